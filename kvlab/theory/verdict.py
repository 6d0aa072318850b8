"""Notebook 09, a worked path through a slow decode step (section 9.8): the verdict.

The Decode and KV Cache chapter, 2026, section 9.8, ends its reasoning path in one of five
verdicts: the step is lost to overhead between kernels, bound by the weights it reads, by the KV
cache it reads, by compute, or the request does not fit at all. ``decide`` turns the path's
measurements (the busy share of a traced step, its share of the copy bandwidth and of the matmul
rate, the KV share of its bytes, the admission check) into that verdict, in the chapter's order,
with the thresholds named below; ``lever`` names the change the path recommends next.
``useful_batch`` is step 4, the largest batch within a service target; ``bandwidth_batch`` and
``shared_weight_tpot`` are the byte model of batching a step that reads its weights (exercise 1 and
the batch sweep of notebook 09). The readings of notebook 09 decide with the models here:
``compare_loops`` (two loops that run the same forward pass), ``compare_idle`` (a stable loop's
gaps), ``compare_batch_tpot`` (the batch sweep against the shared-weight model), ``past_ridge`` and
``exceeds_ceilings``.

Plain functions of numbers, so that a reader (and a test) can check the arithmetic; the
measurements themselves are taken by ``kvlab.lab.diagnose``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import integer, items, one_of, positive, real
from kvlab.theory import roofline
from kvlab.theory.agreement import FactorComparison, within_factor
from kvlab.theory.work import check_method, step_work

VERDICTS = ("overhead", "weights", "kv", "compute", "capacity")
# Below this share of the traced step spent inside operators (CPU) or kernels (GPU), the gaps
# between them (Python, dispatch, launches) are the larger part of the step.
BUSY_THRESHOLD = 0.5
# Below this share of both ceilings (copy bandwidth, matmul rate) the step uses neither: its time
# goes to fixed per-operator costs, even where the profiler counts them as "inside" an operator.
CEILING_THRESHOLD = 0.05
# Above this share of the step's bytes, the KV cache (not the weights) is what the step reads.
KV_SHARE_THRESHOLD = 0.5

LEVERS = {
    "capacity": (
        "make the cache fit: paging to stop reserving each request's maximum"
        " (kvlab.serving.paged_decode.paged_generate, section 9.5 PagedAttention), then fewer or"
        " narrower entries per token: grouped-query attention, KV quantization or a window"
        " (kvlab.cache.window, kvlab.cache.quantized, section 9.7 Long-context variants)"
    ),
    "overhead": (
        "remove the gaps: a stable loop compiled and replayed as a CUDA graph "
        "(kvlab.static_decode(compile=True), section 9.2), or more sequences per step so that "
        "each launch does more work (step 4)"
    ),
    "overhead-static": (
        "the loop is already stable: put more sequences in each step so that each "
        "launch does more work (step 4, the useful batch)"
    ),
    "compute-naive": (
        "reuse the cache: kvlab.cached_decode (section 9.2) drops the recomputed positions"
    ),
    "compute": (
        "the step is at the compute roof: a smaller batch per step lowers TPOT, and more FLOP/s "
        "needs a faster matmul or a lower precision (section 9.3)"
    ),
    "weights": (
        "batch more sequences per step: the weights are read once for all of them, up to the useful"
        " batch of step 4 (kvlab.theory.roofline.ridge_batch, section 9.3); weight quantization"
        " lowers the bytes per parameter"
    ),
    "kv": (
        "read fewer KV bytes per step: grouped-query attention, KV quantization or a window"
        " (kvlab.cache.window, kvlab.cache.quantized, section 9.7 Long-context variants); paging"
        " (section 9.5) admits more requests but does not shrink what an admitted request reads"
    ),
}


def decide(
    *,
    busy_fraction: float,
    bandwidth_fraction: float,
    flops_fraction: float,
    kv_share: float,
    admitted: "bool | roofline.Admission" = True,
) -> tuple[str, str]:
    """The verdict of section 9.8 from the measurements; returns (verdict, the measurements it rests
    on).

    In order: a request that does not fit is ``capacity``; a step that is mostly gaps between
    operators, or that uses under ``CEILING_THRESHOLD`` of both ceilings, is ``overhead``; a step
    whose share of the compute ceiling exceeds its share of the bandwidth ceiling (its arithmetic
    intensity is past the machine's ridge point) is ``compute``; otherwise it is memory-bound, on
    ``kv`` when the cache is most of its bytes and on ``weights`` when they are.
    """
    busy_fraction, kv_share = (
        real("busy_fraction", busy_fraction, 0, 1),
        real("kv_share", kv_share, 0, 1),
    )
    # Shares of a calibrated ceiling may pass 1 (a CPU's caches beat its copy bandwidth); never
    # below 0.
    bandwidth_fraction = real("bandwidth_fraction", bandwidth_fraction, 0)
    flops_fraction = real("flops_fraction", flops_fraction, 0)
    if not isinstance(admitted, (bool, roofline.Admission)):
        raise TypeError(
            "admitted must be True, False or a kvlab.theory.roofline.Admission, got "
            f"{type(admitted).__name__} {admitted!r}"
        )
    ceilings = (
        f"{bandwidth_fraction:.0%} of the copy bandwidth and {flops_fraction:.0%} of the matmul"
        " rate"
    )
    if not admitted:
        detail = f": {admitted}" if isinstance(admitted, roofline.Admission) else ""
        return (
            "capacity",
            f"weights plus cache for the requested batch and length do not fit in memory{detail}",
        )
    if busy_fraction < BUSY_THRESHOLD:
        return (
            "overhead",
            (
                f"operators or kernels were busy for only {busy_fraction:.0%} of the traced step "
                f"(threshold {BUSY_THRESHOLD:.0%}); the rest is gaps between them"
            ),
        )
    if max(bandwidth_fraction, flops_fraction) < CEILING_THRESHOLD:
        return (
            "overhead",
            (
                f"the step reached only {ceilings} (both under {CEILING_THRESHOLD:.0%}): "
                "fixed per-operator costs, not bytes or FLOPs, set its time"
            ),
        )
    if flops_fraction > bandwidth_fraction:
        return (
            "compute",
            (
                f"busy for {busy_fraction:.0%} of the step at {ceilings}: nearer the compute "
                "ceiling than the bandwidth one (intensity past the ridge point)"
            ),
        )
    part = "kv" if kv_share > KV_SHARE_THRESHOLD else "weights"
    what = "the KV cache" if part == "kv" else "the weights"
    return (
        part,
        (
            f"busy for {busy_fraction:.0%} of the step at {ceilings}; {what}"
            f" make{'s' * (part == 'kv')} up {kv_share if part == 'kv' else 1 - kv_share:.0%} of"
            " the bytes it moves"
        ),
    )


def lever(verdict: str, method: str) -> str:
    """The next change the path recommends for ``verdict`` on loop ``method``."""
    one_of("verdict", verdict, VERDICTS)
    check_method(method)
    if verdict == "overhead" and method == "static":
        return LEVERS["overhead-static"]
    if verdict == "compute" and method == "naive":
        return LEVERS["compute-naive"]
    return LEVERS[verdict]


@dataclass(frozen=True)
class Target:
    """A service target for step 4: TPOT and TTFT limits in seconds, and the memory (bytes) for
    weights plus cache (default: this device's memory). Any of them may be None (no limit)."""

    tpot: float | None = None
    ttft: float | None = None
    memory: float | None = None

    def __post_init__(self):
        for name in ("tpot", "ttft", "memory"):
            value = getattr(self, name)
            if value is not None:
                positive(name, value)


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
        return (
            bool(self.admission)
            and (target.tpot is None or self.tpot <= target.tpot)
            and (target.ttft is None or self.ttft <= target.ttft)
        )


def capacity_batch(shape, hw, context: int, w: float = 2) -> int:
    """The largest batch whose weights plus cache of ``context`` tokens each fit
    (``roofline.admitted``); 0 when not even one sequence fits."""
    w = positive("w", w)
    fit = roofline.admitted(shape, hw, 1, context, w, w)
    if not fit:
        return 0
    return int((fit.available - fit.weights) // fit.kv) if fit.kv > 0 else 2**31


def useful_batch(sweep, target: Target) -> int | None:
    """Step 4: the largest measured batch that meets ``target`` and fits; without TPOT and TTFT
    limits, the admitted batch with the most tokens per second. None when no measured batch
    qualifies."""
    if not isinstance(target, Target):
        raise TypeError(
            f"target must be a kvlab.theory.verdict.Target, got {type(target).__name__}"
        )
    sweep = items("sweep", sweep, BatchPoint, what="BatchPoint (kvlab.lab.diagnose.batch_sweep)")
    ok = [p for p in sweep if p.meets(target)]
    if not ok:
        return None
    if target.tpot is None and target.ttft is None:
        return max(ok, key=lambda p: p.tokens_per_s).batch
    return max(p.batch for p in ok)


# --------------------------------------------------------------------------- batching a
# weight-bound step


def bandwidth_batch(
    shape, context: int, step_s: float, bandwidth: float, w_p: float = 2, w_kv: float = 2
) -> float:
    """The batch at which a step that keeps taking ``step_s`` would move bytes at ``bandwidth``.

    The step moves B(b) = P w_p + b (s + 1) K bytes (``kvlab.theory.work.step_work``: the weights
    once, each sequence's cache read and its new token written), so B(b) / step_s = bandwidth gives
    b = (bandwidth * step_s - P w_p) / ((s + 1) K). Only the cache term grows with the batch: the
    weights are read once for all sequences. At most 1 when batch 1 already reaches ``bandwidth``.
    """
    positive("step_s", step_s)
    positive("bandwidth", bandwidth)
    one = step_work(shape, 1, context, "cached", w_p, w_kv)
    per_sequence = one.kv_read + one.kv_written
    return max(1.0, (bandwidth * step_s - one.weights_read) / per_sequence)


def flat_step_fraction(
    batch: int, step_s: float, weight_bytes: float, sequence_bytes: float, bandwidth: float
) -> float:
    """The share of ``bandwidth`` a step of ``batch`` sequences would reach if it kept taking
    ``step_s`` (the batch-1 time): (P w + b (s + 1) K) / (step_s * bandwidth), the prediction behind
    ``bandwidth_batch``."""
    integer("batch", batch, 1)
    positive("weight_bytes", weight_bytes)
    positive("sequence_bytes", sequence_bytes)
    return (weight_bytes + batch * sequence_bytes) / (
        positive("step_s", step_s) * positive("bandwidth", bandwidth)
    )


def shared_weight_tpot(tpot_1: float, batch: int, sequence_bytes: float, bandwidth: float) -> float:
    """TPOT at ``batch`` if everything batch 1 paid is shared by the batch (the weight reads, the
    fixed costs of each operator) and each further sequence adds only its own ``sequence_bytes``
    (its cache read and its new token) at ``bandwidth``: t(b) = t(1) + (b - 1) * sequence_bytes /
    bandwidth."""
    positive("tpot_1", tpot_1)
    integer("batch", batch, 1)
    positive("sequence_bytes", sequence_bytes)
    positive("bandwidth", bandwidth)
    return tpot_1 + (batch - 1) * sequence_bytes / bandwidth


# --------------------------------------------------------------------------- the readings' models

# Two loops that run the same cached forward pass (kvlab's and Hugging Face generate) are at parity
# within this factor of tokens per second.
LOOP_TOLERANCE = 1.25
# A measured idle time or TPOT within this factor of its model's prediction agrees with it.
IDLE_TOLERANCE = 1.25
BATCH_TOLERANCE = 1.25


def compare_loops(tokens_per_s: float, reference_tokens_per_s: float) -> FactorComparison:
    """A loop's tokens per second against a reference loop running the same forward pass, whose
    expected ratio is 1 (parity), agreeing within ``LOOP_TOLERANCE``."""
    positive("reference_tokens_per_s", reference_tokens_per_s)
    return within_factor(tokens_per_s, reference_tokens_per_s, LOOP_TOLERANCE)


def expected_static_idle(cached_idle_s: float, cached_ops: int, static_ops: int) -> float:
    """The stable-loop model of step 3 for a static step run eagerly (no CUDA graph, as on a CPU):
    the gaps are the dispatch of each operator, so its idle time is the cached step's scaled by the
    ratio of their operator counts, ``cached_idle_s * static_ops / cached_ops``."""
    positive("cached_idle_s", cached_idle_s)
    integer("cached_ops", cached_ops, 1)
    integer("static_ops", static_ops, 1)
    return cached_idle_s * static_ops / cached_ops


def compare_idle(
    static_idle_s: float, cached_idle_s: float, cached_ops: int, static_ops: int, graphed: bool
) -> FactorComparison:
    """The static step's idle time against step 3's model, agreeing within ``IDLE_TOLERANCE``.

    Replayed as one CUDA graph (``graphed``) the static step should have almost no gaps: the model
    is then "less idle than the cached step", and the comparison is against the cached step's idle
    time (expected outcome ``"below"``). Eager, it is against ``expected_static_idle`` (expected
    ``"within"``).
    """
    real("static_idle_s", static_idle_s)
    if graphed:
        return within_factor(
            static_idle_s, positive("cached_idle_s", cached_idle_s), IDLE_TOLERANCE
        )
    return within_factor(
        static_idle_s, expected_static_idle(cached_idle_s, cached_ops, static_ops), IDLE_TOLERANCE
    )


def compare_batch_tpot(
    tpot_1: float, batch: int, tpot_b: float, sequence_bytes: float, bandwidth: float
) -> FactorComparison:
    """The TPOT measured at ``batch`` against ``shared_weight_tpot``, agreeing within
    ``BATCH_TOLERANCE``."""
    predicted = shared_weight_tpot(tpot_1, batch, sequence_bytes, bandwidth)
    return within_factor(tpot_b, predicted, BATCH_TOLERANCE)


def past_ridge(intensity: float, ridge: float) -> bool:
    """The roofline's side of the ridge (Williams et al. 2009): a step whose arithmetic intensity
    (FLOP per byte) exceeds the machine's ridge point is compute-bound, below it memory-bound."""
    return real("intensity", intensity) > positive("ridge", ridge)


def exceeds_ceilings(bandwidth_fraction: float, flops_fraction: float) -> bool:
    """Whether a step measured above either calibrated ceiling (a fraction over 1), which the
    roofline does not allow: the calibration, not the step, is then what is off."""
    return (
        max(real("bandwidth_fraction", bandwidth_fraction), real("flops_fraction", flops_fraction))
        > 1
    )
