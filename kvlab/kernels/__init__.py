"""Notebooks 05, 05b, 06, 07 and 11: kvlab's Triton kernels, each beside a plain-PyTorch reference.

Each kernel has two entries. The mechanism, a plain name (:func:`paged_decode`, :func:`paged_extend`
for the prefill, :func:`paged_store`, and the PyTorch :func:`paged_decode_gather`), launches without
a check and without a host sync: what ``kvlab.serving.attention`` calls in every layer after
validating a step once. The checked entry (:func:`paged_decode_attention`,
:func:`paged_prefill_attention`, :func:`store_kv`, and the PyTorch twins) validates every argument
at the door (``kvlab.kernels._validation``) and calls the mechanism.

On a machine without CUDA the kernels run under Triton's interpreter, which ``triton.jit`` chooses
when a kernel is decorated, that is when its module is imported. So importing this package switches
the interpreter on (``TRITON_INTERPRET=1``) before it imports the kernel modules, when no CUDA
device is present and ``TRITON_INTERPRET`` is not set (set it to 0 to compile, as
``kvlab.kernels.targets`` does). The interpreter has no bf16 arithmetic: on a CPU use fp32 or fp16.
Triton is a dependency of kvlab where it publishes wheels (Linux on x86_64); elsewhere importing
this package raises one ``ModuleNotFoundError`` that says so.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from kvlab.versions import triton_missing

if importlib.util.find_spec("triton") is None:
    raise ModuleNotFoundError(triton_missing(), name="triton")

KERNEL_MODULES = (
    "paged_attention",
    "paged_attention_torch",
    "paged_prefill",
    "paged_tile",
    "store",
    "ssm_scan",
)


def use_interpreter() -> bool:
    """Run kvlab's Triton kernels under Triton's interpreter when there is no CUDA device; returns
    whether the interpreter is on. Importing this package calls it when ``TRITON_INTERPRET`` is
    unset; calling it again changes nothing.

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


if "TRITON_INTERPRET" not in os.environ and not any(
    f"{__name__}.{m}" in sys.modules for m in KERNEL_MODULES
):
    use_interpreter()

from kvlab.kernels._validation import check_decode, check_prefill
from kvlab.kernels.paged_attention import (
    SUPPORTED_HEAD_DIMS,
    choose_num_splits,
    group_rows,
    merge_splits,
    multiprocessor_count,
    paged_decode,
    paged_decode_attention,
    paged_decode_partials,
)
from kvlab.kernels.paged_attention_torch import (
    merge_partials,
    paged_decode_attention_gather,
    paged_decode_attention_ref,
    paged_decode_gather,
)
from kvlab.kernels.paged_prefill import (
    paged_extend,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    plan_query_tiles,
    plan_step,
)
from kvlab.kernels.ssm_scan import selective_state_update, selective_state_update_ref
from kvlab.kernels.store import paged_store, store_kv, store_kv_ref
