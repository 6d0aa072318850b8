"""kvlab.theory.prefix (notebook 06): the time-to-first-token saving against its prediction, equal
decode steps and the replay's winner, each on both sides of its boundary."""

import pytest

from kvlab.theory.agreement import edges
from kvlab.theory.prefix import POLICY_MARGIN, decode_steps_compare, hit_rate_verdict, ttft_saving


def test_ttft_saving_against_the_prediction():
    saving = ttft_saving(
        1.0, 0.2, 0.9, 0.1
    )  # measured = 0.1 s + 1.0 x predicted through both points
    assert saving.measured == pytest.approx(5.0) and saving.predicted == pytest.approx(9.0)
    assert saving.fixed_s == pytest.approx(0.1) and saving.verdict == "below"
    # Both sides of each edge of the three-outcome comparison, and inside each cannot-tell band.
    lo_d, lo_a, hi_a, hi_d = edges(4.0, 0.2)
    measured = (
        0.9 * lo_d,
        (lo_d * lo_a) ** 0.5,
        1.1 * lo_a,
        0.9 * hi_a,
        (hi_a * hi_d) ** 0.5,
        1.1 * hi_d,
    )
    verdicts = [ttft_saving(m, 1.0, 4.0, 1.0, spread=0.2).verdict for m in measured]
    assert verdicts == ["below", "cannot tell", "agrees", "agrees", "cannot tell", "above"]
    assert ttft_saving(1.0, 0.5, 0.4, 0.4).fixed_s == 1.0  # equal predictions: no slope
    with pytest.raises(ValueError, match="cached_s must be a finite number > 0"):
        ttft_saving(1.0, 0.0, 0.9, 0.1)


def test_decode_steps_and_policies():
    lo_d, lo_a, hi_a, hi_d = edges(1.0, 0.05)
    outcomes = [
        decode_steps_compare(1.0, r, 0.05).outcome
        for r in (0.9 * lo_d, (lo_d * lo_a) ** 0.5, 1.05 * lo_a, 0.95 * hi_a, 1.1 * hi_d)
    ]
    assert outcomes == ["disagrees", "cannot tell", "agrees", "agrees", "disagrees"]
    with pytest.raises(ValueError, match="computed_s"):
        decode_steps_compare(0.0, 1.0)
    m = POLICY_MARGIN
    assert [hit_rate_verdict(0.5 + g, 0.5) for g in (1.1 * m, 0.9 * m, -0.9 * m, -1.1 * m)] == [
        "more",
        "tie",
        "tie",
        "less",
    ]
