"""kvlab: the instrument behind the book on LLM decode and the KV cache.

Importing kvlab does not import torch: ``kvlab.roofline`` is pure Python. The names that need torch
(the decode loops) load on first use.
"""

import importlib

from .hardware import SPECS, calibrate, device, on_gpu, stamp
from .models import SHAPES, ModelShape, load_model, tiny_model
from .notebook import reading, sizes
from .timing import measure
from .versions import warn_if_below_floor

__version__ = "0.1.0"
warn_if_below_floor()

_LAZY = {name: "decode" for name in ("naive_decode", "cached_decode", "static_decode", "profile_decode")}
_LAZY["explore"] = "widgets"
_LAZY.update(trained_model="trained", trained_tokenizer="trained")
_SUBMODULES = {"bench", "decode", "diagnose", "engine", "gemv", "kernels", "layout", "longctx", "paged_decode", "paging", "plots",
               "prefix", "prefix_paged", "roofline", "ssm", "trained", "versions", "widgets"}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")


def env() -> str:
    """What this notebook runs on: device, versions, and (once per process) the calibrated ceilings."""
    s, c = stamp(), calibrate()
    lines = [f"{k:>12}: {v}" for k, v in s.items()]
    lines.append(f"{'copy':>12}: {c.copy_bytes_per_s / 1e9:.1f} GB/s (bytes read + written)")
    lines.append(f"{'matmul':>12}: {c.matmul_flops / 1e12:.3f} TFLOP/s ({c.matmul_dtype})")
    return "\n".join(lines)
