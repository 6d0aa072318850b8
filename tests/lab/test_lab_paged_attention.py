"""Notebooks 05 and 05b's attention measurements run, account their bytes and refuse bad input
(never a timing asserted)."""

import pytest

from kvlab.lab.paged_attention import compare_attention, compare_splits


def test_compare_attention_runs_every_path():
    timing = compare_attention(
        2, 40, block_size=8, num_q_heads=4, num_kv_heads=2, head_dim=32, reps=1, warmup=0
    )
    assert timing.kv_bytes == 2 * 2 * 40 * 2 * 32 * 4 and timing.path == "gather"
    assert len(timing.paged.times) == len(timing.contiguous.times) == 1
    for path in ("reference", "kernel"):
        assert compare_attention(1, 20, 4, 4, 2, 32, path=path, reps=1, warmup=0).path == path


def test_compare_splits_times_three_contenders_in_one_loop():
    t = compare_splits(
        1, 150, 3, block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=32, reps=2, warmup=0
    )
    assert t.num_splits == 3 and t.kv_bytes == 2 * 150 * 2 * 32 * 4
    assert len(t.split.times) == len(t.one.times) == len(t.contiguous.times) == 2
    assert t.split_bytes_per_s == t.kv_bytes / t.split.median
    alone = compare_splits(
        1, 40, 1, block_size=8, num_q_heads=4, num_kv_heads=2, head_dim=32, reps=1, warmup=0
    )
    assert alone.one is alone.split


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: compare_attention(1, 8, block_size=0, reps=1, warmup=0),
            ValueError,
            r"block_size must be an int >= 1",
        ),
        (lambda: compare_attention(1, 8, num_q_heads=3, num_kv_heads=2), ValueError, "multiple of"),
        (lambda: compare_attention(1, 8, path="flash"), ValueError, "path must be one of"),
        (lambda: compare_splits(1, 8, 0), ValueError, r"num_splits must be an int >= 1"),
        (lambda: compare_splits(1, 8, 2, reps=0), ValueError, r"reps must be an int >= 1"),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
