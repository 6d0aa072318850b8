"""Notebook 09, a worked path through a slow decode step (section 9.8): step 2, the per-token trace.

``trace_step`` times one decode step (``kvlab.lab.repeatable_step``), then runs it under
``torch.profiler`` and splits the traced span into the time covered by kernels (GPU) or top-level
operators (CPU) and the gaps between them: a step mostly made of gaps is lost to launches and Python
dispatch, a busy one is bound by the bytes or FLOPs it moves (``kvlab.theory.work.step_work``). The
``StepTrace`` it returns is what ``kvlab.theory.verdict.decide`` reads, and what the book's recorded
GPU traces store (``to_json``).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from kvlab._checks import integer, one_of
from kvlab.lab.hardware import cpu_threads, device_name
from kvlab.lab.repeatable_step import (
    CPU_THREADS,
    RepeatableStep,
    element_bytes,
    measurement_threads,
    prepared_ids,
    sync,
)
from kvlab.theory.work import STEP_METHODS, StepWork, step_work


@dataclass(frozen=True)
class StepTrace:
    """One decode step timed, then traced under ``torch.profiler`` (section 9.8, step 2).

    ``step_s``: median wall time of the untraced step. ``traced_s``: the traced step's span, from
    the first operator's start to the last one's end (the profiler slows small operators down, so
    use its shares, not its absolute time). ``busy_s``: the part of that span covered by kernels
    (GPU) or by top-level operators (CPU: the matmuls and elementwise work, not the Python between
    them); ``idle_s`` the rest. ``ops``: (name, seconds, calls), by total time, largest first.
    ``timeline``: (name, start_s, end_s) of each kernel or top-level operator, from the span's
    start. ``work``: the bytes and FLOPs of :func:`step_work`. ``threads``: the CPU threads torch
    ran the step on (``kvlab.lab.repeatable_step.CPU_THREADS`` unless asked otherwise; None on a
    GPU).
    """

    method: str
    batch: int
    context: int
    device: str
    step_s: float
    traced_s: float
    busy_s: float
    ops: tuple
    timeline: tuple
    work: StepWork
    step_times: tuple = field(repr=False, default=())
    threads: int | None = None
    busy_fractions: tuple = field(repr=False, default=())

    @property
    def busy_spread(self) -> float:
        """How far the busy share of the second-best traced step sat from the kept one's
        (``busy_fractions`` holds one per profiled step, the least disturbed first),
        relative to it: the scatter of the least disturbed trace, as ``Timing.spread_above_min``
        is of the fastest repeat (0 with one trace)."""
        f = self.busy_fractions
        if len(f) < 2 or f[0] <= 0:
            return 0.0
        return abs(f[1] - f[0]) / f[0]

    @property
    def idle_spread(self) -> float:
        """How far the traces' median idle share sat from the kept trace's, relative to it: the
        scatter of the gaps over every trace, as ``Timing.spread_above_min`` is of the repeats (0
        with one trace or no gaps). A gap a descheduled trace adds widens it."""
        idle = [1 - f for f in self.busy_fractions]
        if len(idle) < 2 or idle[0] <= 0:
            return 0.0
        return abs(statistics.median(idle) - idle[0]) / idle[0]

    @property
    def step_spread(self) -> float:
        """How far a typical untraced step sat above the fastest (median over minimum, less 1)."""
        if not self.step_times or min(self.step_times) <= 0:
            return 0.0
        return statistics.median(self.step_times) / min(self.step_times) - 1

    @property
    def idle_s(self) -> float:
        return max(0.0, self.traced_s - self.busy_s)

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.traced_s if self.traced_s > 0 else 0.0

    @property
    def achieved_bandwidth(self) -> float:
        """Bytes the step must move over its measured time (bytes per second)."""
        return self.work.total_bytes / self.step_s

    @property
    def achieved_flops(self) -> float:
        return self.work.flops / self.step_s

    def to_json(self) -> dict:
        """A plain dict for ``book/data/measurements/`` (recorded traces shown beside the
        reader's)."""
        return {
            "method": self.method,
            "batch": self.batch,
            "context": self.context,
            "device": self.device,
            "step_s": self.step_s,
            "traced_s": self.traced_s,
            "busy_s": self.busy_s,
            "ops": [list(o) for o in self.ops],
            "timeline": [list(t) for t in self.timeline],
            "threads": self.threads,
            "busy_fractions": list(self.busy_fractions),
            "work": {
                "weights_read": self.work.weights_read,
                "kv_read": self.work.kv_read,
                "kv_written": self.work.kv_written,
                "flops": self.work.flops,
            },
        }

    @classmethod
    def from_json(cls, d: dict) -> "StepTrace":
        return cls(
            d["method"],
            d["batch"],
            d["context"],
            d["device"],
            d["step_s"],
            d["traced_s"],
            d["busy_s"],
            tuple(tuple(o) for o in d["ops"]),
            tuple(tuple(t) for t in d["timeline"]),
            StepWork(**d["work"]),
            threads=d.get("threads"),
            busy_fractions=tuple(d.get("busy_fractions", ())),
        )


def _union_length(intervals) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


@contextlib.contextmanager
def _native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the block (Python exceptions still propagate)."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr: nothing to silence
        yield
        return
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def _profile(stepper):
    """Profile one step; returns (traced span, busy time, ranked ops, timeline) in seconds, and the
    share of the step's wall time this thread spent on a core (its CPU time over its wall time:
    below 1 when the process was descheduled, which a shared machine does often)."""
    gpu = stepper.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with _native_stderr_silenced():  # the profiler's C++ side logs its start and stop on stderr
        with profile(activities=activities) as prof:
            wall, cpu = time.perf_counter(), time.thread_time()
            stepper.step()
            sync(stepper.device)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    stepper.reset()
    events = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    if gpu:
        parts = [e for e in events if e.device_type == DeviceType.CUDA]
        by_op = {}
        for e in parts:
            seconds, calls = by_op.get(e.name, (0.0, 0))
            by_op[e.name] = (seconds + e.time_range.elapsed_us() / 1e6, calls + 1)
    else:
        ops = [e for e in events if e.name.startswith("aten::")]
        parts = [
            e for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        ]
        by_op = {}
        for e in ops:  # self time: each operator's own share, without the operators it calls
            seconds, calls = by_op.get(e.name, (0.0, 0))
            by_op[e.name] = (seconds + e.self_cpu_time_total / 1e6, calls + 1)
    if not events:
        raise RuntimeError("the profiler recorded no events for the step")
    origin = min(e.time_range.start for e in events)
    span = (max(e.time_range.end for e in events) - origin) / 1e6
    busy = _union_length((e.time_range.start, e.time_range.end) for e in parts) / 1e6
    timeline = tuple(
        sorted(
            (
                (e.name, (e.time_range.start - origin) / 1e6, (e.time_range.end - origin) / 1e6)
                for e in parts
            ),
            key=lambda t: t[1],
        )
    )
    ranked = tuple(sorted(((n, s, c) for n, (s, c) in by_op.items()), key=lambda t: -t[1]))
    return span, busy, ranked, timeline, min(1.0, cpu / wall) if wall > 0 else 1.0


def trace_step(
    model,
    input_ids,
    context: int | None = None,
    method: str = "cached",
    warmup: int = 2,
    reps: int = 3,
    compile: bool | None = None,
    traces: int = 5,
    threads: int | None = CPU_THREADS,
) -> StepTrace:
    """Time and trace one decode step of ``method`` with ``context`` tokens cached per sequence
    (9.8, step 2).

    ``input_ids`` ``[batch, P]`` fills the cache (repeated up to ``context``, which defaults to P);
    the step feeds each sequence one more token. The step runs ``warmup`` times untimed, ``reps``
    times timed (each from the same cache state), then ``traces`` times under ``torch.profiler``
    with CPU and, on a GPU, CUDA activities; the trace kept is the one whose thread spent the
    largest share of it on a core (on a CPU), then the shortest: the least disturbed by other
    processes. ``compile`` applies to ``static`` (default: on a GPU only). ``paged`` runs kvlab's
    Triton kernels on a GPU and their PyTorch references on a CPU. On a CPU the step runs on
    ``threads`` of torch's threads (default ``CPU_THREADS``; None: the caller's count), restored
    after.
    """
    one_of("method", method, STEP_METHODS)
    traced = trace_steps(
        model, input_ids, (method,), context, warmup, reps, compile, traces, threads
    )
    return traced[method]


def trace_steps(
    model,
    input_ids,
    methods=("cached", "static"),
    context: int | None = None,
    warmup: int = 2,
    reps: int = 3,
    compile: bool | None = None,
    traces: int = 5,
    threads: int | None = CPU_THREADS,
) -> dict:
    """``trace_step`` for each of ``methods`` (distinct), one ``StepTrace`` per method, with their
    traces taken in alternation, one of each per round (their untraced timed steps run one method
    after another): load on a shared machine then falls on every method's traces alike, and a
    comparison of their traces holds from run to run where traces taken a minute apart need not.
    ``paged`` swaps the model's attention while its step is alive, so it is traced alone."""
    if isinstance(methods, str) or not methods or len(set(methods)) != len(methods):
        raise ValueError(f"methods must be a non-empty list of distinct methods, got {methods!r}")
    for i, method in enumerate(methods):
        one_of(f"methods[{i}]", method, STEP_METHODS)
    if "paged" in methods and len(methods) > 1:
        raise ValueError(f"methods must not pair 'paged' with another method, got {methods!r}")
    prepared = {m: prepared_ids(model, input_ids, context, m) for m in methods}
    integer("warmup", warmup, 0)
    integer("reps", reps, 1)
    integer("traces", traces, 1)
    threads = measurement_threads(model, threads)
    steppers = {}
    with cpu_threads(threads):
        try:
            for m in methods:
                steppers[m] = RepeatableStep(model, prepared[m][1], m, compile)
            times = {m: stepper.time(warmup, reps) for m, stepper in steppers.items()}
            profiles = {m: [] for m in methods}
            for _ in range(traces):
                for m, stepper in steppers.items():
                    profiles[m].append(_profile(stepper))
        finally:
            for stepper in steppers.values():
                stepper.close()
    return {
        m: _step_trace(model, m, prepared[m][0], steppers[m], times[m], profiles[m], threads)
        for m in methods
    }


def _step_trace(model, method, shape, stepper, times, profiles, threads) -> StepTrace:
    """The trace kept: the one whose thread was on a core for the largest share of it (then the
    shortest). On a shared machine a descheduled step shows the pause as a gap or as one long
    operator, neither of which is the step's own; a GPU step's thread waits on the device."""
    cpu = stepper.device.type != "cuda"
    profiles = sorted(profiles, key=lambda t: (-round(t[4], 2) if cpu else 0, t[0]))
    span, busy, ops, timeline, _ = profiles[0]
    w = element_bytes(model)
    return StepTrace(
        method,
        stepper.batch,
        stepper.context,
        device_name(),
        statistics.median(times),
        span,
        busy,
        ops,
        timeline,
        step_work(shape, stepper.batch, stepper.context, method, w, w),
        tuple(times),
        threads=threads,
        busy_fractions=tuple(p[1] / p[0] if p[0] > 0 else 0.0 for p in profiles),
    )
