"""Notebook 05b: how much shared memory one program of a Triton kernel needs, and whether a GPU has
it.

``triton.compile`` builds a kernel for any CUDA target without a GPU (Triton ships ``ptxas``), and
the compiled kernel states how much shared memory one program needs. A program needs all of it
resident on one multiprocessor, so a kernel that asks for more than the target's per-block limit
cannot launch there at all: the paged-attention kernel at head_dim 256 in fp16 needs more than a
T4 has. Each kernel module describes its own launches (a :class:`KernelConfig`) and asks
:func:`require_fits` before its first launch on a GPU; :mod:`kvlab.kernels.targets` compiles every
kernel for sm_75, sm_80 and sm_90 on a CPU-only machine.

Compiling needs Triton's real frontend: with the interpreter on (a CPU run of kvlab), compile in a
process started with ``TRITON_INTERPRET=0``, as the tests do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

# Largest shared memory one block may use (the opt-in maximum), by compute capability, from NVIDIA's
# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability".
SHARED_MEMORY_PER_BLOCK = {
    70: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
TARGETS = (75, 80, 90)
_COMPILED: dict = {}  # (name, dtype, sizes, capability) -> bytes, filled by compiled_shared_memory


@dataclass(frozen=True)
class KernelConfig:
    """One kernel as its wrapper launches it at one size: what ``triton.compile`` needs."""

    name: str
    dtype: torch.dtype
    kernel: object  # the @triton.jit function
    signature: dict
    constants: dict
    num_warps: int = 4
    sizes: dict = field(default_factory=dict)  # the sizes that chose the constants, for messages

    @property
    def key(self) -> tuple:
        return self.name, self.dtype, tuple(sorted(self.sizes.items()))


def signature(kernel, pointers: dict, floats=()) -> dict:
    """Triton types of a kernel's arguments: named pointers, fp32 scalars, constexpr for UPPER
    names, i32 for the rest."""
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


def shared_memory_limit(capability: int) -> int:
    """Bytes of shared memory one block may use on a target (the nearest lower known generation)."""
    known = [c for c in SHARED_MEMORY_PER_BLOCK if c <= capability]
    if not known:
        raise ValueError(f"capability must be 7.0 (sm_70) or later, got sm_{capability}")
    return SHARED_MEMORY_PER_BLOCK[max(known)]


def compiled_shared_memory(config: KernelConfig, capability: int) -> int:
    """Compile ``config`` for ``sm_<capability>`` (no GPU needed) and return its shared memory in
    bytes."""
    key = (*config.key, capability)
    if key not in _COMPILED:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        if os.environ.get("TRITON_INTERPRET") == "1":
            raise RuntimeError(
                "ahead-of-time compilation needs TRITON_INTERPRET=0 (Triton's interpreter is on)"
            )
        source = ASTSource(config.kernel, config.signature, config.constants)
        compiled = triton.compile(
            source,
            target=GPUTarget("cuda", capability, 32),
            options=dict(num_warps=config.num_warps),
        )
        _COMPILED[key] = compiled.metadata.shared
    return _COMPILED[key]


def require_fits(config: KernelConfig, device) -> None:
    """Refuse, before any launch, a kernel configuration whose program needs more shared memory than
    one block of ``device`` may have (a CPU under the interpreter has no such limit)."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    major, minor = torch.cuda.get_device_capability(device)
    capability = 10 * major + minor
    needed = compiled_shared_memory(config, capability)
    # The device's own figure where torch reports it, else the table's for its generation.
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    check_fits(config, capability, needed, limit or shared_memory_limit(capability))


def check_fits(config: KernelConfig, capability: int, needed: int, limit: int) -> None:
    if needed > limit:
        where = ", ".join(f"{k}={v}" for k, v in config.sizes.items())
        raise ValueError(
            f"the {config.name} kernel at {where} in {DTYPES[config.dtype]} needs {needed} bytes of"
            f" shared memory per program; sm_{capability} allows {limit} per block. Use a smaller"
            " head_dim, or a GPU of a later generation"
        )
