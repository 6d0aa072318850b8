"""Notebook 09, a worked path through a slow decode step (section 9.8): its readings.

Each function takes what :mod:`kvlab.lab.diagnose` measured and returns the paragraph printed under
the result. Every sentence that depends on the outcome has all its branches written, and takes its
decision from a model in :mod:`kvlab.theory.verdict` (``compare_loops``, ``compare_idle``,
``compare_batch_tpot``, ``exceeds_ceilings``), which the reading names with its formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.show.format import si
from kvlab.theory import verdict as model
from kvlab.theory.agreement import ABOVE, BELOW

if TYPE_CHECKING:  # annotations only: a reading imports no torch
    from kvlab.lab.diagnose import Diagnosis
    from kvlab.lab.step_trace import StepTrace
    from kvlab.theory.verdict import Target


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def reading_diagnosis(d: Diagnosis) -> str:
    """The verdict of one diagnosis, the measurements it rests on, and the lever."""
    threads = (
        f", on {d.threads} CPU thread{'s' * (d.threads != 1)} (set for the measurement)"
        if d.threads is not None
        else ""
    )
    text = (
        f"**{d.method} loop: verdict `{d.verdict}`.** Traced at {d.context} cached tokens and batch"
        f" {d.batch}{threads}, one step took {_ms(d.trace.step_s)} and moved bytes at"
        f" {d.bandwidth_fraction:.0%} of this machine's copy bandwidth and FLOPs at"
        f" {d.flops_fraction:.0%} of its matmul rate. The verdict rests on this: {d.because}. Next"
        f" lever: {d.lever}."
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
    diagnoses: dict, generate_tokens_per_s: float, best_tokens_per_s: float, best: str
) -> str:
    """The loops side by side, and Hugging Face ``generate`` against the fastest kvlab loop.

    Both run the same cached forward pass, so the model is parity
    (``kvlab.theory.verdict.compare_loops``, within ``LOOP_TOLERANCE``)."""
    verdicts = ", ".join(f"{m} `{d.verdict}`" for m, d in diagnoses.items())
    head = f"The four loops' verdicts on this machine: {verdicts}. "
    c = model.compare_loops(best_tokens_per_s, generate_tokens_per_s)
    numbers = (
        f"The fastest kvlab loop here ({best}) made {best_tokens_per_s:.4g} tokens/s and Hugging"
        f" Face `generate` {generate_tokens_per_s:.4g}, whole requests with prefill. Both run the"
        " same cached forward pass, so the expectation is parity: kvlab's loop ran at"
        f" {c.describe()}. "
    )
    if c.agrees:
        tail = (
            "Parity, as expected: the reference a reader would otherwise use runs the same"
            " computation."
        )
    elif c.outcome == ABOVE:
        tail = (
            "The kvlab loop was faster than parity allows. The likely reason: `generate` does more"
            " per step (logits processors, stopping criteria, its cache and mask bookkeeping),"
            " which weighs on a model whose step is this short."
        )
    else:
        tail = (
            "`generate` was faster than parity allows. The likely reasons: on a shared CPU, another"
            " process slowed the kvlab runs (they ran after `generate`); on a GPU, `generate` may"
            " pick a faster attention kernel or cache."
        )
    return head + numbers + tail


def reading_timeline(cached: StepTrace, static: StepTrace, gpu: bool) -> str:
    """What the two timelines show: the gaps in the cached step, and whether the static step has
    fewer, decided by step 3's model (``kvlab.theory.verdict.compare_idle``)."""
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
    c = model.compare_idle(static.idle_s, cached.idle_s, n_cached, n_static, graphed=gpu)
    if gpu:
        expect = (
            "Step 3's model: replayed as one CUDA graph, the static step has almost no gaps, so it"
            f" should be idle for far less than the cached step's {_ms(cached.idle_s)}. It was idle"
            f" for {_ms(static.idle_s)}, {c.describe()}. "
        )
        if c.outcome == BELOW:
            return (
                head + expect + "As expected: the graph launches the step's kernels back to back."
            )
        return (
            head
            + expect
            + "Not less idle, against the model. The likely reason: the static step was not "
            "replayed as a graph (its compilation fell back to eager, or a graph break split "
            "it), so its kernels were launched one at a time again."
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
    elif c.outcome == ABOVE:
        tail = (
            "More idle than its operators explain. The likely reason on a shared CPU: the process"
            " was descheduled during the static step's trace (the shortest of three traces is kept,"
            " but all three can be hit), which shows as white space; rerun the cell. Its operator"
            " count is the model's part of the answer, the rest is this machine."
        )
    else:
        tail = (
            "Less idle than its operators predict: fixed shapes leave less to allocate and check"
            " between operators than the cached step's growing cache (its `torch.cat` per layer),"
            " which the operator count does not weigh."
        )
    return head + expect + tail


def reading_batch(
    sweep,
    target: Target,
    useful: int | None,
    capacity: int,
    sequence_bytes: float,
    bandwidth: float,
) -> str:
    """Step 4: what batching bought, against the shared-weight model
    (``kvlab.theory.verdict.shared_weight_tpot``), and the useful batch under the target.

    ``sequence_bytes``: what one more sequence adds to a step (its cache read and its new token);
    ``bandwidth``: the calibrated copy bandwidth."""
    first, last = sweep[0], sweep[-1]
    gain = last.tokens_per_s / first.tokens_per_s
    c = model.compare_batch_tpot(first.tpot, last.batch, last.tpot, sequence_bytes, bandwidth)
    head = (
        f"From batch {first.batch} to {last.batch}, tokens per second rose {gain:.1f} times while"
        f" TPOT rose {last.tpot / first.tpot:.1f} times. The shared-weight model"
        " (`kvlab.theory.verdict.shared_weight_tpot`: $t(b) = t(1) + (b -"
        " 1)\\,B_\\text{seq}/\\beta$, everything batch 1 paid shared by the batch, each further"
        f" sequence adding its own $B_\\text{{seq}}$ = {sequence_bytes / 1e3:,.1f} kB of cache at"
        f" copy bandwidth) predicts a TPOT of {_ms(c.predicted)} at batch {last.batch}; measured,"
        f" {_ms(last.tpot)}, {c.describe()}. "
    )
    if c.agrees:
        head += (
            "Batching shared the weight reads as the model says: a bigger batch is cheaper per"
            " token. "
        )
    elif c.outcome == ABOVE:
        head += (
            "TPOT grew more than the model allows: something besides the cache bytes grows with the"
            " batch. On a CPU that is the matrix products themselves, whose time grows with the"
            " rows they multiply once the step leaves the weight-read floor, and each sequence's"
            " attention and activations. Batching still paid wherever tokens per second rose. "
        )
    else:
        head += (
            "TPOT grew less than even the cache bytes predict: the batch-1 step was slowed by other"
            " work on this machine, or the added cache was read from the CPU's caches. "
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
    parts = [f"{name}: `{d.verdict}` ({d.because})" for name, d in diagnoses.items()]
    verdicts = {d.verdict for d in diagnoses.values()}
    if len(verdicts) == len(diagnoses):
        tail = (
            "Each workload ended in a different verdict on the same model, so each needs a"
            " different next change, as the seed's closing paragraph says."
        )
    else:
        tail = (
            f"Only {len(verdicts)} distinct verdict(s) for {len(diagnoses)} workloads here. The"
            " seed expects different bottlenecks; on this machine the noise of a shared CPU or a"
            " model too small for its step to leave the overhead regime can merge them. Move the"
            " sliders to larger contexts or batches."
        )
    return "; ".join(parts) + ". " + tail


def reading_real_model(
    random_d: Diagnosis, real_d: Diagnosis, random_name: str, real_name: str
) -> str:
    """The path on the pretrained model beside the random-weight one: the two verdicts of
    ``kvlab.theory.verdict.decide``, and why they agree or differ (a step's work depends on the
    shape, not on what the weights learned)."""
    text = (
        f"**{real_name}, cached loop: verdict `{real_d.verdict}`** ({real_d.because}). Traced at"
        f" {real_d.context} cached tokens, one step took {_ms(real_d.trace.step_s)} and read"
        f" {si(real_d.trace.work.weights_read, 'B')} of weights. Beside it, the random-weight"
        f" {random_name} of the four loops above: verdict `{random_d.verdict}`,"
        f" {_ms(random_d.trace.step_s)} a step for {si(random_d.trace.work.weights_read, 'B')} of"
        " weights. "
    )
    if real_d.verdict == random_d.verdict:
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
        f" the copy bandwidth, with {real_d.trace.work.kv_share:.0%} of its bytes in the cache,"
        f" against {random_d.trace.busy_fraction:.0%}, {random_d.bandwidth_fraction:.0%} and"
        f" {random_d.trace.work.kv_share:.0%} for the random one: those are what `decide`"
        " compared."
    )
