"""Notebooks 05, 05b, 06 and 11: the two steps a paged attention kernel repeats for each tile of
keys, in both the decode and the prefill kernel: :func:`load_kv_tile` reads the tile's K and V
through the block table, and :func:`online_softmax_update` folds it into every query row's running
softmax (FlashAttention's online softmax, in fp32 and in log2 units: scores go through ``exp2``).
Triton inlines ``@triton.jit`` helpers into the kernel that calls them: no call, no extra traffic.
"""

from __future__ import annotations

import triton
import triton.language as tl


# fmt: off
@triton.jit
def load_kv_tile(
    k_cache_ptr, v_cache_ptr, block_table_ptr, seq, kv_head, positions, valid, dims,
    stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
    stride_btb, stride_btm, BLOCK_SIZE: tl.constexpr,
):
    # fmt: on
    """K and V of sequence ``seq``'s tokens at ``positions`` for one KV head, ``[TILE_N, HEAD_DIM]``
    each; a token where ``valid`` is false reads zeros. It looks the block table up once per token,
    so a tile may cover many small blocks or part of a big one; vLLM and FlashInfer look it up once
    per block, and load a block's tokens together.
    """
    entries = block_table_ptr + seq * stride_btb + (positions // BLOCK_SIZE) * stride_btm
    blocks = tl.load(entries, mask=valid, other=0).to(tl.int64)
    offsets = positions % BLOCK_SIZE
    k_rows = blocks[:, None] * stride_kb + offsets[:, None] * stride_kt + kv_head * stride_kh
    v_rows = blocks[:, None] * stride_vb + offsets[:, None] * stride_vt + kv_head * stride_vh
    k = tl.load(k_cache_ptr + k_rows + dims[None, :] * stride_kd, mask=valid[:, None], other=0.0)
    v = tl.load(v_cache_ptr + v_rows + dims[None, :] * stride_vd, mask=valid[:, None], other=0.0)
    return k, v


@triton.jit
def online_softmax_update(
    q, k, v, visible, running_max, running_sum, acc, qk_scale_log2, DOT_PRECISION: tl.constexpr
):
    """Fold one tile of keys into each query row's running ``(max, sum, acc)``; ``visible``
    broadcasts to ``[ROWS, TILE_N]``, ``acc`` is not yet divided by ``running_sum``. A row must see
    a key of the first tile it is given: its max is ``-inf`` until then, and ``-inf - -inf`` is NaN.
    """
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    rescale = tl.exp2(running_max - new_max)
    p = tl.exp2(scores - new_max[:, None])
    running_sum = running_sum * rescale + tl.sum(p, axis=1)
    acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return new_max, running_sum, acc
