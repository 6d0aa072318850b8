"""kvlab.show.readings.gemv: every decision fed measurements computed from its model at 0.9x and
1.1x of the edges of its tolerance (``kvlab.theory.agreement.factor_edges``), so a wrong model or
inequality fails (CONTRIBUTING.md, readings).
"""

import math
import re

import pytest

from kvlab import SHAPES
from kvlab.show.format import si
from kvlab.show.readings import gemv as gemv_readings
from kvlab.theory import matmul, roofline
from kvlab.theory.agreement import factor_edges

K, N, W = 4096, 6144, 4  # the CPU sweep's weight, fp32
COPY, PEAK = 10e9, 40e9  # calibrated copy bandwidth and matmul rate


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def _sides(predicted, tolerance):
    """(below, within, within, above): 0.9x and 1.1x of both edges."""
    low, high = factor_edges(predicted, tolerance)
    return 0.9 * low, 1.1 * low, 0.9 * high, 1.1 * high


def test_gemv_follows_the_roofline_on_both_sides():
    predicted = matmul.roofline_time(1, K, N, W, COPY, PEAK)
    fast, in_low, in_high, slow = (
        no_roles(gemv_readings.gemv_reading(1, K, N, W, t, COPY, PEAK))
        for t in _sides(predicted, matmul.ROOFLINE_TOLERANCE)
    )
    assert "faster than the copy" in fast
    assert "about the speed of one" in in_low and "about the speed of one" in in_high
    assert "did not" in slow and "about the speed of one" not in slow
    assert "roofline_time" in slow and si(predicted, "s") in slow
    exact = gemv_readings.gemv_reading(1, K, N, W, predicted, COPY, PEAK)
    assert "100% of the calibrated copy bandwidth" in exact and "0.50 FLOP per byte" in exact


def _ridge(knee, rms=0.0):
    """A fitted roofline whose knee is ``knee``: a bandwidth line of 6 GB/s under a roof of 6 knee
    GFLOP/s."""
    fit = matmul.RooflineFit(bandwidth=6e9, peak=6e9 * knee, split=4, points=8, rms_log_error=rms)
    n = matmul.batch_at_intensity(fit.knee, K, N, W)
    return no_roles(
        gemv_readings.ridge_reading(
            8.0, PEAK, COPY, fit.knee, n, fit.bandwidth, fit.peak, fit.rms_log_error
        )
    )


def test_gemv_ridge_fitted_knee_against_the_calibrated_one_on_both_sides():
    ridge = matmul.ridge_intensity(PEAK, COPY)
    early, in_low, in_high, late = (_ridge(k) for k in _sides(ridge, matmul.RIDGE_TOLERANCE))
    assert "bent earlier" in early and "within" not in early
    assert "The two agree" in in_low and "The two agree" in in_high and "4 FLOP per byte" in in_low
    assert "bent later" in late and "60% of the copy bandwidth" in late
    none = no_roles(
        gemv_readings.ridge_reading(8.0, PEAK, COPY, float("nan"), float("nan"), 1e9, 1e10)
    )
    assert "finds no knee" in none and "measured knee" not in none


def test_gemv_ridge_corner_on_both_sides():
    edge = math.log(
        matmul.CORNER_TOLERANCE
    )  # the RMS log error at which the points stop fitting a corner
    assert "bend gradually" not in _ridge(4.0, 0.9 * edge)
    curve = _ridge(4.0, 1.1 * edge)
    assert "bend gradually" in curve and "25% a corner allows" in curve


def _doubling_times(ns, growth):
    """Times whose every doubling grows by ``growth``."""
    return [growth ** math.log2(n) for n in ns]


def test_gemv_doubling_follows_the_roofline_on_both_sides():
    """The expected growth from ``roofline_time`` under the fitted ceilings; measured growths at
    0.9x and 1.1x of both edges of ``DOUBLING_TOLERANCE``."""
    ns, bandwidth, peak = [1, 2, 4, 8, 16], 6e9, 30e9
    knee_n = matmul.batch_at_intensity(peak / bandwidth, K, N, W)
    assert 8 <= knee_n < 16  # three doublings lie left of the knee
    expected = math.exp(
        sum(
            math.log(
                matmul.roofline_time(2 * n, K, N, W, bandwidth, peak)
                / matmul.roofline_time(n, K, N, W, bandwidth, peak)
            )
            for n in (1, 2, 4)
        )
        / 3
    )
    texts = [
        no_roles(
            gemv_readings.doubling_reading(
                ns, _doubling_times(ns, g), knee_n, K, N, W, bandwidth, peak
            )
        )
        for g in _sides(expected, matmul.DOUBLING_TOLERANCE)
    ]
    fell, in_low, in_high, steep = texts
    assert "time fell" in fell
    assert (
        "barely changed" in in_low
        and "barely changed" in in_high
        and f"{expected:.2f} there" in in_low
    )
    assert "did not" in steep and "The largest jump" in steep
    assert "No doubling" in gemv_readings.doubling_reading(
        [1, 2], [1.0, 2.0], 1.5, K, N, W, bandwidth, peak
    )


def test_gemv_step_profile_follows_the_weight_read_floor_on_both_sides():
    from kvlab.theory.decode_step import FLOOR_BAND, weight_read_floor

    floor = weight_read_floor(65e6, COPY)
    gemv = matmul.compare_with_roofline(
        matmul.roofline_time(1, K, N, W, COPY, PEAK), 1, K, N, W, COPY, PEAK
    )
    below, in_low, in_high, above = (
        no_roles(gemv_readings.step_profile_reading("m", t, 65e6, floor, 0.7, gemv))
        for t in _sides(floor, FLOOR_BAND)
    )
    assert "faster than reading its weights" in below
    assert "most of the step" in in_low and "most of the step" in in_high
    assert "smaller part" in above and "weight_read_floor" in above and "6.5 ms" in above
    assert "runs at about copy speed (100% of it, within the factor 1.5" in above


def test_gemv_step_profile_gemv_on_both_sides():
    from kvlab.theory.decode_step import weight_read_floor

    floor = weight_read_floor(65e6, COPY)
    predicted = matmul.roofline_time(1, K, N, W, COPY, PEAK)
    fast, in_low, in_high, slow = (
        no_roles(
            gemv_readings.step_profile_reading(
                "m",
                floor,
                65e6,
                floor,
                0.7,
                matmul.compare_with_roofline(t, 1, K, N, W, COPY, PEAK),
            )
        )
        for t in _sides(predicted, matmul.ROOFLINE_TOLERANCE)
    )
    assert "faster than the copy" in fast
    assert "about copy speed" in in_low and "about copy speed" in in_high
    assert "reached only 61% of copy speed" in slow  # 1 / (1.1 * 1.5)


@pytest.fixture
def floors():
    """A step's floors from the roofline model: the cache read once and counted three times."""
    shape = SHAPES["smollm2-135m"]
    return (
        roofline.step_time_floor(shape, "h100-sxm", 4, 1024),
        roofline.step_time_floor(shape, "h100-sxm", 4, 1024, w_kv=6),
    )


def test_gemv_explorer_follows_the_step_floor_on_both_sides(floors):
    floor, floor_copy = floors
    below, in_low, in_high, above = (
        no_roles(gemv_readings.explore_reading(4, 1024, t, floor, floor_copy))
        for t in _sides(floor_copy, roofline.STEP_FLOOR_TOLERANCE)
    )
    assert "should not allow" in below
    assert "Close to the floor" in in_low and "Close to the floor" in in_high
    assert "Well above" in above and "step_time_floor" in above and si(floor_copy, "s") in above


def test_gemv_floor_ratio_follows_the_step_floor_on_both_sides(floors):
    _, floor_copy = floors
    below, in_low, in_high, above = (
        no_roles(gemv_readings.floor_ratio_reading(1, 256, 4.5, 16, 4096, t / floor_copy))
        for t in _sides(floor_copy, roofline.STEP_FLOOR_TOLERANCE)
    )
    assert "faster than its floor allows" in below
    assert "meets the floor" in in_low and "meets the floor" in in_high
    assert "here it did not" in above and "2.2 times" in above and "4.5 times its floor" in above
