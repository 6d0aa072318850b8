"""Every notebook: the sentences that depend on a measurement, one module per section of the book.

A reading is a plain function: it takes the numbers a notebook measured and returns Markdown for
``kvlab.reading`` or for ``explore(..., reading=...)``. Where a sentence depends on the outcome (a
slope within a factor of its prediction, one method faster than another), both outcomes are written
here: the other branch says what was expected, what was measured, and the most likely reason on this
kind of machine. ``tests/show/test_readings_<section>.py`` feeds each function both outcomes.
"""

from kvlab._checks import nonnegative, positive, real


def ratio_text(measured: float, predicted: float) -> str:
    """``"1.3 times"``, ``"1.0 times"`` or ``"0.42 times"``: a measured value as a multiple of its
    prediction, two significant digits below 10 (a whole number keeps its ``.0``)."""
    measured, predicted = nonnegative("measured", measured), positive("predicted", predicted)
    r = measured / predicted
    if r >= 10:
        return f"{r:.0f} times"
    text = f"{r:.2g}"
    return f"{text} times" if "." in text or "e" in text else f"{r:.1f} times"


def within(measured: float, predicted: float, factor: float) -> bool:
    """True when ``measured`` is within ``factor`` of ``predicted`` either way (both positive)."""
    measured, predicted = real("measured", measured), real("predicted", predicted)
    factor = real("factor", factor, 1)
    if measured <= 0 or predicted <= 0:
        return False
    return 1 / factor <= measured / predicted <= factor
