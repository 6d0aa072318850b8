"""Notebook 02, recompute, cache reuse, optimized decode (section 9.2): worked solutions of the
exercises that have numbers."""

from __future__ import annotations

import math

from kvlab._checks import unmeasured
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory.agreement import BELOW, CANNOT_TELL, DISAGREES, compare
from kvlab.theory.work import positions_processed, request_time


def cache_reuse_doubling(
    P: int, G: int, a: float, b: float, measured_g: float, measured_2g: float, spread: float
) -> str:
    """Exercise 1 of chapter 2: the naive loop's total time when G doubles (from G to 2G),
    predicted by the two-pass model (``kvlab.theory.work.request_time``), judged by
    ``agreement.compare`` with ``spread``, the run-to-run scatter of the passes and requests.
    """
    if missing := unmeasured(measured_g=measured_g, measured_2g=measured_2g):
        return solution(1, missing)
    pos_g, pos_2g = positions_processed(P, G), positions_processed(P, 2 * G)
    t_g, t_2g = request_time(P, G, a, b), request_time(P, 2 * G, a, b)
    c = compare(measured_2g / measured_g, t_2g / t_g, spread)
    text = (
        "The naive loop makes $G$ passes: $T(G) \\approx G\\,a +"
        f" b\\cdot\\mathrm{{positions\\_processed}}(P, G)$ (`work.request_time`). At $P = {P}$ the"
        f" positions are {pos_g:,} for $G = {G}$ and {pos_2g:,} for $G = {2 * G}$, and the fitted"
        f" $a$ = {si(a, 's')} and $b$ = {si(b, 's')} per position give {si(t_g, 's')} and"
        f" {si(t_2g, 's')}: a factor of **{c.predicted:.2f}**. It lies between 2 (the fixed cost"
        f" $a$ alone doubles) and {pos_2g / pos_g:.2f} (the positions alone). Measured:"
        f" {si(measured_g, 's')} and {si(measured_2g, 's')}, a factor of **{c.measured:.2f}**:"
        f" {c.ratio:.2f} times the prediction, which {verdict_words(c)}."
    )
    if c.agrees:
        text += " The prediction holds."
    elif c.outcome == CANNOT_TELL:
        text += " The run's spread is too wide to call the gap; rerun both, interleaved."
    else:
        text += (
            " The prediction does not hold in this run: the two-pass line is fitted on one model"
            " and length range, and on a shared CPU a single run of each can move by this much;"
            " rerun both, interleaved."
        )
    return solution(1, text)


def cache_reuse_warm(costs: dict, step_times, steady: float) -> str:
    """Exercise 2 of 9.2: the compile-cost estimate against ``warm``, and the first compiled steps.

    ``step_times``: every step of the compiled run. The recompilation model predicts the second
    step's excess over ``steady`` equal to the first call's; ``agreement.compare`` with the later
    steps' spread judges it. Clearly below that, the second step is one-time work when it stands out
    of the later steps' spread (``kvlab.theory.decode_step.stands_out``), and steady otherwise."""
    if missing := unmeasured(steady=steady):
        return solution(2, missing)
    from kvlab.theory.decode_step import stands_out, step_spread

    rows = "\n".join(f"| {w} | {si(c, 's')} |" for w, c in costs.items())
    spread = max(costs.values()) / min(costs.values()) if min(costs.values()) > 0 else math.inf
    first, second = step_times[0], step_times[1]
    later = list(step_times[2:])
    noise = step_spread(later) if len(later) >= 2 else 0.0
    text = (
        "The estimate the page uses is the first `warm` compiled steps' time beyond as many"
        " steady steps, less the same for the eager loop; against `warm`:\n\n| `warm` | compile"
        f" cost |\n|---:|---:|\n{rows}\n\n(a spread of {spread:.2f}x). Once `warm` covers the"
        " steps that compile, a larger one adds only steady steps, whose excess is noise; too"
        " small a `warm` misses compilation work that happens later. The first compiled step"
        f" took {si(first, 's')}: the call that traces the model and generates its kernels. The"
        f" second took {si(second, 's')}, {second / steady:,.0f} times a steady step"
        f" ({si(steady, 's')}); the later steps moved by {noise:.0%} of a step."
    )
    recompile = compare(max(second - steady, 0.0), max(first - steady, steady), noise)
    if recompile.outcome != DISAGREES or recompile.side != BELOW:
        text += (
            f" Its excess is {recompile.ratio:.2g} times the first call's, which"
            f" {verdict_words(recompile).replace('the prediction', 'a recompilation')}: a second"
            " compilation redoes the first call's work. `torch.compile` specialises on values it"
            " first sees and recompiles once when one of them changes; on a GPU,"
            " `reduce-overhead` also records the CUDA graph on an early call."
        )
    elif stands_out(second - steady, steady, noise):
        text += (
            " That is no second compilation (far less than the first call's work) but more than the"
            " later steps' spread: one-time work remains, buffers allocated and caches warmed on"
            " first use. On a GPU, `reduce-overhead` records the CUDA graph on an early call, which"
            " shows here as a slow second or third step."
        )
    else:
        text += (
            " Within the later steps' spread, the second step is already steady: all the one-time"
            " work happened in the first call."
        )
    return solution(2, text)
