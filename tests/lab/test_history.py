"""kvlab.lab.history: the step-against-history sweep times every context beside its ceilings."""

import pytest

import kvlab
from kvlab.lab.hardware import Ceiling
from kvlab.lab.history import HistorySweep, history_sweep
from kvlab.lab.timing import Timing
from kvlab.theory.decode_step import history_slope


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("llama")


def test_history_sweep_measures_each_context_in_the_same_rounds(model):
    sweep = history_sweep(model, [32, 8], rounds=3)
    assert sweep.contexts == (8 + 2 + 1.0, 32 + 2 + 1.0)
    assert all(len(t.times) == 3 for t in sweep.timings)
    assert sweep.read.rate > 0 and sweep.copy.rate > 0
    k = model.shape.kv_bytes_per_token(model.dtype.itemsize)
    assert sweep.slope_predicted == history_slope(k, sweep.read.rate, sweep.copy.rate)
    assert sweep.slope.outcome in ("agrees", "disagrees", "cannot tell")


def _timing(t, spread=0.0):
    return Timing(t, t, t * (1 + spread), (t, t * (1 + spread)))


def test_slope_and_points_follow_the_model():
    read = Ceiling("read", 10e9, 0.0, "B/s")
    copy = Ceiling("copy", 5e9, 0.0, "B/s")
    k = 1000
    slope = history_slope(k, 10e9, 5e9)
    sweep = HistorySweep(
        (100.0, 1100.0, 2100.0),
        tuple(_timing(0.01 + slope * x) for x in (0, 1000, 2000)),
        k,
        read,
        copy,
    )
    assert sweep.slope_measured == pytest.approx(slope)
    assert sweep.slope.outcome == "agrees"
    assert all(c.outcome == "agrees" for c in sweep.points)
    assert sweep.predicted(2100.0) == pytest.approx(0.01 + slope * 2000)


@pytest.mark.parametrize(
    "kwargs, kind, words",
    [
        ({"contexts": [8]}, ValueError, "contexts must hold at least two"),
        ({"contexts": [8, 0]}, ValueError, r"contexts\[1\] must be an int >= 1"),
        ({"contexts": [8, 16], "rounds": 1}, ValueError, "rounds must be an int >= 2"),
    ],
)
def test_history_sweep_refuses_bad_input(model, kwargs, kind, words):
    with pytest.raises(kind, match=words):
        history_sweep(model, **kwargs)
    with pytest.raises(TypeError, match="model must be"):
        history_sweep("gpt", [8, 16])
