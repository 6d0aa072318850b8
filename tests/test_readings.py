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


# -- 9.2 recompute, cache reuse, optimized decode ------------------------------------------------

from kvlab.readings import cache_reuse  # noqa: E402


def test_cache_reuse_speedup_both_outcomes():
    common = dict(P=64, G=64, worst_error=0.2, work_ratio=48, naive_growth=3.0, cached_growth=1.1)
    agree = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=2, **common))
    slow_cached = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=0.6, **common))
    fast_naive = no_roles(cache_reuse.speedup_reading(naive_s=3, naive_pred=11, cached_s=2, cached_pred=2, **common))
    assert "within a factor of 1.5" in agree and "5.0 times" in agree and "5.5 times" in agree
    assert "cached loop, which took 3.3 times its prediction" in slow_cached and "DynamicCache" in slow_cached
    assert "naive loop, which took 0.27 times" in fast_naive and "not a straight line" in fast_naive
    assert "but its time ratio is smaller" in agree
    big = no_roles(cache_reuse.speedup_reading(naive_s=100, naive_pred=100, cached_s=2, cached_pred=2,
                                               **{**common, "work_ratio": 20}))
    assert "and its time ratio is as large" in big
    flat = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=2,
                                                **{**common, "naive_growth": 1.1}))
    assert "can hide it" in flat and "1.1 times the first" in flat


def test_cache_reuse_latency_both_outcomes():
    usual = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, 0.017, 0.018))
    odd = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.015, 0.017, 0.010))
    assert "because every one of them is a prefill" in usual and "does not make an eager step cheaper" in usual
    assert "no more than the cached loop" in odd and "Here it was faster" in odd
    assert "17 ms" in usual and "70 ms" in usual


def test_cache_reuse_compile_both_outcomes():
    pays = no_roles(cache_reuse.compile_reading(60.0, 6e-3, 1e-3, 12_000))
    never = no_roles(cache_reuse.compile_reading(60.0, 1e-3, 1.5e-3, float("inf")))
    assert "12,000 tokens" in pays and "gain of 5 ms" in pays
    assert "never" in never and "500 µs slower" in never and "tokens" not in never


def test_cache_reuse_explore_both_outcomes():
    tt, tp = {"naive": 0.07, "cached": 0.07, "static": 0.08}, {"naive": 0.08, "cached": 0.02, "static": 0.02}
    below = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 3.0, 7.0))
    above = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 9.0, 7.0))
    assert "below the positions ratio of 7.0" in below and "above the positions ratio" in above
