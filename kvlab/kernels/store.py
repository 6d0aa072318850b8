"""Notebooks 05 and 11: write new tokens' K and V into the paged KV cache (Kwon et al. 2023).

``slot_mapping[i]`` says where token ``i`` goes: ``slot = block * block_size + offset``,
so the token lands in ``k_cache[block, offset]``. A slot of -1 means "do not store"
(padding tokens in a batch, such as a CUDA graph's spare rows).

:func:`store_kv` checks every argument and calls :func:`store_kv_unchecked`, the launch alone, which
a caller that validated a step's slots once calls in every layer; :func:`store_kv_ref` is the
plain-PyTorch reference with the same signature and checks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvlab.kernels._validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    require_disjoint,
    require_dtype,
    require_kernel_device,
    require_no_overlap,
    require_rank,
    require_same_device,
    require_tensor,
)
from kvlab.kernels.shared_memory import KernelConfig, signature


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kco,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vco,
    stride_vch,
    stride_vcd,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
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
    tl.store(
        k_cache_ptr
        + block * stride_kcb
        + offset * stride_kco
        + head * stride_kch
        + dims * stride_kcd,
        k,
        mask=mask,
    )
    tl.store(
        v_cache_ptr
        + block * stride_vcb
        + offset * stride_vco
        + head * stride_vch
        + dims * stride_vcd,
        v,
        mask=mask,
    )


def store_kv_config(dtype: torch.dtype, head_dim: int, block_size: int = 16) -> KernelConfig:
    """The kernel as :func:`store_kv_unchecked` launches it, for ``triton.compile``."""
    t = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    pointers = dict(k_ptr=t, v_ptr=t, k_cache_ptr=t, v_cache_ptr=t, slot_ptr="i64")
    constants = dict(BLOCK_SIZE=block_size, DIM_PAD=triton.next_power_of_2(head_dim))
    return KernelConfig(
        "store_kv",
        dtype,
        _store_kv_kernel,
        signature(_store_kv_kernel, pointers),
        constants,
        sizes=dict(head_dim=head_dim),
    )


def _check_inputs(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Validate every argument of store_kv."""
    for name, value in (
        ("k", k),
        ("v", v),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("slot_mapping", slot_mapping),
    ):
        require_tensor(name, value)
    require_rank("k", k, "[num_tokens, num_kv_heads, head_dim]")
    require_rank("v", v, "[num_tokens, num_kv_heads, head_dim]")
    require_rank("k_cache", k_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("v_cache", v_cache, "[num_blocks, block_size, num_kv_heads, head_dim]")
    require_rank("slot_mapping", slot_mapping, "[num_tokens]")
    _check_shapes(k, v, k_cache, v_cache, slot_mapping)
    require_dtype("k_cache", k_cache, FLOAT_DTYPES)
    if not (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"k, v, k_cache and v_cache must share one dtype, got {k.dtype}, {v.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}"
        )
    require_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    require_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    require_no_overlap("k_cache", k_cache)  # written in place
    require_no_overlap("v_cache", v_cache)
    require_disjoint("k_cache", k_cache, "v_cache", v_cache)
    for name, t in (("k", k), ("v", v)):  # a token read from the pool being written would race
        require_disjoint(name, t, "k_cache", k_cache)
        require_disjoint(name, t, "v_cache", v_cache)
    _check_slots(slot_mapping, num_slots=k_cache.shape[0] * k_cache.shape[1])


def _check_shapes(k, v, k_cache, v_cache, slot_mapping) -> None:
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have equal shapes, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have equal shapes, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k's [num_kv_heads, head_dim] {tuple(k.shape[1:])} must match k_cache's "
            f"{tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping length ({slot_mapping.shape[0]}) must equal num_tokens ({k.shape[0]})"
        )


def _check_slots(slot_mapping, num_slots: int) -> None:
    """Slots in [-1, num_slots), and no slot written twice (the writes would race)."""
    slots = slot_mapping.to("cpu", torch.int64)
    bad = (slots < -1) | (slots >= num_slots)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"slot_mapping[{i}] = {int(slots[i])} is outside [-1, {num_slots}) "
            "(-1 skips a token; num_blocks * block_size slots exist)"
        )
    stored = slots[slots >= 0]
    unique, counts = stored.unique(return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"slot_mapping writes slot {int(unique[counts > 1][0])} more than once")


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Store each token's K and V at its slot of the paged cache, in Triton (notebook 05).

    Args:
        k, v: ``[num_tokens, num_kv_heads, head_dim]``, the caches' dtype.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place.
        slot_mapping: int32 or int64 ``[num_tokens]``, each ``block * block_size + offset``
            in ``[0, num_blocks * block_size)``, or -1 to skip the token; no slot twice.
    """
    _check_inputs(k, v, k_cache, v_cache, slot_mapping)
    require_kernel_device(k.device, _store_kv_kernel, "store_kv")
    store_kv_unchecked(k, v, k_cache, v_cache, slot_mapping)


def store_kv_unchecked(k, v, k_cache, v_cache, slot_mapping) -> None:
    """:func:`store_kv`'s launch without any check (no host sync): for validated slots."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.contiguous(),
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        DIM_PAD=triton.next_power_of_2(head_dim),
    )


def store_kv_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Plain-PyTorch :func:`store_kv`, same signature and checks (notebook 05)."""
    _check_inputs(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    k_cache[slots // block_size, slots % block_size] = k[keep]
    v_cache[slots // block_size, slots % block_size] = v[keep]
