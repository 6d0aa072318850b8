"""Notebook 01, the decode loop (section 9.1): worked solutions of the exercises that have
numbers."""

from __future__ import annotations

from kvlab._checks import integer, unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.exercises.folded import count, solution


def decode_loop_gqa(
    kv_heads_now: int, kv_heads_new: int, slope_now: float, slope_new: float, slope_measured: float
) -> str:
    """Exercise 1 of 9.1: the slope k / read + 2 k / copy with fewer KV heads."""
    if missing := unmeasured(slope_measured=slope_measured):
        return solution(1, missing)
    factor = slope_now / slope_new
    return solution(
        1,
        "The slope is $k/\\beta_\\text{read} + 2k/\\beta_\\text{copy}$ and $k = 2 L\\,n_{kv} d_h w$"
        " is proportional to the KV heads,"
        f" so going from {kv_heads_now} to {kv_heads_new} KV heads divides it by **{factor:g}**:"
        f" from {si(slope_now, 's')} to **{si(slope_new, 's')}** per token of history. The query"
        " heads, and with them the attention FLOPs, do not change. This run measured"
        f" {si(slope_measured, 's')} per token with {kv_heads_now} KV heads. Expect the measured"
        f" fall to be somewhat less than {factor:g}x: a smaller cache fits the CPU's caches for"
        " longer, and the fixed per-step costs that a line fit absorbs do not shrink with it.",
    )


def decode_loop_window(
    P: int, G: int, W: int, naive_pairs: int, cached_pairs: int, dense_naive: int, dense_cached: int
) -> str:
    """Exercise 2 of 9.1: work with a sliding window of W tokens."""
    P = integer("P", P, 0)
    G = integer("G", G, 0)
    W = integer("W", W, 0)
    naive_pairs = integer("naive_pairs", naive_pairs, 0)
    cached_pairs = integer("cached_pairs", cached_pairs, 0)
    dense_naive = integer("dense_naive", dense_naive, 0)
    dense_cached = integer("dense_cached", dense_cached, 0)
    return solution(
        2,
        "A window changes what each query attends to, not which positions are processed: the"
        " positions formulas stay as they are. Under the page's dense convention a query scores"
        " every key it may see, at most $W$ of them, so a pass over $n$ tokens scores $n\\min(n,"
        " W)$ pairs and a decode step with $n$ tokens of history $\\min(n,"
        " W)$:\n\n$$\\text{naive: } \\sum_{j=0}^{G-1}(P+j)\\min(P+j,\\,W), \\qquad"
        " \\text{cached: } P\\min(P, W) + \\sum_{j=1}^{G-1}\\min(P+j,\\,W).$$\n\nWhen $P"
        " \\ge W$ both collapse: the naive loop does $W\\,(GP + G(G-1)/2)$ pairs, $W$ times its"
        f" positions, and the cached loop $W(P + G - 1)$, constant per step. At $P = {P}$, $G ="
        f" {G}$ and $W = {W}$, counting gives **{count(naive_pairs)}** pairs naive and"
        f" **{count(cached_pairs)}** cached (against {count(dense_naive)} and {count(dense_cached)}"
        " without a window); the cell checks the closed form against a brute-force count. To check"
        " it yourself, replace `n` by `min(n, W)` where `counted` adds pairs.",
    )


def decode_loop_static(
    P: int,
    G: int,
    static_first: float,
    static_last: float,
    cached_first: float,
    cached_last: float,
    cached_growth: float,
    spread: float,
) -> str:
    """Exercise 3 of 9.1: the static cache's steps are flat; the cached loop's grow by
    ``cached_growth`` (``kvlab.theory.decode_step.predicted_step_growth``), visible only above the
    run's ``spread``.
    """
    if missing := unmeasured(
        static_first=static_first,
        static_last=static_last,
        cached_first=cached_first,
        cached_last=cached_last,
        cached_growth=cached_growth,
    ):
        return solution(3, missing)
    from kvlab.theory.decode_step import stands_out

    text = (
        "The static cache is allocated for $P + G$ tokens and every step attends over all of those"
        " slots, masked, so every step reads the same bytes: its per-step time should not change"
        " within a request. Flat does not mean cheaper: from the first step the static loop pays"
        " for the longest history, and its mask on top. The cached loop's steps should grow: by"
        " this page's model, by $(k/\\beta_\\text{read} + 2k/\\beta_\\text{copy})(G-1)$ ="
        f" **{si(cached_growth, 's')}** over this request. In a run with $P = {P}$ and $G = {G}$"
        f" the static loop's first and last steps took {si(static_first, 's')} and"
        f" {si(static_last, 's')}, the cached loop's {si(cached_first, 's')} and"
        f" {si(cached_last, 's')}; single steps of the cached run moved by {spread:.0%} of a step"
        " (interquartile range over median)."
    )
    if stands_out(cached_growth, cached_first, spread):
        text += (
            " The predicted growth is larger than that spread, so this run can show it: the cached"
            f" steps changed by {si(cached_last - cached_first, 's')} against"
            f" {si(cached_growth, 's')} predicted."
        )
    else:
        text += (
            f" The predicted growth is {cached_growth / cached_first:.1%} of a step, within that"
            " spread, so a request this short cannot show it: the change measured between the"
            " first and last cached steps is the noise of a shared machine (and of the first steps"
            " warming the CPU's caches), not the history. A longer request or a larger cache per"
            " token would show the growth; the figure above does, across contexts."
        )
    if stands_out(static_last - static_first, static_first, spread):
        text += (
            f" The static steps changed by {ratio_text(static_last, static_first)}, more than the "
            "spread of single steps: expect that from a step or two caught by another process; "
            "compare medians of several runs."
        )
    else:
        text += " The static steps changed by less than that spread: flat, as predicted."
    return solution(3, text)
