"""Every notebook: the torch device and dtype kvlab runs on.

The first CUDA GPU when there is one, else the CPU; bf16 on a GPU with bf16 units, fp16 on one
without (a T4), fp32 on a CPU. Below every layer that holds tensors, so that a cache, a kernel and a
measurement agree on the default.
"""

from __future__ import annotations

from kvlab import _checks


def device():
    """The torch device the book measures on: the first CUDA GPU when there is one, else the CPU."""
    return device_and_dtype()[0]


def device_and_dtype(device=None, dtype=None):
    """The device to run on (kvlab's by default) and the dtype: by default bf16 on a GPU that has
    bf16 units, fp16 on one that has not (T4, V100), fp32 on a CPU."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = _checks.device("device", device)
    if dtype is not None:
        _checks.dtype("dtype", dtype)
    elif dev.type != "cuda":
        dtype = torch.float32
    else:
        dtype = torch.bfloat16 if has_bf16(dev) else torch.float16
    return dev, dtype


def has_bf16(device) -> bool:
    """Whether a CUDA device computes in bf16 natively: compute capability 8.0 (Ampere) or later.

    Asked of the capability rather than ``torch.cuda.is_bf16_supported()``, which can answer yes for
    a T4 (7.5), where bf16 runs emulated and Triton cannot compile bf16 matrix products."""
    import torch

    return torch.cuda.get_device_capability(device) >= (8, 0)


def on_gpu() -> bool:
    return device().type == "cuda"
