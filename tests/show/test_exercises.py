"""Worked solutions (kvlab.show.readings.exercises): folded, quoting the numbers they are given, and
saying which outcome happened where a solution depends on a measurement."""

import re

import pytest

from kvlab.show.readings import exercises as ex


def folded(text, number):
    assert text.startswith(f"<details>\n<summary>Solution to exercise {number}</summary>\n\n"), text
    assert text.rstrip().endswith("</details>")
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_solution_wrapper():
    folded(ex.solution(2, "Body."), 2)
    for bad in (0, True, "1"):
        with pytest.raises(ValueError, match="number"):
            ex.solution(bad, "Body.")
    with pytest.raises(ValueError, match="body"):
        ex.solution(1, "  ")
    assert ex.count(131_072) == "131,072" and ex.count(3.13e8).startswith("$3.13")


def test_decode_loop_solutions():
    t = folded(ex.decode_loop_gqa(8, 2, 8e-6, 2e-6, 16e-6), 1)
    assert "**4**" in t and "2 µs" in t
    t = folded(ex.decode_loop_window(512, 512, 128, 50_003_968, 131_072, 313_000_000, 655_104), 2)
    assert "131,072" in t and r"\min(P+j,\,W)" in t


def test_decode_loop_static_follows_the_growth_model_on_both_sides():
    """The cached steps' growth from the page's model (3k(G-1)/beta), against a spread solved from
    that growth: at 0.9x of it the growth stands out, at 1.1x it does not; the static steps
    likewise."""
    from kvlab.theory.decode_step import predicted_step_growth

    growth = predicted_step_growth(kv_bytes_per_token=65_536, tokens=31, bandwidth=10e9)
    first = 20e-3
    threshold = growth / first  # the spread at which the growth just stands out
    shows = folded(
        ex.decode_loop_static(
            256, 32, 30e-3, 30e-3, first, first + growth, growth, 0.9 * threshold
        ),
        3,
    )
    assert "this run can show it" in shows and "flat, as predicted" in shows
    hidden = folded(
        ex.decode_loop_static(256, 32, 30e-3, 30e-3, first, 0.8 * first, growth, 1.1 * threshold), 3
    )
    assert "cannot show it" in hidden and "not the history" in hidden
    moved = ex.decode_loop_static(
        256, 32, 30e-3, 30e-3 * (1 + 1.1 * threshold), first, first, growth, threshold
    )
    assert "more than the spread" in moved
    still = ex.decode_loop_static(
        256, 32, 30e-3, 30e-3 * (1 + 0.9 * threshold), first, first, growth, threshold
    )
    assert "flat, as predicted" in still


def test_cache_reuse_solutions_and_corrections():
    import math

    from kvlab.show.readings import cache_reuse
    from kvlab.theory.agreement import edges
    from kvlab.theory.work import request_time

    a, b, spread = 0.01, 1e-4, 0.05
    lo_dis, lo_agree, hi_agree, hi_dis = edges(
        request_time(128, 64, a, b) / request_time(128, 32, a, b), spread
    )
    for factor in (1.1 * lo_agree, 0.9 * hi_agree):
        ok = folded(ex.cache_reuse_doubling(128, 32, a, b, 0.8, 0.8 * factor, spread), 1)
        assert "The prediction holds" in ok and "4,592" in ok and "request_time" in ok
    for factor in (0.9 * lo_dis, 1.1 * hi_dis):
        off = folded(ex.cache_reuse_doubling(128, 32, a, b, 0.8, 0.8 * factor, spread), 1)
        assert "does not hold in this run" in off and "holds." not in off
    unsure = ex.cache_reuse_doubling(128, 32, a, b, 0.8, 0.8 * math.sqrt(hi_agree * hi_dis), spread)
    assert "too wide to call" in unsure and "cannot tell" in unsure
    # Both boundaries from their models: the recompilation model's edge, and the later steps'
    # spread.
    from kvlab.theory.decode_step import step_spread

    steady, first, later = 0.001, 5.0, [0.00095, 0.001, 0.001, 0.00105, 0.001]
    low, _, _, _ = edges(first - steady, step_spread(later))  # the recompilation model's edge
    for excess in (1.1 * low, first - steady):  # cannot tell, and agrees
        w = folded(
            ex.cache_reuse_warm({2: 10.0, 8: 10.5}, [first, steady + excess] + later, steady), 2
        )
        assert "| 8 | 10.5 s |" in w and "a second compilation" in w
    work = ex.cache_reuse_warm({2: 10.0}, [first, steady + 0.9 * low] + later, steady)
    assert "one-time work remains" in work and "a second compilation" not in work
    noise = step_spread(later) * steady
    assert "one-time work remains" in ex.cache_reuse_warm(
        {2: 10.0}, [first, steady + 1.1 * noise] + later, steady
    )
    assert "already steady" in ex.cache_reuse_warm(
        {2: 10.0}, [first, steady + 0.9 * noise] + later, steady
    )
    # the positions ratio is no bound: the reading names the pairs ratio either way
    tt, tp = (
        {"naive": 0.07, "cached": 0.07, "static": 0.08},
        {"naive": 0.08, "cached": 0.02, "static": 0.02},
    )
    above = cache_reuse.explore_reading(512, 512, 1, "cpu", tt, tp, 10.0, 7.0, 0.05)
    assert "pairs ratio, 477.8 here" in above  # against a positions ratio of 384 at P = G = 512


def test_gemv_solutions_and_capacity_readings():
    from kvlab.show.readings import capacity
    from kvlab.theory import matmul
    from kvlab.theory.agreement import edges

    predicted = matmul.roofline_time(1, 8192, 28672, 4, 6e9, 1e11)
    lo_dis, lo_agree, hi_agree, hi_dis = edges(predicted, 0.05)

    def big(measured):
        return folded(ex.gemv_big_product(8192, 28672, 4, 6e9, 1e11, measured, 0.05), 1)

    for measured in (1.1 * lo_agree, 0.9 * hi_agree):
        near = big(measured)
        assert "157 ms" in near and "time is bytes" in near and "roofline_time" in near
    assert "Slower than its bytes" in big(1.1 * hi_dis)
    assert "more load than this product" in big(0.9 * lo_dis)
    assert "scattered too much" in big((hi_agree * hi_dis) ** 0.5)
    assert "Measure it" in ex.gemv_big_product(8192, 28672, 2, 6e9, 1e11, None)
    t = folded(ex.gemv_h200_batch(116, 0.0293, 3961, 0.0105, 3050), 2)
    assert "**116 sequences**" in t
    t = folded(ex.gemv_attention_ridge(295.4, {2: 295.4, 0.5: 73.9}, 64), 3)
    assert "| 0.5 | 74 |" in t
    real = capacity.largest_batch_reading(2048)
    assert "**258** instead of 238" in real and "79.6 GiB" in real
    margin = capacity.h200_margin_reading(3052)
    assert (
        "**1 GB**" in margin
        and "**9.7 GB**" in margin
        and "140.4 GiB" in margin
        and "70.55e9" in margin
        and "does not fit one device there at all" in margin  # 0.9 x 150.8e9 < 141.1e9
    )
    assert "leaves 10.0e9 bytes" in capacity.engine_fraction_reading(80e9, 100e9, "X")
    assert "1.0e9 fewer than the weights" in capacity.engine_fraction_reading(91e9, 100e9, "X")
    short = capacity.largest_batch_reading(
        1024
    )  # half the context: twice the batch, past the ridge batch
    assert "That reaches the ridge batch of 295" in short


def _layout_reads():
    """Read and append measurements built from real caches' traffic (kvlab.lab.layout_timing), each
    at a time chosen against the bytes model: ``read(batch, factor, block)`` times a read at
    ``factor`` times its ``predicted_s``."""
    from kvlab.cache.layout import new_cache
    from kvlab.lab.layout_timing import (
        AppendMeasurement,
        ReadMeasurement,
        append_traffic,
        read_traffic,
    )
    from kvlab.lab.timing import Timing

    beta = 8e9

    def cache(layout, batch, block):
        return new_cache(layout, batch=batch, length=256, kv_heads=4, head_dim=16, block_size=block)

    def read(batch=2, factor=1.0, layout="BHTD", block=16):
        kv, moved = read_traffic(cache(layout, batch, block))
        t = factor * moved / beta
        return ReadMeasurement(
            layout, batch, 256, 8, 4, 16, "float32", Timing(t, t, t, (t,)), kv, moved, beta, beta
        )

    def append(method, seconds, batch=2):
        new, moved = append_traffic(cache("BHTD", batch, 16), method)
        return AppendMeasurement(
            "BHTD",
            method,
            batch,
            256,
            4,
            16,
            "float32",
            Timing(seconds, seconds, seconds, (seconds,)),
            new,
            moved,
            beta,
        )

    return read, append


def test_kv_layout_solutions():
    from kvlab.theory.agreement import edges

    read, append = _layout_reads()
    low, _, agree_high, high = edges(1.0, 0.0)  # timings without spread: the 10% floor decides
    lo, hi = read(2), read(8)
    a_lo, a_hi = append("index", 5e-6), append("index", 6e-6, batch=8)
    ok = folded(ex.kv_layout_batch(lo, hi, a_lo, a_hi, None), 1)
    assert "**4**" in ok and "as predicted" in ok
    # The batch-2 read faster than its bytes (10% past the band): the ratio grows past the model's.
    fast_lo = read(2, factor=0.9 * low)
    off = folded(ex.kv_layout_batch(fast_lo, hi, a_lo, a_hi, (lo.kv_bytes + hi.kv_bytes) // 2), 1)
    assert "grew more than its bytes" in off
    slow_lo = read(2, factor=1.1 * high)
    resident = folded(
        ex.kv_layout_batch(slow_lo, hi, a_lo, a_hi, (lo.kv_bytes + hi.kv_bytes) // 2), 1
    )
    assert "last-level cache" in resident and "grew less than its bytes" in resident
    assert "same side" in ex.kv_layout_batch(slow_lo, hi, a_lo, a_hi, None)
    runs1, runs16 = {"HND": 256, "NHD": 256}, {"HND": 4096, "NHD": 256}
    g16 = read(2, layout="NHD", block=16)
    g1_model = read(
        2, layout="NHD", block=1
    )  # the bytes model: a longer block table, the same copy
    slower = read(2, factor=1.1 * high, layout="NHD", block=1)
    assert "Slower than its bytes" in folded(
        ex.kv_layout_block1(64, 4, runs1, runs16, 16, slower, g16), 2
    )
    assert "Not slower here" in folded(
        ex.kv_layout_block1(64, 4, runs1, runs16, 16, g1_model, g16), 2
    )
    torn = read(2, factor=(agree_high * high) ** 0.5, layout="NHD", block=1)  # cannot-tell band
    unsure = folded(ex.kv_layout_block1(64, 4, runs1, runs16, 16, torn, g16), 2)
    assert "cannot tell" in unsure and "Not slower here" not in unsure
    r = read(2)
    cat_pred = append("cat", 1.0).predicted_s
    assert "Close to the byte ratio" in folded(ex.kv_layout_cat(r, append("cat", cat_pred)), 3)
    assert "arithmetic" in ex.kv_layout_cat(r, append("cat", 0.9 * low * cat_pred))
    assert "allocates" in ex.kv_layout_cat(r, append("cat", 1.1 * high * cat_pred))
    assert "**2.008**" in ex.kv_layout_cat(r, append("cat", cat_pred))  # 2 (s + 1) / s at s = 256
    unsure = ex.kv_layout_cat(r, append("cat", (agree_high * high) ** 0.5 * cat_pred))
    assert "within the noise band" in unsure and "cannot tell" in unsure


def test_ssm_solutions():
    t = folded(ex.ssm_breakeven("Mamba-1.4B", 4096, 4, 16, 163_840, 2048, 8192, 20.0), 1)
    assert "**20 tokens**" in t
    from kvlab.theory import ssm

    # The cost model fitted at d = 64, with a round cost 10% past its break-even at d = 8, predicts
    # the parallel scan; the measurement then agrees with it or not.
    gamma, n, s = 1e-9, 16, 1024
    tau = 1.1 * ssm.parallel_break_even(s) * gamma * 8 * n
    predicted = ssm.fastest_order(s, tau, gamma, 8 * n, 16)
    assert predicted != "sequential"
    agree = {
        m: ssm.scan_time(s, m, 16 if m == "chunked" else None, tau, gamma, 8 * n)
        for m in ssm.METHODS
    }
    t = folded(ex.ssm_narrow_scan(64, 8, n, s, 16, tau, gamma, "sequential", agree), 2)
    assert f"predicts the **{predicted}** scan" in t and "as the cost model predicted" in t
    disagree = {**agree, "sequential": min(agree.values()) / 2}
    assert "not the" in ex.ssm_narrow_scan(64, 8, n, s, 16, tau, gamma, "sequential", disagree)
    assert "could not tell" in ex.ssm_narrow_scan(64, 8, n, s, 16, -1.0, gamma, "sequential", agree)
    # 68.1 against 68.6 ms is no win: within the band, either way of the spread, the run cannot tell.
    close = {"sequential": 0.2, "parallel": 68.6e-3, "chunked": 68.1e-3}
    for spread in (0.0, 0.3):
        t = ex.ssm_narrow_scan(64, 8, n, s, 16, tau, gamma, "sequential", close, spread)
        assert "cannot tell which order won" in t and "as the cost model predicted" not in t
    # Just past the band (10% floor, spread 5%): a winner.
    apart = {"sequential": 0.2, "parallel": 1.12 * 60e-3, "chunked": 60e-3}
    t = ex.ssm_narrow_scan(64, 8, n, s, 16, tau, gamma, "sequential", apart, 0.05)
    assert "cannot tell" not in t
    t = ex.ssm_narrow_scan(64, 8, n, s, 16, tau, gamma, "sequential", apart, 0.15)
    assert "cannot tell which order won" in t
    t = folded(ex.ssm_hybrid_fraction(8, 1, {256: 0.193, 131_072: 0.125}), 3)
    assert "**19.3%** at 256 tokens" in t
    exact = folded(ex.ssm_full_rank(8, 8, 1e-16, 8, 64, 1, 0.984375), 4)
    assert "as predicted" in exact and "rank **1**" in exact
    assert "not in floating point" in ex.ssm_full_rank(16, 16, 0.25, 12, 64, 1, 0.984375)


def test_long_context_solutions_and_kivi_reading():
    from kvlab.show.readings import capacity
    from kvlab.theory.long_context import first_eviction

    onset = first_eviction(4, 60)
    assert "Both as predicted" in folded(ex.long_context_onset(4, 64, onset, onset, 512), 1)
    assert f"**$t$ = {onset}**" in ex.long_context_onset(4, 64, onset, onset, 512)
    assert "Not where predicted" in ex.long_context_onset(4, 64, onset + 1, onset, 512)
    flat = {"per-channel keys": {"rms": 0.394}, "per-token keys": {"rms": 0.409}}
    t = folded(
        ex.long_context_outliers(flat, {"per-channel keys": 0.82, "per-token keys": 0.66}), 2
    )
    assert "Per-token wins, as predicted" in t
    assert "Per-channel still wins" in ex.long_context_outliers(
        flat, {"per-channel keys": 0.5, "per-token keys": 0.66}
    )
    assert "Exactly the prediction" in folded(
        ex.long_context_kivi_bytes(4, 0, 100_000, 100_000, 260_000), 3
    )
    assert "check the group size" in ex.long_context_kivi_bytes(4, 0, 100_000, 120_000, 260_000)
    from kvlab.theory.long_context import ROUNDING_GAP

    assert "the same outputs" in folded(ex.long_context_conventions(0.9 * ROUNDING_GAP, 0.074), 4)
    assert "more than rounding" not in ex.long_context_conventions(0.9 * ROUNDING_GAP, 0.074)
    assert "more than rounding" in ex.long_context_conventions(1.1 * ROUNDING_GAP, 0.074)
    k = capacity.kivi_residual_reading(127, 32, 32, 2, 1024, 4, 4, held=127 * 1024 * 4 / 1.8)
    assert (
        "Why only 1.8 times?" in k and "**63 stay in full precision**" in k and "31 newer ones" in k
    )


def test_memory_wall_solutions_and_readings():
    import kvlab
    from kvlab import SHAPES
    from kvlab.show.readings import capacity
    from kvlab.theory import roofline as rf

    L70 = SHAPES["llama-3-70b"]
    t = folded(
        ex.wall_fixed_point(4, 4, {1: [1.0, 2.0], 4: [4.0, 4.0], 32: [26.0, 5.6]}, [1000, 64000]), 1
    )
    assert "**4**" in t and "| 32 | 26.00 | 5.60 |" in t
    import dataclasses

    from kvlab.theory import memory_wall as mw

    # The band opens where the device holds twice the weights: devices 10% on each side of that
    # memory.
    edge = 2 * L70.params * 2
    for factor, opens in ((1.1, True), (0.9, False)):
        hw = dataclasses.replace(kvlab.SPECS["b200"], hbm_bytes=factor * edge)
        assert mw.kv_bound_regime_exists(L70, hw) is opens
        text = ex.wall_288(
            mw.kv_bound_band(L70, hw),
            mw.kv_bound_regime_exists(L70, hw),
            53_406,
            320_435,
            56_458,
            451_660,
            4.0,
        )
        assert ("now exists" in text) is opens and ("still no one-device" in text) is not opens
    t = folded(ex.wall_288(1.057, True, 53_406, 320_435, 56_458, 451_660, 4.0), 2)
    assert "now exists" in t and "**320,435 tokens**" in t
    t = folded(ex.wall_joint({"half": 1.13, "joint": 1.21}, {"half": 1.83, "joint": 3.12}), 3)
    assert "**$S(4)$ = 3.12**" in t and "at both batches" in t
    cache = 41_943_040_000
    nv = capacity.nvlink_reading(cache, 4, 25.0)
    assert (
        "**23.3 ms**" in nv
        and "450 and 64 GB/s" in nv
        and "900 GB/s" in nv
        and "128 GB/s" in nv
        and "11.7 ms" in nv
    )
    assert (
        "**38x to 1,073x**" in nv and "2,146x at the top" in nv
    )  # every figure at the one-way rate
    links = capacity.w4_links(cache)
    assert [round(t, 4) for t in links.values()] == [0.6554, 0.1638, 0.0233]
    assert all("one way" in k or "codec" in k for k in links)
    fixes = capacity.seed_corrections_reading(
        {"Llama-3-8B": (4, 4), "Llama-3-70B": (8, 8), "Llama-3.1-405B": (16, 16)},
        2.61,
        8.0,
        11.3,
        8,
        2.909,
        46.5,
        46.56,
        56.9,
        25.0,
        cache,
        39.06,
    )
    assert (
        "**38× to 1,073×**" in fixes
        and "38× to 2,146×" in fixes
        and "$g = 4$, $g = 8$, $g = 16$" in fixes
    )
    assert fixes.count("\n") == 4 and fixes.startswith("1. ") and "5. **39.0 GiB.**" in fixes
    assert "interleave" in capacity.placement_reading(2.0, 8.0)
    r3 = capacity.rule3_reading(
        L70.name,
        "NVIDIA B200",
        128_000,
        1.21,
        rf.admitted_rate(L70, "b200", 128_000),
        rf.admitted_rate(L70, "b200", 128_000, w_kv=0.5),
    )
    assert (
        "**1 sequence in bf16**" in r3
        and "**4 with a 4-bit cache**" in r3
        and "**4.0 times**" in r3
    )
    none = capacity.rule3_reading(
        SHAPES["llama-3.1-405b"].name,
        "NVIDIA B200",
        128_000,
        1.0,
        rf.admitted_rate(SHAPES["llama-3.1-405b"], "b200", 128_000),
        rf.admitted_rate(SHAPES["llama-3.1-405b"], "b200", 128_000, w_kv=0.5),
    )
    assert "**0 sequences in bf16**" in none and "tokens/s rises" not in none


def test_margins_table_seed_against_exposed():
    from kvlab.show.readings import capacity

    t = capacity.margins_table()
    rows = [line for line in t.splitlines() if line.startswith("| Llama-3-70B")]
    assert rows == ["| Llama-3-70B | does not fit | does not fit | 1.0 GB | 9.7 GB |"]
    assert "| Llama-3-8B | 63.9 GB | 69.5 GB |" in t and "79.6 GiB" in t and "140.4 GiB" in t


def test_prefix_caching_and_engine_solutions():
    from kvlab.cache.blocks import reusable_tokens
    from kvlab.theory import prefix as prefix_model
    from kvlab.theory import serving as serving_model
    from kvlab.theory.agreement import edges

    served = reusable_tokens(None, 64, 16)  # the block rule's prediction
    assert "As predicted" in folded(ex.prefix_whole_blocks(64, 16, served), 1)
    assert "not the predicted count" in ex.prefix_whole_blocks(64, 16, served - 16)
    m = prefix_model.POLICY_MARGIN  # which policy kept more, either side of the replay's margin
    hit = {("lru", 1): 0.74, ("lru", 8): 0.39, ("lfu", 1): 0.66, ("lfu", 8): 0.31 - 1.1 * m}
    assert "**LFU** lost more" in folded(ex.prefix_system_prompts(16, 32, hit), 2)
    hit_lru = {("lru", 1): 0.74, ("lru", 8): 0.2, ("lfu", 1): 0.66, ("lfu", 8): 0.12 + 1.1 * m}
    assert "**LRU** lost more" in ex.prefix_system_prompts(16, 32, hit_lru)
    tie = {("lru", 1): 0.74, ("lru", 8): 0.39, ("lfu", 1): 0.66, ("lfu", 8): 0.31 - 0.9 * m}
    assert "about the same" in ex.prefix_system_prompts(16, 32, tie)
    lo_d, lo_a, hi_a, hi_d = edges(0.04, 0.1)
    assert "Close to the line" in folded(
        ex.prefix_ninety(256, 16, 224, 0.04, 0.95 * hi_a, 0.186, 0.1), 3
    )
    assert "fixed cost of a forward pass" in ex.prefix_ninety(
        256, 16, 224, 0.04, 1.1 * hi_d, 0.186, 0.1
    )
    assert "Below the line" in ex.prefix_ninety(256, 16, 224, 0.04, 0.9 * lo_d, 0.186, 0.1)
    for between in ((hi_a * hi_d) ** 0.5, (lo_a * lo_d) ** 0.5):
        assert "scatter too much" in ex.prefix_ninety(256, 16, 224, 0.04, between, 0.186, 0.1)
    capacity, tol = 1.7, serving_model.CAPACITY_TOLERANCE  # the pool binds (capacity < max_batch)
    assert serving_model.batch_bound(capacity, 8)[0] == "pool"
    assert "as predicted" in folded(ex.engine_half_pool(capacity, 8, 0.9 * tol * capacity, 1), 1)
    assert "short requests take less" in ex.engine_half_pool(capacity, 8, 1.1 * tol * capacity, 0)
    assert "still more than `max_batch` 1" in ex.engine_half_pool(capacity, 1, 1.0, 0)
    recompute = dict(
        preempted=[(9, 2, "recompute")], steps=20, readmitted_tokens=17, readmitted_cached=16
    )
    swap = dict(preempted=[(9, 2, "swap")], steps=19, swapped_blocks=4, same_tokens=True)
    t = folded(ex.engine_swap(recompute, swap), 3)
    assert (
        "16 of the 17 tokens" in t
        and "computed 1 again" in t
        and "preempted once" in t
        and "four blocks" in t
    )
    assert "the same either way" in t
    assert "happened not to preempt" in ex.engine_swap(recompute, dict(swap, preempted=[]))


def test_long_context_sinks_solution():
    import statistics

    from kvlab.theory import long_context as lc

    noise = [0.3, -0.1, 0.2, -0.4, 0.0, 0.1]
    centred = [d - statistics.fmean(noise) for d in noise]
    half = lc.paired_spread([0.0] * 6, centred).half_width

    def spread(scale):  # mean = scale x the half width: resolved beyond +-1
        return lc.paired_spread([0.0] * 6, [d + scale * half for d in centred])

    t = folded(ex.long_context_sinks(40, 270, spread(0.9), 0, spread(0.9), 64), 5)
    assert (
        "40 sink heads of 270" in t
        and "within the noise, as predicted" in t
        and "no gain beyond the noise, as predicted" in t
    )
    t = ex.long_context_sinks(40, 270, spread(-1.1), 0, spread(1.1), 64)
    assert "four are better" in t and "a real gain, although no head meets" in t
    t = ex.long_context_sinks(0, 270, spread(1.1), 2, spread(0.9), 64)
    assert (
        "no sink head of its 270" in t
        and "four are worse" in t
        and "although it has sink heads" in t
    )


def test_diagnosis_solutions():
    from kvlab.theory import verdict
    from kvlab.theory.agreement import edges
    from kvlab.theory.shapes import SHAPES
    from kvlab.theory.work import step_work

    shape, context, beta, step_1 = SHAPES["llama-3.2-1b"], 72, 1e10, 4e-3
    one = step_work(shape, 1, context, "cached", 4, 4)
    weights, seq = one.weights_read, one.kv_read + one.kv_written
    b_pred = verdict.bandwidth_batch(shape, context, step_1, beta, 4, 4)
    flat_16 = verdict.flat_step_fraction(16, step_1, weights, seq, beta)
    lo_d, lo_a, hi_a, hi_d = edges(flat_16, 0.1)
    args = (weights, seq, context, beta, step_1, one.total_bytes / step_1 / beta, b_pred, 16)
    flat = folded(ex.diagnosis_batch(*args, step_1, flat_16, "weights", "weights", 0.1), 1)
    assert f"**{b_pred:,.1f}**" in flat and "batch 16" in flat and "nearly flat" in flat
    assert "not at $1/\\text{fraction}$" in flat and "bandwidth_batch" in flat
    grew = ex.diagnosis_batch(*args, 4.5 * step_1, 0.9 * lo_d, "weights", "compute", 0.1)
    assert "did not stay flat" in grew and "4.50 times" in grew
    odd = ex.diagnosis_batch(*args, step_1, 1.1 * hi_d, "weights", "weights", 0.1)
    assert "beat the flat-step prediction" in odd
    for inside in ((lo_a * lo_d) ** 0.5, (hi_a * hi_d) ** 0.5):
        unsure = ex.diagnosis_batch(*args, step_1, inside, "weights", "weights", 0.1)
        assert "The run cannot tell" in unsure and "flat" in unsure
    small = folded(
        ex.diagnosis_batch(
            weights,
            seq,
            context,
            beta,
            step_1,
            0.9,
            1.0,
            1,
            step_1,
            verdict.flat_step_fraction(1, step_1, weights, seq, beta),
            "weights",
            "weights",
            0.1,
        ),
        1,
    )
    assert "as far as this page's time allows" not in small
    t = folded(ex.diagnosis_gqa(16, 2, 520, 0.83, 0.39, 0.40, "kv", "overhead"), 2)
    assert "**39.0%**" in t and "lever worked" in t
    assert "verdict stays" in ex.diagnosis_gqa(16, 2, 520, 0.83, 0.55, 0.56, "kv", "kv")
    assert "did not rest on the cache" in ex.diagnosis_gqa(
        16, 2, 520, 0.83, 0.39, 0.4, "overhead", "overhead"
    )
    # A run that cannot tell names both verdicts; the cache's part is still read from them.
    torn = ex.diagnosis_gqa(16, 2, 520, 0.83, 0.39, 0.4, "overhead or kv", "overhead or weights")
    assert "lever worked" in torn and "**overhead or weights** after" in torn
    ridge = 20.0  # intensities 10% past the ridge on each side, through verdict.past_ridge
    agree = folded(ex.diagnosis_naive_ridge(ridge, 4, 40, 39, 72, 1.1 * ridge, "compute"), 3)
    assert "**39**" in agree and "past the ridge point" in agree and "agrees" in agree
    assert "agrees" in ex.diagnosis_naive_ridge(ridge, 4, 40, 39, 20, 0.9 * ridge, "weights")
    assert "not compute" in ex.diagnosis_naive_ridge(ridge, 4, 40, 39, 72, 1.1 * ridge, "overhead")
    assert "tip either way" in ex.diagnosis_naive_ridge(
        ridge, 4, 40, 39, 20, 0.9 * ridge, "compute"
    )


def test_speculative_solutions():
    times = {1: 1.0, 2: 1.2, 3: 1.5, 4: 2.5, 5: 4.0}
    t = folded(ex.speculative_best_k_here(0.9, 0.0, times, "quote"), 1)
    assert "$k = 2$" in t  # 2.71 / 1.5 beats 1.9 / 1.2 and 3.44 / 2.5
    t = folded(ex.speculative_best_k_gpu(0.8, 295, "H100"), 2)
    assert "295" in t and "k = 8" in t and "5.00" in t
