"""Notebook 05's preemption measurements: recompute against swap-out and swap-in, the host copy and
its fixed-cost model, and what a recompute recomputes with prefix caching on, counted on kvlab's
engine (never a timing asserted)."""

import functools

import pytest
import torch

import kvlab
from kvlab.lab.preemption import (
    CachedRecompute,
    copy_block_by_block,
    measure_cached_recompute,
    measure_host_copy,
    measure_preemption_cost,
    recompute_workload,
)


@functools.lru_cache(maxsize=1)
def _model():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=512,
        intermediate=256,
        device="cpu",
        dtype=torch.float32,
        seed=3,
    )


def test_preemption_cost_times_recompute_swap_out_and_swap_in_apart():
    cost = measure_preemption_cost(_model(), 10, block_size=4, reps=2, warmup=0)
    assert (cost.tokens, cost.blocks) == (10, 3)
    assert (
        cost.swap_bytes == 2 * 3 * (2 * 2 * 4 * 2 * 32 * 4)
        and cost.bytes_each_way == cost.swap_bytes // 2
    )
    assert all(
        len(t.times) == 2 and t.median > 0 for t in (cost.recompute, cost.swap_out, cost.swap_in)
    )
    round_trips = [o + i for o, i in zip(cost.swap_out.times, cost.swap_in.times)]
    assert cost.swap.times == tuple(round_trips) and cost.swap.min == min(round_trips)


def test_copy_block_by_block_copies_every_block():
    src = torch.arange(24, dtype=torch.float32).view(6, 4)
    dst = torch.zeros_like(src)
    copy_block_by_block(src, dst)
    assert torch.equal(src, dst)


def test_measure_host_copy_accounts_bytes_and_splits_each_copy_by_the_fixed_cost_model():
    rows = measure_host_copy(1 << 16, [1024, 4096, 65536], device="cpu", warmup=0, reps=1)
    assert [(r.block_bytes, r.blocks, r.total_bytes) for r in rows] == [
        (1024, 64, 65536),
        (4096, 16, 65536),
        (65536, 1, 65536),
    ]
    assert all(r.bytes_per_s > 0 and r.one_copy_bytes_per_s > 0 and r.efficiency > 0 for r in rows)
    for r in rows:  # t per copy = t0 + b / beta, beta the one-copy rate
        assert r.fixed_cost_s + r.transfer_s == pytest.approx(r.per_block.median / r.blocks)
        assert r.fixed_cost_dominates == (r.efficiency < 0.5)
    assert measure_host_copy(4000, 1000, device="cpu", warmup=0, reps=1)[0].blocks == 4
    for bad, match in (
        ([], "at least one"),
        ([6], "multiple of 4"),
        ([1 << 20], "block_bytes"),
        ([True], "block_bytes"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            measure_host_copy(1 << 16, bad, device="cpu")


def test_cached_recompute_counts_add_up_on_the_engine():
    prompts, outputs, blocks = recompute_workload(_model().config.vocab_size, gpu=False)
    r = measure_cached_recompute(_model(), prompts, outputs, blocks, block_size=16)
    assert r.held and len(r.held) == len(r.served) and r.same_tokens
    assert r.prompt_tokens == sum(map(len, prompts))
    assert (
        r.dropped == r.recomputed + r.from_cache
        and 0 <= r.from_cache <= r.full_block_tokens <= r.dropped
    )
    assert r.partial_block_tokens == sum(h % 16 for h in r.held) and r.evicted_tokens >= 0
    # the counting is independent of the engine's own: with caching on, exactly what the cache gave
    # back at the readmissions is not prefilled again (the prompts share no block)
    assert r.prefill_tokens[False] - r.prefill_tokens[True] == r.from_cache


def test_recompute_workload_preempts_and_cached_recompute_refuses_bad_input():
    prompts, outputs, blocks = recompute_workload(512, gpu=False)
    assert len(prompts) == len(outputs) == 10
    need = sum(-(-(len(p) + g - 1) // 16) for p, g in zip(prompts, outputs))
    assert blocks < need  # a third of what they need together: they cannot all run at once
    with pytest.raises(TypeError, match="prompts must be a non-empty list"):
        measure_cached_recompute(_model(), [], 4, 8)
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        measure_cached_recompute(_model(), prompts, 4, 0)
    assert CachedRecompute(16, 10, (), (), {False: 10, True: 10}, True).dropped == 0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: measure_preemption_cost(_model(), 8, block_size=0),
            ValueError,
            r"block_size must be an int >= 1, got 0",
        ),
        (
            lambda: measure_preemption_cost(_model(), 1),
            ValueError,
            r"num_tokens must be an int >= 2",
        ),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
