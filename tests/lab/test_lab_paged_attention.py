"""Notebook 05's measurements run, account their bytes and refuse bad input (never a timing asserted)."""

import functools

import pytest
import torch

import kvlab
from kvlab.lab.paged_attention import compare_attention, copy_block_by_block, measure_host_copy, measure_preemption_cost


@functools.lru_cache(maxsize=1)
def _model():
    return kvlab.tiny_model("llama", layers=2, hidden=128, q_heads=4, kv_heads=2, vocab=512, intermediate=256,
                            device="cpu", dtype=torch.float32, seed=3)


def test_measurement_helpers_run():
    timing = compare_attention(2, 40, block_size=8, num_q_heads=4, num_kv_heads=2, head_dim=32, reps=1, warmup=0)
    assert timing.kv_bytes == 2 * 2 * 40 * 2 * 32 * 4 and timing.path == "gather"
    for path in ("reference", "kernel"):
        assert compare_attention(1, 20, 4, 4, 2, 32, path=path, reps=1, warmup=0).path == path
    cost = measure_preemption_cost(_model(), 10, block_size=4, reps=1, warmup=0)
    assert (cost.tokens, cost.blocks) == (10, 3)
    assert cost.swap_bytes == 2 * 3 * (2 * 2 * 4 * 2 * 32 * 4)  # out and back, K and V of 2 layers
    assert cost.recompute.median > 0 and cost.swap.median > 0


def test_copy_block_by_block_copies_every_block():
    src = torch.arange(24, dtype=torch.float32).view(6, 4)
    dst = torch.zeros_like(src)
    copy_block_by_block(src, dst)
    assert torch.equal(src, dst)


def test_measure_host_copy_accounts_bytes():
    rows = measure_host_copy(1 << 16, [1024, 4096, 65536], device="cpu", warmup=0, reps=1)
    assert [(r.block_bytes, r.blocks, r.total_bytes) for r in rows] == [
        (1024, 64, 65536), (4096, 16, 65536), (65536, 1, 65536)]
    assert all(r.bytes_per_s > 0 and r.one_copy_bytes_per_s > 0 and r.efficiency > 0 for r in rows)
    assert measure_host_copy(4000, 1000, device="cpu", warmup=0, reps=1)[0].blocks == 4
    for bad, match in (([], "at least one"), ([6], "multiple of 4"), ([1 << 20], "block_bytes"), ([True], "block_bytes")):
        with pytest.raises((ValueError, TypeError), match=match):
            measure_host_copy(1 << 16, bad, device="cpu")


@pytest.mark.parametrize("call, error, match", [
    (lambda: compare_attention(1, 8, block_size=0, reps=1, warmup=0), ValueError, r"block_size must be an int >= 1"),
    (lambda: compare_attention(1, 8, num_q_heads=3, num_kv_heads=2), ValueError, "multiple of"),
    (lambda: compare_attention(1, 8, path="flash"), ValueError, "path must be one of"),
    (lambda: measure_preemption_cost(_model(), 8, block_size=0), ValueError, r"block_size must be an int >= 1, got 0"),
    (lambda: measure_preemption_cost(_model(), 1), ValueError, r"num_tokens must be an int >= 2"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
