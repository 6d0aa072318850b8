"""Notebook 13, speculative decoding: how many tokens a verify step yields, what it costs, and the
best number of guesses.

A proposer guesses k tokens; the model checks them in one forward pass over k + 1 positions and
keeps the longest right prefix plus its own next token. If each guess is right with probability
alpha, independently once the previous ones were right, a step yields (Leviathan et al. 2023, Eq. 1)

    E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)        tokens (k + 1 when alpha = 1)

The step's cost follows section 9.3's roofline: k + 1 positions share one read of the weights, so
it costs about one decode step t(1) until k + 1 nears the ridge batch b*, then grows with the
positions: t(k + 1) = t(1) max(1, (k + 1) / b*). The speed-up over plain decoding is

    S = E t(1) / (t(k + 1) + draft cost per step)

Prompt lookup (Saxena 2023) costs no model call, but finds nothing to propose at some steps (the
``empty`` fraction), which then yield one token for one decode step; an early-exit draft (Elhoushi
et al. 2024) costs k guesses of ``draft_fraction`` of a decode step each. ``acceptance_rate``
estimates alpha from counted steps; ``request_speedup`` adds the prefill that speculation does not
shorten. Pure Python.
"""

from __future__ import annotations

from kvlab._checks import integer, items, positive, real


def expected_tokens(alpha: float, k: int) -> float:
    """E(alpha, k): the expected tokens one verify step of ``k`` guesses yields (Leviathan et al.
    2023), from 1 (alpha = 0) to k + 1 (alpha = 1)."""
    alpha, k = real("alpha", alpha, 0, 1), integer("k", k, 0)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def acceptance_rate(steps) -> float:
    """alpha estimated from counted steps, ``(proposed, accepted)`` pairs: the accepted guesses
    over the guesses checked until the first wrong one (accepted + one per step that rejected).
    Steps that proposed nothing carry no information on alpha. 0.0 when no guess was checked."""
    accepted = rejected = 0
    for i, (proposed, kept) in enumerate(steps):
        integer(f"steps[{i}] proposed", proposed, 0)
        integer(f"steps[{i}] accepted", kept, 0, proposed + 1)
        accepted += kept
        rejected += kept < proposed
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


def empty_fraction(steps) -> float:
    """The fraction of verify steps that had nothing to check (``proposed == 0``)."""
    steps = items("steps", steps, tuple, what="(proposed, accepted) pairs", each="a pair")
    if not steps:
        raise ValueError("steps must hold at least one (proposed, accepted) pair, got none")
    return sum(proposed == 0 for proposed, _ in steps) / len(steps)


def verify_time(t1: float, positions: int, ridge_batch: float) -> float:
    """t(positions) on section 9.3's roofline: one decode step's ``t1`` while the weights' read
    dominates, growing with ``positions`` past the ridge batch ``ridge_batch``."""
    positive("t1", t1), positive("ridge_batch", ridge_batch)
    return t1 * max(1.0, integer("positions", positions) / ridge_batch)


def speedup(
    alpha: float, k: int, t1: float, t_verify: float, draft_s: float = 0.0, empty: float = 0.0
) -> float:
    """S: plain decoding's time per token over the speculative loop's, for acceptance ``alpha``,
    ``k`` guesses, a decode step ``t1``, a verify step ``t_verify`` = t(k + 1), a draft costing
    ``draft_s`` per step, and a fraction ``empty`` of steps that proposed nothing (one token for
    one decode step each)."""
    t1, t_verify = positive("t1", t1), positive("t_verify", t_verify)
    draft_s, empty = real("draft_s", draft_s, 0), real("empty", empty, 0, 1)
    tokens = empty + (1 - empty) * expected_tokens(alpha, k)
    seconds = empty * t1 + (1 - empty) * (t_verify + draft_s)
    return tokens * t1 / seconds


def request_speedup(step_speedup: float, prefill_s: float, t1: float, new_tokens: int) -> float:
    """A whole request's speed-up when its decode steps speed up ``step_speedup`` times: prefill
    (``prefill_s``, which speculation does not shorten) then ``new_tokens - 1`` decode steps of
    ``t1`` (the first token comes out of prefill)."""
    positive("step_speedup", step_speedup), real("prefill_s", prefill_s, 0), positive("t1", t1)
    decode = (integer("new_tokens", new_tokens) - 1) * t1
    return (prefill_s + decode) / (prefill_s + decode / step_speedup)


def best_k(
    alpha: float, ridge_batch: float, draft_fraction: float = 0.0, k_max: int = 16
) -> tuple[int, float]:
    """``(k, S)``: the number of guesses from 1 to ``k_max`` with the largest speed-up on a roofline
    device (``verify_time`` with ridge batch ``ridge_batch``), each guess costing
    ``draft_fraction`` of a decode step (0 for prompt lookup; layers / L for early exit)."""
    real("draft_fraction", draft_fraction, 0)
    scores = [
        (speedup(alpha, k, 1.0, verify_time(1.0, k + 1, ridge_batch), k * draft_fraction), k)
        for k in range(1, integer("k_max", k_max) + 1)
    ]
    best, k = max(scores)
    return k, best
