"""Notebook 10, the memory wall: the unified KV footprint model and the eight design rules.

The KV Cache Memory Wall, 2026, puts every mitigation of the cache's size into one footprint, Eq.
(4): quantization sets the stored width, eviction the retained fraction, paging the wasted fraction,
prefix caching the sharing factor and tiering the share kept in HBM (section 2.2). Its decision
procedure (section 6.2, Algorithm 1) then reads the regime of a deployment off the crossovers of
``kvlab.theory.roofline`` and names, rule by rule, what to switch on. ``kv_bound_band``,
``kv_bound_regime_exists`` and ``ridge_admitted`` are the yes-or-no questions the readings of
notebooks 03 and 10 ask of those crossovers.

Pure Python, decimal SI units, the notation of ``kvlab.theory.roofline``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab._checks import flag, integer, one_of, positive, real
from kvlab.theory.roofline import (
    admitted,
    capacity_context,
    compression_speedup,
    compute_bound_context,
    crossover_context,
    effective_bandwidth,
    free_beside_weights,
    kv_bytes_per_token,
    max_batch,
    retained_tokens,
    ridge_batch,
)
from kvlab.theory.shapes import ModelShape, model_shape
from kvlab.theory.specs import Accelerator, accelerator

QUALITY_BUDGETS = ("none", "small", "moderate")


# --------------------------------------------------------------------------- the regimes' two
# questions


def kv_bound_band(shape: ModelShape, hw, w_p: float = 2) -> float:
    """s_cap / s* = (M - P w_p) / (P w_p) (KV Cache Memory Wall, 2026, sections 3.5 and 5.1), the
    same at every batch and cache width: a one-device KV-bound regime exists only where it exceeds
    1, i.e. where the device holds more than twice the weights. 0 when the weights alone do not
    fit."""
    shape = model_shape(shape)
    return max(0.0, free_beside_weights(shape, hw, w_p) / (shape.params * positive("w_p", w_p)))


def kv_bound_regime_exists(shape: ModelShape, hw, w_p: float = 2) -> bool:
    """Whether a one-device KV-bound regime exists: ``kv_bound_band`` above 1, s_cap beyond s*."""
    return kv_bound_band(shape, hw, w_p) > 1


def ridge_admitted(shape: ModelShape, hw, context: int, w_p: float = 2, w_kv: float = 2) -> bool:
    """Whether the device admits the ridge batch (``roofline.ridge_batch``, rounded) of
    ``context``-token sequences beside the weights (``roofline.max_batch``): only then can batching
    take the weight products to the compute roof before capacity stops it (Decode and KV Cache
    chapter, 2026, 9.3).
    """
    return max_batch(shape, hw, context, w_p, w_kv) >= round(ridge_batch(hw, w_p))


def map_regime(
    shape: ModelShape, hw, context: int, batch: int, w_p: float = 2, w_kv: float = 2
) -> str:
    """Where a decode step of ``batch`` sequences of ``context`` tokens sits on the regime map:

    - ``"beyond capacity"``: their cache does not fit beside the weights (s > s_cap(b));
    - ``"compute-bound"``: its arithmetic intensity reaches the ridge (s <= s_c(b), only above the
      ridge batch), whichever of weights or cache moves more bytes;
    - ``"KV-bound"``: the cache moves at least as many bytes as the weights (s >= s*(b));
    - ``"weight-bound"``: otherwise.
    """
    context, batch = integer("context", context), integer("batch", batch)
    s_cap = capacity_context(shape, hw, w_p, w_kv, batch=batch)
    if s_cap is None or context > s_cap:
        return "beyond capacity"
    if context <= compute_bound_context(shape, hw, batch, w_p, w_kv):
        return "compute-bound"
    return "KV-bound" if context >= crossover_context(shape, batch, w_p, w_kv) else "weight-bound"


# --------------------------------------------------------------------------- footprint


@dataclass(frozen=True)
class Footprint:
    """KV bytes stored (``total``), split into those resident in HBM and those on other tiers."""

    total: float
    hbm: float

    @property
    def offloaded(self) -> float:
        return self.total - self.hbm


def footprint(
    shape: ModelShape,
    context: int,
    batch: int,
    w_q: float = 2,
    retention: float = 1.0,
    fragmentation: float = 0.0,
    sharing: float = 1.0,
    hbm_fraction: float = 1.0,
) -> Footprint:
    """The unified KV footprint model (KV Cache Memory Wall, 2026, Eq. 4, section 2.2):

        M_kv = b s r (2 L n_kv d_h w_q) / ((1 - phi) sigma),   M_hbm = lambda M_kv

    Each mitigation domain sets one factor: quantization the stored width ``w_q`` (bytes per
    element, 0.25 for 2-bit), eviction the ``retention`` r in (0, 1], paging the ``fragmentation``
    phi in [0, 1) (the fraction of allocated cache memory wasted), prefix caching the ``sharing``
    sigma >= 1, and tiering the HBM-resident fraction ``hbm_fraction`` lambda in [0, 1]. Eq. (4)
    itself is not in the seed's text; phi as a wasted fraction is this module's reading of section
    2.5.
    """
    w_q = positive("w_q", w_q)
    batch = integer("batch", batch)
    tokens = retained_tokens(shape, context)
    r = real("retention", retention, 0, 1, low_open=True)
    phi = real("fragmentation", fragmentation, 0, 1, high_open=True)
    sigma = real("sharing", sharing, 1, math.inf, high_open=True)
    lam = real("hbm_fraction", hbm_fraction, 0, 1)
    total = batch * tokens * kv_bytes_per_token(shape, w_q) * r / ((1 - phi) * sigma)
    return Footprint(total=total, hbm=lam * total)


# --------------------------------------------------------------------------- design rules


@dataclass(frozen=True)
class Recommendation:
    """One step of the decision procedure: the rule (1-8 of KV Cache Memory Wall, 2026, section
    6.2), the domain it concerns, the advice (which may be to leave the domain alone), and the
    numbers behind it.
    """

    rule: int
    domain: str
    advice: str
    reason: str


def _regime(context: int, s_star: float, s_cap: float | None) -> str:
    if s_cap is None or context > s_cap:
        return "beyond capacity"
    return "weight-bound" if context < s_star else "KV-bound"


def recommend(
    shape: ModelShape,
    hw,
    context: int,
    batch: int,
    quality_budget: str,
    retrieval_critical: bool = False,
) -> list[Recommendation]:
    """The eight design rules of KV Cache Memory Wall, 2026, section 6.2, applied in order (its
    Algorithm 1).

    ``quality_budget`` is the accuracy the deployment may give up for speed:
      - ``"none"``: lossless domains only (paging, prefix caching, tiering, placement);
      - ``"small"``: also KV quantization to 8 or 4 bits, reported near-free (section 4.3);
      - ``"moderate"``: also 2-bit KV with structure-aware layouts and eviction down to r = 0.5,
        each validated on position-sensitive (needle-style) probes.
    ``retrieval_critical`` traffic is never evicted (rule 5). BF16 weights and cache are assumed.
    Returns one ``Recommendation`` per rule that applies to this (shape, device, s, b).
    """
    shape, hw = model_shape(shape), accelerator(hw)
    one_of("quality_budget", quality_budget, QUALITY_BUDGETS)
    flag("retrieval_critical", retrieval_critical)  # "no" would count as critical
    context, batch = integer("context", context), integer("batch", batch)
    s_star = crossover_context(shape, batch)
    s_cap = capacity_context(shape, hw, batch=batch)
    regime = _regime(context, s_star, s_cap)
    cap = "none (the weights alone do not fit)" if s_cap is None else f"{s_cap:,.0f} tokens"
    recs = [
        Recommendation(
            1,
            "regime",
            f"{regime}: choose techniques for this regime",
            f"on {hw.name}: s = {context:,}, s*({batch}) = {s_star:,.0f}, s_cap = {cap}",
        ),
        Recommendation(
            2, "paging", "enable always", "lossless; raises the feasible batch, not decode speed"
        ),
        Recommendation(
            2,
            "prefix caching",
            "enable always",
            "lossless; divides stored bytes by sigma and skips prefill of shared tokens",
        ),
    ]
    byte_factor = 1.0
    if context < s_star:
        recs.append(
            Recommendation(
                3,
                "weights and batching",
                "do not compress the KV cache for speed at this batch; spend effort on prefill,"
                " batching and weight precision",
                "s < s*: even 4-bit KV (c = 4) would give only"
                f" {compression_speedup(4, context, s_star):.2f}x at b = {batch};"
                f" {_rule3_scope(shape, hw, context)}",
            )
        )
    else:
        byte_factor = _quantize(recs, quality_budget, context, s_star)
        byte_factor = _evict(recs, quality_budget, retrieval_critical, context, s_star, byte_factor)
    if regime == "beyond capacity":
        recs.append(_tier(shape, hw, batch, context, byte_factor))
    if hw.dies > 1:
        gain = effective_bandwidth(hw, "striped") / effective_bandwidth(hw, "pinned")
        recs.append(
            Recommendation(
                7,
                "placement",
                "keep KV reads striped across dies (default memory modes interleave "
                "addresses across all stacks; partitioned modes pin)",
                f"{hw.dies} dies: striping reads {gain:.1f}x faster than pinning (Eq. 11)",
            )
        )
    recs.append(
        Recommendation(
            8,
            "re-evaluation",
            "recompute s*, s_cap and the ridge on every model, hardware or workload change",
            "s* moves as 1/b with batch; s_cap and the ridge move with the device",
        )
    )
    return recs


def _rule3_scope(shape: ModelShape, hw: Accelerator, context: int) -> str:
    """Where capacity binds, compression admits a larger batch at about the same step floor."""
    bf16, int4 = max_batch(shape, hw, context), max_batch(shape, hw, context, w_kv=0.5)
    if int4 <= bf16 or int4 == 0:
        return f"capacity admits {bf16} sequences in bf16 and no more with 4-bit KV"
    return (
        f"but capacity admits {bf16} sequence{'s' * (bf16 != 1)} in bf16 and {int4} with 4-bit KV: "
        "compress if the batch is capacity-bound"
    )


def _quantize(recs: list, budget: str, context: int, s_star: float) -> float:
    """Rule 4: above s*, quantize first, as far as the quality budget allows. Returns the byte
    factor."""
    if budget == "none":
        recs.append(
            Recommendation(
                4,
                "quantization",
                "do not quantize: the quality budget allows no loss",
                f"4-bit KV would give {compression_speedup(4, context, s_star):.2f}x",
            )
        )
        return 1.0
    if budget == "small":
        c, what = 4, "4-bit KV, per-channel keys, outliers isolated"
    else:
        c, what = (
            8,
            "2-bit KV with a structure-aware layout, validated on position-sensitive probes",
        )
    recs.append(
        Recommendation(
            4,
            "quantization",
            what,
            f"s >= s*: c = {c} gives {compression_speedup(c, context, s_star):.2f}x (Eq. 14)",
        )
    )
    return float(c)


def _evict(
    recs: list, budget: str, retrieval_critical: bool, context: int, s_star: float, c: float
) -> float:
    """Rule 5: evict only when the workload tolerates it, never below r = 0.5 without a needle
    test."""
    if retrieval_critical:
        recs.append(
            Recommendation(
                5, "eviction", "do not evict", "retrieval-critical traffic loses evicted positions"
            )
        )
        return c
    if budget != "moderate":
        recs.append(
            Recommendation(
                5, "eviction", "do not evict", f"quality budget {budget!r} excludes eviction"
            )
        )
        return c
    joint = compression_speedup(2 * c, context, s_star)
    recs.append(
        Recommendation(
            5,
            "eviction",
            "retain r >= 0.5; run a needle-style evaluation before going lower",
            f"joint byte factor {2 * c:g} gives {joint:.2f}x",
        )
    )
    return 2 * c


def _tier(
    shape: ModelShape, hw: Accelerator, batch: int, context: int, byte_factor: float
) -> Recommendation:
    """Rule 6: beyond s_cap, tier or shard, saying what is missing with and without compression."""
    reason = f"BF16 {admitted(shape, hw, batch, context)}"
    if byte_factor > 1:
        compressed = admitted(shape, hw, batch, context, w_kv=2 / byte_factor)
        reason += f"; with KV bytes divided by {byte_factor:g} it {compressed}"
    return Recommendation(
        6,
        "tiering",
        "tier or shard; codecs on every cross-link transfer; never read per-step KV from a remote"
        " tier",
        reason,
    )
