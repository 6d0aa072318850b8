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


def test_roofline_throughput_is_flat_below_the_ridge_and_bends_past_it():
    from kvlab.theory.serving import roofline_throughput

    # Weights: 80 MB at 10 GB/s, 8 ms. One request at 20 tokens/s: a 50 ms step.
    below = roofline_throughput(20.0, 4.0, 80e6, 1e6, 1e10, 1e10, 1e10)
    assert below == pytest.approx(4 * 20.0)  # 4 MFLOP a step is far under the weights' read
    past = roofline_throughput(20.0, 4.0, 80e6, 40e6, 1e10, 1e10, 2e10)
    assert past == pytest.approx(4.0 / (0.050 - 0.008 + 4 * 40e6 / 2e10))
    with pytest.raises(ValueError, match="matmul_b must be a finite number > 0"):
        roofline_throughput(20.0, 4.0, 80e6, 40e6, 1e10, 1e10, 0.0)


def test_curve_agreement_on_every_side_and_its_spread():
    from kvlab.theory.agreement import edges
    from kvlab.theory.serving import curve_agreement, roofline_throughput_spread

    lo_d, lo_a, hi_a, hi_d = edges(100.0, 0.2)
    assert curve_agreement([100.0, 0.99 * hi_a], [100.0, 100.0], [0.2, 0.2])[0] == "agrees"
    assert curve_agreement([100.0, (hi_a * hi_d) ** 0.5], [100.0] * 2, [0.2] * 2)[0] == (
        "cannot tell"
    )
    assert curve_agreement([100.0, 0.9 * lo_d], [100.0] * 2, [0.2] * 2)[0] == "disagrees"
    assert curve_agreement([1.1 * hi_d], [100.0], [0.2])[0] == "disagrees"
    with pytest.raises(ValueError, match="one entry per point"):
        curve_agreement([1.0], [1.0, 2.0], [0.1])
    # A 50 ms anchor at 10% and 8.8 ms of products at 20%, measured at 5%: 50.8 ms a step.
    spread = roofline_throughput_spread(4.4 / 0.0508, 4.4, 20.0, 0.1, 40e6, 2e10, 0.2, 0.05)
    assert spread == pytest.approx(0.05 + (0.1 / 20.0 + 0.0088 * 0.2) / 0.0508)
