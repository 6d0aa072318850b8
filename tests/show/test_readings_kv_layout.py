"""kvlab.show.readings.kv_layout: every decision fed measurements on both sides of the bytes model's
boundary, the measurements built from real caches' traffic (kvlab.lab.layout_timing) and the
boundary from kvlab.theory.kv_traffic (CONTRIBUTING.md, readings).
"""

import re

from kvlab.cache.layout import new_cache
from kvlab.lab.layout_timing import AppendMeasurement, ReadMeasurement, append_traffic, read_traffic
from kvlab.lab.timing import Timing
from kvlab.show.readings import kv_layout
from kvlab.theory.agreement import factor_edges
from kvlab.theory.kv_traffic import BYTES_TOLERANCE

BETA = 8e9  # a calibrated copy bandwidth, bytes/s


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def _t(seconds):
    return Timing(seconds, seconds, seconds, (seconds,))


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


def past(tolerance=BYTES_TOLERANCE):
    """Factors 10% past each edge of the agreement band, and one inside it."""
    low, high = factor_edges(1.0, tolerance)
    return 0.9 * low, 1.0, 1.1 * high


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


def test_explore_reading_on_both_sides_of_the_bytes_model():
    appends = {"index": append("index", 5e-6)}
    below, within, above = (read(f) for f in past())
    llc_big, llc_small = 1 << 30, 1 << 10
    fast_cached = no_roles(kv_layout.explore_reading("BHTD", 256, below, appends, llc_big))
    fast_not = no_roles(kv_layout.explore_reading("BHTD", 256, below, appends, llc_small))
    on = no_roles(kv_layout.explore_reading("BHTD", 256, within, appends, llc_big))
    slow = no_roles(kv_layout.explore_reading("BHTD", 256, above, appends, None))
    assert (
        "beat its bytes" in fast_cached
        and "fit in this device's 1.07 GB last-level cache" in fast_cached
    )
    assert "do not fit" in fast_not and "calibration" in fast_not
    assert "about its ceilings" in on and "bytes model" in on and "index 5 µs" in on
    assert "slower than its bytes" in slow
    assert "within the factor 1.25" in on


def test_gqa_reading_three_ways():
    # Four times fewer KV heads: the model's byte ratio is 4; measured ratios past each edge of it.
    mha = read(1.0, kv_heads=8)
    small_t = mha.timing.median / (mha.predicted_s / read(1.0, kv_heads=2).predicted_s)
    low, high = factor_edges(
        small_t, BYTES_TOLERANCE
    )  # the small read's time at which the outcome changes
    fell_more = read(seconds=0.9 * low, kv_heads=2)
    follows = read(seconds=small_t, kv_heads=2)
    fell_less = read(seconds=1.1 * high, kv_heads=2)
    llc = (mha.kv_bytes + fell_more.kv_bytes) // 2  # the small cache fits, the large one does not
    more = no_roles(kv_layout.gqa_reading(mha, fell_more, llc))
    assert "fell more than the bytes" in more and "smaller cache fits" in more
    assert "same side" in kv_layout.gqa_reading(mha, fell_more, None)
    assert "Time follows bytes" in kv_layout.gqa_reading(mha, follows, llc)
    assert "fell less than the bytes" in kv_layout.gqa_reading(mha, fell_less, llc)
    assert "cut the cache by 4 times" in more


def test_append_reading_branches():
    r = read(1.0, context=256)
    index_pred = append("index", 1.0).predicted_s
    cat_pred = append("cat", 1.0).predicted_s
    # The index append's time at the model's byte ratio, and on both sides of it.
    at_ratio = r.timing.median / (r.predicted_s / index_pred)
    low, high = factor_edges(at_ratio, BYTES_TOLERANCE)
    usual = no_roles(
        kv_layout.append_reading(
            r,
            append("index", 1.1 * high),
            append("slot", 9e-5, layout="NHD"),
            append("cat", cat_pred * r.timing.median / r.predicted_s),
        )
    )
    assert "below the byte ratio, as expected" in usual and "As its bytes say" in usual
    odd = kv_layout.append_reading(
        r,
        append("index", 0.9 * low),
        append("slot", 9e-5, layout="NHD"),
        append("cat", 1.1 * BYTES_TOLERANCE * cat_pred),
    )
    assert "should have kept it below" in odd and "More than its bytes say" in odd
    less = kv_layout.append_reading(
        r,
        append("index", 1.1 * high),
        append("slot", 9e-5, layout="NHD"),
        append("cat", 0.9 * cat_pred / BYTES_TOLERANCE),
    )
    assert "Less than its bytes say" in less
