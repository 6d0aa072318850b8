"""Notebook 13's readings: the three-outcome decision fed on both sides of each edge and inside the
cannot-tell band, and each reading's words following its outcome."""

import math

import pytest

from kvlab.show.readings import speculative as r
from kvlab.theory.agreement import AGREES, CANNOT_TELL, DISAGREES, edges


@pytest.mark.parametrize("predicted", [0.7, 2.5])
@pytest.mark.parametrize("rounds", [(1.0, 1.0), (0.95, 1.1)])
def test_decide_both_sides_and_cannot_tell(predicted, rounds):
    low, high = rounds
    lowest, agree_low, agree_high, highest = edges(predicted, r.spread(low, high))
    outcome = lambda m: r.decide(m, low, high, predicted).outcome  # noqa: E731
    assert outcome(predicted) == AGREES
    assert outcome(agree_high / 1.01) == AGREES and outcome(agree_low * 1.01) == AGREES
    assert outcome(math.sqrt(agree_high * highest)) == CANNOT_TELL
    assert outcome(math.sqrt(lowest * agree_low)) == CANNOT_TELL
    assert outcome(highest * 1.1) == DISAGREES and outcome(lowest / 1.1) == DISAGREES


def test_spread_from_rounds():
    assert r.spread(2.0, 2.0) == 0 and r.spread(1.0, 1.5) == pytest.approx(0.5)
    assert r.decide(3.0, 1.0, 1.5, 2.5).outcome == CANNOT_TELL  # too noisy to agree


def test_readings_follow_the_outcome():
    agree = r.speedup_reading("quote", 8, 2.5, 2.45, 2.55, 2.4)
    assert "agrees" in agree and "pays" in agree and "rounds: 2.45x" in agree
    assert "it costs" in r.speedup_reading("chat", 8, 0.8, 0.8, 0.8, 0.78)
    assert "as much as it costs" in r.speedup_reading("chat", 8, 1.02, 1.02, 1.02, 0.98)
    assert "cannot tell" in r.speedup_reading("quote", 8, 2.25, 2.25, 2.25, 1.92)
    assert "independently" in r.speedup_reading("quote", 8, 1.5, 1.5, 1.5, 3.0)
    text = r.acceptance_reading("quote", 4, 1.0, 0.0, 6, 24)
    assert "5.00 tokens" in text and "6 forward passes" in text
    assert "0.42x" in r.early_exit_reading(0.0, 3, 15, 30, 11, 12, 0.42)
