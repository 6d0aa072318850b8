"""Notebook 07, hybrid attention and SSM state (section 9.6): what a fixed state can recall.

A state of n numbers that has folded in s tokens cannot give each of them back: with i.i.d. unit-
variance inputs and the best linear readout (least squares), the fraction of token p's variance
that no readout recovers is 1 - ||P e_p||^2, P the projection onto the row space of the
recurrence's input map, and its mean over positions is exactly 1 - rank / s >= 1 - n / s.
``linear_recall_errors`` computes it exactly; ``attention_recall`` is the contrast, a hand-built
attention lookup that keeps every token and recalls each one. ``spread_recurrence`` builds a fair
fixed state to probe with. The recurrence is ``kvlab.cache.recurrence.DiagonalRecurrence``.
"""

from __future__ import annotations

import math

import torch

from kvlab._checks import instance, integer, positive
from kvlab.cache.recurrence import DiagonalRecurrence


def linear_recall_errors(recurrence: DiagonalRecurrence, length: int):
    """Best-case error of reading each token back out of the state after ``length`` tokens (9.6).

    The inputs are i.i.d. with unit variance and the readout is the best linear one (least
    squares), so entry p is the fraction of x_p's variance that no linear readout of h_T recovers:
    1 - ||P e_p||^2, with P the projection onto the row space of ``input_map(length)``. Their mean
    is exactly 1 - rank(M) / T, so at least 1 - n / T for any decays and gains. Returns an fp64
    tensor ``[length]``; position 0 is the oldest token.
    """
    instance("recurrence", recurrence, DiagonalRecurrence)
    integer("length", length, 1)
    m = recurrence.input_map(length)
    # Orthonormal basis of M's row space (SVD, dropping directions fp64 cannot resolve).
    _, s, vh = torch.linalg.svd(m, full_matrices=False)
    basis = vh[s > s.max() * length * torch.finfo(torch.float64).eps] if s.max() > 0 else vh[:0]
    return (1.0 - (basis**2).sum(0)).clamp(0.0, 1.0)


def linear_recall_error(
    recurrence: DiagonalRecurrence, length: int, position: int | None = None
) -> float:
    """``linear_recall_errors`` at one ``position``, or their mean over all positions with
    ``None``."""
    if position is not None:
        integer("position", position, 0)
        integer("length", length, 1)
        if position >= length:
            raise ValueError(f"position must be in [0, length={length}), got {position}")
    errors = linear_recall_errors(recurrence, length)
    return float(errors.mean() if position is None else errors[position])


def spread_recurrence(
    state_size: int, fastest: float = 0.5, slowest: float = 0.99
) -> DiagonalRecurrence:
    """A recurrence with ``state_size`` decays spread geometrically between ``fastest`` and
    ``slowest`` (unit gains and readout): a fair fixed state for the recall probe of section 9.6."""
    integer("state_size", state_size, 1)
    for name, value in (("fastest", fastest), ("slowest", slowest)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"{name} must be a number in (0, 1), got {type(value).__name__} {value!r}"
            )
    if not 0 < fastest <= slowest < 1:
        raise ValueError(
            f"need 0 < fastest <= slowest < 1, got fastest={fastest}, slowest={slowest}"
        )
    if state_size == 1:
        decays = (slowest,)
    else:
        ratio = (math.log(slowest) / math.log(fastest)) ** (1 / (state_size - 1))
        decays = tuple(math.exp(math.log(fastest) * ratio**i) for i in range(state_size))
    return DiagonalRecurrence(decays, (1.0,) * state_size, (1.0,) * state_size)


def attention_recall(values, position: int | None = None, sharpness: float = 50.0):
    """A hand-built attention lookup: one-hot position keys, the query of ``position`` scaled by
    ``sharpness``; returns softmax(q K^T) V for ``values`` ``[..., length]`` (section 9.6).

    ``position=None`` asks for every position at once and returns ``[..., length]``."""
    if (
        not isinstance(values, torch.Tensor)
        or not values.dtype.is_floating_point
        or values.dim() < 1
    ):
        raise TypeError(
            f"values must be a floating torch.Tensor [..., length], got {type(values).__name__}"
        )
    if not bool(torch.isfinite(values).all()):
        raise ValueError("values holds NaN or infinite numbers")
    positive("sharpness", sharpness)
    length = values.shape[-1]
    if position is not None:
        integer("position", position, 0)
        if position >= length:
            raise ValueError(f"position must be in [0, length={length}), got {position}")
    keys = torch.eye(length, dtype=values.dtype, device=values.device)
    queries = keys if position is None else keys[position : position + 1]
    out = values @ torch.softmax(sharpness * queries @ keys.T, dim=-1).T
    return out if position is None else out[..., 0]
