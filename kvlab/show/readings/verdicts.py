"""Every notebook: the words for a verdict of ``kvlab.theory.agreement.compare``, the note that
states the method once per page, and the summary of a verdict over a sweep.

A page prints ``method_note`` once, where its first measurement is judged; its readings then say
only what was measured, what the model predicts and the verdict (``verdict_words``), and a sweep's
verdicts are summarised by ``sweep_summary``: where the model agrees, where it misses and on which
side, where the run cannot tell.
"""

from __future__ import annotations

import math

from kvlab._checks import instance, integer
from kvlab.theory.agreement import (
    AGREE_SPREAD_LIMIT,
    AGREES,
    CANNOT_TELL,
    DISAGREE_POWER,
    DISAGREES,
    FLOOR,
    Comparison,
)


def method_note(repeats: int, beside: str = "the ceiling it is compared with") -> str:
    """The page's one note on method and tolerance (Markdown)."""
    repeats = integer("repeats", repeats)
    return (
        f"*How these verdicts are reached.* Each time is the fastest of {repeats} repeats, timed in"
        f" turn with {beside}, so that a busy neighbour slows both; its spread is how far the"
        " faster quarter of the repeats sat above the fastest, the measurement's and the"
        " ceiling's added. A measurement **agrees** with its prediction within a factor of"
        f" 1 + the larger of {FLOOR:.0%} and that spread, **disagrees** beyond the"
        f" {_power_word()} of that factor ({(1 + FLOOR) ** DISAGREE_POWER - 1:.0%} at"
        f" {FLOOR:.0%}), and in between we **cannot tell**; a spread above"
        f" {AGREE_SPREAD_LIMIT:.0%} is too noisy to agree with anything. Two runs of this page"
        " reach the same verdicts or, near an edge, one of them cannot tell; they never agree in"
        " one run and disagree in the other."
    )


def _power_word() -> str:
    return {2: "square", 3: "cube"}.get(DISAGREE_POWER, f"power {DISAGREE_POWER}")


def verdict_words(c: Comparison) -> str:
    """``"agrees"``, ``"is above it"``, ``"is below it"``, ``"cannot tell (above it)"``: the
    verdict as a reading's sentence continues it. A run too noisy to agree
    (``Comparison.can_agree``) says so: on its prediction (within the floor), or with its scatter,
    rather than naming a side."""
    instance("c", c, Comparison)
    if c.outcome == AGREES:
        return "agrees"
    if c.outcome == DISAGREES:
        return f"disagrees: it is {c.side} the prediction"
    if not c.can_agree and abs(math.log(c.ratio)) <= math.log(1 + c.floor):
        return (
            "cannot tell: it is on the prediction, but the repeats scattered too much to confirm it"
        )
    if not c.can_agree:
        return f"cannot tell: the repeats scattered by {c.spread:.0%}, too much to call it"
    return f"cannot tell: it is {c.side} the prediction, but within the noise band"


def _listing(labels: list[str]) -> str:
    if len(labels) <= 2:
        return " and ".join(labels)
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def sweep_summary(labels, comparisons, name: str = "the model") -> str:
    """One sentence: where ``name`` agrees, disagrees (with the side) and cannot tell over a sweep;
    ``labels`` name the points (``"n = 4"``), one per comparison."""
    labels, comparisons = list(labels), list(comparisons)
    if len(labels) != len(comparisons) or not labels:
        raise ValueError(
            f"labels and comparisons must be non-empty and as long as each other, got"
            f" {len(labels)} and {len(comparisons)}"
        )
    parts = []
    agree = [lab for lab, c in zip(labels, comparisons) if c.outcome == AGREES]
    if agree:
        parts.append(f"agrees at {_listing(agree)}")
    for side in ("above", "below"):
        miss = [
            f"{lab} ({c.ratio:.2g} times)"
            for lab, c in zip(labels, comparisons)
            if c.outcome == DISAGREES and c.side == side
        ]
        if miss:
            parts.append(f"disagrees at {_listing(miss)}, the measurement {side} it")
    unsure = [lab for lab, c in zip(labels, comparisons) if c.outcome == CANNOT_TELL]
    if unsure:
        parts.append(f"cannot be judged at {_listing(unsure)}")
    return f"Over the sweep, {name} {_listing(parts)}."
