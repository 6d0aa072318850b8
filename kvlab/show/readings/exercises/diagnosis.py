"""Notebook 09, the worked decode reasoning path (section 9.8): worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution


def diagnosis_batch(fraction_1: float, predicted_batch: int, batch: int, step_1: float, step_b: float,
                    fraction_b: float, verdict_1: str, verdict_b: str) -> str:
    """Exercise 1 of 9.8: the batch at which the chatbot's step would reach the copy bandwidth."""
    text = (f"A batch of $b$ sequences reads the weights once, so if the step time stayed the same, the "
            f"useful bytes per second, and with them the bandwidth fraction, would grow about $b$ times (the "
            f"cache each sequence adds is small for a chatbot). At batch 1 the chatbot's step reached "
            f"{fraction_1:.1%} of the copy bandwidth, so the prediction is $b \\approx 1 / {fraction_1:.3g}$, "
            f"about **{predicted_batch:,}** sequences.")
    if batch < predicted_batch:
        text += f" The cell diagnoses batch {batch}, as far as this page's time allows, and scales from there."
    grew = step_b / step_1
    text += (f" Measured: one step took {si(step_1, 's')} at batch 1 ({verdict_1}) and {si(step_b, 's')} at "
             f"batch {batch} ({verdict_b}), {grew:.2f} times as long, at {fraction_b:.1%} of the copy bandwidth.")
    if grew <= 1.5:
        text += (" The step stayed nearly flat, as the prediction assumes: what the batch-1 step paid for "
                 "(dispatch, reading the weights) is shared by every sequence, so batching is almost free here "
                 "until the per-sequence work catches up.")
    else:
        text += (f" The step did not stay flat: it grew {grew:.2f} times for {batch} times the sequences, so the "
                 "bandwidth fraction grew less than the batch. Something else grew with the batch: each "
                 "sequence's attention, activations and cache copies, and on a CPU the matrix products "
                 "themselves, whose time grows with the rows they multiply well before the copy bandwidth "
                 "binds. The prediction is an upper bound on what batching buys.")
    return solution(1, text)


def diagnosis_gqa(kv_heads_before: int, kv_heads_after: int, context: int, share_before: float,
                  share_after: float, measured_share: float, verdict_before: str, verdict_after: str) -> str:
    """Exercise 2 of 9.8: the retrieval step's KV share with grouped-query attention."""
    text = (f"`kvlab.theory.roofline.step_bytes` gives the weights $P w$ and the cache $b\\,s\\,K$, with "
            f"$K = 2 L n_{{kv}} d_h w$ proportional to the KV heads. Going from {kv_heads_before} to "
            f"{kv_heads_after} KV heads divides the cache by {kv_heads_before / kv_heads_after:g} (the key and value "
            f"projections shrink too, a little of the weights). At {context:,} cached tokens the KV share of "
            f"the step's bytes falls from {share_before:.1%} to a predicted **{share_after:.1%}**; the diagnosis "
            f"counts {measured_share:.1%}, cache writes included. The share is arithmetic; what the "
            f"measurement adds is the verdict: **{verdict_before}** before, **{verdict_after}** after.")
    if verdict_before == "kv" and verdict_after != "kv":
        text += (" The cache no longer limits the step: the lever worked, and the next limit is the one the "
                 "new verdict names. Run the path again from there.")
    elif verdict_after == "kv":
        text += (" The cache still dominates the bytes the step moves, so the verdict stays: a smaller cache "
                 "shortens the step but a longer context would bring it back; KV quantization or a window "
                 "cut it further.")
    else:
        text += (" The verdict did not rest on the cache before either: on this machine the step's time goes "
                 "to what the verdict names, and shrinking the cache changes its bytes, not its limit.")
    return solution(2, text)


def diagnosis_naive_ridge(ridge: float, element_size: int, closed_form: float, crossing: int, context: int,
                          intensity: float, verdict: str) -> str:
    """Exercise 3 of 9.8: the context above which a naive step passes the ridge point."""
    text = (f"A naive step reruns all $n = s + 1$ positions but reads the weights once: $2Pn$ FLOPs of "
            f"products over $P w$ bytes, plus attention FLOPs that grow as $n^2$. Its intensity is about "
            f"$2n / w$ FLOP per byte, so it passes this machine's ridge point of {ridge:.3g} FLOP/byte near "
            f"$n \\approx \\text{{ridge}} \\cdot w / 2$, about {closed_form:,.0f} positions (with $w$ = "
            f"{element_size} bytes). Counting the attention FLOPs too with `kvlab.theory.work.step_work`, the first such context "
            f"is **{crossing:,}** tokens. The page's naive step ran at {context:,} cached tokens, an intensity "
            f"of {intensity:.3g} FLOP/byte, ")
    past = intensity > ridge
    text += ("past the ridge point: " if past else "below the ridge point: ")
    if (verdict == "compute") == past:
        text += f"and its verdict, **{verdict}**, agrees with the arithmetic."
    elif past:
        text += (f"yet its verdict is **{verdict}**, not compute. The ridge point compares ceilings; the verdict "
                 "first asks whether the operators were busy at all, and on a CPU a step of a small model can "
                 "lose most of its time to dispatch, or reach neither ceiling, before the arithmetic matters.")
    else:
        text += (f"yet its verdict is **{verdict}**. The FLOP fraction came out above the bandwidth fraction "
                 "although the intensity is below the ridge point: the calibrated ceilings are single "
                 "measurements, and a step that reaches a small share of both can tip either way.")
    return solution(3, text)
