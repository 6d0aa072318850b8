"""Notebook 03, GEMV-like decode and the roofline (section 9.3): the skinny products of decode, each
timed beside the two ceilings that predict it.

``roofline_sweep`` times ``[n x K] @ [K x N]`` for each n round-robin with two probes of
``kvlab.lab.hardware``: the read stream (the weight is read once per product, so its time is the
weight's bytes over the read bandwidth) and the matmul probe at the same n with a weight that sits
in cache (the arithmetic at that shape, without the stream). Each ``SkinnyPoint`` holds the fastest
repeat and its spread, the two ceilings measured beside it, and the roofline's prediction from them
(Williams et al. 2009): ``max(bytes / read, FLOPs / matmul rate at n)``. The weight is far beyond
the last-level cache and two copies are used in turn, so every product streams its weight.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import flag, integer, integers
from kvlab.devices import device_and_dtype
from kvlab.lab.gemv import alternating_product
from kvlab.lab.hardware import Ceiling, matmul_probe, read_probe
from kvlab.lab.timing import interleaved
from kvlab.theory.agreement import Comparison, combined_spread, compare
from kvlab.theory.matmul import matmul_bytes, matmul_flops

CPU_NS = (1, 2, 4, 8, 16, 64, 256)
GPU_NS = (1, 4, 16, 64, 256, 1024, 4096)


@dataclass(frozen=True)
class SkinnyPoint:
    """One ``[n x K] @ [K x N]`` against its roofline: ``seconds`` the fastest repeat, ``spread``
    how far a typical repeat sat above it, ``read`` and ``matmul`` the ceilings timed beside it."""

    n: int
    K: int
    N: int
    element_size: int
    seconds: float
    spread: float
    read: Ceiling
    matmul: Ceiling

    @property
    def bytes(self) -> float:
        return matmul_bytes(self.n, self.K, self.N, self.element_size)

    @property
    def flops(self) -> int:
        return matmul_flops(self.n, self.K, self.N)

    @property
    def read_seconds(self) -> float:
        """The bytes term: weight, activation and output over the read bandwidth."""
        return self.bytes / self.read.rate

    @property
    def compute_seconds(self) -> float:
        """The FLOPs term: the product's FLOPs over the matmul rate at this n."""
        return self.flops / self.matmul.rate

    @property
    def predicted_seconds(self) -> float:
        """The roofline: the larger of the two terms (reading and computing fully overlapped)."""
        return max(self.read_seconds, self.compute_seconds)

    @property
    def bound(self) -> str:
        """``"memory"`` where the bytes term is the larger, else ``"compute"``."""
        return "memory" if self.read_seconds >= self.compute_seconds else "compute"

    @property
    def comparison(self) -> Comparison:
        """The measured time against the roofline, with the spread of the measurement and of the
        ceiling that sets the prediction."""
        ceiling = self.read if self.bound == "memory" else self.matmul
        return compare(
            self.seconds, self.predicted_seconds, combined_spread(self.spread, ceiling.spread)
        )

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def default_sizes(gpu: bool) -> dict:
    """On a GPU an 8192 x 8192 half-precision weight (134 MB), n up to 4096; on a CPU a 4096 x 6144
    fp32 weight (101 MB, three times a 32 MiB last-level cache), n up to 256."""
    gpu = flag("gpu", gpu)
    if gpu:
        return dict(K=8192, N=8192, ns=GPU_NS)
    return dict(K=4096, N=6144, ns=CPU_NS)


def roofline_sweep(ns=None, K: int | None = None, N: int | None = None, reps: int = 7):
    """Time ``[n x K] @ [K x N]`` for each n in ``ns`` interleaved with the read probe and the
    matmul probe at n, ``reps`` rounds each (defaults: ``default_sizes``), in kvlab's dtype (fp32
    on a CPU). Returns a list of ``SkinnyPoint`` in increasing n."""
    import torch

    dev, dtype = device_and_dtype()
    sizes = default_sizes(dev.type == "cuda")
    ns = sorted(set(integers("ns", sizes["ns"] if ns is None else ns)))
    K = integer("K", sizes["K"] if K is None else K)
    N = integer("N", sizes["N"] if N is None else N)
    integer("reps", reps)
    g = torch.Generator(device=dev).manual_seed(0)
    weights = [torch.randn(K, N, generator=g, device=dev, dtype=dtype) for _ in range(2)]
    read = read_probe()
    points = []
    for n in ns:
        product = alternating_product(weights, n, g)
        mm = matmul_probe(n)
        t = interleaved({"product": product, "read": read.run, "matmul": mm.run}, reps=reps)
        points.append(
            SkinnyPoint(
                n=n,
                K=K,
                N=N,
                element_size=weights[0].element_size(),
                seconds=t["product"].min,
                spread=t["product"].spread_above_min,
                read=read.ceiling(t["read"]),
                matmul=mm.ceiling(t["matmul"]),
            )
        )
    return points
