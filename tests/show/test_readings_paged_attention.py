"""The readings and worked solutions of section 9.5, PagedAttention (notebook 05): each
outcome-dependent sentence in each of its branches, with the inputs on either side of a branch
computed by the model that decides it (kvlab.theory.paging, kvlab.lab.timing.compare_timings, the
fixed-cost model of a copy, kvlab.theory.preemption.preemption_per_token), never picked by hand."""

import re
from types import SimpleNamespace

import pytest

from kvlab.lab.paged_attention import AttentionTiming
from kvlab.lab.paging import make_trace
from kvlab.lab.preemption import CachedRecompute, HostCopy, PreemptionCost
from kvlab.lab.timing import Timing, compare_timings
from kvlab.show.readings import exercises as ex
from kvlab.show.readings import paged_attention, preemption
from kvlab.theory.agreement import edges
from kvlab.theory.paging import gather_overhead_s, paging_saves, waste_bound
from kvlab.theory.preemption import preemption_per_token, recompute_or_swap
from kvlab.theory.shapes import SHAPES
from kvlab.theory.specs import SPECS


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def folded(text, number):
    assert text.startswith(f"<details>\n<summary>Solution to exercise {number}</summary>\n\n"), text
    return no_roles(text)


def timing(median, spread=0.05):
    return Timing(median, median * (1 - spread), median * (1 + spread), (median,))


def pair(outcome, base=1e-3):
    """Two timings (a, b) for which compare_timings gives ``outcome``: a's range 10% clear of b's,
    or overlapping."""
    b = timing(base)
    a = {
        "faster": timing(0.9 * b.min / 1.05),
        "slower": timing(1.1 * b.max / 0.95),
        "even": timing(1.02 * base),
    }[outcome]
    assert compare_timings(a, b).outcome == outcome
    return a, b


def test_compare_timings_flips_where_the_repeats_stop_overlapping():
    b = timing(1.0)
    for factor, outcome in (
        (0.9, "faster"),
        (1.1, "even"),
    ):  # a's slowest repeat against b's fastest
        a = Timing(0.5, 0.4, factor * b.min, (0.5,))
        assert compare_timings(a, b).outcome == outcome
    for factor, outcome in ((1.1, "slower"), (0.9, "even")):
        a = Timing(3.0, factor * b.max, 4.0, (3.0,))
        assert compare_timings(a, b).outcome == outcome
    assert compare_timings(timing(1.0), timing(2.0)).ratio == pytest.approx(2.0)
    with pytest.raises(TypeError, match="a must be a kvlab.lab.timing.Timing"):
        compare_timings(1.0, b)
    with pytest.raises(ValueError, match="b.median must be > 0"):
        compare_timings(b, Timing(0.0, 0.0, 0.0, (0.0,)))


def test_event_reading_names_shared_blocks():
    snap = {
        "event": "B forks",
        "tables": {"B": ([3, 4], 11), "B'": ([3, 4], 11)},
        "refs": [0, 0, 0, 2, 2] + [0] * 11,
    }
    text = no_roles(paged_attention.event_reading(snap, 4, 16))
    assert "blocks 3, 4 are shared" in text and "2 of 16" in text
    alone = {"event": "A arrives", "tables": {"A": ([0], 5)}, "refs": [1] + [0] * 15}
    assert "no block is shared" in paged_attention.event_reading(alone, 0, 16)


def _sim(waste, batch, steps, preemptions=0, meta=120, recomputed=0):
    return SimpleNamespace(
        waste_fraction=waste,
        mean_batch=batch,
        steps=steps,
        preemptions=preemptions,
        recomputed_tokens=recomputed,
        peak_metadata_bytes=meta,
    )


def test_waste_reading_branches_where_the_formula_stops_predicting_a_saving():
    trace, max_len = (
        make_trace(30, "uniform", mean_prompt=16, mean_output=24, max_len=64, seed=1),
        64,
    )
    # the formula's boundary: blocks as large as max_len hold what a maximal reservation holds
    assert not paging_saves(trace, max_len, max_len)
    saving, none = int(0.9 * max_len), int(1.1 * max_len)
    assert paging_saves(trace, saving, max_len) and not paging_saves(trace, none, max_len)
    pred = {"reserve-max": 0.6, "paged": 0.04}
    runs = {
        "reserve-max": _sim(0.6, 7.1, 300),
        "reserve-estimate": _sim(0.43, 9, 250),
        "paged": _sim(0.043, 20.5, 100, preemptions=12, recomputed=6785),
    }
    wins = no_roles(
        paged_attention.waste_reading(runs, pred, trace, "uniform", saving, 4096, max_len)
    )
    assert (
        "**4.3%**" in wins
        and "3.0 times fewer decode steps" in wins
        and "12 preemptions" in wins
        and "6,785 tokens prefilled again" in wins
        and "charges nothing" in wins
        and "contradicts" not in wins
    )
    assert "predicts 60% and 4.0%" in wins
    odd = no_roles(
        paged_attention.waste_reading(
            {**runs, "paged": _sim(0.7, 6.0, 320)}, pred, trace, "uniform", saving, 4096, max_len
        )
    )
    assert "contradicts the formula" in odd and "no preemption" in odd
    # The saving's boundary from the comparison itself (no spread: a deterministic simulation),
    # 10% past the lower disagreement edge on each side, and inside the cannot-tell band.

    low, low_agree, _, _ = edges(pred["reserve-max"] - pred["paged"], 0.0)
    for factor, contradicted in ((0.9, True), (1.1, False), ((low_agree / low) ** 0.5, False)):
        sim = {**runs, "paged": _sim(0.6 - factor * low, 20.5, 100)}
        text = no_roles(
            paged_attention.waste_reading(sim, pred, trace, "uniform", saving, 4096, max_len)
        )
        assert ("contradicts the formula" in text) is contradicted
    loses = no_roles(
        paged_attention.waste_reading(
            {**runs, "paged": _sim(0.7, 6.0, 320)}, pred, trace, "uniform", none, 4096, max_len
        )
    )
    assert "predicts no saving" in loses and "sooner" not in loses


def _attention(outcome, path="gather"):
    contiguous, paged = pair(
        outcome
    )  # compare_timings(contiguous, paged): "faster" = the paged path was slower
    return AttentionTiming(paged, contiguous, 16_000_000, path)


def _gather_timing(gap, gather, copy=2e-3):
    """An AttentionTiming on the gather path whose fastest repeats sit ``gap`` apart, with the
    gather alone at ``gather`` seconds and the copy beside at ``copy`` (scatter 5% each)."""
    contiguous = Timing(1.05e-3, 1e-3, 1.2e-3, (1e-3, 1.05e-3, 1.2e-3))
    low = 1e-3 + gap
    paged = Timing(low * 1.05, low, low * 1.2, (low, low * 1.05, low * 1.2))
    alone = Timing(gather * 1.05, gather, gather * 1.2, (gather, gather * 1.05, gather * 1.2))
    beside = Timing(copy * 1.05, copy, copy * 1.2, (copy, copy * 1.05, copy * 1.2))
    return AttentionTiming(paged, contiguous, 16_000_000, "gather", alone, beside)


def test_attention_reading_in_each_outcome():
    predicted = gather_overhead_s(16_000_000, 2 * 16_000_000 / 2e-3)  # one copy, as timed: 2 ms
    assert abs(predicted - 2e-3) < 1e-12
    for gap, words in (
        (predicted, "The gather's copy is the gap"),
        (0.95 * predicted, "The gather's copy is the gap"),
        (3 * predicted, "The model misses the other"),
        (0.3 * predicted, "smaller than the copy predicts"),
        (1.25 * predicted, "This run cannot tell"),
        (0.8 * predicted, "This run cannot tell"),
    ):
        text = no_roles(
            paged_attention.attention_reading(4096, _gather_timing(gap, 0.5 * gap), 5e9)
        )
        assert words in text and "should add 2 ms" in text, (gap, text)
    slow_gather = no_roles(paged_attention.attention_reading(4096, _gather_timing(6e-3, 5e-3), 5e9))
    assert "The gather itself is slower" in slow_gather
    fair_gather = no_roles(paged_attention.attention_reading(4096, _gather_timing(6e-3, 2e-3), 5e9))
    assert "The model misses the other 4 ms" in fair_gather
    assert "gather itself" not in fair_gather
    assert "kernel's own efficiency" in paged_attention.attention_reading(
        4096, _attention("faster", "kernel"), 5e9
    )
    even = paged_attention.attention_reading(4096, _attention("even", "kernel"), 5e9)
    assert "cannot tell them apart" in even
    assert "beat SDPA" in paged_attention.attention_reading(
        4096, _attention("slower", "kernel"), 5e9
    )


def _cost(outcome, tokens=384):
    swap_in, recompute = pair(outcome)
    return PreemptionCost(tokens, 24, 2_000_000, recompute, timing(2 * swap_in.median), swap_in)


def test_preemption_reading_in_each_outcome():
    cost = _cost("faster")
    swap = no_roles(paged_attention.preemption_reading(cost, 2))
    ratio = compare_timings(cost.swap_in, cost.recompute).ratio
    assert f"swap-in was {ratio:.2g} times cheaper" in swap and "1 MB each way" in swap
    cost = _cost("slower")
    ratio = compare_timings(cost.recompute, cost.swap_in).ratio
    assert f"Recompute was {ratio:.2g} times cheaper" in paged_attention.preemption_reading(cost, 2)
    assert "neither is clearly cheaper" in paged_attention.preemption_reading(_cost("even"), 2)


def test_crossover_table_and_reading_follow_the_model():
    table = preemption.crossover_table()
    r13 = recompute_or_swap(SHAPES["llama-2-13b"], "b200")
    assert (
        table.count("\n") == 2 + len(SHAPES)
        and f"**{r13.ratio:.2f}**" in table
        and r13.cheaper == "recompute"
    )
    pairs = [(k, d) for k in SHAPES for d in SPECS]
    wins = sum(recompute_or_swap(SHAPES[k], d).cheaper == "recompute" for k, d in pairs)
    serial = sum(
        recompute_or_swap(SHAPES[k], d, overlap_swap_out=False).cheaper == "recompute"
        for k, d in pairs
    )
    text = no_roles(preemption.crossover_reading())
    assert f"**{wins}**" in text and f"cheaper in {serial} pairs" in text and serial > wins


def _copy(fixed_over_transfer, block=8192, blocks=1024):
    """A HostCopy whose fixed cost per copy is ``fixed_over_transfer`` times its transfer time."""
    one = Timing(0.01, 0.01, 0.01, (0.01,))
    transfer = block / (block * blocks / one.median)
    per_block = blocks * transfer * (1 + fixed_over_transfer)
    return HostCopy(block, blocks, Timing(per_block, per_block, per_block, (per_block,)), one)


def test_host_copy_reading_flips_where_the_fixed_cost_equals_the_transfer():
    big = _copy(0.0, 1 << 20, 8)
    for factor, dominates in ((1.1, True), (0.9, False)):
        small = _copy(factor)
        assert small.fixed_cost_s == pytest.approx(factor * small.transfer_s)
        assert small.fixed_cost_dominates is dominates
        text = no_roles(preemption.host_copy_reading([small, big], 8192, 16))
        assert ("waste most of the link" in text) is dominates and (
            "keep most of the rate" in text
        ) is not dominates


def test_decides_reading_flips_at_the_models_break_even():
    params, kv, beta = 1e6, 1e3, 5e9
    even = (
        preemption_per_token(params, kv, 1.0, beta).break_even_flops_per_link_byte * beta
    )  # F at break-even
    below = 0.9 * even  # swap cheaper by the model
    assert preemption_per_token(params, kv, below, beta).cheaper == "swap"
    assert preemption_per_token(params, kv, 1.1 * even, beta).cheaper == "recompute"
    agree = no_roles(preemption.decides_reading(params, kv, below, beta, 0.95, _cost("faster")))
    assert "the arithmetic decides here: swap" in agree and "measurement agrees: swap" in agree
    # small copies at half the rate double F / beta: past the break-even, the blocked verdict flips
    flip = preemption.decides_reading(params, kv, below, beta, 0.5, _cost("faster"))
    assert "transfer efficiency decides" in flip
    odd = preemption.decides_reading(params, kv, below, beta, 0.95, _cost("slower"))
    assert "measurement disagrees" in odd and "recompute was cheaper" in odd
    assert "cannot tell them apart" in preemption.decides_reading(
        params, kv, below, beta, 0.95, _cost("even")
    )


def test_cached_recompute_reading_both_ways():
    # 40 and 33 held tokens in 16-token blocks: 32 + 32 in full blocks, 9 in partial ones
    kept = CachedRecompute(16, 500, (40, 33), (32, 32), {False: 700, True: 636}, True)
    assert (kept.full_block_tokens, kept.partial_block_tokens, kept.evicted_tokens) == (64, 9, 0)
    text = no_roles(preemption.cached_recompute_reading(kept, 10, 19))
    assert "**73 tokens**" in text and "**64**" in text and "costs almost nothing" in text
    reused = CachedRecompute(16, 500, (40, 33), (32, 16), {False: 700, True: 652}, False)
    assert reused.evicted_tokens == 16
    text = preemption.cached_recompute_reading(reused, 10, 19)
    assert "16 in full blocks" in text and "oldest entry first" in text and "is a bug" in text


def test_paged_attention_solutions():
    mean, block = 168.0, 128
    bound = waste_bound(block, mean)
    assert bound == pytest.approx(127 / (168 + 127))
    under = folded(
        ex.paged_block_size(
            block,
            mean,
            0.27,
            SimpleNamespace(waste_fraction=0.9 * bound, mean_tokens_held=mean),
            0.04,
        ),
        1,
    )
    assert f"**{bound:.0%}**" in under and "stays under the bound" in under
    over = ex.paged_block_size(
        block, mean, 0.27, SimpleNamespace(waste_fraction=1.1 * bound, mean_tokens_held=mean), 0.04
    )
    assert "a bug" in over
    t = folded(
        ex.paged_fork_append({"B": [3, 4], "B'": [3, 4]}, {"B": [3, 9], "B'": [3, 4]}, 4, 9), 2
    )
    assert "[3, 9]" in t and "B' stays [3, 4]" in t
    assert "The same, as predicted" in folded(
        ex.paged_swap_steps({"recompute": 789, "swap": 789}, {"recompute": 131, "swap": 131}, 9234),
        3,
    )
    assert "They differ by 11" in ex.paged_swap_steps(
        {"recompute": 789, "swap": 800}, {"recompute": 1, "swap": 1}, 9
    )
