"""Notebook 03, GEMV-like decode and the roofline (section 9.3): the measurements.

- ``sweep`` times ``[n x K] @ [K x N]`` for growing n (1 to 4096 on a GPU in bf16, 1 to 512 on a
  CPU in fp32) with a weight matrix far beyond the last-level cache, and reports achieved FLOP/s,
  bytes/s and arithmetic intensity per n, with the counts of ``kvlab.theory.matmul``; its
  ``fit`` is the two-segment roofline fitted to all points (Williams et al. 2009).
- ``step_time`` and ``profile_step`` time one decode step of a Hugging Face model, then the same
  step with a synchronised timer around every weight matrix (``nn.Linear``, GPT-2's ``Conv1D``),
  and compare it with the time the calibrated read bandwidth needs to read its weights once
  (``weight_read_bytes``): a decode step's weights are a read stream.
- ``bench_rows``: the GEMV bandwidth at batch 1 and the ridge point, calibrated and measured, for
  ``python -m kvlab bench``.

Units are SI: seconds, bytes, FLOP; rates per second.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvlab._checks import flag, instance, integer, require_memory
from kvlab.devices import device as default_device
from kvlab.devices import has_bf16, on_gpu
from kvlab.lab.bench import Row
from kvlab.lab.hardware import Calibration, calibrate, device_name
from kvlab.lab.timing import measure
from kvlab.theory.matmul import (
    RooflineFit,
    batch_at_intensity,
    fit_roofline,
    matmul_bytes,
    matmul_flops,
)
from kvlab.versions import cache_kwargs, last_logits_only

CPU_NS = tuple(2**i for i in range(10))  # 1 .. 512
GPU_NS = tuple(2**i for i in range(13))  # 1 .. 4096


# --------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class GemvPoint:
    """One timed ``[n x K] @ [K x N]``: median, fastest and slowest seconds per product."""

    n: int
    K: int
    N: int
    element_size: int
    seconds: float
    min_seconds: float
    max_seconds: float

    @property
    def flops(self) -> int:
        return matmul_flops(self.n, self.K, self.N)

    @property
    def bytes(self) -> float:
        return matmul_bytes(self.n, self.K, self.N, self.element_size)

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


@dataclass(frozen=True)
class GemvSweep:
    """The points of one sweep, in increasing n, and what they were measured on."""

    points: tuple[GemvPoint, ...]
    K: int
    N: int
    dtype: str
    device: str

    @property
    def ns(self) -> list[int]:
        return [p.n for p in self.points]

    def at(self, n: int) -> GemvPoint:
        for p in self.points:
            if p.n == n:
                return p
        raise KeyError(f"n = {n} was not measured; measured: {self.ns}")

    @property
    def peak_flops_per_s(self) -> float:
        return max(p.flops_per_s for p in self.points)

    @property
    def fit(self) -> RooflineFit:
        """Both roofline segments fitted to the sweep: see :func:`fit_roofline`."""
        return fit_roofline(
            [p.intensity for p in self.points], [p.flops_per_s for p in self.points]
        )

    @property
    def knee_intensity(self) -> float:
        """The fitted knee (FLOP/byte), where the two fitted segments meet: the measured ridge
        point; nan when the sweep did not reach both regimes."""
        return self.fit.knee

    @property
    def knee_batch(self) -> float:
        """The n whose intensity reaches the fitted knee (nan without one)."""
        knee = self.knee_intensity
        if not math.isfinite(knee):
            return float("nan")
        return batch_at_intensity(knee, self.K, self.N, self.points[0].element_size)


def default_sizes(gpu: bool | None = None) -> dict:
    """Sweep sizes: on a GPU an 8192 x 8192 half-precision weight (134 MB; bf16 where the GPU has
    it, else fp16) and n = 1..4096; on a CPU a 4096 x 6144 fp32 weight (101 MB, several times a
    server's last-level cache) and n = 1..512.
    """
    gpu = None if gpu is None else flag("gpu", gpu)
    if gpu is None:
        gpu = on_gpu()
    if gpu:
        return dict(K=8192, N=8192, ns=GPU_NS, dtype="bfloat16" if has_bf16("cuda") else "float16")
    return dict(K=4096, N=6144, ns=CPU_NS, dtype="float32")


def sweep(
    ns=None,
    K: int | None = None,
    N: int | None = None,
    dtype=None,
    device=None,
    warmup: int | None = None,
    reps: int | None = None,
    copies: int = 2,
    seed: int = 0,
) -> GemvSweep:
    """Time ``[n x K] @ [K x N]`` for every n in ``ns`` with ``kvlab.lab.timing.measure``.

    Defaults come from ``default_sizes()`` for kvlab's device. ``copies`` weight matrices are
    used in turn, so a product never finds the previous one's weight in the cache. On a GPU
    each timed call runs 10 products (one launch is shorter than the timer's resolution) and the
    time per product is reported.
    """
    dev = torch.device(device) if device is not None else default_device()
    gpu = dev.type == "cuda"
    sizes = default_sizes(gpu)
    ns = sizes["ns"] if ns is None else ns
    K = sizes["K"] if K is None else K
    N = sizes["N"] if N is None else N
    K, N, copies = integer("K", K), integer("N", N), integer("copies", copies)
    if isinstance(ns, (str, bytes)) or not hasattr(ns, "__iter__"):
        raise TypeError(f"ns must be a sequence of ints >= 1, got {ns!r}")
    ns = sorted({integer("n", n) for n in ns})
    if not ns:
        raise ValueError("ns must hold at least one n")
    if dtype is None:
        dtype = getattr(torch, sizes["dtype"])
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype must be a torch dtype or its name, got {dtype!r}")
        dtype = getattr(torch, dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    warmup = (5 if gpu else 1) if warmup is None else warmup
    reps = (20 if gpu else 3) if reps is None else reps
    inner = 10 if gpu else 1

    element = torch.empty((), dtype=dtype).element_size()
    require_memory(
        f"{copies} weight copies of {K} x {N} and inputs up to n = {ns[-1]}",
        (copies * K * N + ns[-1] * (K + N)) * element,
        dev,
    )
    g = torch.Generator(device=dev).manual_seed(seed)
    weights = [torch.randn(K, N, generator=g, device=dev, dtype=dtype) for _ in range(copies)]
    points = []
    for n in ns:
        t = measure(alternating_product(weights, n, g, inner), warmup=warmup, reps=reps, device=dev)
        points.append(
            GemvPoint(n, K, N, dtype.itemsize, t.median / inner, t.min / inner, t.max / inner)
        )
    return GemvSweep(tuple(points), K, N, str(dtype).removeprefix("torch."), device_name())


def alternating_product(weights, n: int, generator, inner: int = 1):
    """``run()``: ``inner`` products of one random ``[n x K]`` activation with ``weights`` (a list
    of ``[K x N]`` tensors) taken in turn, so that no product finds the previous one's weight in
    the cache; the activation and the output are allocated once, outside the timed calls. The
    timed product of ``sweep`` and of ``kvlab.lab.skinny.roofline_sweep``."""
    instance("weights", weights, list)
    n, inner = integer("n", n, 1), integer("inner", inner, 1)
    K, N = weights[0].shape
    dev, dtype = weights[0].device, weights[0].dtype
    x = torch.randn(n, K, generator=generator, device=dev, dtype=dtype)
    out = torch.empty(n, N, device=dev, dtype=dtype)
    turn = [0]

    def run():
        for _ in range(inner):
            torch.matmul(x, weights[turn[0] % len(weights)], out=out)
            turn[0] += 1

    return run


# --------------------------------------------------------------------------- a decode step


def _matmul_modules(model):
    """(name, module) of every module that multiplies by a stored 2-D weight: nn.Linear, GPT-2's
    Conv1D and their kin (embeddings excluded: they gather rows, they do not multiply)."""
    found = []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if (
            isinstance(m, torch.nn.Embedding)
            or not isinstance(w, torch.nn.Parameter)
            or w.dim() != 2
        ):
            continue
        if any(True for _ in m.children()):
            continue
        found.append((name, m))
    return found


def weight_read_bytes(model, batch: int = 1) -> int:
    """Bytes of parameters one decode step of ``batch`` sequences reads: every matrix it multiplies
    by and every norm and bias once, but only ``batch`` rows of an embedding table it merely indexes
    (a table that is also the output head, tied, is read whole).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (a Hugging Face model), got {type(model).__name__}"
        )
    batch = integer("batch", batch)
    multiplied = {id(m.weight) for _, m in _matmul_modules(model)}
    seen, total = set(), 0
    for m in model.modules():
        for p in m.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(m, torch.nn.Embedding) and id(p) not in multiplied:
                total += min(batch, p.shape[0]) * p[0].numel() * p.element_size()
            else:
                total += p.numel() * p.element_size()
    return total


def random_cache(model, batch: int, context: int, seed: int = 0):
    """A transformers ``DynamicCache`` holding ``context`` tokens of random keys and values per
    sequence: a decode step reads and multiplies them exactly as it would real ones, and no prefill
    has to run to make them.
    """
    batch, context = integer("batch", batch), integer("context", context)
    shape = model.shape
    element = torch.empty((), dtype=model.dtype).element_size()
    require_memory(
        f"a random cache of {batch} x {context} tokens",
        2 * shape.layers * batch * shape.kv_heads * context * shape.head_dim * element,
        model.device,
    )
    cache = DynamicCache(config=model.config)
    g = torch.Generator(device=model.device).manual_seed(seed)
    for layer in range(shape.layers):
        k, v = (
            torch.randn(
                batch,
                shape.kv_heads,
                context,
                shape.head_dim,
                generator=g,
                device=model.device,
                dtype=model.dtype,
            )
            for _ in range(2)
        )
        cache.update(k, v, layer)
    return cache


class RandomCacheStep:
    """One decode step at a fixed (batch, context), repeatable: the cache is cropped back after each
    call."""

    def __init__(self, model, batch: int, context: int, seed: int = 0):
        self.model, self.context = model, context
        self.cache = random_cache(model, batch, context, seed)
        dev = model.device
        self.token = torch.randint(0, model.config.vocab_size, (batch, 1), device=dev)
        self.kw = dict(
            attention_mask=torch.ones(batch, context + 1, dtype=torch.long, device=dev),
            position_ids=torch.full((batch, 1), context, dtype=torch.long, device=dev),
            use_cache=True,
            **cache_kwargs(model, self.cache),
            **last_logits_only(model),
        )

    def __call__(self):
        with torch.inference_mode():
            self.model(self.token, **self.kw)
        self.cache.crop(-1)  # drop the token just appended: every call is the same step


def step_time(model, batch: int = 1, context: int = 128, warmup: int = 2, reps: int = 5):
    """``kvlab.lab.timing.Timing`` of one decode step of ``batch`` sequences with ``context`` cached
    tokens each (random keys and values, see ``random_cache``). The step includes what transformers'
    ``DynamicCache`` does on every step (appending the new key and value by concatenation).
    """
    step = RandomCacheStep(model, integer("batch", batch), integer("context", context))
    return measure(step, warmup=warmup, reps=reps, device=model.device)


@dataclass(frozen=True)
class ModuleTime:
    """One weight matrix of the step: its module name, its part of the model, bytes and median
    seconds."""

    name: str
    part: str
    weight_bytes: int
    seconds: float


@dataclass(frozen=True)
class StepProfile:
    """One decode step taken apart. ``step_seconds`` is the fastest step without hooks (its
    ``step_spread`` the scatter of the repeats above it);
    ``hooked_seconds`` the median step with a synchronised timer around every weight matrix, whose
    own times are in ``modules``. ``weight_bytes`` is what the step reads of its parameters
    (``weight_read_bytes``) and ``kv_bytes`` the cache it attends over, read once.
    """

    model: str
    dtype: str
    device: str
    batch: int
    context: int
    step_seconds: float
    hooked_seconds: float
    modules: tuple[ModuleTime, ...]
    weight_bytes: int
    kv_bytes: int
    read_bytes_per_s: float
    step_spread: float = 0.0

    @property
    def matmul_seconds(self) -> float:
        """Time inside the weight multiplications (with hooks)."""
        return sum(m.seconds for m in self.modules)

    @property
    def rest_seconds(self) -> float:
        """Everything else in the hooked step: attention over the cache, norms, cache update,
        dispatch."""
        return max(0.0, self.hooked_seconds - self.matmul_seconds)

    @property
    def matmul_fraction(self) -> float:
        return self.matmul_seconds / self.hooked_seconds

    @property
    def weight_read_seconds(self) -> float:
        """The floor: weight bytes / calibrated read bandwidth."""
        return self.weight_bytes / self.read_bytes_per_s

    @property
    def weight_read_fraction(self) -> float:
        """Share of the measured step that reading the weights once at the read bandwidth
        accounts for."""
        return self.weight_read_seconds / self.step_seconds

    @property
    def floor_seconds(self) -> float:
        """Weights plus cache, each read once at the read bandwidth (the roofline floor of 9.3)."""
        return (self.weight_bytes + self.kv_bytes) / self.read_bytes_per_s

    def by_part(self) -> dict[str, float]:
        """Hooked seconds per part of the model (attention projections, MLP, output head, other
        matrices), plus ``"rest"`` for everything outside the weight multiplications."""
        parts: dict[str, float] = {}
        for m in self.modules:
            parts[m.part] = parts.get(m.part, 0.0) + m.seconds
        parts["rest"] = self.rest_seconds
        return parts


def _part(name: str) -> str:
    low = name.lower()
    if "lm_head" in low or low.endswith("head"):
        return "output head"
    if "attn" in low or "attention" in low:
        return "attention projections"
    if "mlp" in low or "ffn" in low or "feed_forward" in low:
        return "MLP"
    return "other matrices"


def _hooked_step_times(model, step, modules, warmup: int, reps: int):
    """Seconds of ``reps`` calls of ``step`` with a synchronised timer around each of ``modules``:
    (the whole step's times, {module name: the times of each of its calls})."""
    cuda = model.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(model.device)

    starts: dict[str, float] = {}
    times: dict[str, list[float]] = {name: [] for name, _ in modules}
    handles = []
    for name, m in modules:

        def pre(mod, args, name=name):
            sync()
            starts[name] = time.perf_counter()

        def post(mod, args, out, name=name):
            sync()
            times[name].append(time.perf_counter() - starts[name])

        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    totals = []
    try:
        for _ in range(warmup):
            step()
        for t in times.values():
            t.clear()
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            totals.append(time.perf_counter() - t0)
    finally:
        for h in handles:
            h.remove()
    return totals, times


def profile_step(
    model,
    batch: int = 1,
    context: int = 128,
    warmup: int = 2,
    reps: int = 5,
    calibration: Calibration | None = None,
) -> StepProfile:
    """Time one decode step whole, then layer by layer (section 9.3).

    First the plain step (``step_time``); then the same step with a forward pre-hook and hook on
    every weight matrix that synchronise the device and read ``time.perf_counter``, so each
    module's time is its own. The hooks' synchronisations make the hooked step somewhat longer than
    the plain one; the fractions are taken within the hooked step, the weight-read share against the
    plain one.
    """
    batch, context = integer("batch", batch), integer("context", context)
    integer("reps", reps)
    cal = calibration or calibrate()
    plain = step_time(model, batch, context, warmup=warmup, reps=reps)
    modules = _matmul_modules(model)
    totals, times = _hooked_step_times(
        model, RandomCacheStep(model, batch, context), modules, warmup, reps
    )
    rows = []
    for name, m in modules:
        per_call = times[name]
        calls = max(
            1, len(per_call) // reps
        )  # a module called more than once per step (tied reuse)
        per_rep = (
            [sum(per_call[r * calls : (r + 1) * calls]) for r in range(reps)] if per_call else [0.0]
        )
        bytes_ = sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        rows.append(ModuleTime(name, _part(name), bytes_, statistics.median(per_rep)))
    kv = (
        batch
        * min(context, model.shape.window or context)
        * model.shape.kv_bytes_per_token(model.dtype.itemsize)
    )
    return StepProfile(
        model=model.shape.name,
        dtype=str(model.dtype).removeprefix("torch."),
        device=device_name(),
        batch=batch,
        context=context,
        step_seconds=plain.min,
        step_spread=plain.spread_above_min,
        hooked_seconds=statistics.median(totals),
        modules=tuple(rows),
        weight_bytes=weight_read_bytes(model, batch),
        kv_bytes=int(kv),
        read_bytes_per_s=cal.stream_bytes_per_s,
    )


# --------------------------------------------------------------------------- bench rows


def bench_rows(result: GemvSweep | None = None, calibration: Calibration | None = None) -> list:
    """Rows for ``python -m kvlab bench`` (chapter 3): the GEMV bandwidth at batch 1 against the
    calibrated read bandwidth (the weight is a read stream, not a copy), and the ridge point,
    calibrated (matmul rate / read bandwidth, ``Calibration.ridge_point``) and
    measured (the knee of both roofline segments fitted to the sweep), in FLOP/byte and as a batch
    n.
    """
    result = None if result is None else instance("result", result, GemvSweep)
    cal = calibration or calibrate()
    s = result or sweep()
    one, w = s.points[0], s.points[0].element_size
    shape = f"[{one.n} x {s.K}] @ [{s.K} x {s.N}] {s.dtype}"
    ridge = cal.ridge_point
    return [
        Row(
            "GEMV bandwidth, batch 1",
            one.bytes_per_s / 1e9,
            "GB/s",
            f"{shape}: weight + activation + output bytes / median time",
        ),
        Row(
            "GEMV / read bandwidth",
            one.bytes_per_s / cal.stream_bytes_per_s,
            "fraction",
            f"calibrated read stream {cal.stream_bytes_per_s / 1e9:.1f} GB/s",
        ),
        Row(
            "ridge point, calibrated",
            ridge,
            "FLOP/B",
            f"{cal.matmul_flops / 1e12:.3g} TFLOP/s {cal.matmul_dtype} matmul / read bandwidth",
        ),
        Row(
            "ridge batch, calibrated",
            batch_at_intensity(ridge, s.K, s.N, w),
            "n",
            f"the n whose intensity reaches the calibrated ridge, K = {s.K}, N = {s.N}",
        ),
        Row(
            "ridge batch, measured",
            s.knee_batch,
            "n",
            _knee_note(s, "the n whose intensity reaches the fitted knee"),
        ),
        Row(
            "ridge point, measured",
            s.knee_intensity,
            "FLOP/B",
            _knee_note(s, "knee of both roofline segments fitted to the sweep"),
        ),
        Row("sweep peak", s.peak_flops_per_s / 1e12, "TFLOP/s", f"n = {s.ns[0]} .. {s.ns[-1]}"),
    ]


def _knee_note(s: GemvSweep, what: str) -> str:
    """What the roofline fit found: a knee between two segments of at least two points each, or
    none."""
    fit = s.fit
    if math.isfinite(fit.knee):
        return (
            f"{what}: {fit.split} points on the bandwidth segment, {fit.points - fit.split} on the "
            "compute one"
        )
    return (
        f"no knee: the sweep did not reach both regimes ({fit.split} of {fit.points} points on the "
        "bandwidth segment; each needs two)"
    )
