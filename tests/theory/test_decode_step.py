"""kvlab.theory.decode_step (sections 9.1 to 9.3): the cached step's three-pass model worked by
hand, the spread of a run's steps, and the two decisions (a change standing out, a step near its
weight-read floor) on both sides of their edges."""

import math

import pytest

from kvlab.theory.decode_step import (
    FLOOR_BAND,
    near_floor,
    predicted_step,
    predicted_step_growth,
    stands_out,
    step_slope,
    step_spread,
    weight_read_floor,
)


def test_step_growth_model():
    assert predicted_step_growth(1000, 10, 1e9) == pytest.approx(3e-5)
    assert predicted_step_growth(1000, 10, 1e9, passes=1) == pytest.approx(1e-5)
    assert step_spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert step_spread([0.9, 1.0, 1.0, 1.1, 1.2]) > 0
    assert stands_out(0.02, 1.0, 0.01) and not stands_out(0.005, 1.0, 0.01)
    assert stands_out(-0.02, 1.0, 0.01)


def test_step_model_line():
    """t(s) = t(s0) + 3k(s - s0)/beta: its slope is step_slope, and it takes arrays."""
    import numpy as np

    assert step_slope(1000, 1e9) == pytest.approx(3e-6)
    assert predicted_step(0.01, 100, 100, 1000, 1e9) == 0.01
    assert predicted_step(0.01, 100, 1100, 1000, 1e9) == pytest.approx(
        0.01 + 1000 * step_slope(1000, 1e9)
    )
    np.testing.assert_allclose(
        predicted_step(0.01, 100, np.array([100, 1100]), 1000, 1e9), [0.01, 0.013]
    )


@pytest.mark.parametrize("factor, outside", [(0.9, False), (1.1, True)])
def test_stands_out_on_both_sides_of_the_spread(factor, outside):
    step, spread = 2e-3, 0.05
    assert stands_out(factor * spread * step, step, spread) is outside
    assert stands_out(-factor * spread * step, step, spread) is outside


@pytest.mark.parametrize("factor, near", [(0.9, True), (1.1, False)])
def test_near_floor_on_both_sides_of_the_band(factor, near):
    floor = weight_read_floor(270e6, 90e9)
    assert floor == pytest.approx(3e-3)
    assert near_floor(factor * FLOOR_BAND * floor, floor) is near


@pytest.mark.parametrize(
    "call",
    [
        lambda: step_slope(1000, 0.0),
        lambda: predicted_step(0.01, 100, 200, 1000, -1e9),
        lambda: weight_read_floor(1e6, 0),
    ],
)
def test_a_bandwidth_that_is_not_positive_is_named(call):
    with pytest.raises(ValueError, match="bandwidth must be a finite number > 0"):
        call()


def test_fitted_growth_reads_a_line_through_every_step():
    from kvlab.theory.decode_step import fitted_growth

    line = [0.010 + 0.001 * j for j in range(9)]  # 10 ms rising to 18 ms: 1.8 times, no scatter
    growth, scatter = fitted_growth(line)
    assert math.isclose(growth, 1.8) and math.isclose(scatter, 0.0, abs_tol=1e-12)
    # One slow first step (descheduled) moves a two-step ratio by a third; the line does not move.
    jolted = [0.015] + line[1:]
    assert line[-1] / jolted[0] < 1.25 and math.isclose(fitted_growth(jolted)[0], 1.8)
    assert fitted_growth(jolted)[1] < 0.01  # nor widen the scatter: the quartiles pass it by
    flat = fitted_growth([0.02, 0.021, 0.019, 0.02, 0.021, 0.019])
    assert abs(flat[0] - 1) < 0.06 and 0 < flat[1] <= 0.11
    assert fitted_growth([3.0, 2.0, 1.0])[0] == 1 / 3  # a falling run: growth below 1
    assert fitted_growth([1e-9, 1.0, 2.0])[0] > 1e6  # a line through almost zero at the start
