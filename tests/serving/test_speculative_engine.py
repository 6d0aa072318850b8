"""Speculative decoding in the engine (issue 34, notebook 11's stack): prompt-lookup proposals
checked in the step's one forward pass, against Hugging Face ``generate`` per request (greedy), on
random tiny models whose prompts repeat themselves so that proposals exist and are often right and
often wrong. Every test checks the engine's invariants after each step (``debug=True``)."""

import functools
import random

import pytest
import torch

import kvlab
from kvlab.cache.blocks import block_hashes
from kvlab.serving.engine import Engine
from kvlab.serving.runner import ModelRunner
from kvlab.serving.scheduler import Scheduler

VOCAB = 64  # a small vocabulary: random models repeat themselves, so proposals are often right


@functools.lru_cache(maxsize=None)
def _model(arch: str = "llama"):
    return kvlab.tiny_model(
        arch, layers=2, hidden=64, q_heads=4, kv_heads=2, vocab=VOCAB, intermediate=128,
        device="cpu", dtype=torch.float32, seed=5,
    )  # fmt: skip


def _prompts(seed: int, n: int = 6) -> list[list[int]]:
    """Prompts that quote themselves (a run of tokens, then part of it again), 2 to 40 tokens."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        run = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        prompts.append(run + run[: rng.randint(1, len(run))])
    return prompts


@functools.lru_cache(maxsize=None)
def _expected(arch: str, prompt: tuple, new: int) -> list[int]:
    model = _model(arch)
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
    )
    return out[0, len(prompt) :].tolist()


def _cached_hashes_are_finalized(engine: Engine, block_size: int) -> None:
    """Every hash the prefix cache holds names a chain of some request's finalized tokens: none
    was made of a draft token (vLLM v1's rule)."""
    finalized = set()
    for request in engine.requests.values():
        finalized.update(block_hashes(request.token_ids, block_size))
    assert set(engine.cache.manager.cached_blocks()) <= finalized, "a draft token was cached"


def _run(engine: Engine, prompts, news, block_size: int):
    requests = [engine.add_request(p, n) for p, n in zip(prompts, news)]
    while engine.has_work():
        engine.step()
        _cached_hashes_are_finalized(engine, block_size)
    return requests


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(
    "block_size, prefix_caching", [(1, True), (3, True), (4, False), (16, True)]
)
def test_speculative_tokens_equal_generate(k, block_size, prefix_caching):
    prompts, news = _prompts(k + block_size), [1, 2, 7, 13, 20, 9]
    engine = Engine(
        _model(), num_blocks=256 // block_size + 8, block_size=block_size, max_batch=4,
        max_batched_tokens=24, prefix_caching=prefix_caching, attention="gather",
        eos_token_id=None, debug=True, speculate=k,
    )  # fmt: skip
    requests = _run(engine, prompts, news, block_size)
    for request, prompt, new in zip(requests, prompts, news):
        assert request.output == _expected("llama", tuple(prompt), new)
    stats = engine.scheduler.stats
    assert 0 < stats.accepted_tokens < stats.proposed_tokens  # right and wrong guesses were met
    assert engine.stats.generated_tokens == sum(news) and engine.all_blocks_free_or_cached()


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_speculation_under_preemption_and_shared_prompts(preemption):
    """A pool too small for all at once: requests are preempted while speculating, and readmitted
    ones hit the prefix cache, which never holds a draft."""
    system = _prompts(99, 1)[0][:12]
    prompts = [system + p for p in _prompts(7, 8)]
    news = [16] * len(prompts)
    engine = Engine(
        _model("qwen2"), num_blocks=24, block_size=4, max_batch=6, max_batched_tokens=64,
        preemption=preemption, attention="gather", eos_token_id=None, debug=True, speculate=4,
    )  # fmt: skip
    requests = _run(engine, prompts, news, 4)
    assert sum(r.preemptions for r in requests) > 0 and engine.scheduler.stats.accepted_tokens
    for request, prompt in zip(requests, prompts):
        assert request.output == _expected("qwen2", tuple(prompt), 16)


def test_a_draft_in_the_cache_would_be_caught(monkeypatch):
    """A step that commits its draft as if it were the request's tokens is caught: by the check
    above, or by the block manager refusing to give back a rejected token's block it registered."""
    original = Scheduler._propose

    def caching_drafts(self, entry, budget):
        count = original(self, entry, budget)
        request = entry.request
        ids = request.token_ids + entry.draft
        self.memory.commit(request.seq, entry.start + entry.count, ids, checked=True)
        return count

    monkeypatch.setattr(Scheduler, "_propose", caching_drafts)
    engine = Engine(
        _model(), num_blocks=64, block_size=2, attention="gather", eos_token_id=None, speculate=4
    )
    with pytest.raises((AssertionError, ValueError), match="a draft token was cached|num_tokens"):
        _run(engine, _prompts(3), [12] * 6, 2)


def test_stop_and_max_new_tokens_cut_an_accepted_run():
    """Several tokens accepted at once still end at the first stop token, or at max_new_tokens."""
    prompt = _prompts(11, 1)[0]
    full = _expected("llama", tuple(prompt), 24)
    stop = full[5]
    engine = Engine(
        _model(), num_blocks=64, block_size=4, attention="gather", eos_token_id=None, debug=True,
        speculate=8,
    )  # fmt: skip
    stopped, capped = (engine.add_request(prompt, n, stop=s) for n, s in ((24, stop), (3, None)))
    while engine.has_work():
        engine.step()
    assert stopped.output == full[: full.index(stop) + 1] and stopped.finish_reason == "stop"
    assert capped.output == full[:3] and capped.finish_reason == "length"


def test_a_failed_speculative_step_changes_nothing():
    """A forward pass that fails mid-step (after storing a layer's K and V of the drafts) leaves
    the engine as it was; the steps after it give generate's tokens."""
    model, prompts = _model(), _prompts(5, 4)
    engine = Engine(
        model, num_blocks=64, block_size=4, attention="gather", eos_token_id=None, debug=True,
        speculate=6,
    )  # fmt: skip
    requests = [engine.add_request(p, 10) for p in prompts]
    mlp, failures = model.model.layers[-1].mlp, 0

    def fail(*args, **kwargs):
        raise RuntimeError("injected")

    while engine.has_work():
        if engine.stats.steps % 2 and any(len(r.output) for r in requests):
            before = engine.cache.snapshot(), [list(r.token_ids) for r in requests]
            mlp.forward = fail
            try:
                with pytest.raises(RuntimeError, match="injected"):
                    engine.step()
            finally:
                del mlp.forward
            failures += 1
            assert [list(r.token_ids) for r in requests] == before[1]
            engine.check_invariants()
        engine.step()
    assert failures and all(
        r.output == _expected("llama", tuple(p), 10) for r, p in zip(requests, prompts)
    )


def test_bad_speculation_settings_and_chunks_are_refused():
    with pytest.raises(ValueError, match="speculate must be an int >= 0"):
        Engine(_model(), num_blocks=8, speculate=-1)
    with pytest.raises(TypeError, match="speculate must be an int"):
        Engine(_model(), num_blocks=8, speculate=2.5)
    engine = Engine(_model(), num_blocks=8, block_size=4, attention="gather")
    seq, _ = engine.cache.admit([1, 2, 3])
    engine.cache.commit(seq, 3, [1, 2, 3], checked=True)  # the runs below write them
    runner = ModelRunner(_model(), engine.cache, "gather")
    with pytest.raises(ValueError, match=r"chunks\[0\].num_outputs must be an int in \[1, 4\)"):
        runner.run([(seq, 0, [1, 2, 3], 4)])
    assert runner.run([(seq, 0, [1, 2, 3], 3)])[1:] == runner.run([(seq, 1, [2, 3], 2)])


@pytest.mark.parametrize("attention", ["kernel", "reference"])
def test_every_attention_path_verifies_drafts(attention):
    """The paged prefill kernel (its interpreter on a CPU) and the fp32 reference check a draft as
    the gather path does: several query tokens per sequence, after its cached context."""
    prompts, news = _prompts(21, 3), [6, 9, 4]
    engine = Engine(
        _model(), num_blocks=32, block_size=4, attention=attention, cuda_graphs=False,
        eos_token_id=None, debug=True, speculate=3,
    )  # fmt: skip
    requests = _run(engine, prompts, news, 4)
    assert engine.scheduler.stats.proposed_tokens
    for request, prompt, new in zip(requests, prompts, news):
        assert request.output == _expected("llama", tuple(prompt), new)
