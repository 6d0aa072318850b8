"""Notebook 07, hybrid attention and SSM state (section 9.6): the recurrence a state-space layer
keeps.

The Decode and KV Cache chapter, 2026, section 9.6, works a two-element recurrence by hand:
h_t = (0.5 h_{t-1,1} + x_t, 0.25 h_{t-1,2} + 2 x_t), y_t = h_t1 + h_t2. ``DiagonalRecurrence``
generalises it to n state elements, each with its own decay, input gain and output weight, and
``step(state, x)`` folds one token into the state: whatever the number of tokens, the state has n
numbers, where an attention layer keeps a key and a value per token. Mamba (Gu and Dao 2023) makes
the decay and the gain depend on the token (``kvlab.cache.mamba``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab._checks import integer


@dataclass(frozen=True)
class DiagonalRecurrence:
    """h_{t,i} = decay_i * h_{t-1,i} + gain_i * x_t, and y_t = sum_i readout_i * h_{t,i} (section
    9.6).

    A linear time-invariant SSM with a diagonal state matrix and a scalar input and output. The
    state has ``len(decay)`` elements whatever the number of tokens folded into it.
    """

    decay: tuple[float, ...]
    gain: tuple[float, ...]
    readout: tuple[float, ...]

    def __post_init__(self):
        n = len(self.decay)
        if n < 1:
            raise ValueError("decay must have at least one element (the state size)")
        for name in ("gain", "readout"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"{name} must have {n} elements, one per state element (len(decay)), "
                    f"got {len(getattr(self, name))}"
                )
        for name in ("decay", "gain", "readout"):
            for v in getattr(self, name):
                if not math.isfinite(v):
                    raise ValueError(f"{name} must hold finite numbers, got {v!r}")

    @property
    def state_size(self) -> int:
        return len(self.decay)

    def initial_state(self) -> tuple[float, ...]:
        return (0.0,) * self.state_size

    def step(self, state, x: float) -> tuple[tuple[float, ...], float]:
        """Fold one token's feature ``x`` into ``state``; returns ``(new_state, y)``.

        The old state is read once and replaced: nothing about earlier tokens is kept besides it.
        """
        if len(state) != self.state_size:
            raise ValueError(f"state must have {self.state_size} elements, got {len(state)}")
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise TypeError(f"x must be a number, got {type(x).__name__}") from None
        if not math.isfinite(x):
            raise ValueError(f"x must be a finite number, got {x!r}")
        new = tuple(a * h + b * x for a, h, b in zip(self.decay, state, self.gain))
        return new, sum(c * h for c, h in zip(self.readout, new))

    def run(self, xs, state=None) -> tuple[list[tuple[float, ...]], list[float]]:
        """``step`` over the features ``xs``; returns every state and every output."""
        state = self.initial_state() if state is None else tuple(state)
        states, ys = [], []
        for x in xs:
            state, y = self.step(state, x)
            states.append(state)
            ys.append(y)
        return states, ys

    def input_map(self, length: int):
        """The fp64 matrix M with h_T = M x for T = ``length`` inputs from a zero state:
        M[i, t] = gain_i * decay_i ** (T - 1 - t). Its rank bounds what the state can recall."""
        import torch

        integer("length", length, 1)
        ages = torch.arange(length - 1, -1, -1, dtype=torch.float64)
        decay = torch.tensor(self.decay, dtype=torch.float64)[:, None]
        return torch.tensor(self.gain, dtype=torch.float64)[:, None] * decay**ages


# The worked example of section 9.6: h_t = (0.5 h_{t-1,1} + x_t, 0.25 h_{t-1,2} + 2 x_t), y_t = h_t1
# + h_t2.
SEED_RECURRENCE = DiagonalRecurrence(decay=(0.5, 0.25), gain=(1.0, 2.0), readout=(1.0, 1.0))
SEED_INPUTS = (2.0, 1.0)
SEED_STATES = ((2.0, 4.0), (2.0, 3.0))  # h1, h2 as the chapter gives them
SEED_OUTPUTS = (6.0, 5.0)  # y1, y2
