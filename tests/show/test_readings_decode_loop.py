"""kvlab.show.readings.decode_loop: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re

import pytest

from kvlab.show.readings import decode_loop


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


@pytest.mark.parametrize("measured, verdict", [(1.1e-3, "sits on the line"), (3e-3, "slower than the bytes"),
                                               (0.5e-3, "faster than the line")])
def test_decode_loop_step(measured, verdict):
    text = no_roles(decode_loop.step_reading(1024, 32, measured, 1e-3))
    assert verdict in text and "1,024-token" in text and "31 decode steps" in text


def test_decode_loop_slope_both_outcomes():
    args = dict(s0=256, t0=0.030, s_long=4096, t_long=0.080, cache_long_bytes=2e8, weight_bytes=9e7)
    agree = no_roles(decode_loop.slope_reading(5e-6, 6e-6, **args))
    steep = no_roles(decode_loop.slope_reading(5e-6, 40e-6, **args))
    flat = no_roles(decode_loop.slope_reading(5e-6, 1e-6, **args))
    assert "within a factor of two" in agree and "1.2 times" in agree
    assert "more than twice" in steep and "8 times" in steep and "within" not in steep
    assert "less than half" in flat and "0.2 times" in flat
    assert "keeps growing" in agree
    level = no_roles(decode_loop.slope_reading(5e-6, 6e-6, **{**args, "t_long": 0.031}))
    assert "barely grew" in level and "keeps growing" not in level


def test_decode_loop_intercept_follows_the_floor_model_on_both_sides():
    """The floor from the model (weight bytes / bandwidth); steps at 0.9x and 1.1x of the band's edge."""
    from kvlab.lab.decode_timing import FLOOR_BAND, weight_read_floor

    floor = weight_read_floor(88e6, 8.8e9)
    edge = FLOOR_BAND * floor
    near = no_roles(decode_loop.intercept_reading(floor, 0.9 * edge))
    above = no_roles(decode_loop.intercept_reading(floor, 1.1 * edge))
    assert "within 1.5 times the floor" in near and "more than" not in near and "10 ms" in near
    assert "more than 1.5 times the floor" in above and "dispatch" in above
