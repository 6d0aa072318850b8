"""Section 9.7 on a trained model: the measurements notebook 08 makes with kvlab.trained_model(),
checked here on small random models against independent computations (token-by-token streaming,
a loop of fresh forward passes, the model's own projections, uniform attention)."""

import math

import pytest
import torch

import kvlab
from kvlab.cache.longctx import QuantizedKVCache, cached_keys_values, channel_rms, quantize, quantized_cache_quality, recompute_stream_eval, rotary_of, rotate, sink_share, stream_eval, uniform_share

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def model():
    m = kvlab.tiny_model("llama", **SMALL)
    m.set_attn_implementation("eager")
    return m


def _ids(n, seed=0, vocab=512):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_sink_share_matches_streaming_token_by_token(model):
    tokens = _ids(41, seed=1)
    share = sink_share(model, tokens[:40], first=3, skip=8)
    assert share.shape == (2, 4)
    stepped = stream_eval(model, tokens, first=3, attention=True)  # one query at a time, through a cache
    assert math.isclose(float(share.mean()), float(stepped.mass_first[8:].mean()), rel_tol=1e-4)


def test_sink_share_of_uniform_attention_is_the_uniform_share(model):
    import copy

    flat = copy.deepcopy(model)
    for layer in flat.model.layers:
        torch.nn.init.zeros_(layer.self_attn.q_proj.weight)  # every score 0: softmax is uniform
    share = sink_share(flat, _ids(50, seed=2), first=2, skip=5)
    assert torch.allclose(share, torch.full_like(share, uniform_share(50, 2, 5)), atol=1e-6)


def test_sink_share_rejects_bad_input(model):
    with pytest.raises(ValueError, match="first"):
        sink_share(model, _ids(10), first=0)
    with pytest.raises(ValueError, match="longer"):
        sink_share(model, _ids(10), first=2, skip=10)
    sdpa = kvlab.tiny_model("llama", **SMALL)
    sdpa.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="eager"):
        sink_share(sdpa, _ids(20))


@pytest.mark.parametrize("window, stride", [(5, 1), (8, 3), (29, 1)])
def test_recompute_matches_a_loop_of_fresh_forward_passes(model, window, stride):
    tokens = _ids(30, seed=3)
    positions, nll = recompute_stream_eval(model, tokens, window, stride=stride, batch=4)
    assert positions.tolist() == list(range(window - 1, 29, stride))
    for t, loss in zip(positions.tolist(), nll):
        with torch.inference_mode():
            logits = model(tokens[t - window + 1: t + 1][None]).logits[0, -1]
        expected = torch.nn.functional.cross_entropy(logits[None], tokens[t + 1: t + 2])
        assert math.isclose(float(loss), float(expected), rel_tol=1e-4, abs_tol=1e-5)


def test_recompute_rejects_bad_input(model):
    with pytest.raises(ValueError, match="start"):
        recompute_stream_eval(model, _ids(10), 4, start=2)
    with pytest.raises(ValueError, match="window"):
        recompute_stream_eval(model, _ids(10), 0)


def test_cached_keys_are_the_rotated_projections(model):
    tokens = _ids(20, seed=4)
    keys, values = cached_keys_values(model, tokens)
    assert keys.shape == values.shape == (2, 2, 20, 16)
    with torch.inference_mode():
        hidden = model(tokens[None], output_hidden_states=True).hidden_states
    inv_freq, scaling = rotary_of(model)
    for i, layer in enumerate(model.model.layers):
        with torch.inference_mode():
            h = layer.input_layernorm(hidden[i])
            k = layer.self_attn.k_proj(h).view(1, 20, 2, 16).transpose(1, 2)
            v = layer.self_attn.v_proj(h).view(1, 20, 2, 16).transpose(1, 2)
        assert torch.allclose(keys[i], rotate(k, torch.arange(20)[None], inv_freq, scaling)[0], atol=1e-5)
        assert torch.allclose(values[i], v[0], atol=1e-6)
    assert torch.allclose(channel_rms(keys), keys.pow(2).mean(-2).sqrt())


def test_per_token_key_groups_quantize_each_token_on_its_own():
    cache = QuantizedKVCache(bits=4, group_size=8, residual=0, key_groups="token")
    keys = torch.randn(1, 2, 24, 16) * torch.linspace(0.1, 30, 16)
    values = torch.randn(1, 2, 24, 16)
    k_out, v_out = cache.update(keys, values, 0)
    # Independent oracle: quantize 8-token blocks of keys with groups along the channel axis.
    expected = torch.cat([quantize(keys[..., i: i + 8, :], 4, 8, axis=-1).dequantize() for i in range(0, 24, 8)], -2)
    assert torch.allclose(k_out, expected)
    per_channel = QuantizedKVCache(bits=4, group_size=8, residual=0).update(keys, values, 0)[0]
    assert not torch.allclose(k_out, per_channel)
    assert torch.equal(v_out, QuantizedKVCache(bits=4, group_size=8, residual=0).update(keys, values, 0)[1])
    with pytest.raises(ValueError, match="key_groups"):
        QuantizedKVCache(key_groups="head")


def test_quantized_cache_quality(model):
    chunks = torch.stack([_ids(64, seed=s) for s in range(3)])
    full = quantized_cache_quality(model, chunks, None)
    with torch.inference_mode():
        loss = model(chunks, labels=chunks).loss
    assert math.isclose(full["ppl"], float(loss.exp()), rel_tol=1e-4)
    elements = 2 * 2 * 2 * 16  # K and V, 2 layers, 2 KV heads, head dim 16
    assert full["nbytes"] == full["full_bytes"] == chunks.numel() * elements * 4
    eight = quantized_cache_quality(model, chunks, 8, group_size=16)
    two = quantized_cache_quality(model, chunks, 2, group_size=16, key_groups="token")
    assert abs(eight["ppl"] / full["ppl"] - 1) < abs(two["ppl"] / full["ppl"] - 1)
    assert two["nbytes"] < eight["nbytes"] < full["full_bytes"] == eight["full_bytes"]
    with pytest.raises(ValueError, match="bits"):
        quantized_cache_quality(model, chunks, 3)
    with pytest.raises(ValueError, match="chunks"):
        quantized_cache_quality(model, chunks[0], 8)


@pytest.mark.parametrize("num_sink, window", [(1, 6), (4, 9), (0, 7)])
def test_masked_stream_with_in_cache_positions_matches_the_streaming_cache(model, num_sink, window):
    from kvlab.cache.longctx import SinkCache, masked_stream_eval

    tokens = _ids(40, seed=6)
    cache = SinkCache(num_sink, window, rope="cache", model=model)
    stepped = stream_eval(model, tokens, cache, first=3, recent=5, attention=True)
    masked = masked_stream_eval(model, tokens, num_sink, window, first=3, recent=5, rope="cache")
    assert torch.allclose(stepped.logprobs, masked.logprobs, atol=1e-4)
    assert torch.allclose(stepped.mass_first, masked.mass_first, atol=1e-5)
    assert model.config._attn_implementation == "eager"  # restored
    original = masked_stream_eval(model, tokens, num_sink, window, first=3, recent=5)
    if num_sink:  # the two conventions differ once the sinks are moved
        assert not torch.allclose(original.logprobs, masked.logprobs, atol=1e-4)
