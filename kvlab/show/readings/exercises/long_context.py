"""Notebook 08, long-context variants (section 9.7): worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.exercises.folded import solution


def long_context_onset(S: int, W: int, onset_sinks: int, onset_window: int) -> str:
    """Exercise 1 of 9.7: where eviction first changes the output."""
    budget = S + W
    predicted = budget + 1
    text = (f"The cache holds $S + W$ = {budget} tokens. A position $t$ here counts the tokens seen, so up to "
            f"$t$ = {budget} (the plot's dashed line) nothing has been evicted, and the first prediction that "
            f"can differ is at **$t$ = {predicted}**, the first that needs an evicted token. A plain window of "
            f"$W$ = {budget} holds the same budget and evicts at the same moment, so its onset is the same; what "
            "differs after that is which tokens are gone (the very first ones, or those just past the sinks). "
            f"Measured: the first non-zero KL is at $t$ = {onset_sinks} with $S$ = {S}, $W$ = {W}, and at "
            f"$t$ = {onset_window} with $S$ = 0, $W$ = {budget}.")
    if onset_sinks == onset_window == predicted:
        text += " Both as predicted."
    else:
        text += (" Not where predicted: a KL below the detection threshold (10^-6 nats) at the first evicting "
                 "step would move the onset later, when the evicted token carried almost no attention.")
    return solution(1, text)


def long_context_outliers(flat: dict, aligned: dict) -> str:
    """Exercise 2 of 9.7: the key layouts without outliers, and with queries aligned to them."""
    winner_flat = min(flat, key=lambda k: flat[k]["rms"])
    winner_aligned = min(aligned, key=aligned.get)
    text = ("Without outliers every channel has the same scale, so a per-channel group's range is set by "
            "ordinary values, as is a per-token group's: **neither layout has an advantage**, and both RMS "
            f"errors should be close. Measured at 2 bits: per-channel {flat['per-channel keys']['rms']:.3f}, "
            f"per-token {flat['per-token keys']['rms']:.3f} ({winner_flat} slightly ahead). With the outliers "
            "back and queries that read mostly the outlier channels, the error that matters is the one on "
            "those channels. Per-channel groups give each outlier channel its own coarse scale; per-token "
            "groups store each token's minimum and maximum, usually the outlier elements, exactly, so the "
            "prediction is that **per-token keys win through the scores**. Measured relative error of the "
            f"attention output: per-channel {aligned['per-channel keys']:.3f}, per-token "
            f"{aligned['per-token keys']:.3f}.")
    if winner_aligned == "per-token keys":
        text += " Per-token wins, as predicted: which layout is better depends on what the queries read."
    else:
        text += (" Per-channel still wins: at this group size the per-token groups' coarse steps on the many "
                 "ordinary channels outweigh the exact outliers, even for these queries.")
    return solution(2, text)


def long_context_kivi_bytes(bits: int, residual: int, predicted: float, measured: float, full: float) -> str:
    """Exercise 3 of 9.7: the bytes a 4-bit KIVI cache holds with no residual."""
    text = (f"With residual 0 every whole group of tokens is quantized as soon as it fills: `kvlab.theory.cache_sizes.kivi_nbytes` "
            f"(packed {bits}-bit codes, plus an FP32 scale and zero point per group, plus the tokens of an "
            f"unfinished group at full precision) gives **{si(predicted, 'B')}**, against {si(full, 'B')} "
            f"for the FP32 cache, {full / predicted:.1f} times fewer. The bar measured {si(measured, 'B')}.")
    if predicted == measured:
        text += " Exactly the prediction."
    else:
        text += (f" {ratio_text(measured, predicted)} the prediction: check the group size and metadata width "
                 "the cache was built with.")
    return solution(3, text)


def long_context_conventions(gap_no_sinks: float, gap_sinks: float) -> str:
    """Exercise 4 of 9.7: the two position conventions with and without sinks."""
    text = ("RoPE makes a score depend only on the distance between query and key. A window without sinks is "
            "one contiguous run of tokens, so renumbering it from zero (positions in cache) keeps every distance: "
            "the two conventions should give **the same outputs**, up to rounding. Measured, the largest log-prob "
            f"difference is {gap_no_sinks:.2g} without sinks, against {gap_sinks:.2g} with 4 sinks. With sinks "
            "the conventions differ only in how far away the sinks seem: at their original positions they drift "
            "ever further from the query, beyond any distance seen in training once the stream outgrows the "
            "training context; renumbered, they stay just before the window. So the convention matters "
            "**with sinks**, and for a model trained at short context positions-in-cache is the safe one "
            "(StreamingLLM's choice).")
    if gap_no_sinks > 1e-3:
        text += (" Here the two conventions also differed without sinks, more than rounding: check that both "
                 "caches evict at the same step.")
    return solution(4, text)


def long_context_trained(max_share: float, uniform: float, loss_s1: float, loss_s4: float, window: int,
                         gap_small: float, gap_large: float, windows: tuple) -> str:
    """Exercise 5 of 9.7: sinks and window size on the trained model."""
    sinks = max_share > 5 * uniform
    text = (f"The sink measurement is the guide. The largest share of attention on the first token was "
            f"{max_share:.2f}, against {uniform:.3f} for uniform attention: "
            + ("the model has a sink head, and the sink is the first token itself. Keeping one sink keeps it, "
               "so three more should change the loss little. " if sinks else
               "no head sinks its attention, so keeping the first tokens should not matter, one or four. ")
            + f"Measured after the window fills (W = {window}): {loss_s1:.3f} nats with one sink, {loss_s4:.3f} "
            f"with four, a change of {loss_s4 - loss_s1:+.3f}.")
    text += (f" For the second question: past the training context the full cache meets distances it never "
             f"saw, the window does not. The gap between their mean losses after the fill was "
             f"{gap_small:+.3f} nats at W = {windows[0]} and {gap_large:+.3f} at W = {windows[1]}: ")
    if abs(gap_large) < abs(gap_small):
        text += "closer with the larger window, which keeps more of the context the full cache also sees."
    else:
        text += ("not closer: the larger window's extra tokens lie at distances the model handles well, and "
                 "the full cache's loss past the training context is set by the distances beyond it.")
    return solution(5, text)
