"""Notebook 03, GEMV-like decode and the roofline (section 9.3): its readings.

Each decision compares a measurement with a model through ``kvlab.theory.agreement.compare`` and
the spread measured beside it: the roofline of one product, max(bytes / read bandwidth, FLOPs /
matmul rate at n) (``kvlab.lab.skinny.SkinnyPoint``; Williams et al. 2009), the weight-read floor
of a step (weight bytes / read bandwidth) and the roofline floor of a decode step
(``kvlab.theory.roofline.step_time_floor``). Table 9.1 is read as a latency-throughput trade.
"""

from __future__ import annotations

from kvlab._checks import instance, items, unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.verdicts import sweep_summary, verdict_words
from kvlab.theory.agreement import ABOVE, DISAGREES, Comparison, compare
from kvlab.theory.roofline import FloorRow

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"
ROOFLINE = (
    "the roofline, $\\max(\\text{bytes}/\\beta,\\ \\text{FLOPs}/\\text{peak})$ "
    "(`kvlab.theory.matmul.roofline_time`)"
)
STEP_FLOOR = (
    "the roofline's $\\max(B/\\beta,\\ F/\\text{peak})$ of the step's bytes $B$ and FLOPs $F$ "
    "(`kvlab.theory.roofline.step_time_floor`)"
)


def step_profile_reading(
    model: str,
    step_s: float,
    step_spread: float,
    weight_bytes: float,
    weight_read_s: float,
    matmul_fraction: float,
    gemv: Comparison,
) -> str:
    """One decode step (its fastest repeat and ``step_spread``) against the weight-read floor,
    weight bytes over the read bandwidth (``weight_read_s``), judged by ``agreement.compare``;
    ``gemv`` is the sweep's n = 1 product against its roofline (``SkinnyPoint.comparison``)."""
    if missing := unmeasured(
        step_s=step_s,
        step_spread=step_spread,
        weight_read_s=weight_read_s,
        matmul_fraction=matmul_fraction,
    ):
        return missing
    c = compare(step_s, weight_read_s, step_spread)
    text = [
        f"One step of {model} took **{si(step_s, 's')}**. It reads {si(weight_bytes, 'B')} of"
        f" parameters, which take {si(weight_read_s, 's')} at the read bandwidth (the weight-read"
        f" floor): the weight read accounts for **{weight_read_s / step_s:.0%}** of the step, and"
        f" the step against that floor {verdict_words(c)}. With hooks, {matmul_fraction:.0%} of"
        " the step is spent inside the weight multiplications; the rest is attention over the"
        " cache, norms, the cache update and dispatch."
    ]
    if c.agrees:
        text.append("The weight read is the step: this step is the memory-bound GEMV of the sweep.")
    elif c.side == ABOVE:
        text.append(
            "The weight read is the smaller part of a step this small; the gap is fixed costs"
            " (see below)."
        )
    else:
        text.append(
            "The step was faster than reading its weights once from memory: the matrices of a"
            " small model partly stay in the CPU's caches from one step to the next."
        )
    text.append(
        f"For comparison, the sweep's large GEMV streamed at {1 / gemv.ratio:.0%} of its roofline"
        " rate: the larger the matrices, the closer a step comes to its floor."
    )
    return " ".join(text)


def explore_reading(
    batch: int, context: int, measured_s: float, floor_s: float, floor_copy_s: float, spread: float
) -> str:
    """Under the step explorer: this step (the fastest repeat, with its ``spread``) against its
    floor with the cache counted three times (``roofline.step_time_floor``), judged by
    ``agreement.compare``."""
    if missing := unmeasured(
        measured_s=measured_s, floor_s=floor_s, floor_copy_s=floor_copy_s, spread=spread
    ):
        return missing
    c = compare(measured_s, floor_copy_s, spread)
    text = (
        f"Batch {batch}, {context:,} tokens each: the step took **{si(measured_s, 's')}**. Its"
        f" floor, {STEP_FLOOR}, is {si(floor_s, 's')}, and {si(floor_copy_s, 's')} with the cache"
        " counted three times (read, copied, written); the measurement is"
        f" {c.ratio:.2g} times that and {verdict_words(c)}."
    )
    if c.agrees:
        return text + " Close to the floor: this step is as memory bound as the model says."
    if c.side == ABOVE:
        return (
            text + " Above the floor: at this size fixed costs (Python dispatch, small kernels) and"
            f" products that run below both ceilings add to the bytes. {MEMORY_WALL} separates"
            " them."
        )
    return (
        text + f" Below it ({ratio_text(measured_s, floor_s)} the floor counting the cache once):"
        " the cache was not copied at this size, or part of the data stayed in cache."
    )


def floor_ratio_reading(
    b_lo: int, s_lo: int, r_lo: float, b_hi: int, s_hi: int, r_hi: float, spread_hi: float
) -> str:
    """The smallest and the largest setting, each as measured step over its floor with the cache
    counted three times (``roofline.step_time_floor``); the largest judged by
    ``agreement.compare`` with its spread, where the cache's bytes should set the step."""
    if missing := unmeasured(r_lo=r_lo, r_hi=r_hi, spread_hi=spread_hi):
        return missing
    c = compare(r_hi, 1.0, spread_hi)
    text = (
        f"At batch {b_lo} and {s_lo:,} tokens a measured step took {r_lo:.1f} times its floor"
        f" (counting the cache three times); at batch {b_hi} and {s_hi:,} tokens,"
        f" {r_hi:.2g} times, which {verdict_words(c)}."
    )
    if c.agrees:
        return (
            text
            + " At the largest setting the measurement meets the floor: the cache's bytes set the "
            "step, and the fixed costs matter less."
        )
    if c.side == ABOVE:
        return (
            text + " The expectation is that a large batch at long context approaches the floor,"
            " because the cache's bytes dominate; here it did not: on a CPU the attention over a"
            " large batch runs below streaming speed (many small per-head products)."
        )
    return (
        text
        + " The largest setting ran faster than its floor allows: the cache was not copied at this"
        " size, or part of it stayed in cache."
    )


def skinny_reading(
    ns,
    comparisons,
    bounds,
    gemv_bytes_per_s: float,
    read_bytes_per_s: float,
    matmul_one_flops: float,
) -> str:
    """The sweep of ``kvlab.lab.skinny.roofline_sweep`` against its roofline: the GEMV at the first
    n against the read bandwidth measured beside it, where this machine's ridge puts the turn to
    compute, and the verdict at every n (``comparisons``, from ``SkinnyPoint.comparison``;
    ``bounds`` says which term the roofline took at each n)."""
    if missing := unmeasured(
        gemv_bytes_per_s=gemv_bytes_per_s,
        read_bytes_per_s=read_bytes_per_s,
        matmul_one_flops=matmul_one_flops,
    ):
        return missing
    ns, comparisons, bounds = list(ns), list(comparisons), list(bounds)
    first = comparisons[0]
    text = (
        f"At $n = {ns[0]}$ the product streams its weight at {si(gemv_bytes_per_s, 'B/s')},"
        f" {gemv_bytes_per_s / read_bytes_per_s:.0%} of the read bandwidth measured beside it"
        f" ({si(read_bytes_per_s, 'B/s')}); the roofline predicts {si(first.predicted, 's')}, the"
        f" measurement took {si(first.measured, 's')} and {verdict_words(first)}."
    )
    compute_ns = [n for n, b in zip(ns, bounds) if b == "compute"]
    turn = (
        f" The matmul rate measured at $n = {ns[0]}$ with the weight in cache,"
        f" {si(matmul_one_flops, 'FLOP/s')}, over the read bandwidth puts this machine's ridge at"
        f" {matmul_one_flops / read_bytes_per_s:.2g} FLOP per byte, and an fp32 weight product does"
        " about $n/2$ FLOP per byte of weight"
    )
    if compute_ns and compute_ns[0] <= 4:
        turn += (
            f", so the roofline turns compute-bound by $n = {compute_ns[0]}$: every extra row costs"
            " time almost from the start, and on this machine batching is never free."
        )
    elif compute_ns:
        turn += f", so the roofline stays flat up to $n = {compute_ns[0]}$ and then rises."
    else:
        turn += ", so over this sweep the roofline stays on its bytes term."
    text += turn + " " + sweep_summary([f"$n = {n}$" for n in ns], comparisons, "the roofline")
    above = [n for n, c in zip(ns, comparisons) if c.outcome == DISAGREES and c.side == "above"]
    below = [n for n, c in zip(ns, comparisons) if c.outcome == DISAGREES and c.side == "below"]
    if above:
        text += (
            " Where the product is slower than its roofline it runs below both of its ceilings at"
            " once: the library's kernel for a few rows against a weight streamed from memory"
            " neither streams at the read bandwidth nor computes at its in-cache rate, a cost the"
            " two-term model leaves out."
        )
    if below:
        text += (
            " Where the product beat its roofline, the in-cache matmul probe ran slower than the"
            " streamed product did at that $n$: the compute term is pessimistic there."
        )
    return text


def gpu_batching_reading(name: str, ridge: float, flat_n: float, bandwidth: float) -> str:
    """The same roofline with a GPU's datasheet constants: where its flat region ends."""
    instance("name", name, str)
    return (
        f"With the {name}'s constants ({si(bandwidth, 'B/s')} of memory, a ridge of {ridge:.0f}"
        f" FLOP per byte) the same model keeps a bf16 weight product at its $n = 1$ time up to"
        f" $n \\approx {flat_n:.0f}$: there, and only on machines like it, extra rows of a batch"
        " ride on a weight read that is paid anyway. This CPU's ridge sits near $n = 1$, so it"
        " cannot show that flat region; the right panel draws it from the datasheet, not from a"
        " measurement. Measured on a GPU, gpt-fast's batch-1 decode of Llama-2-7B reached 1,397"
        " GB/s on an A100 ([PyTorch gpt-fast, 2023](../book/references.md)): the weight stream, at"
        " most of the bandwidth, is what a batch-1 step costs there."
    )


def latency_throughput_reading(rows) -> str:
    """Table 9.1 read as a trade (``rows`` from ``roofline.decode_floor_table``, its first three
    read: one sequence of 8,192 tokens, then 32 of 2,048 and 32 of 8,192): how much the throughput
    ceiling rises and how much each request's token interval, its latency, rises with it."""
    rows = items("rows", rows, FloorRow)
    if len(rows) < 3 or None in (r.step_time for r in rows[:3]):
        raise ValueError(
            "rows must begin with three admitted rows of roofline.decode_floor_table (one sequence,"
            f" then a batch at two contexts), got step times {[r.step_time for r in rows]}"
        )
    one, short, long = rows[:3]
    return (
        f"Read the table as a trade. Batching {short.batch} sequences raises the throughput ceiling"
        f" {short.tokens_per_s / one.tokens_per_s:.0f} times at {short.context:,} tokens each and"
        f" {long.tokens_per_s / one.tokens_per_s:.0f} times at {long.context:,}"
        f" ({one.tokens_per_s:,.0f} to {short.tokens_per_s:,.0f} or {long.tokens_per_s:,.0f}"
        f" tokens/s), while the **latency** each request sees between two of its tokens, the step"
        f" time, rises from {one.step_time * 1e3:.1f} ms to {short.step_time * 1e3:.1f} or"
        f" {long.step_time * 1e3:.1f} ms. The weights are read once for the whole batch; each"
        " sequence's cache is its own, so the longer the contexts, the more latency a batch costs"
        " for the same throughput."
    )
