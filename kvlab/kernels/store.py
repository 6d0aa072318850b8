"""Notebooks 05 and 11: write new tokens' K and V into the paged KV cache (Kwon et al. 2023).

``slot_mapping[i] = block * block_size + offset`` puts token ``i`` in ``k_cache[block, offset]``;
-1 skips it (padding tokens in a batch, such as a CUDA graph's spare rows).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvlab.kernels._validation import check_store


# fmt: off
@triton.jit
def store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kco, stride_kch, stride_kcd,
    stride_vcb, stride_vco, stride_vch, stride_vcd,
    head_dim, BLOCK_SIZE: tl.constexpr, DIM_PAD: tl.constexpr,
):
    # fmt: on
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    dims = tl.arange(0, DIM_PAD)
    mask = (dims < head_dim) & (tl.zeros([DIM_PAD], tl.int64) + slot >= 0)  # slot -1: store nothing
    slot = tl.maximum(slot, 0)  # a skipped token still gets an in-bounds (masked) address
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    k = tl.load(k_ptr + token * stride_kt + head * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dims * stride_vd, mask=mask)
    k_dst = block * stride_kcb + offset * stride_kco + head * stride_kch + dims * stride_kcd
    v_dst = block * stride_vcb + offset * stride_vco + head * stride_vch + dims * stride_vcd
    tl.store(k_cache_ptr + k_dst, k, mask=mask)
    tl.store(v_cache_ptr + v_dst, v, mask=mask)


def paged_store(k, v, k_cache, v_cache, slot_mapping) -> None:
    """:func:`store_kv`'s launch, unchecked (no host sync)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    store_kv_kernel[(num_tokens, num_kv_heads)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(),
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(), head_dim,
        BLOCK_SIZE=k_cache.shape[1], DIM_PAD=triton.next_power_of_2(head_dim),
    )  # fmt: skip


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Store each token's K and V ``[num_tokens, num_kv_heads, head_dim]`` at its slot, in Triton;
    ``slot_mapping`` int32/int64, each in ``[0, num_blocks * block_size)`` or -1, none twice."""
    check_store(k, v, k_cache, v_cache, slot_mapping, store_kv_kernel)
    paged_store(k, v, k_cache, v_cache, slot_mapping)
