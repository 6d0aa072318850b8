"""Bad input to the kernels and their PyTorch twins (notebooks 05, 05b): a clear error naming the
argument, or a right answer; never a wrong number. Moved here from tests/test_bad_input.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.kernels import (
    merge_partials,
    paged_decode_attention,
    paged_decode_attention_gather,
    paged_decode_attention_ref,
    store_kv,
    store_kv_ref,
)

INTERPRETED = not torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_K = torch.randn(1, 2, 16)


def _attention_args(batch=2, lens=(3, 9), block_size=4, dtype=torch.float32):
    """A valid paged decode batch: 2 KV heads, 4 query heads, head_dim 16, blocks in order."""
    gen = torch.Generator().manual_seed(0)
    per_seq = max(-(-n // block_size) for n in lens)
    table = torch.arange(batch * per_seq, dtype=torch.int32).reshape(batch, per_seq)
    shape = (batch * per_seq, block_size, 2, 16)
    return dict(
        q=torch.randn(batch, 4, 16, generator=gen).to(DEVICE, dtype),
        k_cache=torch.randn(shape, generator=gen).to(DEVICE, dtype),
        v_cache=torch.randn(shape, generator=gen).to(DEVICE, dtype),
        block_table=table.to(DEVICE),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
    )


def _oracle_attention(args):
    """fp64 attention over each sequence's gathered tokens, written from the definition."""
    q, k_cache, v_cache = (args[n].double().cpu() for n in ("q", "k_cache", "v_cache"))
    out = []
    for b, n in enumerate(args["seq_lens"].tolist()):
        blocks = args["block_table"][b].long().cpu()
        keys = k_cache[blocks].flatten(0, 1)[:n].repeat_interleave(2, dim=1)
        values = v_cache[blocks].flatten(0, 1)[:n].repeat_interleave(2, dim=1)
        scale = args.get("scale") or q.shape[-1] ** -0.5
        weights = (torch.einsum("hd,thd->ht", q[b], keys) * scale).softmax(-1)
        out.append(torch.einsum("ht,thd->hd", weights, values))
    return torch.stack(out)


BAD_CALLS = {
    "num_splits beyond tiles": (
        lambda: paged_decode_attention_ref(**_attention_args(), num_splits=65535),
        ValueError,
        r"num_splits must be in \[1, 256\]",
    ),
    "store_kv slot twice": (
        lambda: store_kv_ref(
            _K.expand(2, 2, 16),
            _K.expand(2, 2, 16),
            torch.zeros(2, 4, 2, 16),
            torch.zeros(2, 4, 2, 16),
            torch.tensor([1, 1]),
        ),
        ValueError,
        "writes slot 1 more than once",
    ),
    "store_kv one pool for k and v": (
        lambda: store_kv_ref(_K, _K, *(2 * [torch.zeros(2, 4, 2, 16)]), torch.tensor([1])),
        ValueError,
        "k_cache and v_cache share memory",
    ),
    "store_kv expanded cache": (
        lambda: store_kv_ref(
            _K,
            _K,
            torch.zeros(1, 4, 2, 16).expand(2, -1, -1, -1),
            torch.zeros(2, 4, 2, 16),
            torch.tensor([1]),
        ),
        ValueError,
        "k_cache has overlapping elements",
    ),
    "store_kv k inside the pool": (
        lambda: (
            lambda c: store_kv_ref(c[0, :2], c[0, :2], c, torch.zeros_like(c), torch.tensor([6, 7]))
        )(torch.rand(3, 4, 2, 16)),
        ValueError,
        "k and k_cache share memory",
    ),
    "merge_partials shapes": (
        lambda: merge_partials(torch.rand(2, 3, 4), torch.rand(3, 3)),
        ValueError,
        "same leading shape",
    ),
    "merge_partials no parts": (
        lambda: merge_partials(torch.rand(0, 3, 4), torch.rand(0, 3)),
        ValueError,
        "num_parts >= 1",
    ),
    "choose_num_splits negative": (
        lambda: kvlab.kernels.choose_num_splits(-1, 2, 100, 4),
        ValueError,
        "batch must be an int >= 1",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


@pytest.mark.skipif(
    not INTERPRETED, reason="on a GPU bf16 is computed (tests/kernels/test_paged_attention.py)"
)
def test_bf16_attention_is_refused_under_the_interpreter():
    with pytest.raises(TypeError, match="bfloat16.*interpreter"):
        paged_decode_attention(**_attention_args(dtype=torch.bfloat16))


def test_kernel_attention_matches_the_oracle_where_it_accepts():
    args = _attention_args()
    torch.testing.assert_close(
        paged_decode_attention(**args).double().cpu(), _oracle_attention(args), atol=1e-5, rtol=1e-5
    )


GATHER_CASES = {
    "one-row table for a batch of two": (
        lambda a: a.update(block_table=a["block_table"][:1]),
        "batch size",
    ),
    "length over capacity": (
        lambda a: a["seq_lens"].__setitem__(0, 99),
        r"seq_lens\[0\] = 99 is outside",
    ),
    "block id -1": (
        lambda a: a["block_table"].__setitem__((1, 0), -1),
        r"block_table\[1, 0\] = -1 is outside",
    ),
    "length 0": (lambda a: a["seq_lens"].__setitem__(1, 0), r"seq_lens\[1\] = 0 is outside \[1, "),
}
PATHS = [paged_decode_attention_gather, paged_decode_attention_ref, paged_decode_attention]


@pytest.mark.parametrize("fn", PATHS, ids=["gather", "ref", "kernel"])
@pytest.mark.parametrize("case", GATHER_CASES)
def test_every_attention_path_refuses_what_the_kernel_refuses(fn, case):
    mutate, message = GATHER_CASES[case]
    args = _attention_args()
    mutate(args)
    with pytest.raises(ValueError, match=message):
        fn(**args)


@pytest.mark.parametrize(
    "fn, examples", list(zip(PATHS, (25, 25, 6))), ids=["gather", "ref", "kernel"]
)
def test_attention_is_right_or_refuses(fn, examples):
    """Random lengths (0 and past capacity included) and block ids (negative and past the pool
    included): every path either raises ValueError or matches the fp64 oracle. Never a wrong number.
    """

    @settings(max_examples=examples, deadline=None)
    @given(
        lens=st.lists(st.integers(-1, 14), min_size=2, max_size=2),
        ids=st.lists(st.integers(-2, 8), min_size=6, max_size=6),
    )
    def check(lens, ids):
        args = _attention_args()  # 2 sequences, 3 table entries of 4 tokens each, 6 blocks
        args["seq_lens"] = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        args["block_table"] = torch.tensor(ids, dtype=torch.int32, device=DEVICE).reshape(2, 3)
        used = [-(-n // 4) for n in lens]
        valid = all(1 <= n <= 12 for n in lens) and all(
            0 <= ids[3 * b + j] < 6 for b in range(2) for j in range(used[b])
        )
        if not valid:
            with pytest.raises(ValueError):
                fn(**args)
            return
        out = fn(**args)
        safe = dict(
            args, block_table=args["block_table"].clamp(0, 5)
        )  # unused entries: any valid id
        torch.testing.assert_close(
            out.double().cpu(), _oracle_attention(safe), atol=1e-5, rtol=1e-5
        )

    check()


@pytest.mark.parametrize("fn, examples", [(store_kv_ref, 30), (store_kv, 8)], ids=["ref", "kernel"])
def test_store_kv_is_right_or_refuses(fn, examples):
    """Random slot mappings (-2, repeats and slots past the pool included): either ValueError and
    the pools untouched, or every token at its slot and nothing else changed."""

    @settings(max_examples=examples, deadline=None)
    @given(slots=st.lists(st.integers(-2, 9), min_size=1, max_size=4))
    def check(slots):
        gen = torch.Generator().manual_seed(len(slots))
        k, v = (torch.randn(len(slots), 2, 16, generator=gen).to(DEVICE) for _ in range(2))
        k_cache, v_cache = (torch.randn(2, 4, 2, 16, generator=gen).to(DEVICE) for _ in range(2))
        before = k_cache.clone(), v_cache.clone()
        stored = [s for s in slots if s >= 0]
        mapping = torch.tensor(slots, device=DEVICE)
        if min(slots) < -1 or max(slots) >= 8 or len(set(stored)) != len(stored):
            with pytest.raises(ValueError, match="slot_mapping"):
                fn(k, v, k_cache, v_cache, mapping)
            assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
            return
        fn(k, v, k_cache, v_cache, mapping)
        expected_k, expected_v = before[0].clone(), before[1].clone()
        for i, slot in enumerate(slots):
            if slot >= 0:
                expected_k[slot // 4, slot % 4], expected_v[slot // 4, slot % 4] = k[i], v[i]
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)

    check()


def test_gather_path_takes_any_block_size_and_head_dim():
    """Only the kernel (and the reference, which checks as it does) needs a power-of-two block size
    and a listed head_dim; the gather path computes the same attention for others (block 3, head_dim
    12).
    """
    gen = torch.Generator().manual_seed(2)
    table = torch.tensor([[2, 0, 1], [3, 4, 5]], dtype=torch.int32)
    k_cache, v_cache = (
        torch.randn(6, 3, 2, 12, generator=gen),
        torch.randn(6, 3, 2, 12, generator=gen),
    )
    args = dict(
        q=torch.randn(2, 4, 12, generator=gen),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=table,
        seq_lens=torch.tensor([7, 9], dtype=torch.int32),
    )
    out = paged_decode_attention_gather(**args, scale=0.25)
    torch.testing.assert_close(
        out.double(), _oracle_attention(dict(args, scale=0.25)), atol=1e-5, rtol=1e-5
    )
    with pytest.raises(ValueError, match="head_dim must be one of"):
        paged_decode_attention_ref(**args)


def test_gather_path_ignores_unused_table_entries_and_matches_the_oracle():
    args = _attention_args(lens=(3, 9))
    args["block_table"][0, 1:] = -7  # sequence 0 uses one block; the rest is never read
    out = paged_decode_attention_gather(**args)
    args["block_table"][0, 1:] = 0
    torch.testing.assert_close(out.double().cpu(), _oracle_attention(args), atol=1e-5, rtol=1e-5)


def test_num_splits_beyond_the_tiles_is_refused_before_a_launch():
    with pytest.raises(ValueError, match=r"num_splits must be in \[1, 256\]"):
        paged_decode_attention(**_attention_args(), num_splits=65535)
    with pytest.raises(ValueError, match=r"num_splits must be in \[1, 65535\]"):
        paged_decode_attention(**_attention_args(), num_splits=65536)
