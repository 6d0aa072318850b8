"""kvlab.theory.serving (notebook 11): the work models of padded ``generate`` against the engine,
the speed-up verdict, the flat-step and the pool models, each on both sides of its boundary."""

from types import SimpleNamespace

import pytest

from kvlab.theory.serving import (
    SPEEDUP_TOLERANCE,
    batch_bound,
    flat_step_prediction,
    speedup_verdict,
    work_ratio,
)


def test_work_ratio_counts_rows_and_steps():
    padded = SimpleNamespace(prefill_rows=400, decode_rows=300, forward_passes=60)
    ratio = work_ratio(padded, dict(prefill_tokens=320, generated_tokens=200, requests=8, steps=40))
    assert ratio.rows == pytest.approx(700 / 512) and ratio.steps == pytest.approx(1.5)
    assert (ratio.low, ratio.high) == (ratio.rows, ratio.steps)


def test_speedup_verdict_flips_at_the_range_times_its_tolerance():
    assert speedup_verdict(1.0, 1.0, 2.0) == "within"
    low, high, tol = 1.2, 1.6, SPEEDUP_TOLERANCE
    assert [
        speedup_verdict(f, low, high)
        for f in (0.9 * low / tol, 1.1 * low / tol, 0.9 * high * tol, 1.1 * high * tol)
    ] == ["below", "within", "within", "above"]
    for args, match in [
        ((1.0, 2.0, 1.0), "high must be a finite number >= 2"),
        ((0.0, 1.0, 2.0), "measured"),
        ((1.0, -1.0, 2.0), "low"),
    ]:
        with pytest.raises(ValueError, match=match):
            speedup_verdict(*args)


def test_flat_step_and_pool_models():
    points = [
        SimpleNamespace(tokens_per_s=10.0, mean_batch=1.0),
        SimpleNamespace(tokens_per_s=30.0, mean_batch=3.5),
    ]
    assert flat_step_prediction(points) == pytest.approx(35.0)
    assert batch_bound(0.9 * 4, 4) == ("pool", 3.6) and batch_bound(1.1 * 4, 4) == (
        "max_batch",
        4.0,
    )
    assert batch_bound(4.0, 4) == ("max_batch", 4.0)
