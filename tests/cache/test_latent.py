"""kvlab.cache.latent: mean-pooled GQA and the MLA-style latent cache, exact at full rank."""

import pytest
import torch

import kvlab
from kvlab.cache.latent import LatentKVCache, gqa_from_mha, kv_basis
from kvlab.decode import cached_decode

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def _ids(batch, length, seed=0, vocab=512):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_gqa_pooling_of_identical_heads_is_exact():
    mha = kvlab.tiny_model(
        "llama", layers=2, hidden=64, q_heads=4, kv_heads=4, intermediate=128, vocab=512
    )
    with torch.no_grad():
        for layer in mha.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                w = proj.weight.view(4, 16, 64)
                w[1], w[3] = (
                    w[0].clone(),
                    w[2].clone(),
                )  # pairs of identical heads: pooling loses nothing
    gqa = gqa_from_mha(mha, 2)
    assert gqa.config.num_key_value_heads == 2
    ids = _ids(1, 10)
    with torch.inference_mode():
        assert torch.allclose(mha(ids).logits, gqa(ids).logits, atol=1e-5)
    w = mha.model.layers[0].self_attn.k_proj.weight.view(4, 16, 64)
    assert torch.allclose(
        gqa.model.layers[0].self_attn.k_proj.weight.view(2, 16, 64)[1], (w[2] + w[3]) / 2
    )
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


def test_a_latent_cache_from_another_model_is_refused(llama):
    other = kvlab.tiny_model(
        "llama",
        layers=3,
        hidden=64,
        q_heads=4,
        kv_heads=4,
        vocab=128,
        intermediate=128,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(ValueError, match="cache has 3 layers but the model has 2"):
        cached_decode(llama, torch.tensor([[1, 2]]), 1, cache=LatentKVCache(other, 8))
    wider = kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=64,
        q_heads=4,
        kv_heads=4,
        vocab=128,
        intermediate=128,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(
        ValueError, match="built for \\[K; V\\] of 128 elements per token, but the model writes 64"
    ):
        cached_decode(llama, torch.tensor([[1, 2]]), 1, cache=LatentKVCache(wider, 8))


def test_latent_cache_from_shared_bases_equals_its_own_svd(llama):
    from kvlab.cache.latent import kv_bases

    bases = kv_bases(llama)
    assert [u.shape for u, _ in bases] == [(64, 64)] * 2
    ids = _ids(1, 9)
    for rank in (8, 64):
        expected = cached_decode(llama, ids, 5, cache=LatentKVCache(llama, rank))
        assert torch.equal(
            cached_decode(llama, ids, 5, cache=LatentKVCache(llama, rank, bases=bases)), expected
        )
    with pytest.raises(ValueError, match="rank must be <= 64"):
        LatentKVCache(llama, 65, bases=bases)
    with pytest.raises(ValueError, match="bases must be kv_bases"):
        LatentKVCache(llama, 8, bases=bases[:1])
