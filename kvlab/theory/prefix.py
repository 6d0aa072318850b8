"""Notebook 06, prefix caching: the models its readings decide by.

- ``ttft_saving`` and ``TTFTSaving``: cold against cached time to first token, measured against what
  prefill FLOPs predict (``kvlab.theory.roofline.prefill_time``), agreeing within
  ``TTFT_TOLERANCE``;
- ``decode_steps_agree``: two decode steps that read the same bytes take the same time, within
  ``DECODE_TOLERANCE``;
- ``policy_winner``: which eviction policy's replay served more prompt tokens, closer than
  ``POLICY_MARGIN`` being a tie.

Pure Python; the measurements are in ``kvlab.lab.prefix``, the comparison in
``kvlab.theory.agreement``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import positive
from kvlab.theory.agreement import within_factor

# A measured quantity within this factor of its prediction is said to follow it (both ways).
TTFT_TOLERANCE = 1.5
# Two decode steps that read the same K and V bytes are predicted to take the same time; on a shared
# CPU, medians within this factor are that prediction holding.
DECODE_TOLERANCE = 1.15
# Hit rates of two cache policies closer than this (a share of prompt tokens) are a tie.
POLICY_MARGIN = 0.02


@dataclass(frozen=True)
class TTFTSaving:
    """Cold against cached time to first token (notebook 06): the measured ratio, the ratio that
    :func:`kvlab.theory.roofline.prefill_time` predicts, the outcome of
    :func:`agreement.within_factor` (``verdict``), and ``fixed_s``, the cost per prefill that
    the FLOPs leave out (the intercept of ``measured = fixed_s + a * predicted`` through the two
    points).
    """

    measured: float
    predicted: float
    verdict: str
    fixed_s: float


def ttft_saving(
    cold_s: float,
    cached_s: float,
    cold_pred_s: float,
    cached_pred_s: float,
    tolerance: float = TTFT_TOLERANCE,
) -> TTFTSaving:
    """:class:`TTFTSaving` from the measured and the predicted times to first token, cold and cached
    (s)."""
    cold_s, cached_s = positive("cold_s", cold_s), positive("cached_s", cached_s)
    cold_pred_s, cached_pred_s = (
        positive("cold_pred_s", cold_pred_s),
        positive("cached_pred_s", cached_pred_s),
    )
    measured, predicted = cold_s / cached_s, cold_pred_s / cached_pred_s
    slope = (
        (cold_s - cached_s) / (cold_pred_s - cached_pred_s) if cold_pred_s != cached_pred_s else 0.0
    )
    return TTFTSaving(
        measured,
        predicted,
        within_factor(measured, predicted, tolerance).outcome,
        cold_s - slope * cold_pred_s,
    )


def decode_steps_agree(
    computed_s: float, cached_s: float, tolerance: float = DECODE_TOLERANCE
) -> bool:
    """Whether two decode steps that read the same bytes took the same time, as predicted (ratio
    1)."""
    ratio = positive("cached_s", cached_s) / positive("computed_s", computed_s)
    return within_factor(ratio, 1.0, tolerance).agrees


def policy_winner(lru_hit: float, reserve_hit: float, margin: float = POLICY_MARGIN) -> str:
    """``"lru"``, ``"reserve"`` or ``"tie"``: the policy whose replay served more prompt tokens."""
    if abs(lru_hit - reserve_hit) <= margin:
        return "tie"
    return "lru" if lru_hit > reserve_hit else "reserve"
