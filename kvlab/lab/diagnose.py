"""The worked decode reasoning path of section 9.8, as an instrument that ends in a verdict.

Seed 000 ("9 Decode and KV Cache", section 9.8) assesses a decode bottleneck in a fixed order:

1. naive against cached decode: how much does reusing the cache save?
2. a per-token trace: idle gaps between kernels (launch, Python, control plane), or busy kernels
   moving bytes near the sustained bandwidth, or doing FLOPs near the compute ceiling?
3. a stable single-worker loop: compile or replay a CUDA graph when shapes and addresses are fixed
   and the trace is launch-bound;
4. the useful batch: the largest batch whose time to first token (TTFT), time per output token
   (TPOT) and cache capacity stay within the target;
5. cache-memory pressure: paging, prefix reuse, grouped-query attention or KV quantization when
   allocation or bandwidth limits admission or latency.

:func:`trace_step` times and profiles one decode step; :func:`diagnose` walks the five steps and
returns a :class:`Diagnosis`. The bytes and FLOPs it reports come from :mod:`kvlab.theory.roofline` for the
model's shape, batch and context (:func:`step_work`), and the verdict is :func:`decide`, a plain
function of the measurements, so that a reader (and a test) can check the arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field

from kvlab.theory import roofline
from kvlab._checks import integer
from kvlab.theory.specs import Accelerator
from kvlab.lab.hardware import calibrate, device_name

METHODS = ("naive", "cached", "static", "paged")
VERDICTS = ("overhead", "weights", "kv", "compute", "capacity")
# Below this share of the traced step spent inside operators (CPU) or kernels (GPU), the gaps between
# them (Python, dispatch, launches) are the larger part of the step.
BUSY_THRESHOLD = 0.5
# Below this share of both ceilings (copy bandwidth, matmul rate) the step uses neither: its time goes
# to fixed per-operator costs, even where the profiler counts them as "inside" an operator.
CEILING_THRESHOLD = 0.05
# Above this share of the step's bytes, the KV cache (not the weights) is what the step reads.
KV_SHARE_THRESHOLD = 0.5

LEVERS = {
    "capacity": "make the cache fit: paging to stop reserving each request's maximum "
                "(kvlab.serving.paged_decode.paged_generate, section 9.5 PagedAttention), then fewer or narrower "
                "entries per token: grouped-query attention, KV quantization or a window "
                "(kvlab.cache.longctx, section 9.7 Long-context variants)",
    "overhead": "remove the gaps: a stable loop compiled and replayed as a CUDA graph "
                "(kvlab.static_decode(compile=True), section 9.2), or more sequences per step so that "
                "each launch does more work (step 4)",
    "overhead-static": "the loop is already stable: put more sequences in each step so that each "
                       "launch does more work (step 4, the useful batch)",
    "compute-naive": "reuse the cache: kvlab.cached_decode (section 9.2) drops the recomputed positions",
    "compute": "the step is at the compute roof: a smaller batch per step lowers TPOT, and more FLOP/s "
               "needs a faster matmul or a lower precision (section 9.3)",
    "weights": "batch more sequences per step: the weights are read once for all of them, up to the "
               "useful batch of step 4 (kvlab.theory.roofline.ridge_batch, section 9.3); weight quantization "
               "lowers the bytes per parameter",
    "kv": "read fewer KV bytes per step: grouped-query attention, KV quantization or a window "
          "(kvlab.cache.longctx, section 9.7 Long-context variants); paging (section 9.5) admits more requests "
          "but does not shrink what an admitted request reads",
}


# --------------------------------------------------------------------------- bytes and FLOPs


@dataclass(frozen=True)
class StepWork:
    """Bytes one decode step must move and FLOPs it does, from :mod:`kvlab.theory.roofline` (section 9.3)."""

    weights_read: float
    kv_read: float
    kv_written: float
    flops: float

    @property
    def total_bytes(self) -> float:
        return self.weights_read + self.kv_read + self.kv_written

    @property
    def kv_share(self) -> float:
        """Fraction of the step's bytes that are cache reads and writes."""
        return (self.kv_read + self.kv_written) / self.total_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved (section 9.3's arithmetic intensity)."""
        return self.flops / self.total_bytes


def _window_sum(n: int, window: int | None) -> int:
    """sum_{i=1..n} min(i, window): keys the n positions of a full pass attend to."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def step_work(shape, batch: int, context: int, method: str = "cached", w_p: float = 2, w_kv: float = 2) -> StepWork:
    """Bytes and FLOPs of one decode step of ``method`` with ``context`` tokens already cached.

    Cached, static and paged steps: weights read once (P w_p), the cache read once
    (``roofline.step_bytes(...).kv`` = b s K), one new token's keys and values written (b K), and
    ``roofline.step_flops(...)`` = b (2P + A s). A naive step keeps no cache: it reruns all
    n = context + 1 positions, reading the weights once and doing b (2P n + A sum_i min(i, W)) FLOPs.
    """
    _check_method(method)
    batch, context = integer("batch", batch), integer("context", context)
    read = roofline.step_bytes(shape, batch, context, w_p, w_kv)
    if method == "naive":
        n = context + 1
        flops = (roofline.step_flops(shape, batch, context).weights * n
                 + batch * roofline.attention_flops_per_token(shape) * _window_sum(n, shape.window))
        return StepWork(read.weights, 0.0, 0.0, float(flops))
    written = roofline.step_bytes(shape, batch, 1, w_p, w_kv).kv
    return StepWork(read.weights, read.kv, written, roofline.step_flops(shape, batch, context).total)


# --------------------------------------------------------------------------- checks


def _check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def _check_ids(input_ids):
    import torch

    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [batch >= 1, prompt_length >= 1], got {list(input_ids.shape)}")
    return input_ids


def _model_shape(model):
    from kvlab.theory.shapes import ModelShape

    if not hasattr(model, "config") or not callable(model):
        raise TypeError(f"model must be a Hugging Face causal LM (see kvlab.tiny_model), got {type(model).__name__}")
    shape = getattr(model, "shape", None)
    return shape if isinstance(shape, ModelShape) else ModelShape.from_config(model.config)


def _element_bytes(model) -> int:
    return next(model.parameters()).element_size()


# --------------------------------------------------------------------------- one repeatable step


def _tile(input_ids, context: int):
    """``context`` tokens per sequence: the prompt, repeated as often as needed (timing does not depend
    on which tokens they are)."""
    reps = -(-context // input_ids.shape[1])
    return input_ids.repeat(1, reps)[:, :context]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Stepper:
    """A model holding ``context`` cached tokens per sequence, and one decode step on it that can be
    run again and again: ``reset()`` puts the cache back as it was before the step."""

    def __init__(self, model, ids, method: str, compile: bool | None = None):
        import torch

        self.model, self.method, self.ids = model, method, ids
        self.batch, self.context = ids.shape
        self.device = ids.device
        self.token = ids[:, -1:].clone()
        self._restore = None
        try:
            with torch.inference_mode():
                getattr(self, f"_setup_{method}")(compile)
        except BaseException:
            self.close()  # a failed set-up leaves the model as it found it
            raise

    # -- naive: the whole sequence again, no cache
    def _setup_naive(self, compile):
        import torch

        self.full = torch.cat([self.ids, self.token], dim=1)

    def _step_naive(self):
        return self.model(self.full, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1)

    def _reset_naive(self):
        pass

    # -- cached: the model's own DynamicCache, grown by one position and cropped back
    def _setup_cached(self, compile):
        import torch

        from kvlab.versions import cache_kwargs, returned_cache

        out = self.model(self.ids, use_cache=True, logits_to_keep=1)
        self.kw = cache_kwargs(self.model, returned_cache(out))
        self.mask = torch.ones((self.batch, self.context + 1), dtype=torch.long, device=self.device)
        self.position = torch.full((self.batch, 1), self.context, dtype=torch.long, device=self.device)

    def _step_cached(self):
        out = self.model(self.token, attention_mask=self.mask, position_ids=self.position, use_cache=True, **self.kw)
        return out.logits[:, -1].argmax(-1)

    def _reset_cached(self):
        next(iter(self.kw.values())).crop(-1)

    # -- static: transformers' StaticCache of context + 1 slots; the step writes the last one
    def _setup_static(self, compile):
        import torch

        from kvlab.decode import _static_cache, _StaticStep
        from kvlab.versions import cache_kwargs

        cache = _static_cache(self.model, self.batch, self.context + 1)
        self.mask = torch.ones((self.batch, self.context + 1), dtype=torch.long, device=self.device)
        prefill_mask = self.mask.clone()
        prefill_mask[:, -1] = 0
        self.model(self.ids, attention_mask=prefill_mask, use_cache=True, logits_to_keep=1,
                   **cache_kwargs(self.model, cache))
        self.cache = cache
        self.position = torch.full((self.batch, 1), self.context, dtype=torch.long, device=self.device)
        self.static = _StaticStep(self.model, cache_kwargs(self.model, cache),
                                  self.device.type == "cuda" if compile is None else compile)

    def _step_static(self):
        return self.static.step(self.token, self.position, self.mask)

    def _reset_static(self):
        from kvlab.versions import drop_newest

        drop_newest(self.cache, 1)

    # -- paged: kvlab's paged cache; each step decodes forks of the prefilled sequences
    def _setup_paged(self, compile):
        from kvlab.kernels import store_kv_ref
        from kvlab.serving.paged_decode import cache_for, prefill, use_paged_attention

        self._restore = self.model.config._attn_implementation
        use_paged_attention(self.model)
        gpu = self.device.type == "cuda"
        # A block size that divides the context: a fork's first append then opens a fresh block
        # instead of copying a shared one, so the step is an ordinary decode step.
        self.block_size = math.gcd(self.context, 16)
        blocks = self.batch * (self.context // self.block_size + 1)
        self.attention = "kernel" if gpu else "gather"
        # Without a GPU the Triton store runs in its interpreter: store with the PyTorch reference.
        self.cache = cache_for(self.model, blocks, self.block_size, store=None if gpu else store_kv_ref)
        self.seqs = [self.cache.new_sequence() for _ in range(self.batch)]
        for seq, row in zip(self.seqs, self.ids.tolist()):
            prefill(self.model, self.cache, seq, row, self.attention)
        self.forks = [self.cache.fork(s) for s in self.seqs]
        self.tokens = self.token[:, 0].tolist()

    def _step_paged(self):
        from kvlab.serving.paged_decode import decode_step

        return decode_step(self.model, self.cache, self.forks, self.tokens, self.attention)

    def _reset_paged(self):
        for f in self.forks:
            self.cache.free(f)
        self.forks = [self.cache.fork(s) for s in self.seqs]

    # -- the public face
    def step(self):
        import torch

        with torch.inference_mode():
            return getattr(self, f"_step_{self.method}")()

    def reset(self):
        import torch

        with torch.inference_mode():
            getattr(self, f"_reset_{self.method}")()

    def time(self, warmup: int = 2, reps: int = 5, min_total_s: float = 0.05) -> list[float]:
        """Seconds of at least ``reps`` steps, each from the same cache state, after ``warmup`` untimed
        ones. Short steps repeat (up to 10 * reps) until ``min_total_s`` is timed, so that the median
        of a millisecond step is not one unlucky time slice on a shared machine."""
        for _ in range(warmup):
            self.step()
            self.reset()
        times = []
        while len(times) < reps or (sum(times) < min_total_s and len(times) < 10 * reps):
            _sync(self.device)
            start = time.perf_counter()
            self.step()
            _sync(self.device)
            times.append(time.perf_counter() - start)
            self.reset()
        return times

    def close(self):
        if self._restore is not None:
            self.model.set_attn_implementation(self._restore)
            self._restore = None


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class StepTrace:
    """One decode step timed, then traced under ``torch.profiler`` (section 9.8, step 2).

    ``step_s``: median wall time of the untraced step. ``traced_s``: the traced step's span, from the
    first operator's start to the last one's end (the profiler slows small operators down, so use
    its shares, not its absolute time). ``busy_s``: the part of that span covered by kernels (GPU)
    or by top-level operators (CPU: the matmuls and elementwise work, not the Python between them);
    ``idle_s`` the rest. ``ops``: (name, seconds, calls), by total time, largest first.
    ``timeline``: (name, start_s, end_s) of each kernel or top-level operator, from the span's start.
    ``work``: the bytes and FLOPs of :func:`step_work`.
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
        """A plain dict for ``book/data/measurements/`` (recorded traces shown beside the reader's)."""
        return {"method": self.method, "batch": self.batch, "context": self.context, "device": self.device,
                "step_s": self.step_s, "traced_s": self.traced_s, "busy_s": self.busy_s,
                "ops": [list(o) for o in self.ops], "timeline": [list(t) for t in self.timeline],
                "work": {"weights_read": self.work.weights_read, "kv_read": self.work.kv_read,
                         "kv_written": self.work.kv_written, "flops": self.work.flops}}

    @classmethod
    def from_json(cls, d: dict) -> "StepTrace":
        return cls(d["method"], d["batch"], d["context"], d["device"], d["step_s"], d["traced_s"], d["busy_s"],
                   tuple(tuple(o) for o in d["ops"]), tuple(tuple(t) for t in d["timeline"]), StepWork(**d["work"]))


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
    """Profile one step; returns (traced span, busy time, ranked ops, timeline) in seconds."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = stepper.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with _native_stderr_silenced():  # the profiler's C++ side logs its start and stop on stderr
        with profile(activities=activities) as prof:
            stepper.step()
            _sync(stepper.device)
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
        parts = [e for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        by_op = {}
        for e in ops:  # self time: each operator's own share, without the operators it calls
            seconds, calls = by_op.get(e.name, (0.0, 0))
            by_op[e.name] = (seconds + e.self_cpu_time_total / 1e6, calls + 1)
    if not events:
        raise RuntimeError("the profiler recorded no events for the step")
    origin = min(e.time_range.start for e in events)
    span = (max(e.time_range.end for e in events) - origin) / 1e6
    busy = _union_length((e.time_range.start, e.time_range.end) for e in parts) / 1e6
    timeline = tuple(sorted(((e.name, (e.time_range.start - origin) / 1e6, (e.time_range.end - origin) / 1e6)
                             for e in parts), key=lambda t: t[1]))
    ranked = tuple(sorted(((n, s, c) for n, (s, c) in by_op.items()), key=lambda t: -t[1]))
    return span, busy, ranked, timeline


def _prepare(model, input_ids, context, method):
    shape = _model_shape(model)
    _check_method(method)
    input_ids = _check_ids(input_ids)
    context = input_ids.shape[1] if context is None else integer("context", context, 1)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and context + 1 > limit:
        raise ValueError(f"context must be <= {limit - 1} for this model (max_position_embeddings {limit}), "
                         f"got {context}")
    return shape, _tile(input_ids.to(model.device), context)


def trace_step(model, input_ids, context: int | None = None, method: str = "cached", warmup: int = 2,
               reps: int = 3, compile: bool | None = None, traces: int = 3) -> StepTrace:
    """Time and trace one decode step of ``method`` with ``context`` tokens cached per sequence (9.8, step 2).

    ``input_ids`` ``[batch, P]`` fills the cache (repeated up to ``context``, which defaults to P); the
    step feeds each sequence one more token. The step runs ``warmup`` times untimed, ``reps`` times
    timed (each from the same cache state), then ``traces`` times under ``torch.profiler`` with CPU
    and, on a GPU, CUDA activities; the trace kept is the shortest (the least disturbed by other
    processes). ``compile`` applies to ``static`` (default: on a GPU only). ``paged`` runs
    kvlab's Triton kernels on a GPU and their PyTorch references on a CPU.
    """
    shape, ids = _prepare(model, input_ids, context, method)
    integer("warmup", warmup, 0)
    integer("reps", reps, 1)
    integer("traces", traces, 1)
    stepper = _Stepper(model, ids, method, compile)
    try:
        times = stepper.time(warmup, reps)
        # The shortest of ``traces`` profiled steps: on a shared machine a step that was descheduled
        # shows the pause as a gap or as one long operator, neither of which is the step's own.
        span, busy, ops, timeline = min((_profile(stepper) for _ in range(traces)), key=lambda t: t[0])
    finally:
        stepper.close()
    w = _element_bytes(model)
    work = step_work(shape, stepper.batch, stepper.context, method, w, w)
    return StepTrace(method, stepper.batch, stepper.context, device_name(), statistics.median(times), span, busy,
                     ops, timeline, work, tuple(times))


def _step_time(model, ids, method, warmup=1, reps=3, compile=None) -> float:
    stepper = _Stepper(model, ids, method, compile)
    try:
        return statistics.median(stepper.time(warmup, reps))
    finally:
        stepper.close()


def _prefill_time(model, ids, reps=2) -> float:
    """Time to first token: the prompt's forward pass with a cache, and the greedy pick."""
    import torch

    times = []
    for _ in range(reps):  # the fastest of ``reps``: a prefill is long enough to need no warm-up call
        _sync(ids.device)
        start = time.perf_counter()
        with torch.inference_mode():
            model(ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)
        _sync(ids.device)
        times.append(time.perf_counter() - start)
    return min(times)


# --------------------------------------------------------------------------- the verdict


def decide(*, busy_fraction: float, bandwidth_fraction: float, flops_fraction: float, kv_share: float,
           admitted: "bool | roofline.Admission" = True) -> tuple[str, str]:
    """The verdict of section 9.8 from the measurements; returns (verdict, the measurements it rests on).

    In order: a request that does not fit is ``capacity``; a step that is mostly gaps between
    operators, or that uses under ``CEILING_THRESHOLD`` of both ceilings, is ``overhead``; a step
    whose share of the compute ceiling exceeds its share of the bandwidth ceiling (its arithmetic
    intensity is past the machine's ridge point) is ``compute``; otherwise it is memory-bound, on
    ``kv`` when the cache is most of its bytes and on ``weights`` when they are.
    """
    for name, value in (("busy_fraction", busy_fraction), ("bandwidth_fraction", bandwidth_fraction),
                        ("flops_fraction", flops_fraction), ("kv_share", kv_share)):
        x = roofline._real(name, value)
        if not (x >= 0 and math.isfinite(x)):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if kv_share > 1:
        raise ValueError(f"kv_share must be in [0, 1], got {kv_share!r}")
    ceilings = (f"{bandwidth_fraction:.0%} of the copy bandwidth and {flops_fraction:.0%} of the matmul rate")
    if not admitted:
        detail = f": {admitted}" if isinstance(admitted, roofline.Admission) else ""
        return "capacity", f"weights plus cache for the requested batch and length do not fit in memory{detail}"
    if busy_fraction < BUSY_THRESHOLD:
        return "overhead", (f"operators or kernels were busy for only {busy_fraction:.0%} of the traced step "
                            f"(threshold {BUSY_THRESHOLD:.0%}); the rest is gaps between them")
    if max(bandwidth_fraction, flops_fraction) < CEILING_THRESHOLD:
        return "overhead", (f"the step reached only {ceilings} (both under {CEILING_THRESHOLD:.0%}): "
                            "fixed per-operator costs, not bytes or FLOPs, set its time")
    if flops_fraction > bandwidth_fraction:
        return "compute", (f"busy for {busy_fraction:.0%} of the step at {ceilings}: nearer the compute "
                           "ceiling than the bandwidth one (intensity past the ridge point)")
    part = "kv" if kv_share > KV_SHARE_THRESHOLD else "weights"
    what = "the KV cache" if part == "kv" else "the weights"
    return part, (f"busy for {busy_fraction:.0%} of the step at {ceilings}; {what} make up "
                  f"{kv_share if part == 'kv' else 1 - kv_share:.0%} of the bytes it moves")


def lever(verdict: str, method: str) -> str:
    """The next change the path recommends for ``verdict`` on loop ``method``."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    _check_method(method)
    if verdict == "overhead" and method == "static":
        return LEVERS["overhead-static"]
    if verdict == "compute" and method == "naive":
        return LEVERS["compute-naive"]
    return LEVERS[verdict]


# --------------------------------------------------------------------------- the five steps


@dataclass(frozen=True)
class Target:
    """A service target for step 4: TPOT and TTFT limits in seconds, and the memory (bytes) for weights
    plus cache (default: this device's memory). Any of them may be None (no limit)."""

    tpot: float | None = None
    ttft: float | None = None
    memory: float | None = None

    def __post_init__(self):
        for name in ("tpot", "ttft", "memory"):
            value = getattr(self, name)
            if value is not None:
                roofline._positive(f"target.{name}", value)


@dataclass(frozen=True)
class Step:
    """One step of the path: what it measured, the ceiling it compared against, what it found."""

    name: str
    measured: dict
    ceiling: dict
    finding: str


@dataclass(frozen=True)
class BatchPoint:
    """Step 4 at one batch size: measured TTFT and TPOT, and whether weights plus cache fit."""

    batch: int
    ttft: float
    tpot: float
    admission: roofline.Admission

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.tpot

    def meets(self, target: Target) -> bool:
        return (bool(self.admission) and (target.tpot is None or self.tpot <= target.tpot)
                and (target.ttft is None or self.ttft <= target.ttft))


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found (section 9.8). ``steps`` holds the five :class:`Step`\\ s in order."""

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

    def __str__(self) -> str:
        lines = [f"decode diagnosis: {self.method} loop, batch {self.batch}, prompt {self.prompt_tokens}, "
                 f"{self.new_tokens} new tokens (traced at {self.context} cached tokens)"]
        wrap = functools.partial(textwrap.fill, width=100, subsequent_indent=" " * 13)
        for i, s in enumerate(self.steps, 1):
            lines.append(f"{i}. {s.name}")
            lines.append(wrap("   measured: " + _fmt(s.measured)))
            lines.append(wrap("   ceiling:  " + _fmt(s.ceiling)))
            lines.append(wrap("   finding:  " + s.finding))
        lines += [wrap(f"verdict: {self.verdict} ({self.because})"), wrap(f"lever: {self.lever}")]
        return "\n".join(lines)


def _fmt(d: dict) -> str:
    def one(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    return ", ".join(f"{k} {one(v)}" for k, v in d.items()) or "-"


def this_machine(memory: float | None = None) -> Accelerator:
    """This device as an ``Accelerator`` for :mod:`kvlab.theory.roofline`: calibrated copy bandwidth and matmul
    rate, and ``memory`` bytes (default: the GPU's memory, or the CPU's physical memory)."""
    import os

    import torch

    cal = calibrate()
    if memory is None:
        if torch.cuda.is_available():
            memory = torch.cuda.get_device_properties(0).total_memory
        else:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = roofline._positive("memory", memory)
    return Accelerator(cal.device, memory, cal.copy_bytes_per_s, cal.matmul_flops, 1, cal.copy_bytes_per_s, None,
                       "measured by kvlab.calibrate()")


def _default_batches(batch: int) -> list[int]:
    return sorted({1, batch, 2 * batch, 4 * batch})


def diagnose(model, input_ids, max_new_tokens: int, method: str = "cached", target: Target | None = None,
             batches=None, progress: bool = False, compile: bool | None = None) -> Diagnosis:
    """Walk the five steps of section 9.8 on ``model`` and the prompts ``input_ids`` ``[batch, P]``.

    The trace (steps 2 and 3) is taken at the request's middle step: ``P + max_new_tokens // 2``
    cached tokens. Step 4 times TTFT (the prompt's prefill) and TPOT (one step at that context) at
    each of ``batches`` (default 1, b, 2b, 4b) and checks each against ``target`` and against
    ``roofline.admitted`` for P + max_new_tokens tokens per sequence. ``progress`` shows a tqdm bar.
    """
    from tqdm.auto import tqdm

    shape, _ = _prepare(model, input_ids, None, method)
    integer("max_new_tokens", max_new_tokens, 1)
    target = Target() if target is None else target
    if not isinstance(target, Target):
        raise TypeError(f"target must be a kvlab.lab.diagnose.Target or None, got {type(target).__name__}")
    batch, prompt = input_ids.shape
    batches = _default_batches(batch) if batches is None else [integer("batches[i]", b) for b in batches]
    if not batches:
        raise ValueError("batches must name at least one batch size")
    context = prompt + max_new_tokens // 2
    _prepare(model, input_ids, prompt + max_new_tokens, method)  # the whole request must fit the model
    machine = this_machine(target.memory)
    cal = calibrate()
    w = _element_bytes(model)
    final = prompt + max_new_tokens
    ids = _tile(input_ids.to(model.device), context)
    steps = []
    bar = tqdm(total=5, desc="diagnose", disable=not progress, leave=False)
    try:
        # 1. naive against cached, per token at the same context
        bar.set_postfix_str("1 naive vs cached")
        one = ids[:1]  # per sequence: what the cache saves does not depend on the batch
        t_naive = _step_time(model, one, "naive", warmup=0, reps=2)
        t_cached = _step_time(model, one, "cached")
        speedup = t_naive / t_cached
        work_ratio = float(context + 1)  # positions a naive step runs, against one
        steps.append(Step("naive and cached decode (one sequence)",
                          {"naive step s": t_naive, "cached step s": t_cached, "naive / cached": speedup},
                          {"positions per step, naive / cached": work_ratio},
                          _step1_finding(speedup, work_ratio)))
        bar.update()

        # 2. the per-token trace
        bar.set_postfix_str("2 trace")
        trace = trace_step(model, input_ids, context, method, compile=compile)
        bw_frac = trace.achieved_bandwidth / cal.copy_bytes_per_s
        fl_frac = trace.achieved_flops / cal.matmul_flops
        floor = max(trace.work.total_bytes / cal.copy_bytes_per_s, trace.work.flops / cal.matmul_flops)
        fit = roofline.admitted(shape, machine, batch, final, w, w)
        verdict, because = decide(busy_fraction=trace.busy_fraction, bandwidth_fraction=bw_frac,
                                  flops_fraction=fl_frac, kv_share=trace.work.kv_share, admitted=fit)
        steps.append(Step("per-token trace",
                          {"step s": trace.step_s, "busy fraction": trace.busy_fraction,
                           "bytes": trace.work.total_bytes, "KV share of bytes": trace.work.kv_share,
                           "FLOPs": trace.work.flops, "bytes/s": trace.achieved_bandwidth,
                           "FLOP/s": trace.achieved_flops},
                          {"copy bytes/s": cal.copy_bytes_per_s, "matmul FLOP/s": cal.matmul_flops,
                           "roofline floor s": floor},
                          _step2_finding(trace, bw_frac, fl_frac)))
        bar.update()

        # 3. a stable loop: the static step beside this one
        bar.set_postfix_str("3 stable loop")
        other = "cached" if method == "static" else "static"
        t_other = _step_time(model, ids, other, compile=compile)
        static_s, dynamic_s = (trace.step_s, t_other) if method == "static" else (t_other, trace.step_s)
        base = "cached" if method == "static" else method
        steps.append(Step("stable loop (compile, CUDA graph)",
                          {"busy fraction": trace.busy_fraction, f"{method} step s": trace.step_s,
                           f"{other} step s": t_other, f"static / {base} time": static_s / dynamic_s},
                          {"roofline floor s": floor},
                          _step3_finding(trace.busy_fraction, static_s, dynamic_s, base,
                                         model.device.type == "cuda")))
        bar.update()

        # 4. the useful batch
        bar.set_postfix_str("4 useful batch")
        sweep = _sweep(model, input_ids, context, final, method, batches, machine, compile)
        useful = useful_batch(sweep, target)
        steps.append(Step("useful batch size",
                          {f"b={p.batch}": f"TTFT {p.ttft * 1e3:.3g} ms, TPOT {p.tpot * 1e3:.3g} ms, "
                                           f"{p.tokens_per_s:.4g} tok/s" for p in sweep},
                          {"TPOT target s": target.tpot, "TTFT target s": target.ttft,
                           "memory bytes": machine.hbm_bytes,
                           "largest admitted batch": capacity_batch(shape, machine, final, w)},
                          _step4_finding(sweep, useful, target)))
        bar.update()

        # 5. cache-memory pressure
        bar.set_postfix_str("5 cache pressure")
        steps.append(Step("cache-memory pressure",
                          {"KV bytes at the end": fit.kv, "weight bytes": fit.weights,
                           "KV share of step bytes": trace.work.kv_share},
                          {"memory bytes": fit.available, "KV share threshold": KV_SHARE_THRESHOLD},
                          _step5_finding(fit, trace.work.kv_share)))
        bar.update()
    finally:
        bar.close()
    return Diagnosis(method, batch, prompt, max_new_tokens, context, tuple(steps), verdict, because,
                     lever(verdict, method), trace.achieved_bandwidth, bw_frac, fl_frac, trace, sweep, useful, target)


def _sweep(model, input_ids, context, final, method, batches, machine, compile) -> tuple:
    shape, w = _model_shape(model), _element_bytes(model)
    points = []
    for b in batches:
        prompt_ids = input_ids.to(model.device).repeat(-(-b // input_ids.shape[0]), 1)[:b]
        ttft = _prefill_time(model, prompt_ids)
        tpot = _step_time(model, _tile(prompt_ids, context), method, compile=compile)
        points.append(BatchPoint(b, ttft, tpot, roofline.admitted(shape, machine, b, final, w, w)))
    return tuple(points)


def batch_sweep(model, input_ids, max_new_tokens: int, batches, method: str = "cached", memory: float | None = None,
                compile: bool | None = None) -> tuple:
    """Step 4 of section 9.8 on its own: a :class:`BatchPoint` per batch size in ``batches``.

    Each point times TTFT (the prefill of ``input_ids``' prompts, repeated to fill the batch) and TPOT
    (one ``method`` step at the request's middle, P + max_new_tokens // 2 cached tokens), and asks
    ``roofline.admitted`` whether weights plus P + max_new_tokens tokens per sequence fit in ``memory``
    bytes (default: this device's memory).
    """
    _check_method(method)
    integer("max_new_tokens", max_new_tokens, 1)
    batches = [integer("batches[i]", b) for b in batches]
    if not batches:
        raise ValueError("batches must name at least one batch size")
    prompt = _check_ids(input_ids).shape[1]
    _prepare(model, input_ids, prompt + max_new_tokens, method)
    return _sweep(model, input_ids, prompt + max_new_tokens // 2, prompt + max_new_tokens, method, batches,
                  this_machine(memory), compile)


def capacity_batch(shape, hw, context: int, w: float = 2) -> int:
    """The largest batch whose weights plus cache of ``context`` tokens each fit (``roofline.admitted``);
    0 when not even one sequence fits."""
    fit = roofline.admitted(shape, hw, 1, context, w, w)
    if not fit:
        return 0
    return int((fit.available - fit.weights) // fit.kv) if fit.kv > 0 else 2**31


def useful_batch(sweep, target: Target) -> int | None:
    """Step 4: the largest measured batch that meets ``target`` and fits; without TPOT and TTFT limits,
    the admitted batch with the most tokens per second. None when no measured batch qualifies."""
    ok = [p for p in sweep if p.meets(target)]
    if not ok:
        return None
    if target.tpot is None and target.ttft is None:
        return max(ok, key=lambda p: p.tokens_per_s).batch
    return max(p.batch for p in ok)


# --------------------------------------------------------------------------- findings (both branches)


def _step1_finding(speedup: float, work_ratio: float) -> str:
    if speedup >= 2:
        return (f"reusing the cache made a step {speedup:.1f}x faster (the naive step reruns {work_ratio:.0f}x the "
                "positions): recomputation was the limit the cache removes")
    return (f"the cache bought only {speedup:.1f}x although the naive step reruns {work_ratio:.0f}x the positions: "
            "a short prefix, a fixed per-step cost (dispatch, launches) or a limit outside recomputation")


def _step2_finding(trace: StepTrace, bw_frac: float, fl_frac: float) -> str:
    gaps = "Python dispatch between operators" if trace.device.startswith("CPU") else "launches and host work"
    if trace.busy_fraction < BUSY_THRESHOLD:
        return (f"idle {1 - trace.busy_fraction:.0%} of the traced step: gaps ({gaps}) dominate, "
                "bytes and FLOPs do not")
    return (f"busy {trace.busy_fraction:.0%} of the step, at {bw_frac:.0%} of copy bandwidth and "
            f"{fl_frac:.0%} of the matmul rate; {trace.work.kv_share:.0%} of the bytes are KV")


def _step3_finding(busy: float, static_s: float, dynamic_s: float, base: str, gpu: bool) -> str:
    gain = dynamic_s / static_s
    where = ("on a GPU, compilation and CUDA-graph replay remove launch gaps" if gpu else
             "on a CPU there are no CUDA graphs; a fixed-shape step only avoids the cache's reallocation")
    if busy < BUSY_THRESHOLD:
        return (f"launch-bound (busy {busy:.0%}): a stable loop is the next step; {where}; the static step "
                f"ran {gain:.2f}x as fast as the {base} one")
    return (f"not launch-bound (busy {busy:.0%}): the static step ran {gain:.2f}x as fast as the {base} one; "
            f"{where}")


def _step4_finding(sweep, useful, target: Target) -> str:
    best = max(sweep, key=lambda p: p.tokens_per_s)
    if useful is None:
        return ("no measured batch meets the target and fits in memory: relax the target or shrink the "
                "per-step work (step 5)")
    return (f"batch {useful} is the useful batch ({'most tokens/s' if target.tpot is None and target.ttft is None else 'largest within the target'}); "
            f"the most tokens/s measured was {best.tokens_per_s:.4g} at batch {best.batch}")


def _step5_finding(fit, kv_share: float) -> str:
    if not fit:
        return f"the cache does not fit: {fit}; paging, GQA or KV quantization come first"
    if kv_share > KV_SHARE_THRESHOLD:
        return (f"fits ({fit}), but the cache is {kv_share:.0%} of each step's bytes: fewer KV bytes "
                "(GQA, quantization, windows) would shorten the step")
    return f"fits ({fit}) and the cache is {kv_share:.0%} of each step's bytes: cache pressure is not the limit yet"


# --------------------------------------------------------------------------- bench


def bench_rows():
    """Section 9.8: the cached and static steps traced side by side, and the cached loop's verdict.

    CPU: the tiny Llama (fp32), P = 128, batch 1. GPU: the Llama-3.2-1B shape in bf16, P = 1024,
    batch 1, the static step compiled and replayed as a CUDA graph.
    """
    import torch

    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import on_gpu
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    prompt_len = 1024 if gpu else 128
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    traces = {m: trace_step(model, ids, method=m, reps=10) for m in ("cached", "static")}
    d = diagnose(model, ids, 16, batches=[1])
    where = f"{model.shape.name}, {str(model.dtype).removeprefix('torch.')}, context {prompt_len}, batch 1"
    cal = calibrate()
    rows = []
    for m, t in traces.items():
        rows += [Row(f"{m} step busy fraction", t.busy_fraction, "fraction", f"{where}; traced"),
                 Row(f"{m} step bytes / copy bandwidth", t.achieved_bandwidth / cal.copy_bytes_per_s, "fraction",
                     "kvlab.theory.roofline bytes over the median step time")]
    rows += [Row("static / cached step time", traces["static"].step_s / traces["cached"].step_s, "x",
                 "ratio of medians, same run"),
             Row(f"cached verdict: {d.verdict}", d.bandwidth_fraction, "fraction", "bandwidth fraction behind it")]
    return rows
