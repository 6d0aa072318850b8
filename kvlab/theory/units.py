"""Every notebook: how a quantity is written with a decimal SI prefix, below the presentation layer.

``si(3.35e12, "B/s") == "3.35 TB/s"`` and ``sig(x)`` live here, in the theory layer, so that the
formulas' own messages (``kvlab.theory.roofline.Admission``: "needs 7.66 MB, 16.6 MB available")
pick their units the way the book's prose does; ``kvlab.show.format`` re-exports both. Pure Python.
"""

from __future__ import annotations

import math
import numbers

from kvlab._checks import integer

MAX_DIGITS = 17  # what a double holds

_PREFIXES = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_SECONDS = [(1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]


def _number(name: str, value) -> float:
    """A real number, infinities and NaN included (they print as ``inf`` and ``nan``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures (``format(x, ".3g")``)."""
    return f"{_number('x', x):.{integer('digits', digits, 1, MAX_DIGITS + 1)}g}"


def si(value: float, unit: str, digits: int = 3) -> str:
    """Format a quantity with an SI prefix and ``digits`` significant figures, for prose and labels.

    ``si(3.35e12, "B/s") == "3.35 TB/s"``, ``si(0.0051, "s") == "5.1 ms"``, ``si(2.5e-6, "s") ==
    "2.5 µs"``. Seconds scale down (ms, µs, ns) but never up; other units scale up (k to E) but
    never down. Prefixes are decimal, as in the datasheets.
    """
    value, digits = _number("value", value), integer("digits", digits, 1, MAX_DIGITS + 1)
    if not isinstance(unit, str):
        raise TypeError(
            f"unit must be a str such as 'B/s' or 's', got {type(unit).__name__} {unit!r}"
        )
    if not math.isfinite(value) or value == 0:
        return f"{value:g} {unit}".rstrip()
    sign = "-" if value < 0 else ""
    # Round first, so that 999.96e9 becomes "1 TB/s", not "1e+03 GB/s".
    mag = float(sig(abs(value), digits))
    table = _SECONDS if unit == "s" else _PREFIXES + [(1.0, "")]
    for scale, prefix in table:
        if mag >= scale:
            break
    if unit == "s" and mag >= 1e3:
        return f"{sign}{mag:,.0f} s"
    return f"{sign}{sig(mag / scale, digits)} {prefix}{unit}".rstrip()
