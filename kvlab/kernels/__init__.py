"""Notebooks 05, 05b, 06, 07 and 11: kvlab's Triton kernels, each beside a plain-PyTorch reference.

Importing this package imports no kernel and no Triton: each name below loads its module on first
use. That matters on a machine without CUDA, where the kernels run under Triton's interpreter:
``triton.jit`` decides when a kernel is *decorated* (its module imported) whether it is compiled or
interpreted, so :func:`use_interpreter` must run before the first kernel module is imported.
kvlab's entry points call it (the notebooks' setup cells, ``python -m kvlab``, the test suite).
The interpreter has no bf16 arithmetic: on a CPU use fp32 or fp16. Triton is a dependency of kvlab
where it publishes wheels (Linux on x86_64); elsewhere the first use of a kernel raises one
``ModuleNotFoundError`` that says so.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from kvlab.versions import triton_missing

KERNEL_MODULES = (
    "paged_attention",
    "paged_attention_torch",
    "paged_prefill",
    "paged_tile",
    "store",
    "ssm_scan",
)
_HOMES = {
    "SUPPORTED_HEAD_DIMS": "paged_attention",
    "choose_num_splits": "paged_attention",
    "merge_splits": "paged_attention",
    "multiprocessor_count": "paged_attention",
    "paged_decode_partials": "paged_attention",
    "paged_decode_attention": "paged_attention",
    "paged_decode_launcher": "paged_attention",
    "paged_decode_unchecked": "paged_attention",
    "merge_partials": "paged_attention_torch",
    "paged_decode_attention_gather": "paged_attention_torch",
    "paged_decode_attention_ref": "paged_attention_torch",
    "paged_decode_gather_unchecked": "paged_attention_torch",
    "paged_prefill_attention": "paged_prefill",
    "paged_prefill_attention_ref": "paged_prefill",
    "paged_prefill_launcher": "paged_prefill",
    "paged_prefill_unchecked": "paged_prefill",
    "paged_prefill_work": "paged_prefill",
    "plan_query_tiles": "paged_prefill",
    "store_kv": "store",
    "store_kv_ref": "store",
    "store_kv_unchecked": "store",
    "selective_state_update": "ssm_scan",
    "selective_state_update_ref": "ssm_scan",
}
__all__ = ["use_interpreter", *_HOMES]


def use_interpreter() -> bool:
    """Run kvlab's Triton kernels under Triton's interpreter when there is no CUDA device; returns
    whether the interpreter is on. Call it before anything imports a kernel module.

    Sets ``TRITON_INTERPRET=1``. If something imported Triton before (transformers may), Triton's
    own ``@triton.jit`` helpers were decorated without the switch, so those modules are dropped and
    load again on next use (all but the compiled extension, which cannot load twice).
    """
    import torch

    if torch.cuda.is_available():
        return os.environ.get("TRITON_INTERPRET") == "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    loaded = [m for m in KERNEL_MODULES if f"{__name__}.{m}" in sys.modules]
    if loaded:
        raise RuntimeError(
            "kvlab.kernels.use_interpreter() must run before the kernels are imported, but "
            f"{loaded} already were, compiled for a GPU this machine does not have; call it first "
            "thing in the process (or start Python with TRITON_INTERPRET=1)"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        if not name.startswith("triton._C"):
            del sys.modules[name]
    return True


def _load(module: str):
    """A kernel module, imported on first use; without Triton, one error naming the fix."""
    if module in KERNEL_MODULES and importlib.util.find_spec("triton") is None:
        raise ModuleNotFoundError(triton_missing(), name="triton")
    return importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(_load(_HOMES[name]), name)
    if name in (*KERNEL_MODULES, "shared_memory", "targets"):
        return _load(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
