"""Notebook 11: the engine measured against the transformers paths a reader would use instead.

- :func:`make_requests`: a request trace, lengths from :func:`kvlab.lab.paging.make_trace`, some
  prompts behind shared system prompts; :func:`chat_requests`: real chat prompts through a
  tokenizer's chat template (SmolLM2's, ``kvlab.pretrained_model``), which end at its end-of-turn
  token;
- :func:`static_generate`: ``model.generate`` the way a reader would batch it (padded, in arrival
  order), with what padding and finished rows cost it;
- :func:`continuous_batching`: transformers' own continuous batching (its
  ``ContinuousBatchingManager``, the engine behind ``generate_batch``), with or without its block
  sharing;
- :func:`compare_serving`: the engine (prefix caching on and off) and those peers on one request
  set, tokens checked equal first, then timed interleaved (Yu et al. 2022; Kwon et al. 2023);
- :func:`latency_throughput`: the engine at each ``max_batch``, tokens per second against time per
  output token;
- :func:`burst_requests` and :func:`prefill_tokens`: a burst behind one system prompt, and the
  prompt tokens the engine computes for it when every request arrives at once or one per step;
  :func:`burst_rows`, their bench rows beside transformers' continuous batching with block
  sharing (notebooks 06 and 11);
- :func:`quoting_requests` and :func:`speculation_rows`: chat prompts whose answers copy a passage
  of the held-out King James text, and the engine with prompt-lookup speculation against without
  on them (issue 34), tokens checked equal to ``generate``'s first;
- :func:`timeline`: each request's state step by step, read back from an engine's event log;
- :func:`bench_rows`: the section's rows of ``python -m kvlab bench``.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvlab import _checks
from kvlab.serving.engine import Engine
from kvlab.serving.request import Event

if TYPE_CHECKING:
    from kvlab.lab.bench import Row
from kvlab.theory.serving import CB, CB_NO_SHARING, ENGINE, ENGINE_NO_CACHE, GENERATE

# Real chat requests for SmolLM2-135M-Instruct: short factual questions behind one system prompt,
# whose greedy answers end at the end-of-turn token after 6 to about 40 tokens (measured in fp32).
CHAT_SYSTEM = "You are a helpful assistant. Answer in one short sentence."
CHAT_QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "Say hello in Spanish.",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
    "What is the largest planet in the solar system?",
    "How many days are in a week?",
    "Translate 'thank you' into French.",
    "What is 2 + 2?",
    "What colour is the sky on a clear day?",
    "Name a famous painting by Leonardo da Vinci.",
)


def make_requests(
    n: int,
    distribution: str = "lognormal",
    mean_prompt: float = 32,
    mean_output: float = 16,
    max_len: int = 256,
    shared_prompts: int = 2,
    shared_len: int = 32,
    shared_fraction: float = 0.5,
    vocab: int = 8192,
    seed: int = 0,
) -> tuple[list[list[int]], list[int]]:
    """A request trace for the engine (notebook 11): ``(prompts, max_new_tokens)``.

    Lengths come from :func:`kvlab.lab.paging.make_trace` (``distribution``, means, ``max_len``);
    a ``shared_fraction`` of the prompts begin with one of ``shared_prompts`` system prompts of
    ``shared_len`` tokens (chosen at random), the rest of each prompt is random token ids.
    """
    import numpy as np

    from kvlab.lab.paging import make_trace

    shared_fraction = _checks.real("shared_fraction", shared_fraction, 0, 1)
    shared_prompts = _checks.integer("shared_prompts", shared_prompts, low=0)
    shared_len = _checks.integer("shared_len", shared_len, low=0)
    vocab, seed = _checks.integer("vocab", vocab), _checks.integer("seed", seed, 0)
    trace = make_trace(
        n, distribution, mean_prompt, mean_output, max_len=max_len, seed=seed
    )  # checks the rest
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, vocab, shared_len).tolist() for _ in range(shared_prompts)]
    prompts, news = [], []
    for r in trace:
        own = rng.integers(0, vocab, len(r.prompt)).tolist()
        shared = systems and rng.random() < shared_fraction
        prompts.append(systems[rng.integers(len(systems))] + own if shared else own)
        news.append(r.max_new_tokens)
    return prompts, news


def chat_requests(
    tokenizer, questions=CHAT_QUESTIONS, system: str | None = CHAT_SYSTEM
) -> list[list[int]]:
    """Each question as a chat prompt through ``tokenizer``'s chat template, behind the ``system``
    prompt (None: the template's own default), ending where the assistant's answer begins (notebook
    11)."""
    from kvlab.lab.pretrained import chat_ids

    if isinstance(questions, str) or not questions:
        raise TypeError("questions must be a non-empty list of str")
    head = [] if system is None else [{"role": "system", "content": system}]
    return [
        chat_ids(tokenizer, head + [{"role": "user", "content": q}])[0].tolist() for q in questions
    ]


def _until_stop(tokens: list[int], limit: int, stop) -> list[int]:
    """A request's own tokens: at most ``limit``, ending at its first stop token (kept)."""
    tokens = tokens[:limit]
    return tokens[: next((i + 1 for i, t in enumerate(tokens) if t in stop), len(tokens))]


# --------------------------------------------------------------------------- padded generate


@dataclass(frozen=True)
class PaddedRun:
    """Padded ``generate`` batches on one request set (notebook 11): each request's tokens, when its
    batch returned, and the rows it computed for nothing."""

    outputs: list
    done_at: list  # seconds from the start at which each request's batch returned
    seconds: float
    prefill_rows: int  # prompt tokens prefilled, padding included
    decode_rows: int  # (sequence, step) rows the decode steps computed, over all batches
    # of which for a sequence already done (a stop token, or past its own max_new_tokens)
    carried_rows: int
    padding_tokens: int  # left-padding tokens prefilled to square each batch's prompts
    forward_passes: int  # model calls: per batch one prefill and one per decode step


def static_generate(model, prompts, max_new_tokens, batch_size: int, stop=()) -> PaddedRun:
    """``model.generate`` the way a reader would batch it (notebook 11): ``batch_size`` requests at
    a time in arrival order, left-padded to the longest prompt, each batch run until every member
    has met a token of ``stop`` or its batch's longest ``max_new_tokens`` is reached. A finished
    member is carried along (fed padding) until then: ``carried_rows`` counts those rows.
    """
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    batch_size = _checks.integer("batch_size", batch_size)
    stop = set(stop)
    pad = model.generation_config.pad_token_id or 0
    with _checks.restoring(model, attn_implementation="sdpa"):
        return _static_batches(model, prompts, max_new_tokens, batch_size, pad, stop)


def _requests(model, prompts, max_new_tokens) -> tuple[list[list[int]], list[int]]:
    """The prompts (token ids the model has) and one ``max_new_tokens`` per prompt, checked."""
    _checks.causal_lm("model", model)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of token-id lists, got {prompts!r:.60}")
    prompts = [
        _checks.token_ids(f"prompts[{i}]", p, model.config.vocab_size)
        for i, p in enumerate(prompts)
    ]
    counts = _checks.integers("max_new_tokens", max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(
            f"max_new_tokens must hold one count per prompt of prompts ({len(prompts)} prompts), "
            f"got {len(counts)} counts"
        )
    return prompts, counts


def _static_batches(model, prompts, max_new_tokens, batch_size: int, pad: int, stop: set):
    outputs, done_at, start = [], [], time.perf_counter()
    prefill_rows = rows = carried = padding = passes = 0
    for first in range(0, len(prompts), batch_size):
        batch, news = (
            prompts[first : first + batch_size],
            max_new_tokens[first : first + batch_size],
        )
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch], device=model.device)
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device
        )
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(news),
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=sorted(stop) or None,
            )
        finished = time.perf_counter() - start
        own = [_until_stop(row[width:].tolist(), n, stop) for row, n in zip(out, news)]
        steps = out.shape[1] - width  # tokens generated per row; the prefill gives the first
        prefill_rows += len(batch) * width
        rows += len(batch) * (steps - 1)
        carried += sum(steps - len(o) for o in own)
        padding += sum(width - len(p) for p in batch)
        passes += steps
        outputs += own
        done_at += [finished] * len(batch)
    return PaddedRun(
        outputs, done_at, time.perf_counter() - start, prefill_rows, rows, carried, padding, passes
    )


# --------------------------------------------------------------------------- transformers'
# continuous batching


def continuous_batching(
    model,
    prompts,
    max_new_tokens,
    stop=(),
    block_size: int = 16,
    num_blocks: int = 1024,
    max_batch_tokens: int = 2048,
    block_sharing: bool = True,
    max_requests: int | None = None,
) -> list[list[int]]:
    """Greedy tokens of each prompt from transformers' continuous batching (notebook 11).

    The manager that ``model.generate_batch`` runs, used as transformers' documentation describes it
    for requests of their own lengths (``init_continuous_batching``, ``add_request``,
    ``get_result``): paged blocks of ``block_size`` tokens, ``num_blocks`` of them,
    ``max_batch_tokens`` tokens per step, and with ``block_sharing`` its prefix cache (full prompt
    blocks shared between requests), at most ``max_requests`` per step where the release has that
    setting (5.24 has ``max_requests_per_batch``; the 5.5 floor does not, and schedules as many as
    the token budget allows). Its defaults size the cache from free memory; on a CPU that made every
    step slow, so the pool is given here. The model's attention implementation is restored
    afterwards.
    """
    _checks.integer("block_size", block_size)
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    size = "page_size" if "page_size" in fields else "block_size"  # page_size from 5.17 on
    extra = {size: block_size}
    if max_requests is not None and "max_requests_per_batch" in fields:
        extra["max_requests_per_batch"] = max_requests
    config = ContinuousBatchingConfig(
        allow_block_sharing=block_sharing,
        num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens,
        **extra,
    )
    eos = sorted(stop) or -1  # -1: no end-of-sequence token
    generation = GenerationConfig(
        do_sample=False,
        max_new_tokens=max(max_new_tokens),
        eos_token_id=eos,
        pad_token_id=model.generation_config.pad_token_id or 0,
    )
    with _checks.restoring(model):  # the manager switches the model's attention; it is given back
        manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=config
        )
        manager.start()
        results = {}
        try:
            ids = [
                manager.add_request(list(p), max_new_tokens=n, eos_token_id=eos)
                for p, n in zip(prompts, max_new_tokens)
            ]
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = list(result.generated_tokens)
                elif result is None and not manager.is_running():
                    raise RuntimeError(
                        "transformers' continuous batching stopped before every request finished"
                    )
        finally:
            manager.stop(block=True)
    return [_until_stop(results[i], n, set(stop)) for i, n in zip(ids, max_new_tokens)]


# --------------------------------------------------------------------------- the comparison

CONTENDERS = (ENGINE, ENGINE_NO_CACHE, GENERATE, CB, CB_NO_SHARING)


@dataclass(frozen=True)
class Speedup:
    """How many times faster one contender ran than another: the ratio of their median times, and
    the lowest and highest ratio within one round."""

    median: float
    low: float
    high: float


@dataclass(frozen=True)
class ServingComparison:
    """The engine and its peers on one request set (notebook 11): ``seconds[name]`` per round; every
    contender's tokens equal padded ``generate``'s when ``same_tokens`` holds."""

    requests: int
    generated_tokens: int
    max_batch: int
    seconds: dict
    same_tokens: dict  # name -> its tokens equal padded generate's, request by request
    engine_metrics: dict  # name -> Engine.metrics() of its last round, for the engine contenders
    # name -> mean time from the start to a request's last token (engine and generate)
    latency_s: dict
    padded: PaddedRun

    def tokens_per_s(self, name: str) -> float:
        return self.generated_tokens / statistics.median(self.seconds[name])

    def speedup(self, name: str, over: str) -> Speedup:
        rounds = [b / a for a, b in zip(self.seconds[name], self.seconds[over])]
        return Speedup(
            statistics.median(self.seconds[over]) / statistics.median(self.seconds[name]),
            min(rounds),
            max(rounds),
        )


def _run_engine(model, prompts, news, stop, options) -> tuple[list, float, dict, float]:
    engine = Engine(model, **options)
    requests = [engine.add_request(p, n, stop=stop) for p, n in zip(prompts, news)]
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    seconds = time.perf_counter() - start
    latency = sum(r.finish_time - start for r in requests) / len(requests)
    return [r.output for r in requests], seconds, engine.metrics(), latency


def compare_serving(
    model,
    prompts,
    max_new_tokens,
    stop=(),
    max_batch: int = 8,
    block_size: int = 16,
    num_blocks: int | None = None,
    reps: int = 1,
    contenders=CONTENDERS,
    **engine_options,
) -> ServingComparison:
    """The engine (prefix caching on and off), padded ``generate`` batches of ``max_batch`` and
    transformers' continuous batching (block sharing on and off) on the same requests (notebook 11).

    After a small warm-up of each, ``reps`` rounds run every contender in turn (the order rotating
    from round to round, so that drift falls on all alike); the first round's tokens are compared
    with padded ``generate``'s before any time is kept. ``stop``: token ids that end a request (kept
    in its output).
    """
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    reps = _checks.integer("reps", reps)
    num_blocks = None if num_blocks is None else _checks.integer("num_blocks", num_blocks)
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or GENERATE not in contenders:
        raise ValueError(
            f"contenders must include {GENERATE!r} and come from {CONTENDERS}, got"
            f" {list(contenders)}"
        )
    stop, news = frozenset(stop), list(max_new_tokens)
    pool = num_blocks or sum(-(-(len(p) + n) // block_size) for p, n in zip(prompts, news))
    options = dict(
        num_blocks=pool,
        block_size=block_size,
        max_batch=max_batch,
        eos_token_id=None,
        **engine_options,
    )
    budget = options.get("max_batched_tokens", 2048)
    runs = {
        ENGINE: lambda: _run_engine(model, prompts, news, stop, dict(options, prefix_caching=True)),
        ENGINE_NO_CACHE: lambda: _run_engine(
            model, prompts, news, stop, dict(options, prefix_caching=False)
        ),
        GENERATE: lambda: static_generate(model, prompts, news, max_batch, stop),
        CB: lambda: continuous_batching(
            model, prompts, news, stop, block_size, pool, budget, True, max_batch
        ),
        CB_NO_SHARING: lambda: continuous_batching(
            model, prompts, news, stop, block_size, pool, budget, False, max_batch
        ),
    }
    Engine(model, num_blocks=pool, block_size=block_size, max_batch=max_batch).generate(
        prompts[:2], 2
    )  # warm-up
    static_generate(model, prompts[:2], [2, 2], max_batch)
    seconds = {c: [] for c in contenders}
    outputs, metrics, latency, padded = {}, {}, {}, None
    for r in range(reps):
        order = list(contenders[r % len(contenders) :]) + list(contenders[: r % len(contenders)])
        for name in order:
            start = time.perf_counter()
            result = runs[name]()
            elapsed = time.perf_counter() - start
            if name == GENERATE:
                padded, out = result, result.outputs
                elapsed, latency[name] = result.seconds, sum(result.done_at) / len(result.done_at)
            elif name in (ENGINE, ENGINE_NO_CACHE):
                out, elapsed, metrics[name], latency[name] = result
            else:
                out = result
            outputs.setdefault(name, out)
            seconds[name].append(elapsed)
    same = {name: outputs[name] == outputs[GENERATE] for name in contenders}
    return ServingComparison(
        len(prompts),
        sum(len(o) for o in outputs[GENERATE]),
        max_batch,
        {n: tuple(s) for n, s in seconds.items()},
        same,
        metrics,
        latency,
        padded,
    )


@dataclass(frozen=True)
class CurvePoint:
    """One point of the latency-throughput curve (notebook 11): the fastest of its engine runs.

    ``spread``: how far the other runs' tokens per second sat below the fastest's, relative.
    ``read_rate`` and ``matmul_rate`` (with the latter's spread): the read bandwidth and the matmul
    rate at the mean running batch's rows, timed right after the runs (None when not asked for)."""

    max_batch: int
    tokens_per_s: float
    mean_tpot_s: float
    mean_batch: float
    preemptions: int
    prefix_hit_rate: float
    spread: float = 0.0
    read_rate: float | None = None
    matmul_rate: float | None = None
    matmul_spread: float = 0.0


def latency_throughput(
    model,
    prompts,
    max_new_tokens,
    batches=(1, 2, 4, 8, 16),
    reps: int = 1,
    ceilings: bool = False,
    **engine_options,
) -> list[CurvePoint]:
    """The engine on one trace at each ``max_batch`` of ``batches``: tokens per second against time
    per output token (notebook 11). A fresh engine per run, so no run inherits another's cached
    prefixes; the fastest of ``reps`` runs is kept. With ``ceilings``, the read bandwidth and the
    matmul rate at the point's mean running batch are timed beside it
    (``kvlab.lab.batch_tpot.time_beside``): the ceilings of
    ``kvlab.theory.serving.roofline_throughput``.
    """
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    batches = _checks.integers("batches", list(batches) if isinstance(batches, tuple) else batches)
    _checks.integer("reps", reps, 1)
    _checks.flag("ceilings", ceilings)
    points = []
    for max_batch in batches:
        runs = []
        for _ in range(reps):
            engine = Engine(model, max_batch=max_batch, **engine_options)
            engine.generate(prompts, list(max_new_tokens))
            runs.append(engine.metrics())
        m = max(runs, key=lambda r: r["tokens_per_s"])
        rates = sorted((r["tokens_per_s"] for r in runs), reverse=True)
        point = CurvePoint(
            max_batch,
            m["tokens_per_s"],
            m["mean_tpot_s"] or 0.0,
            m["mean_batch"],
            m["preemptions"],
            m["prefix_hit_rate"],
            spread=rates[0] / rates[1] - 1 if len(rates) > 1 and rates[1] > 0 else 0.0,
        )
        if ceilings:
            point = _with_ceilings(point)
        points.append(point)
    return points


def chunk_budgets(model, prompts, max_new_tokens, budgets, reps: int = 3, **engine_options) -> dict:
    """Chunked prefill's trade-off (notebook 11): the engine on one trace at each token budget per
    step of ``budgets`` (``max_batched_tokens``), the budgets run in turn ``reps`` times so that
    load hits each alike. Returns budget -> (mean TTFT, mean TPOT), each a ``Timing`` over the runs
    (its ``min`` and ``spread_above_min``)."""
    from kvlab.lab.timing import Timing

    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    budgets = _checks.integers("budgets", budgets)
    _checks.integer("reps", reps, 2)
    runs = {b: ([], []) for b in budgets}
    for r in range(reps):
        for b in budgets[r % len(budgets) :] + budgets[: r % len(budgets)]:
            engine = Engine(model, max_batched_tokens=b, **engine_options)
            engine.generate(prompts, list(max_new_tokens))
            m = engine.metrics()
            runs[b][0].append(m["mean_ttft_s"])
            runs[b][1].append(m["mean_tpot_s"])

    def timing(xs):
        return Timing(statistics.median(xs), min(xs), max(xs), tuple(xs))

    return {b: (timing(ttft), timing(tpot)) for b, (ttft, tpot) in runs.items()}


def _with_ceilings(point: CurvePoint) -> CurvePoint:
    from kvlab.lab.batch_tpot import time_beside

    b = time_beside(lambda: None, max(1, round(point.mean_batch)), reps=3)
    return dataclasses.replace(
        point, read_rate=b.read.rate, matmul_rate=b.matmul.rate, matmul_spread=b.matmul.spread
    )


# The bench's request set: 64 requests (issue 25's setting), the engine's target against
# transformers' continuous batching there (reported, never asserted).
BENCH_REQUESTS, ENGINE_TARGET = 64, 1.5


def _speedup_row(
    result: ServingComparison, name: str, over: str, target: float | None = None
) -> Row:
    from kvlab.lab.bench import Row

    r = result.speedup(name, over)
    note = (
        f"ratio of medians of {len(result.seconds[name])} interleaved rounds; one round"
        f" {r.low:.2f}x to {r.high:.2f}x"
    )
    if target is not None:
        note += f"; target >= {target:g}: {'met' if r.median >= target else 'missed'}"
    return Row(f"{name} / {over}", r.median, "x", note)


def peer_rows(result: ServingComparison, where: str, target_over: str | None = CB) -> list:
    """The comparison as bench rows: tokens first, and times only where every contender's tokens
    agree."""
    _checks.instance("result", result, ServingComparison)
    from kvlab.lab.bench import Row

    rows = [
        Row(
            f"{name}: tokens equal padded generate's",
            float(same),
            "bool",
            "greedy, request by request",
        )
        for name, same in result.same_tokens.items()
        if name != GENERATE
    ]
    if not all(result.same_tokens.values()):
        return rows + [
            Row("times not reported", 0.0, "-", "a contender's tokens differ from generate's")
        ]
    rows += [
        _speedup_row(result, ENGINE, over, ENGINE_TARGET if over == target_over else None)
        for over in result.seconds
        if over not in (ENGINE, ENGINE_NO_CACHE)
    ]
    if ENGINE_NO_CACHE in result.seconds:
        rows.append(_speedup_row(result, ENGINE, ENGINE_NO_CACHE))
    rows += [
        Row(f"{ENGINE} tokens/s", result.tokens_per_s(ENGINE), "tokens/s", where),
        Row(
            "padded generate: rows carried after their request ended",
            100 * result.padded.carried_rows / max(result.padded.decode_rows, 1),
            "%",
            f"{result.padded.carried_rows:,} of {result.padded.decode_rows:,} decode rows",
        ),
    ]
    return rows


# ---------------------------------------------------------------- a burst behind one system prompt

BURST_REQUESTS, BURST_SYSTEM, BURST_OWN = 32, 256, (16, 64)


def burst_requests(
    vocab: int,
    n: int = BURST_REQUESTS,
    system: int = BURST_SYSTEM,
    own: tuple = BURST_OWN,
    new: int = 8,
    seed: int = 0,
):
    """``n`` prompts of one ``system``-token system prompt and ``own[0]`` to ``own[1]`` random
    tokens of their own, ``new`` new tokens each: the commonest serving burst (notebooks 06, 11)."""
    vocab, n = _checks.integer("vocab", vocab), _checks.integer("n", n)
    system, new = _checks.integer("system", system, 0), _checks.integer("new", new)
    rng = random.Random(seed)
    head = [rng.randrange(vocab) for _ in range(system)]
    prompts = [head + [rng.randrange(vocab) for _ in range(rng.randint(*own))] for _ in range(n)]
    return prompts, [new] * n


def prefill_tokens(model, prompts, news, staggered: bool = False, block_size: int = 16) -> int:
    """Prompt tokens the engine (prefix caching on) computes for ``prompts``: every request added
    at once (a burst), or with ``staggered`` one added before each step."""
    _checks.flag("staggered", staggered)
    engine = Engine(model, block_size=block_size, max_batch=len(prompts))
    pending = list(zip(prompts, news))
    while pending or engine.has_work():
        arriving, pending = (pending[:1], pending[1:]) if staggered else (pending, [])
        for prompt, new in arriving:
            engine.add_request(prompt, new)
        engine.step()
    return engine.stats.prefill_tokens


def burst_rows(model, reps: int = 2) -> list:
    """The burst as bench rows: prefill tokens, all at once and staggered, against computing the
    system prompt once; the engine against transformers' continuous batching with block sharing on
    the burst, tokens checked equal first."""
    from kvlab.lab.bench import Row

    prompts, news = burst_requests(model.config.vocab_size)
    once = BURST_SYSTEM + sum(len(p) - BURST_SYSTEM for p in prompts)
    what = f"{len(prompts)} requests behind one {BURST_SYSTEM}-token system prompt, blocks of 16"
    rows = []
    for staggered in (False, True):
        computed = prefill_tokens(model, prompts, news, staggered)
        arrival = "one per step" if staggered else "all at once"
        rows.append(
            Row(
                f"burst, {arrival}: prefill tokens / system prompt computed once",
                computed / once,
                "x",
                f"{what}: {computed:,} against {once:,} tokens",
            )
        )
    result = compare_serving(
        model, prompts, news, max_batch=len(prompts), reps=reps, contenders=(ENGINE, GENERATE, CB)
    )
    rows.append(
        Row(
            "burst: engine tokens equal generate's", float(result.same_tokens[ENGINE]), "bool", what
        )
    )
    if all(result.same_tokens.values()):
        speedup = result.speedup(ENGINE, CB)
        rows.append(
            Row(
                f"burst: {CB} time / {ENGINE} time",
                speedup.median,
                "x",
                f"ratio of medians of {reps} interleaved rounds; one round {speedup.low:.2f}x to"
                f" {speedup.high:.2f}x",
            )
        )
    return rows


def cuda_graph_rows(model, prompts, news, reps: int = 3) -> list:
    """On a GPU: the engine replaying its decode steps as CUDA graphs against the same engine eager,
    interleaved, tokens checked equal first."""
    _checks.integer("reps", reps)
    from kvlab.lab.bench import Row

    def run(graphs: bool):
        engine = Engine(model, max_batch=len(prompts), cuda_graphs=graphs, eos_token_id=None)
        start = time.perf_counter()
        out = engine.generate(prompts, news)
        return out, time.perf_counter() - start

    (graphed, _), (eager, _) = run(True), run(False)
    if graphed != eager:
        return [Row("CUDA-graph decode: tokens equal eager", 0.0, "bool", "times not reported")]
    seconds = {True: [], False: []}
    for r in range(reps):
        for graphs in (True, False) if r % 2 == 0 else (False, True):
            seconds[graphs].append(run(graphs)[1])
    rounds = [e / g for g, e in zip(seconds[True], seconds[False])]
    ratio = statistics.median(seconds[False]) / statistics.median(seconds[True])
    return [
        Row("CUDA-graph decode: tokens equal eager", 1.0, "bool", "greedy, request by request"),
        Row(
            "engine, CUDA-graph decode / eager",
            ratio,
            "x",
            f"ratio of medians of {reps} interleaved rounds; one round {min(rounds):.2f}x to"
            f" {max(rounds):.2f}x",
        ),
    ]


def quoting_requests(tokenizer, n: int = 4, chars: int = 240) -> list[list[int]]:
    """``n`` chat prompts asking to copy a passage of ``chars`` characters of the held-out King
    James text (each its own passage): answers that quote their prompt, where prompt lookup pays."""
    n, chars = _checks.integer("n", n), _checks.integer("chars", chars)
    from kvlab.lab.pretrained import chat_ids
    from kvlab.lab.trained import heldout_text

    lines, passages = heldout_text().splitlines()[20:], []
    for _ in range(n):  # whole verses, about ``chars`` characters each
        passage = ""
        while len(passage) < chars:
            passage += lines.pop(0).strip() + "\n"
        passages.append(passage)
    asks = "Copy the following text exactly, word for word:\n\n"
    return [chat_ids(tokenizer, asks + passage)[0].tolist() for passage in passages]


def speculation_rows(k: int = 8, new_tokens: int = 48, reps: int = 2) -> list:
    """The engine with prompt-lookup speculation (``speculate=k``) against without, on
    :func:`quoting_requests` with SmolLM2-135M-Instruct (fp32): both engines' tokens checked equal
    to ``generate``'s per request first, then timed in ``reps`` interleaved rounds."""
    k, reps = _checks.integer("k", k), _checks.integer("reps", reps)
    new_tokens = _checks.integer("new_tokens", new_tokens)
    from kvlab.lab.bench import Row
    from kvlab.lab.pretrained import pretrained_model

    model, tokenizer = pretrained_model()
    prompts = quoting_requests(tokenizer)
    stop = set(Engine(model, num_blocks=4).eos_token_ids)
    expected = []
    with _checks.restoring(model, attn_implementation="sdpa"):  # given back with its own attention
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
            expected.append(_until_stop(out[0, len(prompt) :].tolist(), new_tokens, stop))

    def run(speculate: int):
        engine = Engine(model, max_batch=len(prompts), speculate=speculate)
        start = time.perf_counter()
        out = engine.generate(prompts, new_tokens)
        return out, time.perf_counter() - start, engine.scheduler.stats

    (plain, _, _), (guessed, _, stats) = run(0), run(k)
    what = f"{len(prompts)} copy requests, {sum(map(len, prompts)):,} prompt tokens, k = {k}"
    same = plain == expected and guessed == expected
    rows = [Row("speculative engine: tokens equal generate's", float(same), "bool", what)]
    if not same:
        return rows
    seconds = {0: [], k: []}
    for r in range(reps):
        for speculate in (0, k) if r % 2 == 0 else (k, 0):
            seconds[speculate].append(run(speculate)[1])
    rounds = [p / g for p, g in zip(seconds[0], seconds[k])]
    accepted = stats.accepted_tokens / max(stats.proposed_tokens, 1)
    return rows + [
        Row(
            f"engine without / with speculation (k = {k}), quoting",
            statistics.median(seconds[0]) / statistics.median(seconds[k]),
            "x",
            f"{what}; ratio of medians of {reps} interleaved rounds, one round {min(rounds):.2f}x"
            f" to {max(rounds):.2f}x; {accepted:.0%} of {stats.proposed_tokens} guesses accepted",
        )
    ]


def bench_rows():
    """The engine against transformers' continuous batching (block sharing on and off) and padded
    ``generate`` on one 64-request trace (notebook 11); on a GPU also its CUDA-graph decode against
    eager.
    """
    from kvlab.devices import on_gpu
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    n = BENCH_REQUESTS
    prompts, news = make_requests(
        n,
        mean_prompt=64 if gpu else 32,
        mean_output=64 if gpu else 8,
        max_len=512 if gpu else 128,
        vocab=model.config.vocab_size,
        seed=0,
    )
    result = compare_serving(
        model,
        prompts,
        news,
        max_batch=n,
        reps=3 if gpu else 2,  # about a minute on a CPU
        contenders=(ENGINE, GENERATE, CB, CB_NO_SHARING),
    )
    where = (
        f"{model.shape.name}, {n} requests, max_batch {n},"
        f" {str(model.dtype).removeprefix('torch.')}"
    )
    rows = peer_rows(result, where) + speculation_rows()
    if gpu:  # weight bytes read per step over the step time, against the calibrated copy bandwidth
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        achieved = (
            weight_bytes
            * result.engine_metrics[ENGINE]["steps"]
            / statistics.median(result.seconds[ENGINE])
        )
        rows += [
            Row(
                "engine weight bandwidth",
                achieved / 1e9,
                "GB/s",
                "weight bytes x steps / wall time (KV reads not counted)",
            ),
            Row(
                "engine / copy bandwidth",
                achieved / calibrate().copy_bytes_per_s,
                "fraction",
                "1.0 = the weight-bandwidth floor at this batch",
            ),
        ]
        rows += cuda_graph_rows(model, prompts[:32], [64] * 32)
    return rows


# ---------------------------------------------------------------------- the event log, read back


def timeline(events, num_steps: int) -> dict[int, list[str | None]]:
    """Each request's state at steps ``1 .. num_steps``, read from an event log (notebook 11).

    A state is what the request did in that step (``prefill``, ``decode``) or, in a step that gave
    it no tokens, where it was: ``waiting`` (not yet admitted, or preempted by recompute),
    ``swapped``, ``stalled`` (admitted but given no tokens: the step's token budget ran out);
    ``None`` before it arrived and after it finished.
    """
    num_steps = _checks.integer("num_steps", num_steps, 0)
    events = _checks.items("events", events, Event, what="Event (an engine's .events)")
    states: dict[int, list[str | None]] = {}
    carried: dict[int, str | None] = {}
    by_step: dict[int, list[Event]] = {}
    for event in events:
        by_step.setdefault(event.step, []).append(event)
    for step in range(0, num_steps + 1):
        worked = {}
        for event in by_step.get(step, []):
            states.setdefault(event.request, [None] * num_steps)
            did = _replay(event, carried)
            if did is not None:
                worked.setdefault(event.request, did)
        if step == 0:
            continue
        for request, row in states.items():
            row[step - 1] = worked.get(request, carried.get(request))
    return states


def _replay(event: Event, carried: dict) -> str | None:
    """What ``event`` says its request did in its step (None: nothing); ``carried`` keeps where
    each request is between steps."""
    if event.kind == "arrive":
        carried[event.request] = "waiting"
    elif event.kind in ("admit", "resume"):
        carried[event.request] = "stalled"
    elif event.kind == "preempt":
        carried[event.request] = "swapped" if event.detail == "swap" else "waiting"
    elif event.kind in ("prefill", "decode"):
        return event.kind
    elif event.kind in ("finish", "reject"):
        state, carried[event.request] = carried.get(event.request), None
        return state
    return None
