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


def test_cache_reuse_latency_follows_the_spread_on_both_sides():
    """The static TPOT against the cached one, with the spread solved from their difference: at 1.1x of
    it the difference is within the noise, at 0.9x it stands out (slower or faster)."""
    cached = 0.017
    for static, verdict in ((0.019, "slower than the cached loop"), (0.015, "Here it was faster")):
        threshold = abs(static - cached) / cached
        within = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, cached, static, 1.1 * threshold))
        out = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, cached, static, 0.9 * threshold))
        assert "differ by less than that spread" in within and verdict not in within
        assert verdict in out and "differ by less" not in out
    usual = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, 0.017, 0.018, 0.2))
    odd = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.015, 0.017, 0.010, 0.2))
    assert "because every one of them is a prefill" in usual and "17 ms" in usual and "70 ms" in usual
    assert "no more than the cached loop" in odd


def test_cache_reuse_compile_follows_the_break_even_model():
    """The break-even from the model itself; requests of 0.9x and 1.1x that many tokens fall on either side."""
    from kvlab.theory.work import break_even_tokens

    cost, eager, compiled = 60.0, 6e-3, 1e-3
    n = break_even_tokens(cost, eager - compiled)
    short = no_roles(cache_reuse.compile_reading(cost, eager, compiled, n, int(0.9 * n)))
    long = no_roles(cache_reuse.compile_reading(cost, eager, compiled, n, int(1.1 * n) + 1))
    assert "12,000 tokens" in short and "gain of 5 ms" in short and "did not repay it" in short
    assert "which compiling already paid for" in long and "break-even model" in long
    never = no_roles(cache_reuse.compile_reading(60.0, 1e-3, 1.5e-3, float("inf"), 48))
    assert "never" in never and "500 µs slower" in never and "tokens" not in never
    assert "expected result on a CPU" not in short + long + never


def test_cache_reuse_gpu_break_even_quotes_the_measured_gain():
    text = no_roles(cache_reuse.gpu_break_even_reading(12.0, 10.9e-3))
    assert "**12,000 tokens**" in text and "10.9 ms" in text and "1,101 at this run's gain" in text
    assert "start-up" in text and "even a gain" not in text
    assert "saved nothing" in cache_reuse.gpu_break_even_reading(12.0, -1e-3)


def _peers(speedup_over_hf: float, speedup_over_cached: float):
    from kvlab.lab.decode_peers import GENERATE, GENERATE_COMPILED, PeerComparison

    base = 1.0
    times = {GENERATE: (base,), GENERATE_COMPILED: (base,), "cached": (base,),
             "static, compiled": (base / speedup_over_hf,)}
    times["cached"] = (times["static, compiled"][0] * speedup_over_cached,)
    return PeerComparison("tiny-llama", "float32", "cpu", 1, 128, 128, times, times, {})


def test_cache_reuse_peers_follow_the_targets_on_both_sides():
    """Ratios at 0.9x and 1.1x of each target (``decode_peers.TARGETS``): met above, missed below."""
    from kvlab.lab.decode_peers import GENERATE_COMPILED, TARGETS

    hf, cached = TARGETS["static, compiled", GENERATE_COMPILED], TARGETS["static, compiled", "cached"]
    met = no_roles(cache_reuse.peers_reading(_peers(1.1 * hf, 1.1 * cached)))
    assert met.count("at least as fast") == 2 and "short of" not in met
    assert "1.10x (one round: 1.10x to 1.10x)" in met and "tiny-llama, float32, P=128" in met
    missed = no_roles(cache_reuse.peers_reading(_peers(0.9 * hf, 0.9 * cached)))
    assert missed.count("short of the target") == 2 and "same compiler" in missed
    assert "preallocated slot" in missed


def test_cache_reuse_explore_both_outcomes():
    tt, tp = {"naive": 0.07, "cached": 0.07, "static": 0.08}, {"naive": 0.08, "cached": 0.02, "static": 0.02}
    below = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 3.0, 7.0))
    above = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 9.0, 7.0))
    assert "below the positions ratio of 7.0" in below and "above the positions ratio" in above
