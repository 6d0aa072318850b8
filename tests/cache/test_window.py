"""kvlab.cache.window: sliding-window and sink caches against Hugging Face's Mistral, a banded fp64
mask and their own bound, in both RoPE conventions.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache.rope import rotary_of, rotate
from kvlab.cache.window import BoundedLayer, SinkCache, SlidingWindowCache
from kvlab.decode import cached_decode

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def _ids(batch, length, seed=0, vocab=512):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_window_at_least_the_sequence_is_full_attention(llama):
    ids = _ids(2, 9)
    expected = llama.generate(ids, max_new_tokens=15, do_sample=False)[:, 9:]
    assert torch.equal(cached_decode(llama, ids, 15), expected)
    for cache in (
        SlidingWindowCache(24),
        SlidingWindowCache(100),
        SinkCache(4, 20),
        SinkCache(0, 24),
        SlidingWindowCache(24, rope="cache", model=llama),
        SinkCache(3, 21, rope="cache", model=llama),
    ):
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
        mask = torch.zeros(n, n, dtype=torch.float64).masked_fill(
            ~allowed, torch.finfo(torch.float64).min
        )
        logits = model(
            seq, attention_mask=mask[None, None].expand(seq.shape[0], 1, n, n), use_cache=False
        ).logits
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
        assert torch.equal(
            cached_decode(model, ids, 20, cache=SlidingWindowCache(window)), expected
        )


@settings(max_examples=15, deadline=None)
@given(
    num_sink=st.integers(0, 5),
    window=st.integers(1, 12),
    prompt=st.integers(1, 20),
    new=st.integers(1, 25),
)
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
        k = rotate(raw[:, :, t : t + 1], [t], inv_freq[:8])
        keys, _ = layer.update(k, k, kwargs={"position_ids": torch.tensor([[t]])})
    kept = [0, 1, 6, 7, 8]
    slots = torch.arange(len(kept)) + total - len(kept)
    assert torch.allclose(keys, rotate(raw[:, :, kept], slots, inv_freq[:8]), atol=1e-12)
    assert layer.positions[0].tolist() == kept


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
        SinkCache(
            4,
            8,
            rope="cache",
            model=kvlab.tiny_model(
                "gpt2", layers=1, hidden=32, q_heads=2, intermediate=64, vocab=64
            ),
        )
