"""Notebook 01, the decode loop (section 9.1): its readings.

Each decision calls the model in ``kvlab.theory.decode_step``: a cached step grows by one read of
its cache at the read bandwidth and one copy at the copy rate (``history_slope``), judged by
``kvlab.theory.agreement.compare`` with the spread measured beside it, and a short-context step is
bounded by reading its weights once (``weight_read_floor``), judged the same way.
"""

from __future__ import annotations

from kvlab._checks import unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.verdicts import sweep_summary, verdict_words
from kvlab.theory.agreement import ABOVE, DISAGREES, Comparison, compare

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"


def history_reading(
    kv_bytes_per_token: int,
    read_bytes_per_s: float,
    copy_bytes_per_s: float,
    slope: Comparison,
    contexts,
    steps,
    points,
    weight_bytes: float,
) -> str:
    """ "Reading the result" of 9.1: the slope of the fastest step against the history, against
    ``decode_step.history_slope`` (k / read + 2 k / copy), judged by ``agreement.compare``; then
    the shortest and longest contexts, and the verdict at every context (``points``)."""
    if missing := unmeasured(read_bytes_per_s=read_bytes_per_s, copy_bytes_per_s=copy_bytes_per_s):
        return missing
    contexts, steps = list(contexts), list(steps)
    text = [
        "In the model each token of history adds $k/\\beta_\\text{read} + 2k/\\beta_\\text{copy}$"
        f" = **{si(slope.predicted, 's')}** to a step: attention reads its"
        f" {si(kv_bytes_per_token, 'B')} once at the read bandwidth"
        f" ({si(read_bytes_per_s, 'B/s')}), and `torch.cat` copies them at the copy rate"
        f" ({si(copy_bytes_per_s, 'B/s')}, bytes read plus written), both measured in the same"
        " rounds as the steps. A straight line through the fastest step at each context rises by"
        f" **{si(slope.measured, 's')}** per token, {slope.ratio:.2g} times the prediction, which"
        f" {verdict_words(slope)}."
    ]
    if slope.agrees:
        text.append(
            "One read and one copy of the cache, each at its own ceiling, explain how the step"
            " grows."
        )
    elif slope.outcome == DISAGREES and slope.side == ABOVE:
        text.append(
            "The step grows faster than one read and one copy of the cache explain: the attention"
            " kernel's scratch memory and a new allocation for every `torch.cat` are passes the"
            f" model does not count. {MEMORY_WALL} measures them one by one."
        )
    elif slope.outcome == DISAGREES:
        text.append(
            "The step grew by less than the model predicts: part of the cache was still in the"
            " CPU's caches, which are faster than the streams measured beside it."
        )
    else:
        text.append(
            "The run's steps scatter too widely to call a miss of this size either way; the figure"
            " shows every step."
        )
    cache_long = 3 * kv_bytes_per_token * contexts[-1]
    text.append(
        f"The fastest step grew from {si(steps[0], 's')} at {contexts[0]:,.0f} tokens of history"
        f" to {si(steps[-1], 's')} at {contexts[-1]:,.0f}, where each step reads, copies and"
        f" writes about {si(cache_long, 'B')} of cache against {si(weight_bytes, 'B')} of weights."
        " Removing recomputation did not make a step constant-cost: the history it reads keeps"
        " growing."
    )
    text.append(
        sweep_summary(
            [f"{s:,.0f} tokens" for s in contexts], points, "the model drawn in the figure"
        )
    )
    return " ".join(text)


def intercept_reading(floor_s: float, t0: float, spread: float) -> str:
    """The step at short context against the weight-read floor (``decode_step.weight_read_floor``:
    weight bytes / read bandwidth), judged by ``agreement.compare`` with ``spread``, the step's and
    the read bandwidth's."""
    if missing := unmeasured(floor_s=floor_s, t0=t0):
        return missing
    c = compare(t0, floor_s, spread)
    text = (
        "Reading the weights once at the read bandwidth, weight bytes over $\\beta_\\text{read}$,"
        f" takes {si(floor_s, 's')}: the floor of a step whose cache is small next to its weights."
        f" The fastest step at short context took {si(t0, 's')}, {ratio_text(t0, floor_s)} that"
        f" floor, which {verdict_words(c)}."
    )
    if c.agrees:
        return text + (
            " On this machine a short-context step is already bound by reading its weights, and the"
            " overheads are small next to it."
        )
    if c.outcome == DISAGREES and c.side == ABOVE:
        return text + (
            " A CPU step is also Python dispatch, many small kernels and cache misses. [The memory"
            " wall](10_memory_wall.ipynb) tells these apart. On a GPU the same gap is kernel-launch"
            " overhead, which [Recompute, cache reuse, optimized decode](02_cache_reuse.ipynb)"
            " removes with CUDA graphs."
        )
    if c.outcome == DISAGREES:
        return text + (
            " Faster than its weights can stream from memory: part of them stayed in the CPU's"
            " caches between steps."
        )
    return text + " The run's spread is too wide to say whether the overheads matter."
