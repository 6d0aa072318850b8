"""kvlab.cache.quantized: the half-step bound, the bytes held, KIVI's layout and its residual
window."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache.quantized import QuantizedKVCache, quantize
from kvlab.decode import cached_decode
from kvlab.lab.cache_quality import outlier_keys
from kvlab.theory.cache_sizes import kivi_nbytes, quantized_nbytes

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def _ids(batch, length, seed=0, vocab=512):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from([2, 4, 8]),
    group=st.sampled_from([1, 2, 3, 4, 5, 8]),
    rows=st.integers(1, 6),
    groups=st.integers(1, 5),
    axis=st.sampled_from([0, 1, -1]),
    seed=st.integers(0, 10_000),
    spread=st.sampled_from([1e-3, 1.0, 50.0]),
)
def test_dequantization_error_is_at_most_half_a_step(bits, group, rows, groups, axis, seed, spread):
    g = torch.Generator().manual_seed(seed)
    shape = [rows, group * groups] if axis != 0 else [group * groups, rows]
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * spread + torch.randn(
        1, generator=g, dtype=torch.float64
    )
    x = x
    q = quantize(x, bits, group, axis)
    err = (q.dequantize() - x).abs()
    assert q.dequantize().shape == x.shape
    assert bool((err <= q.step / 2 * (1 + 1e-9) + 1e-12).all())
    levels = 2**bits - 1
    # the step is the group's range over the levels, computed independently here
    moved = x.movedim(axis, -1)
    grouped = moved.reshape(*moved.shape[:-1], -1, group)
    step = (grouped.amax(-1) - grouped.amin(-1)) / levels
    assert torch.allclose(q.scale[..., 0], step)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype, meta", [(torch.float16, 2), (torch.float32, 4)])
def test_nbytes_counts_packed_bits_scales_and_zeros(bits, dtype, meta):
    x = torch.randn(2, 3, 64, 32).to(dtype)
    for axis, group in ((-1, 32), (-1, 8), (-2, 16), (-2, 64)):
        q = quantize(x, bits, group, axis)
        groups = x.numel() // group
        assert q.nbytes == x.numel() * bits // 8 + 2 * groups * meta
        assert q.nbytes == quantized_nbytes(x.numel(), bits, group, meta)
    odd = quantize(torch.randn(5, 6), 2, 3, -1)  # 3 codes of 2 bits still take a byte per group
    assert odd.nbytes == 10 * 1 + 2 * 10 * 4


def test_per_channel_keys_beat_per_token_on_outlier_channels():
    k = outlier_keys(256, 64, outlier_channels=4, outlier_scale=20.0)
    for bits in (2, 4):
        per_channel = (quantize(k, bits, 32, axis=0).dequantize() - k).norm()
        per_token = (quantize(k, bits, 32, axis=1).dequantize() - k).norm()
        assert per_channel < per_token


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(bits=3), "bits"),
        (dict(bits=16), "bits"),
        (dict(group_size=5), "group_size"),
        (dict(group_size=0), "group_size"),
        (dict(axis=4), "axis"),
    ],
)
def test_quantize_rejects_bad_arguments(bad, match):
    args = dict(x=torch.randn(4, 32), bits=4, group_size=8, axis=-1)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        quantize(**args)
    with pytest.raises(TypeError, match="floating"):
        quantize(torch.ones(4, 8, dtype=torch.int32), 4, 4)


_TINY = {}


def _tiny():
    if "m" not in _TINY:
        _TINY["m"] = kvlab.tiny_model("llama", **SMALL)
    return _TINY["m"]


def test_quantized_cache_rejects_bad_arguments():
    with pytest.raises(ValueError, match="bits"):
        QuantizedKVCache(bits=3)
    with pytest.raises(ValueError, match="residual"):
        QuantizedKVCache(residual=-1)
    with pytest.raises(ValueError, match="group_size"):
        cached_decode(_tiny(), _ids(1, 4), 3, cache=QuantizedKVCache(bits=4, group_size=12))


@pytest.mark.parametrize(
    "bits, group, residual, chunks",
    [(2, 8, 5, [23, 1, 1, 1, 9, 1]), (4, 4, 0, [1] * 13), (8, 16, 20, [7, 30, 1, 1])],
)
def test_kivi_cache_residual_exact_and_bytes(bits, group, residual, chunks):
    cache = QuantizedKVCache(bits=bits, group_size=group, residual=residual)
    b, h, d = 2, 3, 16
    g = torch.Generator().manual_seed(bits)
    keys = torch.randn(b, h, sum(chunks), d, generator=g) * torch.linspace(
        0.1, 30, d
    )  # outlier-ish channels
    values = torch.randn(b, h, sum(chunks), d, generator=g)
    n = 0
    for count in chunks:
        k_out, v_out = cache.update(keys[..., n : n + count, :], values[..., n : n + count, :], 0)
        n += count
        layer = cache.layers[0]
        quantized = max(0, (n - residual) // group * group)
        assert layer.get_seq_length() == n and cache.get_seq_length() == n
        assert layer.keys.shape[-2] == n - quantized >= min(n, residual)
        # The residual window is exact, and so is everything the attention sees from it.
        assert torch.equal(k_out[..., quantized:, :], keys[..., quantized:n, :])
        assert torch.equal(v_out[..., quantized:, :], values[..., quantized:n, :])
        if quantized:
            assert bool(
                (
                    (k_out[..., :quantized, :] - keys[..., :quantized, :]).abs()
                    <= layer.qkeys.step / 2 + 1e-5
                ).all()
            )
            assert bool(
                (
                    (v_out[..., :quantized, :] - values[..., :quantized, :]).abs()
                    <= layer.qvalues.step / 2 + 1e-5
                ).all()
            )
        codes = 2 * quantized * b * h * d * bits // 8
        meta = 2 * 2 * (b * h * d * quantized // group) * 4  # keys and values; scale and zero; fp32
        exact = 2 * (n - quantized) * b * h * d * 4
        assert layer.nbytes == cache.nbytes == codes + meta + exact


def test_kivi_cache_decodes(llama):
    ids = _ids(2, 12)
    expected = cached_decode(llama, ids, 12)
    # Eight bits with a residual longer than the request: nothing is quantized, tokens are exact.
    assert torch.equal(
        cached_decode(llama, ids, 12, cache=QuantizedKVCache(8, 16, residual=64)), expected
    )
    cache = QuantizedKVCache(8, 4, residual=2)
    out = cached_decode(llama, ids, 12, cache=cache)
    assert out.shape == expected.shape
    assert cache.get_seq_length() == 12 + 11
    assert (
        out == expected
    ).float().mean() > 0.5  # 8-bit keys and values barely move a random model


def test_per_token_key_groups_quantize_each_token_on_its_own():
    cache = QuantizedKVCache(bits=4, group_size=8, residual=0, key_groups="token")
    keys = torch.randn(1, 2, 24, 16) * torch.linspace(0.1, 30, 16)
    values = torch.randn(1, 2, 24, 16)
    k_out, v_out = cache.update(keys, values, 0)
    # Independent oracle: quantize 8-token blocks of keys with groups along the channel axis.
    expected = torch.cat(
        [quantize(keys[..., i : i + 8, :], 4, 8, axis=-1).dequantize() for i in range(0, 24, 8)], -2
    )
    assert torch.allclose(k_out, expected)
    per_channel = QuantizedKVCache(bits=4, group_size=8, residual=0).update(keys, values, 0)[0]
    assert not torch.allclose(k_out, per_channel)
    assert torch.equal(
        v_out, QuantizedKVCache(bits=4, group_size=8, residual=0).update(keys, values, 0)[1]
    )
    with pytest.raises(ValueError, match="key_groups"):
        QuantizedKVCache(key_groups="head")


def test_kivi_nbytes_matches_the_cache_and_explains_the_short_saving():

    torch.manual_seed(0)
    cache = QuantizedKVCache(bits=2, group_size=32, residual=32)
    k = torch.randn(1, 2, 128, 32)
    cache.update(k, torch.randn_like(k), 0)
    elements = 2 * 2 * 32  # keys and values, one layer, 2 heads of 32
    held = kivi_nbytes(
        128, elements, bits=2, group_size=32, residual=32, element_bytes=4, meta_bytes=4
    )
    assert held == cache.nbytes
    # 96 tokens quantized, 32 residual: the saving is far below the codes' own ratio
    full = 128 * elements * 4
    codes_only = elements * 4 / (quantized_nbytes(elements, 2, 32, 4))
    assert full / held < codes_only / 2
    long = 1 << 16
    assert (
        full / held
        < long * elements * 4 / kivi_nbytes(long, elements, 2, 32, 32, 4, 4)
        < codes_only
    )
    assert kivi_nbytes(40, elements, 2, 32, 32, 4, 4) == 40 * elements * 4  # nothing quantized yet
    with pytest.raises(ValueError, match="residual"):
        kivi_nbytes(10, elements, 2, 32, -1)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(bits=4.0), ValueError, r"bits must be one of \(2, 4, 8\)"),
        (dict(bits=True), ValueError, "bits must be one of"),
        (dict(bits=3), ValueError, "bits must be one of"),
    ],
)
def test_quantized_cache_refuses_bad_bits(kwargs, error, match):
    """issue 22: 4.0 is not the integer 4 (nor True the 1) to a choice of bit widths."""
    with pytest.raises(error, match=match):
        QuantizedKVCache(**kwargs)
