"""kvlab.lab.skinny: the sweep's points carry their ceilings and judge with the right one."""

import pytest

from kvlab.lab.hardware import Ceiling
from kvlab.lab.skinny import SkinnyPoint, roofline_sweep
from kvlab.theory.matmul import matmul_bytes, matmul_flops


def _point(seconds, read_rate=10e9, mm_rate=20e9, n=1, spread=0.02):
    return SkinnyPoint(
        n,
        256,
        512,
        4,
        seconds,
        spread,
        Ceiling("read", read_rate, 0.03, "B/s"),
        Ceiling(f"matmul n={n}", mm_rate, 0.3, "FLOP/s"),
    )


def test_point_predicts_the_larger_term_and_judges_with_its_ceilings_spread():
    p = _point(1e-4)
    assert p.read_seconds == matmul_bytes(1, 256, 512, 4) / 10e9
    assert p.compute_seconds == matmul_flops(1, 256, 512) / 20e9
    assert p.bound == "memory" and p.predicted_seconds == p.read_seconds
    assert p.comparison.spread == pytest.approx(0.05)
    q = _point(1e-4, mm_rate=1e8, n=8)
    assert q.bound == "compute" and q.comparison.spread == pytest.approx(0.32)
    assert q.bytes_per_s == q.bytes / 1e-4


def test_roofline_sweep_measures_each_n_beside_its_probes():
    points = roofline_sweep(ns=[2, 1], K=256, N=512, reps=2)
    assert [p.n for p in points] == [1, 2]
    for p in points:
        assert p.seconds > 0 and p.read.rate > 0 and p.matmul.rate > 0
        assert p.comparison.outcome in ("agrees", "disagrees", "cannot tell")


@pytest.mark.parametrize(
    "kwargs, kind, words",
    [
        ({"ns": "12"}, TypeError, "ns must be a list of ints"),
        ({"ns": [0]}, ValueError, r"ns\[0\] must be an int >= 1"),
        ({"K": 0}, ValueError, "K must be an int >= 1"),
        ({"reps": 0}, ValueError, "reps must be an int >= 1"),
    ],
)
def test_roofline_sweep_refuses_bad_sizes(kwargs, kind, words):
    with pytest.raises(kind, match=words):
        roofline_sweep(**kwargs)
