"""Notebooks 04 and 08: how many bytes each attention design caches (sections 9.4 and 9.7).

- ``gqa_cache_bytes``: the cache per token and per sequence as query heads share KV heads, from
  multi-head attention (g = 1) to one KV head (Ainslie et al. 2023), section 9.4;
- ``cache_bytes`` and ``design_table``: one sequence's cache under full attention, GQA, FP8 and
  INT4 entries, a sliding window, an MLA latent and a hybrid of global and windowed layers: the
  Decode and KV Cache chapter, 2026, Table 9.3, extended with the KV Cache Memory Wall, 2026,
  Table 1, on its unified footprint model (``kvlab.theory.memory_wall.footprint``);
- ``window_span``: how far back stacked sliding windows can carry information (Jiang et al. 2023);
- ``quantized_nbytes`` and ``kivi_nbytes``: what a quantized tensor and a KIVI cache
  (Liu et al. 2024) hold, codes, scales and zero points counted; ``rounding_rms`` and
  ``rounding_explains``: the uniform-rounding model of its error, step / sqrt(12).

Pure Python; the caches these sizes describe are in ``kvlab.cache``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvlab._checks import integer, integers, nonnegative, one_of, positive
from kvlab.theory import memory_wall
from kvlab.theory.shapes import SHAPES, ModelShape

GIB = 2**30
# The code widths kvlab.cache.quantized stores.
BITS = (2, 4, 8)


# --- section 9.4: grouped-query attention ---------------------------------------------------------


@dataclass(frozen=True)
class GQARow:
    """Cache cost of one grouping of a model's query heads (section 9.4; Ainslie et al. 2023)."""

    group: int
    kv_heads: int
    bytes_per_token: float
    bytes_per_sequence: float


def gqa_cache_bytes(shape, context: int, bytes_per_element: float = 2, groups=None) -> list[GQARow]:
    """KV-cache bytes per token and per ``context``-token sequence as query heads share KV heads.

    ``shape`` is a ``ModelShape``; ``groups`` the query heads per KV head to tabulate (default:
    every divisor of the query-head count, 1 = multi-head attention). Uses
    ``ModelShape.kv_bytes_per_token`` with the KV-head count replaced.
    """
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a kvlab ModelShape, got {type(shape).__name__}")
    if shape.latent_dim is not None:
        raise ValueError(
            f"{shape.name} caches a latent (MLA), not per-head K and V: GQA grouping does not apply"
        )
    context = integer("context", context, 1)
    divisors = [g for g in range(1, shape.q_heads + 1) if shape.q_heads % g == 0]
    groups = divisors if groups is None else integers("groups", groups)
    rows = []
    for group in groups:
        if shape.q_heads % group:
            raise ValueError(
                f"group must divide {shape.name}'s {shape.q_heads} query heads; allowed: {divisors}"
            )
        grouped = dataclasses.replace(shape, kv_heads=shape.q_heads // group)
        per_token = grouped.kv_bytes_per_token(bytes_per_element)
        rows.append(GQARow(group, grouped.kv_heads, per_token, per_token * context))
    return rows


# --- section 9.7: Table 9.3 and its extensions
# -------------------------------------------------------


def _shape(shape) -> ModelShape:
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(
                f"shape must be a ModelShape or one of {sorted(SHAPES)}, got {shape!r}"
            )
        return SHAPES[shape]
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a ModelShape or a SHAPES key, got {type(shape).__name__}")
    return shape


def cache_bytes(
    shape,
    tokens: int,
    bytes_per_element: float = 2,
    window: int | None = None,
    kv_heads: int | None = None,
    full: bool = False,
) -> float:
    """KV-cache bytes of one sequence of ``tokens`` tokens (section 9.7, Table 9.3).

    2 x min(T, W) x L x n_kv x d_h x b for standard attention; min(T, W) x L x (d_c + d_r) x b for
    an MLA shape. ``kv_heads`` overrides the shape's KV heads (GQA from the same shape), ``window``
    its sliding window (None keeps the shape's own, e.g. Mistral's 4,096); ``full=True`` drops the
    shape's window, for the cache the same model would keep with full attention. Payload only: no
    scales, block rounding or runtime overhead. Evaluated by ``memory_wall.footprint`` at batch 1.
    """
    shape = _shape(shape)
    integer("tokens", tokens, 1)
    positive("bytes_per_element", bytes_per_element)
    changes = {}
    if kv_heads is not None:
        integer("kv_heads", kv_heads, 1)
        if shape.q_heads % kv_heads:
            raise ValueError(
                f"kv_heads must divide the {shape.q_heads} query heads, got {kv_heads}"
            )
        changes["kv_heads"] = kv_heads
    if not isinstance(full, bool):
        raise TypeError(f"full must be a bool, got {type(full).__name__} {full!r}")
    if full and window is not None:
        raise ValueError(f"give a window or full=True, not both (got window={window!r})")
    if window is not None:
        changes["window"] = integer("window", window, 1)
    if full:
        changes["window"] = None
    return memory_wall.footprint(
        dataclasses.replace(shape, **changes), tokens, batch=1, w_q=bytes_per_element
    ).total


@dataclass(frozen=True)
class Design:
    """One row of the per-design table: what one sequence stores under an attention design."""

    name: str
    tokens_stored: int
    kv_heads: int | None  # None for a latent (MLA) cache
    bytes_per_element: float
    bytes: float

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def design_table(
    shape="llama-3-8b",
    tokens: int = 131_072,
    window: int = 4096,
    gqa_heads: int = 8,
    latent_dim: int = 512,
    rope_dim: int = 64,
    global_layers: int = 8,
) -> list[Design]:
    """Table 9.3 and its extensions for one model shape (section 9.7).

    Rows: full multi-head attention (n_kv = n_q); GQA with ``gqa_heads`` KV heads in BF16, FP8 and
    INT4; GQA with a ``window``-token sliding window; an MLA latent of ``latent_dim`` + ``rope_dim``
    elements per layer (DeepSeek-V2's 512 + 64); and a hybrid whose ``global_layers`` layers keep
    full GQA attention while the rest use the window.
    """
    shape = _shape(shape)
    for name, value in (
        ("tokens", tokens),
        ("window", window),
        ("latent_dim", latent_dim),
        ("rope_dim", rope_dim),
    ):
        integer(name, value, 1)
    integer("gqa_heads", gqa_heads, 1)
    if shape.q_heads % gqa_heads:
        raise ValueError(
            f"gqa_heads must divide the {shape.q_heads} query heads of {shape.name}, got"
            f" {gqa_heads}"
        )
    integer("global_layers", global_layers, 0)
    if global_layers > shape.layers:
        raise ValueError(f"global_layers must be <= the {shape.layers} layers, got {global_layers}")
    win = min(tokens, window)
    rows = [
        Design(
            "Full multi-head attention",
            tokens,
            shape.q_heads,
            2,
            cache_bytes(shape, tokens, 2, kv_heads=shape.q_heads),
        ),
        Design(
            "Grouped-query attention",
            tokens,
            gqa_heads,
            2,
            cache_bytes(shape, tokens, 2, kv_heads=gqa_heads),
        ),
        Design(
            "Grouped-query attention, FP8 cache",
            tokens,
            gqa_heads,
            1,
            cache_bytes(shape, tokens, 1, kv_heads=gqa_heads),
        ),
        Design(
            "Grouped-query attention, INT4 cache",
            tokens,
            gqa_heads,
            0.5,
            cache_bytes(shape, tokens, 0.5, kv_heads=gqa_heads),
        ),
        Design(
            f"Grouped-query, {window:,}-token window",
            win,
            gqa_heads,
            2,
            cache_bytes(shape, tokens, 2, window=window, kv_heads=gqa_heads),
        ),
    ]
    mla = dataclasses.replace(shape, latent_dim=latent_dim, rope_dim=rope_dim)
    rows.append(
        Design(
            f"MLA latent ({latent_dim} + {rope_dim} per layer)",
            tokens,
            None,
            2,
            cache_bytes(mla, tokens, 2),
        )
    )
    hybrid = 0.0
    if global_layers:
        hybrid += cache_bytes(
            dataclasses.replace(shape, layers=global_layers), tokens, 2, kv_heads=gqa_heads
        )
    if shape.layers - global_layers:
        hybrid += cache_bytes(
            dataclasses.replace(shape, layers=shape.layers - global_layers),
            tokens,
            2,
            window=window,
            kv_heads=gqa_heads,
        )
    rows.append(
        Design(
            f"Hybrid: {global_layers} global + {shape.layers - global_layers} windowed layers",
            tokens,
            gqa_heads,
            2,
            hybrid,
        )
    )
    return rows


def window_span(window: int, layers: int) -> int:
    """Theoretical attention span of stacked sliding windows: W x L tokens at the last layer (9.7).

    Each layer can pass information back by at most W positions, so L layers reach W x L
    (Mistral 7B: 4,096 x 32 = 131,072, the chapter's "about 131,000").
    """
    return integer("window", window, 1) * integer("layers", layers, 1)


# --- section 9.7: quantized entries
# ------------------------------------------------------------------


def quantized_nbytes(numel: int, bits: int, group_size: int, meta_bytes: int = 2) -> int:
    """Bytes of a quantized tensor: packed codes plus one scale and one zero point per group."""
    integer("numel", numel, 0)
    one_of("bits", bits, BITS)  # what quantize stores
    integer("group_size", group_size, 1)
    integer("meta_bytes", meta_bytes, 0)
    if numel % group_size:
        raise ValueError(
            f"numel ({numel}) must be a multiple of group_size ({group_size}), as quantize requires"
        )
    groups = numel // group_size
    return groups * math.ceil(group_size * bits / 8) + 2 * groups * meta_bytes


ROUNDING_TOLERANCE = 0.25  # the uniform-rounding model "explains" an RMS error within 25% of it


def rounding_rms(step: float) -> float:
    """The RMS error of rounding to the nearest level of spacing ``step`` when the error is spread
    evenly over [-step/2, step/2]: step / sqrt(12), the prediction ``quantize``'s errors are drawn
    against (section 9.7)."""
    return nonnegative("step", step) / math.sqrt(12)


def rounding_explains(measured_rms: float, step_rms: float) -> bool:
    """True when a measured RMS rounding error is within ``ROUNDING_TOLERANCE`` of
    ``rounding_rms(step_rms)`` (``step_rms``: the RMS of the elements' quantization steps)."""
    measured_rms, predicted = (
        nonnegative("measured_rms", measured_rms),
        rounding_rms(nonnegative("step_rms", step_rms)),
    )
    return predicted > 0 and abs(measured_rms / predicted - 1) <= ROUNDING_TOLERANCE


def kivi_nbytes(
    tokens: int,
    elements_per_token: int,
    bits: int,
    group_size: int,
    residual: int,
    element_bytes: float = 2,
    meta_bytes: int = 2,
) -> float:
    """Bytes a KIVI cache (``QuantizedKVCache``) holds after ``tokens`` tokens (section 9.7).

    Whole groups of ``group_size`` tokens are quantized once ``residual + group_size`` tokens have
    arrived; the ``residual`` newest tokens, and any tokens short of a whole group, stay at
    ``element_bytes``. So a short cache is mostly residual: 128 tokens with a residual of 32 keep a
    quarter of them in full precision, and the saving over a full-precision cache stays far below
    the 2-bit codes' ratio until the cache is many residuals long.
    """
    tokens = integer("tokens", tokens, 0)
    residual = integer("residual", residual, 0)
    group_size = integer("group_size", group_size)
    elements_per_token = integer("elements_per_token", elements_per_token)
    element_bytes = positive("element_bytes", element_bytes)
    quantized = max(0, (tokens - residual) // group_size * group_size)
    return (
        quantized * quantized_nbytes(elements_per_token, bits, group_size, meta_bytes)
        + (tokens - quantized) * elements_per_token * element_bytes
    )
