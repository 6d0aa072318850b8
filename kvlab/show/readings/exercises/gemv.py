"""Notebook 03, GEMV-like decode and the roofline (section 9.3): worked solutions of the exercises
that have numbers."""

from __future__ import annotations

from kvlab._checks import real
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory import matmul
from kvlab.theory.agreement import ABOVE, CANNOT_TELL, compare


def gemv_big_product(
    K: int,
    N: int,
    element_size: int,
    read_bytes_per_s: float,
    matmul_flops: float,
    measured_s: float | None,
    spread: float = 0.0,
) -> str:
    """Exercise 1 of chapter 3: the time of one 70B MLP matrix-vector product, predicted by the
    roofline (``kvlab.theory.matmul.roofline_time``) with the read bandwidth measured beside the
    sweep's batch-1 product; judged by ``agreement.compare`` with ``spread``, the measurement's and
    that ceiling's added."""
    read_bytes_per_s = real("read_bytes_per_s", read_bytes_per_s)
    matmul_flops = real("matmul_flops", matmul_flops)
    nbytes = matmul.matmul_bytes(1, K, N, element_size)
    predicted = matmul.roofline_time(1, K, N, element_size, read_bytes_per_s, matmul_flops)
    text = (
        f"At $n = 1$ the product is a weight read: {K:,} × {N:,} elements of {element_size} bytes,"
        f" {si(nbytes, 'B')} with the activation and output vectors. At the read bandwidth"
        f" measured beside the sweep, {si(read_bytes_per_s, 'B/s')}, the roofline,"
        " $\\max(\\text{bytes}/\\beta,\\ \\text{FLOPs}/\\text{peak})$"
        f" (`matmul.roofline_time`), says it should take about **{si(predicted, 's')}**. The two"
        " vectors add a negligible share."
    )
    if measured_s is None:
        return solution(1, text + " Measure it with the cell the exercise names.")
    c = compare(measured_s, predicted, spread)
    text += (
        f" Measured (fastest repeat): **{si(measured_s, 's')}**, {c.ratio:.2f} times the"
        f" prediction, which {verdict_words(c)}."
    )
    if c.agrees:
        text += " A matrix this large streams at the read bandwidth: time is bytes."
    elif c.outcome == CANNOT_TELL:
        text += " The repeats scattered too much to call the gap; rerun the cell."
    elif c.side == ABOVE:
        text += (
            " Slower than its bytes: the read bandwidth left over moved between the sweep and this"
            " product on a shared machine, or a matrix of this size met memory pressure."
        )
    else:
        text += (
            " Faster than the read bandwidth measured beside the sweep: that stream ran under"
            " more load than this product did."
        )
    return solution(1, text)


def gemv_h200_batch(batch: int, step: float, rate: float, step32: float, rate32: float) -> str:
    """Exercise 2 of 9.3: the largest H200 batch of 8,192-token sequences for the 8B model."""
    step = real("step", step)
    rate = real("rate", rate)
    step32 = real("step32", step32)
    rate32 = real("rate32", rate32)
    return solution(
        2,
        "Solve $P w_p + B\\,T\\,k \\le M$ for $B$: $B = \\lfloor (M - P w_p) / (T k) \\rfloor$"
        f" (`rf.max_batch`). On the H200 that is **{batch} sequences**, with a step floor of"
        f" {si(step, 's')} and {rate:,.0f} tokens/s, against {si(step32, 's')} and {rate32:,.0f}"
        f" tokens/s at 32 sequences: {rate / rate32:.2f} times the tokens/s for {batch / 32:.1f}"
        " times the batch. Past 32 sequences of this length the cache already outweighs the"
        " weights, so each extra sequence adds nearly its own read time: batching stops paying"
        " once the step is KV-bound.",
    )


def gemv_attention_ridge(ridge: float, needs: dict, max_g: int) -> str:
    """Exercise 3 of 9.3: what g and w_kv would bring attention to the H100's ridge."""
    ridge = real("ridge", ridge)
    rows = "\n".join(f"| {w:g} | {g:,.0f} |" for w, g in needs.items())
    return solution(
        3,
        f"Attention does $2g/w_{{kv}}$ FLOP per cache byte, so reaching the ridge of {ridge:.0f}"
        " FLOP per byte needs $g = I^* w_{kv} / 2$:\n\n| $w_{kv}$ (bytes) | $g$ needed"
        f" |\n|---:|---:|\n{rows}\n\nLlama-3-70B has {max_g} query heads, so even one KV head for"
        f" all of them (multi-query attention, $g = {max_g}$) falls short in bf16, and a 4-bit"
        " cache only just comes near. Attention over the cache stays bandwidth-bound; what helps"
        " is fewer bytes (the levers of the long-context section), not more arithmetic per byte.",
    )
