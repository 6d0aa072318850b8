"""Notebook 06, prefix caching: the models its readings decide by.

- ``ttft_saving`` and ``TTFTSaving``: cold against cached time to first token, measured against what
  prefill FLOPs predict (``kvlab.theory.roofline.prefill_time``), judged by
  ``kvlab.theory.agreement.compare`` with the measurement's spread;
- ``decode_steps_compare``: two decode steps that read the same bytes are predicted to take the
  same time, judged the same way;
- ``hit_rate_verdict``: whether an eviction policy's replay served more or fewer prompt tokens
  than another's, closer than ``POLICY_MARGIN`` being a tie.

Pure Python; the measurements are in ``kvlab.lab.prefix``, the comparison in
``kvlab.theory.agreement``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import positive, real
from kvlab.theory.agreement import AGREES, CANNOT_TELL, Comparison, compare

# Hit rates of two cache policies closer than this (a share of prompt tokens) are a tie.
POLICY_MARGIN = 0.02


@dataclass(frozen=True)
class TTFTSaving:
    """Cold against cached time to first token (notebook 06): the measured ratio, the ratio that
    :func:`kvlab.theory.roofline.prefill_time` predicts, the :func:`agreement.compare` of the two
    (``comparison``), and ``fixed_s``, the cost per prefill that the FLOPs leave out (the intercept
    of ``measured = fixed_s + a * predicted`` through the two points).
    """

    measured: float
    predicted: float
    comparison: Comparison
    fixed_s: float

    @property
    def verdict(self) -> str:
        """``"agrees"``, ``"cannot tell"``, or the side of a disagreement: ``"above"`` (a larger
        saving than predicted) or ``"below"``."""
        c = self.comparison
        return c.outcome if c.outcome in (AGREES, CANNOT_TELL) else c.side


def ttft_saving(
    cold_s: float, cached_s: float, cold_pred_s: float, cached_pred_s: float, spread: float = 0.0
) -> TTFTSaving:
    """:class:`TTFTSaving` from the measured and the predicted times to first token, cold and cached
    (s); ``spread``: the measured ratio's relative run-to-run scatter."""
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
        measured, predicted, compare(measured, predicted, spread), cold_s - slope * cold_pred_s
    )


def decode_steps_compare(computed_s: float, cached_s: float, spread: float = 0.0) -> Comparison:
    """Two decode steps that read the same bytes, predicted to take the same time: the ratio
    cached / computed against 1, with the two timings' ``spread``."""
    ratio = positive("cached_s", cached_s) / positive("computed_s", computed_s)
    return compare(ratio, 1.0, spread)


def hit_rate_verdict(hit: float, baseline_hit: float, margin: float = POLICY_MARGIN) -> str:
    """``"more"``, ``"less"`` or ``"tie"``: whether a policy's replay served more prompt tokens
    (``hit``, a share or a difference of shares) than another's (``baseline_hit``), a gap of at
    most ``margin`` being a tie."""
    hit, baseline_hit = real("hit", hit), real("baseline_hit", baseline_hit)
    margin = real("margin", margin, 0)
    if abs(hit - baseline_hit) <= margin:
        return "tie"
    return "more" if hit > baseline_hit else "less"
