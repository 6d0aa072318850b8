"""Notebook 11: the engine measured against Hugging Face ``generate`` on the same requests.

- :func:`make_requests`: a request trace, lengths from :func:`kvlab.lab.paging.make_trace`, some
  prompts behind shared system prompts;
- :func:`static_generate`: ``model.generate`` the way a reader would batch it (padded, in arrival order);
- :func:`compare_with_generate`: both on one trace, tokens compared, interleaved;
- :func:`latency_throughput`: the engine at each ``max_batch``, tokens per second against time per
  output token (Yu et al. 2022; Kwon et al. 2023);
- :func:`bench_rows`: the section's rows of ``python -m kvlab bench``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvlab import _checks
from kvlab.serving.engine import Engine

def make_requests(n: int, distribution: str = "lognormal", mean_prompt: float = 32, mean_output: float = 16,
                  max_len: int = 256, shared_prompts: int = 2, shared_len: int = 32, shared_fraction: float = 0.5,
                  vocab: int = 8192, seed: int = 0) -> tuple[list[list[int]], list[int]]:
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
    trace = make_trace(n, distribution, mean_prompt, mean_output, max_len=max_len, seed=seed)  # checks the rest
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, vocab, shared_len).tolist() for _ in range(shared_prompts)]
    prompts, news = [], []
    for r in trace:
        own = rng.integers(0, vocab, len(r.prompt)).tolist()
        shared = systems and rng.random() < shared_fraction
        prompts.append(systems[rng.integers(len(systems))] + own if shared else own)
        news.append(r.max_new_tokens)
    return prompts, news


def static_generate(model, prompts, max_new_tokens, batch_size: int) -> tuple[list[list[int]], list[float]]:
    """``model.generate`` the way a reader would batch it (notebook 11): ``batch_size`` requests at a time
    in arrival order, left-padded to the longest prompt, each batch run to its longest ``max_new_tokens``.

    Returns each request's own tokens (cut to its ``max_new_tokens``) and the time, from the start,
    at which its batch returned. The model runs with SDPA attention for the call and is given back
    with its own.
    """
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    batch_size = _checks.integer("batch_size", batch_size)
    pad = model.generation_config.pad_token_id or 0
    with _checks.restoring(model, attn_implementation="sdpa"):
        return _static_batches(model, prompts, max_new_tokens, batch_size, pad)


def _requests(model, prompts, max_new_tokens) -> tuple[list[list[int]], list[int]]:
    """The prompts (token ids the model has) and one ``max_new_tokens`` per prompt, checked."""
    _checks.causal_lm("model", model)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of token-id lists, got {prompts!r:.60}")
    prompts = [_checks.token_ids(f"prompts[{i}]", p, model.config.vocab_size) for i, p in enumerate(prompts)]
    counts = _checks.integers("max_new_tokens", max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"max_new_tokens must hold one count per prompt of prompts ({len(prompts)} prompts), "
                         f"got {len(counts)} counts")
    return prompts, counts


def _static_batches(model, prompts, max_new_tokens, batch_size: int, pad: int):
    outputs, done_at, start = [], [], time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        batch, news = prompts[first: first + batch_size], max_new_tokens[first: first + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max(news), do_sample=False,
                                 pad_token_id=pad)
        finished = time.perf_counter() - start
        outputs += [row[width: width + n].tolist() for row, n in zip(out, news)]
        done_at += [finished] * len(batch)
    return outputs, done_at


@dataclass(frozen=True)
class Comparison:
    """The engine and padded static ``generate`` batches on one trace (notebook 11)."""

    requests: int
    generated_tokens: int
    engine_s: float
    generate_s: float
    engine_latency_s: float  # mean time from arrival (all at t = 0) to a request's last token
    generate_latency_s: float
    same_tokens: bool
    engine_metrics: dict

    @property
    def engine_tokens_per_s(self) -> float:
        return self.generated_tokens / self.engine_s

    @property
    def generate_tokens_per_s(self) -> float:
        return self.generated_tokens / self.generate_s

    @property
    def speedup(self) -> float:
        return self.generate_s / self.engine_s


def compare_with_generate(model, prompts, max_new_tokens, max_batch: int = 8, block_size: int = 16,
                          num_blocks: int | None = None, prefix_caching: bool = True, reps: int = 1,
                          **engine_options) -> Comparison:
    """Time a fresh engine and padded static ``generate`` batches of ``max_batch`` on the same trace,
    interleaved ``reps`` times (the faster run of each kept), after one small warm-up of each."""
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    reps = _checks.integer("reps", reps)
    options = dict(num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                   prefix_caching=prefix_caching, **engine_options)
    Engine(model, **options).generate(prompts[:2], 2)
    static_generate(model, prompts[:2], [2] * len(prompts[:2]), max_batch)
    best = None
    for _ in range(reps):
        expected, done_at = static_generate(model, prompts, list(max_new_tokens), max_batch)
        engine = Engine(model, **options)
        requests = [engine.add_request(p, n) for p, n in zip(prompts, max_new_tokens)]
        start = time.perf_counter()
        while engine.has_work():
            engine.step()
        engine_s = time.perf_counter() - start
        run = Comparison(len(prompts), sum(max_new_tokens), engine_s, done_at[-1],
                         sum(r.finish_time - start for r in requests) / len(requests), sum(done_at) / len(done_at),
                         [r.output for r in requests] == expected, engine.metrics())
        best = run if best is None else Comparison(
            run.requests, run.generated_tokens, min(run.engine_s, best.engine_s), min(run.generate_s, best.generate_s),
            min(run.engine_latency_s, best.engine_latency_s), min(run.generate_latency_s, best.generate_latency_s),
            run.same_tokens and best.same_tokens, run.engine_metrics)
    return best


@dataclass(frozen=True)
class CurvePoint:
    """One engine run of the latency-throughput curve (notebook 11)."""

    max_batch: int
    tokens_per_s: float
    mean_tpot_s: float
    mean_batch: float
    preemptions: int
    prefix_hit_rate: float


def latency_throughput(model, prompts, max_new_tokens, batches=(1, 2, 4, 8, 16), **engine_options) -> list[CurvePoint]:
    """The engine on one trace at each ``max_batch`` of ``batches``: tokens per second against time per
    output token (notebook 11). A fresh engine per point, so no point inherits another's cached prefixes."""
    prompts, max_new_tokens = _requests(model, prompts, max_new_tokens)
    batches = _checks.integers("batches", list(batches) if isinstance(batches, tuple) else batches)
    points = []
    for max_batch in batches:
        engine = Engine(model, max_batch=max_batch, **engine_options)
        engine.generate(prompts, list(max_new_tokens))
        m = engine.metrics()
        points.append(CurvePoint(max_batch, m["tokens_per_s"], m["mean_tpot_s"] or 0.0, m["mean_batch"],
                                 m["preemptions"], m["prefix_hit_rate"]))
    return points


def bench_rows():
    """The engine against padded static ``generate`` batches on the same trace (notebook 11)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate
    from kvlab.devices import on_gpu
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    n, batch = (64, 64) if gpu else (24, 8)
    prompts, news = make_requests(n, mean_prompt=64 if gpu else 32, mean_output=64 if gpu else 16,
                                  max_len=512 if gpu else 128, vocab=model.config.vocab_size, seed=0)
    result = compare_with_generate(model, prompts, news, max_batch=batch, reps=2)
    where = f"{model.shape.name}, {n} requests, max_batch {batch}, {str(model.dtype).removeprefix('torch.')}"
    rows = [
        Row("engine / padded generate tokens/s", result.speedup, "x", f"{where}; same trace, one run"),
        Row("engine tokens/s", result.engine_tokens_per_s, "tokens/s", where),
        Row("engine mean latency / generate's", result.engine_latency_s / result.generate_latency_s, "x",
            "mean time from arrival to last token"),
        Row("engine tokens equal generate's", float(result.same_tokens), "bool", "greedy, per request"),
    ]
    if gpu:  # weight bytes read per step over the step time, against the calibrated copy bandwidth
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        steps = result.engine_metrics["steps"]
        achieved = weight_bytes * steps / result.engine_s
        rows += [Row("engine weight bandwidth", achieved / 1e9, "GB/s", "weight bytes x steps / wall time (KV reads not counted)"),
                 Row("engine / copy bandwidth", achieved / calibrate().copy_bytes_per_s, "fraction",
                     "1.0 = the weight-bandwidth floor at this batch")]
    return rows
