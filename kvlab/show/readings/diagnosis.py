"""Notebook 09, a worked path through a slow decode step (section 9.8): its readings.

Each function takes what :mod:`kvlab.lab.diagnose` measured and returns the paragraph printed under
the result. Every sentence that depends on the outcome has all its branches written, and takes its
decision from a model in :mod:`kvlab.theory.verdict` (``compare_loops``, ``compare_idle``,
``compare_batch_tpot`` with ``sweep_outcome``, ``exceeds_ceilings``), which the reading names with
its formula.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import TYPE_CHECKING

from kvlab._checks import flag, instance, record, unmeasured
from kvlab.show.format import si
from kvlab.theory import verdict as model
from kvlab.theory.agreement import ABOVE, AGREES, BELOW, DISAGREES, combined_spread

if TYPE_CHECKING:  # annotations only: a reading imports no torch
    from kvlab.lab.diagnose import Diagnosis
    from kvlab.lab.step_trace import StepTrace
    from kvlab.theory.verdict import Target


DIAGNOSIS = "kvlab.lab.diagnose.Diagnosis"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def verdict_label(d: Diagnosis) -> str:
    """A diagnosis's verdict as the readings print it: ```weights``` when it is firm,
    ```overhead` or `weights` (cannot tell)`` when its measurements sit on a threshold."""
    record("d", d, DIAGNOSIS, "verdict", "verdicts", "firm")
    if d.firm:
        return f"`{d.verdict}`"
    return " or ".join(f"`{v}`" for v in d.verdicts) + " (cannot tell)"


def reading_diagnosis(d: Diagnosis) -> str:
    """The verdict of one diagnosis, the measurements it rests on, and the lever; when the
    measurements sit on a threshold (``Diagnosis.firm`` is False), the verdicts they reach."""
    record("d", d, DIAGNOSIS, "method", "context", "batch", "threads", "trace", "verdicts", "lever")
    measured = ("trace.step_s", "trace.busy_fraction", "bandwidth_fraction", "flops_fraction")
    if missing := unmeasured(**{f"d.{m}": attrgetter(m)(d) for m in measured}):
        return missing
    threads = (
        f", on {d.threads} CPU thread{'s' * (d.threads != 1)} (set for the measurement)"
        if d.threads is not None
        else ""
    )
    text = (
        f"**{d.method} loop: verdict {verdict_label(d)}.** At {d.context} cached tokens and batch"
        f" {d.batch}{threads}, one step took {_ms(d.trace.step_s)}, busy for"
        f" {d.trace.busy_fraction:.0%} of its trace, moving bytes at {d.bandwidth_fraction:.0%} of"
        f" the read bandwidth and FLOPs at {d.flops_fraction:.0%} of the matmul rate. "
    )
    if d.firm:
        text += f"It rests on this: {d.because}. Next lever: {d.lever}."
    else:
        text += (
            f"This run falls on `{d.verdict}` ({d.because}), but within the spread of its"
            f" measurements (its traces' busy shares {d.trace.busy_spread:.0%} apart) it reaches"
            f" {' and '.join(f'`{v}`' for v in d.verdicts)} too: the step sits on a threshold,"
            " and another run may land on the other side. Both levers apply."
        )
    if model.exceeds_ceilings(d.bandwidth_fraction, d.flops_fraction):
        text += (
            " A fraction above 100% means the step beat a ceiling that `kvlab.calibrate()` measured"
            " once, earlier: the calibration ran while the machine was busier, or (for bandwidth)"
            " part of the data was still in the CPU's caches. Read the ceilings as approximate on a"
            " shared machine."
        )
    return text


def reading_methods(
    diagnoses: dict,
    generate_tokens_per_s: float,
    best_tokens_per_s: float,
    best: str,
    spread: float,
) -> str:
    """The loops side by side, and Hugging Face ``generate`` against the fastest kvlab loop, timed
    in turn with it (``spread``: the two timings' relative spread). Both run the same cached
    forward pass, so the model is parity (``kvlab.theory.verdict.compare_loops``)."""
    if missing := unmeasured(
        generate_tokens_per_s=generate_tokens_per_s, best_tokens_per_s=best_tokens_per_s
    ):
        return missing
    verdicts = ", ".join(f"{m} {verdict_label(d)}" for m, d in diagnoses.items())
    head = f"The four loops' verdicts on this machine: {verdicts}. "
    c = model.compare_loops(best_tokens_per_s, generate_tokens_per_s, spread)
    numbers = (
        f"Whole requests, prefill included, timed in turn: the fastest kvlab loop ({best}) made"
        f" {best_tokens_per_s:.4g} tokens/s and Hugging Face `generate`"
        f" {generate_tokens_per_s:.4g}."
        " Both run the same cached forward pass, so the model is parity: kvlab's loop is"
        f" {c.describe()} (spread {c.spread:.0%}). "
    )
    if c.outcome == AGREES:
        tail = "The reference a reader would otherwise use runs the same computation."
    elif c.side == ABOVE:
        tail = (
            "kvlab's loop ran faster than parity. The likely reason: `generate` does more per step"
            " (logits processors, stopping criteria, its cache and mask bookkeeping), which weighs"
            " on a model whose step is this short."
        )
    else:
        tail = (
            "`generate` ran faster than parity. The likely reason: on a GPU, `generate` may pick a"
            " faster attention kernel or cache; on a CPU, it skips work kvlab's loop does per step."
        )
    return head + numbers + tail


def reading_timeline(cached: StepTrace, static: StepTrace, gpu: bool) -> str:
    """What the two timelines show: the gaps in the cached step, and whether the static step has
    fewer, decided by step 3's model (``kvlab.theory.verdict.compare_idle``)."""
    flag("gpu", gpu)
    what = (
        "launch gaps: the CPU issuing kernels one at a time while the GPU waits"
        if gpu
        else "Python dispatch: the interpreter walking the model's modules between operators"
    )
    n_cached, n_static = len(cached.timeline), len(static.timeline)
    head = (
        f"The cached step was busy for {cached.busy_fraction:.0%} of its trace and the static step"
        f" for {static.busy_fraction:.0%}. The white space between bars is {what}. "
    )
    spread = combined_spread(cached.idle_spread, static.idle_spread)
    c = model.compare_idle(static.idle_s, cached.idle_s, n_cached, n_static, gpu, spread)
    if gpu:
        expect = (
            "Step 3's model: replayed as one CUDA graph, the static step has almost no gaps, so it"
            f" should be idle for far less than the cached step's {_ms(cached.idle_s)}. It was idle"
            f" for {_ms(static.idle_s)}, {c.describe()}. "
        )
        if c.outcome == DISAGREES and c.side == BELOW:
            return (
                head + expect + "As expected: the graph launches the step's kernels back to back."
            )
        return (
            head
            + expect
            + "Not clearly less idle, against the model: a step replayed as one graph has no launch"
            " gaps to show, so check that this one was (a compile that fell back to eager, or a"
            " graph break, launches its kernels one at a time again)."
        )
    expect = (
        "Step 3's model for a static step run eagerly, without CUDA graphs (as on a CPU): its gaps"
        " are the dispatch of each operator, so its idle time should be the cached step's"
        f" {_ms(cached.idle_s)} times the ratio of their operator counts, {n_static} against"
        f" {n_cached} here: {_ms(c.predicted)} (`kvlab.theory.verdict.expected_static_idle`). It"
        f" was idle for {_ms(static.idle_s)}, {c.describe()}. "
    )
    if c.agrees:
        more = (
            " (transformers builds the static step's mask over the whole preallocated cache and"
            " writes each token with `index_copy_`, hence its extra operators)"
            if n_static > n_cached
            else ""
        )
        tail = (
            "As the model says: eager, the static loop runs its operators with the same Python"
            f" between them{more}. Removing the gaps needs the compiled step replayed as one CUDA"
            " graph, which a CPU does not have; on a GPU the same cell shows the compiled static"
            " step as a dense run of kernels."
        )
    elif c.outcome == DISAGREES:
        more_or_less = "More" if c.side == ABOVE else "Less"
        tail = (
            f"{more_or_less} idle than its operator count predicts, beyond the traces' scatter: the"
            " gap per operator is not the same in the two loops, as the model assumes, and a trace"
            " does not say what fills a gap."
        )
    else:
        tail = (
            "The traces scatter too much to tell whether the operator count accounts for the"
            " gaps; rerun the cell on a quieter machine."
        )
    return head + expect + tail


def reading_batch(
    sweep,
    target: Target,
    useful: int | None,
    capacity: int,
    predicted,
    spreads,
    bandwidth: float,
    rates: dict,
    weight_bytes: float,
    sequence_flops: float,
    gpu_ridge: float | None = None,
) -> str:
    """Step 4: TPOT across the batch sweep against the roofline with this machine's ceilings
    (``kvlab.theory.verdict.batch_tpot``: ``predicted`` per point, with the relative ``spreads`` of
    the timings behind each), decided over the sweep by ``sweep_outcome``; then the useful batch
    under the target. ``bandwidth``: the read bandwidth measured beside the steps; ``rates``: batch
    to the matmul rate measured beside it; ``weight_bytes`` and ``sequence_flops``: the step's
    weight bytes and one sequence's FLOPs."""
    if missing := unmeasured(bandwidth=bandwidth):
        return missing
    first, last = sweep[0], sweep[-1]
    checks = [
        model.compare_batch_tpot(p.tpot, pred, spread)
        for p, pred, spread in zip(sweep, predicted, spreads)
    ]
    outcome = model.sweep_outcome(checks[1:]) if len(checks) > 1 else AGREES
    # The point the reading names: the furthest of those that decided the sweep's outcome.
    deciding = [i for i in range(1, len(checks)) if checks[i].outcome == outcome] or [0]
    worst_i = max(deciding, key=lambda i: abs(math.log(checks[i].ratio)))
    worst, worst_b = checks[worst_i], sweep[worst_i].batch
    # The batch from which the products, at this machine's rate, outlast the weights' read.
    leaves = next(
        (
            p.batch
            for p in sweep
            if p.batch * sequence_flops / rates[p.batch] > weight_bytes / bandwidth
        ),
        None,
    )
    head = (
        f"From batch {first.batch} to {last.batch}, tokens per second rose"
        f" {last.tokens_per_s / first.tokens_per_s:.1f} times while TPOT rose"
        f" {last.tpot / first.tpot:.1f} times. The roofline with this machine's ceilings, measured"
        f" beside each step (read bandwidth {si(bandwidth, 'B/s')}; matmul rate"
        f" {si(rates[first.batch], 'FLOP/s')} at {first.batch} row and"
        f" {si(rates[last.batch], 'FLOP/s')} at {last.batch}), predicts TPOT from batch"
        f" {first.batch}'s (`kvlab.theory.verdict.batch_tpot`): {_ms(predicted[-1])} at batch"
        f" {last.batch} against {_ms(last.tpot)} measured; the furthest point, batch {worst_b}, is"
        f" {worst.describe()} (the spread of the timings behind it: {worst.spread:.0%}). "
    )
    if outcome == AGREES:
        head += "Over the sweep the model agrees. Batching is not free here: " + (
            f"from batch {leaves} the products of the batch's rows take longer than reading the"
            " weights, because this CPU multiplies a few rows at a small fraction of its"
            " large-product rate, so its ridge sits near batch 1. "
            if leaves is not None
            else "the weights' read still bounds every step of the sweep. "
        )
    elif outcome == DISAGREES and worst.side == ABOVE:
        head += (
            f"Over the sweep the model disagrees: from batch {first.batch} to {worst_b} TPOT grew"
            f" by {si(sweep[worst_i].tpot - first.tpot, 's')}, the roofline's products and cache"
            f" reads by {si(predicted[worst_i] - first.tpot, 's')}. The model misses a term that"
            " grows with the batch. Two candidates, neither in it: on this CPU's one thread the"
            " weights' read and the products' arithmetic may add rather than overlap (the roofline"
            " takes the larger of the two), and each sequence brings its own attention, norms,"
            " cache append and logits, which no matmul probe times. "
        )
    elif outcome == DISAGREES:
        head += (
            "Over the sweep the model disagrees: TPOT grew less than the roofline predicts. The"
            " products inside the step ran faster than the probe's rate at that width (the"
            " model's projections have other shapes than the probe's), or batch 1 itself was"
            " slowed, which raises every prediction. "
        )
    else:
        head += (
            f"Over the sweep this run cannot tell: a point sits {worst.side} the model, further"
            " than its spread explains but not far enough to call it a miss. "
        )
    if gpu_ridge is not None:
        head += (
            "This CPU cannot show the flat region that batching is known for: its ridge sits near"
            " batch 1. The same roofline with the H100 SXM's datasheet figures ([NVIDIA H100"
            f" datasheet](../book/references.md)) puts the ridge near batch {gpu_ridge:,.0f} for"
            " bf16 weights, below which a step's time barely grows with the batch. "
        )
    limits = (
        " and ".join(
            x
            for x in (
                f"TPOT <= {_ms(target.tpot)}" if target.tpot else "",
                f"TTFT <= {_ms(target.ttft)}" if target.ttft else "",
            )
            if x
        )
        or "no latency limit"
    )
    if useful is None:
        mid = f"No measured batch met {limits}. "
    else:
        mid = f"Under {limits}, the useful batch is {useful}. "
    return (
        head + mid + f"Memory would admit up to {capacity:,} sequences of this length"
        " (`kvlab.theory.roofline.admitted`)."
    )


def reading_workloads(diagnoses: dict) -> str:
    """The three workloads side by side: whether they end in different verdicts and levers."""
    instance("diagnoses", diagnoses, dict)
    parts = [f"{name}: {verdict_label(d)} ({d.because})" for name, d in diagnoses.items()]
    verdicts = {d.verdicts if not d.firm else d.verdict for d in diagnoses.values()}
    if len(verdicts) == len(diagnoses):
        tail = (
            "Each workload ended in a different verdict on the same model, so each needs a"
            " different next change, as the seed's closing paragraph says."
        )
    else:
        tail = (
            f"Only {len(verdicts)} distinct verdicts for {len(diagnoses)} workloads here: on this"
            " machine two of them are bound by the same thing."
        )
    heavy = [
        name
        for name, d in diagnoses.items()
        if d.trace.work.kv_share > model.KV_SHARE_THRESHOLD
        and not {"kv", "capacity"} & {d.verdict, *d.verdicts}
    ]
    if heavy:
        d = diagnoses[heavy[0]]
        tail += (
            f" The {heavy[0]} step's bytes are {d.trace.work.kv_share:.0%} cache, yet it moved them"
            f" at {d.bandwidth_fraction:.0%} of the read bandwidth: a large share of the bytes is"
            " not a bound until the step moves them near the ceiling, which a context this short"
            " on this CPU does not."
        )
    return "; ".join(parts) + ". " + tail


def reading_real_model(
    random_d: Diagnosis, real_d: Diagnosis, random_name: str, real_name: str
) -> str:
    """The path on the pretrained model beside the random-weight one: the two verdicts of
    ``kvlab.theory.verdict.decide``, and why they agree or differ (a step's work depends on the
    shape, not on what the weights learned)."""
    instance("random_name", random_name, str)
    instance("real_name", real_name, str)
    text = (
        f"**{real_name}, cached loop: verdict {verdict_label(real_d)}** ({real_d.because})."
        f" Traced at {real_d.context} cached tokens, one step took {_ms(real_d.trace.step_s)} and"
        " read"
        f" {si(real_d.trace.work.weights_read, 'B')} of weights. Beside it, the random-weight"
        f" {random_name} of the four loops above: verdict {verdict_label(random_d)},"
        f" {_ms(random_d.trace.step_s)} a step for {si(random_d.trace.work.weights_read, 'B')} of"
        " weights. "
    )
    if verdict_label(real_d) == verdict_label(random_d):
        return (
            text
            + "The two models share the verdict. It rests on the bytes and FLOPs of a step, which"
            " the model's shape sets, measured against this machine's ceilings; what the weights"
            " learned changes the tokens, not the work. That is why the page can diagnose random"
            " weights in published shapes and trust the verdict for a trained model of the same"
            " shape."
        )
    return (
        text
        + "The verdicts differ, and not because one model is trained: a step's work depends only"
        " on the shape, and the shapes differ. The pretrained step was busy for"
        f" {real_d.trace.busy_fraction:.0%} of its trace at {real_d.bandwidth_fraction:.0%} of"
        f" the read bandwidth, with {real_d.trace.work.kv_share:.0%} of its bytes in the cache,"
        f" against {random_d.trace.busy_fraction:.0%}, {random_d.bandwidth_fraction:.0%} and"
        f" {random_d.trace.work.kv_share:.0%} for the random one: those are what `decide`"
        " compared."
    )
