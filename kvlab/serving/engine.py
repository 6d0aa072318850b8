"""Notebook 11: a continuous-batching engine, the parts of kvlab's serving stack running together.

In the shape of nano-vllm (Yu 2025) and vLLM (Kwon et al. 2023): :class:`Engine` owns one
:class:`~kvlab.cache.paged.PagedKVCache` (the pools and the block manager, prefix caching on or
off), one :class:`~kvlab.serving.scheduler.Scheduler` and one
:class:`~kvlab.serving.runner.ModelRunner`. A step is three calls: the scheduler plans the step's
chunks (reserving and committing their slots, so that with prefix caching a request admitted later
in the step reuses the full blocks an earlier chunk computes), the runner runs the model once over
all of them, and the scheduler appends the sampled tokens and retires the requests that are done.
``add_request`` / ``step`` / ``generate``; an event log; metrics.

A step is all or nothing. Before it schedules anything it checks that the model still fits the cache
(layers, heads, dtype, device) and that every request's sequence is where the scheduler left it; if
the forward pass then fails, the engine is put back as it was before the step (its cache, queues,
requests and counters, and every prefix hash it registered), under two rollback rules: a prefix hash
the step evicted stays evicted, and a preemption the step made to fit its decodes stands (the failed
pass may have written into the preempted blocks). A request that could never fit is refused when it
is added.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from kvlab import _checks
from kvlab.cache.blocks import PREEMPTION_MODES
from kvlab.cache.paged import PagedKVCache
from kvlab.serving.attention import ATTENTION_PATHS
from kvlab.serving.request import Event, Request
from kvlab.serving.runner import ModelRunner, check_cache_fits, check_kernel_limits, model_geometry
from kvlab.serving.scheduler import Scheduler

SUPPORTED_MODELS = ("llama", "qwen2", "mistral")
CPU_KV_BUDGET_BYTES = 64 * 2**20  # the pool on a CPU, when num_blocks is not given
GPU_MEMORY_FRACTION = 0.9  # of the memory free after the weights, on a GPU
# The share of the pool admission leaves free, so that a new request does not force a preemption.
WATERMARK = 0.01


@dataclass
class EngineStats:
    """What the engine did since it was built (notebook 11)."""

    steps: int = 0
    wall_s: float = 0.0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    peak_blocks: int = 0  # most blocks held at once
    batch_sizes: list = field(default_factory=list)  # requests scheduled per step

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


class Engine:
    """Continuous batching over a Hugging Face causal LM on a paged KV cache (notebook 11).

    ``num_blocks=None`` sizes the pool from the memory free after the weights on a GPU
    (``GPU_MEMORY_FRACTION`` of it), or from ``kv_budget_bytes`` (default ``CPU_KV_BUDGET_BYTES``)
    on a CPU. ``attention`` picks the path of :mod:`kvlab.serving.attention`: ``"kernel"`` (the
    Triton kernels; the default on a GPU), ``"gather"`` (vectorised PyTorch, the default on a CPU,
    where the kernels run in Triton's interpreter) or ``"reference"``. ``cuda_graphs`` (default: on
    a GPU) replays decode steps as CUDA graphs. ``debug=True`` checks the invariants after every
    step.

    Decoding is greedy. A request ends after its ``max_new_tokens``, or at the first generated token
    that is an end-of-sequence id or one of its own ``stop`` ids (kept in its output, as
    ``generate`` keeps it), and its blocks go back in that step. ``eos_token_id="auto"`` takes the
    ids ``generate`` stops at, ``model.generation_config.eos_token_id``; pass ids of your own, or
    None for none.
    """

    def __init__(
        self,
        model,
        num_blocks: int | None = None,
        block_size: int = 16,
        max_batch: int = 32,
        max_batched_tokens: int = 2048,
        prefix_caching: bool = True,
        preemption: str = "recompute",
        *,
        kv_budget_bytes: int | None = None,
        attention: str | None = None,
        cuda_graphs: bool | None = None,
        watermark: float = WATERMARK,
        eos_token_id="auto",
        debug: bool = False,
    ):
        _checks.causal_lm("model", model)
        if getattr(model.config, "model_type", None) not in SUPPORTED_MODELS:
            raise ValueError(
                f"model must be one of the architectures {SUPPORTED_MODELS} (rotary positions,"
                " grouped KV heads), got"
                f" {getattr(model.config, 'model_type', type(model).__name__)!r}"
            )
        block_size = _checks.integer("block_size", block_size)
        max_batch = _checks.integer("max_batch", max_batch)
        max_batched_tokens = _checks.integer(
            "max_batched_tokens", max_batched_tokens, low=max_batch
        )
        _checks.one_of("preemption", preemption, PREEMPTION_MODES)
        _checks.flag("prefix_caching", prefix_caching)
        _checks.flag("debug", debug)
        if cuda_graphs is not None:
            _checks.flag("cuda_graphs", cuda_graphs)
        on_cuda = model.device.type == "cuda"
        attention = ("kernel" if on_cuda else "gather") if attention is None else attention
        _checks.one_of("attention", attention, ATTENTION_PATHS)
        watermark = _checks.real("watermark", watermark, 0, 1, high_open=True)
        if num_blocks is not None and kv_budget_bytes is not None:
            raise ValueError(
                f"pass num_blocks ({num_blocks!r}) or kv_budget_bytes ({kv_budget_bytes!r}), not"
                " both: either one sizes the pool"
            )
        layers, kv_heads, head_dim = model_geometry(model)
        check_kernel_limits(block_size, head_dim, attention)
        if num_blocks is None:
            num_blocks = _pool_size(model, block_size, kv_budget_bytes)
        self.cache = PagedKVCache(
            layers,
            _checks.integer("num_blocks", num_blocks),
            block_size,
            kv_heads,
            head_dim,
            dtype=model.dtype,
            device=model.device,
            prefix_caching=prefix_caching,
        )
        self.runner = ModelRunner(
            model, self.cache, attention, on_cuda if cuda_graphs is None else cuda_graphs, max_batch
        )
        self.scheduler = Scheduler(
            self.cache,
            max_batch,
            max_batched_tokens,
            preemption,
            math.ceil(watermark * num_blocks),
            self._log,
        )
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.max_batch, self.max_batched_tokens, self.debug = max_batch, max_batched_tokens, debug
        self.vocab_size, self.window = model.config.vocab_size, _attention_window(model.config)
        if isinstance(eos_token_id, str) and eos_token_id == "auto":
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_token_ids = self._check_stop(eos_token_id, "eos_token_id")
        self.requests: dict[int, Request] = {}
        self.events: list[Event] = []
        self.stats = EngineStats()
        self._clock = 0  # the step an event belongs to: the step running, or the last one after it
        self._idle_steps = 0

    @property
    def bytes_per_block(self) -> int:
        return self.cache.bytes_per_block

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    # -- requests ----------------------------------------------------------------------------

    def add_request(self, prompt, max_new_tokens: int, stop=None) -> Request:
        """Queue one request (``prompt``: token ids; ``stop``: token ids that end it besides the
        engine's end-of-sequence ids); returns it. Bad input raises before anything changes.

        A request that could never fit (its prompt and all but its last new token need more blocks
        than the pool has) is not queued: it comes back ``rejected``, ``error`` saying the bytes it
        needs and the bytes the pool has, and a warning says the same.
        """
        prompt = self._check_prompt(prompt, "prompt")
        max_new_tokens = _checks.integer("max_new_tokens", max_new_tokens)
        return self._add(prompt, max_new_tokens, self._check_stop(stop, "stop"))

    def generate(self, prompts, max_new_tokens, stop=None) -> list[list[int] | None]:
        """Greedy continuation of each prompt (a list of token-id lists), ``max_new_tokens`` each
        (an int or one per prompt), ending early at a stop token (``stop``: token ids for every
        request, added to the engine's end-of-sequence ids); runs until every request has finished.
        A request that can never fit the pool is rejected (``None`` in its place, and a warning with
        the bytes it needs); the others complete. Every argument is checked before any request is
        queued.
        """
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise TypeError("prompts must be a non-empty list of token-id lists")
        checked = [self._check_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        if isinstance(max_new_tokens, (list, tuple)):
            if len(max_new_tokens) != len(prompts):
                raise ValueError(
                    f"max_new_tokens has {len(max_new_tokens)} entries for {len(prompts)} prompts"
                )
            counts = [
                _checks.integer(f"max_new_tokens[{i}]", n) for i, n in enumerate(max_new_tokens)
            ]
        else:
            counts = [_checks.integer("max_new_tokens", max_new_tokens)] * len(prompts)
        stop = self._check_stop(stop, "stop")
        requests = [self._add(p, n, stop) for p, n in zip(checked, counts)]
        while self.has_work():
            self.step()
        return [r.output if r.state == "finished" else None for r in requests]

    def _check_stop(self, ids, name: str) -> frozenset:
        """Stop token ids: None (none), one id, or a list of ids, each in ``[0, vocab_size)``."""
        if ids is None:
            return frozenset()
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if not isinstance(ids, (list, tuple, set, frozenset)):
            return frozenset([_checks.integer(name, ids, low=0, high=self.vocab_size)])
        return frozenset(
            _checks.integer(f"{name}[{i}]", t, low=0, high=self.vocab_size)
            for i, t in enumerate(ids)
        )

    def _check_prompt(self, prompt, name: str) -> list[int]:
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1:
                raise ValueError(
                    f"{name} must be a 1-D tensor of token ids, got shape {tuple(prompt.shape)}"
                )
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(f"{name} must be a list of token ids, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError(f"{name} is empty: a request needs at least one prompt token")
        for i, t in enumerate(prompt):
            _checks.integer(f"{name}[{i}]", t, low=0, high=self.vocab_size)
        blocks = -(-len(prompt) // self.block_size)
        if blocks > self.num_blocks:
            raise ValueError(
                f"{name} has {len(prompt)} tokens: {blocks} blocks"
                f" ({blocks * self.bytes_per_block:,} bytes) but the pool holds {self.num_blocks}"
                f" blocks ({self.pool_bytes:,} bytes) in all"
            )
        if self.window is not None and len(prompt) > self.window:
            raise ValueError(
                f"{name} has {len(prompt)} tokens, more than the model's attention window "
                f"({self.window}); this engine attends to the whole context"
            )
        return [int(t) for t in prompt]

    def _add(
        self, prompt: list[int], max_new_tokens: int, stop: frozenset = frozenset()
    ) -> Request:
        request = Request(
            len(self.requests),
            prompt,
            max_new_tokens,
            time.perf_counter(),
            stop=self.eos_token_ids | stop,
        )
        self.requests[request.id] = request
        self._log(request, "arrive", len(prompt))
        longest = len(prompt) + max_new_tokens - 1  # the last token is never stored
        if self.window is not None and longest > self.window:
            return self._reject(
                request, f"its {longest} tokens exceed the model's attention window ({self.window})"
            )
        blocks = -(-longest // self.block_size)
        if blocks > self.num_blocks:
            return self._reject(
                request,
                f"it needs {blocks} blocks ({blocks * self.bytes_per_block:,} bytes: "
                f"{len(prompt)} prompt + {max_new_tokens - 1} generated tokens stored) "
                f"but the pool has {self.num_blocks} blocks ({self.pool_bytes:,} bytes)",
            )
        self.scheduler.add(request)
        return request

    def _reject(self, request: Request, why: str) -> Request:
        request.state, request.error = "rejected", f"request {request.id} rejected: {why}"
        self._log(request, "reject")
        warnings.warn(request.error, RuntimeWarning, stacklevel=3)
        return request

    def _log(self, request: Request, kind: str, detail=None) -> None:
        self.events.append(Event(self._clock, request.id, kind, detail))

    # -- stepping ----------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Request]:
        """Schedule, run one forward pass, update; returns the requests that finished in this step.

        All or nothing (see the module): checked before anything is scheduled, rolled back if the
        forward pass fails."""
        self._check_ready()
        start = time.perf_counter()
        self._clock = self.stats.steps + 1  # the events of this step carry its number
        try:
            preempted = self.scheduler.make_room()  # stands even if the step fails (module doc)
            with _checks.restoring(self):
                plan = self.scheduler.schedule(preempted)
                finished = self._run(plan) if plan else []
                self.stats.steps = self._clock
        finally:
            self._clock = self.stats.steps
        self._account(plan, time.perf_counter() - start)
        return finished

    def _run(self, plan: list) -> list[Request]:
        """The forward pass over the step's chunks, then the scheduler's update."""
        self.stats.peak_blocks = max(self.stats.peak_blocks, self.num_blocks - self.cache.num_free)
        next_tokens = self.runner.run([entry.chunk for entry in plan])
        self.stats.generated_tokens += sum(1 for entry in plan if entry.completes)
        self.stats.prefill_tokens += sum(e.count for e in plan if e.kind == "prefill")
        return self.scheduler.update(plan, next_tokens, time.perf_counter())

    def _account(self, plan: list, seconds: float) -> None:
        """The step's statistics; a scheduler that stalls with work left fails loudly."""
        self._idle_steps = 0 if plan else self._idle_steps + 1
        if self._idle_steps > 2 and self.has_work():  # a scheduler bug, never a normal state
            raise RuntimeError(
                f"the scheduler made no progress for {self._idle_steps} steps: "
                f"{len(self.scheduler.waiting)} waiting, {len(self.scheduler.running)} running, "
                f"{len(self.scheduler.swapped)} swapped, {self.cache.num_free} blocks free"
            )
        self.stats.batch_sizes.append(len(plan))
        self.stats.wall_s += seconds
        if self.debug:
            self.check_invariants()

    def _check_ready(self) -> None:
        """What a step relies on, checked before it changes anything: the model still fits the cache
        (its dtype or device may have changed since the engine was built), and every request's
        sequence is where the scheduler left it (nothing freed or preempted behind its back)."""
        check_cache_fits(self.model, self.cache, self.runner.attention)
        live = set(self.cache.sequences())
        for state, requests in (
            ("resident", self.scheduler.running),
            ("swap", self.scheduler.swapped),
            ("recompute", [r for r in self.scheduler.waiting if r.seq is not None]),
        ):
            for r in requests:
                if r.seq not in live or self.cache.state(r.seq) != state:
                    raise RuntimeError(
                        f"request {r.id} is {r.state} but its cache sequence {r.seq} is "
                        f"{self.cache.state(r.seq) if r.seq in live else 'gone'}: a request's "
                        "sequence must change only through the engine (free, preempt and resume "
                        "it by stepping)"
                    )

    # -- rollback ----------------------------------------------------------------------------

    def snapshot(self):
        """What a step changes, copied, for :meth:`restore` after a failed step."""
        s = self.scheduler
        queued = [*s.waiting, *s.running, *s.swapped]
        requests = [
            (
                r,
                r.state,
                r.seq,
                len(r.output),
                r.first_token_time,
                r.finish_time,
                r.preemptions,
                r.admitted_tokens,
                r.cached_tokens,
            )
            for r in queued
        ]
        return (
            self.cache.snapshot(),
            deque(s.waiting),
            list(s.running),
            deque(s.swapped),
            replace(s.stats),
            requests,
            replace(self.stats, batch_sizes=list(self.stats.batch_sizes)),
            len(self.events),
        )

    def restore(self, snapshot) -> None:
        cache, waiting, running, swapped, scheduler_stats, requests, stats, events = snapshot
        self.cache.restore(cache)
        s = self.scheduler
        s.waiting, s.running, s.swapped, s.stats = (
            deque(waiting),
            list(running),
            deque(swapped),
            replace(scheduler_stats),
        )
        for (
            r,
            state,
            seq,
            outputs,
            first_token_time,
            finish_time,
            preemptions,
            admitted,
            cached,
        ) in requests:
            r.state, r.seq, r.first_token_time, r.finish_time = (
                state,
                seq,
                first_token_time,
                finish_time,
            )
            r.preemptions, r.admitted_tokens, r.cached_tokens = preemptions, admitted, cached
            del r.output[outputs:]  # a request's output only grows
        self.stats = replace(stats, batch_sizes=list(stats.batch_sizes))
        del self.events[events:]

    # -- metrics and checks ------------------------------------------------------------------

    def metrics(self, requests=None) -> dict:
        """Per-request and total figures: time to first token, time per output token, tokens per
        second, batch size per step, preemptions and prefix hit rate (notebook 11). ``requests``:
        some of this engine's requests, each once (default: all)."""
        if requests is None:
            requests = list(self.requests.values())
        elif isinstance(requests, (str, bytes)) or not hasattr(requests, "__iter__"):
            raise TypeError(
                f"requests must be a list of this engine's Requests, got {type(requests).__name__}"
            )
        requests = list(requests)
        for i, r in enumerate(requests):
            if not isinstance(r, Request) or self.requests.get(r.id) is not r:
                raise ValueError(
                    f"requests[{i}] must be a Request this engine made (add_request), got {r!r}"
                )
        if len({id(r) for r in requests}) != len(requests):
            raise ValueError(
                f"requests must name each request once, got ids {[r.id for r in requests]}"
            )
        done = [r for r in requests if r.state == "finished"]
        ttfts = [r.ttft for r in done]
        tpots = [r.tpot for r in done if r.tpot is not None]
        admitted = sum(r.admitted_tokens for r in done)
        return {
            "requests": len(done),
            "generated_tokens": sum(len(r.output) for r in done),
            "tokens_per_s": self.stats.tokens_per_s,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "mean_tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "mean_batch": self.stats.mean_batch,
            "steps": self.stats.steps,
            "preemptions": sum(r.preemptions for r in done),
            "prefix_hit_rate": sum(r.cached_tokens for r in done) / admitted if admitted else 0.0,
            "stopped": sum(1 for r in done if r.finish_reason == "stop"),  # ended by a stop token
            "prefill_tokens": (
                self.stats.prefill_tokens
            ),  # prompt (and recomputed) tokens the steps computed
        }

    def check_invariants(self) -> None:
        """The cache's invariants (every block counted once, reference counts equal holders,
        registered blocks written and hashed from their tokens) and each live request's place in
        it."""
        self.cache.check()
        live = [r for r in self.requests.values() if r.seq is not None]
        queued = [*self.scheduler.waiting, *self.scheduler.running, *self.scheduler.swapped]
        _require(len(queued) == len({id(r) for r in queued}), "a request sits in two queues")
        _require(
            {r.seq for r in live} == set(self.cache.sequences()),
            "the cache's sequences are not the live requests'",
        )
        for request in live:
            held = self.cache.tokens(request.seq)
            _require(
                held == request.tokens[: len(held)] and len(held) >= len(request.tokens) - 1,
                f"request {request.id}'s cached tokens are not its own",
            )
            state = self.cache.state(request.seq)
            _require(
                (state == "swap") == (request.state == "swapped"),
                f"request {request.id} is {request.state} but its sequence is {state}",
            )

    def all_blocks_free_or_cached(self) -> bool:
        """After the work is done: no block is held by anyone (each is free, or free and cached)."""
        return self.cache.num_free == self.num_blocks and not self.cache.sequences()


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"engine invariant broken: {message}")


def _attention_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _pool_size(model, block_size: int, kv_budget_bytes: int | None) -> int:
    """Blocks that fit the memory left after the weights (GPU) or ``kv_budget_bytes`` (CPU)."""
    layers, kv_heads, head_dim = model_geometry(model)
    per_block = (
        2
        * layers
        * block_size
        * kv_heads
        * head_dim
        * torch.empty((), dtype=model.dtype).element_size()
    )
    if kv_budget_bytes is None:
        if model.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(model.device)
            kv_budget_bytes = int(GPU_MEMORY_FRACTION * free)
        else:
            kv_budget_bytes = CPU_KV_BUDGET_BYTES
    else:
        _checks.integer("kv_budget_bytes", kv_budget_bytes)
        _checks.require_memory(
            f"kv_budget_bytes={kv_budget_bytes:,}", kv_budget_bytes, model.device
        )
    if kv_budget_bytes < per_block:
        raise ValueError(
            f"kv_budget_bytes ({kv_budget_bytes:,}) must hold at least one block ({per_block:,}"
            " bytes)"
        )
    return kv_budget_bytes // per_block
