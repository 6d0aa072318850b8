"""Notebook 08, long-context variants (section 9.7): its readings."""

from __future__ import annotations

import math


def stream_reading(window: int, sinks: int, kl_before: float, kl_window: float, kl_sinks: float | None,
                   loss_full: float, loss_window: float, vocab: int, mass_first: float, t_end: int,
                   mass_recent: float) -> str:
    """Under the stream explorer: eviction's cost, and where the newest query's attention went."""
    text = []
    if kl_before < 1e-4:
        text.append(f"Before the cache fills, the bounded caches match full attention: the largest KL over "
                    f"the first $W$ positions is {kl_before:.0e} nats, rounding error.")
    else:
        text.append(f"Before the cache fills the bounded caches should match full attention exactly, but "
                    f"the largest KL over the first $W$ positions is {kl_before:.2g} nats: something was "
                    "evicted early, which is a bug to report.")
    after = f"{kl_window:.3f} nats for a {window}-token window"
    if kl_sinks is not None:
        after += f" and {kl_sinks:.3f} nats for {sinks} sinks plus the same window"
    if kl_window > 0:
        text.append(f"After $t = S + W$ the KL becomes positive; averaged past that point it is {after}.")
    else:
        text.append(f"After $t = S + W$ the KL should become positive, but it averages {after}: the "
                    "evicted tokens carried no weight in this model's attention.")
    uniform_loss = math.log(vocab)
    if abs(loss_window - loss_full) < 0.05 * loss_full:
        text.append(f"The next-token loss hardly moves ({loss_full:.3f} nats with the full cache, "
                    f"{loss_window:.3f} with the window).")
    else:
        text.append(f"The next-token loss moved from {loss_full:.3f} nats with the full cache to "
                    f"{loss_window:.3f} with the window.")
    if abs(loss_full - uniform_loss) < 0.1 * uniform_loss:
        text.append(f"Both sit near $\\ln V = {uniform_loss:.3f}$, because a random model predicts a random "
                    "stream no better than chance. KL against the full model is the sensitive measure.")
    else:
        text.append(f"The full cache's loss is away from $\\ln V = {uniform_loss:.3f}$, which a random model "
                    "on a random stream should sit near.")
    uniform_first, uniform_recent = 4 / t_end, window / t_end
    share = (f"Over the last 64 positions of the {t_end + 1}-token stream, the full cache's newest query "
             f"puts {mass_first:.4f} of its mass on the first four tokens, against {uniform_first:.4f} for "
             f"uniform attention, and {mass_recent:.2f} on the newest {window} tokens, against "
             f"{uniform_recent:.2f}.")
    if mass_first < 3 * uniform_first:
        text.append("**This model has no attention sinks, and the result says so.** " + share)
    else:
        text.append("**The first tokens draw more than their share here.** " + share + " A random model "
                    "has no reason to do that; a few large logits in its random projections can.")
    return " ".join(text)


def convention_reading(kl_original: float, kl_in_cache: float, gap: float) -> str:
    """Original positions against positions in the cache, with random weights."""
    if max(kl_original, kl_in_cache) <= 2 * min(kl_original, kl_in_cache):
        text = (f"With random weights both conventions move the output about equally far from full "
                f"attention ({kl_original:.4f} nats with original positions, {kl_in_cache:.4f} with "
                "positions in the cache).")
    else:
        text = (f"The two conventions moved the output by different amounts ({kl_original:.4f} nats with "
                f"original positions, {kl_in_cache:.4f} with positions in the cache); with random weights "
                "neither has a reason to be closer to full attention, so this is the particular stream.")
    return text + (f" They do give different outputs: their log-probabilities differ by up to {gap:.2g}. "
                   "The reason for in-cache positions is a trained model's limited position range, which "
                   "a random model does not have.")


def rerotation_reading(t_query: int, rms_error: float, tv_current: float, tv_own: float) -> str:
    """What rotating a cached key again does to the scores of a query at ``t_query``."""
    text = (f"Rotating the cached keys again by the current position changes the scores by {rms_error:.2f} "
            f"standard deviations of the correct scores (RMS). The attention distribution of the query at "
            f"$t = {t_query}$ moves by a total-variation distance of {tv_current:.2f}, and by {tv_own:.2f} "
            "when keys are rotated again by their own position.")
    if rms_error > 0.1:
        return text + (" These are not rounding errors. The scores are a different function of the keys, "
                       "and the decode is wrong from the first step after prefill.")
    return text + (" That is small for this query: its head happens to weigh the low-frequency dimensions, "
                   "which a rotation barely moves. The scores are still a different function of the keys, "
                   "and other heads and positions show it.")


def quant_reading(bits: int, group: int, pc_rms: float, pt_rms: float, pc_scores: float, pt_scores: float,
                  v_err: float, worst_prediction_gap: float, bytes_ratio: float) -> str:
    """Under the quantization explorer: key layouts, where the error enters, and the s/sqrt(12) model."""
    text = [f"At {bits} bits with groups of {group}, per-channel keys have an RMS error of **{pc_rms:.3f}** and "
            f"per-token keys **{pt_rms:.3f}**."]
    if pc_rms < pt_rms:
        text.append("A per-token group contains an outlier channel, so its step is set by the outlier and "
                    "every ordinary channel in it is rounded coarsely. A per-channel group contains one "
                    "channel only, and only the outlier channels pay for their range.")
    else:
        text.append("Per-channel keys were expected to win, because a per-token group's step is set by its "
                    "outlier channel; here they did not, which happens when the groups are so small that "
                    "a per-token group rarely spans an outlier.")
    text.append(f"Through the scores this becomes a relative output error of {pc_scores:.3f} (per-channel) "
                f"against {pt_scores:.3f} (per-token). The values, quantized per token, add {v_err:.3f} "
                "through the weighted sum. The two paths are separate, and a cache format has to control both.")
    if worst_prediction_gap < 0.25:
        text.append(f"The $s/\\sqrt{{12}}$ prediction matches every measured RMS error within "
                    f"{worst_prediction_gap:.0%}.")
    else:
        text.append(f"The $s/\\sqrt{{12}}$ prediction misses one measured RMS error by {worst_prediction_gap:.0%}: "
                    "at few bits and small groups the rounding errors are not uniform, because many "
                    "elements sit exactly on a group's minimum or maximum.")
    text.append(f"Counting scales and zero points as FP16, {bits}-bit per-channel keys take "
                f"{bytes_ratio:.1f} times fewer bytes than FP16 keys, not {16 // bits} times.")
    return " ".join(text)


def kivi_reading(bits: int, residual: int, bytes_ratio: float, kl_after: float, agree: float) -> str:
    """Under the KIVI explorer: bytes against the full cache, and what quantization moved."""
    text = (f"With {bits} bits and a residual of {residual} tokens, the cache holds **{bytes_ratio:.1f} times "
            "fewer bytes** than the FP32 cache, exactly as the arithmetic predicts (the cell asserts it). "
            f"Once quantization starts, the next-token distribution moves by {kl_after:.4f} nats on average.")
    if agree >= 0.9:
        return text + (f" The greedy next token still agrees with the full-precision cache's at {agree:.0%} "
                       "of positions.")
    return text + (f" The greedy next token agrees with the full-precision cache's at only {agree:.0%} of "
                   "positions: at this width a random model's next-token distribution is so flat that "
                   "small errors reorder its top tokens.")


def fewer_reading(gqa_bytes: float, gqa_kl: float, latent_bytes: float, latent_kl: float,
                  latent_full_kl: float) -> str:
    """Pooled GQA and the low-rank latent: bytes per token against the error they add."""
    text = (f"Pooling the multi-head model down to a single KV head ({gqa_bytes:,.0f} bytes per token) moves "
            f"its next-token distribution by {gqa_kl:.3f} nats. The smallest latent ({latent_bytes:,.0f} "
            f"bytes per token) moves it by {latent_kl:.3f} nats.")
    if latent_full_kl < 1e-6:
        return text + f" At full rank the latent cache is exact ({latent_full_kl:.1e} nats, rounding)."
    return text + (f" At full rank the latent cache should be exact, but it moved the output by "
                   f"{latent_full_kl:.1e} nats: more than rounding, so its factorisation lost something.")
