"""Paged prefill ("extend") attention (notebooks 06 and 11; section 9.5, PagedAttention), in Triton.

One step of a serving engine: each sequence brings a chunk of new query tokens (a whole prompt, a
piece of one, or the suffix after a cached prefix) whose K and V are already stored in the paged
pools, and attends to its cached tokens and, causally, to its own chunk:

    q               : [num_tokens, num_q_heads, head_dim]   the step's new tokens, packed
    cu_query_lens   : int32 [batch + 1]    sequence b's tokens are
    q[cu_query_lens[b]:cu_query_lens[b + 1]] context_lens    : int32 [batch]        cached + new
    tokens of each sequence block_table     : int32 [batch, max_blocks] k_cache, v_cache:
    [num_blocks, block_size, num_kv_heads, head_dim]

With ``n = cu_query_lens[b + 1] - cu_query_lens[b]`` and ``c = context_lens[b]``, the chunk's tokens
sit at positions ``c - n, ..., c - 1`` of sequence b, and query ``i`` of the chunk sees the keys at
positions ``0 ... c - n + i``: the whole cached prefix, and the chunk up to itself. A decode step is
the case ``n = 1``; an empty cached prefix is ``n = c``; a chunk may start and end inside a block.

How the work is cut. FlashAttention-2's varlen kernel (Dao 2023) gives each program one tile of
consecutive query tokens of one sequence for one query head, on a grid sized by the longest
sequence, where programs past a shorter sequence's end exit at once. FlashInfer (Ye et al. 2025)
packs the query heads that share a KV head into the rows of one tile, so each K and V tile serves
the whole group, and plans the list of tiles on the host before the launch. This kernel does both:
a program takes one KV head and one *query tile*, whose rows are the (token, query head) pairs of a
run of tokens of one chunk and of the ``group`` query heads of that KV head (as in the decode
kernel, every K and V tile it reads through the block table serves the whole group). It loops over
the keys from position 0 to the tile's last query with an online softmax in fp32, masking the keys
a row may not see (each tile of keys is read and folded in by the two steps of
``kvlab.kernels.paged_tile``, which the decode kernel shares). :func:`plan_query_tiles` lists the
tiles once per step, heaviest first, so a batch that mixes a long prompt with short chunks launches
no empty programs.

Not done here: splitting one tile's keys across programs and merging the parts, as FlashInfer does
for long contexts (a short chunk behind a very long prefix runs on few programs; for one-token rows
the decode kernel's split-K does it), and skipping the mask on key tiles that every row sees whole.
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
from kvlab.theory.prefill_attention import PrefillWork, prefill_attention_work

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
QUERY_ROWS = 64  # (token, query head) rows of one program, the M of its tl.dot tiles
TILE_KEYS = 64  # keys one program reads per loop iteration (may span several blocks)
NUM_WARPS = 4
LOG2E = 1.0 / math.log(2.0)  # scores go through exp2, so the scale carries log2(e)


# --------------------------------------------------------------------------- the kernel


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    cu_query_lens_ptr,
    context_lens_ptr,
    tiles_ptr,
    out_ptr,
    qk_scale_log2,
    stride_qt,
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
    stride_ot,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    TILE_QUERIES: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tiles_ptr + 2 * tile)
    first_query = tl.load(
        tiles_ptr + 2 * tile + 1
    )  # index of the tile's first token within the chunk
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
    q = tl.load(
        q_ptr
        + (q_begin + token)[:, None] * stride_qt
        + q_heads[:, None] * stride_qh
        + dims[None, :] * stride_qd,
        mask=row_valid[:, None],
        other=0.0,
    )

    # The tile's last query sees keys 0 ... key_end - 1; no row of the tile sees further.
    key_end = cached_len + tl.minimum(first_query + TILE_QUERIES, query_len)
    running_max = tl.full([ROWS], float("-inf"), tl.float32)  # in log2 units
    running_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for key_tile in range(0, tl.cdiv(key_end, TILE_N)):
        positions = key_tile * TILE_N + tl.arange(0, TILE_N)
        key_valid = positions < key_end
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            block_table_ptr,
            seq,
            kv_head,
            positions,
            key_valid,
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
        visible = key_valid[None, :] & (
            positions[None, :] <= q_pos[:, None]
        )  # causal within the chunk
        # Key 0 is in the first tile and every row sees it, so the max is finite from then on.
        running_max, running_sum, acc = online_softmax_update(
            q, k, v, visible, running_max, running_sum, acc, qk_scale_log2, DOT_PRECISION
        )

    out = acc / running_sum[:, None]
    tl.store(
        out_ptr
        + (q_begin + token)[:, None] * stride_ot
        + q_heads[:, None] * stride_oh
        + dims[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None],
    )


# --------------------------------------------------------------------------- tiles and launch


def query_tokens_per_tile(group: int) -> int:
    """Tokens of one query tile: as many as fill ``QUERY_ROWS`` rows with their ``group`` heads
    each."""
    return max(1, QUERY_ROWS // group)


def _rows(group: int) -> int:
    """Rows of one program: ``QUERY_ROWS``, or one token's heads where a group is larger."""
    return max(QUERY_ROWS, triton.next_power_of_2(group))


def _constants(dtype: torch.dtype, group: int, head_dim: int, block_size: int) -> dict:
    """The kernel's compile-time constants, as :func:`paged_prefill_unchecked` passes them."""
    return dict(
        GROUP=group,
        TILE_QUERIES=query_tokens_per_tile(group),
        ROWS=_rows(group),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE_N=TILE_KEYS,
        # fp32 caches: true fp32 products, not TF32 (10-bit mantissa); half caches: the backend
        # default.
        DOT_PRECISION="ieee" if dtype == torch.float32 else None,
    )


def paged_prefill_config(
    dtype: torch.dtype, group: int, head_dim: int, block_size: int = 16
) -> KernelConfig:
    """The kernel as :func:`paged_prefill_unchecked` launches it, for ``triton.compile`` and the
    shared-memory check (``kvlab.kernels.targets``, ``require_fits``)."""
    t = DTYPES[dtype]
    pointers = dict(
        q_ptr=t,
        k_cache_ptr=t,
        v_cache_ptr=t,
        out_ptr=t,
        block_table_ptr="i32",
        cu_query_lens_ptr="i32",
        context_lens_ptr="i32",
        tiles_ptr="i32",
    )
    return KernelConfig(
        "paged_prefill",
        dtype,
        _prefill_kernel,
        signature(_prefill_kernel, pointers, ("qk_scale_log2",)),
        _constants(dtype, group, head_dim, block_size),
        NUM_WARPS,
        sizes=dict(head_dim=head_dim, group=group),
    )


def plan_query_tiles(query_lens, context_lens, group: int, device="cpu") -> torch.Tensor:
    """The query tiles of one step, int32 ``[num_tiles, 2]``: (sequence, first token within its
    chunk).

    From host lists of each sequence's new tokens and context length (what an engine's scheduler
    has when it builds a step). A sequence with no new tokens gets no tile. Tiles are ordered by the
    keys they read, most first, so the longest programs start first and the GPU's tail is short.
    """
    group = integer("group", group)
    if len(query_lens) != len(context_lens):
        raise ValueError(
            f"query_lens and context_lens must have one entry per sequence, got {len(query_lens)} "
            f"and {len(context_lens)}"
        )
    for b, (n, c) in enumerate(zip(query_lens, context_lens)):
        integer(f"context_lens[{b}]", c, integer(f"query_lens[{b}]", n, 0))
    per_tile = query_tokens_per_tile(group)
    tiles = [(seq, start) for seq, n in enumerate(query_lens) for start in range(0, n, per_tile)]
    keys = [
        context_lens[seq] - query_lens[seq] + min(start + per_tile, query_lens[seq])
        for seq, start in tiles
    ]
    order = sorted(range(len(tiles)), key=lambda i: -keys[i])
    return torch.tensor([tiles[i] for i in order], dtype=torch.int32, device=device).reshape(
        len(tiles), 2
    )


def paged_prefill_unchecked(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale: float, tiles
) -> torch.Tensor:
    """The kernel without checks: for a caller that validated the step (see
    :func:`paged_prefill_attention`) and planned its ``tiles`` with :func:`plan_query_tiles`."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if tiles.shape[0] == 0:
        return out
    _prefill_kernel[(tiles.shape[0], num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_table,
        cu_query_lens.contiguous(),
        context_lens.contiguous(),
        tiles.contiguous(),
        out,
        scale * LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_table.stride(),
        *out.stride(),
        **_constants(q.dtype, group, head_dim, block_size),
        num_warps=NUM_WARPS,
    )
    return out


def paged_prefill_attention(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Causal attention of each sequence's new tokens to its paged context, in Triton (notebooks 06,
    11).

    Args:
        q: ``[num_tokens, num_q_heads, head_dim]``, float16, bfloat16 or float32: the step's new
            tokens, sequence by sequence.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, q's dtype, holding
            every context token's K and V, the new tokens' included (store them first, e.g. with
            ``store_kv``); ``block_size`` a power of two, ``head_dim`` in ``SUPPORTED_HEAD_DIMS``,
            ``num_q_heads`` a multiple of ``num_kv_heads`` (grouped-query attention).
        block_table: int32 ``[batch, max_blocks]``; the first ``ceil(context_lens[b] / block_size)``
            entries of row ``b`` must be in ``[0, num_blocks)``, the rest are never read.
        cu_query_lens: int32 ``[batch + 1]``, non-decreasing from 0 to ``num_tokens``; sequence
            ``b``'s new tokens are ``q[cu_query_lens[b]:cu_query_lens[b + 1]]`` (none is allowed).
        context_lens: int32 ``[batch]``, cached plus new tokens, each in
            ``[its new tokens, max_blocks * block_size]``; the new tokens are the last of the
            context.
        scale: softmax scale, default ``head_dim ** -0.5``.

    Returns:
        ``[num_tokens, num_q_heads, head_dim]`` in q's dtype; accumulation is fp32. Token ``i`` of
        sequence ``b``'s chunk attends to positions ``0 ... context_lens[b] - n_b + i``.

    Validation reads the lengths and block table on the host, one device sync.
    """
    return paged_prefill_launcher(
        q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale
    )()


def paged_prefill_launcher(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Validate once and plan the tiles, then return a function that launches the kernel (notebooks
    06, 11).

    For timing the kernel alone. The tensors' shapes and contents must not change between launches.
    """
    scale = _check_inputs(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale)
    require_kernel_device(q.device)
    require_computable_dtype("q", q)
    group = q.shape[1] // k_cache.shape[2]
    require_fits(paged_prefill_config(q.dtype, group, q.shape[-1], k_cache.shape[1]), q.device)
    cu = cu_query_lens.tolist()
    query_lens = [b - a for a, b in zip(cu, cu[1:])]
    tiles = plan_query_tiles(query_lens, context_lens.tolist(), group, q.device)
    return lambda: paged_prefill_unchecked(
        q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale, tiles
    )


def paged_prefill_work(q, k_cache, cu_query_lens, context_lens) -> PrefillWork:
    """FLOPs and bytes of one launch on these tensors (``kvlab.theory.prefill_attention``), with
    this kernel's query tile, so that a measured time gives fractions of the machine's ceilings."""
    cu = cu_query_lens.tolist()
    group = q.shape[1] // k_cache.shape[2]
    return prefill_attention_work(
        [b - a for a, b in zip(cu, cu[1:])],
        context_lens.tolist(),
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        q.element_size(),
        k_cache.shape[1],
        query_tokens_per_tile(group),
    )


# --------------------------------------------------------------------------- the fp64 reference


def paged_prefill_attention_ref(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Plain-PyTorch paged prefill attention in float64, same signature and checks (notebooks 06,
    11).

    Gathers each sequence's context through its block table, repeats each KV head over its GQA
    group, and applies softmax attention with the causal mask of the chunk; returns q's dtype.
    """
    scale = _check_inputs(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale)
    group = q.shape[1] // k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    cu = cu_query_lens.tolist()
    for b, context in enumerate(context_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if start == end:
            continue
        blocks = block_table[b, : -(-context // block_size)].long()
        keys = k_cache[blocks].flatten(0, 1)[:context].double().repeat_interleave(group, dim=1)
        values = v_cache[blocks].flatten(0, 1)[:context].double().repeat_interleave(group, dim=1)
        scores = (
            torch.einsum("ihd,thd->hit", q[start:end].double(), keys) * scale
        )  # [heads, n, context]
        query_pos = torch.arange(context - (end - start), context, device=q.device)
        hidden = torch.arange(context, device=q.device)[None, :] > query_pos[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
        out[start:end] = torch.einsum("hit,thd->ihd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


# --------------------------------------------------------------------------- validation


def _check_inputs(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale) -> float:
    """Validate every argument (notebooks 06, 11); return the resolved softmax scale."""
    for name, value in (
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_table", block_table),
        ("cu_query_lens", cu_query_lens),
        ("context_lens", context_lens),
    ):
        require_tensor(name, value)
    require_rank("q", q, "[num_tokens, num_q_heads, head_dim]")
    require_rank("k_cache", k_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("v_cache", v_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("block_table", block_table, "[batch, max_blocks]")
    require_rank("cu_query_lens", cu_query_lens, "[batch + 1]")
    require_rank("context_lens", context_lens, "[batch]")
    _check_shapes(q, k_cache, v_cache, block_table, cu_query_lens, context_lens)
    require_dtype("q", q, FLOAT_DTYPES)
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype},"
            f" {v_cache.dtype}"
        )
    for name, value in (
        ("block_table", block_table),
        ("cu_query_lens", cu_query_lens),
        ("context_lens", context_lens),
    ):
        require_dtype(name, value, (torch.int32,))
    require_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table,
        cu_query_lens=cu_query_lens,
        context_lens=context_lens,
    )
    query_lens = _check_query_lens(cu_query_lens, q.shape[0])
    _check_context(
        block_table,
        context_lens,
        query_lens,
        block_size=k_cache.shape[1],
        num_blocks=k_cache.shape[0],
    )
    return resolve_scale(scale, q.shape[-1])


def _check_shapes(q, k_cache, v_cache, block_table, cu_query_lens, context_lens) -> None:
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have equal shapes, got {tuple(k_cache.shape)} and "
            f"{tuple(v_cache.shape)}"
        )
    _, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f"q head_dim ({head_dim}) must equal k_cache head_dim ({cache_head_dim})")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads"
            f" ({num_kv_heads})"
        )
    if not is_power_of_two(block_size):
        raise ValueError(
            f"block_size (k_cache.shape[1]) must be a power of two >= 1, got {block_size}"
        )
    if num_blocks < 1:
        raise ValueError(f"k_cache must have num_blocks >= 1, got shape {tuple(k_cache.shape)}")
    batch = context_lens.shape[0]
    if block_table.shape[0] != batch or cu_query_lens.shape[0] != batch + 1:
        raise ValueError(
            f"block_table rows ({block_table.shape[0]}) must equal the batch size of context_lens "
            f"({batch}), and cu_query_lens must have batch + 1 = {batch + 1} entries, got "
            f"{cu_query_lens.shape[0]}"
        )


def _check_query_lens(cu_query_lens, num_tokens: int) -> torch.Tensor:
    """cu_query_lens goes from 0 to num_tokens without decreasing; returns each sequence's new
    tokens."""
    cu = cu_query_lens.to("cpu", torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != num_tokens:
        raise ValueError(
            f"cu_query_lens must start at 0 and end at num_tokens (q.shape[0] = {num_tokens}), "
            f"got {int(cu[0])} ... {int(cu[-1])}"
        )
    query_lens = cu[1:] - cu[:-1]
    if (query_lens < 0).any():
        b = int((query_lens < 0).nonzero()[0, 0])
        raise ValueError(
            f"cu_query_lens must not decrease, got cu_query_lens[{b}] = {int(cu[b])} > "
            f"cu_query_lens[{b + 1}] = {int(cu[b + 1])}"
        )
    return query_lens


def _check_context(block_table, context_lens, query_lens, block_size: int, num_blocks: int) -> None:
    """Each context in [its new tokens, max_blocks * block_size]; every block it uses in [0,
    num_blocks)."""
    max_blocks = block_table.shape[1]
    capacity = max_blocks * block_size
    lens = context_lens.to("cpu", torch.int64)
    bad = (lens < query_lens) | (lens > capacity)
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"context_lens[{b}] = {int(lens[b])} is outside [{int(query_lens[b])}, {capacity}] "
            f"(its new tokens in cu_query_lens, max_blocks {max_blocks} * block_size {block_size})"
        )
    require_block_table(block_table, lens, block_size, num_blocks)
