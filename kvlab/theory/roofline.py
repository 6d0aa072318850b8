"""Notebook 03, GEMV-like decode and the roofline (section 9.3), and notebook 10, the memory wall:
the analytical model of one decode step.

Bytes and FLOPs of one step, its roofline floor, admission (do weights plus cache fit), arithmetic
intensity and the ridge, the traffic and capacity crossovers s* and s_cap, the largest admitted
batch, compression speedup, die placement, prefill time with a prefix hit rate and transfer time.
The footprint model and the design rules built on these are in ``kvlab.theory.memory_wall``;
recompute against swap, per token, in ``kvlab.theory.preemption``.

Sources: the Decode and KV Cache chapter, 2026 (the decode-step floor of Table 9.1, section 9.7's
windows) and the KV Cache Memory Wall, 2026 (Eqs. (1) and (5)-(14), Propositions 3.1-3.6,
Corollary 3.8, appendices A and B); the roofline itself is Williams et al. 2009.

Pure Python: importable without torch.

Units are decimal SI throughout, as the memory-wall paper (appendix C.2) prescribes: bytes, seconds,
FLOP and tokens; k = 1e3, M = 1e6, GB = 1e9 bytes, TB/s = 1e12 bytes/s; 128k tokens means 128,000
tokens, not 2**17. (The chapter's Table 9.3 prints binary GiB; divide by 2**30 to compare with it.)

Notation (the memory-wall paper's Table 10): P parameters, w_p and w_kv bytes per weight and cache
element, L layers, n_q and n_kv query and key-value heads, d_h head dimension, g = n_q / n_kv, s
context (cached tokens per sequence), b batch (sequences decoded together), beta bandwidth in
bytes/s. Two per-token constants recur:

    K = 2 L n_kv d_h w_kv     cache bytes per token (Eq. 1; MLA: L (d_c + d_r) w_kv)
    A = 4 L n_q d_h           attention FLOP per cached token per sequence (Eq. 5, Table 8)

A shape with a sliding ``window`` retains only min(s, window) tokens: its cache bytes, attention
FLOPs and footprint stop growing at the window (the chapter's section 9.7). Everything else follows
the memory-wall paper, whose model assumes a full cache.

``hw`` is an ``Accelerator`` from ``kvlab.theory.specs.SPECS`` or its key (``"b200"``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvlab._checks import integer, one_of, positive, real
from kvlab.theory.shapes import ModelShape, model_shape
from kvlab.theory.specs import accelerator
from kvlab.theory.units import si

PLACEMENTS = ("striped", "pinned")


# --------------------------------------------------------------------------- per-token constants


def retained_tokens(shape: ModelShape, context: int) -> int:
    """Tokens a sequence keeps in its cache: s, or min(s, W) for a sliding window W (Decode and KV
    Cache chapter, 2026, 9.7)."""
    shape, context = model_shape(shape), integer("context", context)
    return min(context, shape.window) if shape.window else context


def kv_bytes_per_token(shape: ModelShape, w_kv: float = 2) -> float:
    """K = 2 L n_kv d_h w_kv, cache bytes per token across all layers (KV Cache Memory Wall, 2026,
    Eq. 1)."""
    return model_shape(shape).kv_bytes_per_token(positive("w_kv", w_kv))


def attention_flops_per_token(shape: ModelShape) -> float:
    """A = 4 L n_q d_h: a score and a weighted sum per query head per cached token (KV Cache Memory
    Wall, 2026, Eq. 5)."""
    shape = model_shape(shape)
    return 4 * shape.layers * shape.q_heads * shape.head_dim


# --------------------------------------------------------------------------- one decode step


@dataclass(frozen=True)
class StepBytes:
    """HBM bytes one decode step reads: every weight once, every sequence's cache once."""

    weights: float
    kv: float

    @property
    def total(self) -> float:
        return self.weights + self.kv


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one decode step: the weight matrix-vector products and the attention
    contractions."""

    weights: float
    attention: float

    @property
    def total(self) -> float:
        return self.weights + self.attention


def step_bytes(
    shape: ModelShape, batch: int, context: int, w_p: float = 2, w_kv: float = 2
) -> StepBytes:
    """Bytes of one decode step, B(s, b) = P w_p + b s K (KV Cache Memory Wall, 2026, Eq. 6; Decode
    and KV Cache chapter, 2026, 9.3).

    Returns ``StepBytes`` with ``.weights`` (P w_p), ``.kv`` (b s K) and ``.total``.
    """
    batch = integer("batch", batch)
    tokens = retained_tokens(shape, context)
    weights = shape.params * positive("w_p", w_p)
    return StepBytes(weights=weights, kv=batch * tokens * kv_bytes_per_token(shape, w_kv))


def step_flops(shape: ModelShape, batch: int, context: int) -> StepFlops:
    """FLOPs of one decode step, F(s, b) = b (2P + A s) with A = 4 L n_q d_h (KV Cache Memory Wall,
    2026, Eq. 5).

    Softmax is left out as lower order (a fraction 3 / (4 d_h) of the attention term, appendix A.1).
    Returns ``StepFlops`` with ``.weights`` (2 P b), ``.attention`` (b A s) and ``.total``.
    """
    batch = integer("batch", batch)
    tokens = retained_tokens(shape, context)
    return StepFlops(
        weights=2 * shape.params * batch,
        attention=batch * attention_flops_per_token(shape) * tokens,
    )


def step_time_floor(
    shape: ModelShape,
    hw,
    batch: int,
    context: int,
    w_p: float = 2,
    w_kv: float = 2,
    placement: str = "striped",
) -> float:
    """Roofline floor of one decode step in seconds (KV Cache Memory Wall, 2026, appendix C.4 (ii);
    Decode and KV Cache chapter, 2026, 9.3):

        T_step >= max(B(s, b) / beta_eff, F(s, b) / peak)

    Decode sits far below the ridge, so the byte term is the floor in every case the seeds work.
    """
    hw = accelerator(hw)
    read = step_bytes(shape, batch, context, w_p, w_kv).total / effective_bandwidth(hw, placement)
    compute = step_flops(shape, batch, context).total / hw.bf16_flops
    return max(read, compute)


# A measured step within this factor of its floor counts as bound by the bytes it moves (notebook
# 03's readings, through ``agreement.within_factor``); the floor leaves out dispatch and
# small kernels.
STEP_FLOOR_TOLERANCE = 2.0


@dataclass(frozen=True)
class Admission:
    """Whether weights plus cache fit in HBM. Truthy when they fit; ``str`` says by how much."""

    weights: float
    kv: float
    available: float

    @property
    def needed(self) -> float:
        return self.weights + self.kv

    @property
    def shortfall(self) -> float:
        """Bytes missing for the configuration to fit (0 when it fits)."""
        return max(0.0, self.needed - self.available)

    def __bool__(self) -> bool:
        return self.needed <= self.available

    def __str__(self) -> str:
        """``needs 7.66 MB, 16.6 MB available (8.94 MB to spare)``: decimal units chosen per
        figure."""
        head = f"needs {si(self.needed, 'B')}, {si(self.available, 'B')} available"
        if self:
            return f"{head} ({si(self.available - self.needed, 'B')} to spare)"
        return f"{head}: does not fit by {si(self.shortfall, 'B')} ({self.shortfall:,.0f} bytes)"


def admitted(
    shape: ModelShape,
    hw,
    batch: int,
    context: int,
    w_p: float = 2,
    w_kv: float = 2,
    devices: int = 1,
) -> Admission:
    """Do P w_p + b s K bytes fit in the HBM of ``devices`` accelerators? (Decode and KV Cache
    chapter, 2026, 9.3; KV Cache Memory Wall, 2026, Table 5)"""
    hw = accelerator(hw)
    devices = integer("devices", devices)
    need = step_bytes(shape, batch, context, w_p, w_kv)
    return Admission(weights=need.weights, kv=need.kv, available=devices * hw.hbm_bytes)


@dataclass(frozen=True)
class FloorRow:
    """One row of the Decode and KV Cache chapter's Table 9.1; ``step_time`` and ``tokens_per_s``
    are None when not admitted."""

    batch: int
    context: int
    weight_bytes: float
    kv_bytes: float
    admission: Admission
    step_time: float | None
    tokens_per_s: float | None


def decode_floor_table(
    shape: ModelShape,
    hw,
    cases,
    params: float | None = None,
    w_p: float = 2,
    w_kv: float = 2,
    placement: str = "striped",
) -> list[FloorRow]:
    """Rows of the Decode and KV Cache chapter's Table 9.1 for ``cases``, an iterable of (B
    sequences, T tokens each).

    Each row carries weight bytes P w_p, KV bytes B T K, the step floor B(T, B) / beta, and the
    ideal rate B / T_step over all sequences, or None for both where the row is not admitted.
    ``params`` overrides ``shape.params`` (Table 9.1 uses 8e9 for its 8B model).
    """
    shape = model_shape(shape)
    if params is not None:
        shape = dataclasses.replace(shape, params=positive("params", params))
    rows = []
    for batch, context in cases:
        fit = admitted(shape, hw, batch, context, w_p, w_kv)
        step = step_time_floor(shape, hw, batch, context, w_p, w_kv, placement) if fit else None
        rows.append(
            FloorRow(batch, context, fit.weights, fit.kv, fit, step, batch / step if step else None)
        )
    return rows


# --------------------------------------------------------------------------- intensity and ridge


def arithmetic_intensity(
    shape: ModelShape, context: int, batch: int, w_p: float = 2, w_kv: float = 2
) -> float:
    """AI(s, b) = F(s, b) / B(s, b) = b (2P + A s) / (P w_p + b s K), FLOP per byte (KV Cache Memory
    Wall, 2026, Eq. 7)."""
    return (
        step_flops(shape, batch, context).total / step_bytes(shape, batch, context, w_p, w_kv).total
    )


def kv_intensity_floor(shape: ModelShape, w_kv: float = 2) -> float:
    """lim_{s -> inf} AI(s, b) = A / K = 2g / w_kv, whatever the batch (KV Cache Memory Wall, 2026,
    Prop. 3.1(ii), Eq. 8)."""
    return attention_flops_per_token(shape) / kv_bytes_per_token(shape, w_kv)


def batch_intensity_ceiling(
    shape: ModelShape, context: int, w_p: float = 2, w_kv: float = 2
) -> float:
    """sup_b AI(s, b) = A / K + (2 / w_p) s*(1) / s, the most batching can give at context s
    (KV Cache Memory Wall, 2026, Prop. 3.1(iv)). Dense weights only: a window is not applied here.
    """
    context = integer("context", context)
    s_star = shape.params * positive("w_p", w_p) / kv_bytes_per_token(shape, w_kv)
    return kv_intensity_floor(shape, w_kv) + (2 / w_p) * s_star / context


def fixed_point_batch(shape: ModelShape, w_p: float = 2, w_kv: float = 2) -> float:
    """b-dagger = g w_p / w_kv (= A w_p / (2K)): the batch at which AI(s, b) does not depend on s
    (KV Cache Memory Wall, 2026, Eq. 9, Prop. 3.1(iii)). Below it AI rises with s, above it AI
    falls.
    """
    return kv_intensity_floor(shape, w_kv) * positive("w_p", w_p) / 2


def ridge_point(hw) -> float:
    """I* = peak dense bf16 FLOP/s over aggregate HBM bytes/s (KV Cache Memory Wall, 2026, Table 3,
    appendix B.4)."""
    return accelerator(hw).ridge_point


def ridge_batch(hw, w_p: float = 2) -> float:
    """b = I* w_p / 2, the batch at which the weight products alone reach the ridge (KV Cache Memory
    Wall, 2026, section 1.1 and Prop. 3.3(iii); Decode and KV Cache chapter, 2026, 9.3).
    """
    return ridge_point(hw) * positive("w_p", w_p) / 2


# --------------------------------------------------------------------------- crossovers


def crossover_context(shape: ModelShape, batch: int = 1, w_p: float = 2, w_kv: float = 2) -> float:
    """s*(b) = P w_p / (b K): the context above which KV bytes exceed weight bytes per step
    (KV Cache Memory Wall, 2026, Eq. 12, Table 4, appendix B.3). s*(b) = s*(1) / b (Prop. 3.3(ii)).

    For a sliding-window shape whose window is shorter than s*(b) the cache never catches up:
    returns ``math.inf``.
    """
    batch = integer("batch", batch)
    s_star = shape.params * positive("w_p", w_p) / (batch * kv_bytes_per_token(shape, w_kv))
    return math.inf if shape.window and s_star > shape.window else s_star


def capacity_context(
    shape: ModelShape, hw, w_p: float = 2, w_kv: float = 2, batch: int = 1, devices: int = 1
) -> float | None:
    """s_cap = (M - P w_p) / (b K): the longest context whose cache fits beside the weights (KV
    Cache Memory Wall, 2026, Eq. 13, appendix B.3). None where the weights alone do not fit (M <= P
    w_p).

    For a sliding-window shape whose whole window fits, every context fits: returns ``math.inf``.
    """
    hw = accelerator(hw)
    batch, devices = integer("batch", batch), integer("devices", devices)
    free = devices * hw.hbm_bytes - shape.params * positive("w_p", w_p)
    if free <= 0:
        return None
    per_token = batch * kv_bytes_per_token(shape, w_kv)
    if shape.window and free >= shape.window * per_token:
        return math.inf
    return free / per_token


def free_beside_weights(shape: ModelShape, hw, w_p: float = 2, devices: int = 1) -> float:
    """M - P w_p: bytes left for the cache once the weights are loaded (negative when they do not
    fit). The margin behind s_cap (KV Cache Memory Wall, 2026, Eq. 13). Pass
    ``hardware.exposed_memory(hw)`` for the memory the driver really reports, or a shape with
    ``params=shape.counted_params()`` for unrounded weights.
    """
    hw = accelerator(hw)
    devices = integer("devices", devices)
    return devices * hw.hbm_bytes - model_shape(shape).params * positive("w_p", w_p)


def max_batch(
    shape: ModelShape, hw, context: int, w_p: float = 2, w_kv: float = 2, devices: int = 1
) -> int:
    """The largest batch b of ``context``-token sequences with P w_p + b s K <= M: what admission
    allows (Decode and KV Cache chapter, 2026, 9.3; KV Cache Memory Wall, 2026, Eq. 13 solved for
    b). 0 when not even one sequence fits.
    """
    context = integer("context", context)
    free = free_beside_weights(shape, hw, w_p, devices)
    if free <= 0:
        return 0
    per_sequence = retained_tokens(shape, context) * kv_bytes_per_token(shape, w_kv)
    return int(free // per_sequence)


@dataclass(frozen=True)
class AdmittedRate:
    """The most sequences admission allows at one context, their step floor and their token rate
    (None for both when not even one sequence fits)."""

    batch: int
    step_time: float | None
    tokens_per_s: float | None


def admitted_rate(
    shape: ModelShape, hw, context: int, w_p: float = 2, w_kv: float = 2, devices: int = 1
) -> AdmittedRate:
    """Decode at the largest admitted batch: ``max_batch`` and its ``step_time_floor``.

    This is where KV compression pays in the weight-bound regime (the scope of the KV Cache Memory
    Wall's design rule 3): at a fixed batch, dividing KV bytes barely shortens a step when s < s*,
    but where capacity binds it admits a larger batch at about the same step floor. Llama-3-70B on a
    B200 at 128k: 1 sequence in bf16, 4 with a 4-bit cache, hence about 4x the tokens/s.
    """
    batch = max_batch(shape, hw, context, w_p, w_kv, devices)
    if batch == 0:
        return AdmittedRate(0, None, None)
    hw = accelerator(hw)
    if devices > 1:  # the step's bytes are read by all devices' HBM together
        hw = dataclasses.replace(
            hw,
            hbm_bytes_per_s=devices * hw.hbm_bytes_per_s,
            die_bytes_per_s=devices * hw.die_bytes_per_s,
            bf16_flops=devices * hw.bf16_flops,
        )
    step = step_time_floor(shape, hw, batch, context, w_p, w_kv)
    return AdmittedRate(batch, step, batch / step)


def kv_fraction(
    shape: ModelShape, context: int, batch: int, w_p: float = 2, w_kv: float = 2
) -> float:
    """eta(s, b) = b s K / B(s, b), the KV share of step bytes; equals s / (s + s*(b))
    (KV Cache Memory Wall, 2026, Prop. 3.3(i)).
    """
    b = step_bytes(shape, batch, context, w_p, w_kv)
    return b.kv / b.total


def compression_speedup(c: float, context: int, s_star: float) -> float:
    """S(c; s, b) = c (s + s*(b)) / (s + c s*(b)): step speedup from dividing KV bytes by c
    (KV Cache Memory Wall, 2026, Eq. 14, Prop. 3.4(i)). 1 < S < c for c > 1; S -> c as s -> inf.

    Pass the crossover of the batch in question, ``crossover_context(shape, batch)``; an infinite
    crossover (a window that never catches up) gives S = 1.
    """
    c = positive("c", c)
    context = integer("context", context)
    if isinstance(s_star, float) and s_star == math.inf:  # a crossover that never comes (a window)
        return 1.0
    s_star = positive("s_star", s_star)
    return c * (context + s_star) / (context + c * s_star)


# --------------------------------------------------------------------------- placement on dies


def effective_bandwidth(hw, placement: str = "striped") -> float:
    """beta_eff of KV reads under a page placement (KV Cache Memory Wall, 2026, Eq. 10, Prop. 3.6,
    appendix A.4).

    A read with local fraction gamma takes max(gamma x / beta_p, (1 - gamma) x / beta_f):
    ``"pinned"`` (gamma = 1) gives the per-die beta_p; ``"striped"`` (gamma = 1 / D) gives
    min(beta_agg, D / (D - 1) beta_f). An undisclosed fabric rate (MI300X) is taken not to bind
    (Remark 3.7). A single-die package reaches beta_agg either way.

    The choice is the memory-wall paper's model, not an engine's: in their default modes a B200 and
    an MI300X interleave physical addresses across all HBM stacks, so every allocation is striped
    and a block manager cannot pin a page to one die. Only partitioned modes (MI300X's NPS4 memory
    partitions with CPX compute partitions) make memory local to a part of the package, and each
    part is then a separate device with its share of the bandwidth.
    """
    hw, placement = accelerator(hw), one_of("placement", placement, PLACEMENTS)
    if hw.dies == 1:
        return hw.hbm_bytes_per_s
    if placement == "pinned":
        return hw.die_bytes_per_s
    if hw.fabric_bytes_per_s is None:
        return hw.hbm_bytes_per_s
    return min(hw.hbm_bytes_per_s, hw.dies / (hw.dies - 1) * hw.fabric_bytes_per_s)


def rate_ceiling(shape: ModelShape, hw, placement: str = "striped", w_kv: float = 2) -> float:
    """R_inf = beta_eff / K, the limit of s b / T_step as s -> inf: context times token rate is a
    hardware constant (KV Cache Memory Wall, 2026, Eq. 11, Corollary 3.8, appendix B.4). Tokens/s.
    """
    return effective_bandwidth(hw, placement) / kv_bytes_per_token(shape, w_kv)


# --------------------------------------------------------------------------- prefill and transfer


def sharing_factor(prefix_tokens: int, suffix_tokens: int, requests: int) -> float:
    """sigma = n (p + u) / (p + n u) for n requests sharing one p-token prefix, each with its own
    u-token suffix: unshared bytes over shared bytes (KV Cache Memory Wall, 2026, section 2.6,
    appendix B.5).
    """
    p = integer("prefix_tokens", prefix_tokens, 0)
    u = integer("suffix_tokens", suffix_tokens, 0)
    n = integer("requests", requests)
    if p + u == 0:
        raise ValueError("prefix_tokens + suffix_tokens must be >= 1, got 0")
    return n * (p + u) / (p + n * u)


def prefill_flops(shape: ModelShape, tokens: int, hit_rate: float = 0.0) -> float:
    """FLOPs to encode the uncached part of an s-token prompt when a fraction h is already cached
    (KV Cache Memory Wall, 2026, appendix A.3, section 4.5):

        F = 2 P s (1 - h) + 2 L n_q d_h s^2 (1 - h^2)

    The weight term is linear in the new tokens. New position i attends over i tokens for A i FLOPs;
    summed over i = hs..s that is A (s^2 - (hs)^2) / 2, hence 1 - h^2. Full causal attention (no
    window) is assumed.
    """
    shape = model_shape(shape)
    s = integer("tokens", tokens)
    h = real("hit_rate", hit_rate, 0, 1)
    weights = 2 * shape.params * s * (1 - h)
    attention = attention_flops_per_token(shape) / 2 * s**2 * (1 - h**2)
    return weights + attention


def prefill_time(
    shape: ModelShape,
    hw,
    tokens: int,
    mfu: float = 0.7,
    hit_rate: float = 0.0,
    prefix_tokens: int = 0,
) -> float:
    """Time to first token, prefill_flops / (mu * peak) in seconds, at model FLOP utilization mu (KV
    Cache Memory Wall, 2026, appendix A.3 and C.4 (iii): mu = 0.70). Give the cached share either as
    ``hit_rate`` h or as ``prefix_tokens`` (h = prefix_tokens / tokens), not both.
    """
    hw = accelerator(hw)
    tokens = integer("tokens", tokens)
    mu = real("mfu", mfu, 0, 1, low_open=True)
    prefix = integer("prefix_tokens", prefix_tokens, 0)
    if prefix > tokens:
        raise ValueError(f"prefix_tokens must be in [0, tokens={tokens}], got {prefix}")
    if prefix and hit_rate:
        raise ValueError("give the cached share as hit_rate or as prefix_tokens, not both")
    h = prefix / tokens if prefix else hit_rate
    return prefill_flops(shape, tokens, h) / (mu * hw.bf16_flops)


def transfer_time(nbytes: float, link_bytes_per_s: float, codec: float = 1.0) -> float:
    """Seconds to move ``nbytes`` over a link, x / (codec * beta_link), where ``codec`` is the
    transport codec's size reduction (KV Cache Memory Wall, 2026, section 2.7, appendix B.5;
    CacheGen's is about 4).
    """
    return positive("nbytes", nbytes) / (
        positive("codec", codec) * positive("link_bytes_per_s", link_bytes_per_s)
    )
