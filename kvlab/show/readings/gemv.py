"""Notebook 03, GEMV-like decode and the roofline (section 9.3): its readings."""

from __future__ import annotations

import math
import statistics

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"


def gemv_reading(intensity: float, gemv_bytes_per_s: float, copy_bytes_per_s: float) -> str:
    """The n = 1 product against the calibrated copy bandwidth."""
    frac = gemv_bytes_per_s / copy_bytes_per_s
    text = (f"At $n = 1$ the product ran at {intensity:.2f} FLOP per byte and streamed its operands at "
            f"**{si(gemv_bytes_per_s, 'B/s')}**, {frac:.0%} of the calibrated copy bandwidth "
            f"({si(copy_bytes_per_s, 'B/s')}).")
    if 0.6 <= frac <= 1.5:
        return text + (" A matrix-vector product is a memory copy with a little arithmetic on the side, "
                       "and it runs at about the speed of one.")
    if frac < 0.6:
        return text + (" A matrix-vector product should run at about the speed of a copy; this one "
                       "did not. On a CPU the usual reason is a GEMV kernel that does not keep enough "
                       "loads in flight on one thread to saturate memory, or a weight that partly sat "
                       "in cache during the calibration's copy but not here.")
    return text + (" That is faster than the copy: the copy's bandwidth counts the bytes it writes, and "
                   "writes cost a CPU more than reads, while this product mostly reads.")


def ridge_reading(ridge_cal: float, n_ridge_cal: float, matmul_flops: float, copy_bytes_per_s: float,
                  fit_knee: float, fit_n: float, fit_bandwidth: float, fit_peak: float,
                  fit_rms_log_error: float = 0.0) -> str:
    """The calibrated ridge beside the knee of both roofline segments fitted to the sweep."""
    text = [f"The calibrated roof puts the ridge at **{ridge_cal:.3g} FLOP per byte** "
            f"({si(matmul_flops, 'FLOP/s')} of matmul over {si(copy_bytes_per_s, 'B/s')} of copy); for "
            f"this weight the intensity formula reaches it at $n \\approx {n_ridge_cal:.3g}$ rows."]
    if not math.isfinite(fit_knee):
        text.append("Fitting both roofline segments to the sweep finds no knee: every point lies on one "
                    "segment, so the sweep did not cross the ridge. Extend the sweep's $n$ (exercise 1 "
                    "shows how) to see the bend.")
        return " ".join(text)
    text.append(f"Fitting both segments to the sweep (a bandwidth line of {si(fit_bandwidth, 'B/s')} and a "
                f"flat roof of {si(fit_peak, 'FLOP/s')}) puts the **measured knee at {fit_knee:.3g} FLOP per "
                f"byte**, $n \\approx {fit_n:.3g}$: {ratio_text(fit_knee, ridge_cal)} the calibrated ridge.")
    if within(fit_knee, ridge_cal, 2):
        text.append(f"The two agree within a factor of two, though the fitted line is "
                    f"{fit_bandwidth / copy_bytes_per_s:.0%} of the copy bandwidth and the fitted roof "
                    f"{fit_peak / matmul_flops:.0%} of the calibrated matmul rate: the products bend where "
                    "the ceilings say, below both ceilings.")
    elif fit_knee < ridge_cal:
        text.append(f"The products bent earlier than the calibration says because their roof is lower: "
                    f"they reached {fit_peak / matmul_flops:.0%} of the calibrated matmul rate, since a "
                    "thin product runs a different code path (a GEMV kernel, or a GEMM with thin tiles) "
                    "than the large square product the calibration timed.")
    else:
        text.append(f"The products bent later than the calibration says: their streaming line is "
                    f"{fit_bandwidth / copy_bytes_per_s:.0%} of the copy bandwidth, so they need more "
                    "rows before arithmetic limits them. On a shared machine the calibration and the "
                    "sweep can also meet it in different moods.")
    if fit_rms_log_error > 0.2:
        text.append(f"The points bend gradually rather than at a corner (the two segments miss them by "
                    f"{math.expm1(fit_rms_log_error):.0%} on average), so the knee summarises a curve.")
    return " ".join(text)


def doubling_reading(ns, seconds, knee_n: float) -> str:
    """How much the product's time grew per doubling of n, left of the fitted knee."""
    steps = [(n1, t2 / t1) for n1, t1, n2, t2 in zip(ns, seconds, ns[1:], seconds[1:])
             if n2 == 2 * n1 and (not math.isfinite(knee_n) or n2 <= knee_n)]
    if not steps:
        return ("No doubling of $n$ lies left of the fitted knee, so this sweep cannot show the "
                "bandwidth-bound regime; a device with a higher ridge (a GPU) shows it over many doublings.")
    growth = math.exp(statistics.fmean(math.log(f) for _, f in steps))
    factors = ", ".join(f"{f:.2f}" for _, f in steps)
    text = (f"Left of the fitted knee, each doubling of $n$ multiplied the product's time by {factors} "
            f"(geometric mean {growth:.2f}).")
    if growth < 1.4:
        return text + " Doubling $n$ barely changed the time, so the FLOP/s nearly doubled: time is bytes there."
    n1, worst = max(steps, key=lambda s: s[1])
    return text + (f" The model expects close to 1, so the FLOP/s should double; they did not. The largest "
                   f"jump, {worst:.2f} times from $n = {n1}$ to {2 * n1}, is a change of code path: on a CPU "
                   "$n = 1$ runs a GEMV kernel at streaming speed, while $n \\geq 2$ runs a GEMM whose thin "
                   "tiles stream the weight more slowly. A GPU's bandwidth-bound regime is much wider "
                   "(its ridge is hundreds of FLOP per byte) and shows the flat times the model predicts.")


def step_profile_reading(model: str, step_s: float, weight_bytes: float, weight_read_s: float,
                         matmul_fraction: float, gemv_copy_fraction: float) -> str:
    """One decode step against the time to read its weights once."""
    share = weight_read_s / step_s
    text = [f"One step of {model} took **{si(step_s, 's')}**. It reads {si(weight_bytes, 'B')} of "
            f"parameters, which at copy bandwidth takes {si(weight_read_s, 's')}: the weight read alone "
            f"accounts for **{share:.0%}** of the measured step. With hooks, {matmul_fraction:.0%} of the "
            "step is spent inside the weight multiplications; the rest is attention over the cache, "
            "norms, the cache update and dispatch."]
    if share >= 0.5:
        text.append("The weight read is most of the step: this step is the memory-bound GEMV the sweep "
                    "predicts.")
    else:
        text.append("The weight read is the smaller part here, and the gap is the interesting part "
                    "(see below).")
    if gemv_copy_fraction >= 0.6:
        text.append("The sweep above shows that one large GEMV does run at copy speed, so the larger "
                    "the matrices, the closer a step comes to its floor.")
    else:
        text.append(f"Even the sweep's large GEMV reached only {gemv_copy_fraction:.0%} of copy speed on "
                    "this machine, so the floor here is optimistic for every product.")
    return " ".join(text)


def explore_reading(batch: int, context: int, measured_s: float, floor_s: float, floor_copy_s: float) -> str:
    """Under the step explorer: this step against its two floors."""
    text = (f"Batch {batch}, {context:,} tokens each: the step took **{si(measured_s, 's')}** against a "
            f"floor of {si(floor_s, 's')} ({si(floor_copy_s, 's')} with the cache counted three times), "
            f"{ratio_text(measured_s, floor_copy_s)} the second floor.")
    if measured_s < floor_s:
        return text + (" That is below the floor, which should not happen: the calibration ran slower "
                       "than this step did (a shared machine's noise), or part of the data was in cache.")
    if measured_s <= 2 * floor_copy_s:
        return text + " Close to the floor: this step is as memory bound as the model says."
    return text + (" Well above the floor: at this size the step is dominated by fixed costs (Python "
                   f"dispatch, small kernels), not bytes. {MEMORY_WALL} separates them.")


def floor_ratio_reading(b_lo: int, s_lo: int, r_lo: float, b_hi: int, s_hi: int, r_hi: float) -> str:
    """The smallest and the largest setting against the cache-counted-three-times floor."""
    text = (f"At batch {b_lo} and {s_lo:,} tokens a measured step took {r_lo:.1f} times its floor (counting "
            f"the cache three times); at batch {b_hi} and {s_hi:,} tokens, {r_hi:.1f} times.")
    if r_hi < r_lo:
        return text + (" The measurement approaches the floor as the cache takes over the step's bytes: "
                       "the fixed costs matter less, the bytes more.")
    return text + (" The expectation is that a large batch at long context approaches the floor, because "
                   "the cache's bytes dominate; here it did not, which on a CPU usually means the "
                   "attention over a large batch runs below streaming speed (many small per-head "
                   "products) rather than at it.")
