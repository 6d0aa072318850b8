"""Notebooks 05, 05b, 06, 07 and 11: Triton's interpreter switch, which ``kvlab.kernels`` flips when
it is imported on a machine without CUDA.

``triton.jit`` chooses between compiling and interpreting when a kernel is decorated, that is when
its module is imported. So importing ``kvlab.kernels`` switches the interpreter on
(``TRITON_INTERPRET=1``) before it imports the kernel modules, when no CUDA device is present and
``TRITON_INTERPRET`` is not set (set it to 0 to compile, as ``kvlab.kernels.targets`` does). The
interpreter has no bf16 arithmetic: on a CPU use fp32 or fp16. Triton is a dependency of kvlab
where it publishes wheels (Linux on x86_64); elsewhere importing this module raises one
``ModuleNotFoundError`` that says so.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from kvlab.versions import triton_missing

if importlib.util.find_spec("triton") is None:
    raise ModuleNotFoundError(triton_missing(), name="triton")

PACKAGE = "kvlab.kernels"
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
    whether the interpreter is on. Importing ``kvlab.kernels`` calls it when ``TRITON_INTERPRET``
    is unset; calling it again changes nothing.

    Sets ``TRITON_INTERPRET=1``. If something imported Triton before (transformers may), Triton's
    own ``@triton.jit`` helpers were decorated without the switch, so those modules are dropped and
    load again on next use (all but the compiled extension, which cannot load twice).
    """
    import torch

    if torch.cuda.is_available():
        return os.environ.get("TRITON_INTERPRET") == "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    loaded = [m for m in KERNEL_MODULES if f"{PACKAGE}.{m}" in sys.modules]
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


def switch_on_import() -> None:
    """What importing ``kvlab.kernels`` does first: :func:`use_interpreter`, unless
    ``TRITON_INTERPRET`` is set or a kernel module was already imported."""
    if "TRITON_INTERPRET" not in os.environ and not any(
        f"{PACKAGE}.{m}" in sys.modules for m in KERNEL_MODULES
    ):
        use_interpreter()


# The switch itself, when ``kvlab.kernels`` imports this module before its kernel modules.
switch_on_import()
