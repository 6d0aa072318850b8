"""Every notebook: argument checks shared by kvlab's modules; an error names the argument, the value it
got and what is allowed (CONTRIBUTING.md, "Errors"). Plain Python; torch is imported only by the
tensor checks that need it."""

from __future__ import annotations

import math
import numbers


def integer(name: str, value, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int in [low, high) (no upper bound when ``high`` is None).

    Bools and floats are refused with a TypeError, values out of range with a ValueError; both say
    which argument and which range.
    """
    allowed = f">= {low}" if high is None else f"in [{low}, {high})"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int {allowed}, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value >= high):
        raise ValueError(f"{name} must be an int {allowed}, got {value!r}")
    return int(value)


def one_of(name: str, value, allowed):
    """``value`` if it equals one of ``allowed`` (True is not 1 here), else a ValueError listing them."""
    def same(a) -> bool:
        try:
            return isinstance(value, bool) == isinstance(a, bool) and bool(value == a)
        except (TypeError, RuntimeError, ValueError):  # e.g. a tensor compared with a number
            return False

    if not any(same(a) for a in allowed):
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def free_memory(device) -> int:
    """Bytes that can still be allocated on ``device``: CUDA's free memory plus what torch's caching
    allocator holds unused, or the host's MemAvailable (Linux), or its physical memory where that
    cannot be read."""
    import os

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ValueError(f"device {device} is not available on this machine ({count} CUDA device(s))")
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # torch's own spare
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require_memory(what: str, needed: int, device) -> None:
    """Refuse, by arithmetic and before allocating, a request larger than ``device``'s free memory."""
    free = free_memory(device)
    if needed > free:
        raise MemoryError(f"{what} needs {needed:,} bytes but only {free:,} bytes are free on {device}")


def positive(name: str, value) -> float:
    """``value`` as a finite real number > 0 (bytes per element, widths, factors)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite number > 0, got {type(value).__name__} {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def real(name: str, value) -> float:
    """``value`` as a float; a TypeError for anything but a real number (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def between(name: str, value, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a real number in the interval [low, high], with either end open on request."""
    x = real(name, value)
    above = x > low if low_open else x >= low
    below = x < high if high_open else x <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return x


def named_shapes(layouts: dict, **tensors) -> dict:
    """Each tensor must be a floating ``torch.Tensor`` whose dimensions are the axes its layout names
    (``layouts[name] == "[batch, dim, length]"``); axes of one name must have one size, and all
    tensors one device. ``None`` is skipped (an optional argument). Returns ``{axis: size}``."""
    import torch

    sizes = {}
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor {layouts[name]}, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        axes = layouts[name].strip("[]").split(", ")
        if t.dim() != len(axes):
            raise ValueError(f"{name} must have {len(axes)} dimensions {layouts[name]}, got shape {tuple(t.shape)}")
        for axis, size in zip(axes, t.shape):
            size = int(size)
            if sizes.setdefault(axis, (size, name))[0] != size:
                raise ValueError(f"{name} has {axis}={size} but {sizes[axis][1]} has {axis}={sizes[axis][0]} "
                                 f"({name} is {layouts[name]})")
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return {axis: size for axis, (size, _) in sizes.items()}
