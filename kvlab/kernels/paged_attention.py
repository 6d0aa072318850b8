"""Notebooks 05 and 05b: paged decode attention (Kwon et al. 2023), split-K "flash decoding" in
Triton.

One decode step: every sequence has one new query token per query head, and attends
to its whole history, stored in a paged KV cache

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : int32 [batch, max_blocks]   logical block -> physical block
    seq_lens         : int32 [batch]               tokens in each sequence's cache

Token ``t`` of sequence ``b`` lives at ``k_cache[block_table[b, t // block_size], t % block_size]``.

The kernel runs in two stages:

1. ``_attend_split_kernel``, grid ``(batch, num_kv_heads, num_splits)``. Each program
   takes one KV head of one sequence and one contiguous range of its tiles of tokens,
   reads their K and V through the block table once, and attends all the query heads
   that share this KV head (the GQA group) to them at the same time, with an online
   softmax in fp32. It writes its partial output (already normalised) and the
   log-sum-exp of its scores.
2. ``_merge_splits_kernel``, grid ``(batch, num_q_heads)``, combines the splits with a
   log-sum-exp merge, the same arithmetic as :func:`merge_partials`.

Splitting the sequence is what lets a batch-1 long-context decode use the whole GPU:
without it there are only ``batch * num_kv_heads`` programs.

Beside the kernel, in ``kvlab.kernels.paged_attention_torch``, with the same signature and the
same checks (:func:`check_decode_inputs`): the fp64 reference and the gather-then-SDPA path, and
``merge_partials``, the merge in PyTorch. :func:`paged_decode_attention` validates and then calls
its unchecked twin :func:`paged_decode_unchecked`, which a caller that validated a step's tables
once calls in every layer (``kvlab.serving.attention``): no checks, no host sync, capturable in a
CUDA graph. Each stage can also run alone, checked, to be looked at: :func:`paged_decode_partials`
(stage 1) and :func:`merge_splits` (stage 2). The loop body that stage 1 shares with the prefill
kernel, one tile of keys, is ``kvlab.kernels.paged_tile``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab._checks import integer
from kvlab.kernels._validation import (
    FLOAT_DTYPES,
    is_power_of_two,
    require_block_table,
    require_computable_dtype,
    require_dtype,
    require_kernel_device,
    require_rank,
    require_same_device,
    require_tensor,
    resolve_scale,
)
from kvlab.kernels.paged_tile import load_kv_tile, online_softmax_update
from kvlab.kernels.shared_memory import DTYPES, KernelConfig, require_fits, signature

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
TILE_TOKENS = 64  # tokens one stage-1 program handles per loop iteration (may span several blocks)
MIN_TILES_PER_SPLIT = 2  # below this a split's merge overhead outweighs the parallelism it adds
MAX_SPLITS = 256  # the automatic choice never goes beyond this
MAX_GRID_Z = 65535
CPU_PROGRAM_SLOTS = 4  # stands in for the multiprocessor count under the CPU interpreter
PROGRAMS_PER_SM = 2


LN2: tl.constexpr = tl.constexpr(math.log(2.0))
LOG2E = 1.0 / math.log(2.0)  # scores go through exp2, so the scale carries log2(e)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _attend_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    qk_scale_log2,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_btb,
    stride_btm,
    num_q_heads,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    first_tile = split * tiles_per_split
    end_tile = tl.minimum(
        first_tile + tiles_per_split, num_tiles
    )  # may be <= first_tile: an empty split

    # The GQA group: query heads kv_head*GROUP ... +GROUP-1, padded to GROUP_PAD rows for tl.dot.
    rows = tl.arange(0, GROUP_PAD)
    row_valid = rows < GROUP
    q_heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_valid[:, None],
        other=0.0,
    )

    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # in log2 units
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(first_tile, end_tile):
        positions = tile * TILE_N + tl.arange(0, TILE_N)
        token_valid = positions < seq_len
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            block_table_ptr,
            seq,
            kv_head,
            positions,
            token_valid,
            dims,
            stride_kb,
            stride_kt,
            stride_kh,
            stride_kd,
            stride_vb,
            stride_vt,
            stride_vh,
            stride_vd,
            stride_btb,
            stride_btm,
            BLOCK_SIZE,
        )
        # Every tile in [first_tile, end_tile) holds at least one valid token, so the max stays
        # finite.
        running_max, running_sum, acc = online_softmax_update(
            q,
            k,
            v,
            token_valid[None, :],
            running_max,
            running_sum,
            acc,
            qk_scale_log2,
            DOT_PRECISION,
        )

    # An empty split writes out = 0 and lse = -inf, which the merge weighs by exp(-inf) = 0.
    has_tokens = running_sum > 0
    safe_sum = tl.where(has_tokens, running_sum, 1.0)
    out = acc / safe_sum[:, None]
    lse = tl.where(
        has_tokens, (running_max + tl.log2(safe_sum)) * LN2, float("-inf")
    )  # natural log

    partial_row = (
        seq * num_q_heads + q_heads
    ) * num_splits + split  # [batch, num_q_heads, num_splits]
    tl.store(
        partial_out_ptr + partial_row[:, None] * HEAD_DIM + dims[None, :],
        out,
        mask=row_valid[:, None],
    )
    tl.store(partial_lse_ptr + partial_row, lse, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    stride_od,
    num_splits,
    HEAD_DIM: tl.constexpr,
    SPLIT_TILE: tl.constexpr,
):
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
        lse = tl.load(
            partial_lse_ptr + first_row + splits, mask=splits < num_splits, other=float("-inf")
        )
        max_lanes = tl.maximum(max_lanes, lse)
    global_max = tl.max(max_lanes, axis=0)

    # Pass 2: weights exp(lse - max) <= 1 cannot overflow; an empty split's weight is exp(-inf) = 0.
    # Its output is added as 0 * part, which is 0 only because stage 1 stores part = 0 for an empty
    # split (0 * NaN is NaN). The defensive merge, for partials from elsewhere, masks the part
    # first: part = tl.where(weight[:, None] > 0, part, 0.0), as merge_partials does.
    weight_lanes = tl.zeros([SPLIT_TILE], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, num_splits, SPLIT_TILE):
        splits = start + lanes
        in_range = splits < num_splits
        lse = tl.load(partial_lse_ptr + first_row + splits, mask=in_range, other=float("-inf"))
        part = tl.load(
            partial_out_ptr + (first_row + splits)[:, None] * HEAD_DIM + dims[None, :],
            mask=in_range[:, None],
            other=0.0,
        )
        weight = tl.exp(lse - global_max)
        weight_lanes += weight
        acc += tl.sum(weight[:, None] * part, axis=0)
    out = acc / tl.sum(weight_lanes, axis=0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
        out.to(out_ptr.dtype.element_ty),
    )


# --------------------------------------------------------------------------- validation


def check_decode_inputs(
    q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, kernel_limits=True
) -> float:
    """Validate every argument of a paged decode attention, the kernel's or a PyTorch path's
    (``kvlab.kernels.paged_attention_torch``); return the resolved softmax scale. ``kernel_limits``:
    also the Triton kernel's own limits (head_dim, power-of-two block size), which the gather path
    does not share.
    """
    _check_types_and_ranks(q, k_cache, v_cache, block_table, seq_lens)
    _check_shapes(q, k_cache, v_cache, block_table, seq_lens, kernel_limits)
    _check_dtypes(q, k_cache, v_cache, block_table, seq_lens)
    require_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens
    )
    _check_lengths_and_blocks(
        block_table, seq_lens, block_size=k_cache.shape[1], num_blocks=k_cache.shape[0]
    )
    if num_splits is not None:
        integer("num_splits", num_splits)
        if num_splits > MAX_GRID_Z:
            raise ValueError(
                f"num_splits must be in [1, {MAX_GRID_Z}] (a CUDA grid dimension), got {num_splits}"
            )
        _check_num_splits(num_splits, seq_lens)
    return resolve_scale(scale, q.shape[-1])


def _check_num_splits(num_splits: int, seq_lens) -> None:
    """At most ``MAX_SPLITS``, or one split per tile of the longest sequence when that is more:
    further splits are empty and only cost launches (minutes under the interpreter)."""
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    limit = max(MAX_SPLITS, -(-longest // TILE_TOKENS))
    if num_splits > limit:
        raise ValueError(
            f"num_splits must be in [1, {limit}] (max({MAX_SPLITS}, tiles of {TILE_TOKENS} tokens"
            f" in the longest sequence, {longest} tokens)), got {num_splits}"
        )


def _check_types_and_ranks(q, k_cache, v_cache, block_table, seq_lens) -> None:
    for name, value in (
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_table", block_table),
        ("seq_lens", seq_lens),
    ):
        require_tensor(name, value)
    require_rank("q", q, "[batch, num_q_heads, head_dim]")
    require_rank("k_cache", k_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("v_cache", v_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("block_table", block_table, "[batch, max_blocks]")
    require_rank("seq_lens", seq_lens, "[batch]")


def _check_shapes(q, k_cache, v_cache, block_table, seq_lens, kernel_limits=True) -> None:
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have equal shapes, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    batch, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f"q head_dim ({head_dim}) must equal k_cache head_dim ({cache_head_dim})")
    if kernel_limits and head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads"
            f" ({num_kv_heads})"
        )
    if kernel_limits and not is_power_of_two(block_size):
        raise ValueError(
            f"block_size (k_cache.shape[1]) must be a power of two >= 1, got {block_size}"
        )
    if num_blocks < 1 or block_size < 1 or head_dim < 1:
        raise ValueError(
            "k_cache must have num_blocks, block_size and head_dim >= 1, "
            f"got shape {tuple(k_cache.shape)}"
        )
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"block_table rows ({block_table.shape[0]}) and seq_lens length ({seq_lens.shape[0]}) "
            f"must both equal the batch size of q ({batch})"
        )


def _check_dtypes(q, k_cache, v_cache, block_table, seq_lens) -> None:
    require_dtype("q", q, FLOAT_DTYPES)
    require_dtype("k_cache", k_cache, FLOAT_DTYPES)
    if v_cache.dtype != k_cache.dtype or q.dtype != k_cache.dtype:
        raise TypeError(
            f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}"
        )
    require_dtype("block_table", block_table, (torch.int32,))
    require_dtype("seq_lens", seq_lens, (torch.int32,))


def _check_lengths_and_blocks(block_table, seq_lens, block_size: int, num_blocks: int) -> None:
    """Lengths in [1, max_blocks * block_size]; every block a sequence uses in [0, num_blocks)."""
    max_blocks = block_table.shape[1]
    capacity = max_blocks * block_size
    lens = seq_lens.to("cpu", torch.int64)
    if lens.numel() and (lens.min() < 1 or lens.max() > capacity):
        bad = int(((lens < 1) | (lens > capacity)).nonzero()[0, 0])
        raise ValueError(
            f"seq_lens[{bad}] = {int(lens[bad])} is outside [1, {capacity}] "
            f"(max_blocks {max_blocks} * block_size {block_size})"
        )
    require_block_table(block_table, lens, block_size, num_blocks)


# --------------------------------------------------------------------------- host side


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, multiprocessors: int) -> int:
    """Splits per sequence so that the stage-1 grid fills the machine (notebook 05b).

    Without splitting there are only ``batch * num_kv_heads`` programs, far fewer than a
    GPU's multiprocessors for a batch-1 decode. Aim for ``PROGRAMS_PER_SM`` programs per
    multiprocessor, but give every split at least ``MIN_TILES_PER_SPLIT`` tiles of the
    longest sequence (shorter ones get empty splits), and stop at ``MAX_SPLITS``.
    """
    for name, value in (
        ("batch", batch),
        ("num_kv_heads", num_kv_heads),
        ("max_seq_len", max_seq_len),
        ("multiprocessors", multiprocessors),
    ):
        integer(name, value)
    wanted = math.ceil(PROGRAMS_PER_SM * multiprocessors / max(1, batch * num_kv_heads))
    useful = math.ceil(max_seq_len / (TILE_TOKENS * MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a fixed small number on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAM_SLOTS


def _group_rows(group: int) -> int:
    """tl.dot needs at least 16 rows: pad the GQA group to a power of two >= 16."""
    return max(16, triton.next_power_of_2(group))


def attend_split_config(
    dtype: torch.dtype, group: int, head_dim: int, block_size: int = 16
) -> KernelConfig:
    """Stage 1 as :func:`paged_decode_unchecked` launches it, for ``triton.compile`` and the
    shared-memory check."""
    t = DTYPES[dtype]
    pointers = dict(
        q_ptr=t,
        k_cache_ptr=t,
        v_cache_ptr=t,
        block_table_ptr="i32",
        seq_lens_ptr="i32",
        partial_out_ptr="fp32",
        partial_lse_ptr="fp32",
    )
    constants = dict(
        GROUP=group,
        GROUP_PAD=_group_rows(group),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE_N=TILE_TOKENS,
        DOT_PRECISION="ieee" if dtype == torch.float32 else None,
    )
    return KernelConfig(
        "attend_split",
        dtype,
        _attend_split_kernel,
        signature(_attend_split_kernel, pointers, ("qk_scale_log2",)),
        constants,
        sizes=dict(head_dim=head_dim, group=group),
    )


def merge_splits_config(dtype: torch.dtype, head_dim: int, num_splits: int) -> KernelConfig:
    """Stage 2 as :func:`paged_decode_unchecked` launches it."""
    pointers = dict(partial_out_ptr="fp32", partial_lse_ptr="fp32", out_ptr=DTYPES[dtype])
    constants = dict(HEAD_DIM=head_dim, SPLIT_TILE=min(16, triton.next_power_of_2(num_splits)))
    return KernelConfig(
        "merge_splits",
        dtype,
        _merge_splits_kernel,
        signature(_merge_splits_kernel, pointers),
        constants,
        sizes=dict(head_dim=head_dim, num_splits=num_splits),
    )


def paged_decode_unchecked(
    q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits: int | None = None
):
    """The kernel's two launches without any check: for a caller that has validated these tensors.

    ``scale`` is the softmax scale (a float); ``num_splits`` None picks a count from the table's
    width, which never reads a tensor on the host, so the call can be captured in a CUDA graph.
    """
    batch, num_q_heads, _ = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_splits is None:
        longest = block_table.shape[1] * block_size
        num_splits = choose_num_splits(
            max(1, batch), num_kv_heads, max(1, longest), multiprocessor_count(q.device)
        )
    partial_out, partial_lse = _launch_attend_split(
        q, k_cache, v_cache, block_table, seq_lens, scale, num_splits
    )
    return _launch_merge(partial_out, partial_lse, torch.empty_like(q))


def _launch_attend_split(q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits: int):
    """Stage 1: every split's normalised output ``[batch, num_q_heads, num_splits, head_dim]`` and
    its log-sum-exp ``[batch, num_q_heads, num_splits]``, both fp32."""
    batch, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    seq_lens = seq_lens.contiguous()  # the kernel indexes it as a flat array
    partial_out = torch.empty(
        (batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )
    partial_lse = torch.empty(
        (batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device
    )
    _attend_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        partial_out,
        partial_lse,
        scale * LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_table.stride(),
        num_q_heads,
        GROUP=group,
        GROUP_PAD=_group_rows(group),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE_N=TILE_TOKENS,
        # fp32 caches: true fp32 products, not TF32 (10-bit mantissa); half caches: the backend
        # default.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        num_warps=4,
    )
    return partial_out, partial_lse


def _launch_merge(partial_out, partial_lse, out):
    """Stage 2: the log-sum-exp merge of the splits into ``out`` ``[batch, num_q_heads,
    head_dim]``."""
    batch, num_q_heads, num_splits, head_dim = partial_out.shape
    _merge_splits_kernel[(batch, num_q_heads)](
        partial_out,
        partial_lse,
        out,
        *out.stride(),
        num_splits,
        HEAD_DIM=head_dim,
        SPLIT_TILE=min(16, triton.next_power_of_2(num_splits)),
    )
    return out


def paged_decode_partials(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """Stage 1 alone, checked as :func:`paged_decode_attention` is (notebook 05b): ``(partial_out,
    partial_lse)``, each split's normalised output ``[batch, num_q_heads, num_splits, head_dim]``
    and the natural log-sum-exp of its scores ``[batch, num_q_heads, num_splits]``, in fp32. A split
    that holds no token of its sequence stores output 0 and log-sum-exp ``-inf``."""
    scale, num_splits = _check_launch(
        q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, "paged_decode_partials"
    )
    return _launch_attend_split(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)


def merge_splits(partial_out, partial_lse, dtype=torch.float32):
    """Stage 2 alone, the Triton merge (notebook 05b): ``[batch, num_q_heads, head_dim]`` in
    ``dtype`` from stage 1's ``partial_out`` ``[batch, num_q_heads, num_splits, head_dim]`` and
    ``partial_lse`` ``[batch, num_q_heads, num_splits]`` (fp32, contiguous, split 0 of every row
    finite).

    Unlike :func:`merge_partials` it does not mask a split whose log-sum-exp is ``-inf``: it adds
    ``0 * partial_out``, which is NaN when that output is NaN. Stage 1 stores 0 there, so the kernel
    is exact; partials from anywhere else need the mask (see the comment in the kernel).
    """
    for name, tensor, layout in (
        ("partial_out", partial_out, "[batch, num_q_heads, num_splits, head_dim]"),
        ("partial_lse", partial_lse, "[batch, num_q_heads, num_splits]"),
    ):
        require_tensor(name, tensor)
        require_rank(name, tensor, layout)
        require_dtype(name, tensor, (torch.float32,))
    if partial_out.shape[:3] != partial_lse.shape or partial_lse.shape[2] < 1:
        raise ValueError(
            "partial_out must be [batch, num_q_heads, num_splits >= 1, head_dim] and partial_lse "
            f"[batch, num_q_heads, num_splits], got {tuple(partial_out.shape)} and "
            f"{tuple(partial_lse.shape)}"
        )
    if partial_out.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"partial_out head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {partial_out.shape[3]}"
        )
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    if not (partial_out.is_contiguous() and partial_lse.is_contiguous()):
        raise ValueError(
            "partial_out and partial_lse must be contiguous (the kernel indexes them as flat rows)"
        )
    require_same_device(partial_out=partial_out, partial_lse=partial_lse)
    require_kernel_device(partial_out.device, _merge_splits_kernel, "merge_splits")
    batch, num_q_heads, _, head_dim = partial_out.shape
    out = torch.empty((batch, num_q_heads, head_dim), dtype=dtype, device=partial_out.device)
    return _launch_merge(partial_out, partial_lse, out) if batch and num_q_heads else out


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """One decode step of attention over a paged KV cache, in Triton (notebooks 05 and 05b).

    Args:
        q: ``[batch, num_q_heads, head_dim]``, float16, bfloat16 or float32.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, q's dtype;
            ``block_size`` a power of two, ``head_dim`` in ``SUPPORTED_HEAD_DIMS``,
            ``num_q_heads`` a multiple of ``num_kv_heads`` (grouped-query attention).
        block_table: int32 ``[batch, max_blocks]``; the first ``ceil(seq_lens[b] / block_size)``
            entries of row ``b`` must be in ``[0, num_blocks)``, the rest are never read.
        seq_lens: int32 ``[batch]``, each in ``[1, max_blocks * block_size]``.
        scale: softmax scale, default ``head_dim ** -0.5``.
        num_splits: how many parts each sequence is split into (split-K); default from
            :func:`choose_num_splits`.

    Returns:
        ``[batch, num_q_heads, head_dim]`` in q's dtype; accumulation is fp32.

    Validation reads ``seq_lens`` and ``block_table`` on the host, one device sync.
    """
    return paged_decode_launcher(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)()


def paged_decode_launcher(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """Validate once, then return a function that launches the kernel on these tensors (notebook
    05b).

    For timing the kernel alone: the tensors' shapes and the validity of their block ids must not
    change between launches.
    """
    scale, num_splits = _check_launch(
        q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, "paged_decode_attention"
    )
    if q.shape[0] == 0:
        return lambda: torch.empty_like(q)
    return lambda: paged_decode_unchecked(
        q, k_cache, v_cache, block_table, seq_lens, scale, num_splits
    )


def _check_launch(
    q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, call: str
) -> tuple[float, int]:
    """Every check of the inputs and of the device, then ``(scale, num_splits)`` resolved."""
    scale = check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)
    require_kernel_device(q.device, _attend_split_kernel, call)
    require_computable_dtype("q", q)
    # A GPU whose blocks cannot hold one program's tiles (head_dim 256 in fp16 on a T4) is refused
    # here.
    require_fits(
        attend_split_config(q.dtype, q.shape[1] // k_cache.shape[2], q.shape[-1], k_cache.shape[1]),
        q.device,
    )
    if num_splits is None:
        longest = int(seq_lens.max()) if q.shape[0] else 1
        num_splits = choose_num_splits(
            max(1, q.shape[0]), k_cache.shape[2], longest, multiprocessor_count(q.device)
        )
    return scale, num_splits
