"""Notebook 08, long-context variants (section 9.7): worked solutions of the exercises that have
numbers."""

from __future__ import annotations

from kvlab._checks import instance, integer, unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.exercises.folded import solution
from kvlab.show.readings.long_context import spread_text
from kvlab.theory.long_context import Spread, first_eviction, same_up_to_rounding

ONSET_NATS = 1e-4  # a loss that differs by less is the same loss (fp32 rounding of one masked pass)


def long_context_onset(
    sinks: int, budget: int, onset_sinks: int, onset_window: int, tokens: int
) -> str:
    """Exercise 1 of 9.7: where eviction first changes the output of the pretrained model."""
    sinks = integer("sinks", sinks, 0)
    budget = integer("budget", budget, 0)
    onset_sinks = integer("onset_sinks", onset_sinks, 0)
    onset_window = integer("onset_window", onset_window, 0)
    tokens = integer("tokens", tokens, 0)
    predicted = first_eviction(sinks, budget - sinks)
    text = (
        "Position $t$ predicts token $t + 1$ from the $t + 1$ tokens up to it. A cache of $S + W$"
        f" = {budget} tokens holds them all up to $t$ = {predicted - 1}, so the first prediction"
        f" that can differ from the full cache's is at **$t$ = {predicted}**"
        " (`kvlab.theory.long_context.first_eviction`), the first whose query misses a token. The"
        f" window alone ($S$ = 0, $W$ = {budget}) holds the same budget and evicts at the same"
        " step; what differs after that is which token is gone (the very first, or the one just"
        f" past the sinks). Measured on the {tokens}-token text, the first loss that differs from"
        f" the full cache's by more than {ONSET_NATS:g} nats is at $t$ = {onset_sinks} with $S$ ="
        f" {sinks} and at $t$ = {onset_window} with $S$ = 0."
    )
    if onset_sinks == onset_window == predicted:
        text += " Both as predicted."
    else:
        text += (
            " Not where predicted: an evicted token that carried almost no attention moves the"
            f" loss by less than {ONSET_NATS:g} nats at the first evicting step, which puts the"
            " measured onset later."
        )
    return solution(1, text)


def long_context_outliers(flat: dict, aligned: dict) -> str:
    """Exercise 2 of 9.7: the key layouts without outliers, and with queries aligned to them."""
    instance("flat", flat, dict)
    instance("aligned", aligned, dict)
    winner_flat = min(flat, key=lambda k: flat[k]["rms"])
    winner_aligned = min(aligned, key=aligned.get)
    text = (
        "Without outliers every channel has the same scale, so a per-channel group's range is set"
        " by ordinary values, as is a per-token group's: **neither layout has an advantage**, and"
        " both RMS errors should be close. Measured at 2 bits: per-channel"
        f" {flat['per-channel keys']['rms']:.3f}, per-token {flat['per-token keys']['rms']:.3f}"
        f" ({winner_flat} slightly ahead). With the outliers back and queries that read mostly the"
        " outlier channels, the error that matters is the one on those channels. Per-channel"
        " groups give each outlier channel its own coarse scale; per-token groups store each"
        " token's minimum and maximum, usually the outlier elements, exactly, so the prediction is"
        " that **per-token keys win through the scores**. Measured relative error of the attention"
        f" output: per-channel {aligned['per-channel keys']:.3f}, per-token"
        f" {aligned['per-token keys']:.3f}."
    )
    if winner_aligned == "per-token keys":
        text += (
            " Per-token wins, as predicted: which layout is better depends on what the queries"
            " read."
        )
    else:
        text += (
            " Per-channel still wins: at this group size the per-token groups' coarse steps on the"
            " many ordinary channels outweigh the exact outliers, even for these queries."
        )
    return solution(2, text)


def long_context_kivi_bytes(
    bits: int, residual: int, predicted: float, measured: float, full: float
) -> str:
    """Exercise 3 of 9.7: the bytes a 4-bit KIVI cache holds with no residual."""
    if missing := unmeasured(measured=measured):
        return solution(3, missing)
    text = (
        "With residual 0 every whole group of tokens is quantized as soon as it fills:"
        f" `kvlab.theory.cache_sizes.kivi_nbytes` (packed {bits}-bit codes, plus an FP32 scale and"
        " zero point per group, plus the tokens of an unfinished group at full precision) gives"
        f" **{si(predicted, 'B')}**, against {si(full, 'B')} for the FP32 cache,"
        f" {full / predicted:.1f} times fewer. The bar measured {si(measured, 'B')}."
    )
    if predicted == measured:
        text += " Exactly the prediction."
    else:
        text += (
            f" {ratio_text(measured, predicted)} the prediction: check the group size and metadata"
            " width the cache was built with."
        )
    return solution(3, text)


def long_context_conventions(gap_no_sinks: float, gap_sinks: float) -> str:
    """Exercise 4 of 9.7: the two position conventions with and without sinks."""
    if missing := unmeasured(gap_no_sinks=gap_no_sinks, gap_sinks=gap_sinks):
        return solution(4, missing)
    text = (
        "RoPE makes a score depend only on the distance between query and key. A window without"
        " sinks is one contiguous run of tokens, so renumbering it from zero (positions in cache)"
        " keeps every distance: the two conventions should give **the same outputs**, up to fp32"
        " rounding (`kvlab.theory.long_context.same_up_to_rounding`). Measured, the largest"
        f" log-prob difference is {gap_no_sinks:.2g} without sinks, against {gap_sinks:.2g} with 4"
        " sinks. With sinks the conventions differ only in how far away the sinks seem: at their"
        " original positions they drift ever further from the query, beyond any distance seen in"
        " training once the stream outgrows the training context; renumbered, they stay just"
        " before the window. So the convention matters **with sinks**, and for a model trained at"
        " short context positions-in-cache is the safe one (StreamingLLM's choice)."
    )
    if not same_up_to_rounding(gap_no_sinks):
        text += (
            " Here the two conventions also differed without sinks, more than rounding: check that"
            " both caches evict at the same step."
        )
    return solution(4, text)


def long_context_sinks(
    sink_heads: int,
    heads: int,
    one_vs_four: Spread,
    kjv_heads: int,
    kjv_rescue: Spread,
    budget: int,
) -> str:
    """Exercise 5 of 9.7: one sink or four on the pretrained model; sinks or none on the KJV model.
    Both use the page's one definition of a sink head (``kvlab.theory.long_context.sink_heads``)."""
    heads = integer("heads", heads)
    sink_heads = integer("sink_heads", sink_heads, 0, heads + 1)
    kjv_heads = integer("kjv_heads", kjv_heads, 0)
    budget = integer("budget", budget)
    instance("one_vs_four", one_vs_four, Spread)
    instance("kjv_rescue", kjv_rescue, Spread)
    if missing := unmeasured(one_vs_four=one_vs_four.mean, kjv_rescue=kjv_rescue.mean):
        return solution(5, missing)
    if sink_heads:
        text = (
            f"The heat map is the guide: by the page's definition SmolLM2 has {sink_heads} sink"
            f" heads of {heads}, each measured by its attention on the first token. One sink keeps"
            " that token, so the prediction is that three more change the loss little at a fixed"
            f" budget of {budget} tokens, and may cost a little, since each takes a slot from the"
            " window. "
        )
    else:
        text = (
            "The heat map is the guide: by the page's definition SmolLM2 has no sink head of its"
            f" {heads}, so the prediction is that the number of sinks matters little at a fixed"
            f" budget of {budget} tokens. "
        )
    text += f"Measured, four sinks against one: {spread_text(one_vs_four, 'blocks of positions')}: "
    if one_vs_four.resolved:
        text += "a real difference; " + (
            "four are better, so the sink is not the first token alone. "
            if one_vs_four.mean < 0
            else "four are worse, as predicted. "
        )
    else:
        text += "within the noise, as predicted. "
    expect = "should not matter" if not kjv_heads else "should matter, as on SmolLM2"
    text += (
        f"The KJV model has {kjv_heads} sink heads by the same definition, so keeping its first"
        f" tokens {expect}. Measured, the window alone minus 4 sinks plus the window:"
        f" {spread_text(kjv_rescue, 'blocks of positions')}: "
    )
    if kjv_rescue.resolved and kjv_rescue.mean > 0:
        text += "a real gain" + (
            ", although no head meets the sink threshold: its first tokens matter in a weaker way."
            if not kjv_heads
            else ", as predicted."
        )
    else:
        text += "no gain beyond the noise" + (
            ", as predicted." if not kjv_heads else ", although it has sink heads."
        )
    return solution(5, text)
