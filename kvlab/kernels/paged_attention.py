"""Notebooks 05 and 05b: paged decode attention (Kwon et al. 2023), split-K in Triton.

One decode step: every sequence has one new query token per query head and attends to its whole
history in a paged KV cache, ``k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]``:
token ``t`` of sequence ``b`` lives at ``k_cache[block_table[b, t // block_size], t % block_size]``.

The design is Flash-Decoding (Dao et al. 2023), the same idea as vLLM's PagedAttention V2
partitions and FlashInfer's split-KV: split each sequence's keys across programs, then merge. Two
kernels:

1. :func:`attend_split_kernel`, grid ``(batch, num_kv_heads, num_splits)``. Each program takes one
   KV head of one sequence and one contiguous range of its tiles of ``TILE_TOKENS`` tokens, reads
   their K and V through the block table once, and attends all the query heads that share this KV
   head (the GQA group) to them at once, with an online softmax in fp32. It writes its partial
   output (already normalised) and the log-sum-exp of its scores.
2. :func:`merge_splits_kernel`, grid ``(batch, num_q_heads)``, combines the splits with a
   log-sum-exp merge, the arithmetic of ``merge_partials``.

Splitting is what lets a batch-1 long-context decode use the whole GPU: without it there are only
``batch * num_kv_heads`` programs. The loop body, one tile of keys, is ``kvlab.kernels.paged_tile``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.kernels._validation import SUPPORTED_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from kvlab.kernels._validation import check_decode, check_merge
from kvlab.kernels.configs import MAX_SPLITS as MAX_SPLITS
from kvlab.kernels.configs import MIN_TILES_PER_SPLIT as MIN_TILES_PER_SPLIT
from kvlab.kernels.configs import PROGRAMS_PER_SM as PROGRAMS_PER_SM
from kvlab.kernels.configs import TILE_TOKENS, dot_precision, group_rows, longest, splits_for
from kvlab.kernels.configs import choose_num_splits as choose_num_splits
from kvlab.kernels.configs import multiprocessor_count as multiprocessor_count
from kvlab.kernels.paged_tile import load_kv_tile, online_softmax_update

LN2: tl.constexpr = tl.constexpr(math.log(2.0))
LOG2E = 1.0 / math.log(2.0)  # scores go through exp2, so the scale carries log2(e)


# fmt: off
@triton.jit
def attend_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr,
    partial_out_ptr, partial_lse_ptr, qk_scale_log2,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_btb, stride_btm, num_q_heads,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # fmt: on
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    first_tile = split * tiles_per_split
    # May be <= first_tile: an empty split.
    end_tile = tl.minimum(first_tile + tiles_per_split, num_tiles)

    # The GQA group: query heads kv_head*GROUP ... +GROUP-1, padded to GROUP_PAD rows for tl.dot.
    rows = tl.arange(0, GROUP_PAD)
    row_valid = rows < GROUP
    q_heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q_ptrs = q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)

    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # in log2 units
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(first_tile, end_tile):
        positions = tile * TILE_N + tl.arange(0, TILE_N)
        token_valid = positions < seq_len
        # fmt: off
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_table_ptr, seq, kv_head, positions, token_valid, dims,
            stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
            stride_btb, stride_btm, BLOCK_SIZE,
        )
        # fmt: on
        # Every tile in [first_tile, end_tile) holds a valid token, so the max stays finite.
        running_max, running_sum, acc = online_softmax_update(
            q, k, v, token_valid[None, :], running_max, running_sum, acc, qk_scale_log2,
            DOT_PRECISION,
        )  # fmt: skip

    # An empty split writes out = 0 and lse = -inf, which the merge weighs by exp(-inf) = 0.
    has_tokens = running_sum > 0
    safe_sum = tl.where(has_tokens, running_sum, 1.0)
    out = acc / safe_sum[:, None]
    lse = tl.where(has_tokens, (running_max + tl.log2(safe_sum)) * LN2, float("-inf"))  # natural

    partial_row = (seq * num_q_heads + q_heads) * num_splits + split  # [batch, heads, splits]
    out_ptrs = partial_out_ptr + partial_row[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_ptrs, out, mask=row_valid[:, None])
    tl.store(partial_lse_ptr + partial_row, lse, mask=row_valid)


# fmt: off
@triton.jit
def merge_splits_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr, stride_ob, stride_oh, stride_od, num_splits,
    HEAD_DIM: tl.constexpr, SPLIT_TILE: tl.constexpr,
):
    # fmt: on
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_q_heads = tl.num_programs(1)
    first_row = (seq * num_q_heads + head) * num_splits
    dims = tl.arange(0, HEAD_DIM)
    lanes = tl.arange(0, SPLIT_TILE)

    # Pass 1: the largest log-sum-exp. Split 0 always holds token 0, so it is finite.
    max_lanes = tl.full([SPLIT_TILE], float("-inf"), tl.float32)
    for start in range(0, num_splits, SPLIT_TILE):
        splits = start + lanes
        in_range = splits < num_splits
        lse = tl.load(partial_lse_ptr + first_row + splits, mask=in_range, other=float("-inf"))
        max_lanes = tl.maximum(max_lanes, lse)
    global_max = tl.max(max_lanes, axis=0)

    # Pass 2: weights exp(lse - max) <= 1 cannot overflow; an empty split's weight is exp(-inf) = 0,
    # and 0 * part is 0 because stage 1 stores part = 0 there (merge_partials masks a NaN part).
    weight_lanes = tl.zeros([SPLIT_TILE], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, num_splits, SPLIT_TILE):
        splits = start + lanes
        in_range = splits < num_splits
        lse = tl.load(partial_lse_ptr + first_row + splits, mask=in_range, other=float("-inf"))
        part_ptrs = partial_out_ptr + (first_row + splits)[:, None] * HEAD_DIM + dims[None, :]
        part = tl.load(part_ptrs, mask=in_range[:, None], other=0.0)
        weight = tl.exp(lse - global_max)
        weight_lanes += weight
        acc += tl.sum(weight[:, None] * part, axis=0)
    out = acc / tl.sum(weight_lanes, axis=0)
    out_ptrs = out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty))


def launch_attend_split(q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits: int):
    """Stage 1: ``(partial_out, partial_lse)``, as :func:`paged_decode_partials` returns them."""
    batch, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    partial_out = q.new_empty((batch, num_q_heads, num_splits, head_dim), dtype=torch.float32)
    partial_lse = q.new_empty((batch, num_q_heads, num_splits), dtype=torch.float32)
    attend_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens.contiguous(), partial_out, partial_lse,
        scale * LOG2E, *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(),
        num_q_heads,
        GROUP=group, GROUP_PAD=group_rows(group), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_N=TILE_TOKENS, DOT_PRECISION=dot_precision(q.dtype), num_warps=4,
    )  # fmt: skip
    return partial_out, partial_lse


def launch_merge(partial_out, partial_lse, out):
    """Stage 2: the log-sum-exp merge of the splits into ``out``."""
    batch, num_q_heads, num_splits, head_dim = partial_out.shape
    merge_splits_kernel[(batch, num_q_heads)](
        partial_out, partial_lse, out, *out.stride(), num_splits,
        HEAD_DIM=head_dim, SPLIT_TILE=min(16, triton.next_power_of_2(num_splits)),
    )  # fmt: skip
    return out


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits=None):
    """The two launches, unchecked. ``num_splits`` None picks a count from the table's width, which
    never reads a tensor on the host, so the call can be captured in a CUDA graph."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    if num_splits is None:
        num_splits = splits_for(q, k_cache, max(1, block_table.shape[1] * k_cache.shape[1]))
    parts = launch_attend_split(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)
    return launch_merge(*parts, torch.empty_like(q))


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """One decode step of attention over a paged KV cache, in Triton, accumulated in fp32: ``q``
    ``[batch, num_q_heads, head_dim]`` (fp16, bf16, fp32; ``head_dim`` in ``SUPPORTED_HEAD_DIMS``),
    ``block_size`` a power of two, int32 ``block_table [batch, max_blocks]`` and ``seq_lens
    [batch]`` (each in ``[1, max_blocks * block_size]``). The checks sync the host once."""
    args = (q, k_cache, v_cache, block_table, seq_lens)
    scale = check_decode(*args, scale, num_splits, attend_split_kernel, "paged_decode_attention")
    return paged_decode(*args, scale, num_splits or splits_for(q, k_cache, longest(seq_lens)))


def paged_decode_partials(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """Stage 1 alone, checked as :func:`paged_decode_attention` is: ``(partial_out, partial_lse)``,
    each split's normalised output ``[batch, num_q_heads, num_splits, head_dim]`` and the natural
    log-sum-exp of its scores ``[batch, num_q_heads, num_splits]``, in fp32. A split that holds no
    token of its sequence stores output 0 and log-sum-exp ``-inf``."""
    args = (q, k_cache, v_cache, block_table, seq_lens)
    scale = check_decode(*args, scale, num_splits, attend_split_kernel, "paged_decode_partials")
    num_splits = num_splits or splits_for(q, k_cache, longest(seq_lens))
    return launch_attend_split(*args, scale, num_splits)


def merge_splits(partial_out, partial_lse, dtype=torch.float32):
    """Stage 2 alone: ``[batch, num_q_heads, head_dim]`` in ``dtype`` from stage 1's outputs (fp32,
    contiguous, split 0 of every row finite). Unlike ``merge_partials`` it does not mask an empty
    split (see the comment in the kernel): exact for stage 1's partials only."""
    check_merge(partial_out, partial_lse, dtype, merge_splits_kernel)
    batch, num_q_heads, _, head_dim = partial_out.shape
    out = partial_out.new_empty((batch, num_q_heads, head_dim), dtype=dtype)
    return launch_merge(partial_out, partial_lse, out) if batch and num_q_heads else out
