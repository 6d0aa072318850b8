"""Notebook 11, the continuous-batching engine: the cost models its readings decide by.

- ``work_ratio`` and ``WorkRatio``: what padded ``generate`` computes over what the engine computes
  on the same requests, if a step costs its token rows or if every forward pass costs the same;
  ``speedup_verdict``: a measured speed-up against the range those two models predict, within
  ``SPEEDUP_TOLERANCE``;
- ``flat_step_prediction``: the throughput a step that costs the same whatever the batch predicts,
  agreeing within ``FLAT_STEP_TOLERANCE``;
- ``batch_bound``: whether the KV pool or ``max_batch`` bounds the running batch, a mean batch
  within ``CAPACITY_TOLERANCE`` of the pool's capacity being the pool binding;
- ``ENGINE``, ``ENGINE_NO_CACHE``, ``GENERATE``, ``CB`` and ``CB_NO_SHARING``: the names of the
  contenders these models compare.

Pure Python; the measurements are in ``kvlab.lab.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import integer, positive, real

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
    best = max(points, key=lambda p: p.tokens_per_s)
    return best.mean_batch * points[0].tokens_per_s / points[0].mean_batch


def batch_bound(capacity: float, max_batch: int) -> tuple[str, float]:
    """What bounds the running batch, by the pool model: ``("pool", capacity)`` when the pool holds
    fewer mean requests than ``max_batch``, else ``("max_batch", max_batch)``."""
    capacity, max_batch = real("capacity", capacity, 0), integer("max_batch", max_batch)
    return ("pool", capacity) if capacity < max_batch else ("max_batch", float(max_batch))
