"""Notebook 02, recompute, cache reuse, optimized decode (section 9.2): worked solutions of the exercises that have numbers."""

from __future__ import annotations

import math

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within
from kvlab.show.readings.exercises.folded import solution


def cache_reuse_doubling(P: int, G: int, a: float, b: float, pos32: int, pos64: int, measured32: float,
                         measured64: float) -> str:
    """Exercise 1 of 9.2: the naive loop's total time when G doubles (from G to 2G)."""
    t32, t64 = G * a + b * pos32, 2 * G * a + b * pos64
    predicted, measured = t64 / t32, measured64 / measured32
    text = (f"The naive loop makes $G$ passes: $T(G) \\approx G\\,a + b\\cdot\\mathrm{{positions\\_processed}}(P, G)$. "
            f"At $P = {P}$ the positions are {pos32:,} for $G = {G}$ and {pos64:,} for $G = {2 * G}$, and the fitted "
            f"$a$ = {si(a, 's')} and $b$ = {si(b, 's')} per position give {si(t32, 's')} and {si(t64, 's')}: a "
            f"factor of **{predicted:.2f}**. It lies between 2 (the fixed cost $a$ alone doubles) and "
            f"{pos64 / pos32:.2f} (the positions alone). Measured: {si(measured32, 's')} and "
            f"{si(measured64, 's')}, a factor of **{measured:.2f}**.")
    if within(measured, predicted, 1.15):
        text += " The prediction holds."
    else:
        text += (f" That is {ratio_text(measured, predicted)} the predicted factor: the two-pass line is "
                 "fitted on one model and length range, and on a shared CPU a single run of each can move "
                 "by this much; rerun both, interleaved.")
    return solution(1, text)


def cache_reuse_warm(costs: dict, first_steps, steady: float) -> str:
    """Exercise 2 of 9.2: the compile-cost estimate against ``warm``, and the first compiled steps."""
    rows = "\n".join(f"| {w} | {si(c, 's')} |" for w, c in costs.items())
    spread = max(costs.values()) / min(costs.values()) if min(costs.values()) > 0 else math.inf
    first, second = first_steps[0], first_steps[1]
    text = ("The estimate the page uses, the compiled run's extra time net of its steady gain, depends on "
            "`warm` only through the two steady medians, so it barely moves:\n\n"
            f"| `warm` | compile cost |\n|---:|---:|\n{rows}\n\n"
            f"(a spread of {spread:.2f}x). Summing only the first `warm` compiled steps would not be stable: "
            "too small a `warm` misses compilation work that happens later, too large a one counts steady steps "
            f"as cost. The first compiled step took {si(first, 's')}: the call that traces the model and "
            f"generates its kernels. The second took {si(second, 's')}, {second / steady:,.0f} times a steady "
            f"step ({si(steady, 's')}).")
    if second > 100 * steady:
        text += (" That is a second compilation: `torch.compile` specialises on values it first sees and "
                 "recompiles once when one of them changes; on a GPU, `reduce-overhead` also records the CUDA "
                 "graph on an early call.")
    elif second > 2 * steady:
        text += (" No second compilation, but one-time work remains: buffers allocated and caches warmed on "
                 "first use. On a GPU, `reduce-overhead` records the CUDA graph on an early call, which shows "
                 "here as a slow second or third step.")
    else:
        text += " The second step is already steady: all the one-time work happened in the first call."
    return solution(2, text)
