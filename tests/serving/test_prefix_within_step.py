"""Prefix sharing within a step (notebooks 06 and 11): a request admitted behind another in the same
step reuses the full blocks the other's chunk computes in that forward pass, as vLLM v1 registers a
request's full blocks when it allocates the step's slots. The oracle is Hugging Face ``generate`` on
each prompt alone; the counts are the blocks' arithmetic (a burst behind one system prompt computes
it once). Also: reversing store and attention inside a layer is caught, a failed step takes its
registrations back, and a few hundred requests on a pool that preempts (recompute and swap) still
decode ``generate``'s tokens."""

import functools
import random

import pytest
import torch

import kvlab
from kvlab.serving import attention
from kvlab.serving.engine import Engine

VOCAB, BLOCK = 512, 16


@functools.lru_cache(maxsize=1)
def _model():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=VOCAB,
        intermediate=256,
        device="cpu",
        dtype=torch.float32,
        seed=3,
    )


@functools.lru_cache(maxsize=None)
def _generate(prompt: tuple, new: int) -> list[int]:
    model = _model()
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([list(prompt)])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
    )
    return out[0, len(prompt) :].tolist()


def _burst(shared: int, own: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(shared)]
    return [system + [rng.randrange(VOCAB) for _ in range(own)] for _ in range(n)]


def _shared_once(prompts, shared: int, block_size: int = BLOCK) -> int:
    """Prefill tokens when the first prompt computes the shared full blocks and every other prompt
    reuses them."""
    reused = shared // block_size * block_size
    return len(prompts[0]) + sum(len(p) - reused for p in prompts[1:])


@pytest.mark.parametrize(
    "path, shared, max_batch",
    [
        ("gather", 64, 16),  # the burst: 16 requests, 64 shared tokens, 8 own each
        ("gather", 64, 4),
        ("gather", 60, 16),  # the shared prompt ends inside a block: that block is everyone's own
        ("reference", 64, 16),
        ("kernel", 37, 5),
    ],
)
def test_a_burst_behind_one_system_prompt_computes_it_once(path, shared, max_batch):
    prompts = _burst(shared, 8, 16 if path != "kernel" else 5)
    engine = Engine(
        _model(), num_blocks=256, block_size=BLOCK, max_batch=max_batch, attention=path, debug=True
    )
    out = engine.generate(prompts, 3)
    assert out == [_generate(tuple(p), 3) for p in prompts]
    assert engine.stats.prefill_tokens == _shared_once(prompts, shared)
    assert engine.metrics()["prefix_hit_rate"] > 0 and engine.all_blocks_free_or_cached()


def test_the_burst_decodes_wrong_tokens_if_a_layer_attends_before_it_stores(monkeypatch):
    """The guard of the rule that makes sharing within a step correct: with the store moved after
    the attention, the step reads K and V nobody wrote yet, and the tokens leave generate's."""
    store = attention._store

    def late(path, k_new, v_new, k_pool, v_pool, slots):
        pending.append((path, k_new, v_new, k_pool, v_pool, slots))

    def attend_then_store(*args, **kwargs):
        out = real(*args, **kwargs)
        while pending:
            store(*pending.pop())
        return out

    pending, real = [], attention.paged_attention
    monkeypatch.setattr(attention, "_store", late)
    monkeypatch.setattr(attention, "paged_attention", attend_then_store)
    prompts = _burst(64, 8, 4)
    engine = Engine(_model(), num_blocks=64, block_size=BLOCK, max_batch=4, attention="gather")
    assert engine.generate(prompts, 3) != [_generate(tuple(p), 3) for p in prompts]


def test_a_fully_cached_prompt_recomputes_only_its_last_block():
    """Three identical prompts of exactly four blocks, admitted in one step: the first computes 64
    tokens, each repeat reuses three blocks and computes the last one (its last token's logits give
    the first output token; hits stop at the last full block before it, as in vLLM v1)."""
    (prompt,) = _burst(64, 0, 1, seed=5)
    engine = Engine(_model(), num_blocks=64, block_size=BLOCK, max_batch=4, debug=True)
    out = engine.generate([prompt] * 3, 4)
    assert out == [_generate(tuple(prompt), 4)] * 3
    assert engine.stats.prefill_tokens == 64 + 2 * BLOCK
    assert [r.cached_tokens for r in engine.requests.values()] == [0, 48, 48]


def test_a_chunk_that_ends_inside_the_shared_prompt_shares_what_it_has_computed():
    """A 48-token budget cuts the first prefill inside the 64-token system prompt; the others are
    admitted once there is budget left, and reuse every full block registered by then."""
    prompts = _burst(64, 8, 6, seed=2)
    engine = Engine(
        _model(), num_blocks=128, block_size=BLOCK, max_batch=8, max_batched_tokens=48, debug=True
    )
    assert engine.generate(prompts, 3) == [_generate(tuple(p), 3) for p in prompts]
    first = [e.detail for e in engine.events if e.request == 0 and e.kind == "prefill"]
    assert first[0] == 48  # its first chunk ends inside block 3 of the system prompt
    assert [r.cached_tokens for r in engine.requests.values()][1:] == [64] * 5
    assert engine.stats.prefill_tokens == _shared_once(prompts, 64)


def test_a_failed_step_takes_back_the_registrations_it_made():
    prompts = _burst(64, 8, 4, seed=3)
    model = _model()
    engine = Engine(model, num_blocks=64, block_size=BLOCK, max_batch=4, debug=True)
    for p in prompts:
        engine.add_request(p, 3)
    mlp = model.model.layers[-1].mlp

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure in the last layer")

    mlp.forward = fail
    try:
        with pytest.raises(RuntimeError, match="injected"):
            engine.step()
    finally:
        del mlp.forward
    assert engine.cache.manager.cached_blocks() == {} and engine.cache.num_free == 64
    assert all(r.state == "waiting" and r.seq is None for r in engine.requests.values())
    engine.check_invariants()
    while engine.has_work():
        engine.step()
    assert [r.output for r in engine.requests.values()] == [_generate(tuple(p), 3) for p in prompts]
    assert engine.stats.prefill_tokens == _shared_once(prompts, 64)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_hundreds_of_requests_sharing_prompts_on_a_pool_that_preempts(preemption):
    """240 requests behind four system prompts (two block-aligned, two not), 1 to 12 own tokens and
    4 to 16 new ones, all at once on a pool of 20 blocks of 8: the sharers are preempted and
    readmitted, and every request decodes generate's tokens."""
    rng = random.Random(11)
    systems = [[rng.randrange(VOCAB) for _ in range(n)] for n in (16, 21, 32, 45)]
    prompts = [
        systems[i % 4] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
        for i in range(240)
    ]
    news = [rng.randint(4, 16) for _ in prompts]
    engine = Engine(
        _model(),
        num_blocks=20,
        block_size=8,
        max_batch=64,
        max_batched_tokens=256,
        preemption=preemption,
        watermark=0.0,
        debug=True,
    )
    out = engine.generate(prompts, news)
    assert out == [_generate(tuple(p), n) for p, n in zip(prompts, news)]
    assert engine.scheduler.stats.preemptions > 0
    assert engine.stats.prefill_tokens < sum(map(len, prompts))
    assert engine.all_blocks_free_or_cached()
