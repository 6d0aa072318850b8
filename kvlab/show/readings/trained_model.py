"""Notebook 08, long-context variants (section 9.7): the book's trained KJV model, the contrast to
the pretrained one.

``model_reading`` says what the model is, from the figures its training run wrote
(``kvlab.lab.trained.metrics()``); ``contrast_reading`` sets the page's measurements on SmolLM2
beside the same measurements on the KJV model, with the page's one definition of a sink
(``kvlab.theory.long_context.sink_heads``) and its test of a difference against the noise
(``Spread.resolved``), and says what the literature reports about when sinks emerge (Gu et al.
2025).
"""

from __future__ import annotations

from kvlab._checks import instance
from kvlab.show.readings.long_context import spread_text
from kvlab.theory import long_context as rules


def model_reading(m: dict) -> str:
    """What the trained model is, from the figures its training run wrote
    (``trained.metrics()``)."""
    instance("m", m, dict)
    return (
        f"The model has **{m['params'] / 1e6:.1f} M parameters** ({m['layers']} layers,"
        f" {m['q_heads']} query heads sharing {m['kv_heads']} KV heads of dimension"
        f" {m['head_dim']}), was trained for {m['train_minutes']:.0f} minutes on"
        f" {m['train_tokens']:,} tokens of the King James Bible ({m['epochs']:.1f} passes,"
        f" {m['steps']} steps) in windows of {m['context']} tokens, and scores a perplexity of"
        f" **{m['heldout_ppl']:.1f}** on {m['heldout_books']}, which it never saw."
    )


def contrast_reading(
    small: dict, kjv: dict, kjv_sinks: list, kjv_rescue: rules.Spread, budget: int
) -> str:
    """The contrast: the same measurements on SmolLM2 (``small``) and the KJV model (``kjv``). Each
    dict has ``name``, ``params``, ``train_tokens`` (text), ``sink_heads``, ``heads``,
    ``max_share``, ``window``, ``sinks`` (perplexity after the fill), ``key_ratio``; ``kjv_sinks``
    are the KJV model's sink heads and ``kjv_rescue`` its loss with the window alone minus with 4
    sinks."""
    instance("small", small, dict)
    instance("kjv", kjv, dict)
    instance("kjv_sinks", kjv_sinks, (list, tuple), "a list")
    rows = [
        ("parameters", lambda m: f"{m['params'] / 1e6:.1f} M"),
        ("training tokens", lambda m: m["train_tokens"]),
        ("sink heads", lambda m: f"{m['sink_heads']} of {m['heads']}"),
        ("largest share on the first token", lambda m: f"{m['max_share']:.0%}"),
        (f"perplexity, window alone ($B$ = {budget})", lambda m: f"{m['window']:.1f}"),
        ("perplexity, 4 sinks + window", lambda m: f"{m['sinks']:.1f}"),
        ("largest key channel / median", lambda m: f"{m['key_ratio']:.1f}"),
    ]
    table = [f"| | {small['name']} | {kjv['name']} |", "|---|---:|---:|"]
    table += [f"| {label} | {cell(small)} | {cell(kjv)} |" for label, cell in rows]
    if kjv_sinks:
        text = (
            f"The KJV model has {len(kjv_sinks)} sink head(s) by the same definition: even its"
            " short training on one book formed some."
        )
    else:
        text = (
            "**The KJV model has no sink head** by the same definition: no head puts "
            f"{rules.SINK_SHARE:.0%} of its attention on the first token."
        )
    if kjv_rescue.resolved and kjv_rescue.mean > 0:
        text += (
            " Its window still gains from 4 sinks,"
            f" {spread_text(kjv_rescue, 'blocks of positions')}."
        )
    elif kjv_rescue.resolved:
        text += (
            " Keeping 4 sinks makes its window worse,"
            f" {spread_text(kjv_rescue, 'blocks of positions')}: the sinks take four recent tokens'"
            " slots and give the model nothing it relies on."
        )
    else:
        text += (
            " Keeping 4 sinks changes its window's loss by"
            f" {spread_text(kjv_rescue, 'blocks of positions')}, within the noise: without sinks"
            " there is nothing to rescue."
        )
    text += (
        " The literature says when sinks appear: they emerge during pre-training once the model is"
        " optimised effectively on enough data, are absent when the training data are too few, and"
        " form later and weaker with smaller learning rates ([Gu et al."
        f" 2025](../book/references.md)). The KJV model saw {kjv['train_tokens']} tokens; SmolLM2"
        f" was trained on {small['train_tokens']} ([Ben Allal et al. 2025](../book/references.md))."
    )
    return "\n".join(table) + "\n\n" + text
