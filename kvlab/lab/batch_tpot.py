"""Notebook 09, a worked path through a slow decode step (section 9.8): TPOT by batch beside the
ceilings that set it.

Step 4 of the path asks what batching buys. The roofline's answer depends on two ceilings of this
machine: the read bandwidth its weights stream at (``kvlab.lab.hardware.read_probe``) and the rate
of the products a decode step multiplies, ``b`` rows by the weights (``matmul_probe(b, ...)``),
which on a CPU grows with ``b`` far more slowly than a GPU's does. ``tpot_sweep`` times one decode
step at each batch interleaved with both probes (``kvlab.lab.timing.interleaved``), so that a
neighbour's load changes the step and its ceilings alike, and returns a ``TpotPoint`` per batch;
``kvlab.theory.verdict.batch_tpot`` is the model they are compared with. ``step_beside_ceilings``
does the same for one step of the path (step 2), so that the shares of the read bandwidth and of
the matmul rate a verdict rests on are taken under the load the step itself ran under.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from kvlab._checks import instance, integer, integers
from kvlab.lab.hardware import Ceiling, cpu_threads, matmul_probe, read_probe
from kvlab.lab.repeatable_step import CPU_THREADS, RepeatableStep, measurement_threads, prepared_ids
from kvlab.lab.timing import Timing, interleaved


@functools.lru_cache(maxsize=1)
def shared_read_probe():
    """One read probe for the process (its buffer is hundreds of MB): ``read_probe()``."""
    return read_probe()


def min_scatter(timing: Timing) -> float:
    """How far the second-fastest repeat sat above the fastest, relative: the scatter of the
    minimum, the statistic every comparison here uses, from one run to the next. A neighbour that
    slows most repeats leaves it small where ``Timing.spread_above_min`` (median over minimum)
    grows; a run with one fast outlier still shows its doubt."""
    instance("timing", timing, Timing)
    times = sorted(timing.times)
    if len(times) < 2 or times[0] <= 0:
        return 0.0
    return times[1] / times[0] - 1


@dataclass(frozen=True)
class Beside:
    """A step's timing and the two ceilings timed interleaved with it; each ceiling's ``spread``
    is its ``min_scatter``, and ``step_spread`` the step's."""

    step: Timing
    read: Ceiling
    matmul: Ceiling

    @property
    def step_spread(self) -> float:
        return min_scatter(self.step)


def time_beside(one_step, rows: int, reps: int = 5) -> Beside:
    """``one_step()`` timed ``reps`` times interleaved with the read probe and the matmul probe of
    ``rows`` rows (``matmul_probe``'s default 1024 x 1024 weight, in the last-level cache: the
    arithmetic rate at that many rows, not a small model's dispatch), on the caller's threads."""
    matmul = matmul_probe(integer("rows", rows, 1))
    read = shared_read_probe()
    t = interleaved({"step": one_step, "read": read.run, "matmul": matmul.run}, reps=reps, warmup=1)
    return Beside(
        t["step"],
        dataclasses.replace(read.ceiling(t["read"]), spread=min_scatter(t["read"])),
        dataclasses.replace(matmul.ceiling(t["matmul"]), spread=min_scatter(t["matmul"])),
    )


def _step_and_reset(stepper: RepeatableStep):
    def one_step():
        stepper.step()
        stepper.reset()

    return one_step


def step_beside_ceilings(stepper: RepeatableStep, rows: int, reps: int = 5) -> Beside:
    """One step of ``stepper`` (a ``RepeatableStep``, reset after each call) timed beside the read
    bandwidth and the matmul rate at ``rows`` rows (``time_beside``)."""

    instance("stepper", stepper, RepeatableStep)

    def one_step():
        stepper.step()
        stepper.reset()

    return time_beside(one_step, rows, reps)


@dataclass(frozen=True)
class TpotPoint:
    """One batch of the sweep: the step's ``tpot`` timing, and the read bandwidth and the matmul
    rate at ``batch`` rows measured beside it."""

    batch: int
    tpot: Timing
    read: Ceiling
    matmul: Ceiling


def tpot_sweep(
    model,
    input_ids,
    context: int,
    batches,
    method: str = "cached",
    reps: int = 9,
    threads: int | None = CPU_THREADS,
) -> tuple[TpotPoint, ...]:
    """One ``method`` decode step after ``context`` cached tokens per sequence, at each batch in
    ``batches`` (the prompt ``input_ids [1, P]`` repeated to fill it), every batch's step timed
    ``reps`` times in turn with every other's, with the read probe and with the matmul probe at
    each batch's rows (``interleaved``): a neighbour that slows the machine for a while slows the
    batch-1 step the model starts from as much as the batch it predicts. On a CPU it runs on
    ``threads`` of torch's threads."""
    batches = integers("batches", batches)
    integer("reps", reps, 2)
    _, ids = prepared_ids(model, input_ids, context, method)
    with cpu_threads(measurement_threads(model, threads)):
        steppers = {b: RepeatableStep(model, ids[:1].repeat(b, 1), method) for b in batches}
        try:
            calls = {f"step {b}": _step_and_reset(stepper) for b, stepper in steppers.items()}
            probes = {b: matmul_probe(integer("rows", b, 1)) for b in batches}
            calls |= {f"matmul {b}": probe.run for b, probe in probes.items()}
            read = shared_read_probe()
            calls["read"] = read.run
            t = interleaved(calls, reps=reps, warmup=1)
        finally:
            for stepper in steppers.values():
                stepper.close()
    read_ceiling = dataclasses.replace(read.ceiling(t["read"]), spread=min_scatter(t["read"]))
    points = [
        TpotPoint(
            b,
            t[f"step {b}"],
            read_ceiling,
            dataclasses.replace(
                probes[b].ceiling(t[f"matmul {b}"]), spread=min_scatter(t[f"matmul {b}"])
            ),
        )
        for b in batches
    ]
    return tuple(points)
