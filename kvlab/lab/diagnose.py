"""Notebook 09, a worked path through a slow decode step (section 9.8): the path, walked on a model.

The Decode and KV Cache chapter, 2026, section 9.8, assesses a decode bottleneck in a fixed order:

1. naive against cached decode: how much does reusing the cache save?
2. a per-token trace: idle gaps between kernels (launch, Python, control plane), or busy kernels
   moving bytes near the sustained bandwidth, or doing FLOPs near the compute ceiling?
3. a stable single-worker loop: compile or replay a CUDA graph when shapes and addresses are fixed
   and the trace is launch-bound;
4. the useful batch: the largest batch whose time to first token (TTFT), time per output token
   (TPOT) and cache capacity stay within the target;
5. cache-memory pressure: paging, prefix reuse, grouped-query attention or KV quantization when
   allocation or bandwidth limits admission or latency.

``diagnose`` walks the five steps, one function each, and returns a ``Diagnosis``. The step it
traces is ``kvlab.lab.step_trace.trace_step``; the bytes and FLOPs it reports come from
``kvlab.theory.work.step_work``, and the verdict is ``kvlab.theory.verdict.decide``, a plain
function of the measurements, so that a reader (and a test) can check the arithmetic.

On a CPU the whole path runs on ``CPU_THREADS`` of torch's threads
(``kvlab.lab.hardware.cpu_threads``, restored after), the count ``make`` sets, and the calibration
it compares with is taken at that count: the verdict is then the same whether ``make``, a notebook
kernel or ``python -m kvlab diagnose`` ran it.
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass

import torch

from kvlab._checks import flag, integer, integers, positive
from kvlab.devices import on_gpu
from kvlab.lab.batch_tpot import step_beside_ceilings
from kvlab.lab.bench import Row
from kvlab.lab.hardware import calibrate, calibrated_device, cpu_threads
from kvlab.lab.models import tiny_model
from kvlab.lab.repeatable_step import (
    CPU_THREADS,
    RepeatableStep,
    element_bytes,
    measurement_threads,
    model_shape_of,
    prefill_time,
    prepared_ids,
    step_time,
    tile_prompt,
)
from kvlab.lab.step_trace import StepTrace, trace_step
from kvlab.theory import roofline
from kvlab.theory.specs import Accelerator
from kvlab.theory.units import si
from kvlab.theory.verdict import (
    BUSY_THRESHOLD,
    KV_SHARE_THRESHOLD,
    BatchPoint,
    Target,
    capacity_batch,
    decide,
    lever,
    useful_batch,
    verdicts_within,
)


@dataclass(frozen=True)
class Step:
    """One step of the path: what it measured, the ceiling it compared against, what it found."""

    name: str
    measured: dict
    ceiling: dict
    finding: str


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found (section 9.8). ``steps`` holds the five :class:`Step`\\ s in
    order; ``threads`` the CPU threads every measurement ran on (None: a GPU, threads left as they
    were).
    """

    method: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    context: int
    steps: tuple
    verdict: str
    because: str
    lever: str
    achieved_bandwidth: float
    bandwidth_fraction: float
    flops_fraction: float
    trace: StepTrace
    sweep: tuple
    useful_batch: int | None
    target: Target
    threads: int | None = None
    verdicts: tuple = ()
    fraction_spread: float = 0.0

    @property
    def read_bandwidth(self) -> float:
        """The read bandwidth measured beside the traced step (bytes per second): the ceiling its
        ``bandwidth_fraction`` divides by."""
        return self.achieved_bandwidth / self.bandwidth_fraction

    @property
    def firm(self) -> bool:
        """Whether every measurement within its band reaches the same verdict
        (``kvlab.theory.verdict.verdicts_within``); if not, ``verdicts`` lists those it reaches
        and the run cannot tell between them."""
        return len(self.verdicts) <= 1

    def __str__(self) -> str:
        lines = [
            f"decode diagnosis: {self.method} loop, batch {self.batch}, prompt"
            f" {self.prompt_tokens}, {self.new_tokens} new tokens (traced at {self.context} cached"
            " tokens)"
        ]
        if self.threads is not None:
            lines.append(f"measured on {threads_text(self.threads)}")
        wrap = functools.partial(textwrap.fill, width=100, subsequent_indent=" " * 13)
        for i, s in enumerate(self.steps, 1):
            lines.append(f"{i}. {s.name}")
            lines.append(wrap("   measured: " + _fmt(s.measured)))
            lines.append(wrap("   ceiling:  " + _fmt(s.ceiling)))
            lines.append(wrap("   finding:  " + s.finding))
        verdict = self.verdict if self.firm else f"{' or '.join(self.verdicts)} (cannot tell)"
        lines += [wrap(f"verdict: {verdict} ({self.because})"), wrap(f"lever: {self.lever}")]
        return "\n".join(lines)


def _fmt(d: dict) -> str:
    def one(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    return ", ".join(f"{k} {one(v)}" for k, v in d.items()) or "-"


def threads_text(threads: int) -> str:
    """``"1 CPU thread (torch.set_num_threads, restored after)"``: how a diagnosis names its thread
    count."""
    threads = integer("threads", threads)
    return f"{threads} CPU thread{'s' * (threads != 1)} (torch.set_num_threads, restored after)"


def calibration(threads: int | None = CPU_THREADS):
    """``kvlab.calibrate()`` as the path sees it: on a CPU, measured on ``threads`` threads, the
    count the path's own steps run on (a GPU's calibration does not depend on them)."""
    with cpu_threads(None if on_gpu() else threads):
        return calibrate()


def this_machine(memory: float | None = None) -> Accelerator:
    """This device as the ``Accelerator`` the path checks admission on: the calibrated copy
    bandwidth and matmul rate (``kvlab.lab.hardware.calibrated_device``) and ``memory`` bytes
    (default: the GPU's memory, or the CPU's physical memory)."""
    memory = None if memory is None else positive("memory", memory)
    return calibrated_device(memory=memory)


def _default_batches(batch: int) -> list[int]:
    return sorted({1, batch, 2 * batch, 4 * batch})


@dataclass(frozen=True)
class _Request:
    """What every step of the path needs: the model, the prompts tiled to the traced context, the
    request's final length, the machine, its calibration and the element size."""

    model: object
    input_ids: object
    ids: object
    method: str
    context: int
    final: int
    machine: Accelerator
    cal: object
    w: int
    compile: bool | None


def diagnose(
    model,
    input_ids,
    max_new_tokens: int,
    method: str = "cached",
    target: Target | None = None,
    batches=None,
    progress: bool = False,
    compile: bool | None = None,
    threads: int | None = CPU_THREADS,
) -> Diagnosis:
    """Walk the five steps of section 9.8 on ``model`` and the prompts ``input_ids`` ``[batch, P]``.

    The trace (steps 2 and 3) is taken at the request's middle step: ``P + max_new_tokens // 2``
    cached tokens. Step 4 times TTFT (the prompt's prefill) and TPOT (one step at that context) at
    each of ``batches`` (default 1, b, 2b, 4b) and checks each against ``target`` and against
    ``roofline.admitted`` for P + max_new_tokens tokens per sequence. ``progress`` shows a tqdm bar.
    On a CPU every measurement, and the calibration the verdict divides by, runs on ``threads`` of
    torch's threads (default ``CPU_THREADS``, restored after; None keeps the caller's count).
    """
    threads = measurement_threads(model, threads)
    with cpu_threads(threads):
        return _diagnose(
            model, input_ids, max_new_tokens, method, target, batches, progress, compile, threads
        )


def _diagnose(
    model, input_ids, max_new_tokens, method, target, batches, progress, compile, threads
) -> Diagnosis:
    from tqdm.auto import tqdm

    shape = _check_request(model, input_ids, max_new_tokens, method, compile)
    target = Target() if target is None else target
    if not isinstance(target, Target):
        raise TypeError(
            f"target must be a kvlab.theory.verdict.Target or None, got {type(target).__name__}"
        )
    flag("progress", progress)
    batch, prompt = input_ids.shape
    batches = _default_batches(batch) if batches is None else integers("batches", batches)
    context = prompt + max_new_tokens // 2
    r = _Request(
        model,
        input_ids,
        tile_prompt(input_ids.to(model.device), context),
        method,
        context,
        prompt + max_new_tokens,
        this_machine(target.memory),
        calibrate(),
        element_bytes(model),
        compile,
    )
    bar = tqdm(total=5, desc="diagnose", disable=not progress, leave=False)
    try:
        bar.set_postfix_str("1 naive vs cached")
        steps = [_naive_against_cached(r)]
        bar.update()
        bar.set_postfix_str("2 trace")
        trace, fit, step2, fractions = _per_token_trace(r, shape, batch, threads)
        steps.append(step2)
        bar.update()
        bar.set_postfix_str("3 stable loop")
        steps.append(_stable_loop(r, trace))
        bar.update()
        bar.set_postfix_str("4 useful batch")
        sweep = _sweep(model, input_ids, context, r.final, method, batches, r.machine, compile)
        useful = useful_batch(sweep, target)
        steps.append(_useful_batch_step(r, shape, sweep, useful, target))
        bar.update()
        bar.set_postfix_str("5 cache pressure")
        steps.append(_cache_pressure(fit, trace))
        bar.update()
    finally:
        bar.close()
    bw_frac, fl_frac, fraction_spread = fractions
    verdict, because = decide(
        busy_fraction=trace.busy_fraction,
        bandwidth_fraction=bw_frac,
        flops_fraction=fl_frac,
        kv_share=trace.work.kv_share,
        admitted=fit,
    )
    reachable = verdicts_within(
        busy_fraction=trace.busy_fraction,
        bandwidth_fraction=bw_frac,
        flops_fraction=fl_frac,
        kv_share=trace.work.kv_share,
        busy_spread=trace.busy_spread,
        fraction_spread=fraction_spread,
        admitted=fit,
    )
    return Diagnosis(
        method,
        batch,
        prompt,
        max_new_tokens,
        context,
        tuple(steps),
        verdict,
        because,
        lever(verdict, method),
        trace.achieved_bandwidth,
        bw_frac,
        fl_frac,
        trace,
        sweep,
        useful,
        target,
        threads,
        reachable,
        fraction_spread,
    )


def _fractions(trace: StepTrace, b) -> tuple[float, float, float]:
    """The traced step's shares of the read bandwidth and of the matmul rate at its rows, each
    timed beside the step (``_beside``; the fastest repeats), and the relative spread behind
    them."""
    step_s = b.step.min
    spread = b.step_spread + max(b.read.spread, b.matmul.spread)
    return (
        trace.work.total_bytes / step_s / b.read.rate,
        trace.work.flops / step_s / b.matmul.rate,
        spread,
    )


# The matmul probe a verdict divides FLOPs by: this many rows by a 1024 x 1024 weight held in the
# last-level cache, the machine's compute ceiling (near a large square product's rate). A probe of
# the step's own few rows would time the cache's bandwidth, not the arithmetic (a 1-row product
# reads its weight once per 2 FLOPs), and could not tell the two apart.
COMPUTE_ROWS = 256


def _beside(r: _Request, trace: StepTrace):
    """The step timed again, interleaved with the read probe and the compute ceiling's probe."""
    stepper = RepeatableStep(r.model, r.ids, r.method, r.compile)
    try:
        return step_beside_ceilings(stepper, COMPUTE_ROWS)
    finally:
        stepper.close()


def _check_request(model, input_ids, max_new_tokens, method: str, compile):
    """The model's shape, after checking the request: token ids the model has, and a prompt plus
    ``max_new_tokens`` within its positions."""
    shape, _ = prepared_ids(model, input_ids, None, method)
    if compile is not None:
        flag("compile", compile)
    prompt = input_ids.shape[1]
    limit = getattr(model.config, "max_position_embeddings", None)
    integer("max_new_tokens", max_new_tokens, 1, None if limit is None else max(2, limit - prompt))
    return shape


def _naive_against_cached(r: _Request) -> Step:
    """Step 1, per sequence: what the cache saves does not depend on the batch."""
    one = r.ids[:1]
    t_naive = step_time(r.model, one, "naive", warmup=0, reps=2)
    t_cached = step_time(r.model, one, "cached")
    speedup = t_naive / t_cached
    work_ratio = float(r.context + 1)  # positions a naive step runs, against one
    return Step(
        "naive and cached decode (one sequence)",
        {"naive step s": t_naive, "cached step s": t_cached, "naive / cached": speedup},
        {"positions per step, naive / cached": work_ratio},
        _step1_finding(speedup, work_ratio),
    )


def _per_token_trace(r: _Request, shape, batch: int, threads: int | None):
    """Step 2: the traced step against both ceilings, and whether the whole request fits."""
    trace = trace_step(
        r.model, r.input_ids, r.context, r.method, compile=r.compile, threads=threads
    )
    b = _beside(r, trace)
    bw_frac, fl_frac, spread = _fractions(trace, b)
    floor = max(trace.work.total_bytes / b.read.rate, trace.work.flops / b.matmul.rate)
    fit = roofline.admitted(shape, r.machine, batch, r.final, r.w, r.w)
    step = Step(
        "per-token trace",
        {
            "step s": trace.step_s,
            "busy fraction": trace.busy_fraction,
            "bytes": trace.work.total_bytes,
            "KV share of bytes": trace.work.kv_share,
            "FLOPs": trace.work.flops,
            "bytes/s": trace.achieved_bandwidth,
            "FLOP/s": trace.achieved_flops,
        },
        {
            "read bytes/s (beside)": b.read.rate,
            f"matmul FLOP/s, {COMPUTE_ROWS} rows (beside)": b.matmul.rate,
            "roofline floor s": floor,
        },
        _step2_finding(trace, bw_frac, fl_frac),
    )
    return trace, fit, step, (bw_frac, fl_frac, spread)


def _stable_loop(r: _Request, trace: StepTrace) -> Step:
    """Step 3: the static step beside the traced one."""
    other = "cached" if r.method == "static" else "static"
    t_other = step_time(r.model, r.ids, other, compile=r.compile)
    static_s, dynamic_s = (
        (trace.step_s, t_other) if r.method == "static" else (t_other, trace.step_s)
    )
    base = "cached" if r.method == "static" else r.method
    floor = max(
        trace.work.total_bytes / r.cal.stream_bytes_per_s, trace.work.flops / r.cal.matmul_flops
    )
    return Step(
        "stable loop (compile, CUDA graph)",
        {
            "busy fraction": trace.busy_fraction,
            f"{r.method} step s": trace.step_s,
            f"{other} step s": t_other,
            f"static / {base} time": static_s / dynamic_s,
        },
        {"roofline floor s": floor},
        _step3_finding(
            trace.busy_fraction, static_s, dynamic_s, base, r.model.device.type == "cuda"
        ),
    )


def _useful_batch_step(r: _Request, shape, sweep, useful, target: Target) -> Step:
    """Step 4: TTFT, TPOT and tokens/s per batch, against the target and the memory."""
    return Step(
        "useful batch size",
        {
            f"b={p.batch}": (
                f"TTFT {p.ttft * 1e3:.3g} ms, TPOT {p.tpot * 1e3:.3g} ms, "
                f"{p.tokens_per_s:.4g} tok/s"
            )
            for p in sweep
        },
        {
            "TPOT target": _limit(target.tpot),
            "TTFT target": _limit(target.ttft),
            "memory bytes": r.machine.hbm_bytes,
            "largest admitted batch": capacity_batch(shape, r.machine, r.final, r.w),
        },
        _step4_finding(sweep, useful, target),
    )


def _limit(seconds: float | None) -> str:
    return "none" if seconds is None else si(seconds, "s")


def _cache_pressure(fit, trace: StepTrace) -> Step:
    """Step 5: does the cache fit, and how much of each step's bytes is it."""
    return Step(
        "cache-memory pressure",
        {
            "KV bytes at the end": fit.kv,
            "weight bytes": fit.weights,
            "KV share of step bytes": trace.work.kv_share,
        },
        {"memory bytes": fit.available, "KV share threshold": KV_SHARE_THRESHOLD},
        _step5_finding(fit, trace.work.kv_share),
    )


def _sweep(model, input_ids, context, final, method, batches, machine, compile) -> tuple:
    shape, w = model_shape_of(model), element_bytes(model)
    points = []
    for b in batches:
        prompt_ids = input_ids.to(model.device).repeat(-(-b // input_ids.shape[0]), 1)[:b]
        ttft = prefill_time(model, prompt_ids)
        tpot = step_time(model, tile_prompt(prompt_ids, context), method, compile=compile)
        points.append(BatchPoint(b, ttft, tpot, roofline.admitted(shape, machine, b, final, w, w)))
    return tuple(points)


def batch_sweep(
    model,
    input_ids,
    max_new_tokens: int,
    batches,
    method: str = "cached",
    memory: float | None = None,
    compile: bool | None = None,
    threads: int | None = CPU_THREADS,
) -> tuple:
    """Step 4 of section 9.8 on its own: a :class:`BatchPoint` per batch size in ``batches``.

    Each point times TTFT (the prefill of ``input_ids``' prompts, repeated to fill the batch) and
    TPOT (one ``method`` step at the request's middle, P + max_new_tokens // 2 cached tokens), and
    asks ``roofline.admitted`` whether weights plus P + max_new_tokens tokens per sequence fit in
    ``memory`` bytes (default: this device's memory). On a CPU the sweep runs on ``threads`` of
    torch's threads (default ``CPU_THREADS``, restored after), as :func:`diagnose` does.
    """
    _check_request(model, input_ids, max_new_tokens, method, compile)
    batches = integers("batches", batches)
    prompt = input_ids.shape[1]
    with cpu_threads(measurement_threads(model, threads)):
        return _sweep(
            model,
            input_ids,
            prompt + max_new_tokens // 2,
            prompt + max_new_tokens,
            method,
            batches,
            this_machine(memory),
            compile,
        )


# --------------------------------------------------------------------------- findings (both
# branches)


def _step1_finding(speedup: float, work_ratio: float) -> str:
    if speedup >= 2:
        return (
            f"reusing the cache made a step {speedup:.1f}x faster (the naive step reruns"
            f" {work_ratio:.0f}x the positions): recomputation was the limit the cache removes"
        )
    return (
        f"the cache bought only {speedup:.1f}x although the naive step reruns {work_ratio:.0f}x the"
        " positions: a short prefix, a fixed per-step cost (dispatch, launches) or a limit outside"
        " recomputation"
    )


def _step2_finding(trace: StepTrace, bw_frac: float, fl_frac: float) -> str:
    gaps = (
        "Python dispatch between operators"
        if trace.device.startswith("CPU")
        else "launches and host work"
    )
    if trace.busy_fraction < BUSY_THRESHOLD:
        return (
            f"idle {1 - trace.busy_fraction:.0%} of the traced step: gaps ({gaps}) dominate, "
            "bytes and FLOPs do not"
        )
    return (
        f"busy {trace.busy_fraction:.0%} of the step, at {bw_frac:.0%} of read bandwidth and "
        f"{fl_frac:.0%} of the matmul rate; {trace.work.kv_share:.0%} of the bytes are KV"
    )


def _step3_finding(busy: float, static_s: float, dynamic_s: float, base: str, gpu: bool) -> str:
    gain = dynamic_s / static_s
    where = (
        "on a GPU, compilation and CUDA-graph replay remove launch gaps"
        if gpu
        else (
            "on a CPU there are no CUDA graphs; a fixed-shape step only avoids the cache's"
            " reallocation"
        )
    )
    if busy < BUSY_THRESHOLD:
        return (
            f"launch-bound (busy {busy:.0%}): a stable loop is the next step; {where}; the static"
            f" step ran {gain:.2f}x as fast as the {base} one"
        )
    return (
        f"not launch-bound (busy {busy:.0%}): the static step ran {gain:.2f}x as fast as the {base}"
        f" one; {where}"
    )


def _step4_finding(sweep, useful, target: Target) -> str:
    best = max(sweep, key=lambda p: p.tokens_per_s)
    if useful is None:
        return (
            "no measured batch meets the target and fits in memory: relax the target or shrink the "
            "per-step work (step 5)"
        )
    unbounded = target.tpot is None and target.ttft is None
    why = "most tokens/s" if unbounded else "largest within the target"
    return (
        f"batch {useful} is the useful batch ({why});"
        f" the most tokens/s measured was {best.tokens_per_s:.4g} at batch {best.batch}"
    )


def _step5_finding(fit, kv_share: float) -> str:
    if not fit:
        return f"the cache does not fit: {fit}; paging, GQA or KV quantization come first"
    if kv_share > KV_SHARE_THRESHOLD:
        return (
            f"fits ({fit}), but the cache is {kv_share:.0%} of each step's bytes: fewer KV bytes "
            "(GQA, quantization, windows) would shorten the step"
        )
    return (
        f"fits ({fit}) and the cache is {kv_share:.0%} of each step's bytes: cache pressure is not"
        " the limit yet"
    )


# --------------------------------------------------------------------------- bench


def bench_rows():
    """Section 9.8: the cached and static steps traced side by side, and the cached loop's verdict.

    CPU: the tiny Llama (fp32), P = 128, batch 1. GPU: the Llama-3.2-1B shape in bf16, P = 1024,
    batch 1, the static step compiled and replayed as a CUDA graph.
    """
    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    prompt_len = 1024 if gpu else 128
    ids = torch.randint(
        0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0)
    )
    ids = ids.to(model.device)
    traces = {m: trace_step(model, ids, method=m, reps=10) for m in ("cached", "static")}
    d = diagnose(model, ids, 16, batches=[1])
    where = (
        f"{model.shape.name}, {str(model.dtype).removeprefix('torch.')}, context {prompt_len},"
        " batch 1"
    )
    cal = calibrate()
    rows = []
    for m, t in traces.items():
        rows += [
            Row(f"{m} step busy fraction", t.busy_fraction, "fraction", f"{where}; traced"),
            Row(
                f"{m} step bytes / copy bandwidth",
                t.achieved_bandwidth / cal.copy_bytes_per_s,
                "fraction",
                "kvlab.theory.roofline bytes over the median step time",
            ),
        ]
    rows += [
        Row(
            "static / cached step time",
            traces["static"].step_s / traces["cached"].step_s,
            "x",
            "ratio of medians, same run",
        ),
        Row(
            f"cached verdict: {d.verdict}",
            d.bandwidth_fraction,
            "fraction",
            "bandwidth fraction behind it",
        ),
    ]
    return rows
