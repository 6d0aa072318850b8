"""Notebook 01, the decode loop (section 9.1): a cached decode step against the length of its
history, measured beside the ceilings that predict its growth.

``history_sweep`` prefills one request per context with ``kvlab.decode``'s cached loop, then
advances the requests one decode step at a time, round-robin, with a read probe and a copy probe of
``kvlab.lab.hardware`` in the same rounds (``kvlab.lab.timing.interleaved``): a neighbour's load
hits every context and both ceilings alike. The step grows with the history because transformers'
``DynamicCache`` reads every cached byte for attention (a read stream) and appends by ``torch.cat``
(a copy: every byte read and written again), so the predicted slope is
``kvlab.theory.decode_step.history_slope``: k / read bandwidth + 2 k / copy rate, where the copy
rate counts bytes read plus written.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import causal_lm, integer, integers
from kvlab.decode import decode_steps
from kvlab.lab.hardware import Ceiling, copy_probe, read_probe
from kvlab.lab.timing import Timing, interleaved
from kvlab.theory.agreement import Comparison, combined_spread, compare
from kvlab.theory.decode_step import history_slope


@dataclass(frozen=True)
class HistorySweep:
    """Step times per context (``timings``, each over ``rounds`` steps of one request), the cache
    bytes per token ``kv_bytes_per_token``, and the two ceilings timed in the same rounds."""

    contexts: tuple[float, ...]
    timings: tuple[Timing, ...]
    kv_bytes_per_token: int
    read: Ceiling
    copy: Ceiling

    @property
    def steps(self) -> list[float]:
        """The fastest step at each context."""
        return [t.min for t in self.timings]

    @property
    def slope_predicted(self) -> float:
        """Seconds per token of history: k / read + 2 k / copy (``history_slope``)."""
        return history_slope(self.kv_bytes_per_token, self.read.rate, self.copy.rate)

    @property
    def slope_measured(self) -> float:
        """The least-squares slope of the fastest step against the context."""
        xs, ys = self.contexts, self.steps
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx

    @property
    def slope_spread(self) -> float:
        """Relative scatter of the measured slope: the spreads of the shortest and longest
        contexts' steps carried through their difference, plus the ceilings' spreads."""
        lo, hi = self.timings[0], self.timings[-1]
        rise = max(hi.min - lo.min, 1e-12)
        carried = (hi.min * hi.spread_above_min + lo.min * lo.spread_above_min) / rise
        return carried + max(self.read.spread, self.copy.spread)

    @property
    def slope(self) -> Comparison:
        return compare(self.slope_measured, self.slope_predicted, self.slope_spread)

    def predicted(self, context: float) -> float:
        """The model's step at ``context``: the shortest context's fastest step plus the predicted
        growth."""
        return self.steps[0] + self.slope_predicted * (context - self.contexts[0])

    @property
    def points(self) -> list[Comparison]:
        """Each context's fastest step against the model, with its own spread, the shortest
        context's and the ceilings'."""
        base = self.timings[0].spread_above_min
        ceilings = max(self.read.spread, self.copy.spread)
        return [
            compare(t.min, self.predicted(s), combined_spread(t.spread_above_min, base, ceilings))
            for s, t in zip(self.contexts, self.timings)
        ]


def history_sweep(model, contexts, rounds: int = 16, seed: int = 0) -> HistorySweep:
    """Prefill one random prompt per context in ``contexts`` (batch 1), then time ``rounds`` decode
    steps of each, round-robin with a read and a copy probe (``stream_bytes()``). A context's x is
    the mean history its timed steps saw."""
    import torch

    causal_lm("model", model)
    contexts = sorted(set(integers("contexts", contexts)))
    if len(contexts) < 2:
        raise ValueError(f"contexts must hold at least two lengths, got {contexts}")
    integer("rounds", rounds, 2)
    g = torch.Generator().manual_seed(seed)
    read, copy = read_probe(), copy_probe()
    steps = {}
    for p in contexts:
        ids = torch.randint(0, model.config.vocab_size, (1, p), generator=g).to(model.device)
        steps[p] = decode_steps("cached", model, ids, rounds + 3)
        next(steps[p])  # prefill and the first token, untimed
    fns = {f"s={p}": (lambda gen=steps[p]: next(gen)) for p in contexts}
    t = interleaved({**fns, "read": read.run, "copy": copy.run}, reps=rounds, warmup=1)
    for gen in steps.values():
        gen.close()
    k = model.shape.kv_bytes_per_token(model.dtype.itemsize)
    return HistorySweep(
        contexts=tuple(p + 2 + (rounds - 1) / 2 for p in contexts),
        timings=tuple(t[f"s={p}"] for p in contexts),
        kv_bytes_per_token=k,
        read=read.ceiling(t["read"]),
        copy=copy.ceiling(t["copy"]),
    )
