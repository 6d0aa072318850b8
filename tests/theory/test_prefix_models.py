"""kvlab.theory.prefix (notebook 06): the time-to-first-token saving against its prediction, equal
decode steps and the replay's winner, each on both sides of its boundary."""

import pytest

from kvlab.theory.prefix import (
    DECODE_TOLERANCE,
    POLICY_MARGIN,
    TTFT_TOLERANCE,
    decode_steps_agree,
    policy_winner,
    ttft_saving,
)


def test_ttft_saving_against_the_prediction():
    saving = ttft_saving(
        1.0, 0.2, 0.9, 0.1
    )  # measured = 0.1 s + 1.0 x predicted through both points
    assert saving.measured == pytest.approx(5.0) and saving.predicted == pytest.approx(9.0)
    assert saving.fixed_s == pytest.approx(0.1) and saving.verdict == "below"
    tol = TTFT_TOLERANCE
    verdicts = [
        ttft_saving(f * 4.0, 1.0, 4.0, 1.0).verdict
        for f in (0.9 / tol, 1.1 / tol, 0.9 * tol, 1.1 * tol)
    ]
    assert verdicts == ["below", "within", "within", "above"]
    assert ttft_saving(1.0, 0.5, 0.4, 0.4).fixed_s == 1.0  # equal predictions: no slope
    with pytest.raises(ValueError, match="cached_s must be a finite number > 0"):
        ttft_saving(1.0, 0.0, 0.9, 0.1)


def test_decode_steps_and_policies():
    assert decode_steps_agree(1.0, 0.9 * DECODE_TOLERANCE) and not decode_steps_agree(
        1.0, 1.1 * DECODE_TOLERANCE
    )
    assert decode_steps_agree(1.0, 1.1 / DECODE_TOLERANCE) and not decode_steps_agree(
        1.0, 0.9 / DECODE_TOLERANCE
    )
    with pytest.raises(ValueError, match="computed_s"):
        decode_steps_agree(0.0, 1.0)
    m = POLICY_MARGIN
    assert [policy_winner(0.5 + g, 0.5) for g in (1.1 * m, 0.9 * m, -1.1 * m)] == [
        "lru",
        "tie",
        "reserve",
    ]
