"""Every notebook: the folded block every worked solution is shown in, and its small helpers.

An exercise stays in its page as "predict, then measure"; its solution, when it has numbers, is a
function in this package's module for that notebook, which takes what the notebook computed or
measured and returns Markdown wrapped by :func:`solution`: an HTML ``<details>`` block, collapsed
until the reader opens it, in the book and in Jupyter alike.
"""

from __future__ import annotations

from kvlab._checks import real
from kvlab.show.format import sci

GLOSSARY = "../book/glossary.md"


def count(n: float) -> str:
    """An exact count with thousands separators below a million, else in scientific notation."""
    n = real("n", n)
    return f"{int(n):,}" if float(n).is_integer() and abs(n) < 1e6 else sci(n)


def solution(number: int, body: str) -> str:
    """``body`` (Markdown) inside a collapsed ``<details>`` block titled "Solution to exercise
    N"."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"number must be an exercise number >= 1, got {number!r}")
    if not isinstance(body, str) or not body.strip():
        raise ValueError("body must be the solution's Markdown text")
    return (
        "<details>\n<summary>Solution to exercise"
        f" {number}</summary>\n\n{body.strip()}\n\n</details>\n"
    )
