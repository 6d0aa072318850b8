"""Readings of section 9.5 (kvlab.show.readings.paged_attention), each outcome-dependent sentence fed both
outcomes. The other sections' readings are tested in tests/show/test_readings_<section>.py.
"""

import re
from types import SimpleNamespace

from kvlab.show.readings import paged_attention


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def _sim(waste, batch, steps, preemptions=0, meta=120):
    return SimpleNamespace(waste_fraction=waste, mean_batch=batch, steps=steps, preemptions=preemptions,
                           peak_metadata_bytes=meta)


def test_paged_event_reading_names_shared_blocks():
    snap = {"event": "B forks", "tables": {"B": ([3, 4], 11), "B'": ([3, 4], 11)}, "refs": [0, 0, 0, 2, 2] + [0] * 11}
    text = no_roles(paged_attention.event_reading(snap, 4, 16))
    assert "blocks 3, 4 are shared" in text and "2 of 16" in text
    alone = {"event": "A arrives", "tables": {"A": ([0], 5)}, "refs": [1] + [0] * 15}
    assert "no block is shared" in paged_attention.event_reading(alone, 0, 16)


def test_paged_waste_both_outcomes():
    pred = {"reserve-max": 0.67, "paged": 0.04}
    wins = no_roles(paged_attention.waste_reading(
        {"reserve-max": _sim(0.67, 7.1, 300), "reserve-estimate": _sim(0.43, 9, 250),
         "paged": _sim(0.043, 20.5, 100, preemptions=12)}, pred, "lognormal", 16, 4096, 120))
    loses = no_roles(paged_attention.waste_reading(
        {"reserve-max": _sim(0.30, 7.1, 300), "reserve-estimate": _sim(0.43, 9, 250),
         "paged": _sim(0.45, 6.0, 320)}, pred, "uniform", 128, 4096, 120))
    assert "**4.3%**" in wins and "3.0 times sooner" in wins and "12 preemptions" in wins
    assert "no less than reserving the maximum" in loses and "no preemption" in loses and "sooner" not in loses


def test_paged_attention_and_preemption_both_outcomes():
    gap = no_roles(paged_attention.attention_reading(4096, "gather", 0.5e9, 1.1e9, 5e9))
    kernel_gap = no_roles(paged_attention.attention_reading(4096, "triton", 0.5e9, 1.1e9, 5e9))
    even = no_roles(paged_attention.attention_reading(4096, "gather", 1.1e9, 1.1e9, 5e9))
    assert "2.2 times as long" in gap and "the gather" in gap
    assert "kernel's own efficiency" in kernel_gap and "kept up" in even
    swap = no_roles(paged_attention.preemption_reading(384, 0.1, 0.0005, 1.6e6, 2))
    rec = no_roles(paged_attention.preemption_reading(384, 0.001, 0.003, 1.6e6, 2))
    assert "Swap was 200 times cheaper" in swap and "Recompute was 3.0 times cheaper" in rec
