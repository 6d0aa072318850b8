"""Every notebook: how a reading compares what it measured with what a model predicted.

A reading that decides between outcomes ("within", "faster", "less idle", "explains") never writes
the inequality itself. The model's own function gives the prediction, and ``compare`` says whether
the measurement lies within a factor ``tolerance`` of it, above it or below it, keeping the three
numbers so that the reading can print what it compared. A reading's test then builds its
measurements from the model on both sides of that boundary (``edges``), so a wrong model or a wrong
inequality fails a test (CONTRIBUTING.md, readings). Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab._checks import positive, real

WITHIN, ABOVE, BELOW = "within", "above", "below"
OUTCOMES = (WITHIN, ABOVE, BELOW)


@dataclass(frozen=True)
class Comparison:
    """A measurement against its prediction: ``outcome`` is ``"within"`` when ``measured`` lies
    within a factor ``tolerance`` of ``predicted`` either way, else ``"above"`` or ``"below"``."""

    measured: float
    predicted: float
    tolerance: float

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured / self.predicted

    @property
    def outcome(self) -> str:
        if self.ratio > self.tolerance:
            return ABOVE
        if self.ratio < 1 / self.tolerance:
            return BELOW
        return WITHIN

    @property
    def agrees(self) -> bool:
        return self.outcome == WITHIN

    def describe(self) -> str:
        """The ratio and the outcome: ``"1.4 times the prediction: above it, beyond the factor 1.25
        either way that counts as agreement"``; inside that factor, ``"...: within the factor 1.25
        ..."``.
        """
        r = self.ratio
        times = f"{r:.3g}" if r < 100 else f"{r:,.0f}"
        where = "within" if self.agrees else f"{self.outcome} it, beyond"
        return (
            f"{times} times the prediction: {where} the factor {self.tolerance:g} either way that"
            " counts as agreement"
        )


def compare(measured: float, predicted: float, tolerance: float) -> Comparison:
    """``measured`` against ``predicted`` (> 0) with agreement within a factor ``tolerance`` (> 1).

    A measurement at or below zero (a slope that came out negative) is ``"below"`` any positive
    prediction.
    """
    measured = real("measured", measured)
    positive("predicted", predicted)
    if not (real("tolerance", tolerance) > 1 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite factor > 1, got {tolerance!r}")
    return Comparison(measured, predicted, tolerance)


def edges(predicted: float, tolerance: float) -> tuple[float, float]:
    """The two measurements at which ``compare(measured, predicted, tolerance)`` changes outcome:
    ``(predicted / tolerance, predicted * tolerance)``. Tests step 10% past each side."""
    compare(predicted, predicted, tolerance)
    return predicted / tolerance, predicted * tolerance
