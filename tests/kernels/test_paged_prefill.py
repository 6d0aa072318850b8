"""Paged prefill attention (notebooks 06 and 11) against an fp64 oracle written here, and its work.

The oracle gathers each context token's K and V by explicit Python indexing through the block
table and applies, query by query, softmax(q k^T scale) v over the keys at or before the query's
position, in float64, sharing no code with kvlab. On a CPU the kernel runs under the Triton
interpreter (fp32 and fp16 only, small sizes: it is slow); on a GPU the same tests run compiled,
plus bf16.
"""

import itertools
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.kernels import _validation, paged_attention, paged_prefill
from kvlab.kernels.configs import query_tokens_per_tile
from kvlab.kernels.paged_attention_torch import paged_prefill_attention_ref
from kvlab.kernels.paged_prefill import paged_prefill_attention, plan_query_tiles
from kvlab.lab.paged_attention import paged_prefill_launcher, paged_prefill_work
from kvlab.theory import roofline
from kvlab.theory.prefill_attention import prefill_attention_work, tile_keys, visible_pairs
from kvlab.theory.shapes import ModelShape

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
NUM_KV_HEADS = 2


# --------------------------------------------------------------------------- oracle and data


def oracle_fp64(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale):
    """Query i of sequence b's chunk of n tokens sits at position c - n + i and sees keys 0 ... c -
    n + i."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    q, k_cache, v_cache = q.cpu().double(), k_cache.cpu().double(), v_cache.cpu().double()
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(len(context_lens)):
        start, end, context = int(cu_query_lens[b]), int(cu_query_lens[b + 1]), int(context_lens[b])
        blocks = [int(block_table[b, t // block_size]) for t in range(context)]
        keys = k_cache[blocks, [t % block_size for t in range(context)]]  # [context, kv_heads, dim]
        values = v_cache[blocks, [t % block_size for t in range(context)]]
        for i, token in enumerate(range(start, end)):
            seen = context - (end - start) + i + 1
            for h in range(q.shape[1]):
                scores = keys[:seen, h // group] @ q[token, h] * scale
                weights = torch.exp(scores - scores.max())
                out[token, h] = (weights / weights.sum()) @ values[:seen, h // group]
    return out


def make_step(chunks, block_size, group, head_dim, dtype, seed):
    """Random q and a paged cache for ``chunks`` = [(cached, new), ...], blocks a random permutation
    of a 3x pool. Every slot no context token owns is NaN and every table entry past a sequence's
    last block an out-of-range id: reading either shows up in the output."""
    gen = torch.Generator().manual_seed(seed)
    contexts = [cached + new for cached, new in chunks]
    needed = [math.ceil(c / block_size) for c in contexts]
    num_blocks = 3 * max(1, sum(needed))
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(chunks), max(needed, default=0) + 1), num_blocks + 7, dtype=torch.int32)
    shape = (num_blocks, block_size, NUM_KV_HEADS, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, context in enumerate(contexts):
        for t in range(context):
            if t % block_size == 0:
                table[b, t // block_size] = pool.pop()
            block = int(table[b, t // block_size])
            k_cache[block, t % block_size] = torch.randn(NUM_KV_HEADS, head_dim, generator=gen).to(
                dtype
            )
            v_cache[block, t % block_size] = torch.randn(NUM_KV_HEADS, head_dim, generator=gen).to(
                dtype
            )
    cu = torch.tensor([0, *itertools.accumulate(new for _, new in chunks)], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), group * NUM_KV_HEADS, head_dim, generator=gen).to(dtype)
    context_lens = torch.tensor(contexts, dtype=torch.int32)
    return [x.to(DEVICE) for x in (q, k_cache, v_cache, table, cu, context_lens)]


def awkward_chunks(block_size, group, rng):
    """In one step: an empty cached prefix; chunks that start and end inside a block; a one-token
    chunk on a block boundary; a sequence with no new tokens; a chunk of more than one query tile;
    and one of random sizes."""
    bs, tile = block_size, query_tokens_per_tile(group)
    return [
        (0, bs + 3),
        (bs + 3, max(1, bs - 2)),
        (2 * bs, 1),
        (5, 0),
        (1, tile + 2),
        (3 * bs - 1, 2),
        (rng.randint(0, 40), rng.randint(1, 30)),
    ]


def relative_error(out, ref):
    return ((out.cpu().double() - ref).norm() / ref.norm()).item()


# --------------------------------------------------------------------------- kernel vs oracle

# (dtype, GQA group, head_dim, block_size). Group 3 leaves rows of a tile unused (64 = 21 * 3 + 1).
CASES = [
    (torch.float32, 1, 64, 16),
    (torch.float32, 4, 32, 8),
    (torch.float32, 8, 128, 1),
    (torch.float32, 3, 16, 2),
    (torch.float16, 1, 128, 32),
    (torch.float16, 4, 64, 4),
    (torch.float16, 8, 64, 16),
    (torch.float16, 4, 256, 64),
]


def _case_id(case):
    dtype, group, head_dim, block_size = case
    return f"{str(dtype)[6:]}-g{group}-d{head_dim}-bs{block_size}"


def _check_against_oracle(fn, case, seed):
    dtype, group, head_dim, block_size = case
    chunks = awkward_chunks(block_size, group, random.Random(seed))
    step = make_step(chunks, block_size, group, head_dim, dtype, seed)
    out = fn(*step)
    ref = oracle_fp64(*step, head_dim**-0.5)
    assert out.shape == step[0].shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_kernel_matches_fp64_oracle(case):
    _check_against_oracle(paged_prefill_attention, case, seed=CASES.index(case))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_reference_matches_fp64_oracle(case):
    _check_against_oracle(paged_prefill_attention_ref, case, seed=CASES.index(case) + 50)


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 4, 8]),
    block_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_reference_matches_oracle_on_random_steps(chunks, group, block_size, seed):
    step = make_step(chunks, block_size, group, 16, torch.float32, seed)
    out = paged_prefill_attention_ref(*step)
    torch.testing.assert_close(out.cpu().double(), oracle_fp64(*step, 0.25), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the Triton interpreter has no bf16 arithmetic")
@pytest.mark.parametrize("group", [1, 4, 8])
def test_kernel_bf16_on_gpu(group):
    _check_against_oracle(paged_prefill_attention, (torch.bfloat16, group, 128, 16), seed=group)


def test_one_token_chunks_equal_the_decode_kernel():
    step = make_step([(0, 1), (16, 1), (40, 1)], 8, 4, 32, torch.float32, seed=5)
    q, k_cache, v_cache, table, _, context_lens = step
    decode = paged_attention.paged_decode_attention(
        q, k_cache, v_cache, table, context_lens, num_splits=1
    )
    torch.testing.assert_close(paged_prefill_attention(*step), decode, rtol=1e-5, atol=1e-5)


def test_kernel_accepts_strided_inputs_and_explicit_scale():
    step = make_step([(3, 4), (0, 9)], 8, 4, 32, torch.float32, seed=3)
    q, k_cache, v_cache, table, cu, context_lens = step
    q_strided = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=DEVICE).transpose(1, 2)
    q_strided.copy_(q)
    table_strided = torch.empty(
        table.shape[1], table.shape[0], dtype=torch.int32, device=DEVICE
    ).t()
    table_strided.copy_(table)
    lens_strided = torch.stack([context_lens, context_lens], dim=1)[:, 0]
    out = paged_prefill_attention(
        q_strided, k_cache, v_cache, table_strided, cu, lens_strided, scale=0.3
    )
    assert relative_error(out, oracle_fp64(*step, 0.3)) < 1e-5


def test_a_step_without_new_tokens_gives_empty_output():
    q, k_cache, v_cache, table, cu, context_lens = make_step(
        [(5, 0), (9, 0)], 4, 4, 32, torch.float32, seed=1
    )
    assert paged_prefill_attention(q, k_cache, v_cache, table, cu, context_lens).shape == (0, 8, 32)
    empty = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = paged_prefill_attention(q, k_cache, v_cache, table[:0], empty, context_lens[:0])
    assert out.shape == (0, 8, 32)


def test_the_unchecked_launch_of_a_planned_step_equals_the_checked_call():
    step = make_step([(7, 5), (0, 12)], 4, 8, 32, torch.float16, seed=2)
    q, k_cache, v_cache, table, cu, context_lens = step
    tiles = plan_query_tiles([5, 12], [12, 12], group=8, device=DEVICE)
    unchecked = paged_prefill.paged_extend(
        q, k_cache, v_cache, table, cu, context_lens, 32**-0.5, tiles
    )
    launch = paged_prefill_launcher(*step)
    assert torch.equal(unchecked, launch()) and torch.equal(
        launch(), paged_prefill_attention(*step)
    )


def test_the_tiles_cover_every_query_once_heaviest_first():
    query_lens, context_lens, group = [0, 70, 3, 17], [4, 90, 3, 17], 4
    tiles = plan_query_tiles(query_lens, context_lens, group).tolist()
    per_tile = query_tokens_per_tile(group)
    covered = sorted(
        (seq, start + i)
        for seq, start in tiles
        for i in range(per_tile)
        if start + i < query_lens[seq]
    )
    assert covered == [(seq, i) for seq, n in enumerate(query_lens) for i in range(n)]
    keys = [
        context_lens[s] - query_lens[s] + min(start + per_tile, query_lens[s]) for s, start in tiles
    ]
    assert keys == sorted(keys, reverse=True)
    assert plan_query_tiles([0, 0], [1, 2], 1).shape == (0, 2)
    with pytest.raises(ValueError, match=r"context_lens\[1\] must be an int >= 3, got 2"):
        plan_query_tiles([1, 3], [1, 2], 4)
    with pytest.raises(ValueError, match="group must be an int >= 1, got 0"):
        plan_query_tiles([1], [1], 0)


# --------------------------------------------------------------------------- bad input


def _good():
    return make_step([(3, 2), (0, 4)], 4, 4, 32, torch.float32, seed=0)


def _replace(i, value):
    step = _good()
    step[i] = value(step) if callable(value) else value
    return step


BAD = [
    ("q", lambda s: s[0].numpy(), TypeError, "q must be a torch.Tensor"),
    ("q rank", lambda s: s[0][None], ValueError, r"q must have 3 dimensions \[num_tokens"),
    ("cu rank", lambda s: s[4][None], ValueError, r"cu_query_lens must have 1 dimensions"),
    ("head_dim", lambda s: s[0][..., :24], ValueError, r"q head_dim \(24\) must equal"),
    ("group", lambda s: s[0][:, :3], ValueError, r"num_q_heads \(3\) must be a positive multiple"),
    ("dtype", lambda s: s[0].double(), TypeError, "q must have dtype in"),
    ("mixed", lambda s: s[0].half(), TypeError, "must share one dtype"),
    ("cu dtype", lambda s: s[4].long(), TypeError, "cu_query_lens must have dtype in \\(int32\\)"),
    (
        "batch",
        lambda s: s[4][:2],
        ValueError,
        r"cu_query_lens must have batch \+ 1 = 3 entries, got 2",
    ),
    (
        "cu start",
        lambda s: s[4] + 1,
        ValueError,
        "cu_query_lens must start at 0 and end at num_tokens",
    ),
    (
        "cu order",
        lambda s: torch.tensor([0, 7, 6], dtype=torch.int32),
        ValueError,
        r"must not decrease, got cu_query_lens\[1\] = 7 > cu_query_lens\[2\] = 6",
    ),
    (
        "short context",
        lambda s: torch.tensor([1, 4], dtype=torch.int32),
        ValueError,
        r"context_lens\[0\] = 1 is outside \[2, 12\]",
    ),
    (
        "long context",
        lambda s: torch.tensor([5, 13], dtype=torch.int32),
        ValueError,
        r"context_lens\[1\] = 13 is outside \[4, 12\]",
    ),
    (
        "block id",
        lambda s: s[3].clone().fill_(9),
        ValueError,
        r"block_table\[0, 0\] = 9 is outside \[0, 9\)",
    ),
    ("block size", lambda s: s[1][:, :3], ValueError, "must have equal shapes"),
]
INDEX = {
    "q": 0,
    "q rank": 0,
    "cu rank": 4,
    "head_dim": 0,
    "group": 0,
    "dtype": 0,
    "mixed": 0,
    "cu dtype": 4,
    "batch": 4,
    "cu start": 4,
    "cu order": 4,
    "short context": 5,
    "long context": 5,
    "block id": 3,
    "block size": 1,
}


@pytest.mark.parametrize(
    "fn", [paged_prefill_attention, paged_prefill_attention_ref], ids=["kernel", "ref"]
)
@pytest.mark.parametrize("name,value,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_naming_the_argument(fn, name, value, error, match):
    with pytest.raises(error, match=match):
        fn(*_replace(INDEX[name], value))


def test_bad_scale_and_bf16_under_the_interpreter():
    with pytest.raises(ValueError, match="scale must be a finite float > 0, got -1"):
        paged_prefill_attention(*_good(), scale=-1.0)
    with pytest.raises(TypeError, match="scale must be a float > 0 or None, got str"):
        paged_prefill_attention_ref(*_good(), scale="0.5")
    if DEVICE == "cpu":
        step = [x.bfloat16() if x.is_floating_point() else x for x in _good()]
        with pytest.raises(TypeError, match="q is bfloat16, which the Triton interpreter"):
            paged_prefill_attention(*step)


def test_the_wrapper_asks_whether_the_kernel_fits_before_it_launches(monkeypatch):
    asked = []

    def refuse(config, device):
        asked.append((config.name, config.dtype, config.sizes))
        raise ValueError("refused")

    monkeypatch.setattr(_validation, "require_fits", refuse)
    monkeypatch.setattr(paged_prefill, "paged_extend", lambda *a: pytest.fail("launched"))
    with pytest.raises(ValueError, match="refused"):
        paged_prefill_attention(*_good())
    assert asked == [("paged_prefill", torch.float32, dict(head_dim=32, group=4))]


# --------------------------------------------------------------------------- bytes and FLOPs


@settings(max_examples=50, deadline=None)
@given(cached=st.integers(0, 50), new=st.integers(0, 50), per_tile=st.integers(1, 70))
def test_pair_and_key_counts_equal_a_count_of_the_mask(cached, new, per_tile):
    context = cached + new
    mask = [[key <= cached + i for key in range(context)] for i in range(new)]
    assert visible_pairs(new, context) == sum(map(sum, mask))
    tiles = [range(start, min(start + per_tile, new)) for start in range(0, new, per_tile)]
    assert tile_keys(new, context, per_tile) == sum(cached + tile[-1] + 1 for tile in tiles)


def test_a_decode_launch_has_the_roofline_decode_attention_work():
    shape = ModelShape(
        "one layer",
        layers=1,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        hidden=4096,
        params=1e9,
        vocab=1000,
    )
    contexts = [100, 4096, 7]
    work = prefill_attention_work(
        [1, 1, 1], contexts, 32, 8, 128, element_bytes=2, block_size=16, tokens_per_tile=8
    )
    assert work.flops == roofline.attention_flops_per_token(shape) * sum(contexts)
    cache = roofline.kv_bytes_per_token(shape, 2) * sum(contexts)
    q_and_out, metadata = 2 * 3 * 32 * 128 * 2, 4 * (7 + 7 + 256 + 1)
    assert work.bytes == work.tile_bytes == cache + q_and_out + metadata


def test_query_tiles_reread_the_keys():
    one_tile = prefill_attention_work([64], [64], 8, 8, 64, tokens_per_tile=64)
    four_tiles = prefill_attention_work([64], [64], 8, 8, 64, tokens_per_tile=16)
    assert one_tile.tile_bytes == one_tile.bytes == four_tiles.bytes < four_tiles.tile_bytes
    assert one_tile.flops == four_tiles.flops == 4 * 8 * 64 * (64 * 65 // 2)
    assert (
        prefill_attention_work([0], [10], 1, 1, 16).bytes == 4 * 3
    )  # lengths only: nothing is read


def test_the_kernel_work_uses_its_dtype_and_tile():
    q, k_cache, _, _, cu, context_lens = make_step(
        [(3, 70), (0, 5)], 4, 1, 32, torch.float16, seed=0
    )
    work = paged_prefill_work(q, k_cache, cu, context_lens)
    assert work == prefill_attention_work(
        [70, 5], [73, 5], 2, 2, 32, 2, 4, query_tokens_per_tile(1)
    )
    assert work.tile_bytes > work.bytes  # 70 new tokens are two tiles of 64


def test_work_refuses_inconsistent_lengths():
    with pytest.raises(ValueError, match=r"context_lens\[1\] must be an int >= 5, got 4"):
        prefill_attention_work([1, 5], [3, 4], 2, 1, 16)
    with pytest.raises(ValueError, match="one entry per sequence"):
        prefill_attention_work([1], [3, 4], 2, 1, 16)
    with pytest.raises(ValueError, match=r"num_q_heads \(3\) must be a multiple"):
        prefill_attention_work([1], [3], 3, 2, 16)


def test_the_work_formulas_import_without_torch():
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; import kvlab.theory.prefill_attention"
    subprocess.run([sys.executable, "-c", code], check=True)
