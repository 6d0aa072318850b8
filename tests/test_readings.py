"""Readings (kvlab.readings): each outcome-dependent sentence, fed both outcomes.

A reading must change with its condition and stay true to the numbers it is given: the tests feed
each function a measurement that agrees with its prediction and one that does not, and check that
the text quotes the numbers and says which of the two happened.
"""

import re

import pytest

from kvlab.readings import decode_loop, ratio_text, sci, within


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_helpers():
    assert within(1.0, 1.2, 1.25) and not within(1.0, 2.0, 1.25) and not within(0.0, 1.0, 2)
    assert ratio_text(2.1, 1.0) == "2.1 times" and ratio_text(45.0, 1.0) == "45 times"
    assert sci(3.13e8) == r"$3.13 \times 10^{8}$" and sci(655_000) == "655,000" and sci(12.5) == "12.5"


# -- 9.1 the decode loop -------------------------------------------------------------------------


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


def test_decode_loop_intercept_both_outcomes():
    above = decode_loop.intercept_reading(0.010, 0.034)
    near = decode_loop.intercept_reading(0.010, 0.012)
    assert "longer" in above and "10 ms" in above and "34 ms" in above
    assert "close to the floor" in near and "longer" not in near
