"""Notebook 03, GEMV-like decode and the roofline (section 9.3): the counts of a matrix product.

``[n x K] @ [K x N]`` does 2 n K N FLOPs on (K N + n K + n N) w bytes (the weight, the activation
and the output, each moved once). At n = 1 it is a matrix-vector product (GEMV) that reads every
weight for two FLOPs; as n grows the same read serves n rows, its arithmetic intensity rises about
as 2n / w, and past the machine's ridge point the product is a GEMM that the arithmetic units
limit (Williams et al. 2009; the Decode and KV Cache chapter, 2026, section 9.3).

``roofline_time`` is the time the roofline allows a product, ``ridge_intensity`` where its segments
meet; the tolerances say how far notebook 03's measurements may sit from them and still follow them
(``agreement.within_factor``). ``fit_roofline`` fits both segments of a roofline to measured
points, so the knee of a sweep (``kvlab.lab.gemv``) is a property of all its points. Pure Python;
units are SI.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvlab._checks import integer, positive, reals, same_length
from kvlab.theory.agreement import FactorComparison, within_factor


def matmul_flops(n: int, K: int, N: int) -> int:
    """2 n K N: one multiply and one add per weight per activation row."""
    return 2 * integer("n", n) * integer("K", K) * integer("N", N)


def matmul_bytes(n: int, K: int, N: int, element_size: float) -> float:
    """(K N + n K + n N) w: the weight, the activation and the output, each moved once."""
    n, K, N = integer("n", n), integer("K", K), integer("N", N)
    return (K * N + n * K + n * N) * positive("element_size", element_size)


def matmul_intensity(n: int, K: int, N: int, element_size: float) -> float:
    """FLOP per byte of ``[n x K] @ [K x N]``: 2 n K N / ((K N + n K + n N) w).

    About 2n / w while n is small against K and N (the weight dominates the bytes), and at most
    2 K N / ((K + N) w) however large n grows.
    """
    return matmul_flops(n, K, N) / matmul_bytes(n, K, N, element_size)


def batch_at_intensity(intensity: float, K: int, N: int, element_size: float) -> float:
    """The (real) n at which ``matmul_intensity(n, K, N, w)`` equals ``intensity``:
    n = I w K N / (2 K N - I w (K + N)). ``math.inf`` when this K x N never gets there.
    """
    intensity = positive("intensity", intensity)
    K, N, w = integer("K", K), integer("N", N), positive("element_size", element_size)
    denominator = 2 * K * N - intensity * w * (K + N)
    return math.inf if denominator <= 0 else intensity * w * K * N / denominator


def roofline_time(
    n: int, K: int, N: int, element_size: float, bandwidth: float, peak: float
) -> float:
    """The roofline's time for ``[n x K] @ [K x N]``: max(bytes / bandwidth, FLOPs / peak) in
    seconds, with ``matmul_bytes`` and ``matmul_flops`` (Williams et al. 2009). Below the ridge the
    bytes term is the time: a GEMV streams its weight at the bandwidth."""
    return max(
        matmul_bytes(n, K, N, element_size) / positive("bandwidth", bandwidth),
        matmul_flops(n, K, N) / positive("peak", peak),
    )


def ridge_intensity(peak: float, bandwidth: float) -> float:
    """I* = peak / bandwidth, FLOP per byte: where the roofline's two segments meet."""
    return positive("peak", peak) / positive("bandwidth", bandwidth)


# How far a measurement may sit from the roofline and still follow it (the readings of notebook 03):
# a product's time from its roofline time; a fitted knee from the calibrated ridge (a fit through a
# few medians on a shared machine moves by a factor of two); the time growth per doubling of n from
# the roofline's; and the points from the fitted corner (exp of its RMS log error against 1).
ROOFLINE_TOLERANCE = 1.5
RIDGE_TOLERANCE = 2.0
DOUBLING_TOLERANCE = 1.4
CORNER_TOLERANCE = 1.25


def compare_with_roofline(
    seconds: float, n: int, K: int, N: int, element_size: float, bandwidth: float, peak: float
) -> FactorComparison:
    """A product's measured ``seconds`` against its ``roofline_time``, agreeing within
    ``ROOFLINE_TOLERANCE``."""
    seconds = positive("seconds", seconds)
    return within_factor(
        seconds, roofline_time(n, K, N, element_size, bandwidth, peak), ROOFLINE_TOLERANCE
    )


@dataclass(frozen=True)
class RooflineFit:
    """A roofline fitted to measured points: FLOP/s = min(bandwidth x intensity, peak).

    ``bandwidth`` (bytes/s) is fitted to the points left of the knee, ``peak`` (FLOP/s) to those
    right of it; ``split`` is how many points (in increasing intensity) the bandwidth segment
    took. ``knee = peak / bandwidth`` in FLOP/byte; nan when either segment has fewer than two
    points, that is, when the sweep did not reach both regimes.
    """

    bandwidth: float
    peak: float
    split: int
    points: int
    rms_log_error: float

    @property
    def knee(self) -> float:
        if self.split < 2 or self.points - self.split < 2:
            return float("nan")
        return self.peak / self.bandwidth


def fit_roofline(intensities, rates) -> RooflineFit:
    """Fit both segments of a roofline to measured (intensity, FLOP/s) points (section 9.3).

    Least squares in log space over every split of the points, sorted by intensity, into a
    bandwidth-bound left part (log rate = log bandwidth + log intensity) and a compute-bound right
    part (log rate = log peak); the split with the smallest error wins. Nothing is anchored to one
    point, so the knee is a property of the whole sweep, not of its first measurement.
    """
    intensities = reals("intensities", intensities, 0, low_open=True)
    rates = reals("rates", rates, 0, low_open=True)
    if same_length(intensities=intensities, rates=rates) < 2:
        raise ValueError(f"intensities and rates must hold at least two points, got {len(rates)}")
    pts = sorted(zip(intensities, rates))
    lx = [math.log(x) for x, _ in pts]
    ly = [math.log(y) for _, y in pts]
    best = None
    for k in range(len(pts) + 1):
        left = [y - x for x, y in zip(lx[:k], ly[:k])]
        right = ly[k:]
        lb = statistics.fmean(left) if left else -math.inf
        lp = statistics.fmean(right) if right else math.inf
        sse = sum((v - lb) ** 2 for v in left) + sum((v - lp) ** 2 for v in right)
        if best is None or sse < best[0] - 1e-12:
            best = (sse, k, lb, lp)
    sse, k, lb, lp = best
    bandwidth = (
        math.exp(lb) if k else max(y / x for x, y in pts)
    )  # no left part: bound it from above
    peak = math.exp(lp) if k < len(pts) else max(y for _, y in pts)
    return RooflineFit(bandwidth, peak, k, len(pts), math.sqrt(sse / len(pts)))
