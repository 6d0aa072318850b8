"""Notebook 11's measurements: the request trace and the chat requests, padded ``generate`` batches
with stop tokens (what they carry), transformers' continuous batching, and the engine against all of
them on one trace (the tokens must agree; timings are never asserted). The models the readings
decide by are tested in tests/theory/test_serving_models.py."""

import math

import pytest
import torch

import kvlab
from kvlab.lab import engine as lab
from kvlab.lab.engine import (
    compare_serving,
    continuous_batching,
    latency_throughput,
    make_requests,
    static_generate,
)
from kvlab.serving.engine import Engine


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=512,
        intermediate=256,
        device="cpu",
        dtype=torch.float32,
        seed=3,
    )


def test_make_requests_shares_system_prompts():
    prompts, news = make_requests(
        12,
        mean_prompt=8,
        mean_output=4,
        max_len=32,
        shared_prompts=2,
        shared_len=6,
        shared_fraction=1.0,
        vocab=100,
        seed=1,
    )
    assert len(prompts) == len(news) == 12 and len({tuple(p[:6]) for p in prompts}) <= 2
    assert all(0 <= t < 100 for p in prompts for t in p) and all(n >= 1 for n in news)
    assert make_requests(12, vocab=100, seed=1) == make_requests(12, vocab=100, seed=1)
    with pytest.raises(ValueError, match="shared_fraction"):
        make_requests(3, shared_fraction=2)


def test_padded_generate_counts_what_it_carries(model):
    prompts, news = make_requests(6, mean_prompt=8, mean_output=4, max_len=32, vocab=512, seed=2)
    free = static_generate(model, prompts, news, batch_size=3)
    assert [len(o) for o in free.outputs] == news and len(free.done_at) == 6
    batches = [news[:3], news[3:]]
    assert free.decode_rows == sum(3 * (max(b) - 1) for b in batches)
    assert free.carried_rows == sum(max(b) - n for b in batches for n in b)
    assert free.forward_passes == sum(max(b) for b in batches)
    widths = [max(len(p) for p in prompts[:3]), max(len(p) for p in prompts[3:])]
    assert free.prefill_rows == 3 * sum(widths) and free.padding_tokens == free.prefill_rows - sum(
        map(len, prompts)
    )
    stop = {
        free.outputs[0][1]
    }  # request 0 now ends at its second token, the others wherever they meet it
    stopped = static_generate(model, prompts, [max(news)] * 6, batch_size=3, stop=stop)
    assert stopped.outputs[0] == free.outputs[0][:2]
    assert all(o[-1] in stop or len(o) == max(news) for o in stopped.outputs)
    engine = Engine(model, num_blocks=64, block_size=4, max_batch=3, eos_token_id=None)
    assert engine.generate(prompts, [max(news)] * 6, stop=stop) == stopped.outputs


@pytest.mark.parametrize("sharing", [True, False])
def test_transformers_continuous_batching_gives_the_engines_tokens(model, sharing):
    prompts, news = make_requests(
        5,
        mean_prompt=8,
        mean_output=4,
        max_len=32,
        shared_fraction=1.0,
        shared_len=8,
        vocab=512,
        seed=4,
    )
    stop = {7, 11}
    expected = Engine(model, num_blocks=64, block_size=4, eos_token_id=None).generate(
        prompts, news, stop=stop
    )
    attn = model.config._attn_implementation
    assert (
        continuous_batching(
            model,
            prompts,
            news,
            stop,
            block_size=4,
            num_blocks=64,
            max_batch_tokens=64,
            block_sharing=sharing,
            max_requests=4,
        )
        == expected
    )
    assert model.config._attn_implementation == attn


def test_compare_serving_checks_tokens_and_times_every_contender(model):
    prompts, news = make_requests(6, mean_prompt=8, mean_output=4, max_len=32, vocab=512, seed=2)
    result = compare_serving(model, prompts, news, max_batch=3, block_size=4, reps=2)
    assert all(result.same_tokens.values()) and set(result.seconds) == set(lab.CONTENDERS)
    assert all(len(s) == 2 for s in result.seconds.values()) and result.generated_tokens == sum(
        news
    )
    assert (
        result.engine_metrics[lab.ENGINE]["requests"] == 6
        and result.speedup(lab.ENGINE, lab.GENERATE).median > 0
    )
    rows = lab.peer_rows(result, "here")
    assert rows[0].unit == "bool" and any("target >= 1.5" in r.note for r in rows)
    with pytest.raises(ValueError, match="contenders"):
        compare_serving(model, prompts, news, contenders=(lab.ENGINE,))
    points = latency_throughput(model, prompts, news, batches=(1, 3), block_size=4)
    assert [p.max_batch for p in points] == [1, 3] and all(p.tokens_per_s > 0 for p in points)
    assert all(p.read_rate is None and p.spread == 0 for p in points)
    timed = latency_throughput(
        model, prompts, news, batches=(2,), block_size=4, reps=2, ceilings=True
    )
    assert timed[0].read_rate > 0 and timed[0].matmul_rate > 0 and timed[0].spread >= 0
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        latency_throughput(model, prompts, news, batches=(1,), reps=0)


# issue 22's bad calls of this module: (call on the fixture's model, error, a pattern naming the
# argument)
BAD_CALLS = {
    "mean_output inf": (
        lambda m: make_requests(4, mean_output=math.inf),
        ValueError,
        "mean_output must be a finite",
    ),
    "vocab 1.5": (lambda m: make_requests(4, vocab=1.5), TypeError, "vocab must be an int"),
    "n True": (lambda m: make_requests(True), TypeError, "n must be an int"),
    "batch_size -1": (
        lambda m: static_generate(m, [[1, 2, 3]], [2], -1),
        ValueError,
        "batch_size must be an int >= 1",
    ),
    "one count for two prompts": (
        lambda m: static_generate(m, [[1, 2], [3, 4]], [2], 1),
        ValueError,
        "max_new_tokens must hold one count per prompt",
    ),
    "token past the vocabulary": (
        lambda m: static_generate(m, [[1, 512]], [2], 1),
        ValueError,
        r"512",
    ),
    "compare float tokens": (
        lambda m: compare_serving(m, [[1.0, 2]], [2]),
        TypeError,
        r"prompts\[0\]\[0\]",
    ),
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


def test_a_burst_and_a_staggered_arrival_both_compute_the_system_prompt_once():
    model = kvlab.tiny_model("llama", layers=1, hidden=64, q_heads=2, kv_heads=1, vocab=256)
    prompts, news = lab.burst_requests(256, n=5, system=40, own=(3, 9), new=2, seed=1)
    assert len({tuple(p[:40]) for p in prompts}) == 1 and all(43 <= len(p) <= 49 for p in prompts)
    once = 40 + sum(len(p) - 40 for p in prompts)
    reused = 32  # the system prompt's two full blocks of 16; its last 8 tokens are in a mixed block
    expected = len(prompts[0]) + sum(len(p) - reused for p in prompts[1:])
    assert expected > once  # the unaligned tail of the system prompt is computed by everyone
    for staggered in (False, True):
        assert lab.prefill_tokens(model, prompts, news, staggered) == expected


def test_chunk_budgets_times_each_budget_in_turn(model):
    from kvlab.lab.engine import chunk_budgets, make_requests

    prompts, news = make_requests(3, "lognormal", mean_prompt=12, mean_output=3, max_len=32,
                                  vocab=model.config.vocab_size, seed=1)  # fmt: skip
    got = chunk_budgets(model, prompts, news, [4, 64], reps=2, max_batch=2, num_blocks=16,
                        block_size=4)  # fmt: skip
    assert list(got) == [4, 64]
    for ttft, tpot in got.values():
        assert len(ttft.times) == 2 and ttft.min > 0 and tpot.min > 0
    with pytest.raises(ValueError, match="reps"):
        chunk_budgets(model, prompts, news, [4, 64], reps=1)
