"""Notebook 11, the continuous-batching engine: the cost models its readings decide by.

- ``work_ratio`` and ``WorkRatio``: what padded ``generate`` computes over what the engine computes
  on the same requests, if a step costs its token rows or if every forward pass costs the same;
  ``speedup_verdict``: a measured speed-up against the range those two models predict, within
  ``SPEEDUP_TOLERANCE``;
- ``flat_step_prediction``: the throughput a step that costs the same whatever the batch predicts
  (the GPU's picture below its ridge), kept for contrast;
- ``roofline_throughput``: the throughput the roofline with this machine's ceilings predicts at a
  mean running batch (its read bandwidth and its matmul rate at that many rows), and
  ``curve_agreement``, each point of the curve against it (``kvlab.theory.agreement.compare``);
- ``batch_bound``: whether the KV pool or ``max_batch`` bounds the running batch, a mean batch
  within ``CAPACITY_TOLERANCE`` of the pool's capacity being the pool binding;
- ``ENGINE``, ``ENGINE_NO_CACHE``, ``GENERATE``, ``CB`` and ``CB_NO_SHARING``: the names of the
  contenders these models compare.

Pure Python; the measurements are in ``kvlab.lab.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import integer, items, positive, real
from kvlab.theory.agreement import AGREES, CANNOT_TELL, DISAGREES, Comparison, compare

# A measured speed-up within this factor of the range its two work models predict is said to follow
# them.
SPEEDUP_TOLERANCE = 1.25
# A measured quantity within this factor of the flat-step model's prediction follows it.
FLAT_STEP_TOLERANCE = 1.5
# A mean running batch within this factor of the pool's mean capacity is the pool binding.
CAPACITY_TOLERANCE = 1.2

ENGINE, ENGINE_NO_CACHE = "engine", "engine, no prefix caching"
GENERATE = "padded generate"
CB, CB_NO_SHARING = (
    "transformers continuous batching",
    "transformers continuous batching, no block sharing",
)


@dataclass(frozen=True)
class WorkRatio:
    """What padded ``generate`` computes over what the engine computes on the same requests
    (notebook 11), under two cost models of a step: ``rows``, if a step's time follows the token
    rows it computes (prompt tokens, padding included, plus one row per decoded token, finished rows
    included); ``steps``, if every forward pass costs the same whatever it holds (a step that only
    reads its weights)."""

    rows: float
    steps: float

    @property
    def low(self) -> float:
        return min(self.rows, self.steps)

    @property
    def high(self) -> float:
        return max(self.rows, self.steps)


def work_ratio(padded, engine_metrics: dict) -> WorkRatio:
    """:class:`WorkRatio` from a padded run (``kvlab.lab.engine.PaddedRun``: its ``prefill_rows``,
    ``decode_rows`` and ``forward_passes``) and the engine's ``metrics()`` on the same requests."""
    for field in ("prefill_rows", "decode_rows", "forward_passes"):
        integer(f"padded.{field}", getattr(padded, field, None), 0)
    engine_rows = (
        engine_metrics["prefill_tokens"]
        + engine_metrics["generated_tokens"]
        - engine_metrics["requests"]
    )
    padded_rows = padded.prefill_rows + padded.decode_rows
    return WorkRatio(padded_rows / engine_rows, padded.forward_passes / engine_metrics["steps"])


def speedup_verdict(
    measured: float, low: float, high: float, tolerance: float = SPEEDUP_TOLERANCE
) -> str:
    """``"within"`` when ``measured`` lies in ``[low / tolerance, high * tolerance]``, else
    ``"below"`` or ``"above"``: a measured speed-up against the range two cost models predict."""
    measured, low = positive("measured", measured), positive("low", low)
    tolerance = real("tolerance", tolerance, 1)
    high = real("high", high, low)
    if measured < low / tolerance:
        return "below"
    return "above" if measured > high * tolerance else "within"


def flat_step_prediction(points) -> float:
    """Tokens per second the flat-step model predicts at the last of ``points`` (each with
    ``tokens_per_s`` and ``mean_batch``, as ``kvlab.lab.engine.CurvePoint``) with the most
    throughput: its mean running batch times the rate per request at ``points[0]`` (a step costs the
    same whatever the batch, so throughput grows with the batch)."""
    points = items("points", points, object, what="CurvePoints")
    if not points:
        raise ValueError("points must hold at least one CurvePoint, got none")
    best = max(points, key=lambda p: p.tokens_per_s)
    return best.mean_batch * points[0].tokens_per_s / points[0].mean_batch


def roofline_throughput(
    rate_1: float,
    mean_batch: float,
    weight_bytes: float,
    sequence_flops: float,
    bandwidth: float,
    matmul_1: float,
    matmul_b: float,
) -> float:
    """Tokens per second at a mean running batch b by the roofline with this machine's ceilings,
    anchored at the one-request rate ``rate_1`` r1 (tokens per second per running request at
    ``max_batch`` 1, prefill included): a step takes t(b) = 1 / r1 + roof(b) - roof(1), with
    roof(b) = max(P w / R, b F / M(b)), and makes b tokens. ``weight_bytes`` P w are read at the
    read bandwidth R (``bandwidth``); each request adds ``sequence_flops`` F at the matmul rate
    measured at its rows, ``matmul_1`` M(1) and ``matmul_b`` M(b). Below the ridge (a GPU's regime)
    the step stays flat and throughput grows as b r1, the flat-step model; past it (this CPU from
    batch 2 or so) the products set the step."""
    for name, value in (
        ("rate_1", rate_1),
        ("mean_batch", mean_batch),
        ("weight_bytes", weight_bytes),
        ("sequence_flops", sequence_flops),
        ("bandwidth", bandwidth),
        ("matmul_1", matmul_1),
        ("matmul_b", matmul_b),
    ):
        positive(name, value)
    weights_s = weight_bytes / bandwidth
    step = (
        1 / rate_1
        + max(weights_s, mean_batch * sequence_flops / matmul_b)
        - max(weights_s, sequence_flops / matmul_1)
    )
    return mean_batch / step


def roofline_throughput_spread(
    predicted: float,
    mean_batch: float,
    rate_1: float,
    spread_1: float,
    sequence_flops: float,
    matmul_b: float,
    matmul_spread: float,
    measured_spread: float,
) -> float:
    """The relative spread behind a measured throughput over ``roofline_throughput``'s
    ``predicted``: the measurement's own, plus each uncertain term of the predicted step time
    weighted by its share of it (the one-request step 1 / ``rate_1`` with ``spread_1``, the
    products b F / M(b) with ``matmul_spread``)."""
    step = positive("mean_batch", mean_batch) / positive("predicted", predicted)
    one = real("spread_1", spread_1, 0) / positive("rate_1", rate_1)
    products = (
        mean_batch * real("sequence_flops", sequence_flops, 0) / positive("matmul_b", matmul_b)
    )
    return (
        real("measured_spread", measured_spread, 0)
        + (one + products * real("matmul_spread", matmul_spread, 0)) / step
    )


def curve_agreement(measured, predicted, spreads) -> tuple[str, tuple[Comparison, ...]]:
    """Each measured throughput against its prediction with its relative spread
    (``kvlab.theory.agreement.compare``), and one outcome for the curve: ``"disagrees"`` when any
    point disagrees, ``"agrees"`` when all agree, else ``"cannot tell"``."""
    measured, predicted, spreads = (
        [real(f"{name}[{i}]", v) for i, v in enumerate(items(name, value, object))]
        for name, value in (("measured", measured), ("predicted", predicted), ("spreads", spreads))
    )
    if not len(measured) == len(predicted) == len(spreads):
        raise ValueError(
            "measured, predicted and spreads must have one entry per point, got"
            f" {len(measured)}, {len(predicted)} and {len(spreads)}"
        )
    checks = tuple(compare(m, p, s) for m, p, s in zip(measured, predicted, spreads))
    outcomes = {c.outcome for c in checks}
    if DISAGREES in outcomes:
        return DISAGREES, checks
    return (AGREES if outcomes == {AGREES} else CANNOT_TELL), checks


def batch_bound(capacity: float, max_batch: int) -> tuple[str, float]:
    """What bounds the running batch, by the pool model: ``("pool", capacity)`` when the pool holds
    fewer mean requests than ``max_batch``, else ``("max_batch", max_batch)``."""
    capacity, max_batch = real("capacity", capacity, 0), integer("max_batch", max_batch)
    return ("pool", capacity) if capacity < max_batch else ("max_batch", float(max_batch))
