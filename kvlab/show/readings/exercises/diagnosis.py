"""Notebook 09, the worked decode reasoning path (section 9.8): worked solutions of the exercises
that have numbers."""

from __future__ import annotations

from kvlab._checks import real, unmeasured
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory import verdict as model
from kvlab.theory.agreement import ABOVE, AGREES, DISAGREES, compare


def diagnosis_batch(
    weight_bytes: float,
    sequence_bytes: float,
    context: int,
    bandwidth: float,
    step_1: float,
    fraction_1: float,
    predicted_batch: float,
    batch: int,
    step_b: float,
    fraction_b: float,
    verdict_1: str,
    verdict_b: str,
    spread: float,
) -> str:
    """Exercise 1 of 9.8: the batch at which the chatbot's step would reach the read bandwidth.

    ``weight_bytes`` (P w) and ``sequence_bytes`` ((s + 1) K, one sequence's cache read and new
    token) are the step's bytes at ``context`` cached tokens (``kvlab.theory.work.step_work``);
    ``predicted_batch`` is ``kvlab.theory.verdict.bandwidth_batch``; ``batch`` the batch diagnosed,
    at ``step_b`` seconds and ``fraction_b`` of the read ``bandwidth``; ``spread`` the relative
    spread of the two diagnoses' fractions (``kvlab.theory.agreement.compare``).
    """
    if missing := unmeasured(step_1=step_1, fraction_1=fraction_1):
        return solution(1, missing)
    flat = model.flat_step_fraction(batch, step_1, weight_bytes, sequence_bytes, bandwidth)
    c = compare(fraction_b, flat, spread)
    text = (
        "A step moves $P w + b\\,(s + 1)\\,K$ bytes: the weights, read once for all the sequences"
        f" of the batch ({si(weight_bytes, 'B')}) and each sequence's cache read and new token"
        f" ({si(sequence_bytes, 'B')} at {context:,} cached tokens). Only the second term grows"
        f" with $b$. At batch 1 the step took {si(step_1, 's')} and moved its"
        f" {si(weight_bytes + sequence_bytes, 'B')} at {fraction_1:.1%} of the read bandwidth"
        f" $\\beta$ = {si(bandwidth, 'B/s')}. If the step time stayed $t_1$, the bytes per second"
        " would reach $\\beta$ at $b = (\\beta t_1 - P w)/((s + 1) K)$ ="
        f" **{predicted_batch:,.1f}** (`kvlab.theory.verdict.bandwidth_batch`), not at"
        " $1/\\text{fraction}$: batching a step that reads its weights raises tokens and FLOPs"
        " per second, and bytes per second only by the cache it adds."
    )
    if batch < predicted_batch:
        text += f" The cell diagnoses batch {batch}, as far as this page's time allows."
    text += (
        f" Measured: one step took {si(step_1, 's')} at batch 1 ({verdict_1}) and {si(step_b, 's')}"
        f" at batch {batch} ({verdict_b}), {step_b / step_1:.2f} times as long, at {fraction_b:.1%}"
        f" of the read bandwidth against the {flat:.1%} a flat step would reach"
        f" (`verdict.flat_step_fraction`): {c.describe()}."
    )
    if c.outcome == AGREES:
        text += (
            " The step stayed nearly flat, as the prediction assumes: what the batch-1 step paid"
            " for (dispatch, reading the weights) is shared by every sequence."
        )
    elif c.outcome == DISAGREES and c.side != ABOVE:
        text += (
            " The step did not stay flat, so the fraction fell short of the prediction: something"
            " else grew with the batch, each sequence's attention and activations, and on a CPU the"
            " matrix products themselves, whose time grows with the rows they multiply well before"
            " the read bandwidth binds. The prediction is an upper bound on the bytes per second"
            " batching buys."
        )
    elif c.outcome == DISAGREES:
        text += (
            " The fraction beat the flat-step prediction, which a batch cannot do by its bytes: the"
            " batch-1 step was slowed by other work on this shared machine (rerun the cell)."
        )
    else:
        text += (
            " The run cannot tell: the miss is wider than the spread explains, short of a clear"
            " one. Diagnose a larger batch to see which way the step goes."
        )
    return solution(1, text)


def diagnosis_gqa(
    kv_heads_before: int,
    kv_heads_after: int,
    context: int,
    share_before: float,
    share_after: float,
    measured_share: float,
    verdict_before: str,
    verdict_after: str,
) -> str:
    """Exercise 2 of 9.8: the retrieval step's KV share with grouped-query attention."""
    if missing := unmeasured(measured_share=measured_share):
        return solution(2, missing)
    text = (
        "`kvlab.theory.roofline.step_bytes` gives the weights $P w$ and the cache $b\\,s\\,K$,"
        f" with $K = 2 L n_{{kv}} d_h w$ proportional to the KV heads. Going from {kv_heads_before}"
        f" to {kv_heads_after} KV heads divides the cache by {kv_heads_before / kv_heads_after:g}"
        f" (the key and value projections shrink too, a little of the weights). At {context:,}"
        f" cached tokens the KV share of the step's bytes falls from {share_before:.1%} to a"
        f" predicted **{share_after:.1%}**; the diagnosis counts {measured_share:.1%}, cache writes"
        " included. The share is arithmetic; what the measurement adds is the verdict:"
        f" **{verdict_before}** before, **{verdict_after}** after."
    )
    # A verdict may name two ("overhead or kv") when the run cannot tell between them.
    kv_before, kv_after = ("kv" in v.split(" or ") for v in (verdict_before, verdict_after))
    if kv_before and not kv_after:
        text += (
            " The cache no longer limits the step: the lever worked, and the next limit is the one"
            " the new verdict names. Run the path again from there."
        )
    elif kv_after:
        text += (
            " The cache still dominates the bytes the step moves, so the verdict stays: a smaller"
            " cache shortens the step but a longer context would bring it back; KV quantization or"
            " a window cut it further."
        )
    else:
        text += (
            " The verdict did not rest on the cache before either: on this machine the step's time"
            " goes to what the verdict names, and shrinking the cache changes its bytes, not its"
            " limit."
        )
    return solution(2, text)


def diagnosis_naive_ridge(
    ridge: float,
    element_size: int,
    closed_form: float,
    crossing: int,
    context: int,
    intensity: float,
    verdict: str,
) -> str:
    """Exercise 3 of 9.8: the context above which a naive step passes the ridge point."""
    ridge = real("ridge", ridge)
    closed_form = real("closed_form", closed_form)
    intensity = real("intensity", intensity)
    text = (
        "A naive step reruns all $n = s + 1$ positions but reads the weights once: $2Pn$ FLOPs of"
        " products over $P w$ bytes, plus attention FLOPs that grow as $n^2$. Its intensity is"
        f" about $2n / w$ FLOP per byte, so it passes this machine's ridge point of {ridge:.3g}"
        f" FLOP/byte near $n \\approx \\text{{ridge}} \\cdot w / 2$, about {closed_form:,.0f}"
        f" positions (with $w$ = {element_size} bytes). Counting the attention FLOPs too with"
        f" `kvlab.theory.work.step_work`, the first such context is **{crossing:,}** tokens. The"
        f" page's naive step ran at {context:,} cached tokens, an intensity of {intensity:.3g}"
        " FLOP/byte, "
    )
    past = model.past_ridge(intensity, ridge)
    text += "past the ridge point: " if past else "below the ridge point: "
    if (verdict == "compute") == past:
        text += f"and its verdict, **{verdict}**, agrees with the arithmetic."
    elif past:
        text += (
            f"yet its verdict is **{verdict}**, not compute. The ridge point compares ceilings; the"
            " verdict first asks whether the operators were busy at all, and on a CPU a step of a"
            " small model can lose most of its time to dispatch, or reach neither ceiling, before"
            " the arithmetic matters."
        )
    else:
        text += (
            f"yet its verdict is **{verdict}**. The FLOP fraction came out above the bandwidth"
            " fraction although the intensity is below the ridge point: the calibrated ceilings"
            " are single measurements, and a step that reaches a small share of both can tip"
            " either way."
        )
    return solution(3, text)
