"""Notebook 09, a worked path through a slow decode step (section 9.8): the verdict.

The Decode and KV Cache chapter, 2026, section 9.8, ends its reasoning path in one of five
verdicts: the step is lost to overhead between kernels, bound by the weights it reads, by the KV
cache it reads, by compute, or the request does not fit at all. ``decide`` turns the path's
measurements (the busy share of a traced step, its share of the read bandwidth and of the matmul
rate, the KV share of its bytes, the admission check) into that verdict, in the chapter's order,
with the thresholds named below; ``lever`` names the change the path recommends next.
``useful_batch`` is step 4, the largest batch within a service target; ``bandwidth_batch`` and
``shared_weight_tpot`` are the byte model of batching a step that reads its weights (exercise 1),
and ``batch_tpot`` the roofline of the batch sweep of notebook 09, with this machine's read
bandwidth and its matmul rate at each batch. ``verdicts_within`` lists the verdicts a diagnosis
reaches within its measurements' spread. The readings of notebook 09 decide with the models here:
``compare_loops`` (two loops that run the same forward pass), ``compare_idle`` (a stable loop's
gaps), ``compare_batch_tpot`` and ``sweep_outcome`` (the batch sweep against ``batch_tpot``),
``past_ridge`` and ``exceeds_ceilings``.

Plain functions of numbers, so that a reader (and a test) can check the arithmetic; the
measurements themselves are taken by ``kvlab.lab.diagnose``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import flag, integer, items, nonnegative, one_of, positive, real
from kvlab.theory import roofline
from kvlab.theory.agreement import AGREES, CANNOT_TELL, DISAGREES, FLOOR, Comparison, compare
from kvlab.theory.work import check_method, step_work

VERDICTS = ("overhead", "weights", "kv", "compute", "capacity")
# Below this share of the traced step spent inside operators (CPU) or kernels (GPU), the gaps
# between them (Python, dispatch, launches) are the larger part of the step.
BUSY_THRESHOLD = 0.5
# Below this share of both ceilings (read bandwidth, matmul rate) the step is bound by neither: its
# time goes to fixed per-operator costs, even where the profiler counts them as "inside" an
# operator. Section 9.8's step 2 asks for near-ceiling throughput before it calls a step
# memory-bound: a large KV share of bytes moved at a tenth of the bandwidth is not KV-bound.
CEILING_THRESHOLD = 0.15
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
    on). Checks its arguments, then decides with ``classify``."""
    busy_fraction, kv_share = (
        real("busy_fraction", busy_fraction, 0, 1),
        real("kv_share", kv_share, 0, 1),
    )
    # Shares of a calibrated ceiling may pass 1 (a CPU's caches beat its read bandwidth); never
    # below 0.
    bandwidth_fraction = real("bandwidth_fraction", bandwidth_fraction, 0)
    flops_fraction = real("flops_fraction", flops_fraction, 0)
    if not isinstance(admitted, (bool, roofline.Admission)):
        raise TypeError(
            "admitted must be True, False or a kvlab.theory.roofline.Admission, got "
            f"{type(admitted).__name__} {admitted!r}"
        )
    return classify(busy_fraction, bandwidth_fraction, flops_fraction, kv_share, admitted)


def classify(busy, bandwidth, flops, kv_share, admitted=True) -> tuple[str, str]:
    """The decision of ``decide``, in the chapter's order: a request that does not fit is
    ``capacity``; a step that is mostly gaps between operators, or that reaches under
    ``CEILING_THRESHOLD`` of both ceilings, is ``overhead``; a step nearer the compute ceiling than
    the bandwidth one (intensity past the ridge point) is ``compute``; otherwise it is memory-bound,
    on ``kv`` when the cache is most of its bytes and on ``weights`` when they are."""
    if not admitted:
        detail = f": {admitted}" if isinstance(admitted, roofline.Admission) else ""
        return "capacity", f"weights plus cache do not fit in memory{detail}"
    if busy < BUSY_THRESHOLD:
        return "overhead", f"busy for only {busy:.0%} of the traced step: mostly gaps"
    if max(bandwidth, flops) < CEILING_THRESHOLD:
        return "overhead", (
            f"busy, but under {CEILING_THRESHOLD:.0%} of both ceilings: neither bytes nor FLOPs set"
            " its time"
        )
    if flops > bandwidth:
        return "compute", "nearer the matmul rate than the read bandwidth"
    if kv_share > KV_SHARE_THRESHOLD:
        return "kv", f"nearer the read bandwidth, and the KV cache is {kv_share:.0%} of the bytes"
    return (
        "weights",
        f"nearer the read bandwidth, and the weights are {1 - kv_share:.0%} of the bytes",
    )


def verdicts_within(
    *,
    busy_fraction: float,
    bandwidth_fraction: float,
    flops_fraction: float,
    kv_share: float,
    busy_spread: float = 0.0,
    fraction_spread: float = 0.0,
    admitted: "bool | roofline.Admission" = True,
) -> tuple[str, ...]:
    """Every verdict ``decide`` reaches while each measured share moves within its band: the busy
    share by a factor ``1 + max(FLOOR, busy_spread)`` either way, the two ceiling shares each by
    ``1 + max(FLOOR, fraction_spread)`` (the agreement band of ``kvlab.theory.agreement``). The KV
    share is arithmetic and does not move. One verdict: the diagnosis is firm. Two or more: the
    measurement sits on a threshold, and the run cannot tell between them (a second run may land
    on either side). In the order of ``VERDICTS``."""
    busy = real("busy_fraction", busy_fraction, 0, 1)
    bw = real("bandwidth_fraction", bandwidth_fraction, 0)
    fl = real("flops_fraction", flops_fraction, 0)
    a = 1 + max(FLOOR, real("busy_spread", busy_spread, 0))
    f = 1 + max(FLOOR, real("fraction_spread", fraction_spread, 0))
    found = set()
    for b in (busy / a, busy, min(1.0, busy * a)):
        for x in (bw / f, bw * f):
            for y in (fl / f, fl * f):
                found.add(
                    decide(
                        busy_fraction=b,
                        bandwidth_fraction=x,
                        flops_fraction=y,
                        kv_share=kv_share,
                        admitted=admitted,
                    )[0]
                )
    return tuple(v for v in VERDICTS if v in found)


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


def compare_loops(tokens_per_s: float, reference_tokens_per_s: float, spread: float) -> Comparison:
    """A loop's tokens per second against a reference loop running the same forward pass, whose
    expected ratio is 1 (parity), with the relative ``spread`` of the two timings
    (``kvlab.theory.agreement.compare``)."""
    positive("tokens_per_s", tokens_per_s)
    positive("reference_tokens_per_s", reference_tokens_per_s)
    return compare(tokens_per_s, reference_tokens_per_s, spread)


def expected_static_idle(cached_idle_s: float, cached_ops: int, static_ops: int) -> float:
    """The stable-loop model of step 3 for a static step run eagerly (no CUDA graph, as on a CPU):
    the gaps are the dispatch of each operator, so its idle time is the cached step's scaled by the
    ratio of their operator counts, ``cached_idle_s * static_ops / cached_ops``."""
    positive("cached_idle_s", cached_idle_s)
    integer("cached_ops", cached_ops, 1)
    integer("static_ops", static_ops, 1)
    return cached_idle_s * static_ops / cached_ops


def compare_idle(
    static_idle_s: float,
    cached_idle_s: float,
    cached_ops: int,
    static_ops: int,
    graphed: bool,
    spread: float,
) -> Comparison:
    """The static step's idle time against step 3's model, with the relative ``spread`` of the two
    traces' idle times (``kvlab.theory.agreement.compare``).

    Replayed as one CUDA graph (``graphed``) the static step should have almost no gaps: the
    comparison is then against the cached step's idle time, and the model expects the static step
    far below it (outcome ``"disagrees"``, side ``"below"``). Eager, it is against
    ``expected_static_idle``, and the model expects agreement.
    """
    nonnegative("static_idle_s", static_idle_s), flag("graphed", graphed)
    if graphed:
        return compare(static_idle_s, positive("cached_idle_s", cached_idle_s), spread)
    return compare(
        static_idle_s, expected_static_idle(cached_idle_s, cached_ops, static_ops), spread
    )


def batch_tpot(
    tpot_1: float,
    batch: int,
    weight_bytes: float,
    sequence_bytes: float,
    sequence_flops: float,
    bandwidth: float,
    rate_1: float,
    rate_b: float,
) -> float:
    """TPOT at ``batch`` from the batch-1 TPOT and the roofline with this machine's ceilings:
    t(b) = t(1) + roof(b) - roof(1) + (b - 1) B_seq / R, with roof(b) = max(P w / R, b F / M(b)).

    ``weight_bytes`` P w are read once per step at the read bandwidth R (``bandwidth``); each
    sequence adds ``sequence_bytes`` B_seq (its cache read and new token) and ``sequence_flops`` F,
    done at ``rate_b`` M(b), the matmul rate measured at ``batch`` rows (``rate_1`` at one). What
    batch 1 paid beyond its roof (dispatch, the operators' fixed costs) is shared by the batch. On a
    GPU M(b) grows almost in proportion to b up to the ridge and the step stays flat; on a CPU M(b)
    grows slowly and the products' time sets TPOT from batch 2 or so."""
    positive("tpot_1", tpot_1)
    integer("batch", batch, 1)
    for name, value in (
        ("weight_bytes", weight_bytes),
        ("sequence_bytes", sequence_bytes),
        ("sequence_flops", sequence_flops),
        ("bandwidth", bandwidth),
        ("rate_1", rate_1),
        ("rate_b", rate_b),
    ):
        positive(name, value)
    roof_1 = max(weight_bytes / bandwidth, sequence_flops / rate_1)
    roof_b = max(weight_bytes / bandwidth, batch * sequence_flops / rate_b)
    return tpot_1 + roof_b - roof_1 + (batch - 1) * sequence_bytes / bandwidth


def batch_tpot_spread(
    predicted: float,
    tpot_1: float,
    spread_1: float,
    products_s: float,
    rate_spread: float,
    measured_spread: float,
) -> float:
    """The relative spread behind measured TPOT over ``batch_tpot``'s ``predicted``: the measured
    step's own ``measured_spread``, plus each uncertain term of the prediction weighted by its share
    of it: the batch-1 time ``tpot_1`` (``spread_1``) and the products' time ``products_s``, b F /
    M(b), whose rate was measured with ``rate_spread``. First-order propagation: a term that is a
    tenth of the prediction adds a tenth of its spread."""
    positive("predicted", predicted)
    positive("tpot_1", tpot_1)
    real("products_s", products_s, 0)
    spreads = [real(n, v, 0) for n, v in (("spread_1", spread_1), ("rate_spread", rate_spread))]
    own = real("measured_spread", measured_spread, 0)
    return own + (tpot_1 * spreads[0] + products_s * spreads[1]) / predicted


def compare_batch_tpot(tpot_b: float, predicted: float, spread: float) -> Comparison:
    """The TPOT measured at a batch against ``batch_tpot``'s prediction, with the relative
    ``spread`` of the timings behind both (``kvlab.theory.agreement.compare``)."""
    positive("tpot_b", tpot_b)
    return compare(tpot_b, predicted, spread)


def sweep_outcome(comparisons) -> str:
    """One outcome for a sweep of comparisons: ``"disagrees"`` when any point disagrees,
    ``"agrees"`` when every point agrees, else ``"cannot tell"``."""
    comparisons = items("comparisons", comparisons, Comparison, what="Comparison")
    outcomes = {c.outcome for c in comparisons}
    if DISAGREES in outcomes:
        return DISAGREES
    return AGREES if outcomes == {AGREES} else CANNOT_TELL


def past_ridge(intensity: float, ridge: float) -> bool:
    """The roofline's side of the ridge (Williams et al. 2009): a step whose arithmetic intensity
    (FLOP per byte) exceeds the machine's ridge point is compute-bound, below it memory-bound."""
    return nonnegative("intensity", intensity) > positive("ridge", ridge)


def exceeds_ceilings(bandwidth_fraction: float, flops_fraction: float) -> bool:
    """Whether a step measured above either calibrated ceiling (a fraction over 1), which the
    roofline does not allow: the calibration, not the step, is then what is off."""
    return (
        max(
            nonnegative("bandwidth_fraction", bandwidth_fraction),
            nonnegative("flops_fraction", flops_fraction),
        )
        > 1
    )
