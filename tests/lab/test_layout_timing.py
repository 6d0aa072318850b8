"""kvlab.lab.layout_timing: address runs from the arithmetic, and the measurements and bench rows
run."""

import dataclasses

import pytest
import torch

from kvlab.cache import layout as L
from kvlab.cache.addresses import LAYOUTS, KVGeometry
from kvlab.lab.bench import Row
from kvlab.lab.layout_timing import (
    bench_rows,
    contiguous_runs,
    measure_append,
    measure_read,
    measure_reads,
)


def test_contiguous_runs_match_the_layouts_arithmetic():
    heads, dim, block = 4, 8, 16
    bhtd = KVGeometry.contiguous(
        "BHTD", layers=1, batch=2, max_tokens=40, kv_heads=heads, head_dim=dim
    )
    assert contiguous_runs(bhtd, 40, [1]).tolist() == [40 * dim]
    assert contiguous_runs(bhtd, 40).tolist() == [heads * 40 * dim]  # full capacity: one run
    assert (
        contiguous_runs(bhtd, 30).tolist() == [30 * dim] * heads
    )  # spare capacity splits the heads
    bthd = dataclasses.replace(bhtd, layout="BTHD")
    assert contiguous_runs(bthd, 40, [2]).tolist() == [dim] * 40
    assert contiguous_runs(bthd, 33).tolist() == [33 * heads * dim]
    table = torch.tensor([[9, 4, 0]])  # no two logical neighbours are physical neighbours
    for layout, one_head in (("NHD", [dim] * 40), ("HND", [block * dim, block * dim, 8 * dim])):
        paged = KVGeometry.paged(
            layout, layers=1, num_blocks=10, block_size=block, kv_heads=heads, head_dim=dim
        )
        assert sorted(contiguous_runs(paged, 40, [3], block_table=table).tolist()) == sorted(
            one_head
        )
        all_heads = contiguous_runs(paged, 40, block_table=table).tolist()
        assert sum(all_heads) == 40 * heads * dim and max(all_heads) == block * heads * dim


def test_measurements_and_bench_rows_run():
    for layout in LAYOUTS:
        cache = L.new_cache(
            layout, batch=2, length=33, kv_heads=2, head_dim=8, block_size=8, device="cpu"
        )
        read = measure_read(cache, q_heads=4, warmup=0, reps=1)
        assert read.kv_bytes == 2 * 2 * 33 * 2 * 8 * 4 and read.moved_bytes >= read.kv_bytes
        assert read.timing.median > 0 and read.predicted_s > 0
        for method in L.APPEND_METHODS[layout]:
            append = measure_append(cache, method, warmup=0, reps=1)
            assert append.new_bytes == 2 * 2 * 2 * 8 * 4 and append.per_token_s > 0
        assert cache.length == 33  # measuring does not advance the cache
    rows = bench_rows(rounds=1, context=40, batch=2)
    assert rows and all(isinstance(r, Row) for r in rows)
    assert {"read BHTD", "read NHD", "append BTHD cat / index"} <= {r.name for r in rows}


def test_reads_timed_in_alternation_are_measured_like_one_read():
    caches = {
        b: L.new_cache("BHTD", batch=b, length=24, kv_heads=2, head_dim=8, device="cpu")
        for b in (1, 3)
    }
    reads = measure_reads(caches, q_heads=4, warmup=0, reps=3)
    for b, cache in caches.items():
        alone = measure_read(cache, q_heads=4, warmup=0, reps=1)
        got = reads[b]
        assert len(got.timing.times) == 3 and got.timing.min > 0
        assert dataclasses.replace(got, timing=alone.timing) == alone  # same bytes and shape
    assert reads[3].kv_bytes == 3 * reads[1].kv_bytes


def test_reads_in_alternation_refuse_a_mixed_or_empty_set():
    cache = L.new_cache("BHTD", batch=1, length=4, kv_heads=2, head_dim=8, device="cpu")
    with pytest.raises(ValueError, match="at least one"):
        measure_reads({})
    with pytest.raises(TypeError, match=r"caches\[1\] must be a kvlab.cache.layout.KVCache"):
        measure_reads({"a": cache, "b": "cache"})
    with pytest.raises(ValueError, match="multiple of the cache's kv_heads"):
        measure_reads({"a": cache}, q_heads=3)


def test_last_level_cache_is_a_size_or_unknown():
    from kvlab.lab.layout_timing import last_level_cache_bytes

    size = last_level_cache_bytes()
    assert size is None or (isinstance(size, int) and size >= 1 << 16)
