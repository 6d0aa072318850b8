"""kvlab.show.readings.cache_reuse: the sentences that depend on a measurement, each fed both
outcomes (CONTRIBUTING.md, readings)."""

import math
import re

from kvlab.show.readings import cache_reuse
from kvlab.theory.agreement import edges
from kvlab.theory.work import pass_time, positions_processed, request_time


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


P, G, A, B = 64, 64, 0.01, 1e-4  # the fitted pass cost t(n) = a + b n the model is fed
SPREAD = 0.05
GROWTHS = dict(naive_growth=pass_time(P + G - 1, A, B) / pass_time(P + 1, A, B), cached_growth=1.0)


def _speedup(naive_s, cached_s, **growths):
    return no_roles(
        cache_reuse.speedup_reading(
            P,
            G,
            A,
            B,
            naive_s,
            cached_s,
            0.2,
            **{**GROWTHS, **growths},
            spread=SPREAD,
            step_noise=SPREAD,
        )
    )


def test_cache_reuse_speedup_follows_the_two_pass_model_on_every_side():
    """Predicted request times from ``request_time``; measured speedups 10% past each edge of
    ``agreement.edges`` and inside the cannot-tell band, the gap put on the cached loop (the naive
    loop's on the other side)."""
    naive, cached = request_time(P, G, A, B), request_time(P, G, A, B, cached=True)
    lo_dis, lo_agree, hi_agree, hi_dis = edges(naive / cached, SPREAD)
    assert "explains most of both loops' time" in _speedup(naive, naive / (1.1 * lo_agree))
    assert "explains most of both loops' time" in _speedup(naive, naive / (0.9 * hi_agree))
    assert "request_time" in _speedup(naive, cached) and f"{naive / cached:.1f} times" in _speedup(
        naive, cached
    )
    unsure = _speedup(naive, naive / math.sqrt(hi_agree * hi_dis))
    assert "cannot say whether the model misses" in unsure and "cannot tell" in unsure
    slow_cached = _speedup(naive, naive / (0.9 * lo_dis))
    assert "cached loop, which took" in slow_cached and "DynamicCache" in slow_cached
    assert "explains" not in slow_cached
    fast_cached = _speedup(naive, naive / (1.1 * hi_dis))
    assert "cached loop, which took" in fast_cached and "cold" in fast_cached
    fast_naive = _speedup(0.9 * lo_dis * cached, cached)
    assert "naive loop, which took" in fast_naive and "not a straight line" in fast_naive
    slow_naive = _speedup(1.1 * hi_dis * cached, cached)
    assert "naive loop, which took" in slow_naive and "no longer fit" in slow_naive


def test_cache_reuse_speedup_against_the_positions_ratio_on_every_side():
    work = positions_processed(P, G) / positions_processed(P, G, cached=True)
    lo_dis, lo_agree, hi_agree, hi_dis = edges(work, SPREAD)
    assert "fixed cost $a$" in _speedup(0.9 * lo_dis, 1.0)
    assert f"{work:.0f} times as many positions" in _speedup(1, 1)
    for inside in (1.1 * lo_agree, 0.9 * hi_agree):
        assert "small next to the per-token work" in _speedup(inside, 1.0)
    assert "pairs ratio" in _speedup(1.1 * hi_dis, 1.0)
    unsure = _speedup(math.sqrt(lo_dis * lo_agree), 1.0)
    assert "cannot tell" in unsure and "fixed cost $a$" in unsure


def test_cache_reuse_step_growth_on_every_side():
    """Each loop's last step over its first 10% past the edges around the model's growth, and
    inside the cannot-tell band."""
    n_edges = edges(GROWTHS["naive_growth"], SPREAD)
    c_edges = edges(1.0, SPREAD)
    speedup = request_time(P, G, A, B) / request_time(P, G, A, B, cached=True)
    for growths in (
        dict(naive_growth=1.1 * n_edges[1]),
        dict(naive_growth=0.9 * n_edges[2]),
        dict(cached_growth=1.1 * c_edges[1]),
        dict(cached_growth=0.9 * c_edges[2]),
    ):
        assert "cached tokens cost about the same" in _speedup(speedup, 1.0, **growths)
    for growths in (dict(naive_growth=0.9 * n_edges[0]), dict(naive_growth=1.1 * n_edges[3])):
        text = _speedup(speedup, 1.0, **growths)
        assert "The naive growth disagrees" in text and "about the same" not in text
    both = _speedup(speedup, 1.0, naive_growth=1.1 * n_edges[3], cached_growth=1.1 * c_edges[3])
    assert "naive and the cached growth disagrees" in both
    assert f"{GROWTHS['naive_growth']:.2f}" in both
    longer = _speedup(speedup, 1.0, cached_growth=1.1 * c_edges[3])
    assert "The cached growth disagrees" in longer and "one token longer" in longer
    flat = _speedup(speedup, 1.0, cached_growth=0.9 * c_edges[0])
    assert "The cached growth disagrees with the two-pass model." in flat
    assert "one token longer" not in flat
    unsure = _speedup(speedup, 1.0, cached_growth=math.sqrt(c_edges[2] * c_edges[3]))
    assert "cannot tell whether the growth fits" in unsure


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


def test_cache_reuse_compile_on_every_side_of_no_gain():
    """The eager step is the prediction of a compiled step that gains nothing: compiled steps past
    each edge of ``agreement.edges`` and inside the cannot-tell band; below it, the break-even model
    decides for requests of 0.9x and 1.1x the break-even."""
    import math

    from kvlab.theory.agreement import edges
    from kvlab.theory.work import break_even_tokens

    eager, spread = 6e-3, 0.05
    lo_dis, lo_agree, hi_agree, hi_dis = edges(eager, spread)
    compiled = 0.9 * lo_dis
    cost = 60.0
    n = break_even_tokens(cost, eager - compiled)

    def read(t, tokens=48, k=n):
        return no_roles(cache_reuse.compile_reading(cost, eager, t, spread, k, tokens))

    short, long = read(compiled, int(0.9 * n)), read(compiled, int(1.1 * n) + 1)
    assert f"{n:,.0f} tokens" in short and "does not repay it" in short and "disagrees" in short
    assert "which compiling already paid for" in long
    same = read(eager, k=math.inf)
    assert "no faster within this run's noise" in same and "agrees" in same
    unsure = read(math.sqrt(lo_dis * lo_agree), k=math.inf)
    assert "no break-even worth stating" in unsure and "cannot tell" in unsure
    slower = read(1.1 * hi_dis, k=math.inf)
    assert "never pays off" in slower and "target" not in slower


def test_ttft_reading_on_every_side():
    from kvlab.lab.timing import Timing

    def t(x):
        return Timing(x, x, x, (x, x, x))

    def read(ttft, cache_bytes=1e5):
        return no_roles(cache_reuse.ttft_reading(ttft, cache_bytes, 1e10))

    same = read({"naive": t(0.10), "cached": t(0.105)})
    assert "fastest of 3 prefills" in same and "agrees" in same and "lost in the prefill" in same
    apart = read({"naive": t(0.10), "static": t(0.153)})
    assert "disagrees" in apart and "setup on the host" in apart and "10 µs" in apart
    written = read({"naive": t(0.10), "static": t(0.153)}, cache_bytes=1e8)
    assert "The difference is those writes" in written
    unsure = read({"naive": t(0.10), "static": t(0.12)})
    assert "cannot tell" in unsure


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


def test_cache_reuse_peers_on_every_side_of_as_fast():
    """Speed-ups past each edge of ``agreement.edges`` around 1 (as fast), and in between."""
    import math

    from kvlab.theory.agreement import edges

    lo_dis, lo_agree, hi_agree, hi_dis = edges(1.0, 0.0)
    fast = no_roles(cache_reuse.peers_reading(_peers(1.1 * hi_dis, 1.1 * hi_dis)))
    assert fast.count(": faster.") == 1 and "target" not in fast
    assert "tiny-llama, float32, P=128" in fast and "single rounds" in fast
    assert "kvlab's cached loop" not in fast.split("dynamic cache.")[1]  # one verdict on compiling
    slow = no_roles(cache_reuse.peers_reading(_peers(0.9 * lo_dis, 0.9 * lo_dis)))
    assert slow.count(": slower.") == 1
    even = no_roles(cache_reuse.peers_reading(_peers(1.0, 1.0)))
    assert even.count("as fast, within the spread") == 1
    g = math.sqrt(hi_agree * hi_dis)
    unsure = no_roles(cache_reuse.peers_reading(_peers(g, g)))
    assert unsure.count("cannot resolve") == 1


def test_cache_reuse_explore_follows_the_positions_ratio_on_both_sides():
    """The positions ratio from ``positions_processed``; time ratios at 0.9x and 1.1x of both
    edges."""
    tt, tp = (
        {"naive": 0.07, "cached": 0.07, "static": 0.08},
        {"naive": 0.08, "cached": 0.02, "static": 0.02},
    )
    work = positions_processed(32, 8) / positions_processed(32, 8, cached=True)
    lo_dis, lo_agree, hi_agree, hi_dis = edges(work, SPREAD)

    def text(ratio):
        return no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, ratio, work, SPREAD))

    assert "fixed per-pass cost is paid by both" in text(0.9 * lo_dis)
    assert "positions ratio (`kvlab.theory.work.positions_processed`" in text(1)
    assert "sets both loops' time" in text(1.1 * lo_agree)
    assert "sets both loops' time" in text(0.9 * hi_agree)
    assert "The time ratio is higher" in text(1.1 * hi_dis) and "pairs ratio" in text(1.1 * hi_dis)
    assert "too much in this run to call" in text(math.sqrt(hi_agree * hi_dis))
