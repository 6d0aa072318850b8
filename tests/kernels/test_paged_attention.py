"""Paged decode attention and store_kv (notebooks 05 and 05b) against an fp64 oracle written here.

The oracle gathers each token's K and V by explicit Python indexing through the block
table and applies softmax(q k^T scale) v in float64, sharing no code with kvlab. On a
CPU the Triton kernels run under the interpreter (fp32 and fp16 only); on a GPU the
same tests run the compiled kernels, plus bf16.
"""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.kernels import (
    choose_num_splits,
    merge_partials,
    paged_decode,
    paged_decode_attention,
    paged_decode_attention_gather,
    paged_decode_attention_ref,
    paged_decode_gather,
    paged_store,
    store_kv,
    store_kv_ref,
)
from kvlab.kernels import paged_attention as pa

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
NUM_KV_HEADS = 2


# --------------------------------------------------------------------------- oracle and data


def oracle_fp64(q, k_cache, v_cache, block_table, seq_lens, scale):
    """softmax(q . k^T * scale) . v in float64, K/V gathered token by token."""
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    q, k_cache, v_cache = q.cpu().double(), k_cache.cpu().double(), v_cache.cpu().double()
    out = torch.empty(batch, num_q_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        blocks = [int(block_table[b, t // block_size]) for t in range(length)]
        offsets = [t % block_size for t in range(length)]
        keys, values = k_cache[blocks, offsets], v_cache[blocks, offsets]  # [length, kv_heads, dim]
        for h in range(num_q_heads):
            scores = keys[:, h // group] @ q[b, h] * scale
            weights = torch.exp(scores - scores.max())
            out[b, h] = (weights / weights.sum()) @ values[:, h // group]
    return out


def boundary_lengths(block_size, rng, long_len=None):
    """1, block_size - 1, block_size, block_size + 1 and one long length, in one batch."""
    long_len = long_len if long_len is not None else rng.randint(1, 2048)
    return [1, max(1, block_size - 1), block_size, block_size + 1, long_len]


def make_paged_batch(lengths, block_size, group, head_dim, dtype, seed):
    """Random q and a paged cache whose blocks are a random permutation of a 3x pool.

    Every cache slot no sequence owns, and every block-table entry past a sequence's
    last block, is poison (NaN, out-of-range id): reading one shows up in the output.
    """
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(n / block_size) for n in lengths]
    num_blocks = 3 * sum(needed)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(needed) + 1
    table = torch.full((len(lengths), max_blocks), num_blocks + 7, dtype=torch.int32)
    shape = (num_blocks, block_size, NUM_KV_HEADS, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, length in enumerate(lengths):
        for t in range(length):
            if t % block_size == 0:
                table[b, t // block_size] = pool.pop()
            block = int(table[b, t // block_size])
            k_cache[block, t % block_size] = torch.randn(NUM_KV_HEADS, head_dim, generator=gen).to(
                dtype
            )
            v_cache[block, t % block_size] = torch.randn(NUM_KV_HEADS, head_dim, generator=gen).to(
                dtype
            )
    q = torch.randn(len(lengths), group * NUM_KV_HEADS, head_dim, generator=gen).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return [x.to(DEVICE) for x in (q, k_cache, v_cache, table, seq_lens)]


def relative_error(out, ref):
    return ((out.cpu().double() - ref).norm() / ref.norm()).item()


# --------------------------------------------------------------------------- kernel vs oracle

# (dtype, GQA group, head_dim, block_size, num_splits); None = the automatic choice.
# Short sequences (1, bs-1, bs, bs+1 tokens) get empty splits whenever num_splits > 1;
# 40 splits leave splits empty even for a 2048-token sequence (32 tiles of 64 tokens).
CASES = [
    (torch.float32, 1, 64, 16, 1),
    (torch.float32, 4, 128, 32, 7),
    (torch.float32, 8, 64, 1, None),
    (torch.float32, 8, 128, 16, 40),
    (torch.float32, 1, 128, 1, 3),
    (torch.float32, 4, 64, 128, 2),
    (torch.float16, 1, 128, 32, None),
    (torch.float16, 4, 64, 1, 3),
    (torch.float16, 8, 128, 16, 1),
    (torch.float16, 8, 64, 32, 5),
    (torch.float16, 4, 128, 4, 16),
    (torch.float32, 4, 16, 8, 2),  # the smallest and largest supported head_dim
    (torch.float16, 1, 256, 64, None),
]
LONG_CASE = (torch.float16, 4, 128, 16, None)  # exactly 2048 tokens


def _case_id(case):
    dtype, group, head_dim, block_size, splits = case
    return f"{str(dtype)[6:]}-g{group}-d{head_dim}-bs{block_size}-s{splits}"


def _check_against_oracle(fn, case, seed, long_len=None):
    dtype, group, head_dim, block_size, num_splits = case
    lengths = boundary_lengths(block_size, random.Random(seed), long_len)
    q, k_cache, v_cache, table, seq_lens = make_paged_batch(
        lengths, block_size, group, head_dim, dtype, seed
    )
    out = fn(q, k_cache, v_cache, table, seq_lens, num_splits=num_splits)
    ref = oracle_fp64(q, k_cache, v_cache, table, seq_lens, head_dim**-0.5)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_kernel_matches_fp64_oracle(case):
    _check_against_oracle(paged_decode_attention, case, seed=CASES.index(case))


def test_kernel_2048_tokens_head_dim_128():
    _check_against_oracle(paged_decode_attention, LONG_CASE, seed=99, long_len=2048)


@pytest.mark.parametrize(
    "fn", [paged_decode_attention_ref, paged_decode_attention_gather], ids=["ref", "gather"]
)
@pytest.mark.parametrize("case", CASES + [LONG_CASE], ids=_case_id)
def test_plain_pytorch_paths_match_fp64_oracle(fn, case):
    _check_against_oracle(fn, case, seed=7, long_len=2048)


def test_unchecked_twins_compute_what_the_checked_functions_do():
    q, k_cache, v_cache, table, seq_lens = make_paged_batch(
        [1, 17, 40], 16, 4, 64, torch.float32, seed=4
    )
    for splits in (None, 3):
        torch.testing.assert_close(
            paged_decode(q, k_cache, v_cache, table, seq_lens, 0.125, splits),
            paged_decode_attention(q, k_cache, v_cache, table, seq_lens, 0.125, splits),
        )
    torch.testing.assert_close(
        paged_decode_gather(q, k_cache, v_cache, table, seq_lens, 0.125),
        paged_decode_attention_gather(q, k_cache, v_cache, table, seq_lens, 0.125),
    )
    k, v = torch.randn(3, 2, 64).to(DEVICE), torch.randn(3, 2, 64).to(DEVICE)
    a, b = torch.zeros(4, 8, 2, 64, device=DEVICE), torch.zeros(4, 8, 2, 64, device=DEVICE)
    c, d = a.clone(), b.clone()
    slots = torch.tensor([5, -1, 30], device=DEVICE)
    paged_store(k, v, a, b, slots)
    store_kv_ref(k, v, c, d, slots)
    assert torch.equal(a, c) and torch.equal(b, d)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the Triton interpreter has no bf16 arithmetic")
@pytest.mark.parametrize("group", [1, 4, 8])
def test_kernel_bf16_on_gpu(group):
    _check_against_oracle(
        paged_decode_attention, (torch.bfloat16, group, 128, 16, None), seed=group
    )


def test_kernel_accepts_strided_inputs_and_explicit_scale():
    q, k_cache, v_cache, table, seq_lens = make_paged_batch(
        [5, 70], 16, 4, 64, torch.float32, seed=3
    )
    q_strided = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=DEVICE).transpose(1, 2)
    q_strided.copy_(q)
    table_strided = torch.empty(
        table.shape[1], table.shape[0], dtype=torch.int32, device=DEVICE
    ).t()
    table_strided.copy_(table)
    lens_strided = torch.stack([seq_lens, seq_lens + 1], dim=1)[:, 0]
    out = paged_decode_attention(
        q_strided, k_cache, v_cache, table_strided, lens_strided, scale=0.3, num_splits=2
    )
    ref = oracle_fp64(q, k_cache, v_cache, table, seq_lens, 0.3)
    assert relative_error(out, ref) < 1e-5


def test_empty_batch_gives_empty_output():
    q, k_cache, v_cache, table, seq_lens = make_paged_batch([5], 16, 4, 64, torch.float32, seed=3)
    out = paged_decode_attention(q[:0], k_cache, v_cache, table[:0], seq_lens[:0])
    assert out.shape == (0, q.shape[1], q.shape[2])


def test_num_splits_heuristic_fills_the_gpu():
    # batch 1, 8 KV heads, 128k context on 132 multiprocessors: 2 programs per SM -> 33 splits
    assert choose_num_splits(1, 8, 131072, 132) == 33
    assert choose_num_splits(64, 8, 4096, 132) == 1  # the batch already fills the GPU
    assert choose_num_splits(1, 8, 100, 132) == 1  # too short to be worth splitting
    assert choose_num_splits(1, 1, 10**7, 10**4) == pa.MAX_SPLITS


# --------------------------------------------------------------------------- log-sum-exp merge


def _attend_fp64(scores, values):
    """(out, natural lse) of one part; an empty part gives garbage out and lse = -inf."""
    if scores.shape[-1] == 0:
        return torch.full(
            values.shape[:-2] + values.shape[-1:], float("nan"), dtype=torch.float64
        ), torch.full(scores.shape[:-1], float("-inf"), dtype=torch.float64)
    return torch.einsum("ht,htd->hd", torch.softmax(scores, dim=-1), values), torch.logsumexp(
        scores, dim=-1
    )


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 200),
    cuts=st.lists(st.integers(0, 200), max_size=8),
    seed=st.integers(0, 2**16),
)
def test_merge_of_random_partition_equals_one_pass(length, cuts, seed):
    gen = torch.Generator().manual_seed(seed)
    heads, dim = 3, 8
    scores = 5 * torch.randn(heads, length, generator=gen, dtype=torch.float64)
    values = torch.randn(heads, length, dim, generator=gen, dtype=torch.float64)
    bounds = sorted({0, length, *(min(c, length) for c in cuts)}) + [
        length
    ]  # a trailing empty part
    parts = [_attend_fp64(scores[:, a:b], values[:, a:b]) for a, b in zip(bounds, bounds[1:])]
    out, lse = merge_partials(
        torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    )
    want_out, want_lse = _attend_fp64(scores, values)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_merge_of_only_empty_parts_is_empty_not_nan():
    out, lse = merge_partials(torch.full((2, 4), float("nan")), torch.full((2,), float("-inf")))
    assert torch.equal(out, torch.zeros(4)) and lse.item() == float("-inf")


# --------------------------------------------------------------------------- empty splits in the
# Triton merge


def _empty_splits(lengths, num_splits):
    """Split j of a sequence of n tokens holds tiles [j t, (j + 1) t), t = ceil(tiles / num_splits):
    empty once j t reaches the sequence's tiles (the kernel's own rule, written out here)."""
    rows = []
    for n in lengths:
        tiles = math.ceil(n / pa.TILE_TOKENS)
        per = math.ceil(tiles / num_splits)
        rows.append([j * per >= tiles for j in range(num_splits)])
    return torch.tensor(rows)


def test_stage_one_stores_zero_in_empty_splits_and_the_triton_merge_relies_on_it():
    """Notebook 05b, exercise 3: the Triton merge does not mask a split whose log-sum-exp is -inf (a
    NaN output there comes out NaN: 0 x NaN), while merge_partials does; the kernel is exact because
    stage 1 stores exactly 0 (and lse -inf) in every empty split."""
    lengths, splits, group = [1, 70, 200, 512], 8, 4
    q, k_cache, v_cache, table, seq_lens = make_paged_batch(
        lengths, 16, group, 64, torch.float32, seed=11
    )
    partial_out, partial_lse = pa.paged_decode_partials(
        q, k_cache, v_cache, table, seq_lens, num_splits=splits
    )
    empty = (
        _empty_splits(lengths, splits)[:, None, :].expand(partial_lse.shape).to(partial_lse.device)
    )
    assert (
        torch.equal(torch.isneginf(partial_lse), empty) and empty[:3].any() and not empty[3].any()
    )
    assert torch.equal(partial_out[empty], torch.zeros_like(partial_out[empty]))  # stage 1 stores 0
    merged = pa.merge_splits(partial_out, partial_lse)
    want = oracle_fp64(q, k_cache, v_cache, table, seq_lens, 64**-0.5)
    assert torch.isfinite(merged).all() and relative_error(merged, want) < TOLERANCE[torch.float32]
    torch.testing.assert_close(
        merged, paged_decode_attention(q, k_cache, v_cache, table, seq_lens, num_splits=splits)
    )

    poisoned = partial_out.masked_fill(empty[..., None], float("nan"))
    leaked = pa.merge_splits(poisoned, partial_lse)
    assert torch.isnan(leaked[:3]).all()  # every head of the three sequences with an empty split
    torch.testing.assert_close(leaked[3], merged[3])  # the 512-token sequence has none
    masked, _ = merge_partials(poisoned.permute(2, 0, 1, 3), partial_lse.permute(2, 0, 1))
    torch.testing.assert_close(masked, merged)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda o, l: pa.merge_splits(o.tolist(), l),
            TypeError,
            "partial_out must be a torch.Tensor",
        ),
        (lambda o, l: pa.merge_splits(o[0], l), ValueError, "partial_out must have 4 dimensions"),
        (lambda o, l: pa.merge_splits(o, l[:, :, :2]), ValueError, "num_splits >= 1"),
        (lambda o, l: pa.merge_splits(o.half(), l), TypeError, "partial_out must have dtype"),
        (lambda o, l: pa.merge_splits(o[..., :48], l), ValueError, "head_dim must be one of"),
        (
            lambda o, l: pa.merge_splits(o.transpose(0, 1).contiguous().transpose(0, 1), l),
            ValueError,
            "contiguous",
        ),
        (lambda o, l: pa.merge_splits(o, l, dtype=torch.int32), TypeError, "dtype must be one of"),
    ],
)
def test_merge_splits_rejects_bad_input(call, error, match):
    out, lse = torch.zeros(2, 4, 3, 64), torch.zeros(2, 4, 3)
    with pytest.raises(error, match=match):
        call(out.to(DEVICE), lse.to(DEVICE))


# --------------------------------------------------------------------------- store_kv


@pytest.mark.parametrize("store", [store_kv, store_kv_ref], ids=["triton", "ref"])
@pytest.mark.parametrize(
    "dtype,block_size,num_kv_heads,head_dim,slot_dtype",
    [
        (torch.float32, 16, 2, 64, torch.int64),
        (torch.float16, 1, 3, 128, torch.int32),
        (torch.float32, 8, 1, 80, torch.int32),  # head_dim not a power of two is fine here
    ],
)
def test_store_kv_round_trips_and_skips(
    store, dtype, block_size, num_kv_heads, head_dim, slot_dtype
):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, num_tokens = 24, 20
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = (
        torch.randn(shape, generator=gen).to(dtype),
        torch.randn(shape, generator=gen).to(dtype),
    )
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want_k[slot // block_size, slot % block_size] = k[i]
            want_v[slot // block_size, slot % block_size] = v[i]
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)

    store(k.to(DEVICE), v.to(DEVICE), k_cache, v_cache, slots.to(DEVICE, slot_dtype))

    assert torch.equal(k_cache.cpu(), want_k) and torch.equal(
        v_cache.cpu(), want_v
    )  # -1 touched nothing
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // block_size, slot % block_size].cpu(), k[i])


# --------------------------------------------------------------------------- bad inputs


def _valid_attention_args():
    q, k_cache, v_cache, table, seq_lens = make_paged_batch(
        [3, 20], 8, 2, 64, torch.float32, seed=0
    )
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, seq_lens=seq_lens)


def _set_seq_len(value):
    def mutate(a):
        a["seq_lens"] = a["seq_lens"].clone()
        a["seq_lens"][1] = value

    return mutate


def _set_block(value):
    def mutate(a):
        a["block_table"] = a["block_table"].clone()
        a["block_table"][1, 2] = value  # sequence 1 (20 tokens, block_size 8) uses entries 0..2

    return mutate


def _replace(name, make):
    return lambda a: a.__setitem__(name, make(a))


ATTENTION_ERRORS = {
    "not a tensor": (
        _replace("q", lambda a: a["q"].tolist()),
        TypeError,
        "q must be a torch.Tensor",
    ),
    "q rank": (_replace("q", lambda a: a["q"][0]), ValueError, "q must have 3 dimensions"),
    "cache shapes differ": (
        _replace("v_cache", lambda a: a["v_cache"][:-1]),
        ValueError,
        "equal shapes",
    ),
    "head_dim mismatch": (_replace("q", lambda a: a["q"][..., :32]), ValueError, "q head_dim"),
    "head_dim unsupported": (
        lambda a: a.update(
            q=a["q"][..., :48], k_cache=a["k_cache"][..., :48], v_cache=a["v_cache"][..., :48]
        ),
        ValueError,
        "head_dim must be one of",
    ),
    "heads not a multiple": (
        _replace("q", lambda a: a["q"][:, :3]),
        ValueError,
        "multiple of num_kv_heads",
    ),
    "block_size not power of two": (
        lambda a: a.update(k_cache=a["k_cache"][:, :6], v_cache=a["v_cache"][:, :6]),
        ValueError,
        "power of two",
    ),
    "batch mismatch": (_replace("seq_lens", lambda a: a["seq_lens"][:1]), ValueError, "batch size"),
    "q dtype": (_replace("q", lambda a: a["q"].double()), TypeError, "q must have dtype"),
    "cache dtypes differ": (
        _replace("v_cache", lambda a: a["v_cache"].half()),
        TypeError,
        "share one dtype",
    ),
    "block_table dtype": (
        _replace("block_table", lambda a: a["block_table"].long()),
        TypeError,
        "block_table must have dtype",
    ),
    "seq_lens dtype": (
        _replace("seq_lens", lambda a: a["seq_lens"].long()),
        TypeError,
        "seq_lens must have dtype",
    ),
    "devices differ": (_replace("q", lambda a: a["q"].to("meta")), ValueError, "share one device"),
    "seq_len zero": (_set_seq_len(0), ValueError, r"seq_lens\[1\] = 0 is outside \[1, 32\]"),
    "seq_len over capacity": (
        _set_seq_len(33),
        ValueError,
        r"seq_lens\[1\] = 33 is outside \[1, 32\]",
    ),
    "block id negative": (_set_block(-1), ValueError, r"block_table\[1, 2\] = -1 is outside \[0, "),
    "block id too large": (
        _set_block(10**6),
        ValueError,
        r"block_table\[1, 2\] = 1000000 is outside \[0, ",
    ),
    "num_splits zero": (
        lambda a: a.update(num_splits=0),
        ValueError,
        "num_splits must be an int >= 1",
    ),
    "num_splits too large": (
        lambda a: a.update(num_splits=70000),
        ValueError,
        r"num_splits must be in \[1, 65535\]",
    ),
    "num_splits not int": (
        lambda a: a.update(num_splits=2.0),
        TypeError,
        "num_splits must be an int",
    ),
    "scale not positive": (
        lambda a: a.update(scale=float("nan")),
        ValueError,
        "scale must be a finite float",
    ),
}


@pytest.mark.parametrize(
    "fn",
    [paged_decode_attention, paged_decode_attention_ref, pa.paged_decode_partials],
    ids=["triton", "ref", "partials"],
)
@pytest.mark.parametrize("name", ATTENTION_ERRORS)
def test_attention_rejects_bad_input_before_launch(fn, name, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("the kernel was launched with bad input")

    monkeypatch.setattr(pa, "paged_decode", no_launch)
    monkeypatch.setattr(pa, "launch_attend_split", no_launch)
    mutate, error, message = ATTENTION_ERRORS[name]
    args = _valid_attention_args()
    mutate(args)
    with pytest.raises(error, match=message):
        fn(**args)


def test_unused_block_table_entries_are_never_checked_or_read():
    args = _valid_attention_args()
    args["block_table"][0, 1:] = -5  # sequence 0 has 3 tokens: only entry 0 is in use
    out = paged_decode_attention(**args, num_splits=2)
    assert torch.isfinite(out).all()


def _valid_store_args():
    cache = torch.zeros(4, 8, 2, 64)
    return dict(
        k=torch.randn(5, 2, 64),
        v=torch.randn(5, 2, 64),
        k_cache=cache.clone(),
        v_cache=cache.clone(),
        slot_mapping=torch.tensor([0, 9, -1, 31, 4]),
    )


def _set_slot(value):
    def mutate(a):
        a["slot_mapping"][1] = value

    return mutate


STORE_ERRORS = {
    "not a tensor": (_replace("k", lambda a: 1.0), TypeError, "k must be a torch.Tensor"),
    "k rank": (_replace("k", lambda a: a["k"][0]), ValueError, "k must have 3 dimensions"),
    "k v shapes differ": (
        _replace("v", lambda a: a["v"][:4]),
        ValueError,
        "k and v must have equal shapes",
    ),
    "heads mismatch": (
        lambda a: a.update(k=a["k"][:, :1], v=a["v"][:, :1]),
        ValueError,
        "must match k_cache",
    ),
    "slot length": (
        _replace("slot_mapping", lambda a: a["slot_mapping"][:4]),
        ValueError,
        "slot_mapping length",
    ),
    "dtype mismatch": (
        _replace("k_cache", lambda a: a["k_cache"].half()),
        TypeError,
        "share one dtype",
    ),
    "slot dtype": (
        _replace("slot_mapping", lambda a: a["slot_mapping"].float()),
        TypeError,
        "slot_mapping must have dtype",
    ),
    "slot below -1": (_set_slot(-2), ValueError, r"slot_mapping\[1\] = -2 is outside \[-1, 32\)"),
    "slot too large": (_set_slot(32), ValueError, r"slot_mapping\[1\] = 32 is outside \[-1, 32\)"),
    "slot twice": (_set_slot(0), ValueError, "writes slot 0 more than once"),
}


@pytest.mark.parametrize("fn", [store_kv, store_kv_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("name", STORE_ERRORS)
def test_store_kv_rejects_bad_input(fn, name):
    mutate, error, message = STORE_ERRORS[name]
    args = _valid_store_args()
    before = args["k_cache"].clone()
    mutate(args)
    with pytest.raises(error, match=message):
        fn(**args)
    if args["k_cache"].shape == before.shape and args["k_cache"].dtype == before.dtype:
        assert torch.equal(args["k_cache"], before)  # nothing was written
