"""kvlab.show.readings.kv_layout: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re
from types import SimpleNamespace

from kvlab.show.readings import kv_layout


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def _read(median, predicted=1e-3, kv_bytes=33.6e6, frac=0.4):
    return SimpleNamespace(timing=SimpleNamespace(median=median), predicted_s=predicted, kv_bytes=kv_bytes,
                           kv_bytes_per_s=kv_bytes / median, fraction_of_copy=frac)


def test_kv_layout_table_is_a_pipe_table_with_ratios():
    reads = {"BHTD": _read(0.010), "BTHD": _read(0.016), "NHD": _read(0.027), "HND": _read(0.027)}
    text = no_roles(kv_layout.layout_table(reads, 7.4e9, 2, 4096))
    assert "|---|---:|---:|---:|" in text and "| `NHD` (gather) |" in text and "| 1.6 |" in text
    assert "batch 2, context 4,096" in text and "7.4 GB/s" in text


def test_kv_layout_append_both_outcomes():
    usual = no_roles(kv_layout.append_reading(0.012, 5e-6, 9e-5, 0.018, 4096))
    odd = no_roles(kv_layout.append_reading(0.012, 1e-6, 9e-5, 0.006, 4096))
    assert "smaller than the byte ratio" in usual and "1.5 times the read" in usual
    assert "at least the byte ratio" in odd and "expected to take longer" in odd and "0.5 times" in odd


def test_kv_layout_explorer_and_gqa_both_outcomes():
    appends = {"index": SimpleNamespace(timing=SimpleNamespace(median=5e-6))}
    on = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(1.2e-3), appends))
    slow = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(4e-3), appends))
    fast = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(0.3e-3), appends))
    assert "about the copy bandwidth" in on and "slower than its bytes" in slow and "faster than its bytes" in fast
    assert "index 5 µs" in on
    follows = no_roles(kv_layout.gqa_reading(8, 2, 4, 3.5))
    less = no_roles(kv_layout.gqa_reading(8, 2, 4, 1.5))
    more = no_roles(kv_layout.gqa_reading(8, 2, 4, 9.0))
    assert "Time follows bytes" in follows and "fell less" in less and "fell more" in more
