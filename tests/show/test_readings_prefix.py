"""Readings of the prefix-caching section, each fed every outcome it distinguishes."""

import re

import pytest

from kvlab.show.readings import prefix_caching as r


def clean(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_identity_table():
    text = clean(r.identity_reading([("reference", 40, None, 32), ("a space added", 41, 17, 16)], 16))
    assert "| a space added | 41 | 17 | 16 | 1 |" in text and "| reference | 40 | none | 32 | 2 |" in text


@pytest.mark.parametrize("warm, verdict", [(0.1, "follows the FLOPs"), (0.4, "smaller than predicted"),
                                           (0.02, "larger than predicted")])
def test_ttft(warm, verdict):
    text = clean(r.ttft_reading(512, 16, 1.0, warm, 496, 1.2, 0.12, middle=(256, 0.5, 0.45)))
    assert verdict in text and "512-token" in text and "496 tokens cached" in text
    assert "With 256 tokens cached it took 500 ms against 450 ms predicted (1.1 times)" in text


@pytest.mark.parametrize("lru, reserve, verdict", [(0.8, 0.5, "LRU wins"), (0.5, 0.8, "Reserve wins"),
                                                   (0.8, 0.81, "within two percentage points")])
def test_trace(lru, reserve, verdict):
    text = clean(r.trace_reading(64, 16, 65536, lru, reserve, 0.01, 0.02, 0.05, 3))
    assert verdict in text and f"{100 * lru:.0f}%" in text and "3 system prompts" in text


@pytest.mark.parametrize("cached, verdict", [(0.0101, "equal within noise"), (0.02, "differ by more")])
def test_decode(cached, verdict):
    text = clean(r.decode_reading(0.01, cached, 256, 240, 1e6))
    assert verdict in text and "240 of its tokens" in text


def test_memory():
    text = clean(r.memory_reading(40, 65536, 0.75, 48))
    assert "40 blocks" in text and "75%" in text and "held 48" in text
