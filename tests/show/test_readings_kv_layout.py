"""kvlab.show.readings.kv_layout: every decision fed measurements on both sides of the bytes model's
boundary, the measurements built from real caches' traffic (kvlab.lab.layout_timing) and the
boundary from kvlab.theory.kv_traffic (CONTRIBUTING.md, readings).
"""

import re

from kvlab.cache.layout import new_cache
from kvlab.lab.layout_timing import AppendMeasurement, ReadMeasurement, append_traffic, read_traffic
from kvlab.lab.timing import Timing
from kvlab.show.readings import kv_layout
from kvlab.theory.agreement import edges

BETA = 8e9  # a calibrated copy bandwidth, bytes/s


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def _t(seconds):
    return Timing(seconds, seconds, seconds, (seconds,))  # no spread: the 10% floor decides


def read(factor=1.0, layout="BHTD", batch=2, context=256, kv_heads=4, seconds=None):
    """A read whose time is ``factor`` times the bytes model's prediction for a real cache's
    traffic."""
    cache = new_cache(layout, batch=batch, length=context, kv_heads=kv_heads, head_dim=16)
    kv, moved = read_traffic(cache)
    t = factor * moved / BETA if seconds is None else seconds
    return ReadMeasurement(
        layout, batch, context, 8, kv_heads, 16, "float32", _t(t), kv, moved, BETA, BETA
    )


def append(method, seconds, layout="BHTD", batch=2, context=256, kv_heads=4):
    cache = new_cache(layout, batch=batch, length=context, kv_heads=kv_heads, head_dim=16)
    new, moved = append_traffic(cache, method)
    return AppendMeasurement(
        layout, method, batch, context, kv_heads, 16, "float32", _t(seconds), new, moved, BETA
    )


def past(spread=0.0):
    """Factors 10% past each disagreement edge, one inside the agreement band, and one in the
    cannot-tell band above it."""
    lo_dis, _, hi_agree, hi_dis = edges(1.0, spread)
    return 0.9 * lo_dis, 1.0, 1.1 * hi_dis, (hi_agree * hi_dis) ** 0.5


def test_layout_table_is_a_pipe_table_with_ratios():
    reads = {
        "BHTD": read(seconds=0.010),
        "BTHD": read(seconds=0.016),
        "NHD": read(seconds=0.027, layout="NHD"),
        "HND": read(seconds=0.027, layout="HND"),
    }
    from kvlab.lab.hardware import Ceiling

    text = no_roles(kv_layout.layout_table(reads, Ceiling("read", 8e9, 0.05, "B/s"), 6e9, 2, 4096))
    assert "|---|---:|---:|---:|---:|" in text and "| `NHD` (gather) |" in text
    assert "| 1.6 |" in text and "served partly from the last-level cache" not in text
    fast = dict(reads, BHTD=read(seconds=1e-5))
    text = no_roles(kv_layout.layout_table(fast, Ceiling("read", 8e9, 0.05, "B/s"), 6e9, 2, 4096))
    assert "`BHTD` read faster than the read bandwidth" in text
    assert "batch 2, context 4,096" in text and "8 GB/s" in text and "6 GB/s" in text


def test_explore_reading_on_every_side_of_the_bytes_model():
    appends = {"index": append("index", 5e-6)}
    below, within, above, unsure = (read(f) for f in past())
    llc_big, llc_small = 1 << 30, 1 << 10

    def text(r, llc):
        return no_roles(kv_layout.explore_reading("BHTD", 256, r, appends, llc, 0.0))

    fast_cached, fast_not = text(below, llc_big), text(below, llc_small)
    on, slow, middle = text(within, llc_big), text(above, None), text(unsure, None)
    assert (
        "beat its bytes" in fast_cached
        and "fit in this device's 1.07 GB last-level cache" in fast_cached
    )
    assert "do not fit" in fast_not and "calibration" in fast_not
    assert "about its ceilings" in on and "bytes model" in on and "index 5 µs" in on
    assert "slower than its bytes" in slow and "disagrees" in slow
    assert "agrees" in on and "cannot tell" in middle and "slower than its bytes" not in middle


def test_gqa_reading_on_every_side():
    # Four times fewer KV heads: the model's byte ratio is 4; measured ratios past each edge of it.
    mha = read(1.0, kv_heads=8)
    small_t = mha.timing.min / (mha.predicted_s / read(1.0, kv_heads=2).predicted_s)
    lo_dis, lo_agree, hi_agree, hi_dis = edges(small_t, 0.0)  # the small read's edges
    fell_more = read(seconds=0.9 * lo_dis, kv_heads=2)
    follows = read(seconds=small_t, kv_heads=2)
    fell_less = read(seconds=1.1 * hi_dis, kv_heads=2)
    unsure = read(seconds=(hi_agree * hi_dis) ** 0.5, kv_heads=2)
    llc = (mha.kv_bytes + fell_more.kv_bytes) // 2  # the small cache fits, the large one does not
    more = no_roles(kv_layout.gqa_reading(mha, fell_more, llc))
    assert "fell more than the bytes" in more and "smaller cache fits" in more
    assert "same side" in kv_layout.gqa_reading(mha, fell_more, None)
    assert "Time follows bytes" in kv_layout.gqa_reading(mha, follows, llc)
    assert "fell less than the bytes" in kv_layout.gqa_reading(mha, fell_less, llc)
    assert "cannot tell" in kv_layout.gqa_reading(mha, unsure, llc)
    assert "cut the cache by 4 times" in more


def test_append_reading_on_every_side():
    r = read(1.0, context=256)
    cat_pred = append("cat", 1.0).predicted_s
    at_model = cat_pred * r.timing.min / r.predicted_s  # the cat time the bytes model predicts
    lo_dis, _, hi_agree, hi_dis = edges(at_model, 0.0)

    def text(cat_seconds):
        return no_roles(
            kv_layout.append_reading(
                r,
                append("index", 5e-6),
                append("slot", 9e-5, layout="NHD"),
                append("cat", cat_seconds),
            )
        )

    usual = text(at_model)
    assert "As its bytes say" in usual and "moves 256 times the append's new bytes" in usual
    assert "checked once before timing" in usual
    assert "More than its bytes say" in text(1.1 * hi_dis)
    assert "Less than its bytes say" in text(0.9 * lo_dis)
    middle = text((hi_agree * hi_dis) ** 0.5)
    assert "cannot tell" in middle and "bytes say" not in middle


def test_page_attributes_each_layout_to_the_engine_that_uses_it():
    """Issue 32: NHD is vLLM's FlashAttention backend's and FlashInfer's name, not the PagedAttention
    kernel's; that kernel's K blocks split the head vector in 16-byte pieces."""
    import json
    from pathlib import Path

    page = Path(__file__).parents[2] / "notebooks" / "04_kv_layout.ipynb"
    text = "".join(
        "".join(c["source"])
        for c in json.loads(page.read_text())["cells"]
        if c["cell_type"] == "markdown"
    )
    nhd_row = next(line for line in text.splitlines() if line.startswith("| `NHD`"))
    assert "FlashInfer" in nhd_row and "Kwon" not in nhd_row
    assert "$[N, H, D/x, S, x]$" in text and "16\\,\\text{bytes} / w" in text
    assert "$[N, H, D, S]$" in text
