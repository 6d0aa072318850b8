"""kvlab.lab.paged_kernel (notebook 05b): the grid model of split-K against choose_num_splits, its
gain boundary solved with the model itself, and the reading of the book's records."""

from pathlib import Path

import pytest

from kvlab.kernels import paged_attention as pa
from kvlab.lab.bench import load_records
from kvlab.lab.paged_kernel import recorded_runs, split_grid

H100 = 132


def test_split_grid_is_choose_num_splits_and_its_limits():
    for batch, context in ((1, 32768), (1, 2048), (32, 32768), (64, 100), (3, 5000)):
        grid = split_grid(batch, 8, context, H100)
        assert grid.splits == pa.choose_num_splits(batch, 8, context, H100)
        assert grid.splits == max(1, min(grid.wanted, grid.useful, pa.MAX_SPLITS))
        assert grid.programs == batch * 8 * grid.splits
    assert (
        split_grid(1, 8, 32768, H100).bound == "occupancy"
        and split_grid(1, 8, 2048, H100).bound == "tiles"
    )
    assert split_grid(1, 8, 32768, H100, num_splits=5).bound == "given"
    # empty splits by the kernel's rule: 1,024 tokens are 16 tiles; 33 splits of one tile each leave
    # 17 empty
    assert split_grid(1, 8, 8192, H100).empty_splits(1024) == 33 - 16
    assert split_grid(1, 8, 8192, H100, num_splits=5).empty_splits(8192) == 0
    with pytest.raises(ValueError, match="multiprocessors must be an int >= 1"):
        split_grid(1, 8, 1024, 0)


def test_split_grid_predicts_a_gain_only_below_the_multiprocessor_count():
    # the boundary: the unsplit grid's programs equal the multiprocessors, solved with the model
    # itself
    sms = max(m for m in range(1, 64) if not split_grid(1, 2, 4096, m, num_splits=8).predicts_gain)
    assert sms == split_grid(1, 2, 4096, sms, num_splits=8).programs_unsplit
    assert split_grid(1, 2, 4096, sms + 1, num_splits=8).predicts_gain
    assert (
        split_grid(1, 2, 4096, 1, num_splits=8).busy_gain == 1
    )  # the interpreter: one program at a time


def test_recorded_runs_read_the_books_own_records():
    runs = recorded_runs(
        load_records(Path(__file__).resolve().parents[2] / "book" / "data" / "measurements")
    )
    assert runs and all(run.rows for run in runs)
