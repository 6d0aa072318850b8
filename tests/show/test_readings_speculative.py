"""Notebook 13's readings: the three-outcome decision fed on both sides of its tolerance and inside
the cannot-tell band, and each reading's words following its outcome."""

import pytest

from kvlab.show.readings import speculative as r


@pytest.mark.parametrize("predicted", [0.7, 2.5])
def test_decide_both_sides_and_cannot_tell(predicted):
    low, high = 0.95, 1.05  # a narrow spread: the floor tolerance applies
    assert r.decide(predicted * 1.1, low, high, predicted) == (r.AGREES, r.MIN_TOLERANCE)
    assert r.decide(predicted / 1.1, low, high, predicted)[0] == r.AGREES
    assert r.decide(predicted * r.MIN_TOLERANCE * 1.1, low, high, predicted)[0] == r.DISAGREES
    assert r.decide(predicted / r.MIN_TOLERANCE / 1.1, low, high, predicted)[0] == r.DISAGREES
    wide = (1.0, r.CANNOT_TELL_SPREAD * 1.1)
    assert r.decide(predicted * 3, *wide, predicted)[0] == r.CANNOT_TELL


def test_spread_widens_the_tolerance():
    outcome, tolerance = r.decide(2.0 * 1.4, 1.0, 1.5, 2.0)
    assert tolerance == 1.5 and outcome == r.AGREES


def test_readings_follow_the_outcome():
    agree = r.speedup_reading("quote", 8, 2.6, 2.5, 2.7, 2.4)
    assert "agrees" in agree and "pays" in agree
    costs = r.speedup_reading("chat", 8, 0.8, 0.78, 0.82, 0.75)
    assert "it costs" in costs and "rounds: 0.78x" in costs
    even = r.speedup_reading("chat", 8, 1.02, 1.02, 1.02, 0.95)
    assert "as much as it costs" in even and "rounds" not in even
    assert "beyond the factor" in r.speedup_reading("quote", 8, 1.5, 1.45, 1.55, 3.0)
    assert "cannot tell" in r.speedup_reading("quote", 8, 1.5, 1.0, 2.0, 3.0)
    text = r.acceptance_reading("quote", 4, 1.0, 0.0, 6, 24)
    assert "5.00 tokens" in text and "6 forward passes" in text
