"""The FP8 (E4M3) KV cache (kvlab.cache.fp8): every stored element within E4M3's relative rounding
of itself, checked in float64 against the format's definition; a fixed scale per layer and
tensor; saturation past the calibrated range; one byte per element; and a decode loop through it."""

import math

import pytest
import torch

import kvlab
from kvlab.cache.fp8 import FP8_MAX, FP8KVCache, fp8_scale, from_fp8, to_fp8
from kvlab.decode import cached_decode

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)
# E4M3: 3 mantissa bits, so a normal number rounds to within 2^-4 of itself; the smallest normal is
# 2^-6 and subnormals are spaced 2^-9 apart (absolute error at most 2^-10 there).
RELATIVE, SUBNORMAL_HALF_STEP = 2.0**-4, 2.0**-10


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


@pytest.mark.parametrize("seed, spread", [(0, 1.0), (1, 1e-3), (2, 300.0)])
def test_each_element_is_within_e4m3_rounding_of_itself(seed, spread):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 37, 16, generator=g, dtype=torch.float64) * spread
    x[0, 0, 5, 3] = 7 * spread  # an outlier sets the scale
    scale = fp8_scale(x)
    assert math.isclose(float(scale), float(x.abs().max()) / 448, rel_tol=1e-6)
    back = from_fp8(to_fp8(x, scale), scale, torch.float64)
    bound = RELATIVE * x.abs() + SUBNORMAL_HALF_STEP * float(scale)
    assert bool(((back - x).abs() <= bound * (1 + 1e-6)).all())
    assert float((back - x).abs().max()) > 0  # it does round


def test_past_the_calibrated_range_an_element_saturates_not_nan():
    scale = torch.tensor(1.0)
    back = from_fp8(to_fp8(torch.tensor([1e6, -1e6, 3.0]), scale), scale, torch.float32)
    assert back.tolist() == [FP8_MAX, -FP8_MAX, 3.0]
    assert float(fp8_scale(torch.zeros(4))) == 1.0


def test_the_cache_keeps_the_first_scale_and_counts_one_byte_per_element():
    cache = FP8KVCache()
    k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8) * 5
    keys, values = cache.update(k, v, 0)
    layer = cache.layers[0]
    first = (float(layer.key_scale), float(layer.value_scale))
    assert first == pytest.approx((float(k.abs().max()) / 448, float(v.abs().max()) / 448))
    assert torch.allclose(keys, k, rtol=RELATIVE, atol=1e-3)
    keys, values = cache.update(k[..., :1, :] * 100, v[..., :1, :], 0)  # past the range: clamped
    assert (float(layer.key_scale), float(layer.value_scale)) == first
    assert keys.shape[-2] == 11 and torch.isfinite(keys).all()
    assert float(keys[..., -1, :].abs().max()) == pytest.approx(448 * first[0], rel=1e-6)
    assert cache.get_seq_length() == 11
    assert cache.nbytes == 2 * (1 * 2 * 11 * 8) + 8


def test_a_decode_loop_runs_through_the_fp8_cache(llama):
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    expected = cached_decode(llama, ids, 12)
    cache = FP8KVCache()
    out = cached_decode(llama, ids, 12, cache=cache)
    assert out.shape == expected.shape
    assert cache.get_seq_length() == 12 + 11
    assert (out == expected).float().mean() > 0.5  # 8-bit floats barely move a random model
