"""Measurements across ranks for notebook 12, "Decode across devices": the link between two ranks,
collectives against the ring model of ``kvlab.theory.parallel``, and a tensor-parallel decode step
against one process's; ``bench_rows`` for ``python -m kvlab bench``.

The link is calibrated the way one calibrates any network: a message bounced between two ranks,
at sizes from a kilobyte to megabytes, and a line fit to the one-way time, t(n) = alpha + n / beta
(Hockney 1994). alpha is the per-message latency, beta the rate. On one CPU with gloo, the
"link" is the kernel's loopback TCP between two processes sharing the same memory: these
numbers measure the mechanism, not NVLink.

Every time here is the fastest of several repeats, not their median: on a shared machine the other
processes only ever add time, and the fastest repeat is the least disturbed one.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kvlab._checks import integer, items, one_of
from kvlab.parallel import launch
from kvlab.theory import parallel as model
from kvlab.theory.agreement import combined_spread
from kvlab.theory.specs import Link

SIZES = tuple(2**k for k in range(10, 23, 2))  # 1 KiB .. 4 MiB


def _check_sizes(sizes) -> tuple[int, ...]:
    sizes = tuple(integer(f"sizes[{i}]", n, 4) for i, n in enumerate(sizes))
    if not sizes or any(n % 4 for n in sizes):
        raise ValueError(
            f"sizes must be byte counts that are multiples of 4 (fp32 elements), got {sizes}"
        )
    return sizes


# --------------------------------------------------------------------------- the link


@dataclass(frozen=True)
class MeasuredLink:
    """One-way times of messages between two ranks and the line t = alpha + n / beta fitted to
    them."""

    backend: str
    sizes: tuple[int, ...]
    one_way_s: tuple[float, ...]
    latency_s: float
    bytes_per_s: float

    def link(self) -> Link:
        """The calibrated link, usable wherever ``kvlab.theory`` takes a ``Link``."""
        return Link(
            f"{self.backend} between two ranks here (measured)",
            self.bytes_per_s,
            "kvlab.lab.parallel.calibrate_link: ping-pong between ranks 0 and 1, line fit",
        )

    def predicted(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


def fit_line(sizes, seconds) -> tuple[float, float]:
    """(alpha, beta) of t = alpha + n / beta, fitted by least squares of the relative error (each
    point weighted by 1 / t^2), so that the small messages that set alpha count as much as the large
    ones that set beta. alpha is clipped at 0."""
    n = [float(x) for x in sizes]
    t = [float(x) for x in seconds]
    if len(n) < 2 or len(n) != len(t) or min(t) <= 0:
        raise ValueError("fit_line needs at least two (size, positive time) pairs of equal length")
    w = [1 / x**2 for x in t]
    sw, sn, st = sum(w), sum(a * b for a, b in zip(w, n)), sum(a * b for a, b in zip(w, t))
    snn, snt = sum(a * b * b for a, b in zip(w, n)), sum(a * b * c for a, b, c in zip(w, n, t))
    slope = (sw * snt - sn * st) / (sw * snn - sn * sn)
    if slope <= 0:
        raise ValueError(
            "the measured times do not grow with the message size: no rate can be fitted"
        )
    return max(0.0, (st - slope * sn) / sw), 1 / slope


def _ping_pong_on_rank(rank: int, world_size: int, sizes, reps: int):
    """Ranks 0 and 1 bounce each message ``reps`` times; the others wait. Rank 0 returns one-way
    times."""
    device = launch.rank_device()
    times = []
    for n in sizes:
        buffer = torch.ones(n // 4, device=device)
        rounds = []
        for i in range(reps + 2):  # two warm-up rounds
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, dst=1)
                dist.recv(buffer, src=1)
            elif rank == 1:
                dist.recv(buffer, src=0)
                dist.send(buffer, dst=0)
            if i >= 2:
                rounds.append((time.perf_counter() - start) / 2)
        times.append(min(rounds))
    return times if rank == 0 else None


CALIBRATION_TRIES = 3


def calibrate_link(workers: launch.Workers, sizes=SIZES, reps: int = 9) -> MeasuredLink:
    """Ping-pong between ranks 0 and 1 of ``workers`` at each of ``sizes`` bytes; the fitted link.

    On a busy machine a rank can be descheduled through every repetition of a small message, so that
    its best time exceeds a large one's and no line fits; the sweep is then measured again with
    twice the repetitions, up to ``CALIBRATION_TRIES`` times, before the fit's error is raised."""
    sizes, reps = _check_sizes(sizes), integer("reps", reps)
    for attempt in range(CALIBRATION_TRIES):
        one_way = workers.run(_ping_pong_on_rank, sizes, reps * 2**attempt)[0]
        try:
            alpha, beta = fit_line(sizes, one_way)
        except ValueError:
            if attempt == CALIBRATION_TRIES - 1:
                raise
            continue
        return MeasuredLink(workers.backend, sizes, tuple(one_way), alpha, beta)


# --------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class CollectiveSweep:
    """Measured time of one collective per message size, beside the ring model's prediction with
    the calibrated link: alpha times ``kvlab.theory.parallel.ring_steps``, plus the ring's bytes
    at the fitted rate. ``sizes`` are the message (all-reduce) or each rank's part (all-gather)."""

    kind: str
    world_size: int
    sizes: tuple[int, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    # per size, how far the faster quarter of the calls sat above the fastest (relative)
    spreads: tuple[float, ...] = ()


def _collective_on_rank(rank: int, world_size: int, kind: str, sizes, reps: int):
    """Fastest seconds of ``kind`` per size on this rank, each timed call starting after a
    barrier."""
    return [t.min for t in _collective_timings(world_size, kind, sizes, reps)]


def _collective_spread_on_rank(rank: int, world_size: int, kind: str, sizes, reps: int):
    """Per size, this rank's fastest call and how far the faster quarter sat above it."""
    return [(t.min, t.spread_above_min) for t in _collective_timings(world_size, kind, sizes, reps)]


def _collective_timings(world_size: int, kind: str, sizes, reps: int) -> list:
    from kvlab.lab.timing import Timing

    device = launch.rank_device()
    timings = []
    for n in sizes:
        part = torch.ones(n // 4, device=device)
        parts = [torch.empty_like(part) for _ in range(world_size)]
        calls = []
        for i in range(reps + 2):
            dist.barrier()
            start = time.perf_counter()
            if kind == "all_reduce":
                dist.all_reduce(part)
            else:
                dist.all_gather(parts, part)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                calls.append(time.perf_counter() - start)
        calls.sort()
        timings.append(Timing(calls[len(calls) // 2], calls[0], calls[-1], tuple(calls)))
    return timings


def predicted_collective(kind: str, nbytes: float, world_size: int, link: MeasuredLink) -> float:
    """The ring model's time of one collective over the calibrated ``link``."""
    latency = model.ring_steps(kind, world_size) * link.latency_s
    return model.collective_time(kind, nbytes, world_size, link.link(), latency)


def measure_collectives(
    workers: launch.Workers,
    link: MeasuredLink,
    kind: str = "all_reduce",
    sizes=SIZES,
    reps: int = 9,
) -> CollectiveSweep:
    """Time ``kind`` at each size on ``workers`` (the slowest rank's time counts: a collective
    ends when its last rank does) and predict each from ``link``."""
    one_of("kind", kind, model.COLLECTIVES)
    sizes, reps = _check_sizes(sizes), integer("reps", reps)
    per_rank = workers.run(_collective_spread_on_rank, kind, sizes, reps)
    measured = tuple(max(r[i][0] for r in per_rank) for i in range(len(sizes)))
    spreads = tuple(max(r[i][1] for r in per_rank) for i in range(len(sizes)))
    predicted = tuple(predicted_collective(kind, n, workers.world_size, link) for n in sizes)
    return CollectiveSweep(kind, workers.world_size, sizes, measured, predicted, spreads)


# --------------------------------------------------------------------------- a tensor-parallel step


@dataclass(frozen=True)
class StepComparison:
    """A decode step of one model in one process and split over ``world_size`` ranks, with what the
    split step should cost: one process's step / p plus its collectives, each timed alone here."""

    world_size: int
    batch: int
    context: int
    one_process_s: float
    split_s: float
    calls: int
    message_bytes: int
    all_reduce_s: float
    # the vocabulary split's all-reduce and logit all-gather, where the plan has them
    extra_s: float
    # how far the second-fastest round sat above the fastest, relative (each step's own scatter)
    one_process_spread: float = 0.0
    split_spread: float = 0.0

    @property
    def communication_s(self) -> float:
        return self.calls * self.all_reduce_s + self.extra_s

    @property
    def predicted_s(self) -> float:
        return self.one_process_s / self.world_size + self.communication_s

    @property
    def spread(self) -> float:
        """The relative spread behind split over predicted: both steps' rounds."""
        return combined_spread(self.one_process_spread, self.split_spread)


ROUNDS = 5  # timed rounds of a step, in one process and on each rank


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_seconds(net, batch: int, context: int, steps: int, vocab: int, together: bool):
    """Seconds of one cached decode step after a ``context``-token prefill: the fastest of
    ``ROUNDS`` rounds, and how far the second fastest sat above it (relative)."""
    from transformers import DynamicCache

    from kvlab.versions import cache_kwargs

    device = next(net.parameters()).device
    ids = torch.randint(0, vocab, (batch, context), generator=torch.Generator().manual_seed(0)).to(
        device
    )
    rounds = []
    with torch.inference_mode():
        cache = DynamicCache()
        out = net(ids, use_cache=True, **cache_kwargs(net, cache))
        token = out.logits[:, -1:].argmax(-1)
        for r in range(ROUNDS + 1):  # one warm-up round
            _sync(device)
            if together:
                dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                out = net(token, use_cache=True, **cache_kwargs(net, cache))
                token = out.logits[:, -1:].argmax(-1)
            _sync(device)
            if r:
                rounds.append((time.perf_counter() - start) / steps)
    rounds.sort()
    return rounds[0], rounds[1] / rounds[0] - 1


def _split_step_on_rank(
    rank: int,
    world_size: int,
    path: str,
    batch: int,
    context: int,
    steps: int,
    message: int,
    logits: int,
    reps: int,
):
    from kvlab.parallel.tensor import load_sharded

    net = load_sharded(path)
    step, spread = _step_seconds(net, batch, context, steps, net.config.vocab_size, together=True)
    reduce_s = _collective_on_rank(rank, world_size, "all_reduce", (message,), reps)[0]
    gather_s = (
        _collective_on_rank(rank, world_size, "all_gather", (logits,), reps)[0] if logits else 0.0
    )
    return step, reduce_s, gather_s, spread


def compare_tensor_parallel_step(
    net, workers: launch.Workers, batch: int = 1, context: int = 64, steps: int = 8, reps: int = 15
) -> StepComparison:
    """One decode step of ``net`` here (one process, this process's threads) and split over
    ``workers`` (``kvlab.parallel.tensor``), each the fastest of rounds of ``steps`` steps."""
    batch, context = integer("batch", batch), integer("context", context)
    steps, reps = integer("steps", steps), integer("reps", reps)
    from kvlab.parallel.tensor import check_splittable, save_checkpoint, vocab_sharded

    check_splittable(net, workers.world_size)
    batch, context = integer("batch", batch), integer("context", context)
    steps, reps = integer("steps", steps), integer("reps", reps)
    element = next(net.parameters()).element_size()
    message = batch * net.config.hidden_size * element
    sharded = vocab_sharded(net)
    logits = batch * net.config.vocab_size // workers.world_size * element if sharded else 0
    one, one_spread = _step_seconds(
        net, batch, context, steps, net.config.vocab_size, together=False
    )
    with tempfile.TemporaryDirectory(prefix="kvlab-tp-") as path:
        save_checkpoint(net, path)
        ranks = workers.run(_split_step_on_rank, path, batch, context, steps, message, logits, reps)
    split, reduce_s, gather_s, split_spread = (max(r[i] for r in ranks) for i in range(4))
    calls = 2 * net.config.num_hidden_layers
    extra = (reduce_s + gather_s) if sharded else 0.0
    return StepComparison(
        workers.world_size,
        batch,
        context,
        one,
        split,
        calls,
        message,
        reduce_s,
        extra,
        one_spread,
        split_spread,
    )


# --------------------------------------------------------------------------- bench rows


def bench_rows(world_size: int = 2):
    """The link, an all-reduce, a KV handoff and a tensor-parallel step at ``world_size`` ranks:
    NCCL across GPUs when there are enough, gloo across CPU processes on a machine without a GPU,
    and no rows on a machine with too few GPUs (its record would file CPU figures under a GPU)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.models import tiny_model
    from kvlab.parallel.disaggregated import disaggregated_generate

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < world_size:
        # CPU ranks beside one GPU would be recorded under the GPU's name: nothing to measure
        return []
    device = "cuda" if gpus else "cpu"
    where = f"{world_size} ranks, {launch.default_backend(device)} on {device}"
    with launch.Workers(world_size, device=device) as workers:
        link = calibrate_link(workers)
        sweep = measure_collectives(workers, link, "all_reduce", sizes=(2**20,))
        net = tiny_model("llama", device="cpu" if device == "cpu" else None)
        prompt = torch.randint(0, net.config.vocab_size, (256,)).tolist()
        handoff = disaggregated_generate(net, prompt, 2, workers=workers, device=device)
        step = compare_tensor_parallel_step(net, workers)
    return [
        Row(
            "link rate (one way)",
            link.bytes_per_s / 1e9,
            "GB/s",
            f"{where}; ping-pong 1 KiB-4 MiB, line fit",
        ),
        Row("link latency", link.latency_s * 1e6, "us", "per message, the fit's intercept"),
        Row(
            "all-reduce 1 MiB", sweep.measured_s[0] * 1e3, "ms", "fastest of 9 calls, slowest rank"
        ),
        Row(
            "all-reduce 1 MiB / ring model",
            sweep.measured_s[0] / sweep.predicted_s[0],
            "x",
            "ring model with the calibrated link",
        ),
        Row(
            "KV handoff rate",
            handoff.total_bytes / handoff.send_s / 1e9,
            "GB/s",
            f"{handoff.kv_bytes / 1e6:.2f} MB of blocks, 256-token prompt",
        ),
        Row(
            "tensor-parallel step",
            step.split_s * 1e3,
            "ms",
            f"{net.shape.name}, batch 1, context 64",
        ),
        Row(
            "tensor-parallel / one process",
            step.split_s / step.one_process_s,
            "x",
            "ratio of the fastest rounds",
        ),
    ]


# --------------------------------------------------------------------------- where to run, and what
# was recorded

SECTION = "12 decode across devices"  # this page's rows in ``python -m kvlab record`` files


def ranks_here(world_size: int = 2) -> tuple[int, str]:
    """``(world_size, device)`` for this machine: every GPU with NCCL when there are two or more,
    else ``world_size`` CPU processes with gloo."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return (gpus, "cuda") if gpus >= 2 else (integer("world_size", world_size, 2), "cpu")


def recorded_rows(records) -> dict:
    """``{device: [(name, value, unit), ...]}`` of this page's rows in the GPU records among
    ``records`` (``kvlab.lab.bench.load_records``); CPU records are left out."""
    records = items("records", records, dict, what="record dicts")
    found = {}
    for record in records:
        device = record["stamp"]["device"]
        rows = record["results"].get(SECTION)
        if rows and not device.startswith("CPU"):
            found[f"{device}, {record['stamp']['date']}"] = [
                (r["name"], r["value"], r["unit"]) for r in rows
            ]
    return found
