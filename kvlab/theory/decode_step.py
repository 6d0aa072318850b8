"""Notebooks 01, 02 and 03, the decode loop, cache reuse and the GEMV (sections 9.1 to 9.3): what a
decode step should cost.

- ``history_slope``: notebook 01's slope with each pass at its own ceiling, k / read + 2 k / copy;
- ``predicted_step``, ``predicted_step_growth`` and ``step_slope``: the single-bandwidth model of
  a cached step, t(s) = t(s0) + passes k (s - s0) / beta (``DYNAMIC_CACHE_PASSES`` passes over
  the cache), and how far a measurement may sit from it (``STEP_TOLERANCE``, ``SLOPE_TOLERANCE``,
  ``GROWTH_TOLERANCE``);
- ``step_spread`` and ``stands_out``: how much single steps of one run move, and whether a change
  exceeds it; ``fitted_growth``: a run's growth from first step to last, read off a line through
  every step;
- ``weight_read_floor`` and ``near_floor``: the time to read a step's weights once, and whether a
  step is within ``FLOOR_BAND`` of it.

Pure Python; the timings are in ``kvlab.lab.decode_timing``.
"""

from __future__ import annotations

import statistics

from kvlab._checks import integer, nonnegative, positive, real, reals

# Notebook 01's model of a cached step: t(s) = t(s0) + copies * k * (s - s0) / beta.
# ``DynamicCache`` reads every cached byte and its ``torch.cat`` copies it (a read and a write):
# three passes.
DYNAMIC_CACHE_PASSES = 3


def predicted_step_growth(
    kv_bytes_per_token: int, tokens: int, bandwidth: float, passes: int = DYNAMIC_CACHE_PASSES
) -> float:
    """Seconds by which a cached decode step grows over ``tokens`` more tokens of history, at
    ``kv_bytes_per_token`` bytes each moved ``passes`` times at ``bandwidth`` bytes/s (notebook 01).
    """
    kv_bytes_per_token, passes = (
        nonnegative("kv_bytes_per_token", kv_bytes_per_token),
        integer("passes", passes),
    )
    return passes * kv_bytes_per_token * tokens / positive("bandwidth", bandwidth)


def step_slope(
    kv_bytes_per_token: int, bandwidth: float, passes: int = DYNAMIC_CACHE_PASSES
) -> float:
    """Seconds each extra token of history adds to a cached step, ``passes`` k / beta: the slope of
    notebook 01's model."""
    return predicted_step_growth(kv_bytes_per_token, 1, bandwidth, passes)


def history_slope(
    kv_bytes_per_token: int, read_bytes_per_s: float, copy_bytes_per_s: float
) -> float:
    """Seconds each extra token of history adds to a ``DynamicCache`` step, with each pass at the
    ceiling of its traffic: attention reads the token's ``kv_bytes_per_token`` bytes once at the
    read bandwidth, and ``torch.cat`` copies them (read and written) at the copy rate, which counts
    bytes read plus written: k / read + 2 k / copy (notebook 01)."""
    k = positive("kv_bytes_per_token", kv_bytes_per_token)
    return k / positive("read_bytes_per_s", read_bytes_per_s) + 2 * k / positive(
        "copy_bytes_per_s", copy_bytes_per_s
    )


def predicted_step(
    t0: float,
    s0: float,
    context,
    kv_bytes_per_token: int,
    bandwidth: float,
    passes: int = DYNAMIC_CACHE_PASSES,
):
    """Notebook 01's model of a cached step at ``context`` tokens of history, t(s) = t(s0) + passes
    k (s - s0) / beta, from the step ``t0`` measured at ``s0`` tokens (``context`` may be a NumPy
    array)."""
    t0, s0 = nonnegative("t0", t0), nonnegative("s0", s0)
    return t0 + predicted_step_growth(kv_bytes_per_token, context - s0, bandwidth, passes)


# How far a measurement may sit from notebook 01's model and still follow it: a median step within a
# quarter of its predicted time; a slope fitted through a few medians on a shared machine within a
# factor of two; a long-context step within a tenth of the short-context one has not grown.
STEP_TOLERANCE = 1.25
SLOPE_TOLERANCE = 2.0
GROWTH_TOLERANCE = 1.1


def step_spread(step_times) -> float:
    """How much single steps of one run move: their interquartile range over their median."""
    step_times = reals("step_times", step_times, 0, low_open=True)
    if len(step_times) < 2:
        raise ValueError(f"step_times must hold at least two steps, got {len(step_times)}")
    q1, _, q3 = statistics.quantiles(step_times, n=4)
    return (q3 - q1) / statistics.median(step_times)


def fitted_growth(step_times) -> tuple[float, float]:
    """``(growth, scatter)`` of one run's steps, in order. A line through every step, its slope the
    median of the slopes between every pair of steps and its offset the median left over (Theil and
    Sen's line, which one descheduled step cannot tilt), gives ``growth``: its value at the last
    step over its value at the first, what a ratio of two single steps would read without their
    noise. ``scatter``: the interquartile range of the steps about that line over their median, the
    noise the growth is judged against. Needs three steps or more; a line at or below zero at the
    first step gives ``inf``."""
    step_times = reals("step_times", step_times, 0, low_open=True)
    n = len(step_times)
    if n < 3:
        raise ValueError(f"step_times must hold at least three steps, got {n}")
    slope = statistics.median(
        (step_times[k] - step_times[j]) / (k - j) for j in range(n) for k in range(j + 1, n)
    )
    first = statistics.median(t - slope * j for j, t in enumerate(step_times))
    residuals = [t - (first + slope * j) for j, t in enumerate(step_times)]
    q1, _, q3 = statistics.quantiles(residuals, n=4)
    growth = (first + slope * (n - 1)) / first if first > 0 else float("inf")
    return growth, (q3 - q1) / statistics.median(step_times)


def stands_out(change: float, step: float, spread: float) -> bool:
    """Whether a change of ``change`` seconds in a step of ``step`` seconds exceeds the ``spread``
    (a fraction of a step, ``step_spread``) by which single steps of the run move anyway."""
    change, step, spread = (
        real("change", change),
        positive("step", step),
        nonnegative("spread", spread),
    )
    return abs(change) > spread * step


# A step within this factor of its weight-read floor counts as bound by reading its weights.
FLOOR_BAND = 1.5


def weight_read_floor(weight_bytes: float, bandwidth: float) -> float:
    """Seconds to read a step's weights once at ``bandwidth`` bytes/s: the floor of a batch-1 decode
    step whose cache is small next to its weights (notebooks 01 and 03)."""
    return nonnegative("weight_bytes", weight_bytes) / positive("bandwidth", bandwidth)


def near_floor(step: float, floor: float, band: float = FLOOR_BAND) -> bool:
    """Whether a step of ``step`` seconds is within ``band`` times its ``floor``."""
    step, floor, band = positive("step", step), positive("floor", floor), real("band", band, 1)
    return step <= band * floor
