"""kvlab.theory.verdict: section 9.8's verdict is a plain function of the measurements, tested on
numbers."""

import pytest

import kvlab
from kvlab.theory import roofline
from kvlab.theory import verdict as verdict_models
from kvlab.theory.shapes import SHAPES
from kvlab.theory.verdict import (
    LEVERS,
    VERDICTS,
    BatchPoint,
    Target,
    capacity_batch,
    decide,
    lever,
    useful_batch,
)
from kvlab.theory.work import STEP_METHODS


def test_decide_each_branch():
    base = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    assert decide(**base)[0] == "weights"
    assert decide(**{**base, "kv_share": 0.8})[0] == "kv"
    assert decide(**{**base, "flops_fraction": 0.7})[0] == "compute"
    assert decide(**{**base, "busy_fraction": 0.2})[0] == "overhead"
    assert decide(**{**base, "bandwidth_fraction": 0.01, "flops_fraction": 0.01})[0] == "overhead"
    assert decide(**base, admitted=False)[0] == "capacity"
    short = roofline.Admission(weights=4e9, kv=7e9, available=10e9)
    verdict, because = decide(**base, admitted=short)
    assert verdict == "capacity" and "does not fit by 1 GB" in because
    verdict, because = decide(**{**base, "kv_share": 0.8})
    assert "80%" in because and "nearer the read bandwidth" in because  # what it rests on


def test_decide_refuses_bad_numbers():
    good = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    with pytest.raises(ValueError, match="kv_share must be in"):
        decide(**{**good, "kv_share": 1.5})
    with pytest.raises(ValueError, match=r"busy_fraction must be in \[0, 1\]"):
        decide(**{**good, "busy_fraction": -0.1})
    with pytest.raises(
        ValueError, match=r"busy_fraction must be in \[0, 1\], got 1.5"
    ):  # not "busy for 150%"
        decide(**{**good, "busy_fraction": 1.5})
    with pytest.raises(ValueError, match="bandwidth_fraction must be a finite number >= 0"):
        decide(**{**good, "bandwidth_fraction": float("inf")})
    for admitted in (None, "no", 0):  # not the verdict "capacity"
        with pytest.raises(
            TypeError, match="admitted must be True, False or a kvlab.theory.roofline.Admission"
        ):
            decide(**good, admitted=admitted)
    with pytest.raises(ValueError, match="flops_fraction"):
        decide(**{**good, "flops_fraction": float("nan")})
    with pytest.raises(TypeError, match="bandwidth_fraction must be a finite number"):
        decide(**{**good, "bandwidth_fraction": "fast"})


def test_every_lever_names_a_function_or_section():
    for verdict in VERDICTS:
        for method in STEP_METHODS:
            text = lever(verdict, method)
            assert "kvlab." in text or "section" in text or "step 4" in text, (verdict, method)
    assert lever("compute", "naive") == LEVERS["compute-naive"]
    with pytest.raises(ValueError, match="verdict must be one of"):
        lever("slow", "cached")


def _point(batch, tpot, ttft=0.01, fits=True):
    return BatchPoint(batch, ttft, tpot, roofline.Admission(1.0, 1.0 if fits else 10.0, 5.0))


def test_useful_batch_under_a_target():
    sweep = [_point(1, 0.010), _point(2, 0.012), _point(4, 0.020), _point(8, 0.045, fits=False)]
    assert useful_batch(sweep, Target(tpot=0.015)) == 2
    assert useful_batch(sweep, Target(tpot=0.1)) == 4  # batch 8 would meet it but does not fit
    assert useful_batch(sweep, Target(tpot=0.001)) is None
    assert useful_batch(sweep, Target(ttft=0.001)) is None
    assert useful_batch(sweep, Target()) == 4  # most tokens per second among those that fit


@pytest.mark.parametrize("key", ["llama-3-8b", "llama-2-13b", "mistral-7b"])
@pytest.mark.parametrize("context", [1000, 32768, 131072])
def test_capacity_batch_is_the_admission_edge(key, context):
    shape, hw = SHAPES[key], kvlab.SPECS["h200"]
    b = capacity_batch(shape, hw, context, 2)
    assert b >= 1
    assert roofline.admitted(shape, hw, b, context)
    assert not roofline.admitted(shape, hw, b + 1, context)


def test_capacity_batch_zero_when_nothing_fits():
    assert capacity_batch(SHAPES["llama-3.1-405b"], kvlab.SPECS["l4"], 1000) == 0


# --- the models notebook 09's readings decide with (issue 21, items 1 and 10)
# ----------------------------


def test_bandwidth_batch_grows_only_the_cache_term():
    from kvlab.theory import verdict
    from kvlab.theory.work import step_work

    shape = SHAPES["llama-3.2-1b"]
    one = step_work(shape, 1, 512, "cached", 2, 2)
    step, beta = 4 * one.total_bytes / 3.35e12, 3.35e12  # batch 1 at a quarter of the bandwidth
    b = verdict.bandwidth_batch(shape, 512, step, beta)
    assert b == pytest.approx((beta * step - one.weights_read) / (one.kv_read + one.kv_written))
    # At that batch a step of the same duration moves exactly the bandwidth: the model's own
    # boundary.
    at_b = verdict.flat_step_fraction(
        round(b), step, one.weights_read, one.kv_read + one.kv_written, beta
    )
    assert at_b == pytest.approx(1.0, rel=0.5 / b)
    assert (
        verdict.bandwidth_batch(shape, 512, one.total_bytes / beta / 2, beta) == 1.0
    )  # already past it
    assert b > 4  # not 1 / fraction: the weights do not grow with the batch


def test_idle_batch_and_parity_models_on_both_sides():
    from kvlab.theory import verdict
    from kvlab.theory.agreement import edges

    expected = verdict.expected_static_idle(1e-3, 100, 120)
    assert expected == pytest.approx(1.2e-3)
    lo_d, lo_a, hi_a, hi_d = edges(expected, 0.15)

    def idle(x, graphed=False):
        return verdict.compare_idle(x, 1e-3, 100, 120, graphed, 0.15)

    assert idle(1.1 * hi_d).outcome == "disagrees" and idle(1.1 * hi_d).side == "above"
    assert idle(0.99 * hi_a).outcome == "agrees" and idle(1.01 * lo_a).outcome == "agrees"
    assert idle((hi_a * hi_d) ** 0.5).outcome == "cannot tell"
    assert idle((lo_a * lo_d) ** 0.5).outcome == "cannot tell"
    assert idle(0.9 * lo_d).outcome == "disagrees" and idle(0.9 * lo_d).side == "below"
    # Replayed as a graph the reference is the cached step's idle time, and far less is expected.
    graphed = idle(0.1e-3, graphed=True)
    assert graphed.predicted == 1e-3 and graphed.outcome == "disagrees" and graphed.side == "below"
    tpot = verdict.shared_weight_tpot(0.01, 16, 1e5, 1e10)
    assert tpot == pytest.approx(0.01 + 15 * 1e-5)
    l_lo_d, l_lo_a, l_hi_a, l_hi_d = edges(50.0, 0.1)
    assert verdict.compare_loops(0.9 * l_lo_d, 50.0, 0.1).side == "below"
    assert verdict.compare_loops(1.01 * l_lo_a, 50.0, 0.1).outcome == "agrees"
    assert verdict.compare_loops((l_hi_a * l_hi_d) ** 0.5, 50.0, 0.1).outcome == "cannot tell"
    assert verdict.compare_loops(1.1 * l_hi_d, 50.0, 0.1).side == "above"
    assert verdict.past_ridge(1.1 * 3.5, 3.5) and not verdict.past_ridge(0.9 * 3.5, 3.5)
    assert verdict.exceeds_ceilings(0.2, 1.1) and not verdict.exceeds_ceilings(0.9, 0.5)


def test_a_large_kv_share_far_below_the_bandwidth_is_not_kv_bound():
    from kvlab.theory import verdict

    t = verdict.CEILING_THRESHOLD
    near = verdict.decide(
        busy_fraction=0.8, bandwidth_fraction=1.1 * t, flops_fraction=0.01, kv_share=0.7
    )
    far = verdict.decide(
        busy_fraction=0.8, bandwidth_fraction=0.9 * t, flops_fraction=0.01, kv_share=0.7
    )
    assert near[0] == "kv" and far[0] == "overhead" and "neither bytes nor FLOPs" in far[1]
    # decide checks its arguments, then hands the numbers to classify unchanged.
    assert verdict.classify(0.8, 0.9 * t, 0.01, 0.7) == far


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (
            lambda: verdict_models.bandwidth_batch(SHAPES["llama-3.2-1b"], 8, 0.0, 1e9),
            ValueError,
            "step_s must be a finite number > 0",
        ),
        (
            lambda: verdict_models.shared_weight_tpot(0.01, 0, 1e5, 1e9),
            ValueError,
            "batch must be an int >= 1",
        ),
        (
            lambda: verdict_models.expected_static_idle(1e-3, 0, 10),
            ValueError,
            "cached_ops must be an int >= 1",
        ),
        (
            lambda: verdict_models.past_ridge(1.0, -2.0),
            ValueError,
            "ridge must be a finite number > 0",
        ),
        (
            lambda: verdict_models.compare_loops(1.0, 0.0, 0.1),
            ValueError,
            "reference_tokens_per_s must be a finite number > 0",
        ),
    ],
)
def test_reading_models_refuse_bad_numbers(call, kind, words):
    with pytest.raises(kind, match=words):
        call()


# issue 22's bad calls of decide: out-of-range shares and a missing admission are refused, not
# printed
GOOD = dict(
    busy_fraction=0.5, bandwidth_fraction=0.5, flops_fraction=0.1, kv_share=0.5, admitted=True
)


@pytest.mark.parametrize(
    "field, value, error, match",
    [
        ("busy_fraction", 1.5, ValueError, r"busy_fraction must be in \[0, 1\], got 1.5"),
        ("kv_share", float("nan"), ValueError, "kv_share must be in"),
        (
            "bandwidth_fraction",
            float("inf"),
            ValueError,
            "bandwidth_fraction must be a finite number",
        ),
        ("flops_fraction", True, TypeError, "flops_fraction must be"),
        (
            "admitted",
            None,
            TypeError,
            "admitted must be True, False or a kvlab.theory.roofline.Admission",
        ),
    ],
)
def test_decide_refuses_each_bad_argument(field, value, error, match):
    with pytest.raises(error, match=match):
        decide(**dict(GOOD, **{field: value}))


def test_batch_tpot_is_the_roofline_anchored_at_batch_one():
    from kvlab.theory import verdict

    # Weights 80 MB at 10 GB/s: 8 ms. One sequence's 40 MFLOP at 10 GFLOP/s: 4 ms at batch 1,
    # 16 sequences at 20 GFLOP/s: 32 ms. Batch 1 paid 2 ms beyond its roof.
    t = verdict.batch_tpot(0.010, 16, 80e6, 1e5, 40e6, 1e10, 1e10, 2e10)
    assert t == pytest.approx(0.010 + 0.032 - 0.008 + 15 * 1e-5)
    # Below the ridge the weights' read bounds the step: only the cache term grows.
    flat = verdict.batch_tpot(0.010, 2, 80e6, 1e5, 4e6, 1e10, 1e10, 2e10)
    assert flat == pytest.approx(0.010 + 1e-5)
    with pytest.raises(ValueError, match="rate_b must be a finite number > 0"):
        verdict.batch_tpot(0.010, 2, 80e6, 1e5, 4e6, 1e10, 1e10, 0.0)


def test_batch_tpot_comparison_and_sweep_outcome_on_every_side():
    from kvlab.theory import verdict
    from kvlab.theory.agreement import edges

    pred, spread = 0.020, 0.15
    lo_d, lo_a, hi_a, hi_d = edges(pred, spread)
    agree = verdict.compare_batch_tpot(0.99 * hi_a, pred, spread)
    tell = verdict.compare_batch_tpot((hi_a * hi_d) ** 0.5, pred, spread)
    above = verdict.compare_batch_tpot(1.1 * hi_d, pred, spread)
    below = verdict.compare_batch_tpot(0.9 * lo_d, pred, spread)
    assert (agree.outcome, tell.outcome, above.outcome, below.outcome) == (
        "agrees",
        "cannot tell",
        "disagrees",
        "disagrees",
    )
    assert verdict.compare_batch_tpot(1.01 * lo_a, pred, spread).outcome == "agrees"
    assert verdict.sweep_outcome([agree, agree]) == "agrees"
    assert verdict.sweep_outcome([agree, tell]) == "cannot tell"
    assert verdict.sweep_outcome([tell, above, agree]) == "disagrees"
    with pytest.raises(TypeError, match="comparisons"):
        verdict.sweep_outcome([0.5])


def test_verdicts_within_names_both_sides_of_a_threshold():
    from kvlab.theory import verdict

    common = dict(bandwidth_fraction=0.4, flops_fraction=0.05, kv_share=0.2)
    t = verdict.BUSY_THRESHOLD
    # Well above the busy threshold: one verdict; well below: one; on it: both.
    assert verdict.verdicts_within(busy_fraction=1.3 * t, **common) == ("weights",)
    assert verdict.verdicts_within(busy_fraction=0.7 * t, **common) == ("overhead",)
    assert verdict.verdicts_within(busy_fraction=1.05 * t, **common) == ("overhead", "weights")
    # A wider measured spread widens the band past the floor.
    assert verdict.verdicts_within(busy_fraction=1.3 * t, busy_spread=0.4, **common) == (
        "overhead",
        "weights",
    )
    # The ceiling shares move too: a step near both ceilings alike cannot tell compute from weights.
    near = dict(busy_fraction=0.9, bandwidth_fraction=0.3, flops_fraction=0.31, kv_share=0.2)
    assert verdict.verdicts_within(**near) == ("weights", "compute")
    # The verdict decide gives is always among them.
    for busy in (0.3, 0.48, 0.52, 0.8):
        v, _ = verdict.decide(busy_fraction=busy, **common)
        assert v in verdict.verdicts_within(busy_fraction=busy, **common)


def test_batch_tpot_spread_weights_each_term_by_its_share():
    from kvlab.theory import verdict

    # A prediction of 40 ms: 10 ms of batch 1 at 20%, 30 ms of products at 10%, measured at 5%.
    assert verdict.batch_tpot_spread(0.040, 0.010, 0.2, 0.030, 0.1, 0.05) == pytest.approx(
        0.05 + (0.010 * 0.2 + 0.030 * 0.1) / 0.040
    )
    with pytest.raises(ValueError, match="rate_spread"):
        verdict.batch_tpot_spread(0.040, 0.010, 0.2, 0.030, -0.1, 0.05)
