"""Notebook 13, speculative decoding: its readings.

Each decision calls a model: the expected tokens per verify step and the speed-up of
``kvlab.theory.speculative`` (Leviathan et al. 2023), from the acceptance counted on the greedy
output and the step times measured beside it. A measured speed-up meets its prediction in
``kvlab.theory.agreement.compare`` with three outcomes (agrees, disagrees, cannot tell), the spread
being how far the interleaved rounds' speed-ups lie apart (``spread``).
"""

from __future__ import annotations

from kvlab._checks import positive, real, unmeasured
from kvlab.theory.agreement import AGREES, CANNOT_TELL, Comparison, compare
from kvlab.theory.speculative import expected_tokens

BREAK_EVEN = 1.1  # a speed-up within this factor of 1 neither pays nor costs, in words


def spread(low: float, high: float) -> float:
    """The relative spread of a speed-up measured over rounds: its highest over its lowest, less 1
    (0 for one round)."""
    low = positive("low", low)
    high = real("high", high, low)
    return high / low - 1


def decide(measured: float, low: float, high: float, predicted: float) -> Comparison:
    """``measured`` (its rounds from ``low`` to ``high``) against ``predicted``."""
    return compare(measured, predicted, spread(low, high))


def acceptance_reading(task: str, k: int, alpha: float, empty: float, steps: int, new: int) -> str:
    """What the counted trace says: alpha, the steps with nothing to propose, the expected tokens
    per step, and the verify steps the request needed."""
    if missing := unmeasured(alpha=alpha, empty=empty):
        return missing
    return (
        f"On the {task} task, prompt lookup with $k = {k}$ proposed something at "
        f"{1 - empty:.0%} of the steps, and each guess it checked was right with probability "
        f"$\\alpha = {alpha:.2f}$: Leviathan's $E(\\alpha, k)$ gives "
        f"**{expected_tokens(alpha, k):.2f} tokens** per step that proposed. The {new} tokens "
        f"took {steps} forward passes after prefill instead of {new - 1}."
    )


def speedup_reading(
    task: str, k: int, measured: float, low: float, high: float, predicted: float
) -> str:
    """The measured speed-up of the whole request against the theory's, and the verdict."""
    if missing := unmeasured(measured=measured, low=low, high=high):
        return missing
    c = decide(measured, low, high, predicted)
    text = (
        f"On the {task} task the speculative loop ($k = {k}$) ran the request **{measured:.2f}x** "
        f"as fast as plain greedy{_rounds(low, high)}, tokens identical. From the counted "
        f"$\\alpha$ and the step times measured beside it, the model predicts {predicted:.2f}x: "
        f"{c.describe()} (agreement within a factor {c.agree_factor:.2f}, from the rounds' spread "
        "or 10% at the least)."
    )
    if c.outcome == AGREES:
        return text + " " + _verdict(measured)
    if c.outcome == CANNOT_TELL:
        return text + (
            " The miss is larger than the rounds' scatter explains but short of a clear one; "
            "more rounds would decide."
        )
    return text + (
        " The model leaves out the proposer's own time and the Python of each step, and assumes "
        "each guess is right independently of the last."
    )


def early_exit_reading(
    alpha: float, k: int, layers: int, every: int, steps: int, new: int, predicted: float
) -> str:
    """The early-exit draft's counted acceptance and the speed-up the model predicts with its cost:
    ``k`` guesses of ``layers / every`` of a decode step each."""
    if missing := unmeasured(alpha=alpha):
        return missing
    return (
        f"Drafting with the first {layers} of the model's {every} layers and its head, each of "
        f"$k = {k}$ guesses was right with probability $\\alpha = {alpha:.2f}$; the {new} tokens "
        f"took {steps} forward passes after prefill. Each step also pays for {k} guesses of "
        f"{layers / every:.2f} of a decode step, so the model predicts **{predicted:.2f}x**. "
        "SmolLM2 was not trained to exit early (LayerSkip trains with layer dropout and an "
        "early-exit loss so that its shallow layers already predict well): its half-depth guesses "
        "are rarely the full model's, and the draft costs more than it saves."
    )


def _rounds(low: float, high: float) -> str:
    return "" if low == high else f" (the rounds: {low:.2f}x to {high:.2f}x)"


def _verdict(measured: float) -> str:
    if measured >= BREAK_EVEN:
        return "Speculation pays where the output quotes its context."
    if measured > 1 / BREAK_EVEN:
        return (
            "Where little is quoted, each verify step costs more than a decode step and buys "
            "about as much as it costs."
        )
    return "Where little is quoted, each verify step costs more than a decode step: it costs."
