"""kvlab: the instrument behind the book on LLM decode and the KV cache."""

from .hardware import SPECS, calibrate, device, stamp
from .models import SHAPES, ModelShape, load_model, tiny_model
from .timing import measure

__version__ = "0.1.0"


def env() -> str:
    """What this notebook runs on: device, versions, and (once per process) the calibrated ceilings."""
    from .hardware import calibrate, stamp

    s, c = stamp(), calibrate()
    lines = [f"{k:>12}: {v}" for k, v in s.items()]
    lines.append(f"{'copy':>12}: {c.copy_bytes_per_s / 1e9:.1f} GB/s (bytes read + written)")
    lines.append(f"{'matmul':>12}: {c.matmul_flops / 1e12:.3f} TFLOP/s ({c.matmul_dtype})")
    return "\n".join(lines)
