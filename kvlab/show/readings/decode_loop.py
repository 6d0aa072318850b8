"""Notebook 01, the decode loop (section 9.1): its readings.

Each decision calls the model in ``kvlab.theory.decode_step``: a cached step grows by three passes
over its cache bytes (``predicted_step``, ``step_slope``; ``STEP_TOLERANCE``, ``SLOPE_TOLERANCE``,
``GROWTH_TOLERANCE``) and a short-context step is bounded by reading its weights once
(``weight_read_floor``, ``near_floor``). The comparison itself is
``kvlab.theory.agreement.compare``.
"""

from __future__ import annotations

from kvlab._checks import unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.theory.agreement import ABOVE, compare

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"


MODEL = (
    "the three-pass model $t(s) = t(s_0) + 3k(s - s_0)/\\beta$ "
    "(`kvlab.theory.decode_step.predicted_step`)"
)


def step_reading(P: int, G: int, median_s: float, predicted_s: float) -> str:
    """Under the step-time figure: the median step at this prompt length against ``predicted_s``,
    what the three-pass model (``decode_step.predicted_step``) gives there; agreement within
    ``decode_step.STEP_TOLERANCE``."""
    if missing := unmeasured(median_s=median_s, predicted_s=predicted_s):
        return missing
    from kvlab.theory.decode_step import STEP_TOLERANCE

    c = compare(median_s, predicted_s, STEP_TOLERANCE)
    head = (
        f"With a {P:,}-token prompt, the median of {G - 1} decode steps took"
        f" **{si(median_s, 's')}**; {MODEL} gives {si(predicted_s, 's')} there: the step is"
        f" {c.describe()}."
    )
    if c.agrees:
        return (
            head
            + " The measurement sits on the line: the extra history costs what its bytes predict."
        )
    if c.outcome == ABOVE:
        return (
            head + " The step is slower than the bytes predict. On a CPU the likely reasons are "
            "memory allocation for the growing cache and a cache that no longer fits the CPU's "
            f"caches; on a shared machine, another process. {MEMORY_WALL} separates these."
        )
    return (
        head + " The step is faster than the line: part of the cache was still in the CPU's "
        "caches, so it was read faster than the calibrated streaming bandwidth."
    )


def slope_reading(
    kv_bytes_per_token: int,
    bandwidth: float,
    slope_meas: float,
    s0: int,
    t0: float,
    s_long: int,
    t_long: float,
    weight_bytes: float,
) -> str:
    """ "Reading the result" of 9.1: the fitted slope against ``decode_step.step_slope`` (3k/beta,
    agreement within ``SLOPE_TOLERANCE``), and the step at ``s_long`` against the one at ``s0``
    (grown beyond ``GROWTH_TOLERANCE`` or not)."""
    if missing := unmeasured(slope_meas=slope_meas, t0=t0, t_long=t_long, bandwidth=bandwidth):
        return missing
    from kvlab.theory.decode_step import (
        DYNAMIC_CACHE_PASSES,
        GROWTH_TOLERANCE,
        SLOPE_TOLERANCE,
        predicted_step,
        step_slope,
    )

    slope_pred = step_slope(kv_bytes_per_token, bandwidth)
    c = compare(slope_meas, slope_pred, SLOPE_TOLERANCE)
    text = [
        "The three-pass model (`kvlab.theory.decode_step.step_slope`: $3k/\\beta$, with $k$ ="
        f" {si(kv_bytes_per_token, 'B')} per token and $\\beta$ = {si(bandwidth, 'B/s')}) says each"
        f" extra token of history should add **{si(slope_pred, 's')}** to a step. A straight line"
        f" through the measured medians gives **{si(slope_meas, 's')}**: {c.describe()}."
    ]
    if c.agrees:
        text.append(
            "Counting three passes over the cache bytes (read, copy, write) explains how the step"
            " grows."
        )
    elif c.outcome == ABOVE:
        text.append(
            "The step moves more than the three passes over the cache we counted. On a CPU the "
            "usual reasons are the attention kernel's own scratch memory, allocating a new tensor "
            "for every `torch.cat`, and a cache that has outgrown the CPU's caches. "
            f"{MEMORY_WALL} measures them one by one."
        )
    else:
        text.append(
            "The step grew by less than the three passes predict: part of the cache was still in "
            "the CPU's caches, which are faster than the streaming bandwidth we calibrated, or the "
            "timer noise of a shared machine flattened the line."
        )
    cache_long = DYNAMIC_CACHE_PASSES * kv_bytes_per_token * s_long
    growth = compare(t_long, t0, GROWTH_TOLERANCE)
    text.append(
        f"A step at {s0:,} tokens of context took {si(t0, 's')}; at {s_long:,} tokens it took"
        f" {si(t_long, 's')}, {ratio_text(t_long, t0)} the short-context step, where the model"
        f" predicts {si(predicted_step(t0, s0, s_long, kv_bytes_per_token, bandwidth), 's')}. By"
        f" then each step reads, copies and writes about {si(cache_long, 'B')} of cache, against"
        f" {si(weight_bytes, 'B')} of weights."
    )
    if growth.outcome == ABOVE:
        text.append(
            f"That is more than {GROWTH_TOLERANCE:g} times: removing recomputation did not make the"
            " step constant-cost, since the history a step reads keeps growing."
        )
    elif growth.agrees:
        text.append(
            f"Over this range the step grew by less than a factor of {GROWTH_TOLERANCE:g}: the"
            " weights still dominate what a step reads. The growth shows once the cache bytes pass"
            " the weight bytes; move the slider to the longest context or run on a GPU with a real"
            " model."
        )
    else:
        text.append(
            "The long-context step was faster than the short-context one, which no cost model "
            "predicts: the short-context steps were slowed by something else (a shared machine's "
            "other processes, caches still warming). Rerun the cell."
        )
    return " ".join(text)


def intercept_reading(floor_s: float, t0: float) -> str:
    """The step at short context against the weight-read floor (``decode_step.weight_read_floor``:
    weight bytes / copy bandwidth); ``decode_step.near_floor`` decides."""
    if missing := unmeasured(floor_s=floor_s, t0=t0):
        return missing
    from kvlab.theory.decode_step import FLOOR_BAND, near_floor

    text = (
        "Reading the weights once at the calibrated copy bandwidth, weight bytes over $\\beta$,"
        f" takes {si(floor_s, 's')}: the floor of a step whose cache is small next to its weights."
        f" The measured step at short context took {si(t0, 's')}, {ratio_text(t0, floor_s)} that"
        " floor."
    )
    if not near_floor(t0, floor_s):
        return (
            text + f" That is more than {FLOOR_BAND:g} times the floor, because a CPU step is also"
            " Python dispatch, many small kernels and cache misses. [The memory"
            " wall](10_memory_wall.ipynb) tells these apart. On a GPU the same gap is"
            " kernel-launch overhead, which [Recompute, cache reuse, optimized"
            " decode](02_cache_reuse.ipynb) removes with CUDA graphs."
        )
    return (
        text + f" That is within {FLOOR_BAND:g} times the floor: on this machine a short-context"
        " step is "
        "already bound by reading the weights, and the overheads are small next to it."
    )
