"""Notebook 11's measurements: the request trace, padded ``generate`` batches, and the engine against
them on one trace (the tokens must agree; timings are never asserted)."""

import math

import pytest
import torch

import kvlab
from kvlab.lab.engine import compare_with_generate, latency_throughput, make_requests, static_generate


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("llama", layers=2, hidden=128, q_heads=4, kv_heads=2, vocab=512, intermediate=256,
                            device="cpu", dtype=torch.float32, seed=3)


def test_make_requests_shares_system_prompts():
    prompts, news = make_requests(12, mean_prompt=8, mean_output=4, max_len=32, shared_prompts=2, shared_len=6,
                                  shared_fraction=1.0, vocab=100, seed=1)
    assert len(prompts) == len(news) == 12 and len({tuple(p[:6]) for p in prompts}) <= 2
    assert all(0 <= t < 100 for p in prompts for t in p) and all(n >= 1 for n in news)
    assert make_requests(12, vocab=100, seed=1) == make_requests(12, vocab=100, seed=1)
    with pytest.raises(ValueError, match="shared_fraction"):
        make_requests(3, shared_fraction=2)


def test_engine_and_padded_generate_agree(model):
    prompts, news = make_requests(6, mean_prompt=8, mean_output=4, max_len=32, vocab=512, seed=2)
    expected, done_at = static_generate(model, prompts, news, batch_size=3)
    assert len(expected) == len(done_at) == 6 and [len(e) for e in expected] == news
    result = compare_with_generate(model, prompts, news, max_batch=3, block_size=4)
    assert result.same_tokens and result.generated_tokens == sum(news)
    assert result.engine_metrics["requests"] == 6
    points = latency_throughput(model, prompts, news, batches=(1, 3), block_size=4)
    assert [p.max_batch for p in points] == [1, 3] and all(p.tokens_per_s > 0 for p in points)


# issue 22's bad calls of this module: (call on the fixture's model, error, a pattern naming the argument)
BAD_CALLS = {
    "mean_output inf": (lambda m: make_requests(4, mean_output=math.inf), ValueError, "mean_output must be a finite"),
    "vocab 1.5": (lambda m: make_requests(4, vocab=1.5), TypeError, "vocab must be an int"),
    "n True": (lambda m: make_requests(True), TypeError, "n must be an int"),
    "batch_size -1": (lambda m: static_generate(m, [[1, 2, 3]], [2], -1), ValueError, "batch_size must be an int >= 1"),
    "one count for two prompts": (lambda m: static_generate(m, [[1, 2], [3, 4]], [2], 1), ValueError,
                                  "max_new_tokens must hold one count per prompt"),
    "token past the vocabulary": (lambda m: static_generate(m, [[1, 512]], [2], 1), ValueError, r"512"),
    "compare float tokens": (lambda m: compare_with_generate(m, [[1.0, 2]], [2]), TypeError, r"prompts\[0\]\[0\]"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_and_leaves_the_model_as_it_was(model, name):
    call, error, match = BAD_CALLS[name]
    own = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with pytest.raises(error, match=match):
            call(model)
        assert model.config._attn_implementation == "eager"  # not switched to sdpa on the way
    finally:
        model.set_attn_implementation(own)
