"""What each NVIDIA GPU generation can run of kvlab's Triton kernels (sections 9.5 and 9.6).

``triton.compile`` builds a kernel for any CUDA target without a GPU (Triton ships ``ptxas``), and
the compiled kernel states how much shared memory one program needs. A program needs all of it
resident on one multiprocessor, so a kernel that asks for more than the target's per-block limit
cannot launch there at all: the paged-attention kernel at head_dim 256 in fp16 needs more than a
T4 has. The wrappers ask this module before the first launch on a GPU (:func:`require_fits`), and
the test suite compiles every kernel for sm_75, sm_80 and sm_90 on a CPU-only machine.

Compiling needs Triton's real frontend: under ``TRITON_INTERPRET=1`` (a CPU run of kvlab) call
``python -m kvlab.kernels.targets`` with ``TRITON_INTERPRET=0`` instead, as the tests do.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import torch

# Largest shared memory one block may use (the opt-in maximum), by compute capability, from NVIDIA's
# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability".
SHARED_MEMORY_PER_BLOCK = {
    70: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024,
    90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024,
}
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
TARGETS = (75, 80, 90)


def shared_memory_limit(capability: int) -> int:
    """Bytes of shared memory one block may use on a target (the nearest lower known generation)."""
    known = [c for c in SHARED_MEMORY_PER_BLOCK if c <= capability]
    if not known:
        raise ValueError(f"capability must be 7.0 (sm_70) or later, got sm_{capability}")
    return SHARED_MEMORY_PER_BLOCK[max(known)]


def _signature(kernel, pointers: dict, floats=()) -> dict:
    """Triton types of a kernel's arguments: named pointers, fp32 scalars, i32 for the rest."""
    sig = {}
    for name in kernel.arg_names:
        if name in pointers:
            sig[name] = "*" + pointers[name]
        elif name in floats:
            sig[name] = "fp32"
        elif name.isupper():
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    return sig


def _configs(name: str, dtype: torch.dtype, **sizes):
    """(kernel, signature, constants, num_warps) of one kvlab kernel at one size, as its wrapper launches it."""
    import triton

    from kvlab.kernels import paged_attention, paged_prefill, ssm_scan
    from kvlab.kernels.store_kv import _store_kv_kernel

    t = DTYPES[dtype]
    if name == "attend_split":
        k = paged_attention._attend_split_kernel
        group, head_dim = sizes["group"], sizes["head_dim"]
        pointers = dict(q_ptr=t, k_cache_ptr=t, v_cache_ptr=t, block_table_ptr="i32", seq_lens_ptr="i32",
                        partial_out_ptr="fp32", partial_lse_ptr="fp32")
        constants = dict(GROUP=group, GROUP_PAD=paged_attention._group_rows(group), HEAD_DIM=head_dim,
                         BLOCK_SIZE=sizes.get("block_size", 16), TILE_N=paged_attention.TILE_TOKENS,
                         DOT_PRECISION="ieee" if dtype == torch.float32 else None)
        return k, _signature(k, pointers, ("qk_scale_log2",)), constants, 4
    if name == "merge_splits":
        k = paged_attention._merge_splits_kernel
        pointers = dict(partial_out_ptr="fp32", partial_lse_ptr="fp32", out_ptr=t)
        constants = dict(HEAD_DIM=sizes["head_dim"], SPLIT_TILE=min(16, triton.next_power_of_2(sizes["num_splits"])))
        return k, _signature(k, pointers), constants, 4
    if name == "store_kv":
        k = _store_kv_kernel
        pointers = dict(k_ptr=t, v_ptr=t, k_cache_ptr=t, v_cache_ptr=t, slot_ptr="i64")
        constants = dict(BLOCK_SIZE=sizes.get("block_size", 16), DIM_PAD=triton.next_power_of_2(sizes["head_dim"]))
        return k, _signature(k, pointers), constants, 4
    if name == "ssm_update":
        k = ssm_scan._selective_state_update_kernel
        pointers = {p: t for p in k.arg_names if p.endswith("_ptr")}
        pointers.update(A_ptr="fp32", D_ptr="fp32", bias_ptr="fp32")
        constants = dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, BLOCK_DIM=ssm_scan.BLOCK_DIM,
                         STATE_PAD=max(triton.next_power_of_2(sizes["state"]), 2))
        return k, _signature(k, pointers), constants, 4
    if name == "paged_prefill":
        k = paged_prefill._prefill_kernel
        pointers = dict(q_ptr=t, k_cache_ptr=t, v_cache_ptr=t, out_ptr=t, block_table_ptr="i32",
                        cu_query_lens_ptr="i32", context_lens_ptr="i32", tiles_ptr="i32")
        constants = paged_prefill._constants(dtype, sizes["group"], sizes["head_dim"], sizes.get("block_size", 16))
        return k, _signature(k, pointers, ("qk_scale_log2",)), constants, paged_prefill.NUM_WARPS
    raise ValueError(f"unknown kernel {name!r}")


@functools.lru_cache(maxsize=None)
def compiled_shared_memory(name: str, dtype: torch.dtype, capability: int, **sizes) -> int:
    """Compile one kernel for ``sm_<capability>`` (no GPU needed) and return its shared memory in bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("ahead-of-time compilation needs TRITON_INTERPRET=0 (Triton's interpreter is on)")
    kernel, signature, constants, num_warps = _configs(name, dtype, **sizes)
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", capability, 32),
                              options=dict(num_warps=num_warps))
    return compiled.metadata.shared


def require_fits(name: str, dtype: torch.dtype, device, **sizes) -> None:
    """Refuse, before any launch, a kernel configuration whose program needs more shared memory than
    one block of ``device`` may have (a CPU under the interpreter has no such limit)."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    major, minor = torch.cuda.get_device_capability(device)
    capability = 10 * major + minor
    needed = compiled_shared_memory(name, dtype, capability, **sizes)
    # The device's own figure where torch reports it, else the table's for its generation.
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    limit = limit or shared_memory_limit(capability)
    check_fits(name, dtype, capability, needed, limit, **sizes)


def check_fits(name: str, dtype: torch.dtype, capability: int, needed: int, limit: int, **sizes) -> None:
    if needed > limit:
        where = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise ValueError(
            f"the {name} kernel at {where} in {DTYPES[dtype]} needs {needed} bytes of shared memory per "
            f"program; sm_{capability} allows {limit} per block. Use a smaller head_dim, or a GPU of a later "
            "generation")


def _main(argv) -> int:
    """``python -m kvlab.kernels.targets JSON``: shared memory of each requested configuration, as JSON."""
    results = []
    for config in json.loads(argv[0]):
        dtype = getattr(torch, config.pop("dtype"))
        name, capability = config.pop("kernel"), config.pop("capability")
        shared = compiled_shared_memory(name, dtype, capability, **config)
        results.append(dict(config, kernel=name, dtype=DTYPES[dtype], capability=capability, shared=shared))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
