"""kvlab.lab.streams: one masked pass equals streaming token by token through the cache, in both
conventions."""

import math

import pytest
import torch

import kvlab
from kvlab.cache.window import SinkCache
from kvlab.lab.streams import (
    eviction_mask,
    kl_divergence,
    masked_stream_eval,
    recompute_stream_eval,
    stream_eval,
)

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.mark.parametrize("num_sink, window", [(0, 7), (3, 9), (0, None)])
def test_masked_stream_matches_streaming_through_the_cache(num_sink, window):
    model = kvlab.tiny_model("llama", **SMALL)
    model.set_attn_implementation("eager")
    tokens = _ids(30, seed=5)
    cache = None if window is None else SinkCache(num_sink, window)
    stepped = stream_eval(model, tokens, cache, first=3, recent=5, attention=True)
    masked = masked_stream_eval(model, tokens, num_sink, window, first=3, recent=5)
    assert torch.allclose(stepped.logprobs, masked.logprobs, atol=1e-4)
    assert torch.allclose(stepped.mass_first, masked.mass_first, atol=1e-5)
    assert torch.allclose(stepped.mass_recent, masked.mass_recent, atol=1e-5)
    assert stepped.stored == masked.stored


@pytest.fixture(scope="module")
def model():
    m = kvlab.tiny_model("llama", **SMALL)
    m.set_attn_implementation("eager")
    return m


def _ids(n, seed=0, vocab=512):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("window, stride", [(5, 1), (8, 3), (29, 1)])
def test_recompute_matches_a_loop_of_fresh_forward_passes(model, window, stride):
    tokens = _ids(30, seed=3)
    positions, nll = recompute_stream_eval(model, tokens, window, stride=stride, batch=4)
    assert positions.tolist() == list(range(window - 1, 29, stride))
    for t, loss in zip(positions.tolist(), nll):
        with torch.inference_mode():
            logits = model(tokens[t - window + 1 : t + 1][None]).logits[0, -1]
        expected = torch.nn.functional.cross_entropy(logits[None], tokens[t + 1 : t + 2])
        assert math.isclose(float(loss), float(expected), rel_tol=1e-4, abs_tol=1e-5)


def test_recompute_rejects_bad_input(model):
    with pytest.raises(ValueError, match="start"):
        recompute_stream_eval(model, _ids(10), 4, start=2)
    with pytest.raises(ValueError, match="window"):
        recompute_stream_eval(model, _ids(10), 0)


@pytest.mark.parametrize("num_sink, window", [(1, 6), (4, 9), (0, 7)])
def test_masked_stream_with_in_cache_positions_matches_the_streaming_cache(model, num_sink, window):

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


def test_masked_stream_eval_refuses_window_zero(model):
    with pytest.raises(ValueError, match=r"window must be an int >= 1, got 0"):
        masked_stream_eval(model, torch.arange(8), num_sink=0, window=0)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "eviction_mask window 0": (
        lambda: eviction_mask(8, 0, 0),
        ValueError,
        r"window must be an int >= 1",
    ),
    "kl shapes": (
        lambda: kl_divergence(torch.zeros(3, 4), torch.zeros(3, 5)),
        ValueError,
        "one shape",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_streaming_sweep_runs_every_cache_over_the_same_positions(model):
    from kvlab.lab.streams import compare, streaming_sweep

    tokens = _ids(40, seed=7)
    sweep = streaming_sweep(
        model, tokens, 12, sinks=(0, 2), both_conventions_at=2, recompute_stride=5
    )
    assert set(sweep.bounded) == {(0, "cache"), (2, "cache"), (2, "original")}
    assert all(v.shape == sweep.full.shape == (39,) for v in sweep.bounded.values())
    assert torch.equal(sweep.full, masked_stream_eval(model, tokens).nll)
    assert torch.equal(
        sweep.bounded[2, "cache"], masked_stream_eval(model, tokens, 2, 10, rope="cache").nll
    )
    # nothing is evicted before t = budget: every cache predicts as the full cache does there
    for nll in sweep.bounded.values():
        assert torch.allclose(nll[: sweep.budget], sweep.full[: sweep.budget], atol=1e-5)
    positions, nll = recompute_stream_eval(model, tokens, 12, start=12, stride=5)
    assert torch.equal(sweep.recompute_positions, positions) and torch.allclose(
        sweep.recompute, nll
    )
    assert math.isfinite(sweep.perplexity(sweep.full))
    assert sweep.perplexity(sweep.full) == pytest.approx(
        math.exp(float(sweep.full[12:].double().mean()))
    )
    sp = compare(sweep.full[12:], sweep.bounded[0, "cache"][12:], 9)
    assert sp.n == 3 and math.isfinite(sp.mean)
    with pytest.raises(ValueError, match="same positions"):
        compare(sweep.full, sweep.full[1:], 4)
    with pytest.raises(ValueError, match="longer than budget"):
        streaming_sweep(model, tokens[:12], 12)
    with pytest.raises(ValueError, match="sinks"):
        streaming_sweep(model, tokens, 12, sinks=(13,))


def test_masked_stream_without_attention_gives_the_same_losses(model):
    tokens = _ids(20, seed=2)
    with_mass = masked_stream_eval(model, tokens, 2, 6)
    losses = masked_stream_eval(model, tokens, 2, 6, attention=False)
    assert (
        losses.mass_first is None
        and losses.mass_recent is None
        and losses.stored == with_mass.stored
    )
    assert torch.allclose(losses.nll, with_mass.nll, atol=1e-6)


def test_kl_divergence_refuses_probabilities():
    """issue 22: probabilities where log-probabilities belong would give a meaningless number."""
    p = torch.softmax(torch.randn(3, 5), -1)
    with pytest.raises(ValueError, match="reference must hold log-probabilities"):
        kl_divergence(p, p.log())


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda m, t: stream_eval(m, t, attention="no"),
            TypeError,
            "attention must be True or False",
        ),
        (
            lambda m, t: stream_eval(m, t + m.config.vocab_size),
            ValueError,
            r"tokens\[0\] must be a token id in \[0, ",
        ),
        (lambda m, t: stream_eval(None, t), TypeError, "model must be a Hugging Face causal LM"),
        (lambda m, t: masked_stream_eval(m, -t - 1), ValueError, r"tokens\[0\] must be a token id"),
        (
            lambda m, t: recompute_stream_eval(m, t, 4, batch=0),
            ValueError,
            "batch must be an int >= 1",
        ),
        (
            lambda m, t: recompute_stream_eval(m, t.tolist(), 4),
            TypeError,
            "tokens must be an integer torch.Tensor",
        ),
    ],
)
def test_stream_evals_refuse_bad_input(model, call, error, match):
    """issue 22: not an IndexError from the embedding, nor torch's split error, nor a str taken as
    True."""
    with pytest.raises(error, match=match):
        call(model, torch.arange(1, 9))
