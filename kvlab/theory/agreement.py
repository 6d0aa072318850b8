"""Every notebook: how a reading compares what it measured with what a model predicted.

The rule, stated once. A measurement and its prediction meet in their ratio ``r = measured /
predicted``; ``spread`` is the relative run-to-run scatter behind that ratio (the measurement's and
the ceiling's the prediction was computed from, added: ``combined_spread``). The agreement band is
``a = max(FLOOR, spread)`` either way: a ratio within a factor ``1 + a`` of 1 **agrees**. A ratio
beyond the factor ``(1 + a) ** 3`` **disagrees**, above or below. In between the run **cannot
tell**: the miss is larger than the noise explains, but not by enough to call. ``FLOOR`` (10%) is
the least a model of a few terms and a ceiling measured once are asked to match; it keeps a quiet
run from calling a 2% miss a disagreement. A run whose spread exceeds ``AGREE_SPREAD_LIMIT`` (25%)
is too noisy to confirm anything: it can still disagree, beyond its wide edge, but never agrees.

Why three outcomes and the gap between them: two runs of one commit measure two ratios. When each
run's spread is honest (the two log-ratios differ by no more than the smaller run's ``a``) and
neither spread is more than twice the other, one run cannot agree while the other disagrees: the
first puts its ratio within ``a`` of 1, the second sees it at most ``a`` further, short of the
``3 a`` a disagreement needs. A noisy run gives a wide band; it is never an excuse to agree with a
large miss, since the disagreement edge widens with it and the reading prints the spread.

A reading never writes the inequality itself: the model's own function gives the prediction, and
``compare`` decides, keeping the numbers so the reading can print them. A reading's test builds
measurements from ``edges`` on both sides of each boundary and inside the cannot-tell band
(CONTRIBUTING.md, readings).

``within_factor`` is the older two-outcome rule, a fixed factor either way; readings not yet moved
to the spread still call it (``factor_edges`` gives its edges). Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab._checks import positive, real

AGREES, DISAGREES, CANNOT_TELL = "agrees", "disagrees", "cannot tell"
VERDICTS = (AGREES, DISAGREES, CANNOT_TELL)
WITHIN, ABOVE, BELOW = "within", "above", "below"
OUTCOMES = (WITHIN, ABOVE, BELOW)
FLOOR = 0.10
DISAGREE_POWER = 3
AGREE_SPREAD_LIMIT = 0.25


@dataclass(frozen=True)
class Comparison:
    """A measurement against its prediction under the spread-derived bands of this module.

    ``outcome`` is ``"agrees"``, ``"disagrees"`` or ``"cannot tell"``; ``side`` is ``"above"`` or
    ``"below"`` when the outcome is not agreement (None when it agrees).
    """

    measured: float
    predicted: float
    spread: float
    floor: float = FLOOR

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured / self.predicted

    @property
    def band(self) -> float:
        """The agreement band's half-width as a fraction: ``max(floor, spread)``."""
        return max(self.floor, self.spread)

    @property
    def agree_factor(self) -> float:
        """A ratio within this factor of 1, either way, agrees."""
        return 1 + self.band

    @property
    def disagree_factor(self) -> float:
        """A ratio beyond this factor of 1, either way, disagrees."""
        return self.agree_factor**DISAGREE_POWER

    @property
    def can_agree(self) -> bool:
        """False when the spread exceeds ``AGREE_SPREAD_LIMIT``: too noisy to confirm a model."""
        return self.spread <= AGREE_SPREAD_LIMIT

    @property
    def outcome(self) -> str:
        if self.measured <= 0:
            return DISAGREES
        distance = abs(math.log(self.ratio))
        if distance <= math.log(self.agree_factor) and self.can_agree:
            return AGREES
        if distance > math.log(self.disagree_factor):
            return DISAGREES
        return CANNOT_TELL

    @property
    def side(self) -> str | None:
        if self.outcome == AGREES:
            return None
        return ABOVE if self.ratio > 1 else BELOW

    @property
    def agrees(self) -> bool:
        return self.outcome == AGREES

    @property
    def edges(self) -> tuple[float, float, float, float]:
        """The measurements where the outcome changes, lowest first (see ``edges``)."""
        return edges(self.predicted, self.spread, self.floor)

    def describe(self) -> str:
        """``"1.04 times the prediction: agrees"``, ``"1.6 times the prediction: above it"``,
        ``"1.2 times the prediction: cannot tell (above it, short of a clear miss)"``; a run too
        scattered to agree says ``"(on it, too scattered to confirm it)"`` within the floor of the
        prediction, else ``"(scattered by 40%)"``."""
        r = self.ratio
        times = ratio_words(r)
        if self.outcome == AGREES:
            return f"{times} times the prediction: agrees"
        if self.outcome == DISAGREES:
            return f"{times} times the prediction: {self.side} it"
        if not self.can_agree and abs(math.log(r)) <= math.log(1 + self.floor):
            return f"{times} times the prediction: cannot tell (on it, too scattered to confirm it)"
        if not self.can_agree:
            return f"{times} times the prediction: cannot tell (scattered by {self.spread:.0%})"
        return f"{times} times the prediction: cannot tell ({self.side} it, short of a clear miss)"


def ratio_words(r: float) -> str:
    """A ratio as a reader writes it: ``"1.04"``, ``"1.00"`` (never a bare ``"1"``), ``"2,048"``."""
    r = real("r", r)
    if r >= 100:
        return f"{r:,.0f}"
    short = f"{r:.3g}"
    return short if "." in short or "e" in short else f"{r:.2f}"


def combined_spread(*spreads: float) -> float:
    """The relative spread of a ratio of measured quantities: the sum of theirs (each >= 0), so a
    ratio of a time to a ceiling carries both runs' scatter."""
    return sum(real(f"spreads[{i}]", s, 0) for i, s in enumerate(spreads))


def compare(measured: float, predicted: float, spread: float, floor: float = FLOOR) -> Comparison:
    """``measured`` against ``predicted`` (> 0) with the relative run-to-run ``spread`` (>= 0).

    ``floor`` (in (0, 1), default ``FLOOR``) is the least half-width of the agreement band. A
    measurement at or below zero (a slope that came out negative) disagrees, below any positive
    prediction.
    """
    measured = real("measured", measured)
    positive("predicted", predicted)
    real("spread", spread, 0)
    real("floor", floor, 0, 1, low_open=True, high_open=True)
    return Comparison(measured, predicted, spread, floor)


def edges(
    predicted: float, spread: float, floor: float = FLOOR
) -> tuple[float, float, float, float]:
    """The four measurements at which ``compare(measured, predicted, spread, floor)`` changes
    outcome, lowest first: disagrees below the first, cannot tell up to the second, agrees up to
    the third, cannot tell up to the fourth, disagrees beyond it. Tests step 10% past each, and
    feed the geometric mean of the first two (or last two) for the cannot-tell band. A spread above
    ``AGREE_SPREAD_LIMIT`` has no agreement band: its middle two edges are the prediction."""
    c = compare(predicted, predicted, spread, floor)
    a, d = (c.agree_factor if c.can_agree else 1.0), c.disagree_factor
    return predicted / d, predicted / a, predicted * a, predicted * d


@dataclass(frozen=True)
class FactorComparison:
    """The older two-outcome rule: ``outcome`` is ``"within"`` when ``measured`` lies within a
    factor ``tolerance`` of ``predicted`` either way, else ``"above"`` or ``"below"``."""

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
        times = ratio_words(r)
        where = "within" if self.agrees else f"{self.outcome} it, beyond"
        return (
            f"{times} times the prediction: {where} the factor {self.tolerance:g} either way that"
            " counts as agreement"
        )


def within_factor(measured: float, predicted: float, tolerance: float) -> FactorComparison:
    """``measured`` against ``predicted`` (> 0) with agreement within a fixed factor ``tolerance``
    (> 1): the older rule. A measurement at or below zero is ``"below"`` any positive prediction.
    """
    measured = real("measured", measured)
    positive("predicted", predicted)
    if not (real("tolerance", tolerance) > 1 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite factor > 1, got {tolerance!r}")
    return FactorComparison(measured, predicted, tolerance)


def factor_edges(predicted: float, tolerance: float) -> tuple[float, float]:
    """The two measurements at which ``within_factor(measured, predicted, tolerance)`` changes
    outcome: ``(predicted / tolerance, predicted * tolerance)``. Tests step 10% past each side."""
    predicted = positive("predicted", predicted)
    within_factor(predicted, predicted, tolerance)
    return predicted / tolerance, predicted * tolerance
