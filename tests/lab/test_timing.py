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
