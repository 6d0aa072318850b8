"""kvlab.show.readings.decode_loop: the sentences that depend on a measurement, each fed both
outcomes (CONTRIBUTING.md, readings)."""

import re

import pytest

from kvlab.show.format import si
from kvlab.show.readings import decode_loop
from kvlab.theory import decode_step as dt
from kvlab.theory.agreement import edges


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


K, BETA = 65_536, 10e9  # cache bytes per token and bandwidth the model is fed


@pytest.mark.parametrize(
    "side, verdict",
    [
        (0.9 / dt.STEP_TOLERANCE, "faster than the line"),
        (1.1 / dt.STEP_TOLERANCE, "sits on the line"),
        (0.9 * dt.STEP_TOLERANCE, "sits on the line"),
        (1.1 * dt.STEP_TOLERANCE, "slower than the bytes"),
    ],
)
def test_decode_loop_step_follows_the_three_pass_model_on_both_sides(side, verdict):
    """The prediction from ``predicted_step``; medians at 0.9x and 1.1x of both edges of its
    tolerance."""
    predicted = dt.predicted_step(10e-3, 256, 1024 + 16, K, BETA)
    low, high = edges(predicted, dt.STEP_TOLERANCE)
    measured = side * predicted
    assert (low < measured < high) == (verdict == "sits on the line")
    text = no_roles(decode_loop.step_reading(1024, 32, measured, predicted))
    assert verdict in text and "1,024-token" in text and "31 decode steps" in text
    assert "three-pass model" in text and "predicted_step" in text and si(predicted, "s") in text


@pytest.mark.parametrize(
    "side, verdict", [(0.9, "less than the three passes"), (1.1, "explains how the step grows")]
)
def test_decode_loop_slope_below_the_tolerance(side, verdict):
    slope_low, _ = edges(dt.step_slope(K, BETA), dt.SLOPE_TOLERANCE)
    text = no_roles(decode_loop.slope_reading(K, BETA, side * slope_low, **ARGS))
    assert verdict in text


@pytest.mark.parametrize(
    "side, verdict", [(0.9, "explains how the step grows"), (1.1, "more than the three passes")]
)
def test_decode_loop_slope_above_the_tolerance(side, verdict):
    _, slope_high = edges(dt.step_slope(K, BETA), dt.SLOPE_TOLERANCE)
    text = no_roles(decode_loop.slope_reading(K, BETA, side * slope_high, **ARGS))
    assert verdict in text and "step_slope" in text and si(dt.step_slope(K, BETA), "s") in text


ARGS = dict(s0=256, t0=0.030, s_long=4096, t_long=0.080, weight_bytes=9e7)


@pytest.mark.parametrize(
    "side, verdict",
    [
        (0.9 / dt.GROWTH_TOLERANCE, "faster than the short-context one"),
        (1.1 / dt.GROWTH_TOLERANCE, "grew by less than"),
        (0.9 * dt.GROWTH_TOLERANCE, "grew by less than"),
        (1.1 * dt.GROWTH_TOLERANCE, "keeps growing"),
    ],
)
def test_decode_loop_growth_on_both_sides(side, verdict):
    """The long-context step at 0.9x and 1.1x of both edges around the short-context step."""
    t0 = ARGS["t0"]
    text = no_roles(
        decode_loop.slope_reading(K, BETA, dt.step_slope(K, BETA), **{**ARGS, "t_long": side * t0})
    )
    assert verdict in text
    assert si(dt.predicted_step(t0, 256, 4096, K, BETA), "s") in text
    assert si(3 * K * 4096, "B") in text


def test_decode_loop_intercept_follows_the_floor_model_on_both_sides():
    """The floor from the model (weight bytes / bandwidth); steps at 0.9x and 1.1x of the band's
    edge."""
    from kvlab.theory.decode_step import FLOOR_BAND, weight_read_floor

    floor = weight_read_floor(88e6, 8.8e9)
    edge = FLOOR_BAND * floor
    near = no_roles(decode_loop.intercept_reading(floor, 0.9 * edge))
    above = no_roles(decode_loop.intercept_reading(floor, 1.1 * edge))
    assert "within 1.5 times the floor" in near and "more than" not in near and "10 ms" in near
    assert "more than 1.5 times the floor" in above and "dispatch" in above


@pytest.mark.parametrize(
    "reading, missing",
    [
        (lambda: decode_loop.step_reading(64, 32, float("nan"), 1e-3), "median_s"),
        (lambda: decode_loop.step_reading(64, 32, 1e-3, None), "predicted_s"),
        (lambda: decode_loop.slope_reading(K, BETA, float("inf"), **ARGS), "slope_meas"),
        (lambda: decode_loop.intercept_reading(1e-3, float("nan")), "t0"),
    ],
)
def test_a_reading_handed_no_measurement_says_so_instead_of_a_verdict(reading, missing):
    text = reading()
    assert text.startswith("Not measured: " + missing) and "no verdict" in text
