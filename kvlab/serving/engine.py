"""Notebook 11: a continuous-batching engine in the shape of nano-vllm (Yu 2025) and vLLM (Kwon et
al. 2023). A step is three calls: the scheduler plans the step's chunks, the runner runs the model
once over them all, and the scheduler appends the sampled tokens and retires the finished requests.

A step is all or nothing. It first checks that the model still fits the cache and that every
request's sequence is where the scheduler left it; if the forward pass then fails, the engine is put
back as it was (cache, queues, requests, counters, the prefix hashes it registered), under two
rollback rules: a prefix hash the step evicted stays evicted, and a preemption the step made to fit
its decodes stands (the failed pass may have written into the preempted blocks).
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from kvlab._checks import restoring
from kvlab.serving import _checks
from kvlab.serving.request import Event, Request
from kvlab.serving.runner import ModelRunner, cache_for, model_geometry
from kvlab.serving.scheduler import Scheduler

CPU_KV_BUDGET_BYTES = 64 * 2**20  # the pool on a CPU, when num_blocks is not given
GPU_MEMORY_FRACTION = 0.9  # of the memory free after the weights, on a GPU
WATERMARK = 0.01  # the share of the pool admission leaves free, so as not to force a preemption


@dataclass
class EngineStats:
    """What the engine did since it was built (notebook 11)."""

    steps: int = 0
    wall_s: float = 0.0
    generated_tokens: int = 0
    prefill_tokens: int = 0  # prompt (and recomputed) tokens the steps computed
    peak_blocks: int = 0  # most blocks held at once
    batch_sizes: list = field(default_factory=list)  # requests scheduled per step


class Engine:
    """``num_blocks=None`` sizes the pool by ``kv_budget_bytes`` (on a GPU, by default, from the
    memory free after the weights); ``attention`` and ``cuda_graphs`` default to the kernels and
    graphs on a GPU, ``"gather"`` on a CPU; ``debug=True`` checks the invariants after every step;
    ``eos_token_id="auto"`` stops at ``model.generation_config``'s end-of-sequence ids;
    ``speculate=k`` checks up to ``k`` prompt-lookup guesses per decode in each step (the
    scheduler)."""

    def __init__(
        self, model, num_blocks: int | None = None, block_size: int = 16, max_batch: int = 32,
        max_batched_tokens: int = 2048, prefix_caching: bool = True, preemption: str = "recompute",
        *, kv_budget_bytes: int | None = None, attention: str | None = None,
        cuda_graphs: bool | None = None, watermark: float = WATERMARK, eos_token_id="auto",
        debug: bool = False, speculate: int = 0,
    ):  # fmt: skip
        checked = _checks.engine(
            model, num_blocks, block_size, max_batch, max_batched_tokens, prefix_caching,
            preemption, kv_budget_bytes, attention, cuda_graphs, watermark, eos_token_id, debug,
        )  # fmt: skip
        block_size, max_batch, max_batched_tokens, attention, cuda_graphs, watermark, eos = checked
        num_blocks = _pool_size(model, block_size, kv_budget_bytes, num_blocks)
        self.cache = cache = cache_for(model, num_blocks, block_size, prefix_caching)
        self.runner = ModelRunner(model, cache, attention, cuda_graphs, max_batch, checked=True)
        self.scheduler = Scheduler(
            cache, max_batch, max_batched_tokens, preemption,
            math.ceil(watermark * num_blocks), self._log, speculate,
        )  # fmt: skip
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.eos_token_ids, self.debug = eos, debug
        self.vocab_size, self.window = model.config.vocab_size, _checks.window(model.config)
        self.requests, self.events, self.stats = {}, [], EngineStats()
        self._clock = self._idle_steps = 0

    max_batch = property(lambda self: self.scheduler.max_batch)
    max_batched_tokens = property(lambda self: self.scheduler.max_batched_tokens)
    bytes_per_block = property(lambda self: self.cache.bytes_per_block)
    pool_bytes = property(lambda self: self.num_blocks * self.cache.bytes_per_block)

    def add_request(self, prompt, max_new_tokens: int, stop=None) -> Request:
        """Queue one request; one that could never fit comes back ``rejected``, saying why."""
        prompt, max_new_tokens, stop = _checks.add_request(self, prompt, max_new_tokens, stop)
        return self._add(prompt, max_new_tokens, stop)

    def generate(self, prompts, max_new_tokens, stop=None) -> list[list[int] | None]:
        """Greedy continuation of each prompt until all have finished; a rejected one gives None."""
        prompts, counts, stop = _checks.engine_generate(self, prompts, max_new_tokens, stop)
        requests = [self._add(p, n, stop) for p, n in zip(prompts, counts)]
        while self.has_work():
            self.step()
        return [r.output if r.state == "finished" else None for r in requests]

    def _add(self, prompt: list[int], max_new_tokens: int, stop: frozenset) -> Request:
        request = Request(len(self.requests), prompt, max_new_tokens, checked=True)  # door checked
        request.arrival, request.stop = time.perf_counter(), self.eos_token_ids | stop
        self.requests[request.id] = request
        self._log(request, "arrive", len(prompt))
        why = _checks.never_fits(self, len(prompt), max_new_tokens)
        if why is None:
            self.scheduler.add(request)
            return request
        request.state, request.error = "rejected", f"request {request.id} rejected: {why}"
        self._log(request, "reject")
        warnings.warn(request.error, RuntimeWarning, stacklevel=3)
        return request

    def _log(self, request: Request, kind: str, detail=None) -> None:
        """An event of the step running (``_clock``), or of the last one between steps."""
        self.events.append(Event(self._clock, request.id, kind, detail))

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Request]:
        """Schedule, run, update, all or nothing (the module); the requests that finished."""
        _checks.engine_ready(self)
        start = time.perf_counter()
        self._clock = self.stats.steps + 1  # the events of this step carry its number
        try:
            preempted = self.scheduler.make_room()  # stands even if the step fails (the module)
            with restoring(self):
                plan = self.scheduler.schedule(preempted)
                finished = self._run(plan) if plan else []
                self.stats.steps = self._clock
        finally:
            self._clock = self.stats.steps
        self._account(plan, time.perf_counter() - start)
        return finished

    def _run(self, plan: list) -> list[Request]:
        self.stats.peak_blocks = max(self.stats.peak_blocks, self.num_blocks - self.cache.num_free)
        next_tokens = self.runner.run([entry.chunk for entry in plan], checked=True)
        held = sum(e.request.num_tokens for e in plan)
        self.stats.prefill_tokens += sum(e.count for e in plan if e.kind == "prefill")
        finished = self.scheduler.update(plan, next_tokens, time.perf_counter())
        self.stats.generated_tokens += sum(e.request.num_tokens for e in plan) - held
        return finished

    def _account(self, plan: list, seconds: float) -> None:
        self._idle_steps = 0 if plan else self._idle_steps + 1
        _checks.progress(self, self._idle_steps)  # a scheduler stalled with work left: fail loudly
        self.stats.batch_sizes.append(len(plan))
        self.stats.wall_s += seconds
        if self.debug:
            self.check_invariants()

    def snapshot(self):
        """What a step changes, copied, for :meth:`restore` after a failed step."""
        s = self.scheduler
        requests = [(r, r.num_tokens, dict(vars(r))) for r in [*s.waiting, *s.running, *s.swapped]]
        queues = (deque(s.waiting), list(s.running), deque(s.swapped), replace(s.stats))
        stats = replace(self.stats, batch_sizes=list(self.stats.batch_sizes))
        return self.cache.snapshot(), queues, requests, stats, len(self.events)

    def restore(self, snapshot) -> None:
        cache, (waiting, running, swapped, scheduler_stats), requests, stats, events = snapshot
        self.cache.restore(cache)
        s = self.scheduler
        s.waiting, s.running, s.swapped = deque(waiting), list(running), deque(swapped)
        s.stats = replace(scheduler_stats)
        for r, num_tokens, fields in requests:
            vars(r).update(fields)
            del r.token_ids[num_tokens:]  # a request's tokens only grow
        self.stats = replace(stats, batch_sizes=list(stats.batch_sizes))
        del self.events[events:]

    def metrics(self, requests=None) -> dict:
        """Totals over the finished ``requests`` (some of this engine's; default: all)."""
        done = [r for r in _checks.engine_requests(requests, self) if r.state == "finished"]
        ttfts, tpots = [r.ttft for r in done], [r.tpot for r in done if r.tpot is not None]
        admitted, stats = sum(r.admitted_tokens for r in done), self.stats
        return {
            "requests": len(done), "generated_tokens": sum(len(r.output) for r in done),
            "tokens_per_s": stats.generated_tokens / stats.wall_s if stats.wall_s else 0.0,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "mean_tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "mean_batch": sum(stats.batch_sizes) / max(1, len(stats.batch_sizes)),
            "steps": stats.steps, "preemptions": sum(r.preemptions for r in done),
            "prefix_hit_rate": sum(r.cached_tokens for r in done) / admitted if admitted else 0.0,
            "stopped": sum(1 for r in done if r.finish_reason == "stop"),
            "prefill_tokens": stats.prefill_tokens,
        }  # fmt: skip

    def check_invariants(self) -> None:
        """The cache's invariants and each live request's place in it."""
        _checks.engine_invariants(self)

    def all_blocks_free_or_cached(self) -> bool:
        """After the work is done: no block is held by anyone."""
        return self.cache.num_free == self.num_blocks and not self.cache.sequences()


def _pool_size(model, block_size: int, kv_budget_bytes: int | None, num_blocks) -> int:
    """``num_blocks``, or the blocks that fit ``kv_budget_bytes`` (or its default)."""
    if num_blocks is not None:
        return num_blocks
    if kv_budget_bytes is None and model.device.type == "cuda":
        kv_budget_bytes = int(GPU_MEMORY_FRACTION * torch.cuda.mem_get_info(model.device)[0])
    elif kv_budget_bytes is None:
        kv_budget_bytes = CPU_KV_BUDGET_BYTES
    layers, kv_heads, head_dim = model_geometry(model)
    per_block = 2 * layers * block_size * kv_heads * head_dim * model.dtype.itemsize
    return _checks.kv_budget(kv_budget_bytes, per_block, model.device) // per_block
