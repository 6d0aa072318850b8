"""Notebook 08, long-context variants (section 9.7): readings measured on the book's trained model.

Each function takes the numbers a cell measured with ``kvlab.trained_model()`` and returns the
Markdown under it; where the sentence depends on the outcome (does this model have attention sinks,
do the sinks rescue the window, do its keys have outlier channels, does per-channel grouping win),
both outcomes are written, and the other branch says what was expected and the likely reason.
"""

from __future__ import annotations

from kvlab.show.format import si

SINK_SHARE = 0.25  # a head is a sink head when a quarter or more of its attention goes to the first token
SINK_FACTOR = 4.0  # ... and that is at least this many times what uniform attention would give it
OUTLIER_FACTOR = 4.0  # an outlier channel: RMS at least this many times its head's median channel
LOSS_MARGIN = 0.05  # nats per token: a difference smaller than this is reported as no difference
QUALITY_MARGIN = 0.01  # perplexities within 1% of each other are reported as the same


def _heads(share, uniform: float) -> list[tuple[int, int, float]]:
    """(layer, head, share) of every sink head in a ``[layers][heads]`` nested list."""
    return [(l, h, s) for l, row in enumerate(share) for h, s in enumerate(row)
            if s >= SINK_SHARE and s >= SINK_FACTOR * uniform]


def model_reading(m: dict) -> str:
    """What the trained model is, from the figures its training run wrote (``trained.metrics()``)."""
    return (f"The model has **{m['params'] / 1e6:.1f} M parameters** ({m['layers']} layers, {m['q_heads']} query "
            f"heads sharing {m['kv_heads']} KV heads of dimension {m['head_dim']}), saw {m['train_tokens']:,} "
            f"training tokens ({m['epochs']:.1f} passes over the text) in windows of {m['context']} tokens, and "
            f"scores a perplexity of **{m['heldout_ppl']:.1f}** on {m['heldout_books']}, which it never saw. "
            f"Asked to continue *{m['prompt']}*, it writes: \"{m['sample']}\"")


def sink_reading(share_bos, share_plain, uniform: float, tokens: int) -> str:
    """Under the sink heat maps: which heads are sinks, on a passage that starts with ``<s>`` and on
    one that starts with an ordinary word. ``share_*`` are ``[layers][heads]`` nested lists."""
    layers, heads = len(share_bos), len(share_bos[0])
    bos = _heads(share_bos, uniform)
    plain = _heads(share_plain, uniform)
    top = max((s, l, h) for l, row in enumerate(share_bos) for h, s in enumerate(row))
    head = (f"Over a {tokens}-token held-out passage, uniform attention would give the first token "
            f"{uniform:.3f} of each query's attention on average. ")
    if bos:
        text = head + (f"**This model has attention sinks**: {len(bos)} of its {layers * heads} heads put at "
                       f"least {SINK_SHARE:.0%} of their attention on the first token, `<s>`; the strongest "
                       f"(layer {top[1]}, head {top[2]}) puts {top[0]:.0%} there, {top[0] / uniform:.0f} times "
                       f"the uniform share. The sinks formed in training; nobody put them there. ")
    else:
        text = head + (f"**This model shows no attention sinks**: no head puts {SINK_SHARE:.0%} of its attention "
                       f"on the first token (the largest share is {top[0]:.0%}, in layer {top[1]}, head "
                       f"{top[2]}, {top[0] / uniform:.0f} times the uniform share). StreamingLLM found sinks in every large model it examined; a model this small "
                       f"and this briefly trained need not have formed them, which is itself the finding. ")
    if plain and bos:
        text += (f"When the passage starts with an ordinary word instead, {len(plain)} heads still treat the first "
                 f"token as a sink: the sink is the first *position*, whatever token fills it.")
    elif bos:
        text += ("When the passage starts with an ordinary word instead, no head treats it as a sink: this model "
                 "sinks its attention into the `<s>` token it always saw first in training, not into whatever "
                 "comes first. A streaming cache must therefore keep `<s>` itself.")
    elif plain:
        text += (f"Starting the passage with an ordinary word, {len(plain)} heads do treat that first token as a "
                 f"sink, so the first position draws attention even though `<s>` does not.")
    return text


def stream_reading(loss: dict, nbytes: dict, window: int, sinks: int, context: int, full_short: float,
                   full_long: float) -> str:
    """Under the streaming figure. ``loss`` maps each cache to its mean next-token loss (nats) after
    the window filled; ``nbytes`` to the bytes it holds at the end of the stream."""
    win, snk, rec = loss["window"], loss["sinks + window"], loss["recompute"]
    text = [f"After the window filled, the mean next-token loss was {loss['full']:.2f} nats with the full cache "
            f"({si(nbytes['full'], 'B')}), {win:.2f} with the {window}-token window alone "
            f"({si(nbytes['window'], 'B')}), {snk:.2f} with {sinks} sink{'s' if sinks != 1 else ''} plus the window "
            f"({si(nbytes['sinks + window'], 'B')}), and {rec:.2f} when each step recomputes its window from "
            f"scratch ({window} tokens of work per layer per step instead of one)."]
    if win - snk > LOSS_MARGIN:
        text.append(f"Evicting the first tokens costs the window {win - snk:.2f} nats per token, and keeping "
                    f"{sinks} of them buys it back to within {abs(snk - rec):.2f} nats of recomputation: "
                    "StreamingLLM's result, reproduced on a model trained here.")
    else:
        text.append(f"Keeping the sinks changed the loss by only {win - snk:+.2f} nats. StreamingLLM expects the "
                    "window alone to fail once the first tokens are evicted; it does not fail here, which is "
                    "likely because this small model's heads do not lean on the first token strongly enough (see "
                    "the sink measurement above), so losing it costs little.")
    if rec - win > LOSS_MARGIN:
        text.append(f"Recomputing is worse than the cached window here, by {rec - win:.2f} nats: a recomputed "
                    "window starts with an ordinary word at position 0, where every training window had `<s>`, "
                    "while the cached window's entries were computed when each token could still see further "
                    "back.")
    else:
        text.append("Recomputation, at its quadratic cost, is as good as or better than the cached window, as "
                    "StreamingLLM found.")
    if full_long - full_short > LOSS_MARGIN:
        text.append(f"The full cache keeps everything and still gets worse past the {context}-token training "
                    f"context ({full_short:.2f} nats before, {full_long:.2f} after): its queries meet keys at "
                    "distances the model never saw in training. More memory is not more context.")
    else:
        text.append(f"The full cache holds up past the {context}-token training context ({full_short:.2f} nats "
                    f"before, {full_long:.2f} after): on this text the nearby tokens carry the prediction and the "
                    "unseen distances cost little.")
    return " ".join(text)


def outlier_reading(key_ratio: float, value_ratio: float, key_outliers: int, value_outliers: int,
                    channels: int) -> str:
    """Under the channel-RMS figure: the largest channel against its head's median, keys and values;
    ``*_outliers`` count the (layer, head, channel) triples at least ``OUTLIER_FACTOR`` above it."""
    text = (f"The largest key channel has {key_ratio:.1f} times the RMS of its head's median channel; the "
            f"largest value channel {value_ratio:.1f} times. ")
    if key_outliers > value_outliers and key_ratio >= OUTLIER_FACTOR:
        return text + (f"**This model's keys have outlier channels**: {key_outliers} of {channels} key channels "
                       f"are {OUTLIER_FACTOR:.0f} times their median or more, against {value_outliers} value "
                       "channels. That is the pattern KIVI and KVQuant report for large models, measured here "
                       "rather than assumed, and it is why per-token key groups waste their range.")
    return text + (f"**This model's keys have no more outlier channels than its values** ({key_outliers} against "
                   f"{value_outliers} of {channels} channels at {OUTLIER_FACTOR:.0f} times the median or more). "
                   "Large models show a few key channels tens of times larger than the rest; a small model "
                   "trained briefly need not develop them, so the argument for per-channel key groups is "
                   "weaker here.")


def quant_reading(ppl: dict, agree: dict, nbytes: dict, full_ppl: float, full_bytes: int) -> str:
    """Under the KV-quantization figure. ``ppl``, ``agree`` and ``nbytes`` map ``(bits, layout)`` with
    layout ``"channel"`` or ``"token"`` (how keys are grouped) to perplexity, top-1 agreement with the
    full-precision cache, and cache bytes."""
    c2, t2 = ppl[(2, "channel")], ppl[(2, "token")]
    text = [f"With the full-precision cache the perplexity is {full_ppl:.2f}. At 8 bits it is "
            f"{ppl[(8, 'channel')]:.2f}, at 4 bits {ppl[(4, 'channel')]:.2f}, at 2 bits {c2:.2f} (keys grouped "
            f"per channel, KIVI's layout); the greedy next token agrees with full precision at "
            f"{agree[(8, 'channel')]:.1%}, {agree[(4, 'channel')]:.1%} and {agree[(2, 'channel')]:.1%} of "
            f"positions. The 2-bit cache holds {si(nbytes[(2, 'channel')], 'B')} against "
            f"{si(full_bytes, 'B')}, {full_bytes / nbytes[(2, 'channel')]:.1f} times less, scales and zero "
            "points included."]
    if t2 > c2 * (1 + QUALITY_MARGIN):
        text.append(f"Grouping 2-bit keys per token instead raises the perplexity to {t2:.2f}, "
                    f"{t2 / c2 - 1:.1%} more: KIVI's argument holds on this model. A per-token group spans every "
                    "channel of one key, so its step is set by the key's largest channel and the smaller ones are "
                    "rounded coarsely; the more uneven the channels, the larger the gap.")
    else:
        relation = "lower than" if t2 < c2 * (1 - QUALITY_MARGIN) else f"within {QUALITY_MARGIN:.0%} of"
        text.append(f"Grouping 2-bit keys per token gives {t2:.2f}, {relation} per channel. KIVI expects per-token "
                    "key groups to lose because a few outlier channels set every group's step; where a model has "
                    "few such channels (see the channel measurement above), per-token groups lose little by "
                    "spanning the channels, and per-channel groups pay instead for spanning tokens whose keys "
                    "RoPE has rotated differently.")
    return " ".join(text)
