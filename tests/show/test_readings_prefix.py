"""Readings of the prefix-caching section, each fed every outcome it distinguishes, with inputs
computed on both sides of each decision's boundary by the model that decides it (the block rule,
prefill FLOPs, the replay's margin, equal decode bytes, the roofline of a prefill launch)."""

import re

import pytest

from kvlab.cache.blocks import reusable_tokens
from kvlab.lab import prefix as lab
from kvlab.show.readings import prefix_caching as r
from kvlab.theory import prefix as model
from kvlab.theory import roofline
from kvlab.theory.agreement import edges
from kvlab.theory.shapes import SHAPES

SHAPE, HW = SHAPES["llama-3-8b"], "h100-sxm"


def clean(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_identity_table_against_the_block_rule():
    rows = [
        ("reference", 40, None, reusable_tokens(None, 40, 16)),
        ("a space added", 41, 17, reusable_tokens(17, 41, 16)),
    ]
    text = clean(r.identity_reading(rows, 16))
    assert (
        "| a space added | 41 | 17 | 16 | 16 | 1 |" in text
        and "| reference | 40 | none | 32 | 32 | 2 |" in text
    )
    assert "exactly what the rule predicts" in text
    text = clean(r.identity_reading([("reference", 40, None, 16)], 16))
    assert "predicted other counts for: reference (16 served, 32 predicted)" in text


def _predicted(tokens=2048, cached=1536, shared=None):
    hw = HW
    cold = roofline.prefill_time(SHAPE, hw, tokens, mfu=1.0)
    warm = roofline.prefill_time(SHAPE, hw, tokens, mfu=1.0, prefix_tokens=cached)
    hf = roofline.prefill_time(SHAPE, hw, tokens, mfu=1.0, prefix_tokens=shared or cached + 8)
    return cold, warm, hf


# The three-outcome bands with no spread (the 10% floor): a saving or a ratio against 1.
_T_LO_D, _T_LO_A, _T_HI_A, _T_HI_D = edges(1.0, 0.0)


@pytest.mark.parametrize(
    "factor, verdict",
    [
        (1.1 * _T_HI_D, "larger than predicted"),
        (0.95 * _T_HI_A, "follows the FLOPs"),
        (1.05 * _T_LO_A, "follows the FLOPs"),
        (0.9 * _T_LO_D, "smaller than predicted"),
        ((_T_HI_A * _T_HI_D) ** 0.5, "This run cannot tell"),
        ((_T_LO_A * _T_LO_D) ** 0.5, "This run cannot tell"),
    ],
)
def test_ttft_decides_by_prefill_flops(factor, verdict):
    cold_pred, warm_pred, _ = _predicted()
    cold = 1.0
    warm = cold / (
        factor * cold_pred / warm_pred
    )  # the measured saving is factor x the predicted one
    text = clean(
        r.ttft_reading(2048, 16, cold, warm, 1536, cold_pred, warm_pred, middle=(1024, 0.5, 0.45))
    )
    assert verdict in text and "2,048-token" in text and "1,536 tokens cached" in text
    assert "With 1,024 tokens cached it took 500 ms against 450 ms predicted (1.1 times)" in text


_LO_D, _LO_A, _HI_A, _HI_D = edges(1.0, 0.2)  # the reuse ratio's bands at a 20% spread


@pytest.mark.parametrize(
    "saving, reuse, verdicts",
    [
        (
            1.1 * _T_HI_D,
            1.1 * _HI_D,
            ("larger than the FLOPs predict", "copying the whole", "above it"),
        ),
        (0.95 * _T_HI_A, 0.99 * _HI_A, ("follows the FLOPs", "follow their FLOPs", "agrees")),
        (0.95 * _T_HI_A, 1.01 * _LO_A, ("follow their FLOPs",)),
        ((_T_HI_A * _T_HI_D) ** 0.5, 1.0, ("scatter too much", "agrees")),
        (0.9 * _T_LO_D, 0.9 * _LO_D, ("smaller than the FLOPs predict", "kvlab took longer")),
        (1.0, (_HI_A * _HI_D) ** 0.5, ("cannot tell", "above the FLOPs' prediction")),
        (1.0, (_LO_A * _LO_D) ** 0.5, ("cannot tell", "below the FLOPs' prediction")),
    ],
)
def test_chat_decides_by_prefill_flops(saving, reuse, verdicts):
    cold_pred, warm_pred, hf_pred = _predicted()
    cold, cached = 0.5, 0.5 / (saving * cold_pred / warm_pred)
    hf_reused = cached * reuse * hf_pred / warm_pred
    text = clean(
        r.chat_reading(
            120, 16, 4, 0.7, cold, cached, 0.55, hf_reused, cold_pred, warm_pred, hf_pred, 0.2
        )
    )
    assert all(v in text for v in verdicts) and "**70%**" in text and "120 tokens" in text


@pytest.mark.parametrize(
    "gap, verdict",
    [
        (1.1 * model.POLICY_MARGIN, "served more"),
        (-1.1 * model.POLICY_MARGIN, "served less"),
        (0.9 * model.POLICY_MARGIN, "within two points"),
        (-0.9 * model.POLICY_MARGIN, "within two points"),
    ],
)
@pytest.mark.parametrize("policy", ["Leaf-first LRU", "LFU"])
def test_trace_decides_each_rule_against_lru(gap, verdict, policy):
    lru, other = 0.5, 0.5 + gap
    hits = (lru, other, lru) if policy == "Leaf-first LRU" else (lru, lru, other)
    text = clean(r.trace_reading(64, 16, 65536, *hits, 0.01, 0.01, 0.02, 0.05, 3))
    assert f"{policy} {verdict}" in text or f"{policy} matches LRU {verdict}" in text
    assert f"{100 * other:.0f}%" in text and "3 system prompts" in text and "{si(" not in text
    others = [p for p in ("Leaf-first LRU", "LFU") if p != policy]
    assert all(f"{p} served" not in text for p in others)  # the other rule tied with LRU


@pytest.mark.parametrize(
    "factor, verdict",
    [
        (0.95 * _T_HI_A, "The cache saves prefill work"),
        (1.05 * _T_LO_A, "The cache saves prefill work"),
        (1.1 * _T_HI_D, "differ by more"),
        (0.9 * _T_LO_D, "differ by more"),
        ((_T_HI_A * _T_HI_D) ** 0.5, "neither step is clearly slower"),
    ],
)
def test_decode_decides_by_equal_bytes(factor, verdict):
    text = clean(r.decode_reading(0.01, 0.01 * factor, 256, 240, 1e6))
    assert verdict in text and "240 of its tokens" in text and "{si(" not in text


def test_memory_says_cached_blocks_cost_no_admission_capacity():
    text = clean(r.memory_reading(40, 65536, 0.75, 48, 12, 72, 16, 16))
    assert (
        "40 free blocks" in text
        and "75%" in text
        and "at most 48" in text
        and "`num_free` counts" in text
    )
    assert "giving up 12 hashes" in text and "all 16 blocks" in text and "evicted 16 hashes" in text
    assert "evicted nothing" in clean(r.memory_reading(40, 65536, 0.75, 48, 0, 72, 16, 16))


def _cost(new, cached=0):
    return lab.prefill_attention_cost(SHAPE, HW, [new], [cached + new])


def test_prefill_cost_names_the_bound_from_the_roofline():
    # The compulsory floor turns compute-bound at some chunk length: find it with the model, test
    # either side.
    n = next(n for n in range(1, 1 << 16) if _cost(n).compulsory_floor.bound == "compute")
    below, above = _cost(int(0.9 * n)), _cost(int(1.1 * n) + 1)
    assert below.compulsory_floor.bound == "memory" and above.compulsory_floor.bound == "compute"
    low_text = clean(r.prefill_cost_reading(below, "H100", "one prompt"))
    high_text = clean(r.prefill_cost_reading(above, "H100", "one prompt"))
    assert (
        "for every byte read once" in low_text
        and "set by its bytes" in low_text.split("for every byte read once")[1]
    )
    assert "set by its FLOPs" in high_text.split("for every byte read once")[1]
    assert "FlashAttention's varlen" in high_text and "decode rows" in high_text
    assert above.rows.tile_bytes > above.kernel.tile_bytes >= above.kernel.bytes
    assert ("L2 cache" in high_text) == (above.kernel_floor.bound == "memory")
