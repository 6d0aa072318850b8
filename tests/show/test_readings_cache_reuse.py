"""kvlab.show.readings.cache_reuse: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re

from kvlab.show.readings import cache_reuse


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


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
