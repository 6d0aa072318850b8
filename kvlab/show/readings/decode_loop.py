"""Notebook 01, the decode loop (section 9.1): its readings."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"


def step_reading(P: int, G: int, median_s: float, predicted_s: float) -> str:
    """Under the step-time figure: the median step at this prompt length against the line."""
    head = (f"With a {P:,}-token prompt, the median of {G - 1} decode steps took **{si(median_s, 's')}**; "
            f"the prediction line gives {si(predicted_s, 's')} there ({ratio_text(median_s, predicted_s)}).")
    if within(median_s, predicted_s, 1.25):
        return head + " The measurement sits on the line: the extra history costs what its bytes predict."
    if median_s > predicted_s:
        return (head + " The step is slower than the bytes predict. On a CPU the likely reasons are "
                "memory allocation for the growing cache and a cache that no longer fits the CPU's "
                f"caches; on a shared machine, another process. {MEMORY_WALL} separates these.")
    return (head + " The step is faster than the line: part of the cache was still in the CPU's "
            "caches, so it was read faster than the calibrated streaming bandwidth.")


def slope_reading(slope_pred: float, slope_meas: float, s0: int, t0: float, s_long: int, t_long: float,
                  cache_long_bytes: float, weight_bytes: float) -> str:
    """"Reading the result" of 9.1: the fitted slope against ``3k/beta``, and the growth of a step."""
    text = [f"The prediction says each extra token of history should add **{si(slope_pred, 's')}** to a "
            f"step. A straight line through the measured medians gives **{si(slope_meas, 's')}**, "
            f"{ratio_text(slope_meas, slope_pred)} the prediction."]
    if within(slope_meas, slope_pred, 2):
        text.append("That is within a factor of two: counting three passes over the cache bytes "
                    "(read, copy, write) explains how the step grows.")
    elif slope_meas > slope_pred:
        text.append("That is more than twice the prediction: the step moves more than the three "
                    "passes over the cache we counted. On a CPU the usual reasons are the attention "
                    "kernel's own scratch memory, allocating a new tensor for every `torch.cat`, and "
                    f"a cache that has outgrown the CPU's caches. {MEMORY_WALL} measures them one by one.")
    else:
        text.append("That is less than half the prediction: part of the cache was still in the CPU's "
                    "caches, which are faster than the streaming bandwidth we calibrated, or the timer "
                    "noise of a shared machine flattened the line.")
    text.append(f"A step at {s0:,} tokens of context took {si(t0, 's')}; at {s_long:,} tokens it took "
                f"{si(t_long, 's')}. By then each step reads, copies and writes about "
                f"{si(cache_long_bytes, 'B')} of cache, against {si(weight_bytes, 'B')} of weights.")
    if t_long > 1.1 * t0:
        text.append("Removing recomputation did not make the step constant-cost: the history a step "
                    "reads keeps growing.")
    else:
        text.append(f"Over this range the step barely grew ({ratio_text(t_long, t0)} the short-context "
                    "step): the weights still dominate what a step reads. The growth shows once the "
                    "cache bytes pass the weight bytes; move the slider to the longest context or run "
                    "on a GPU with a real model.")
    return " ".join(text)


def intercept_reading(floor_s: float, t0: float) -> str:
    """The step at short context against the weight-read floor (``decode_timing.weight_read_floor``:
    weight bytes / copy bandwidth); ``decode_timing.near_floor`` decides."""
    from kvlab.lab.decode_timing import FLOOR_BAND, near_floor

    text = (f"Reading the weights once at the calibrated copy bandwidth, weight bytes over $\\beta$, takes "
            f"{si(floor_s, 's')}: the floor of a step whose cache is small next to its weights. The measured "
            f"step at short context took {si(t0, 's')}, {ratio_text(t0, floor_s)} that floor.")
    if not near_floor(t0, floor_s):
        return (text + f" That is more than {FLOOR_BAND:g} times the floor, because a CPU step is also Python "
                "dispatch, many small kernels and cache misses. [The memory wall](10_memory_wall.ipynb) "
                "tells these apart. On a GPU the same gap is kernel-launch overhead, which "
                "[Recompute, cache reuse, optimized decode](02_cache_reuse.ipynb) removes with CUDA graphs.")
    return (text + f" That is within {FLOOR_BAND:g} times the floor: on this machine a short-context step is "
            "already bound by reading the weights, and the overheads are small next to it.")
