"""Notebook 08, long-context variants (section 9.7): the rules that turn quality measurements into
verdicts.

Pure Python. Each reading of page 08 that decides between outcomes calls one of these, and its test
puts numbers on both sides of the boundary computed with the same function.

- ``first_eviction``: the first position whose prediction a bounded cache can change;
- ``unseen_distances``: whether keys at their original positions meet a query at a distance the
  model never trained on; ``same_up_to_rounding``: whether two runs that RoPE says are equal agree
  to fp32 rounding;
- ``uniform_share``: the share of attention the first tokens would get if every query spread its
  attention evenly over the keys it sees, the baseline a sink is measured against;
- ``sink_threshold`` and ``sink_heads``: the page's one definition of an attention sink (Xiao et al.
  2024). A head is a sink head when its queries put, on average, at least ``SINK_SHARE`` of their
  attention on the first token (the threshold Gu et al. 2025 use, 0.3) and at least ``SINK_FACTOR``
  times what uniform attention would give it (which matters only on very short passages);
- ``outlier_count`` and ``keys_have_outliers``: an outlier channel is one whose RMS is at least
  ``OUTLIER_FACTOR`` times its head's median channel (the pattern Liu et al. 2024 and Hooper et al.
  2024 report in keys, not values);
- ``block_means`` and ``paired_spread``: a difference between two caches measured on the same text,
  with the 95% Student-t interval of its mean over independent pieces (text windows, or blocks of
  positions). ``Spread.resolved`` is the page's test of "larger than the noise".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab._checks import integer, positive, real, reals

SINK_SHARE = 0.3
SINK_FACTOR = 4.0
OUTLIER_FACTOR = 4.0

# Two-sided 95% quantiles of Student's t, by degrees of freedom 1..30.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
_Z95 = 1.959964


def uniform_share(n: int, first: int = 1, skip: int = 16) -> float:
    """The mean share of attention on the first ``first`` tokens if every query at position t (from
    ``skip`` to n - 1) spread its attention evenly over its t + 1 keys: the mean of min(1, first /
    (t + 1)).
    """
    integer("n", n, 1)
    integer("first", first, 1)
    integer("skip", skip, 0, n)  # at least one query after the skipped ones
    return sum(min(1.0, first / (t + 1)) for t in range(skip, n)) / (n - skip)


def first_eviction(num_sink: int, window: int) -> int:
    """The first position t whose prediction can differ from the full cache's when a cache keeps the
    first ``num_sink`` tokens and the ``window`` newest: the query at t sees t + 1 tokens, one more
    than the cache holds once t = num_sink + window."""
    integer("num_sink", num_sink, 0)
    integer("window", window, 1)
    return num_sink + window


# largest log-probability difference of two fp32 runs that are equal in exact arithmetic
ROUNDING_GAP = 1e-3


def unseen_distances(tokens: int, context: int) -> bool:
    """True when a stream of ``tokens`` holds a query-key distance the model never trained on: with
    keys at their original positions the largest distance is tokens - 1, and training on windows of
    ``context`` tokens covers distances up to context - 1."""
    integer("tokens", tokens, 1)
    integer("context", context, 1)
    return tokens - 1 > context - 1


def same_up_to_rounding(gap: float) -> bool:
    """True when the largest log-probability difference ``gap`` of two runs is fp32 rounding
    (at most ``ROUNDING_GAP``): what RoPE's relative positions predict for two conventions that keep
    every distance."""
    return abs(real("gap", gap)) <= ROUNDING_GAP


def sink_threshold(uniform: float) -> float:
    """The smallest mean share on the first token that makes a head a sink head, given the share
    ``uniform`` that uniform attention would give it: max(SINK_SHARE, SINK_FACTOR x uniform)."""
    positive("uniform", uniform)
    return max(SINK_SHARE, SINK_FACTOR * uniform)


def sink_heads(share: Sequence[Sequence[float]], uniform: float) -> list[tuple[int, int, float]]:
    """``(layer, head, share)`` of every sink head in ``share[layer][head]`` (mean share of
    attention on the first token), by the page's one definition: ``share >=
    sink_threshold(uniform)``."""
    threshold = sink_threshold(uniform)
    share = [reals(f"share[{layer}]", row, 0) for layer, row in enumerate(share)]
    return [
        (layer, head, float(s))
        for layer, row in enumerate(share)
        for head, s in enumerate(row)
        if s >= threshold
    ]


def outlier_count(ratios: Sequence[float]) -> int:
    """How many channels have an RMS at least ``OUTLIER_FACTOR`` times their head's median
    (``ratios``: each channel's RMS over its head's median, flattened)."""
    ratios = reals("ratios", ratios, 0, empty=True)
    return sum(1 for r in ratios if r >= OUTLIER_FACTOR)


def keys_have_outliers(key_ratios: Sequence[float], value_ratios: Sequence[float]) -> bool:
    """True when the keys have outlier channels that the values do not: more key channels than value
    channels at ``OUTLIER_FACTOR`` times their median or more. KIVI's case for per-channel key
    groups.
    """
    key_ratios, value_ratios = (
        reals("key_ratios", key_ratios, 0),
        reals("value_ratios", value_ratios, 0),
    )
    return outlier_count(key_ratios) > outlier_count(value_ratios)


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2), within
    0.001 of the exact value)."""
    integer("df", df, 1)
    if df <= len(_T95):
        return _T95[df - 1]
    z = _Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Spread:
    """The mean of paired differences b - a over ``n`` independent pieces, and its 95% interval."""

    mean: float
    half_width: float  # t95(n - 1) x standard deviation / sqrt(n)
    n: int
    smallest: float
    largest: float

    @property
    def resolved(self) -> bool:
        """True when the interval excludes zero: the difference is larger than its spread."""
        return abs(self.mean) > self.half_width

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def paired_spread(a: Sequence[float], b: Sequence[float]) -> Spread:
    """The differences ``b[i] - a[i]`` of two measurements on the same pieces, as a ``Spread``."""
    if len(a) != len(b):
        raise ValueError(f"a and b must pair up piece by piece, got {len(a)} and {len(b)} values")
    if len(a) < 2:
        raise ValueError(f"a spread needs at least 2 pieces, got {len(a)}")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError("a and b must be finite")
    n = len(diffs)
    half = t95(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return Spread(statistics.fmean(diffs), half, n, min(diffs), max(diffs))


def block_means(values: Sequence[float], block: int) -> list[float]:
    """Means of consecutive blocks of ``block`` values (a last partial block is dropped):
    neighbouring positions of one text are not independent, blocks of them nearly are."""
    integer("block", block, 1)
    values = reals("values", values, empty=True)
    return [
        statistics.fmean(values[i : i + block]) for i in range(0, len(values) - block + 1, block)
    ]
