"""Notebooks 06 and 11: paged prefill ("extend") attention (section 9.5, PagedAttention), in Triton.

One step of a serving engine: each sequence brings a chunk of new query tokens (a whole prompt, a
piece of one, or the suffix after a cached prefix) whose K and V are already stored in the paged
pools. With ``n`` new tokens and ``c = context_lens[b]``, query ``i`` of the chunk (position
``c - n + i``) sees the keys at positions ``0 ... c - n + i``: the cached prefix and, causally, the
chunk. A decode step is ``n = 1``; a chunk may start and end inside a block.

How the work is cut. FlashAttention-2's varlen kernel (Dao 2023) gives each program a tile of
consecutive query tokens of one sequence and one query head; FlashInfer (Ye et al. 2025) packs the
query heads that share a KV head into the rows of one tile, so each K and V tile serves the whole
group, and plans the tiles on the host before the launch. This kernel does both: a program takes
one KV head and one *query tile*, whose rows are the (token, query head) pairs of a run of tokens
of one chunk and the ``group`` query heads of that KV head. It loops over the keys from position 0
to the tile's last query with an online softmax in fp32 (``kvlab.kernels.paged_tile``), masking
the keys a row may not see. :func:`plan_query_tiles` lists the tiles once per step, heaviest first.
Not done here: splitting one tile's keys across programs, as FlashInfer does for long contexts,
and skipping the mask on key tiles that every row sees whole.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.kernels._validation import check_plan, check_prefill
from kvlab.kernels.configs import PREFILL_WARPS, prefill_constants, query_tokens_per_tile
from kvlab.kernels.paged_tile import load_kv_tile, online_softmax_update

LOG2E = 1.0 / math.log(2.0)  # scores go through exp2, so the scale carries log2(e)


# fmt: off
@triton.jit
def paged_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, cu_query_lens_ptr, context_lens_ptr,
    tiles_ptr, out_ptr, qk_scale_log2,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_btb, stride_btm, stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, TILE_QUERIES: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # fmt: on
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tiles_ptr + 2 * tile)
    first_query = tl.load(tiles_ptr + 2 * tile + 1)  # the tile's first token within the chunk
    q_begin = tl.load(cu_query_lens_ptr + seq)
    query_len = tl.load(cu_query_lens_ptr + seq + 1) - q_begin
    context_len = tl.load(context_lens_ptr + seq)
    cached_len = context_len - query_len

    # Row r is token first_query + r // GROUP of the chunk, query head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, ROWS)
    token = first_query + rows // GROUP
    row_valid = (rows < TILE_QUERIES * GROUP) & (token < query_len)
    # A padding row gets a position past every key of the tile, so it sees them all and its
    # softmax stays finite; it is never stored.
    q_pos = cached_len + token
    q_heads = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, HEAD_DIM)
    at, head = (q_begin + token)[:, None], q_heads[:, None]  # each row's token and query head
    q_ptrs = q_ptr + at * stride_qt + head * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)

    # The tile's last query sees keys 0 ... key_end - 1; no row of the tile sees further.
    key_end = cached_len + tl.minimum(first_query + TILE_QUERIES, query_len)
    running_max = tl.full([ROWS], float("-inf"), tl.float32)  # in log2 units
    running_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for key_tile in range(0, tl.cdiv(key_end, TILE_N)):
        positions = key_tile * TILE_N + tl.arange(0, TILE_N)
        key_valid = positions < key_end
        # fmt: off
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_table_ptr, seq, kv_head, positions, key_valid, dims,
            stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
            stride_btb, stride_btm, BLOCK_SIZE,
        )
        # fmt: on
        visible = key_valid[None, :] & (positions[None, :] <= q_pos[:, None])  # causal in the chunk
        # Key 0 is in the first tile and every row sees it, so the max is finite from then on.
        running_max, running_sum, acc = online_softmax_update(
            q, k, v, visible, running_max, running_sum, acc, qk_scale_log2, DOT_PRECISION
        )

    out = acc / running_sum[:, None]
    out_ptrs = out_ptr + at * stride_ot + head * stride_oh + dims[None, :] * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def plan_query_tiles(query_lens, context_lens, group: int, device="cpu") -> torch.Tensor:
    """The query tiles of one step, int32 ``[num_tiles, 2]`` of (sequence, first token of its
    chunk) from host lists; most keys first, the longest start first."""
    check_plan(query_lens, context_lens, group)
    per_tile = query_tokens_per_tile(group)
    tiles = [(seq, start) for seq, n in enumerate(query_lens) for start in range(0, n, per_tile)]
    keys = [
        context_lens[seq] - query_lens[seq] + min(start + per_tile, query_lens[seq])
        for seq, start in tiles
    ]
    ordered = [tiles[i] for i in sorted(range(len(tiles)), key=lambda i: -keys[i])]
    return torch.tensor(ordered, dtype=torch.int32, device=device).reshape(len(tiles), 2)


def paged_extend(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale: float, tiles
) -> torch.Tensor:
    """The launch, unchecked, over ``tiles`` from :func:`plan_query_tiles`."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if tiles.shape[0] == 0:
        return out
    paged_prefill_kernel[(tiles.shape[0], num_kv_heads)](
        q, k_cache, v_cache, block_table, cu_query_lens.contiguous(), context_lens.contiguous(),
        tiles.contiguous(), out, scale * LOG2E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), *out.stride(),
        **prefill_constants(q.dtype, group, head_dim, block_size), num_warps=PREFILL_WARPS,
    )  # fmt: skip
    return out


def paged_prefill_attention(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Causal attention of each sequence's new tokens to its paged context, in Triton, in fp32:
    ``q [num_tokens, ...]`` packs them, sequence ``b``'s at ``q[cu_query_lens[b]:cu_query_lens[b +
    1]]``; the caches already hold them (``store_kv`` first) and have the decode kernel's limits;
    int32 ``context_lens [batch]`` counts cached plus new tokens. The checks sync the host once."""
    args = (q, k_cache, v_cache, block_table, cu_query_lens, context_lens)
    scale = check_prefill(*args, scale, paged_prefill_kernel)
    return paged_extend(*args, scale, plan_step(q, k_cache, cu_query_lens, context_lens))


def plan_step(q, k_cache, cu_query_lens, context_lens) -> torch.Tensor:
    """:func:`plan_query_tiles` for a step's tensors, read on the host."""
    cu = cu_query_lens.tolist()
    query_lens = [b - a for a, b in zip(cu, cu[1:])]
    group = q.shape[1] // k_cache.shape[2]
    return plan_query_tiles(query_lens, context_lens.tolist(), group, q.device)
