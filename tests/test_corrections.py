"""The formulas behind the book's teaching corrections (issue 12) that belong to the serving stack:
swap's copy size. The others (recompute against swap, real capacities, one-way link rates, design
rule 3's scope, compile break-even, the Blelloch and two-level scans) are tested beside their
modules in tests/theory, tests/cache and tests/lab."""

import pytest
import torch

from kvlab.serving.paged_decode import _copy_blocks, measure_host_copy


def test_copy_blocks_copies_every_block():
    src = torch.arange(24, dtype=torch.float32).view(6, 4)
    dst = torch.zeros_like(src)
    _copy_blocks(src, dst, False)
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
