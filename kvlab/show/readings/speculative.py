"""Notebook 13, speculative decoding: its readings.

Each decision calls a model: the expected tokens per verify step and the speed-up of
``kvlab.theory.speculative`` (Leviathan et al. 2023), from the acceptance counted on the greedy
output and the step times measured beside it. A measured speed-up is set against its prediction
with three outcomes (``decide``): it *agrees* when it lies within a tolerance of the prediction, the
tolerance widened to the spread the interleaved rounds showed; it *disagrees* beyond that; and we
*cannot tell* when the rounds themselves spread wider than ``CANNOT_TELL_SPREAD``. (The book's
shared three-outcome ``compare`` was being written beside this page; this is its decision, stated
here until it lands.)
"""

from __future__ import annotations

from kvlab.theory.agreement import compare
from kvlab.theory.speculative import expected_tokens

AGREES, DISAGREES, CANNOT_TELL = "agrees", "disagrees", "cannot tell"
MIN_TOLERANCE = 1.2  # a whole request on a shared CPU: a factor 1.2 either way at the least
CANNOT_TELL_SPREAD = 1.6  # rounds whose speed-ups spread wider than this decide nothing
BREAK_EVEN = 1.1  # a speed-up within this factor of 1 neither pays nor costs, in words


def decide(measured: float, low: float, high: float, predicted: float) -> tuple[str, float]:
    """``(outcome, tolerance)``: ``measured`` (its rounds from ``low`` to ``high``) against
    ``predicted``, agreement within a factor max(``MIN_TOLERANCE``, high / low)."""
    spread = high / low
    tolerance = max(MIN_TOLERANCE, spread)
    if spread > CANNOT_TELL_SPREAD:
        return CANNOT_TELL, tolerance
    return (AGREES if compare(measured, predicted, tolerance).agrees else DISAGREES), tolerance


def acceptance_reading(task: str, k: int, alpha: float, empty: float, steps: int, new: int) -> str:
    """What the counted trace says: alpha, the steps with nothing to propose, the expected tokens
    per step, and the verify steps the request needed."""
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
    outcome, tolerance = decide(measured, low, high, predicted)
    text = (
        f"On the {task} task the speculative loop ($k = {k}$) ran the request **{measured:.2f}x** "
        f"as fast as plain greedy{_rounds(low, high)}, tokens identical. From "
        f"the counted $\\alpha$ and the step times measured beside it, the model predicts "
        f"{predicted:.2f}x"
    )
    if outcome == CANNOT_TELL:
        return text + (
            f". The rounds spread by a factor {high / low:.2f}, wider than "
            f"{CANNOT_TELL_SPREAD:g}: this run cannot tell whether the model holds."
        )
    if outcome == AGREES:
        return (
            text
            + f", and the measurement agrees with it within a factor {tolerance:.2f}. "
            + (_verdict(measured))
        )
    return text + (
        f"; the measurement is {measured / predicted:.2f} times that, beyond the factor "
        f"{tolerance:.2f} that counts as agreement. The model leaves out the proposer's own time "
        "and the Python of each step, and assumes each guess is right independently of the last."
    )


def early_exit_reading(
    alpha: float, k: int, layers: int, every: int, steps: int, new: int, predicted: float
) -> str:
    """The early-exit draft's counted acceptance and the speed-up the model predicts with its cost:
    ``k`` guesses of ``layers / every`` of a decode step each."""
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
