"""Notebook 09, a worked path through a slow decode step (section 9.8): its readings.

Each function takes what :mod:`kvlab.lab.diagnose` measured and returns the paragraph printed under the
result; every sentence that depends on the outcome has both branches written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a reading imports no torch
    from kvlab.lab.diagnose import Diagnosis
    from kvlab.lab.step_trace import StepTrace
    from kvlab.theory.verdict import Target


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def reading_diagnosis(d: Diagnosis) -> str:
    """The verdict of one diagnosis, the measurements it rests on, and the lever."""
    text = (f"**{d.method} loop: verdict `{d.verdict}`.** Traced at {d.context} cached tokens and batch "
            f"{d.batch}, one step took {_ms(d.trace.step_s)} and moved bytes at "
            f"{d.bandwidth_fraction:.0%} of this machine's copy bandwidth and FLOPs at {d.flops_fraction:.0%} "
            f"of its matmul rate. The verdict rests on this: {d.because}. Next lever: {d.lever}.")
    if max(d.bandwidth_fraction, d.flops_fraction) > 1:
        text += (" A fraction above 100% means the step beat a ceiling that `kvlab.calibrate()` measured once, "
                 "earlier: the calibration ran while the machine was busier, or (for bandwidth) part of the data "
                 "was still in the CPU's caches. Read the ceilings as approximate on a shared machine.")
    return text


def reading_methods(diagnoses: dict, generate_tokens_per_s: float, best_tokens_per_s: float, best: str) -> str:
    """The loops side by side, and Hugging Face ``generate`` against the fastest kvlab loop."""
    verdicts = ", ".join(f"{m} `{d.verdict}`" for m, d in diagnoses.items())
    head = f"The four loops' verdicts on this machine: {verdicts}. "
    ratio = best_tokens_per_s / generate_tokens_per_s
    if ratio >= 1:
        tail = (f"The fastest kvlab loop here ({best}) made {best_tokens_per_s:.4g} tokens/s, {ratio:.2f} times "
                f"Hugging Face `generate` ({generate_tokens_per_s:.4g} tokens/s): the reference a reader would "
                "otherwise use is no faster, because it runs the same cached forward pass with more bookkeeping.")
    else:
        tail = (f"Hugging Face `generate` made {generate_tokens_per_s:.4g} tokens/s, {1 / ratio:.2f} times the "
                f"fastest kvlab loop ({best}, {best_tokens_per_s:.4g} tokens/s). The expectation was parity, since "
                "both run the same cached forward pass; on a shared CPU the gap is within run-to-run noise, and "
                "on a GPU `generate` may pick a faster attention kernel or cache.")
    return head + tail


def reading_timeline(cached: StepTrace, static: StepTrace, gpu: bool) -> str:
    """What the two timelines show: the gaps in the cached step, and whether the static step removes them."""
    what = ("launch gaps: the CPU issuing kernels one at a time while the GPU waits" if gpu else
            "Python dispatch: the interpreter walking the model's modules between operators")
    head = (f"The cached step was busy for {cached.busy_fraction:.0%} of its trace and the static step for "
            f"{static.busy_fraction:.0%}. The white space between bars is {what}. ")
    if static.idle_s < 0.8 * cached.idle_s:  # a fifth less idle time: more than run-to-run noise
        tail = (f"The static step left {_ms(static.idle_s)} idle against the cached step's {_ms(cached.idle_s)}: "
                "with fixed shapes there is less to allocate and check between operators. ")
    else:
        tail = (f"The static step was not clearly less idle ({_ms(static.idle_s)} against {_ms(cached.idle_s)}). "
                "Removing the gaps needs the compiled step replayed as one CUDA graph; eager, the static loop "
                "runs the same operators with the same Python between them. ")
    where = ("On this GPU the static step was compiled and replayed as a graph." if gpu else
             "On a CPU there are no CUDA graphs, so this is the expected picture; on a GPU the same cell shows "
             "the compiled static step as a dense run of kernels.")
    return head + tail + where


def reading_batch(sweep, target: Target, useful: int | None, capacity: int) -> str:
    """Step 4: what batching bought, and the useful batch under the target."""
    first, last = sweep[0], sweep[-1]
    gain = last.tokens_per_s / first.tokens_per_s
    growth = last.tpot / first.tpot
    if gain > 1.5:
        head = (f"From batch {first.batch} to {last.batch}, tokens per second rose {gain:.1f} times while TPOT rose "
                f"{growth:.1f} times: the weights are read once per step for every sequence, so a bigger batch "
                "is cheaper per token. ")
    else:
        head = (f"From batch {first.batch} to {last.batch}, tokens per second rose only {gain:.1f} times (TPOT "
                f"{growth:.1f} times). Batching was expected to share the weight reads; on this machine the step "
                "is limited by something that grows with the batch (compute threads, or noise from other work). ")
    limits = " and ".join(x for x in (f"TPOT <= {_ms(target.tpot)}" if target.tpot else "",
                                      f"TTFT <= {_ms(target.ttft)}" if target.ttft else "") if x) or "no latency limit"
    if useful is None:
        mid = f"No measured batch met {limits}. "
    else:
        mid = f"Under {limits}, the useful batch is {useful}. "
    return head + mid + f"Memory would admit up to {capacity:,} sequences of this length (`kvlab.theory.roofline.admitted`)."


def reading_workloads(diagnoses: dict) -> str:
    """The three workloads side by side: whether they end in different verdicts and levers."""
    parts = [f"{name}: `{d.verdict}` ({d.because})" for name, d in diagnoses.items()]
    verdicts = {d.verdict for d in diagnoses.values()}
    if len(verdicts) == len(diagnoses):
        tail = ("Each workload ended in a different verdict on the same model, so each needs a different "
                "next change, as the seed's closing paragraph says.")
    else:
        tail = (f"Only {len(verdicts)} distinct verdict(s) for {len(diagnoses)} workloads here. The seed expects "
                "different bottlenecks; on this machine the noise of a shared CPU or a model too small for its "
                "step to leave the overhead regime can merge them. Move the sliders to larger contexts or batches.")
    return "; ".join(parts) + ". " + tail
