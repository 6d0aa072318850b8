"""kvlab.lab.timing: measure counts its calls and refuses bad repeats."""

import pytest

from kvlab.lab.timing import measure


def test_measure_counts_calls_and_validates():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, reps=4, device="cpu")
    assert len(calls) == 6 and len(t.times) == 4 and t.min <= t.median <= t.max
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        measure(lambda: None, reps=0)
    with pytest.raises(TypeError, match="warmup must be an int"):
        measure(lambda: None, warmup=1.5)


def test_interleaved_runs_each_call_once_per_round_rotating_the_start():
    from kvlab.lab.timing import interleaved

    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    t = interleaved(fns, reps=3, warmup=1, device="cpu")
    assert order == list("abc" + "abc" + "bca" + "cab")
    assert set(t) == set("abc") and all(len(x.times) == 3 for x in t.values())
    assert all(x.min <= x.median and x.spread_above_min >= 0 for x in t.values())


@pytest.mark.parametrize(
    "kwargs, kind, words",
    [
        ({"fns": {}}, TypeError, "fns must be a non-empty dict"),
        ({"fns": [lambda: None]}, TypeError, "fns must be a non-empty dict"),
        ({"fns": {"a": 3}}, TypeError, r"fns\['a'\] must be"),
        ({"fns": {"a": lambda: None}, "reps": 0}, ValueError, "reps must be an int >= 1"),
        ({"fns": {"a": lambda: None}, "warmup": -1}, ValueError, "warmup must be an int >= 0"),
    ],
)
def test_interleaved_refuses_bad_calls_before_running_any(kwargs, kind, words):
    from kvlab.lab.timing import interleaved

    with pytest.raises(kind, match=words):
        interleaved(**kwargs)


def test_spread_above_min_is_the_lower_quartile_over_the_fastest():
    from kvlab.lab.timing import Timing

    t = Timing(median=1.2, min=1.0, max=5.0, times=(5.0, 1.0, 1.1, 1.2, 1.3))
    assert t.spread_above_min == pytest.approx(0.1) and t.spread == pytest.approx(4 / 1.2)
    t = Timing(median=1.2, min=1.0, max=1.4, times=(1.0, 1.4))
    assert t.spread_above_min == pytest.approx(0.1)  # a quarter of the way from 1.0 to 1.4
    assert Timing(0.0, 0.0, 0.0, (0.0,)).spread_above_min == 0.0
