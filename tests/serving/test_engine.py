"""The continuous-batching engine (notebook 11) against Hugging Face ``generate``, one request at a
time.

The oracle is ``model.generate`` (greedy, its own cache and SDPA) on each prompt alone, with an
explicit all-ones attention mask (the tiny models' pad token is 0, which a random prompt may hold).
The engine runs seeded random traces (prompt lengths from 1 token to several blocks, shared
system prompts, one exact repeat) with its allocator invariants checked after every step.
"""

import functools
import random
import warnings

import pytest
import torch

import kvlab
from kvlab.serving import engine as engine_module
from kvlab.serving import runner as runner_module
from kvlab.serving.attention import paged_attention
from kvlab.serving.engine import Engine

VOCAB = 512
ARCHS = ("llama", "qwen2", "mistral")


@functools.lru_cache(maxsize=None)
def _model(arch: str):
    return kvlab.tiny_model(
        arch,
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


def _trace(seed: int, block_size: int, n: int = 10, max_new: int | None = None):
    """Prompts of 1 to ~3 blocks, half behind one of two shared system prompts, the last a repeat;
    up to ``max_new`` new tokens each (default two blocks' worth, so that decoding crosses blocks).
    """
    rng = random.Random(seed)
    unit = max(block_size, 4)
    max_new = max_new or 2 * unit
    systems = [
        [rng.randrange(VOCAB) for _ in range(rng.randint(unit, 2 * unit + 3))] for _ in range(2)
    ]
    prompts = []
    for i in range(n - 1):
        own = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3 * unit))]
        prompts.append(systems[i % 2] + own if rng.random() < 0.5 else own)
    prompts.append(list(prompts[0]))
    return prompts, [rng.randint(1, max_new) for _ in prompts]


@functools.lru_cache(maxsize=None)
def _expected(arch: str, seed: int, block_size: int) -> list:
    model = _model(arch)
    model.set_attn_implementation("sdpa")
    prompts, news = _trace(seed, block_size)
    out = []
    for prompt, new in zip(prompts, news):
        ids = torch.tensor([prompt])
        tokens = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
        )
        out.append(tokens[0, len(prompt) :].tolist())
    return out


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _tight_pool(prompts, news, block_size: int) -> int:
    """Just more than the largest request needs alone: several requests at once must preempt."""
    largest = max(_blocks(len(p) + n - 1, block_size) for p, n in zip(prompts, news))
    return largest + 2


def _run(engine: Engine, prompts, news):
    out = engine.generate(prompts, news)  # debug=True: invariants checked after every step
    assert engine.all_blocks_free_or_cached()
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_tokens_equal_generate_under_preemption(arch, block_size, preemption, prefix_caching):
    prompts, news = _trace(1, block_size)
    engine = Engine(
        _model(arch),
        num_blocks=_tight_pool(prompts, news, block_size),
        block_size=block_size,
        max_batch=8,
        max_batched_tokens=48,
        prefix_caching=prefix_caching,
        preemption=preemption,
        debug=True,
    )
    assert _run(engine, prompts, news) == _expected(arch, 1, block_size)
    assert engine.metrics()["preemptions"] >= 1
    assert any(e.kind == "preempt" and e.detail == preemption for e in engine.events)
    assert (engine.metrics()["prefix_hit_rate"] > 0) <= prefix_caching


@pytest.mark.parametrize("seed", range(6))
def test_random_engine_settings(seed):
    """Random budgets, batch limits and pools on the llama: chunked prefill, waits and preemption
    mixed."""
    rng = random.Random(100 + seed)
    block_size = rng.choice([1, 2, 4, 16])
    prompts, news = _trace(seed, block_size)
    max_batch = rng.randint(1, 6)
    pool = _tight_pool(prompts, news, block_size) + rng.randint(0, 20)
    engine = Engine(
        _model("llama"),
        num_blocks=pool,
        block_size=block_size,
        max_batch=max_batch,
        max_batched_tokens=rng.randint(max_batch, 40),
        prefix_caching=rng.random() < 0.5,
        preemption=rng.choice(["recompute", "swap"]),
        debug=True,
    )
    assert _run(engine, prompts, news) == _expected("llama", seed, block_size)
    assert max(engine.stats.batch_sizes) <= max_batch


@pytest.mark.parametrize("attention", ["kernel", "reference"])
def test_decode_attention_paths(attention):
    """The Triton kernel (interpreted on a CPU) and the per-sequence reference give the same
    tokens."""
    prompts, news = _trace(2, 16, n=4, max_new=4)
    engine = Engine(_model("llama"), num_blocks=64, block_size=16, attention=attention, debug=True)
    assert _run(engine, prompts, news) == _expected_small(2)


@functools.lru_cache(maxsize=None)
def _expected_small(seed):
    model = _model("llama")
    model.set_attn_implementation("sdpa")
    prompts, news = _trace(seed, 16, n=4, max_new=4)
    return [
        model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
        )[0, len(p) :].tolist()
        for p, n in zip(prompts, news)
    ]


def test_a_repeat_admitted_in_the_same_step_shares_the_blocks_its_twin_computes():
    """Two identical 3-block prompts. With room for both in one step, the second is admitted behind
    the first and reuses the two full blocks the first computes in that very step (not the third:
    at least one token is left to compute, whose logits give the first output token). With a budget
    of 5 tokens a step the first prefills in chunks, and the second, admitted once there is budget
    left, finds the same blocks registered."""
    model = _model("llama")
    prompt = [random.Random(7).randrange(VOCAB) for _ in range(12)]
    expected = _generate_one(model, prompt, 3)
    for budget in (24, 5):
        engine = Engine(
            model, num_blocks=16, block_size=4, max_batch=4, max_batched_tokens=budget, debug=True
        )
        first, second = engine.add_request(prompt, 3), engine.add_request(list(prompt), 3)
        while engine.has_work():
            engine.step()
        assert first.output == second.output == expected and second.cached_tokens == 8
        assert engine.stats.prefill_tokens == 12 + 4
        chunks = [e.detail for e in engine.events if e.request == first.id and e.kind == "prefill"]
        assert sum(chunks) == 12 and (len(chunks) >= 2) == (budget == 5)  # chunked prefill
        admitted = {e.request: e.step for e in engine.events if e.kind == "admit"}
        assert (admitted[first.id] == admitted[second.id]) == (budget == 24)
        assert engine.all_blocks_free_or_cached()


def test_a_request_preempted_in_the_middle_of_its_prefill_still_gets_generates_tokens():
    model = _model("llama")
    rng = random.Random(8)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (6, 14)]
    for mode in ("recompute", "swap"):
        engine = Engine(
            model,
            num_blocks=6,
            block_size=4,
            max_batch=2,
            max_batched_tokens=4,
            preemption=mode,
            watermark=0.0,
            debug=True,
        )
        first, second = (engine.add_request(p, n) for p, n in zip(prompts, (9, 3)))
        mid_prefill = False
        while engine.has_work():
            seen, prefilling = len(engine.events), second.state == "running" and not second.output
            engine.step()
            mid_prefill |= prefilling and any(
                e.kind == "preempt" and e.request == second.id for e in engine.events[seen:]
            )
        assert mid_prefill, mode  # the newest request lost its blocks before its prefill was done
        assert first.output == _generate_one(
            model, prompts[0], 9
        ) and second.output == _generate_one(model, prompts[1], 3)


def test_a_failed_step_leaves_the_engine_consistent_and_the_next_step_goes_on():
    """A layer that raises once, in a step that mixes decodes and a prefill chunk: the error reaches
    the caller, the invariants hold, nothing unwritten is cached, and the run ends with generate's
    tokens.
    """
    model = _model("llama")
    prompts, news = _trace(3, 4, n=5, max_new=6)
    engine = Engine(
        model, num_blocks=40, block_size=4, max_batch=4, max_batched_tokens=10, debug=True
    )
    for p, n in zip(prompts, news):
        engine.add_request(p, n)
    engine.step()
    engine.step()
    mlp = model.model.layers[-1].mlp

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure in the last layer")

    mlp.forward = fail
    try:
        with pytest.raises(RuntimeError, match="injected"):
            engine.step()
    finally:
        del mlp.forward
    engine.check_invariants()
    while engine.has_work():
        engine.step()
    model.set_attn_implementation("sdpa")
    assert [r.output for r in engine.requests.values()] == [
        _generate_one(model, p, n) for p, n in zip(prompts, news)
    ]


def _generate_one(model, prompt, new):
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([prompt])
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
    )[0, len(prompt) :].tolist()


def test_prefix_cache_serves_a_later_request():
    model = _model("qwen2")
    system = list(range(1, 40))
    for caching in (True, False):
        engine = Engine(model, num_blocks=32, block_size=16, prefix_caching=caching, debug=True)
        engine.generate([system + [5, 6]], 2)
        (later,) = [engine.add_request(system + [7], 2)]
        while engine.has_work():
            engine.step()
        assert later.cached_tokens == (32 if caching else 0)
        assert later.output == _generate_one(model, system + [7], 2)


def test_a_requests_tokens_have_one_home(monkeypatch):
    """The request's ``token_ids`` is the list every commit reads (no copy is kept or made); the
    caller's prompt is left alone; the engine's door checks a prompt and neither its Request nor
    the block manager does again; a Request built by hand is still checked."""
    from kvlab.cache import _checks as cache_checks
    from kvlab.serving import _checks as serving_checks
    from kvlab.serving.request import Request

    model, prompt = _model("llama"), [3, 1, 4, 1, 5, 9, 2, 6, 5]
    engine = Engine(model, num_blocks=16, block_size=4, max_batched_tokens=32, debug=True)
    read, commit = [], engine.cache.commit
    monkeypatch.setattr(
        engine.cache, "commit", lambda s, n, ids, **kw: read.append(ids) or commit(s, n, ids, **kw)
    )
    monkeypatch.setattr(serving_checks, "request", lambda r: pytest.fail("checked twice"))
    for again in ("prompt", "commit_args", "resume_tokens", "written"):
        monkeypatch.setattr(cache_checks, again, lambda *a: pytest.fail(f"{a} checked again"))
    request = engine.add_request(prompt, 6)
    while engine.has_work():
        engine.step()
    assert prompt == [3, 1, 4, 1, 5, 9, 2, 6, 5] and request.prompt == prompt
    assert request.token_ids == prompt + request.output and request.output == _generate_one(
        model, prompt, 6
    )
    assert len(read) == 6 and all(ids is request.token_ids for ids in read)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"token_ids\[1\] must be a token id"):
        Request(0, [1, -2], 3)
    own = [1, 2]
    hand_built = Request(0, own, 3)
    hand_built.token_ids.append(7)
    assert own == [1, 2]  # a hand-built request copies its prompt: appends never reach the caller


def test_life_of_a_request_in_the_event_log():
    engine = Engine(
        _model("llama"), num_blocks=8, block_size=4, max_batched_tokens=6, max_batch=2, debug=True
    )
    request = engine.add_request(list(range(1, 11)), 4)
    engine.step()
    assert (
        request.state == "running"
        and engine.cache.num_computed(request.seq) == 6
        and not request.output
    )
    while engine.has_work():
        engine.step()
    kinds = [e.kind for e in engine.events if e.request == request.id]
    assert kinds == [
        "arrive",
        "admit",
        "prefill",
        "prefill",
        "decode",
        "decode",
        "decode",
        "finish",
    ]
    assert (
        request.state == "finished"
        and len(request.output) == 4
        and engine.stats.generated_tokens == 4
    )
    assert 0 < request.ttft <= request.finish_time - request.arrival and request.tpot > 0
    metrics = engine.metrics()
    assert (
        metrics["requests"] == 1
        and metrics["generated_tokens"] == 4
        and metrics["steps"] == engine.stats.steps
    )


def test_impossible_request_rejected_while_the_others_complete():
    model = _model("mistral")
    prompts = [[3, 4, 5], [6] * 10, [7, 8]]
    engine = Engine(model, num_blocks=4, block_size=4, debug=True)
    with pytest.warns(
        RuntimeWarning, match=r"needs 5 blocks \(.* bytes.*pool has 4 blocks \(.* bytes\)"
    ):
        out = engine.generate(prompts, [4, 10, 4])
    assert (
        out[1] is None
        and engine.requests[1].state == "rejected"
        and "bytes" in engine.requests[1].error
    )
    assert out[0] == _generate_one(model, prompts[0], 4) and out[2] == _generate_one(
        model, prompts[2], 4
    )
    assert engine.all_blocks_free_or_cached()


def test_bad_input_raises_before_any_work():
    model = _model("llama")
    for kwargs, match in [
        (dict(block_size=0), "block_size"),
        (dict(max_batch=0), "max_batch"),
        (dict(num_blocks=0), "num_blocks"),
        (dict(max_batch=8, max_batched_tokens=4), "max_batched_tokens"),
        (dict(preemption="drop"), "preemption"),
        (dict(attention="fast"), "attention"),
        (dict(kv_budget_bytes=10), "kv_budget_bytes"),
        (dict(block_size=3, attention="kernel"), "power of two"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            Engine(model, **kwargs)
    with pytest.raises(ValueError, match="architectures"):
        Engine(
            kvlab.tiny_model(
                "gpt2", layers=1, hidden=64, q_heads=2, vocab=64, intermediate=64, device="cpu"
            )
        )
    engine = Engine(model, num_blocks=4, block_size=4)
    for prompts, new, match in [
        ([[1, 2], []], 2, r"prompts\[1\] is empty"),
        ([[1, 2], list(range(17))], 2, r"prompts\[1\] has 17 tokens.*bytes.*pool holds"),
        ([[1, 2]], 0, "max_new_tokens"),
        ([[1, 2]], [1, 2], "2 entries for 1 prompts"),
        ([[1, VOCAB]], 2, r"prompts\[0\]\[1\]"),
        ([], 2, "non-empty"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            engine.generate(prompts, new)
    assert not engine.requests and engine.stats.steps == 0 and not engine.events


def test_cuda_graphs_never_built_on_a_cpu(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("CUDA-graph capture called on a CPU")

    monkeypatch.setattr(runner_module.CudaGraphs, "__init__", refuse)
    engine = Engine(_model("llama"), num_blocks=16, block_size=16, cuda_graphs=True)
    assert engine.runner.graphs is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert engine.generate([[1, 2, 3]], 2) == [_generate_one(_model("llama"), [1, 2, 3], 2)]


def test_model_keeps_its_attention_and_default_pool():
    model = _model("llama")
    model.set_attn_implementation("sdpa")
    engine = Engine(model)  # the CPU pool from its stated budget
    assert (
        engine.pool_bytes
        <= engine_module.CPU_KV_BUDGET_BYTES
        < engine.pool_bytes + engine.bytes_per_block
    )
    engine.generate([[1, 2, 3]], 2)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="kvlab_step"):
        paged_attention(model.model.layers[0].self_attn, None, None, None, None)


def test_step_metadata_built_once_per_step(monkeypatch):
    built = []
    original = runner_module.build_step
    monkeypatch.setattr(
        runner_module, "build_step", lambda *a, **k: built.append(1) or original(*a, **k)
    )
    engine = Engine(_model("llama"), num_blocks=16, block_size=4, max_batched_tokens=4, max_batch=4)
    engine.generate([[1, 2, 3, 4, 5, 6], [7, 8]], 3)
    assert len(built) == engine.stats.steps  # one per step, for a model of two layers


def test_invariant_hook_catches_a_broken_allocator():
    engine = Engine(_model("llama"), num_blocks=16, block_size=4, prefix_caching=False)
    engine.add_request([1, 2, 3, 4, 5], 4)
    engine.step()
    engine.check_invariants()
    (request,) = engine.scheduler.running
    engine.cache.manager.allocator.incref(
        engine.cache.block_table(request.seq)[0]
    )  # a holder nobody accounts for
    with pytest.raises(AssertionError, match="reference count 2, holders 1"):
        engine.check_invariants()


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs and the compiled kernel need a CUDA GPU"
)
def test_cuda_graph_decode_matches_generate(monkeypatch):
    """On a GPU: decode steps replay captured CUDA graphs (padded batches) and the tokens still
    match."""
    model = kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=VOCAB,
        intermediate=256,
        device="cuda",
        dtype=torch.float32,
        seed=3,
    )
    replays = []
    original = runner_module.CudaGraphs.run
    monkeypatch.setattr(
        runner_module.CudaGraphs, "run", lambda self, *a: replays.append(1) or original(self, *a)
    )
    prompts, news = _trace(4, 16, n=6, max_new=12)
    engine = Engine(model, num_blocks=64, block_size=16, max_batch=6, debug=True)
    assert engine.runner.graphs is not None and engine.runner.attention == "kernel"
    out = engine.generate(prompts, news)
    model.set_attn_implementation("sdpa")
    expected = [
        model.generate(
            torch.tensor([p], device="cuda"),
            attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
            max_new_tokens=n,
            do_sample=False,
        )[0, len(p) :].tolist()
        for p, n in zip(prompts, news)
    ]
    assert out == expected and replays


# --------------------------------------------------------------------------- stop tokens


def _generate_until(model, prompt, new, stop):
    """``generate``'s greedy tokens for one prompt, ending at the first of ``stop`` (kept)."""
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=list(stop),
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    return out[: next((i + 1 for i, t in enumerate(out) if t in stop), len(out))]


def test_stop_tokens_end_requests_at_different_steps_and_free_their_blocks_in_that_step():
    """Each request's stop ids are the first token it would emit at some later step, so the requests
    end at different steps by a stop token, one by its length; a stopped request's blocks are back
    in the step whose token stopped it."""
    model = _model("llama")
    prompts, _ = _trace(5, 4, n=4)
    free_running = [_generate_one(model, p, 10) for p in prompts]
    stops = [[out[k]] for out, k in zip(free_running, (2, 5, 8, 0))]
    stops[3] = (
        [VOCAB - 1] if VOCAB - 1 not in free_running[3] else [free_running[3][9]]
    )  # never (or last) emitted
    engine = Engine(model, num_blocks=40, block_size=4, max_batch=4, debug=True, eos_token_id=None)
    requests = [engine.add_request(p, 10, stop=s) for p, s in zip(prompts, stops)]
    while engine.has_work():
        held = {r.id: r.seq for r in requests if r.seq is not None}
        for (
            request
        ) in engine.step():  # freed in the step it stopped: the cache no longer holds its sequence
            assert request.seq is None and held.get(request.id) not in engine.cache.sequences()
        assert sorted(engine.cache.sequences()) == sorted(
            r.seq for r in requests if r.seq is not None
        )
    for request, prompt, stop in zip(requests, prompts, stops):
        assert request.output == _generate_until(model, prompt, 10, stop)
        assert request.finish_reason == ("stop" if request.output[-1] in stop else "length")
    finishing = {e.step for e in engine.events if e.kind == "finish"}
    assert len(finishing) >= 3 and engine.metrics()["stopped"] >= 3
    assert engine.all_blocks_free_or_cached()


def test_the_engine_stops_where_generate_does_by_default():
    """``eos_token_id="auto"`` is the model's ``generation_config.eos_token_id``, the ids generate
    uses."""
    model = _model("llama")
    prompt = _trace(6, 4, n=2)[0][0]
    first = _generate_one(model, prompt, 6)
    model.generation_config.eos_token_id = first[3]
    try:
        assert Engine(model, num_blocks=16, block_size=4).generate([prompt], 6) == [first[:4]]
        assert Engine(model, num_blocks=16, block_size=4, eos_token_id=None).generate(
            [prompt], 6
        ) == [first]
    finally:
        model.generation_config.eos_token_id = None


def test_bad_stop_tokens_are_refused_before_anything_is_queued():
    model = _model("llama")
    for kwargs, match in [
        (dict(eos_token_id=VOCAB), "eos_token_id"),
        (dict(eos_token_id="end"), "eos_token_id"),
        (dict(eos_token_id=[1, -1]), r"eos_token_id\[1\]"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            Engine(model, num_blocks=4, block_size=4, **kwargs)
    engine = Engine(model, num_blocks=4, block_size=4)
    for stop, match in [([1.5], r"stop\[0\]"), (VOCAB, "stop"), (["a"], r"stop\[0\]")]:
        with pytest.raises((ValueError, TypeError), match=match):
            engine.add_request([1, 2], 2, stop=stop)
        with pytest.raises((ValueError, TypeError), match=match):
            engine.generate([[1, 2]], 2, stop=stop)
    assert not engine.requests and not engine.events


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(cuda_graphs="yes"), TypeError, "cuda_graphs must be True or False"),
        (dict(debug="no"), TypeError, "debug must be True or False"),
        (dict(prefix_caching=1), TypeError, "prefix_caching must be True or False"),
        (dict(num_blocks=True), TypeError, "num_blocks must be an int"),
        (dict(block_size=16.0), TypeError, "block_size must be an int"),
        (
            dict(num_blocks=8, kv_budget_bytes=10),
            ValueError,
            "num_blocks .* or kv_budget_bytes .*, not both",
        ),
    ],
)
def test_engine_refuses_bad_settings(kwargs, error, match):
    """issue 22: strings as flags, bools and floats as sizes, and two arguments that both size the
    pool."""
    with pytest.raises(error, match=match):
        Engine(_model("llama"), **kwargs)


def test_metrics_refuse_duplicates_and_other_engines_requests():
    engine, other = (Engine(_model("llama"), num_blocks=16, block_size=4) for _ in range(2))
    engine.generate([[1, 2, 3]], 2)
    other.generate([[1, 2, 3]], 2)
    (r,) = engine.requests.values()
    with pytest.raises(ValueError, match="requests must name each request once"):
        engine.metrics([r, r])
    with pytest.raises(ValueError, match=r"requests\[0\] must be a Request this engine made"):
        engine.metrics(list(other.requests.values()))
    assert engine.metrics([r])["generated_tokens"] == 2


def test_a_step_on_a_model_changed_behind_the_engine_fails_before_admitting():
    """issue 22: the model's dtype changed after the engine was built; the step refuses it before it
    admits a request, takes a block or counts a step, and works again once the model is put back."""
    model = kvlab.tiny_model(
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
    engine = Engine(model, num_blocks=16, block_size=4)
    engine.add_request([1, 2, 3, 4, 5], 2)
    before = (
        engine.stats.steps,
        engine.cache.num_free,
        [r.state for r in engine.requests.values()],
        len(engine.events),
    )
    model.to(torch.float16)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        engine.step()
    assert (
        engine.stats.steps,
        engine.cache.num_free,
        [r.state for r in engine.requests.values()],
        len(engine.events),
    ) == before
    model.to(torch.float32)
    while engine.has_work():
        engine.step()
    assert engine.requests[0].output == _generate_one(model, [1, 2, 3, 4, 5], 2)
