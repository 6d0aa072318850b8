"""Notebook 03, GEMV-like decode and the roofline (section 9.3): its readings.

Each decision calls a model: the roofline of one product, max(bytes / beta, FLOPs / peak)
(``kvlab.theory.matmul.roofline_time``, ``compare_with_roofline``, ``ridge_intensity`` and their
tolerances; Williams et al. 2009), the weight-read floor of a step (``kvlab.theory.decode_step``:
weight bytes / beta, ``FLOOR_BAND``) and the roofline floor of a decode step
(``kvlab.theory.roofline.step_time_floor``, ``STEP_FLOOR_TOLERANCE``). The comparison itself is
``kvlab.theory.agreement.compare``.
"""

from __future__ import annotations

import math
import statistics

from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.theory import matmul
from kvlab.theory.agreement import ABOVE, BELOW, FactorComparison, within_factor
from kvlab.theory.roofline import STEP_FLOOR_TOLERANCE

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"
ROOFLINE = (
    "the roofline, $\\max(\\text{bytes}/\\beta,\\ \\text{FLOPs}/\\text{peak})$ "
    "(`kvlab.theory.matmul.roofline_time`)"
)
STEP_FLOOR = (
    "the roofline's $\\max(B/\\beta,\\ F/\\text{peak})$ of the step's bytes $B$ and FLOPs $F$ "
    "(`kvlab.theory.roofline.step_time_floor`)"
)


def gemv_reading(
    n: int,
    K: int,
    N: int,
    element_size: float,
    seconds: float,
    copy_bytes_per_s: float,
    matmul_flops: float,
) -> str:
    """The ``[n x K] @ [K x N]`` product (n = 1) against its roofline time at the calibrated
    ceilings (``matmul.compare_with_roofline``)."""
    c = matmul.compare_with_roofline(seconds, n, K, N, element_size, copy_bytes_per_s, matmul_flops)
    nbytes = matmul.matmul_bytes(n, K, N, element_size)
    text = (
        f"At $n = {n}$ the product did {matmul.matmul_intensity(n, K, N, element_size):.2f} FLOP"
        f" per byte and streamed its {si(nbytes, 'B')} at **{si(nbytes / seconds, 'B/s')}**,"
        f" {nbytes / seconds / copy_bytes_per_s:.0%} of the calibrated copy bandwidth"
        f" ({si(copy_bytes_per_s, 'B/s')}). With the calibrated ceilings {ROOFLINE} gives"
        f" {si(c.predicted, 's')}; it took {si(seconds, 's')}, {c.describe()}."
    )
    if c.agrees:
        return (
            text
            + " A matrix-vector product is a memory copy with a little arithmetic on the side, "
            "and it runs at about the speed of one."
        )
    if c.outcome == ABOVE:
        return (
            text + " A matrix-vector product should run at about the speed of a copy; this one "
            "did not. On a CPU the usual reason is a GEMV kernel that does not keep enough "
            "loads in flight on one thread to saturate memory, or a weight that partly sat "
            "in cache during the calibration's copy but not here."
        )
    return (
        text
        + " That is faster than the copy: the copy's bandwidth counts the bytes it writes, and "
        "writes cost a CPU more than reads, while this product mostly reads."
    )


def ridge_reading(
    n_ridge_cal: float,
    matmul_flops: float,
    copy_bytes_per_s: float,
    fit_knee: float,
    fit_n: float,
    fit_bandwidth: float,
    fit_peak: float,
    fit_rms_log_error: float = 0.0,
) -> str:
    """The calibrated ridge (``matmul.ridge_intensity``) beside the knee of both roofline segments
    fitted to the sweep, agreeing within ``matmul.RIDGE_TOLERANCE``; the fit's misfit against
    ``CORNER_TOLERANCE``."""
    ridge_cal = matmul.ridge_intensity(matmul_flops, copy_bytes_per_s)
    text = [
        "The calibrated roof puts the ridge, peak over bandwidth"
        f" (`kvlab.theory.matmul.ridge_intensity`), at **{ridge_cal:.3g} FLOP per byte**"
        f" ({si(matmul_flops, 'FLOP/s')} of matmul over {si(copy_bytes_per_s, 'B/s')} of copy); for"
        f" this weight the intensity formula reaches it at $n \\approx {n_ridge_cal:.3g}$ rows."
    ]
    if not math.isfinite(fit_knee):
        text.append(
            "Fitting both roofline segments to the sweep finds no knee: every point lies on one "
            "segment, so the sweep did not cross the ridge. Extend the sweep's $n$ (exercise 1 "
            "shows how) to see the bend."
        )
        return " ".join(text)
    c = within_factor(fit_knee, ridge_cal, matmul.RIDGE_TOLERANCE)
    text.append(
        f"Fitting both segments to the sweep (a bandwidth line of {si(fit_bandwidth, 'B/s')} and a"
        f" flat roof of {si(fit_peak, 'FLOP/s')}) puts the **measured knee at {fit_knee:.3g} FLOP"
        f" per byte**, $n \\approx {fit_n:.3g}$:"
        f" {c.describe().replace('prediction', 'calibrated ridge')}."
    )
    if c.agrees:
        text.append(
            f"The two agree, though the fitted line is {fit_bandwidth / copy_bytes_per_s:.0%} of"
            f" the copy bandwidth and the fitted roof {fit_peak / matmul_flops:.0%} of the"
            " calibrated matmul rate: the products bend where the ceilings say, below both"
            " ceilings."
        )
    elif c.outcome == BELOW:
        text.append(
            "The products bent earlier than the calibration says because their roof is lower: "
            f"they reached {fit_peak / matmul_flops:.0%} of the calibrated matmul rate, since a "
            "thin product runs a different code path (a GEMV kernel, or a GEMM with thin tiles) "
            "than the large square product the calibration timed."
        )
    else:
        text.append(
            "The products bent later than the calibration says: their streaming line is "
            f"{fit_bandwidth / copy_bytes_per_s:.0%} of the copy bandwidth, so they need more "
            "rows before arithmetic limits them. On a shared machine the calibration and the "
            "sweep can also meet it in different moods."
        )
    if within_factor(math.exp(fit_rms_log_error), 1.0, matmul.CORNER_TOLERANCE).outcome == ABOVE:
        text.append(
            "The points bend gradually rather than at a corner (the two segments miss them by "
            f"{math.expm1(fit_rms_log_error):.0%} on average, more than the "
            f"{matmul.CORNER_TOLERANCE - 1:.0%} a corner allows), so the knee summarises a curve."
        )
    return " ".join(text)


def doubling_reading(
    ns, seconds, knee_n: float, K: int, N: int, element_size: float, bandwidth: float, peak: float
) -> str:
    """How much the product's time grew per doubling of n left of the fitted knee, against the
    growth of its ``matmul.roofline_time`` under the fitted ``bandwidth`` and ``peak`` (geometric
    means, agreement within ``matmul.DOUBLING_TOLERANCE``)."""
    steps = [
        (n1, t2 / t1)
        for n1, t1, n2, t2 in zip(ns, seconds, ns[1:], seconds[1:])
        if n2 == 2 * n1 and (not math.isfinite(knee_n) or n2 <= knee_n)
    ]
    if not steps:
        return (
            "No doubling of $n$ lies left of the fitted knee, so this sweep cannot show the"
            " bandwidth-bound regime; a device with a higher ridge (a GPU) shows it over many"
            " doublings."
        )

    def roof(n):
        return matmul.roofline_time(n, K, N, element_size, bandwidth, peak)

    growth = math.exp(statistics.fmean(math.log(f) for _, f in steps))
    expected = math.exp(statistics.fmean(math.log(roof(2 * n) / roof(n)) for n, _ in steps))
    c = within_factor(growth, expected, matmul.DOUBLING_TOLERANCE)
    factors = ", ".join(f"{f:.2f}" for _, f in steps)
    text = (
        f"Left of the fitted knee, each doubling of $n$ multiplied the product's time by {factors}"
        f" (geometric mean {growth:.2f}). With the fitted bandwidth and roof, {ROOFLINE} multiplies"
        f" it by {expected:.2f} there, since only the small activation and output grow: the"
        f" measured growth is {c.describe()}."
    )
    if c.agrees:
        return (
            text
            + " Doubling $n$ barely changed the time, so the FLOP/s nearly doubled: time is bytes"
            " there."
        )
    if c.outcome == BELOW:
        return (
            text + " The time fell as $n$ doubled, which no roofline predicts: the smaller products"
            " were "
            "slowed by something else (the first calls warming caches, another process on a shared "
            "machine). Rerun the sweep."
        )
    n1, worst = max(steps, key=lambda s: s[1])
    return (
        text + " So the FLOP/s should double; they did not. The largest "
        f"jump, {worst:.2f} times from $n = {n1}$ to {2 * n1}, is a change of code path: on a CPU "
        "$n = 1$ runs a GEMV kernel at streaming speed, while $n \\geq 2$ runs a GEMM whose thin "
        "tiles stream the weight more slowly. A GPU's bandwidth-bound regime is much wider "
        "(its ridge is hundreds of FLOP per byte) and shows the flat times the model predicts."
    )


def step_profile_reading(
    model: str,
    step_s: float,
    weight_bytes: float,
    weight_read_s: float,
    matmul_fraction: float,
    gemv: FactorComparison,
) -> str:
    """One decode step against the weight-read floor (weight bytes / copy bandwidth,
    ``weight_read_s``), agreement within ``decode_step.FLOOR_BAND``; ``gemv`` is the sweep's n = 1
    product against its roofline time (``matmul.compare_with_roofline``)."""
    from kvlab.theory.decode_step import FLOOR_BAND

    c = within_factor(step_s, weight_read_s, FLOOR_BAND)
    text = [
        f"One step of {model} took **{si(step_s, 's')}**. It reads {si(weight_bytes, 'B')} of"
        " parameters; the weight-read floor, weight bytes over the copy bandwidth"
        f" (`kvlab.theory.decode_step.weight_read_floor`), is {si(weight_read_s, 's')}: the weight"
        f" read alone accounts for **{weight_read_s / step_s:.0%}** of the measured step, which is"
        f" {c.describe().replace('the prediction', 'the floor')}. With hooks, {matmul_fraction:.0%}"
        " of the step is spent inside the weight multiplications; the rest is attention over the"
        " cache, norms, the cache update and dispatch."
    ]
    if c.agrees:
        text.append(
            "The weight read is most of the step: this step is the memory-bound GEMV the sweep "
            "predicts."
        )
    elif c.outcome == ABOVE:
        text.append(
            "The weight read is the smaller part here, and the gap is the interesting part "
            "(see below)."
        )
    else:
        text.append(
            "The step was faster than reading its weights once at copy speed: the matrices of a"
            " small model partly stay in the CPU's caches from one step to the next, which read"
            " faster than the calibrated bandwidth."
        )
    copy_share = 1 / gemv.ratio  # the product's rate over the copy bandwidth
    if gemv.agrees:
        text.append(
            f"The sweep above shows that one large GEMV runs at about copy speed ({copy_share:.0%}"
            f" of it, within the factor {gemv.tolerance:g} of its roofline time), so the larger the"
            " matrices, the closer a step comes to its floor."
        )
    elif gemv.outcome == ABOVE:
        text.append(
            f"Even the sweep's large GEMV reached only {copy_share:.0%} of copy speed on "
            "this machine, so the floor here is optimistic for every product."
        )
    else:
        text.append(
            f"The sweep's large GEMV streamed at {copy_share:.0%} of copy speed, faster than the"
            " copy, whose bandwidth counts the bytes it writes: for reads alone this floor is, if"
            " anything, high."
        )
    return " ".join(text)


def explore_reading(
    batch: int, context: int, measured_s: float, floor_s: float, floor_copy_s: float
) -> str:
    """Under the step explorer: this step against its floor with the cache counted three times
    (``roofline.step_time_floor``), agreement within ``roofline.STEP_FLOOR_TOLERANCE``."""
    c = within_factor(measured_s, floor_copy_s, STEP_FLOOR_TOLERANCE)
    text = (
        f"Batch {batch}, {context:,} tokens each: the step took **{si(measured_s, 's')}**. Its"
        f" floor, {STEP_FLOOR}, is {si(floor_s, 's')}, and {si(floor_copy_s, 's')} with the cache"
        " counted three times (read, copied, written); the step is"
        f" {c.describe().replace('prediction', 'second floor')}."
    )
    if c.agrees:
        return text + " Close to the floor: this step is as memory bound as the model says."
    if c.outcome == ABOVE:
        return (
            text
            + " Well above the floor: at this size the step is dominated by fixed costs (Python "
            f"dispatch, small kernels), not bytes. {MEMORY_WALL} separates them."
        )
    return (
        text + f" Below it ({ratio_text(measured_s, floor_s)} the floor counting the cache once),"
        " which a "
        "floor should not allow: the calibration ran slower than this step did (a shared machine's "
        "noise), part of the data was in cache, or the cache was not copied at this size."
    )


def floor_ratio_reading(
    b_lo: int, s_lo: int, r_lo: float, b_hi: int, s_hi: int, r_hi: float
) -> str:
    """The smallest and the largest setting, each as measured step over its floor with the cache
    counted three times (``roofline.step_time_floor``); the largest against agreement within
    ``roofline.STEP_FLOOR_TOLERANCE``, where the cache's bytes should set the step."""
    c = within_factor(r_hi, 1.0, STEP_FLOOR_TOLERANCE)
    text = (
        f"At batch {b_lo} and {s_lo:,} tokens a measured step took {r_lo:.1f} times its floor"
        f" (counting the cache three times); at batch {b_hi} and {s_hi:,} tokens,"
        f" {c.describe().replace('the prediction', 'its floor')}."
    )
    if c.agrees:
        return (
            text
            + " At the largest setting the measurement meets the floor: the cache's bytes set the "
            "step, and the fixed costs matter less."
        )
    if c.outcome == ABOVE:
        return (
            text + " The expectation is that a large batch at long context approaches the floor,"
            " because "
            "the cache's bytes dominate; here it did not, which on a CPU usually means the "
            "attention over a large batch runs below streaming speed (many small per-head "
            "products) rather than at it."
        )
    return (
        text
        + " The largest setting ran faster than its floor allows: the calibration ran slower than "
        "this step did (a shared machine's noise), or the cache was not copied at this size."
    )
