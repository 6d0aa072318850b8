"""kvlab.theory.verdict: section 9.8's verdict is a plain function of the measurements, tested on numbers.
"""

import pytest

import kvlab
from kvlab.theory import roofline
from kvlab.theory.shapes import SHAPES
from kvlab.theory.verdict import BatchPoint, LEVERS, Target, VERDICTS, capacity_batch, decide, lever, useful_batch
from kvlab.theory.work import STEP_METHODS


def test_decide_each_branch():
    base = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    assert decide(**base)[0] == "weights"
    assert decide(**{**base, "kv_share": 0.8})[0] == "kv"
    assert decide(**{**base, "flops_fraction": 0.7})[0] == "compute"
    assert decide(**{**base, "busy_fraction": 0.2})[0] == "overhead"
    assert decide(**{**base, "bandwidth_fraction": 0.01, "flops_fraction": 0.01})[0] == "overhead"
    assert decide(**base, admitted=False)[0] == "capacity"
    short = roofline.Admission(weights=4e9, kv=7e9, available=10e9)
    verdict, because = decide(**base, admitted=short)
    assert verdict == "capacity" and "does not fit by 1.0 GB" in because
    verdict, because = decide(**{**base, "kv_share": 0.8})
    assert "60%" in because and "80%" in because  # names the measurements it rests on


def test_decide_refuses_bad_numbers():
    good = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    with pytest.raises(ValueError, match="kv_share must be in"):
        decide(**{**good, "kv_share": 1.5})
    with pytest.raises(ValueError, match=r"busy_fraction must be in \[0, 1\]"):
        decide(**{**good, "busy_fraction": -0.1})
    with pytest.raises(ValueError, match=r"busy_fraction must be in \[0, 1\], got 1.5"):  # not "busy for 150%"
        decide(**{**good, "busy_fraction": 1.5})
    with pytest.raises(ValueError, match="bandwidth_fraction must be a finite number >= 0"):
        decide(**{**good, "bandwidth_fraction": float("inf")})
    for admitted in (None, "no", 0):  # not the verdict "capacity"
        with pytest.raises(TypeError, match="admitted must be True, False or a kvlab.theory.roofline.Admission"):
            decide(**good, admitted=admitted)
    with pytest.raises(ValueError, match="flops_fraction"):
        decide(**{**good, "flops_fraction": float("nan")})
    with pytest.raises(TypeError, match="bandwidth_fraction must be a finite number"):
        decide(**{**good, "bandwidth_fraction": "fast"})


def test_every_lever_names_a_function_or_section():
    for verdict in VERDICTS:
        for method in STEP_METHODS:
            text = lever(verdict, method)
            assert "kvlab." in text or "section" in text or "step 4" in text, (verdict, method)
    assert lever("compute", "naive") == LEVERS["compute-naive"]
    with pytest.raises(ValueError, match="verdict must be one of"):
        lever("slow", "cached")


def _point(batch, tpot, ttft=0.01, fits=True):
    return BatchPoint(batch, ttft, tpot, roofline.Admission(1.0, 1.0 if fits else 10.0, 5.0))


def test_useful_batch_under_a_target():
    sweep = [_point(1, 0.010), _point(2, 0.012), _point(4, 0.020), _point(8, 0.045, fits=False)]
    assert useful_batch(sweep, Target(tpot=0.015)) == 2
    assert useful_batch(sweep, Target(tpot=0.1)) == 4  # batch 8 would meet it but does not fit
    assert useful_batch(sweep, Target(tpot=0.001)) is None
    assert useful_batch(sweep, Target(ttft=0.001)) is None
    assert useful_batch(sweep, Target()) == 4  # most tokens per second among those that fit


@pytest.mark.parametrize("key", ["llama-3-8b", "llama-2-13b", "mistral-7b"])
@pytest.mark.parametrize("context", [1000, 32768, 131072])
def test_capacity_batch_is_the_admission_edge(key, context):
    shape, hw = SHAPES[key], kvlab.SPECS["h200"]
    b = capacity_batch(shape, hw, context, 2)
    assert b >= 1
    assert roofline.admitted(shape, hw, b, context)
    assert not roofline.admitted(shape, hw, b + 1, context)


def test_capacity_batch_zero_when_nothing_fits():
    assert capacity_batch(SHAPES["llama-3.1-405b"], kvlab.SPECS["l4"], 1000) == 0


# issue 22's bad calls of decide: out-of-range shares and a missing admission are refused, not printed
GOOD = dict(busy_fraction=0.5, bandwidth_fraction=0.5, flops_fraction=0.1, kv_share=0.5, admitted=True)


@pytest.mark.parametrize("field, value, error, match", [
    ("busy_fraction", 1.5, ValueError, r"busy_fraction must be in \[0, 1\], got 1.5"),
    ("kv_share", float("nan"), ValueError, "kv_share must be in"),
    ("bandwidth_fraction", float("inf"), ValueError, "bandwidth_fraction must be a finite number"),
    ("flops_fraction", True, TypeError, "flops_fraction must be"),
    ("admitted", None, TypeError, "admitted must be True, False or a kvlab.theory.roofline.Admission"),
])
def test_decide_refuses_each_bad_argument(field, value, error, match):
    with pytest.raises(error, match=match):
        decide(**dict(GOOD, **{field: value}))
