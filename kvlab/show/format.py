"""Every notebook: how the book writes a number, in prose, tables and figure labels.

One module, imported by the readings (which must not pull in matplotlib) and by ``plots``; ``si``
and ``sig`` are defined in ``kvlab.theory.units``, so that the formulas' own messages use them too:

- ``si(3.35e12, "B/s") == "3.35 TB/s"``: a quantity with a decimal SI prefix, as the datasheets
  print them (seconds scale down to ms, µs, ns, never up);
- ``sci(3.13e8) == "$3.13 \\times 10^{8}$"``: a large or small count as Markdown math;
- ``sig(x)``: ``x`` to three significant figures.
"""

from __future__ import annotations

from kvlab._checks import integer, real
from kvlab.theory.units import MAX_DIGITS, si, sig

__all__ = ["sci", "si", "sig"]


def sci(x: float, digits: int = 3) -> str:
    """A large or small count as Markdown math, ``$3.13 \\times 10^{8}$``; plain below 10^6."""
    x, digits = real("x", x), integer("digits", digits, 1, MAX_DIGITS + 1)
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        rounded = float(f"{x:.{digits}g}")
        return f"{rounded:,.0f}" if abs(rounded) >= 10 ** (digits - 1) else f"{rounded:g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"${mantissa} \\times 10^{{{int(exponent)}}}$"
