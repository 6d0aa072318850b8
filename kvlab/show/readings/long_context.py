"""Notebook 08, long-context variants (section 9.7): its readings.

Most are measured on SmolLM2-135M-Instruct (Q4_1-dequantized, ``kvlab.pretrained_model()``). Every
verdict is taken by a rule of ``kvlab.theory.long_context``: what counts as an attention sink
(``sink_heads``), as an outlier channel (``keys_have_outliers``), and as a difference larger than
the noise (``Spread.resolved``, a 95% interval over independent pieces of the text). The branch
that contradicts the literature says what was expected, what was measured and the likely reason.
"""

from __future__ import annotations

import math

from kvlab._checks import instance, real, reals, unmeasured
from kvlab.theory import long_context as rules
from kvlab.theory.cache_sizes import ROUNDING_TOLERANCE, rounding_explains, rounding_rms


def _decimals(half_width: float) -> int:
    """Enough decimals to show a 95% half width to two significant figures (at least 2)."""
    return 2 if half_width <= 0 or half_width >= 0.1 else 1 - math.floor(math.log10(half_width))


def _signed(x: float, decimals: int) -> str:
    text = f"{x:+.{decimals}f}"
    return "±" + text[1:] if float(text) == 0 else text  # no "-0.00"


def spread_text(sp: rules.Spread, pieces: str) -> str:
    """``"+0.29 nats per token (95% interval +0.18 to +0.40 over 13 blocks of positions)"``, with
    more decimals when the interval is narrow."""
    instance("pieces", pieces, str)
    d = _decimals(sp.half_width)
    return (
        f"{_signed(sp.mean, d)} nats per token (95% interval {_signed(sp.low, d)} to"
        f" {_signed(sp.high, d)} over {sp.n} {pieces})"
    )


def _ranges(numbers) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5 and 9"``."""
    numbers = sorted(set(numbers))
    runs, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            runs.append(f"{start}" if start == n else f"{start}–{n}")
            start = None
    return ", ".join(runs[:-1]) + (" and " if len(runs) > 1 else "") + runs[-1] if runs else "none"


def model_reading(name: str, params: int, shape, context: int, tokens: int, dtype: str) -> str:
    """What the page measures on: the pretrained model and the text."""
    instance("name", name, str)
    instance("dtype", dtype, str)
    return (
        f"The measurements below run on **{name}** ({params / 1e6:.1f} M parameters; {shape.layers}"
        f" layers, {shape.q_heads} query heads sharing {shape.kv_heads} KV heads of dimension"
        f" {shape.head_dim}, RoPE, a {context:,}-token training context), in {dtype}, with weights"
        " dequantized from the Q4_1 GGUF file that kvlab loads offline: every finding here is"
        " about that 4-bit-rounded copy ([the model card](../book/models.md)). The text is the"
        " held-out King James text that ships with kvlab (Ruth and Jonah, public domain),"
        f" {tokens:,} tokens in this model's tokenizer."
    )


def check_reading(num_sink: int, window: int, steps: int, gap: float, stored: int) -> str:
    """The masked pass against ``SinkCache`` streamed token by token (the cell asserts they
    agree)."""
    if missing := unmeasured(gap=gap):
        return missing
    return (
        f'Streamed token by token through `SinkCache({num_sink}, {window}, rope="cache")`, {steps}'
        " tokens of the text give the same next-token log-probabilities as the masked pass, to"
        f" {gap:.1e} (fp32 rounding), and the cache ends holding {stored} tokens per layer, its"
        " bound. The sweep below can therefore run one forward pass per cache instead of one per"
        " token."
    )


def sink_reading(share, share_shifted, uniform: float, tokens: int) -> str:
    """Under the sink heat map. ``share[layer][head]``: mean share of attention on the first token
    of a passage starting at the text's first token; ``share_shifted``: the same for a passage
    starting in the middle of a verse."""
    uniform = real("uniform", uniform)
    heads = rules.sink_heads(share, uniform)
    shifted = rules.sink_heads(share_shifted, uniform)
    total = len(share) * len(share[0])
    top = max((s, layer, head) for layer, row in enumerate(share) for head, s in enumerate(row))
    definition = (
        "By this page's one definition, a head is an **attention sink** when its queries put on"
        f" average at least {rules.SINK_SHARE:.0%} of their attention on the first token (the"
        " threshold of [Gu et al. 2025](../book/references.md)) and at least"
        f" {rules.SINK_FACTOR:.0f} times the {uniform:.3f} that uniform attention over this"
        f" {tokens}-token passage would give it. "
    )
    if heads:
        layers = sorted({layer for layer, _, _ in heads})
        text = (
            definition + f"**{len(heads)} of the model's {total} heads are sinks**, in layers"
            f" {_ranges(layers)}; the strongest (layer {top[1]}, head {top[2]}) puts {top[0]:.0%}"
            f" of its attention on the first token, {top[0] / uniform:.0f} times the uniform"
            " share. "
        )
    else:
        text = (
            definition
            + f"**No head is a sink here**: the largest share is {top[0]:.0%} (layer {top[1]},"
            " head "
            f"{top[2]}). StreamingLLM found sinks in every large model it examined "
            "([Xiao et al. 2024](../book/references.md)); this run did not. "
        )
    if shifted and heads:
        return (
            text
            + f"The passage that starts in the middle of a verse has {len(shifted)} sink heads too:"
            " the sink is the first *position*, whatever token fills it."
        )
    if heads:
        return (
            text
            + "The passage that starts in the middle of a verse has none: here the sink belongs to"
            " the text's first token, not to the first position."
        )
    if shifted:
        return (
            text
            + f"Yet the passage that starts in the middle of a verse has {len(shifted)}: the first "
            "position draws attention there."
        )
    return text


def stream_reading(sinks: int, budget: int, n: int, ppl: dict, spreads: dict, stride: int) -> str:
    """Under the streaming explorer, for ``sinks`` sinks beside a window of ``budget - sinks``.

    ``ppl``: perplexity after the cache fills of ``"full"``, ``"window"`` (no sinks), ``"sinks"``
    (this setting), and, at the recomputed positions, ``"recompute"`` and ``"sinks at recompute"``.
    ``spreads`` (``Spread`` of the second loss minus the first): ``"window - full"``, ``"window -
    sinks"``, ``"sinks - full"``, ``"recompute - sinks"``; the ``sinks`` ones are absent when sinks
    is 0.
    """
    if missing := unmeasured(**{f"ppl[{k!r}]": v for k, v in ppl.items()}):
        return missing
    blocks = "blocks"
    label = f"{sinks} sink{'s' if sinks != 1 else ''} plus a window of {budget - sinks}"
    text = [
        f"Over positions $t \\ge B$ = {budget} to {n - 2} (after the cache first evicts), the"
        f" perplexity is **{ppl['full']:.1f}** with the full cache ({n - 1}"
        f" tokens held at the end) and **{ppl['window']:.1f}** with the window alone ({budget}"
        " tokens)"
        + (f", **{ppl['sinks']:.1f}** with {label} (the same {budget} tokens)." if sinks else ".")
    ]
    worse = spreads["window - full"]
    if worse.resolved and worse.mean > 0:
        text.append(
            f"Evicting the first tokens costs the window alone {spread_text(worse, blocks)} against"
            " the full cache: the collapse StreamingLLM reports once the sinks leave the window."
        )
    else:
        text.append(
            "StreamingLLM expects the window alone to collapse once it evicts the first tokens;"
            f" here its loss differs from the full cache's by {spread_text(worse, blocks)}, within"
            " the noise."
        )
    if not sinks:
        return " ".join(text) + " Move the slider to keep sinks."
    back = spreads["window - sinks"]
    if back.resolved and back.mean > 0:
        text.append(f"Keeping {sinks} of them buys back {spread_text(back, blocks)}.")
    else:
        text.append(
            f"Keeping {sinks} of them was expected to buy that back; the difference from the window"
            f" alone is {spread_text(back, blocks)}, within the noise."
        )
    rest = spreads["sinks - full"]
    if rest.resolved and rest.mean > 0:
        text.append(
            f"What remains, {spread_text(rest, blocks)} above the full cache, is what the evicted"
            " middle of the text carried."
        )
    else:
        text.append(f"It ends within the noise of the full cache ({spread_text(rest, blocks)}).")
    rec = spreads["recompute - sinks"]
    where = (
        f"At the positions where the window was recomputed from scratch (every {stride}th),"
        " recomputation gives"
        f" {ppl['recompute']:.1f} against {ppl['sinks at recompute']:.1f} for the sinks"
    )
    if not rec.resolved:
        text.append(
            f"{where}: a difference of {spread_text(rec, 'blocks')}, within the noise, as"
            " StreamingLLM found (it matches the recomputed window at a fraction of the work)."
        )
    elif rec.mean > 0:
        text.append(
            f"{where}: the sinks are better by {spread_text(rec, 'blocks')}. StreamingLLM found the"
            " two about equal; a likely reason here is that the cached window's keys were computed"
            " when each token still saw further back, while a recomputed window starts blind at"
            " its first token."
        )
    else:
        text.append(
            f"{where}: recomputation is better by {spread_text(rec, 'blocks')}. StreamingLLM found"
            " the two about equal; here the sinks' window pays for what its entries lost when"
            " their neighbours left."
        )
    return " ".join(text)


def sink_count_reading(
    budget: int,
    ppl_by_sinks: dict,
    one_vs_four: rules.Spread,
    conventions: rules.Spread,
    n: int,
    context: int,
    convention_sinks: int,
) -> str:
    """After the sweep: perplexity against the number of sinks at a fixed budget, and the two
    position conventions. ``one_vs_four``: loss with 4 sinks minus loss with 1; ``conventions``:
    loss with keys at positions in the cache minus at their original positions."""
    if missing := unmeasured(**{f"ppl_by_sinks[{s}]": p for s, p in ppl_by_sinks.items()}):
        return missing
    row = ", ".join(f"{s}: {p:.1f}" for s, p in sorted(ppl_by_sinks.items()))
    text = [
        f"At a fixed cache of {budget} tokens, the perplexity after the fill by number of sinks is"
        f" {row}."
    ]
    blocks = "blocks"
    if one_vs_four.resolved and one_vs_four.mean < 0:
        text.append(
            f"Four sinks beat one by {spread_text(one_vs_four, blocks)}: the model spreads its sink"
            " over more than the first token, as StreamingLLM found for the models behind its"
            " choice of four."
        )
    elif one_vs_four.resolved:
        text.append(
            f"Four sinks are worse than one by {spread_text(one_vs_four, blocks)}: the sink is the"
            " first token alone, and each further sink costs the window a recent token."
        )
    else:
        text.append(
            f"Four sinks against one: {spread_text(one_vs_four, blocks)}, within the noise."
            " StreamingLLM keeps four; here one already recovers the window, and this run cannot"
            " tell one from four."
        )
    within = not rules.unseen_distances(n, context)
    keys = (
        f"With {convention_sinks} sinks, keys at their positions inside the cache (StreamingLLM's"
        " convention, "
        '`rope="cache"`) against keys at their original positions:'
        f" {spread_text(conventions, blocks)}."
    )
    if not conventions.resolved:
        text.append(
            keys
            + (
                f" Within the noise, as expected while the {n}-token stream stays inside the"
                f" model's {context:,}-token training context: no query meets a key at a distance"
                " it never saw."
                if within
                else (
                    " Within the noise, although the stream is longer than the training "
                    "context: the sinks' large distances did not matter to this model."
                )
            )
        )
    else:
        text.append(
            keys
            + (
                " A real difference, although no distance here exceeds the training context: the"
                " two conventions score the sinks at different distances, and this model's heads"
                " tell them apart."
                if within
                else (
                    " A real difference: beyond the training context, only the "
                    "in-cache positions keep every distance inside what the model was trained on."
                )
            )
        )
    return " ".join(text)


def channel_reading(key_ratio_by_layer, value_ratio_by_layer, key_ratios, value_ratios) -> str:
    """Under the channel-magnitude figure. ``*_ratio_by_layer``: the largest channel RMS over its
    head's median, per layer; ``*_ratios``: every (layer, head, channel) ratio, flattened."""
    key_ratio_by_layer = reals("key_ratio_by_layer", key_ratio_by_layer, 0)
    value_ratio_by_layer = reals("value_ratio_by_layer", value_ratio_by_layer, 0)
    key_ratios = reals("key_ratios", key_ratios, 0)
    value_ratios = reals("value_ratios", value_ratios, 0)
    keys, values = rules.outlier_count(key_ratios), rules.outlier_count(value_ratios)
    text = (
        f"Per layer, the largest key channel is {min(key_ratio_by_layer):.1f} to"
        f" {max(key_ratio_by_layer):.1f} times its head's median channel (RMS over the passage),"
        f" the largest value channel {min(value_ratio_by_layer):.1f} to"
        f" {max(value_ratio_by_layer):.1f} times. Counting channels at {rules.OUTLIER_FACTOR:.0f}"
        f" times their median or more: {keys} of {len(key_ratios):,} key channels and {values} of"
        f" {len(value_ratios):,} value channels. "
    )
    if rules.keys_have_outliers(key_ratios, value_ratios):
        return (
            text
            + "**The keys have outlier channels that the values mostly lack**: the pattern KIVI and"
            " KVQuant report ([Liu et al. 2024](../book/references.md), [Hooper et al."
            " 2024](../book/references.md)), measured here."
        )
    return (
        text
        + "**The keys have no more outlier channels than the values** here, unlike the models KIVI"
        " and KVQuant describe, so their argument for per-channel key groups has less to work"
        " with."
    )


def kivi_layout_reading(
    ppl: dict, full_ppl: float, spreads: dict, windows: int, length: int, group: int
) -> str:
    """Under the KIVI-layout figure. ``ppl[(bits, layout)]`` with layout ``"channel"`` or
    ``"token"`` (how keys are grouped; values are per token in both); ``spreads[bits]``: loss with
    per-token keys minus loss with per-channel keys, a ``Spread`` over the text windows."""
    if missing := unmeasured(full_ppl=full_ppl):
        return missing
    text = [
        f"Over {windows} windows of {length} tokens (groups of {group}, no residual), the"
        f" full-precision cache scores a perplexity of {full_ppl:.1f}."
    ]
    for bits in sorted(spreads, reverse=True):
        sp, c, t = spreads[bits], ppl[bits, "channel"], ppl[bits, "token"]
        head = f"At {bits} bits, per-channel keys give {c:.1f} and per-token keys {t:.1f}"
        gap = spread_text(sp, "windows")
        if sp.resolved and sp.mean > 0:
            text.append(
                f"{head}: per-token keys lose {gap}, larger than the spread: **KIVI's choice,"
                " measured**."
            )
        elif sp.resolved:
            text.append(
                f"{head}: per-channel keys lose {gap}. KIVI predicts the opposite; a likely reason"
                " is that a group of tokens of one channel spans keys that RoPE rotated"
                " differently."
            )
        else:
            text.append(
                f"{head}: a difference of {gap}, **within the spread**, so this run does not show"
                " that either layout is better at this width."
            )
    return " ".join(text)


def fp8_reading(
    full_ppl: float, fp8_ppl: float, spread: rules.Spread, bytes_held: dict, int4_ppl: float
) -> str:
    """Beside the KIVI layouts: the FP8 (E4M3) cache engines ship. ``spread``: loss with the FP8
    cache minus loss with the full cache, over the text windows; ``bytes_held`` ``{"full", "fp8",
    "int4"}``: what each cache holds for the same tokens; ``int4_ppl``: 4-bit groups, keys per
    channel."""
    if missing := unmeasured(full_ppl=full_ppl, fp8_ppl=fp8_ppl, int4_ppl=int4_ppl):
        return missing
    gap = spread_text(spread, "windows")
    verdict = "larger than the spread" if spread.resolved else "**within the spread**"
    return (
        "An FP8 cache, E4M3 with one scale per layer for the keys and one for the values (what vLLM"
        ' and SGLang ship as `kv_cache_dtype="fp8"`), holds'
        f" {bytes_held['full'] / bytes_held['fp8']:.1f} times less than the full cache and scores"
        f" {fp8_ppl:.1f} against its {full_ppl:.1f}: {gap}, {verdict}. The 4-bit groups hold"
        f" {bytes_held['fp8'] / bytes_held['int4']:.1f} times less again and score {int4_ppl:.1f}:"
        " a float keeps every element within 2^-4 of itself under one scale, integer groups buy"
        " their extra saving with a scale and a zero point per group."
    )


def kivi_residual_quality_reading(
    bits: int, residual: int, length: int, with_residual: dict, without: dict
) -> str:
    """KIVI as its paper runs it, beside the worst case: ``with_residual`` and ``without`` are
    ``quantized_cache_quality`` results (``ppl``, ``nbytes``) at ``bits`` with per-channel keys."""
    if missing := unmeasured(with_residual=with_residual["ppl"], without=without["ppl"]):
        return missing
    return (
        "KIVI as its paper runs it keeps the newest tokens exact: at"
        f" {bits} bits with a residual of {residual} of each window's {length} tokens, the cache"
        f" scores {with_residual['ppl']:.1f},"
        f" against {without['ppl']:.1f} with no residual (the worst case above), and holds"
        f" {with_residual['nbytes'] / without['nbytes']:.1f} times the bytes; over a long context"
        " its bytes fade and its exact recent tokens stay."
    )


def needle_reading(probes: list, num_sink: int, window: int, answer: str) -> str:
    """Under the needle figure. ``probes``: ``kvlab.lab.streams.NeedleProbe`` at several depths;
    the answer's probability is ``exp(-nll)`` of its tokens together."""
    instance("probes", probes, (list, tuple), "a list")
    instance("answer", answer, str)
    kept = [p for p in probes if p.in_cache]
    lost = [p for p in probes if not p.in_cache]

    def chance(nll: float) -> str:
        return f"{math.exp(-nll):.2g}"

    full = ", ".join(chance(p.full_nll) for p in probes)
    text = [
        f"With the full cache the model completes the number{answer} with probability {full} for"
        f" the needle at depths {', '.join(f'{p.depth:g}' for p in probes)}: it copies the fact"
        " from wherever it sits."
    ]
    if lost:
        worst = max(p.evicting_nll - p.full_nll for p in lost)
        text.append(
            f"With {num_sink} sinks and a window of {window}, the needle {_distances(lost)} tokens"
            f" back has left the cache, and the answer's probability falls to"
            f" {', '.join(chance(p.evicting_nll) for p in lost)}: up to {worst:.1f} nats lost"
            " on one short answer, far more than the stream above loses per token."
        )
    if kept:
        text.append(
            f"Where the needle is still in the window ({_distances(kept)} tokens back) the"
            f" evicting cache scores {', '.join(chance(p.evicting_nll) for p in kept)}, as the full"
            " one does."
        )
    return " ".join(text)


def _distances(probes) -> str:
    return ", ".join(f"{p.distance:,}" for p in probes)


def fewer_reading(rows: list, same_bytes: rules.Spread, gqa: str, latent: str) -> str:
    """Under the fewer-entries figure. ``rows``: ``kvlab.lab.cache_quality.fewer_entries`` (full
    cache first); ``same_bytes``: loss of ``latent`` minus loss of ``gqa`` (the pooled GQA cache and
    the latent of the same bytes per token), over blocks of positions."""
    instance("rows", rows, (list, tuple), "a list")
    instance("gqa", gqa, str)
    instance("latent", latent, str)
    by = {r["name"]: r for r in rows}
    full, g, lat = rows[0], by[gqa], by[latent]
    latents = [r for r in rows if r["name"].startswith("latent")]
    table = [
        "| cache | bytes per token | perplexity | KL from full (nats) |",
        "|---|---:|---:|---:|",
    ]
    table += [
        f"| {r['name']} | {r['bytes_per_token']:,.0f} | {r['ppl']:,.1f} | {r['kl']:.3g} |"
        for r in rows
    ]
    text = (
        f"The full cache stores {full['bytes_per_token']:,.0f} bytes per token and scores"
        f" {full['ppl']:.1f}. Pooling the KV heads ({gqa}, {g['bytes_per_token']:,.0f} bytes)"
        f" raises the perplexity to {g['ppl']:,.0f}; the latent of the same size ({latent}) gives"
        f" {lat['ppl']:,.0f}. "
    )
    gap = f"the latent's loss minus the pooled cache's is {spread_text(same_bytes, 'blocks')}"
    if same_bytes.resolved:
        better = "latent" if same_bytes.mean < 0 else "pooled GQA"
        text += f"At equal bytes the {better} cache is better: {gap}. "
    else:
        text += f"At equal bytes the two are within the noise of each other: {gap}. "
    text += (
        "The latent's error falls with its rank and is rounding at full rank (rank"
        f" {latents[-1]['name'].split()[-1]}: KL {latents[-1]['kl']:.1e} nats). These are raw"
        " costs: GQA models are uptrained after pooling ([Ainslie et al."
        " 2023](../book/references.md)), and DeepSeek-V2 trains its latent from the start"
        " ([DeepSeek-AI 2024](../book/references.md))."
    )
    return text + "\n\n" + "\n".join(table)


def rerotation_reading(
    t_query: int, layer: int, rms_error: float, tv_current: float, tv_own: float
) -> str:
    """What rotating a cached key again does to the scores of a query at ``t_query``."""
    if missing := unmeasured(rms_error=rms_error, tv_current=tv_current, tv_own=tv_own):
        return missing
    return (
        f"On layer {layer} of the model, rotating the cached keys again by the current position"
        f" changes the scores of the query at $t = {t_query}$ by {rms_error:.2f} standard"
        " deviations of the correct scores (RMS), and moves its attention distribution by a"
        f" total-variation distance of {tv_current:.2f} ({tv_own:.2f} when keys are rotated again"
        " by their own position). The scores are now a function of $-p$ instead of $t - p$: the"
        " decode is wrong from the first step after prefill."
    )


def quant_reading(
    bits: int,
    group: int,
    pc_rms: float,
    pt_rms: float,
    pc_scores: float,
    pt_scores: float,
    v_err: float,
    measured: dict,
    steps: dict,
    bytes_ratio: float,
) -> str:
    """Under the quantization explorer (synthetic keys with outlier channels). ``measured`` and
    ``steps`` map each (bits, layout) to the RMS error and the RMS quantization step."""
    if missing := unmeasured(
        pc_rms=pc_rms, pt_rms=pt_rms, pc_scores=pc_scores, pt_scores=pt_scores, v_err=v_err
    ):
        return missing
    text = [
        f"At {bits} bits with groups of {group}, per-channel keys have an RMS error of"
        f" **{pc_rms:.3f}** and per-token keys **{pt_rms:.3f}**."
    ]
    # The order the rounding model predicts from each layout's quantization step, step / sqrt(12).
    pred_pc, pred_pt = (
        rounding_rms(steps[bits, layout]) for layout in ("per-channel keys", "per-token keys")
    )
    predicted = (
        "the uniform-rounding model, step/$\\sqrt{12}$ of each layout's RMS step, predicts "
        f"{pred_pc:.3f} per-channel against {pred_pt:.3f} per-token"
    )
    if (pred_pc < pred_pt) != (pc_rms < pt_rms):
        text.append(
            f"That is the opposite of the order {predicted}: the rounding errors are far from"
            " uniform at these settings (see below), so the steps alone do not rank the two"
            " layouts."
        )
    elif pc_rms < pt_rms:
        text.append(
            f"Per-channel keys are finer, as {predicted}: in a per-token group the outlier sets"
            " the step for every channel, in a per-channel group only the outlier channels pay for"
            " their range."
        )
    else:
        text.append(
            f"Per-token keys are finer here, as {predicted}: per-channel keys were expected to win,"
            " because a per-token group's step is set by its outlier channel, but with groups this"
            " small a per-token group rarely spans an outlier."
        )
    text.append(
        f"Through the scores this becomes a relative output error of {pc_scores:.3f} (per-channel)"
        f" against {pt_scores:.3f} (per-token). The values, quantized per token, add {v_err:.3f}"
        " through the weighted sum. The two paths are separate, and a cache format has to control"
        " both."
    )
    missed = [key for key in measured if not rounding_explains(measured[key], steps[key])]
    if not missed:
        text.append(
            f"The rounding model matches every measured RMS error within {ROUNDING_TOLERANCE:.0%}."
        )
    else:
        b, layout = missed[0]
        text.append(
            f"The uniform-rounding model, RMS error = step/$\\sqrt{{12}}$, misses {len(missed)} of"
            f" the {len(measured)} measured errors by more than {ROUNDING_TOLERANCE:.0%} (first:"
            f" {b}-bit, {layout}): at few bits and small groups the rounding errors are not"
            " uniform, because many elements sit exactly on a group's minimum or maximum."
        )
    text.append(
        f"Counting scales and zero points as FP16, {bits}-bit per-channel keys take "
        f"{bytes_ratio:.1f} times fewer bytes than FP16 keys, not {16 // bits} times."
    )
    return " ".join(text)


def kivi_reading(
    bits: int, residual: int, bytes_ratio: float, kl_after: float, agree: float
) -> str:
    """Under the KIVI decode-loop explorer (random weights): bytes against the full cache, and what
    quantization moved."""
    if missing := unmeasured(kl_after=kl_after, agree=agree):
        return missing
    return (
        f"With {bits} bits and a residual of {residual} tokens, the cache holds **{bytes_ratio:.1f}"
        " times fewer bytes** than the FP32 cache, exactly as the arithmetic predicts (the cell"
        " asserts it). Once quantization starts, the next-token distribution moves by"
        f" {kl_after:.4f} nats on average and the greedy next token agrees with the full-precision"
        f" cache's at {agree:.0%} of positions. Random weights give a nearly flat next-token"
        " distribution: this shows the mechanism, and the pretrained model above shows the cost."
    )
