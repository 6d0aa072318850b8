"""Argument checks shared by kvlab's modules: an error names the argument and its allowed range."""

from __future__ import annotations

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
