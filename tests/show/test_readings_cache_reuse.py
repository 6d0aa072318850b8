"""kvlab.show.readings.cache_reuse: the sentences that depend on a measurement, each fed both
outcomes (CONTRIBUTING.md, readings)."""

import re

from kvlab.show.readings import cache_reuse
from kvlab.theory.agreement import factor_edges
from kvlab.theory.work import (
    POSITIONS_TOLERANCE,
    REQUEST_TOLERANCE,
    pass_time,
    positions_processed,
    request_time,
)


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


P, G, A, B = 64, 64, 0.01, 1e-4  # the fitted pass cost t(n) = a + b n the model is fed
GROWTHS = dict(naive_growth=pass_time(P + G - 1, A, B) / pass_time(P + 1, A, B), cached_growth=1.0)


def _speedup(naive_s, cached_s, **growths):
    return no_roles(
        cache_reuse.speedup_reading(P, G, A, B, naive_s, cached_s, 0.2, **{**GROWTHS, **growths})
    )


def test_cache_reuse_speedup_follows_the_two_pass_model_on_both_sides():
    """Predicted request times from ``request_time``; measured speedups at 0.9x and 1.1x of both
    edges of ``REQUEST_TOLERANCE``, the gap put on the cached loop (the naive loop's on the other
    side)."""
    naive, cached = request_time(P, G, A, B), request_time(P, G, A, B, cached=True)
    low, high = factor_edges(naive / cached, REQUEST_TOLERANCE)
    assert "explains most of both loops' time" in _speedup(naive, naive / (1.1 * low))
    assert "explains most of both loops' time" in _speedup(naive, naive / (0.9 * high))
    assert "request_time" in _speedup(naive, cached) and f"{naive / cached:.1f} times" in _speedup(
        naive, cached
    )
    slow_cached = _speedup(naive, naive / (0.9 * low))
    assert "cached loop, which took" in slow_cached and "DynamicCache" in slow_cached
    assert "explains" not in slow_cached
    fast_cached = _speedup(naive, naive / (1.1 * high))
    assert "cached loop, which took" in fast_cached and "cold" in fast_cached
    fast_naive = _speedup(0.9 * low * cached, cached)
    assert "naive loop, which took" in fast_naive and "not a straight line" in fast_naive
    slow_naive = _speedup(1.1 * high * cached, cached)
    assert "naive loop, which took" in slow_naive and "no longer fit" in slow_naive


def test_cache_reuse_speedup_against_the_positions_ratio_on_both_sides():
    work = positions_processed(P, G) / positions_processed(P, G, cached=True)
    low, high = factor_edges(work, POSITIONS_TOLERANCE)
    assert "fixed cost $a$" in _speedup(
        0.9 * low, 1.0
    ) and f"{work:.0f} times as many positions" in _speedup(1, 1)
    assert "small next to the per-token work" in _speedup(
        1.1 * low, 1.0
    ) and "It is" not in _speedup(1.1 * low, 1.0)
    assert "small next to the per-token work" in _speedup(0.9 * high, 1.0)
    assert "pairs ratio" in _speedup(1.1 * high, 1.0)


def test_cache_reuse_step_growth_on_both_sides():
    """Each loop's last step over its first at 0.9x and 1.1x of the edges around the model's
    growth."""
    naive_low, naive_high = factor_edges(GROWTHS["naive_growth"], REQUEST_TOLERANCE)
    cached_low, cached_high = factor_edges(1.0, REQUEST_TOLERANCE)
    speedup = request_time(P, G, A, B) / request_time(P, G, A, B, cached=True)
    for growths in (
        dict(naive_growth=1.1 * naive_low),
        dict(naive_growth=0.9 * naive_high),
        dict(cached_growth=1.1 * cached_low),
        dict(cached_growth=0.9 * cached_high),
    ):
        assert "cached tokens cost about the same" in _speedup(speedup, 1.0, **growths)
    for growths in (
        dict(naive_growth=0.9 * naive_low),
        dict(naive_growth=1.1 * naive_high),
        dict(cached_growth=0.9 * cached_low),
        dict(cached_growth=1.1 * cached_high),
    ):
        text = _speedup(speedup, 1.0, **growths)
        assert "One of them is within" in text and "about the same" not in text
    both = _speedup(speedup, 1.0, naive_growth=1.1 * naive_high, cached_growth=1.1 * cached_high)
    assert "Neither of them" in both and f"{GROWTHS['naive_growth']:.2f}" in both


def test_cache_reuse_latency_follows_the_spread_on_both_sides():
    """The static TPOT against the cached one, with the spread solved from their difference: at 1.1x
    of it the difference is within the noise, at 0.9x it stands out (slower or faster)."""
    cached = 0.017
    for static, verdict in ((0.019, "slower than the cached loop"), (0.015, "Here it was faster")):
        threshold = abs(static - cached) / cached
        within = no_roles(
            cache_reuse.latency_reading(96, 32, 0.07, 0.08, cached, static, 1.1 * threshold)
        )
        out = no_roles(
            cache_reuse.latency_reading(96, 32, 0.07, 0.08, cached, static, 0.9 * threshold)
        )
        assert "differ by less than that spread" in within and verdict not in within
        assert verdict in out and "differ by less" not in out
    # The naive TPOT against the cached one, through the same spread model on both sides of its
    # boundary.
    for naive, verdict in (
        (0.025, "because every one of them is a prefill"),
        (0.012, "slowed the cached run"),
    ):
        threshold = abs(naive - cached) / cached
        within = no_roles(
            cache_reuse.latency_reading(96, 32, 0.07, naive, cached, 0.0171, 1.1 * threshold)
        )
        out = no_roles(
            cache_reuse.latency_reading(96, 32, 0.07, naive, cached, 0.0171, 0.9 * threshold)
        )
        assert "the fixed cost of a pass hides" in within and verdict not in within
        assert verdict in out and "hides" not in out
    usual = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, 0.017, 0.018, 0.2))
    assert "17 ms" in usual and "70 ms" in usual


def test_cache_reuse_compile_follows_the_break_even_model():
    """The break-even from the model itself; requests of 0.9x and 1.1x that many tokens fall on
    either side."""
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
    from kvlab.lab.decode_peers import PeerComparison
    from kvlab.theory.peers import GENERATE, GENERATE_COMPILED

    base = 1.0
    times = {
        GENERATE: (base,),
        GENERATE_COMPILED: (base,),
        "cached": (base,),
        "static, compiled": (base / speedup_over_hf,),
    }
    times["cached"] = (times["static, compiled"][0] * speedup_over_cached,)
    return PeerComparison("tiny-llama", "float32", "cpu", 1, 128, 128, times, times, {})


def test_cache_reuse_peers_follow_the_targets_on_both_sides():
    """Ratios at 0.9x and 1.1x of each target (``kvlab.theory.peers.TARGETS``): met above, missed
    below."""
    from kvlab.theory.peers import GENERATE_COMPILED, TARGETS

    hf, cached = (
        TARGETS["static, compiled", GENERATE_COMPILED],
        TARGETS["static, compiled", "cached"],
    )
    met = no_roles(cache_reuse.peers_reading(_peers(1.1 * hf, 1.1 * cached)))
    assert met.count("at least as fast") == 2 and "short of" not in met
    assert "1.10x (one round: 1.10x to 1.10x)" in met and "tiny-llama, float32, P=128" in met
    missed = no_roles(cache_reuse.peers_reading(_peers(0.9 * hf, 0.9 * cached)))
    assert missed.count("short of the target") == 2 and "same compiler" in missed
    assert "preallocated slot" in missed


def test_cache_reuse_explore_follows_the_positions_ratio_on_both_sides():
    """The positions ratio from ``positions_processed``; time ratios at 0.9x and 1.1x of both
    edges."""
    tt, tp = (
        {"naive": 0.07, "cached": 0.07, "static": 0.08},
        {"naive": 0.08, "cached": 0.02, "static": 0.02},
    )
    work = positions_processed(32, 8) / positions_processed(32, 8, cached=True)
    low, high = factor_edges(work, POSITIONS_TOLERANCE)

    def text(ratio):
        return no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, ratio, work))

    assert "fixed per-pass cost is paid by both" in text(
        0.9 * low
    ) and "positions ratio (`kvlab.theory.work.positions_processed`" in text(1)
    assert "sets both loops' time" in text(1.1 * low) and "sets both loops' time" in text(
        0.9 * high
    )
    assert "The time ratio is higher" in text(1.1 * high) and "pairs ratio" in text(1.1 * high)
