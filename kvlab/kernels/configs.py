"""Notebooks 05b and 06: the launch geometry of the paged kernels (tile sizes, padded rows, the
decode kernel's split count), and each kernel as its wrapper launches it at one size, a
:class:`KernelConfig` for ``triton.compile`` (``kvlab.kernels.targets``) and the shared-memory
check (``require_fits``).

A builder takes the ``@triton.jit`` function itself, so that this module, which the argument checks
use, needs no kernel module.
"""

from __future__ import annotations

import math

import torch
import triton

from kvlab._checks import integer
from kvlab.kernels.shared_memory import DTYPES, KernelConfig, signature

TILE_TOKENS = 64  # tokens one decode program handles per loop iteration (may span several blocks)
MAX_SPLITS = 256  # the automatic split count never goes beyond this
QUERY_ROWS = 64  # (token, query head) rows of one prefill program, the M of its tl.dot tiles
TILE_KEYS = 64  # keys one prefill program reads per loop iteration (may span several blocks)
PREFILL_WARPS = 4
MIN_TILES_PER_SPLIT = 2  # below this a split's merge overhead outweighs the parallelism it adds
PROGRAMS_PER_SM = 2
CPU_PROGRAM_SLOTS = 4  # stands in for the multiprocessor count under the CPU interpreter


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, multiprocessors: int) -> int:
    """Splits per sequence so that the stage-1 grid fills the machine (notebook 05b).

    Aim for ``PROGRAMS_PER_SM`` programs per multiprocessor, but give every split at least
    ``MIN_TILES_PER_SPLIT`` tiles of the longest sequence (shorter ones get empty splits), and stop
    at ``MAX_SPLITS``.
    """
    for name in ("batch", "num_kv_heads", "max_seq_len", "multiprocessors"):
        integer(name, locals()[name])
    wanted = math.ceil(PROGRAMS_PER_SM * multiprocessors / max(1, batch * num_kv_heads))
    useful = math.ceil(max_seq_len / (TILE_TOKENS * MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a fixed small number on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAM_SLOTS


def splits_for(q, k_cache, longest: int) -> int:
    """:func:`choose_num_splits` for these tensors and a longest sequence of ``longest`` tokens."""
    cores = multiprocessor_count(q.device)
    return choose_num_splits(max(1, q.shape[0]), k_cache.shape[2], longest, cores)


def longest(seq_lens) -> int:
    """The longest sequence, read on the host (1 for an empty batch)."""
    return int(seq_lens.max()) if seq_lens.numel() else 1


def group_rows(group: int) -> int:
    """tl.dot needs 16 rows or more: the decode kernel pads a GQA group to a power of two >= 16."""
    return max(16, triton.next_power_of_2(group))


def query_tokens_per_tile(group: int) -> int:
    """Tokens of one prefill query tile: as many as fill ``QUERY_ROWS`` rows with their ``group``
    heads each."""
    return max(1, QUERY_ROWS // group)


def dot_precision(dtype: torch.dtype):
    """fp32 caches: true fp32 products, not TF32 (10-bit mantissa); half caches: the default."""
    return "ieee" if dtype == torch.float32 else None


def prefill_constants(dtype: torch.dtype, group: int, head_dim: int, block_size: int) -> dict:
    """The prefill kernel's compile-time constants, as its launch passes them."""
    return dict(
        GROUP=group,
        TILE_QUERIES=query_tokens_per_tile(group),
        ROWS=max(QUERY_ROWS, triton.next_power_of_2(group)),  # one token's heads if a group is more
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE_N=TILE_KEYS,
        DOT_PRECISION=dot_precision(dtype),
    )


def attend_split_config(
    kernel, dtype: torch.dtype, group: int, head_dim: int, block_size: int = 16
) -> KernelConfig:
    """Decode stage 1 (``attend_split_kernel``) as ``paged_decode`` launches it."""
    t = DTYPES[dtype]
    pointers = dict(q_ptr=t, k_cache_ptr=t, v_cache_ptr=t, block_table_ptr="i32")
    pointers.update(seq_lens_ptr="i32", partial_out_ptr="fp32", partial_lse_ptr="fp32")
    constants = dict(GROUP=group, GROUP_PAD=group_rows(group), HEAD_DIM=head_dim)
    constants.update(BLOCK_SIZE=block_size, TILE_N=TILE_TOKENS, DOT_PRECISION=dot_precision(dtype))
    sig = signature(kernel, pointers, ("qk_scale_log2",))
    sizes = dict(head_dim=head_dim, group=group)
    return KernelConfig("attend_split", dtype, kernel, sig, constants, sizes=sizes)


def merge_splits_config(kernel, dtype: torch.dtype, head_dim: int, num_splits: int) -> KernelConfig:
    """Decode stage 2 (``merge_splits_kernel``) as ``paged_decode`` launches it."""
    pointers = dict(partial_out_ptr="fp32", partial_lse_ptr="fp32", out_ptr=DTYPES[dtype])
    constants = dict(HEAD_DIM=head_dim, SPLIT_TILE=min(16, triton.next_power_of_2(num_splits)))
    sizes = dict(head_dim=head_dim, num_splits=num_splits)
    return KernelConfig(
        "merge_splits", dtype, kernel, signature(kernel, pointers), constants, sizes=sizes
    )


def paged_prefill_config(
    kernel, dtype: torch.dtype, group: int, head_dim: int, block_size: int = 16
) -> KernelConfig:
    """The prefill kernel (``paged_prefill_kernel``) as ``paged_prefill`` launches it."""
    t = DTYPES[dtype]
    pointers = dict(q_ptr=t, k_cache_ptr=t, v_cache_ptr=t, out_ptr=t, block_table_ptr="i32")
    pointers.update(cu_query_lens_ptr="i32", context_lens_ptr="i32", tiles_ptr="i32")
    constants = prefill_constants(dtype, group, head_dim, block_size)
    sig = signature(kernel, pointers, ("qk_scale_log2",))
    sizes = dict(head_dim=head_dim, group=group)
    return KernelConfig("paged_prefill", dtype, kernel, sig, constants, PREFILL_WARPS, sizes)


def store_kv_config(kernel, dtype: torch.dtype, head_dim: int, block_size: int = 16):
    """The store kernel (``store_kv_kernel``) as ``paged_store`` launches it."""
    t = DTYPES[dtype]
    pointers = dict(k_ptr=t, v_ptr=t, k_cache_ptr=t, v_cache_ptr=t, slot_ptr="i64")
    constants = dict(BLOCK_SIZE=block_size, DIM_PAD=triton.next_power_of_2(head_dim))
    sig = signature(kernel, pointers)
    return KernelConfig("store_kv", dtype, kernel, sig, constants, sizes=dict(head_dim=head_dim))
