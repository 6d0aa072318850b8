"""Section 9.7: cache sizes against the seeds, bounded caches against independent oracles (HF's
sliding-window Mistral, an fp64 banded-mask forward pass), RoPE composition, and quantization
bounds and byte counts."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.decode import cached_decode
from kvlab.cache.longctx import BoundedLayer, LatentKVCache, QuantizedKVCache, SinkCache, SlidingWindowCache, attention_error, cache_bytes, design_table, gqa_from_mha, kv_basis, masked_stream_eval, outlier_keys, quantize, quantized_nbytes, stream_eval, rerotation_scores, rotary_of, rotate, window_span

GIB = 2**30
SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def _ids(batch, length, seed=0, vocab=512):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- bytes

def test_table_9_3_exact():
    # Seed 000, Table 9.3: Llama 3 8B-like shape, 131,072 tokens, BF16 unless stated.
    rows = {d.name: d for d in design_table("llama-3-8b", 131_072, window=4096)}
    assert rows["Full multi-head attention"].bytes == 64 * GIB
    assert rows["Grouped-query attention"].bytes == 16 * GIB
    assert rows["Grouped-query attention, FP8 cache"].bytes == 8 * GIB
    assert rows["Grouped-query, 4,096-token window"].bytes == 0.5 * GIB
    assert rows["Grouped-query, 4,096-token window"].tokens_stored == 4096
    assert cache_bytes("llama-3-8b", 131_072, 2, kv_heads=32) == 2 * 131_072 * 32 * 32 * 128 * 2


def test_deepseek_v2_latent_bytes_per_token():
    # Seed 004, section 2.1: (512 + 64) x 60 layers x 2 bytes = 69,120 bytes per token.
    assert cache_bytes("deepseek-v2", 1) == 69_120
    assert cache_bytes("deepseek-v2", 1000) == 69_120_000


def test_mistral_window_span_and_rolling_cache():
    # Seed 000, 9.7: W = 4,096 over 32 layers spans "about 131,000" tokens; 8x less cache at 32k.
    assert window_span(4096, 32) == 131_072
    mistral = kvlab.SHAPES["mistral-7b"]
    full = cache_bytes(mistral, 32_768, window=32_768)
    assert full / cache_bytes(mistral, 32_768) == 8


def test_hybrid_and_mla_rows_add_up():
    rows = {d.name: d for d in design_table("llama-3-8b", 131_072, window=4096, global_layers=8)}
    per_layer_full = 16 * GIB / 32
    hybrid = next(d for n, d in rows.items() if n.startswith("Hybrid"))
    assert hybrid.bytes == 8 * per_layer_full + 24 * per_layer_full / 32
    mla = next(d for n, d in rows.items() if n.startswith("MLA"))
    assert mla.bytes == 131_072 * 32 * 576 * 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"), (dict(kv_heads=3), "kv_heads"), (dict(tokens=0), "tokens"),
])
def test_cache_bytes_rejects_bad_input(kwargs, match):
    args = dict(shape="llama-3-8b", tokens=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        cache_bytes(**args)


# --------------------------------------------------------------------------- bounded caches

def test_window_at_least_the_sequence_is_full_attention(llama):
    ids = _ids(2, 9)
    expected = llama.generate(ids, max_new_tokens=15, do_sample=False)[:, 9:]
    assert torch.equal(cached_decode(llama, ids, 15), expected)
    for cache in (SlidingWindowCache(24), SlidingWindowCache(100), SinkCache(4, 20), SinkCache(0, 24),
                  SlidingWindowCache(24, rope="cache", model=llama), SinkCache(3, 21, rope="cache", model=llama)):
        assert torch.equal(cached_decode(llama, ids, 15, cache=cache), expected), cache


def test_window_over_a_padded_batch_is_full_attention(llama):
    ids = _ids(3, 8, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)[:, 8:]
    got = cached_decode(llama, ids, 10, attention_mask=mask, cache=SlidingWindowCache(18))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("prompt", [5, 19])
def test_sliding_window_matches_hf_mistral(prompt):
    # Independent oracle: Mistral's own sliding-window mask and DynamicSlidingWindowLayer.
    window = 11
    model = kvlab.tiny_model("mistral", window=window, **SMALL)
    ids = _ids(2, prompt, seed=prompt)
    expected = model.generate(ids, max_new_tokens=25, do_sample=False)[:, prompt:]
    assert torch.equal(cached_decode(model, ids, 25, cache=SlidingWindowCache(window)), expected)


def _banded_oracle(model, ids, new, num_sink, window):
    """Greedy tokens from full fp64 forward passes with an explicit mask: prompt queries see the
    prompt causally; each generated position sees the first num_sink tokens and the last window."""
    model = model.double()
    seq, prompt = ids.clone(), ids.shape[1]
    out = []
    for _ in range(new):
        n = seq.shape[1]
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        allowed = (j <= i) & ((i < prompt) | (j < num_sink) | (i - j < window))
        mask = torch.zeros(n, n, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
        logits = model(seq, attention_mask=mask[None, None].expand(seq.shape[0], 1, n, n), use_cache=False).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        out.append(token)
        seq = torch.cat([seq, token], dim=1)
    model.float()
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("num_sink, window", [(0, 6), (4, 5), (2, 1), (1, 9)])
def test_eviction_matches_a_banded_fp64_mask(num_sink, window):
    model = kvlab.tiny_model("llama", **SMALL).double()
    ids = _ids(2, 10, seed=num_sink + window)
    expected = _banded_oracle(model, ids, 20, num_sink, window)
    cache = SinkCache(num_sink, window)
    assert torch.equal(cached_decode(model, ids, 20, cache=cache), expected)
    if num_sink == 0:
        assert torch.equal(cached_decode(model, ids, 20, cache=SlidingWindowCache(window)), expected)


@settings(max_examples=15, deadline=None)
@given(num_sink=st.integers(0, 5), window=st.integers(1, 12), prompt=st.integers(1, 20), new=st.integers(1, 25))
def test_cache_never_holds_more_than_sinks_plus_window(num_sink, window, prompt, new):
    model = _tiny()
    cache = SinkCache(num_sink, window)
    seen = []
    original = cache.update

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.append(cache.stored_tokens)
        if args[0].shape[-2] == 1:
            seen.append(result[0].shape[-2])  # what a decode query attends to
        return result

    cache.update = spy
    cached_decode(model, _ids(1, prompt), new, cache=cache)
    assert max(seen) <= num_sink + window
    assert cache.get_seq_length() == prompt + new - 1
    assert cache.stored_tokens == min(prompt + new - 1, num_sink + window)


_TINY = {}


def _tiny():
    if "m" not in _TINY:
        _TINY["m"] = kvlab.tiny_model("llama", **SMALL)
    return _TINY["m"]


def test_in_cache_rope_rotates_keys_at_their_slots(llama):
    # Feed a layer keys rotated at absolute positions, read them back: slot i of n must carry the
    # rotation of (newest position - (n - 1 - i)), computed here from the raw keys directly.
    inv_freq, _ = rotary_of(llama)
    num_sink, window, total = 2, 3, 9
    raw = torch.randn(1, 2, total, 16, dtype=torch.float64)
    layer = BoundedLayer(num_sink, window, rope="cache", inv_freq=inv_freq[:8])
    for t in range(total):
        k = rotate(raw[:, :, t: t + 1], [t], inv_freq[:8])
        keys, _ = layer.update(k, k, kwargs={"position_ids": torch.tensor([[t]])})
    kept = [0, 1, 6, 7, 8]
    slots = torch.arange(len(kept)) + total - len(kept)
    assert torch.allclose(keys, rotate(raw[:, :, kept], slots, inv_freq[:8]), atol=1e-12)
    assert layer.positions[0].tolist() == kept


@settings(max_examples=40, deadline=None)
@given(p=st.floats(-5000, 5000), d=st.floats(-5000, 5000), dim=st.sampled_from([2, 8, 64]))
def test_rotating_by_p_then_d_is_rotating_by_p_plus_d(p, d, dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    x = torch.randn(3, dim, dtype=torch.float64)
    twice = rotate(rotate(x, [p] * 3, inv_freq), [d] * 3, inv_freq)
    assert torch.allclose(twice, rotate(x, [p + d] * 3, inv_freq), atol=1e-9)
    assert torch.allclose(rotate(twice, [-(p + d)] * 3, inv_freq), x, atol=1e-9)  # and it undoes


def test_rotate_matches_hf_rope(llama):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x = torch.randn(2, 2, 7, 16)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [0, 0, 1, 2, 3, 4, 5]])
    cos, sin = llama.model.rotary_emb(x, pos)
    _, expected = apply_rotary_pos_emb(x, x, cos, sin)
    inv_freq, scaling = rotary_of(llama)
    assert torch.allclose(rotate(x, pos, inv_freq, scaling), expected, atol=1e-5)


def test_rerotated_keys_change_scores_by_relative_position():
    dim = 32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    q, k = torch.randn(dim), torch.randn(10, dim)
    pos = torch.arange(10)
    s = rerotation_scores(q, k, inv_freq, 20, pos)
    # Correct: depends on t - p. Plus-current-position: on -p. Twice: on t - 2p. Check by rotation.
    expected = (rotate(k.double(), pos.double() - 20, inv_freq) @ q.double()) / math.sqrt(dim)
    assert torch.allclose(s["correct"], expected)
    assert torch.allclose(s["plus current position"], (rotate(k.double(), pos.double(), inv_freq) @ q.double()) / math.sqrt(dim))
    assert torch.allclose(s["twice its own position"][0], s["correct"][0])  # p = 0 is unharmed
    assert not torch.allclose(s["twice its own position"][1:], s["correct"][1:])


def test_bounded_caches_reject_bad_arguments(llama):
    with pytest.raises(ValueError, match="window"):
        SlidingWindowCache(0)
    with pytest.raises(ValueError, match="window"):
        SinkCache(4, 0)
    with pytest.raises(ValueError, match="num_sink"):
        SinkCache(-1, 4)
    with pytest.raises(TypeError, match="window"):
        SlidingWindowCache(2.5)
    with pytest.raises(ValueError, match="rope"):
        SinkCache(4, 8, rope="absolute")
    with pytest.raises(ValueError, match="model="):
        SinkCache(4, 8, rope="cache")
    with pytest.raises(ValueError, match="rotary"):
        SinkCache(4, 8, rope="cache", model=kvlab.tiny_model("gpt2", layers=1, hidden=32, q_heads=2,
                                                             intermediate=64, vocab=64))


# --------------------------------------------------------------------------- quantization

@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), group=st.sampled_from([1, 2, 3, 4, 5, 8]), rows=st.integers(1, 6),
       groups=st.integers(1, 5), axis=st.sampled_from([0, 1, -1]), seed=st.integers(0, 10_000),
       spread=st.sampled_from([1e-3, 1.0, 50.0]))
def test_dequantization_error_is_at_most_half_a_step(bits, group, rows, groups, axis, seed, spread):
    g = torch.Generator().manual_seed(seed)
    shape = [rows, group * groups] if axis != 0 else [group * groups, rows]
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * spread + torch.randn(1, generator=g, dtype=torch.float64)
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


@pytest.mark.parametrize("bad, match", [
    (dict(bits=3), "bits"), (dict(bits=16), "bits"), (dict(group_size=5), "group_size"),
    (dict(group_size=0), "group_size"), (dict(axis=4), "axis"),
])
def test_quantize_rejects_bad_arguments(bad, match):
    args = dict(x=torch.randn(4, 32), bits=4, group_size=8, axis=-1)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        quantize(**args)
    with pytest.raises(TypeError, match="floating"):
        quantize(torch.ones(4, 8, dtype=torch.int32), 4, 4)


def test_quantized_cache_rejects_bad_arguments():
    with pytest.raises(ValueError, match="bits"):
        QuantizedKVCache(bits=3)
    with pytest.raises(ValueError, match="residual"):
        QuantizedKVCache(residual=-1)
    with pytest.raises(ValueError, match="group_size"):
        cached_decode(_tiny(), _ids(1, 4), 3, cache=QuantizedKVCache(bits=4, group_size=12))


@pytest.mark.parametrize("bits, group, residual, chunks", [
    (2, 8, 5, [23, 1, 1, 1, 9, 1]), (4, 4, 0, [1] * 13), (8, 16, 20, [7, 30, 1, 1]),
])
def test_kivi_cache_residual_exact_and_bytes(bits, group, residual, chunks):
    cache = QuantizedKVCache(bits=bits, group_size=group, residual=residual)
    b, h, d = 2, 3, 16
    g = torch.Generator().manual_seed(bits)
    keys = torch.randn(b, h, sum(chunks), d, generator=g) * torch.linspace(0.1, 30, d)  # outlier-ish channels
    values = torch.randn(b, h, sum(chunks), d, generator=g)
    n = 0
    for count in chunks:
        k_out, v_out = cache.update(keys[..., n: n + count, :], values[..., n: n + count, :], 0)
        n += count
        layer = cache.layers[0]
        quantized = max(0, (n - residual) // group * group)
        assert layer.get_seq_length() == n and cache.get_seq_length() == n
        assert layer.keys.shape[-2] == n - quantized >= min(n, residual)
        # The residual window is exact, and so is everything the attention sees from it.
        assert torch.equal(k_out[..., quantized:, :], keys[..., quantized:n, :])
        assert torch.equal(v_out[..., quantized:, :], values[..., quantized:n, :])
        if quantized:
            assert bool(((k_out[..., :quantized, :] - keys[..., :quantized, :]).abs()
                         <= layer.qkeys.step / 2 + 1e-5).all())
            assert bool(((v_out[..., :quantized, :] - values[..., :quantized, :]).abs()
                         <= layer.qvalues.step / 2 + 1e-5).all())
        codes = 2 * quantized * b * h * d * bits // 8
        meta = 2 * 2 * (b * h * d * quantized // group) * 4  # keys and values; scale and zero; fp32
        exact = 2 * (n - quantized) * b * h * d * 4
        assert layer.nbytes == cache.nbytes == codes + meta + exact


def test_kivi_cache_decodes(llama):
    ids = _ids(2, 12)
    expected = cached_decode(llama, ids, 12)
    # Eight bits with a residual longer than the request: nothing is quantized, tokens are exact.
    assert torch.equal(cached_decode(llama, ids, 12, cache=QuantizedKVCache(8, 16, residual=64)), expected)
    cache = QuantizedKVCache(8, 4, residual=2)
    out = cached_decode(llama, ids, 12, cache=cache)
    assert out.shape == expected.shape
    assert cache.get_seq_length() == 12 + 11
    assert (out == expected).float().mean() > 0.5  # 8-bit keys and values barely move a random model


# --------------------------------------------------------------------------- GQA and MLA

def test_gqa_pooling_of_identical_heads_is_exact():
    mha = kvlab.tiny_model("llama", layers=2, hidden=64, q_heads=4, kv_heads=4, intermediate=128, vocab=512)
    with torch.no_grad():
        for layer in mha.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                w = proj.weight.view(4, 16, 64)
                w[1], w[3] = w[0].clone(), w[2].clone()  # pairs of identical heads: pooling loses nothing
    gqa = gqa_from_mha(mha, 2)
    assert gqa.config.num_key_value_heads == 2
    ids = _ids(1, 10)
    with torch.inference_mode():
        assert torch.allclose(mha(ids).logits, gqa(ids).logits, atol=1e-5)
    w = mha.model.layers[0].self_attn.k_proj.weight.view(4, 16, 64)
    assert torch.allclose(gqa.model.layers[0].self_attn.k_proj.weight.view(2, 16, 64)[1], (w[2] + w[3]) / 2)
    with pytest.raises(ValueError, match="kv_heads"):
        gqa_from_mha(mha, 3)


def test_latent_cache_full_rank_is_exact_and_low_rank_is_small(llama):
    ids = _ids(2, 9)
    expected = cached_decode(llama, ids, 10)
    full_rank = 2 * 2 * 16  # 2 x n_kv x d_h
    cache = LatentKVCache(llama, full_rank)
    assert torch.equal(cached_decode(llama, ids, 10, cache=cache), expected)
    small = LatentKVCache(llama, 8)
    cached_decode(llama, ids, 10, cache=small)
    assert small.nbytes == 2 * 18 * 8 * 4 * 2  # batch x tokens x rank x fp32 x layers
    assert small.nbytes * full_rank == cache.nbytes * 8


def test_latent_reconstruction_error_falls_with_rank(llama):
    attention = llama.model.layers[0].self_attn
    x = torch.randn(50, 64, dtype=torch.float64)
    w = torch.cat([attention.k_proj.weight, attention.v_proj.weight]).detach().double()
    kv = x @ w.T
    errors = []
    for rank in (4, 16, 32, 64):
        u, b = kv_basis(attention, rank)
        errors.append(float((kv @ u @ u.T - kv).norm() / kv.norm()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-10
    with pytest.raises(ValueError, match="rank"):
        kv_basis(attention, 65)


@pytest.mark.parametrize("num_sink, window", [(0, 7), (3, 9), (0, None)])
def test_masked_stream_matches_streaming_through_the_cache(num_sink, window):
    model = kvlab.tiny_model("llama", **SMALL)
    model.set_attn_implementation("eager")
    tokens = _ids(1, 30, seed=5)[0]
    cache = None if window is None else SinkCache(num_sink, window)
    stepped = stream_eval(model, tokens, cache, first=3, recent=5, attention=True)
    masked = masked_stream_eval(model, tokens, num_sink, window, first=3, recent=5)
    assert torch.allclose(stepped.logprobs, masked.logprobs, atol=1e-4)
    assert torch.allclose(stepped.mass_first, masked.mass_first, atol=1e-5)
    assert torch.allclose(stepped.mass_recent, masked.mass_recent, atol=1e-5)
    assert stepped.stored == masked.stored
