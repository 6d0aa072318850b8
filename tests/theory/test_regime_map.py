"""The regime map's colours (notebook 10): above the ridge batch, a short context is compute-bound,
not weight-bound; each boundary is tested on both sides."""

import math

import pytest

from kvlab.theory import memory_wall as mw
from kvlab.theory import roofline as rf
from kvlab.theory.shapes import SHAPES
from kvlab.theory.specs import SPECS

L70 = SHAPES["llama-3-70b"]


def _intensity_at(shape, hw, s, b):
    return rf.arithmetic_intensity(shape, s, b) / rf.ridge_point(hw)


@pytest.mark.parametrize("device", ["h100-sxm", "b200", "h200"])
def test_compute_bound_context_is_where_the_intensity_reaches_the_ridge(device):
    hw = SPECS[device]
    b = 2 * math.ceil(rf.ridge_batch(hw))
    s_c = rf.compute_bound_context(L70, hw, b)
    assert s_c > 1
    assert _intensity_at(L70, hw, math.floor(s_c * 0.99), b) > 1
    assert _intensity_at(L70, hw, math.ceil(s_c * 1.01), b) < 1


def test_no_context_is_compute_bound_at_or_below_the_ridge_batch():
    hw = SPECS["h100-sxm"]
    assert rf.compute_bound_context(L70, hw, math.floor(rf.ridge_batch(hw))) == 0


def test_the_map_paints_a_large_batch_at_short_context_compute_bound():
    hw = SPECS["h100-sxm"]  # ridge batch 295 in bf16
    assert round(rf.ridge_batch(hw)) == 295
    l8 = SHAPES["llama-3-8b"]
    assert mw.map_regime(l8, hw, context=100, batch=600) == "compute-bound"
    assert mw.map_regime(l8, hw, context=100, batch=200) == "weight-bound"
    s_star = rf.crossover_context(l8, 32)
    assert mw.map_regime(l8, hw, context=math.ceil(s_star), batch=32) == "KV-bound"
    assert mw.map_regime(l8, hw, context=math.floor(s_star), batch=32) == "weight-bound"


def test_the_map_says_beyond_capacity_past_s_cap():
    hw = SPECS["b200"]
    s_cap = rf.capacity_context(L70, hw, batch=8)
    assert mw.map_regime(L70, hw, context=math.floor(s_cap), batch=8) != "beyond capacity"
    assert mw.map_regime(L70, hw, context=math.ceil(s_cap) + 1, batch=8) == "beyond capacity"
    assert mw.map_regime(L70, SPECS["h100-sxm"], context=1, batch=1) == "beyond capacity"
