"""kvlab.lab.batch_tpot: decode steps timed beside the read bandwidth and the matmul rate at their
rows (notebook 09), and the scatter of a minimum."""

import pytest
import torch

import kvlab
from kvlab.lab.batch_tpot import min_scatter, time_beside, tpot_sweep
from kvlab.lab.timing import Timing


@pytest.fixture(scope="module")
def small():
    return kvlab.tiny_model(
        "llama", layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=256
    )


def test_min_scatter_is_the_gap_between_the_two_fastest_repeats():
    t = Timing(2.0, 1.0, 9.0, (9.0, 1.0, 1.25, 2.0))
    assert min_scatter(t) == pytest.approx(0.25)  # a slow outlier does not widen it
    assert min_scatter(Timing(1.0, 1.0, 1.0, (1.0,))) == 0.0


def test_tpot_sweep_times_each_batch_beside_its_ceilings(small):
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    points = tpot_sweep(small, ids, 10, [1, 3], reps=2)
    assert [p.batch for p in points] == [1, 3]
    for p in points:
        assert p.tpot.min > 0 and len(p.tpot.times) == 2
        assert p.read.unit == "B/s" and p.read.rate > 0 and p.read.spread >= 0
        assert p.matmul.name == f"matmul n={p.batch}" and p.matmul.rate > 0
    beside = time_beside(lambda: None, 2, reps=2)
    assert beside.step.min >= 0 and beside.step_spread >= 0


@pytest.mark.parametrize(
    "kwargs, kind, words",
    [
        (dict(batches=[]), ValueError, "batches"),
        (dict(batches=[1], reps=1), ValueError, "reps must be an int >= 2"),
        (dict(batches=[0]), ValueError, "batches"),
    ],
)
def test_tpot_sweep_refuses_bad_arguments(small, kwargs, kind, words):
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(kind, match=words):
        tpot_sweep(small, ids, 10, **kwargs)
