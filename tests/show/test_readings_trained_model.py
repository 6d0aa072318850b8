"""Readings of section 9.7 on the KJV model (kvlab.show.readings.trained_model), fed both outcomes
of the page's sink rule and of its test against the noise (kvlab.theory.long_context)."""

import re
import statistics

from kvlab.show.readings import trained_model as r
from kvlab.theory import long_context as lc

NOISE = [0.3, -0.1, 0.2, -0.4, 0.0, 0.1]


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def spread(scale: float) -> lc.Spread:
    """A Spread whose mean is ``scale`` times its half width (resolved when |scale| > 1)."""
    centred = [d - statistics.fmean(NOISE) for d in NOISE]
    half = lc.paired_spread([0.0] * len(NOISE), centred).half_width
    return lc.paired_spread([0.0] * len(NOISE), [d + scale * half for d in centred])


def test_model_reading_quotes_the_card():
    card = dict(
        params=4_196_608,
        layers=4,
        q_heads=4,
        kv_heads=2,
        head_dim=64,
        train_tokens=1_224_000,
        epochs=1.18,
        steps=400,
        train_minutes=30.005,
        context=256,
        heldout_ppl=71.857,
        heldout_books="Ruth and Jonah",
    )
    text = no_roles(r.model_reading(card))
    assert (
        "4.2 M parameters" in text
        and "30 minutes" in text
        and "1,224,000" in text
        and "71.9" in text
    )


def row(name, sink_heads):
    return dict(
        name=name,
        params=4_196_608,
        train_tokens="1,224,000",
        sink_heads=sink_heads,
        heads=16,
        max_share=0.25,
        window=80.0,
        sinks=79.5,
        key_ratio=3.2,
    )


def test_contrast_reading_both_outcomes():
    uniform = 0.02
    at = lc.sink_threshold(uniform)
    none = lc.sink_heads([[0.9 * at, 0.1]], uniform)
    some = lc.sink_heads([[1.1 * at, 0.1]], uniform)
    assert not none and len(some) == 1
    small = row("SmolLM2-135M-Instruct", 40)
    plain = no_roles(r.contrast_reading(small, row("KJV model", len(none)), none, spread(0.9), 64))
    assert "**The KJV model has no sink head**" in plain and "within the noise" in plain
    assert "| sink heads | 40 of 16 | 0 of 16 |" in plain and "Gu et al. 2025" in plain
    formed = no_roles(r.contrast_reading(small, row("KJV model", len(some)), some, spread(1.1), 64))
    assert "1 sink head(s)" in formed and "Its window still gains from 4 sinks" in formed
    assert "makes its window worse" in r.contrast_reading(
        small, row("KJV model", 0), none, spread(-1.1), 64
    )
