"""Every notebook: how the book writes a number, in prose, tables and figure labels.

One module, imported by the readings (which must not pull in matplotlib) and by ``plots``; ``si``
and ``sig`` are defined in ``kvlab.theory.units``, so that the formulas' own messages use them too:

- ``si(3.35e12, "B/s") == "3.35 TB/s"``: a quantity with a decimal SI prefix, as the datasheets
  print them (seconds scale down to ms, µs, ns, never up);
- ``sci(3.13e8) == "$3.13 \\times 10^{8}$"``: a large or small count as Markdown math;
- ``sig(x)``: ``x`` to three significant figures;
- ``markdown_table(["model", "GB"], [["8B", 16.1]])``: a table as a Markdown pipe table, which the
  book and Jupyter draw as a table (a printed text table wraps and loses its columns).
"""

from __future__ import annotations

from kvlab._checks import integer, items, one_of, real
from kvlab.theory.units import MAX_DIGITS, si, sig

__all__ = ["markdown_table", "sci", "si", "sig"]


def sci(x: float, digits: int = 3) -> str:
    """A large or small count as Markdown math, ``$3.13 \\times 10^{8}$``; plain below 10^6."""
    x, digits = real("x", x), integer("digits", digits, 1, MAX_DIGITS + 1)
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        rounded = float(f"{x:.{digits}g}")
        return f"{rounded:,.0f}" if abs(rounded) >= 10 ** (digits - 1) else f"{rounded:g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"${mantissa} \\times 10^{{{int(exponent)}}}$"


def _cell(value) -> str:
    """One table cell: a number as written (a float to three significant figures), text with its
    pipes escaped and its line breaks as spaces."""
    if isinstance(value, float):
        value = sig(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header, rows, align: str | None = None) -> str:
    """``rows`` under ``header`` as a Markdown pipe table.

    ``align`` has one letter per column, ``l`` (left) or ``r`` (right); by default the first column
    is left-aligned and the others, usually numbers, right-aligned. Floats are written to three
    significant figures; format a number first (``si``, ``f"{x:,.1f}"``) to choose its digits.
    """
    header = items("header", header, object, what="column names", each="a column name")
    if not header:
        raise ValueError("header must name at least one column, got []")
    rows = items("rows", rows, object, what="rows", each="a row")
    rows = [
        items(f"rows[{i}]", row, object, what="cells", each="a cell") for i, row in enumerate(rows)
    ]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(
                f"rows[{i}] must have one cell per column of header ({len(header)}), got {len(row)}"
            )
    align = "l" + "r" * (len(header) - 1) if align is None else align
    if not isinstance(align, str) or len(align) != len(header):
        raise ValueError(
            f"align must be a str of one letter per column ({len(header)}), 'l' or 'r',"
            f" got {align!r}"
        )
    rule = [
        {"l": ":---", "r": "---:"}[one_of(f"align[{j}]", a, ("l", "r"))]
        for j, a in enumerate(align)
    ]
    lines = ["| " + " | ".join(_cell(c) for c in header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
