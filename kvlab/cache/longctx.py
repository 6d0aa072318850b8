"""Long-context variants of attention and their caches (section 9.7).

At long context the attention design sets the memory budget, and each smaller design costs
something. This module measures both sides:

- **bytes**: ``cache_bytes`` and ``design_table`` (seed 000 Table 9.3, seed 004 Table 1), on top of
  the unified footprint model of ``kvlab.theory.roofline``;
- **bounded caches** that ``kvlab.cached_decode(..., cache=...)`` accepts: ``SlidingWindowCache``
  and ``SinkCache`` (StreamingLLM), with either RoPE convention (``rope="original"`` or
  ``rope="cache"``);
- **narrower entries**: ``quantize`` (int8, int4, 2-bit, asymmetric min-max groups, packed) and
  ``QuantizedKVCache`` in KIVI's layout;
- **fewer entries**: ``gqa_from_mha`` (mean-pooled KV heads) and ``LatentKVCache`` (an MLA-style
  low-rank latent with up-projection);
- **where the error enters**: ``attention_error`` (through scores and through values),
  ``rerotation_scores`` (what rotating an already-rotated key does), ``stream_eval`` (next-token
  loss and attention mass on a long token stream).

The caches follow transformers' ``Cache`` API (a list of layers, each with ``update``,
``get_seq_length`` and ``get_mask_sizes``). ``get_seq_length`` is the number of tokens the sequence
has seen (its next absolute position), not the number retained.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvlab._checks import integer, positive
from kvlab.theory import roofline
from kvlab.theory.shapes import SHAPES, ModelShape
from kvlab.versions import cache_kwargs

GIB = 2**30
BITS = (2, 4, 8)
ROPE_MODES = ("original", "cache")
KEY_GROUPS = ("channel", "token")


# --------------------------------------------------------------------------- argument checks

def _shape(shape) -> ModelShape:
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"shape must be a ModelShape or one of {sorted(SHAPES)}, got {shape!r}")
        return SHAPES[shape]
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a ModelShape or a SHAPES key, got {type(shape).__name__}")
    return shape


# --------------------------------------------------------------------------- bytes (Table 9.3)

def cache_bytes(shape, tokens: int, bytes_per_element: float = 2, window: int | None = None,
                kv_heads: int | None = None, full: bool = False) -> float:
    """KV-cache bytes of one sequence of ``tokens`` tokens (section 9.7, Table 9.3).

    2 x min(T, W) x L x n_kv x d_h x b for standard attention; min(T, W) x L x (d_c + d_r) x b for an
    MLA shape. ``kv_heads`` overrides the shape's KV heads (GQA from the same shape), ``window`` its
    sliding window (None keeps the shape's own, e.g. Mistral's 4,096); ``full=True`` drops the shape's
    window, for the cache the same model would keep with full attention. Payload only: no scales, block
    rounding or runtime overhead. Evaluated by ``roofline.footprint`` at batch 1.
    """
    shape = _shape(shape)
    integer("tokens", tokens, 1)
    positive("bytes_per_element", bytes_per_element)
    changes = {}
    if kv_heads is not None:
        integer("kv_heads", kv_heads, 1)
        if shape.q_heads % kv_heads:
            raise ValueError(f"kv_heads must divide the {shape.q_heads} query heads, got {kv_heads}")
        changes["kv_heads"] = kv_heads
    if not isinstance(full, bool):
        raise TypeError(f"full must be a bool, got {type(full).__name__} {full!r}")
    if full and window is not None:
        raise ValueError(f"give a window or full=True, not both (got window={window!r})")
    if window is not None:
        changes["window"] = integer("window", window, 1)
    if full:
        changes["window"] = None
    return roofline.footprint(dataclasses.replace(shape, **changes), tokens, batch=1,
                              w_q=bytes_per_element).total


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


def design_table(shape="llama-3-8b", tokens: int = 131_072, window: int = 4096, gqa_heads: int = 8,
                 latent_dim: int = 512, rope_dim: int = 64, global_layers: int = 8) -> list[Design]:
    """Table 9.3 and its extensions for one model shape (section 9.7).

    Rows: full multi-head attention (n_kv = n_q); GQA with ``gqa_heads`` KV heads in BF16, FP8 and
    INT4; GQA with a ``window``-token sliding window; an MLA latent of ``latent_dim`` + ``rope_dim``
    elements per layer (DeepSeek-V2's 512 + 64); and a hybrid whose ``global_layers`` layers keep
    full GQA attention while the rest use the window.
    """
    shape = _shape(shape)
    for name, value in (("tokens", tokens), ("window", window), ("latent_dim", latent_dim), ("rope_dim", rope_dim)):
        integer(name, value, 1)
    integer("gqa_heads", gqa_heads, 1)
    if shape.q_heads % gqa_heads:
        raise ValueError(f"gqa_heads must divide the {shape.q_heads} query heads of {shape.name}, got {gqa_heads}")
    integer("global_layers", global_layers, 0)
    if global_layers > shape.layers:
        raise ValueError(f"global_layers must be <= the {shape.layers} layers, got {global_layers}")
    win = min(tokens, window)
    rows = [
        Design("Full multi-head attention", tokens, shape.q_heads, 2,
               cache_bytes(shape, tokens, 2, kv_heads=shape.q_heads)),
        Design("Grouped-query attention", tokens, gqa_heads, 2, cache_bytes(shape, tokens, 2, kv_heads=gqa_heads)),
        Design("Grouped-query attention, FP8 cache", tokens, gqa_heads, 1,
               cache_bytes(shape, tokens, 1, kv_heads=gqa_heads)),
        Design("Grouped-query attention, INT4 cache", tokens, gqa_heads, 0.5,
               cache_bytes(shape, tokens, 0.5, kv_heads=gqa_heads)),
        Design(f"Grouped-query, {window:,}-token window", win, gqa_heads, 2,
               cache_bytes(shape, tokens, 2, window=window, kv_heads=gqa_heads)),
    ]
    mla = dataclasses.replace(shape, latent_dim=latent_dim, rope_dim=rope_dim)
    rows.append(Design(f"MLA latent ({latent_dim} + {rope_dim} per layer)", tokens, None, 2,
                       cache_bytes(mla, tokens, 2)))
    hybrid = 0.0
    if global_layers:
        hybrid += cache_bytes(dataclasses.replace(shape, layers=global_layers), tokens, 2, kv_heads=gqa_heads)
    if shape.layers - global_layers:
        hybrid += cache_bytes(dataclasses.replace(shape, layers=shape.layers - global_layers), tokens, 2,
                              window=window, kv_heads=gqa_heads)
    rows.append(Design(f"Hybrid: {global_layers} global + {shape.layers - global_layers} windowed layers",
                       tokens, gqa_heads, 2, hybrid))
    return rows


def window_span(window: int, layers: int) -> int:
    """Theoretical attention span of stacked sliding windows: W x L tokens at the last layer (9.7).

    Each layer can pass information back by at most W positions, so L layers reach W x L
    (Mistral 7B: 4,096 x 32 = 131,072, the seed's "about 131,000").
    """
    return integer("window", window, 1) * integer("layers", layers, 1)


# --------------------------------------------------------------------------- RoPE

def rotate(x: torch.Tensor, positions, inv_freq: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """Rotate ``x [..., n, d]`` by RoPE at ``positions`` (``[n]`` or ``[batch, n]``; any real numbers).

    Hugging Face's half-split convention (``rotate_half``): dimension i pairs with i + d/2 at
    frequency ``inv_freq[i]``. Rotations compose: rotating by p and then by q is rotating by p + q,
    so a negative position undoes a rotation. Computed in fp32 (fp64 for fp64 inputs).
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be a floating tensor [..., n, d] with an even d, got {getattr(x, 'shape', x)!r}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions, dtype=work)
    pos = pos.to(device=x.device, dtype=work)
    if pos.dim() not in (1, 2) or pos.shape[-1] != x.shape[-2]:
        raise ValueError(f"positions must be [n] or [batch, n] with n = {x.shape[-2]} (x's tokens), "
                         f"got shape {tuple(pos.shape)}")
    if tuple(inv_freq.shape) != (x.shape[-1] // 2,):
        raise ValueError(f"inv_freq must have d/2 = {x.shape[-1] // 2} elements, got shape {tuple(inv_freq.shape)}")
    freqs = pos[..., None] * inv_freq.to(device=x.device, dtype=work)
    emb = torch.cat((freqs, freqs), dim=-1)
    if emb.dim() == 3:  # [batch, n, d]: broadcast over the heads of [batch, heads, n, d]
        emb = emb[:, None]
    cos, sin = emb.cos() * scaling, emb.sin() * scaling
    xw = x.to(work)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-xw[..., half:], xw[..., :half]), dim=-1)
    return (xw * cos + rotated_half * sin).to(x.dtype)


def rotary_of(model):
    """``(inv_freq, attention_scaling)`` of a Hugging Face RoPE model (Llama, Qwen2, Mistral)."""
    emb = getattr(getattr(model, "model", model), "rotary_emb", None)
    if emb is None or not hasattr(emb, "inv_freq"):
        raise ValueError(f"model {type(model).__name__} has no rotary embedding (RoPE); "
                         "rope='cache' needs one (gpt2 uses learned positions)")
    return emb.inv_freq.detach(), float(getattr(emb, "attention_scaling", 1.0))


def rerotation_scores(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, query_position: int,
                      key_positions) -> dict:
    """What rotating an already-rotated cached key again does to attention scores (seed 002).

    ``q [d]`` and ``k [n, d]`` are un-rotated projections. Returns the scores q_t . k_p of correct
    decoding (keys rotated once, at their positions p), the scores when the cache applies the
    current position t to keys that already carry R_p (keys at p + t), and when it rotates them by p
    again (keys at 2p), all scaled by 1/sqrt(d), fp64.
    """
    q64, k64 = q.double(), k.double()
    pos = torch.as_tensor(key_positions, dtype=torch.float64)
    qr = rotate(q64[None], [query_position], inv_freq)[0]
    cached = rotate(k64, pos, inv_freq)
    scale = q.shape[-1] ** -0.5
    return {
        "correct": cached @ qr * scale,
        "plus current position": rotate(cached, torch.full_like(pos, query_position), inv_freq) @ qr * scale,
        "twice its own position": rotate(cached, pos, inv_freq) @ qr * scale,
    }


# --------------------------------------------------------------------------- bounded caches

def _positions_from(kwargs, batch: int, count: int, seen: int, device) -> torch.Tensor:
    """Absolute positions ``[batch, count]`` of the tokens being written.

    transformers passes the attention layer's kwargs (``position_ids`` among them) to
    ``Cache.update``; without them, the tokens follow on from those already seen.
    """
    pos = (kwargs.get("kwargs") or {}).get("position_ids") if kwargs else None
    if pos is not None and pos.shape[-1] == count:
        return pos.to(device).expand(batch, count)
    return (torch.arange(count, device=device) + seen).expand(batch, count)


class BoundedLayer(CacheLayerMixin):
    """One layer of a cache that keeps the first ``num_sink`` tokens plus the ``window`` most recent.

    Decoding one token per step, each query sees at most ``num_sink + window`` keys, itself included,
    and the layer never stores more. A multi-token chunk (the prompt) sees the retained cache plus
    itself, causally, and is trimmed after use: eviction happens after prefill.

    ``rope="original"``: keys are stored as the model rotated them, at their absolute positions, so a
    query at t meets a retained key at its true distance t - p. ``rope="cache"`` (StreamingLLM):
    keys are stored before rotation (the layer undoes the model's rotation on write) and are rotated
    on read at their slots in the cache, so distances never exceed ``num_sink + window``.
    """

    is_sliding = True
    is_compileable = False
    is_croppable = False

    def __init__(self, num_sink: int, window: int, rope: str = "original", inv_freq=None, scaling: float = 1.0):
        super().__init__()
        self.num_sink, self.window, self.rope = num_sink, window, rope
        self.inv_freq, self.scaling = inv_freq, scaling
        self.seen = 0
        self.positions = None  # [batch, n] absolute positions of the stored tokens

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.positions = torch.zeros((key_states.shape[0], 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def _keep(self, n: int) -> torch.Tensor:
        """Indices of the slots to keep out of ``n``: the sinks, then the most recent ``window``."""
        if n <= self.num_sink + self.window:
            return torch.arange(n, device=self.device)
        return torch.cat([torch.arange(self.num_sink, device=self.device),
                          torch.arange(n - self.window, n, device=self.device)])

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, count = key_states.shape[0], key_states.shape[-2]
        new_pos = _positions_from(kwargs, batch, count, self.seen, self.device)
        if self.rope == "cache":
            # Undo the model's rotation (HF multiplies cos and sin by attention_scaling).
            key_states = rotate(key_states, -new_pos, self.inv_freq, 1.0) / self.scaling
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        positions = torch.cat([self.positions, new_pos], dim=-1)
        keep = self._keep(keys.shape[-2])
        # Everything that can fail is done: only now change the layer (a failed update changes nothing).
        self.keys, self.values, self.positions = keys[..., keep, :], values[..., keep, :], positions[:, keep]
        self.seen += count
        if count == 1:
            keys, values = self.keys, self.values
        if self.rope == "cache":
            # Slot i of n sits n-1-i positions before the newest token. RoPE scores depend only on
            # differences, so rotating slot i to (newest query's position - (n-1-i)) gives the
            # in-cache distances without touching the query the model already rotated.
            n = keys.shape[-2]
            last = new_pos[:, -1:]
            slot_pos = last - (n - 1 - torch.arange(n, device=self.device))
            keys = rotate(keys, slot_pos, self.inv_freq, self.scaling)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        stored = 0 if self.keys is None else self.keys.shape[-2]
        kv_length = min(stored + 1, self.num_sink + self.window) if query_length == 1 else stored + query_length
        # The returned keys are presented to the mask as the kv_length positions ending at the
        # newest query: every retained key is visible to a one-token query, the chunk stays causal.
        return kv_length, self.seen + query_length - kv_length

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.num_sink + self.window

    def get_max_cache_shape(self) -> int:  # transformers < 5.13 asks under this name
        return self.get_max_length()

    def reset(self):
        self.keys = self.values = self.positions = None
        self.is_initialized = False
        self.seen = 0

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("a bounded cache has evicted what crop would restore")


class _LayeredCache(Cache):
    """A Cache whose layers are made on first use by ``make_layer()`` (the model's layer count is not
    known until it runs)."""

    def __init__(self, make_layer):
        super().__init__(layers=[])
        self._make_layer = make_layer

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(self._make_layer())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def stored_tokens(self) -> int:
        """Tokens held by the fullest layer right now (0 before the first update)."""
        return max((layer.get_seq_length() if isinstance(layer, QuantizedLayer) else layer.keys.shape[-2]
                    for layer in self.layers if layer.keys is not None), default=0)

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now, over all layers."""
        return sum(_layer_nbytes(layer) for layer in self.layers)


def _layer_nbytes(layer) -> int:
    if hasattr(layer, "nbytes"):
        return layer.nbytes
    if layer.keys is None:
        return 0
    return layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()


def _rope_args(rope: str, model):
    if rope not in ROPE_MODES:
        raise ValueError(f"rope must be one of {ROPE_MODES}, got {rope!r}")
    if rope == "original":
        return None, 1.0
    if model is None:
        raise ValueError("rope='cache' needs model= (the cache re-rotates keys with the model's RoPE frequencies)")
    return rotary_of(model)


class SinkCache(_LayeredCache):
    """StreamingLLM's cache: the first ``num_sink`` tokens plus a rolling ``window`` (section 9.7).

    Holds at most ``num_sink + window`` tokens per layer, by construction. ``rope="original"`` keeps
    keys rotated at their absolute positions; ``rope="cache"`` (needs ``model=``) stores them before
    rotation and rotates them at their positions inside the cache, as StreamingLLM does. Use it for
    unpadded batches: the sinks are the first ``num_sink`` columns of every row.
    """

    def __init__(self, num_sink: int, window: int, rope: str = "original", model=None):
        integer("num_sink", num_sink, 0)
        integer("window", window, 1)
        inv_freq, scaling = _rope_args(rope, model)
        self.num_sink, self.window, self.rope = num_sink, window, rope
        super().__init__(lambda: BoundedLayer(num_sink, window, rope, inv_freq, scaling))


class SlidingWindowCache(SinkCache):
    """A rolling cache of the ``window`` most recent tokens (sliding-window attention, section 9.7).

    Each decode step attends to the newest ``window`` tokens, itself included, as Mistral 7B's
    rolling buffer does; memory is bounded by ``window`` tokens per layer.
    """

    def __init__(self, window: int, rope: str = "original", model=None):
        super().__init__(0, window, rope=rope, model=model)


# --------------------------------------------------------------------------- quantization

@dataclass(frozen=True)
class QuantizedTensor:
    """Asymmetric min-max quantization in groups, with packed codes (section 9.7, seed 004 2.3).

    Each group of ``group_size`` consecutive elements along ``axis`` shares one ``scale`` and one
    ``zero`` (the group's minimum): x ~ code x scale + zero with code in [0, 2^bits - 1]. Codes are
    packed 8 // bits to a byte, so ``nbytes`` counts the real bits plus the scales and zero points.
    """

    codes: torch.Tensor  # uint8 [..., groups, ceil(group_size * bits / 8)]
    scale: torch.Tensor  # [..., groups, 1]
    zero: torch.Tensor  # [..., groups, 1]
    bits: int
    group_size: int
    axis: int
    shape: tuple

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero))

    @property
    def step(self) -> torch.Tensor:
        """The quantization step of every element, broadcast to ``shape``."""
        return _ungroup(self.scale.expand(*self.scale.shape[:-1], self.group_size), self.axis, self.shape)

    def dequantize(self) -> torch.Tensor:
        codes = _unpack(self.codes, self.bits, self.group_size)
        return _ungroup(codes.to(self.scale.dtype) * self.scale + self.zero, self.axis, self.shape)


def _moved_shape(shape, axis):
    dims = list(shape)
    dims.append(dims.pop(axis))
    return dims


def _ungroup(grouped: torch.Tensor, axis: int, shape) -> torch.Tensor:
    moved = _moved_shape(shape, axis)
    return grouped.reshape(moved).movedim(-1, axis)


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    n = codes.shape[-1]
    pad = (-n) % per
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad))
    codes = codes.reshape(*codes.shape[:-1], -1, per).to(torch.int32)
    shifts = torch.arange(per, device=codes.device, dtype=torch.int32) * bits
    return (codes << shifts).sum(-1).to(torch.uint8)


def _unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, device=packed.device, dtype=torch.int32) * bits
    codes = (packed.to(torch.int32)[..., None] >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], -1)[..., :n]


def quantize(x: torch.Tensor, bits: int, group_size: int, axis: int = -1) -> QuantizedTensor:
    """Quantize ``x`` to ``bits`` in {2, 4, 8}, one scale and zero point per group (section 9.7).

    Groups are ``group_size`` consecutive elements along ``axis``, which ``group_size`` must divide.
    For a cache ``[batch, heads, tokens, head_dim]``, ``axis=-1`` gives per-token groups (KIVI's
    values) and ``axis=-2`` per-channel groups that span tokens (KIVI's keys). Rounding to the
    nearest level bounds the error of every element by half its group's step.
    Scales and zero points keep ``x``'s dtype.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    integer("group_size", group_size, 1)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis must be an int in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d tensor, got {axis!r}")
    axis = axis % x.dim()
    if x.shape[axis] % group_size:
        raise ValueError(f"group_size ({group_size}) must divide the length of axis {axis} ({x.shape[axis]})")
    moved = x.movedim(axis, -1)
    grouped = moved.reshape(*moved.shape[:-1], moved.shape[-1] // group_size, group_size)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    lo = grouped.amin(-1, keepdim=True).to(work)
    hi = grouped.amax(-1, keepdim=True).to(work)
    levels = 2**bits - 1
    scale = ((hi - lo) / levels).to(x.dtype)
    zero = lo.to(x.dtype)
    # Round against the scale and zero as stored, so the half-step bound holds for what is kept.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(work)
    codes = torch.round((grouped.to(work) - zero.to(work)) / safe).clamp_(0, levels).to(torch.uint8)
    return QuantizedTensor(_pack(codes, bits), scale, zero, bits, group_size, axis, tuple(x.shape))


def quantized_nbytes(numel: int, bits: int, group_size: int, meta_bytes: int = 2) -> int:
    """Bytes of a quantized tensor: packed codes plus one scale and one zero point per group."""
    integer("numel", numel, 0)
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS} (what quantize stores), got {bits!r}")
    integer("group_size", group_size, 1)
    integer("meta_bytes", meta_bytes, 0)
    if numel % group_size:
        raise ValueError(f"numel ({numel}) must be a multiple of group_size ({group_size}), as quantize requires")
    groups = numel // group_size
    return groups * math.ceil(group_size * bits / 8) + 2 * groups * meta_bytes


def kivi_nbytes(tokens: int, elements_per_token: int, bits: int, group_size: int, residual: int,
                element_bytes: float = 2, meta_bytes: int = 2) -> float:
    """Bytes a KIVI cache (``QuantizedKVCache``) holds after ``tokens`` tokens (section 9.7).

    Whole groups of ``group_size`` tokens are quantized once ``residual + group_size`` tokens have
    arrived; the ``residual`` newest tokens, and any tokens short of a whole group, stay at
    ``element_bytes``. So a short cache is mostly residual: 128 tokens with a residual of 32 keep a
    quarter of them in full precision, and the saving over a full-precision cache stays far below
    the 2-bit codes' ratio until the cache is many residuals long.
    """
    tokens = _positive_int("tokens", tokens, 0)
    residual = _positive_int("residual", residual, 0)
    group_size = _positive_int("group_size", group_size)
    elements_per_token = _positive_int("elements_per_token", elements_per_token)
    quantized = max(0, (tokens - residual) // group_size * group_size)
    return (quantized * quantized_nbytes(elements_per_token, bits, group_size, meta_bytes)
            + (tokens - quantized) * elements_per_token * element_bytes)


def _positive_int(name, value, low=1):
    from kvlab._checks import integer

    return integer(name, value, low)


def _cat_quantized(a: QuantizedTensor | None, b: QuantizedTensor, axis: int) -> QuantizedTensor:
    """Join two quantized tensors of the same layout along ``axis`` of the original shape."""
    if a is None:
        return b
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    dim = -2 if axis == a.axis else _moved_shape(range(len(shape)), a.axis).index(axis)
    cat = lambda x, y: torch.cat([x, y], dim=dim)  # noqa: E731
    return dataclasses.replace(a, codes=cat(a.codes, b.codes), scale=cat(a.scale, b.scale),
                               zero=cat(a.zero, b.zero), shape=tuple(shape))


class _KeepAllLayer(CacheLayerMixin):
    """A layer that keeps every token it was given (compressed): masks span the whole history."""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers < 5.13 asks under this name
        return self.get_max_length()


class QuantizedLayer(_KeepAllLayer):
    """One layer of KIVI's cache: quantized keys per channel, values per token, recent tokens exact.

    New tokens enter a full-precision residual. Whenever it holds ``residual + group_size`` tokens,
    its oldest ``group_size`` are quantized: keys in groups of ``group_size`` tokens per channel,
    values in groups of ``group_size`` channels per token. The ``residual`` newest tokens are
    therefore always exact. Each read dequantizes the quantized part. ``key_groups="token"`` groups
    keys like values instead (``group_size`` channels of one token), the layout KIVI argues against.
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, bits: int, group_size: int, residual: int, key_groups: str = "channel"):
        super().__init__()
        self.bits, self.group_size, self.residual = bits, group_size, residual
        self.key_axis = -2 if key_groups == "channel" else -1
        self.qkeys = self.qvalues = None

    def lazy_initialization(self, key_states, value_states):
        if key_states.shape[-1] % self.group_size:
            raise ValueError(f"group_size ({self.group_size}) must divide the head dimension "
                             f"({key_states.shape[-1]}): values are quantized per token in channel groups")
        self.device = key_states.device
        self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        qkeys, qvalues, g = self.qkeys, self.qvalues, self.group_size
        while keys.shape[-2] >= self.residual + g:
            oldest_k, keys = keys[..., :g, :], keys[..., g:, :]
            oldest_v, values = values[..., :g, :], values[..., g:, :]
            qkeys = _cat_quantized(qkeys, quantize(oldest_k, self.bits, g, axis=self.key_axis), axis=2)
            qvalues = _cat_quantized(qvalues, quantize(oldest_v, self.bits, g, axis=-1), axis=2)
        # Everything that can fail is done: only now change the layer (a failed update changes nothing).
        self.keys, self.values, self.qkeys, self.qvalues = keys, values, qkeys, qvalues
        if self.qkeys is None:
            return self.keys, self.values
        return (torch.cat([self.qkeys.dequantize(), self.keys], dim=-2),
                torch.cat([self.qvalues.dequantize(), self.values], dim=-2))

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.shape[-2] + (0 if self.qkeys is None else self.qkeys.shape[2])

    @property
    def nbytes(self) -> int:
        full = 0 if self.keys is None else 2 * self.keys.numel() * self.keys.element_size()
        quant = 0 if self.qkeys is None else self.qkeys.nbytes + self.qvalues.nbytes
        return full + quant

    def reset(self):
        self.keys = self.values = self.qkeys = self.qvalues = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("QuantizedKVCache does not support crop")


class QuantizedKVCache(_LayeredCache):
    """KIVI's KV-cache layout, usable in ``cached_decode(..., cache=...)`` (section 9.7).

    Keys per channel and values per token, at ``bits`` in {2, 4, 8} with ``group_size``-element
    groups, and the ``residual`` most recent tokens kept in full precision. ``nbytes`` is what the
    cache holds now: packed codes, scales, zero points and the residual. ``key_groups="token"``
    quantizes keys per token too, for comparison with KIVI's per-channel keys.
    """

    def __init__(self, bits: int = 2, group_size: int = 32, residual: int = 128, key_groups: str = "channel"):
        if isinstance(bits, bool) or bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        integer("group_size", group_size, 1)
        integer("residual", residual, 0)
        if key_groups not in KEY_GROUPS:
            raise ValueError(f"key_groups must be one of {KEY_GROUPS}, got {key_groups!r}")
        self.bits, self.group_size, self.residual, self.key_groups = bits, group_size, residual, key_groups
        super().__init__(lambda: QuantizedLayer(bits, group_size, residual, key_groups))


# --------------------------------------------------------------------------- where quantization error enters

def attention_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor,
                    v_hat: torch.Tensor) -> dict:
    """Relative error of attention outputs when only keys, only values, or both are approximated.

    ``q [..., m, d]``, ``k, v [..., n, d]``; fp64 softmax(q k^T / sqrt(d)) v. Key error enters through
    the scores (it reshapes the weights); value error through the weighted sum. Seed 002's contract:
    quantization error enters attention through both. Returns ``{"scores", "values", "both"}`` as
    ||o_hat - o|| / ||o||, plus ``"score_rmse"``, the RMS error of the scores themselves.
    """
    def attend(kk, vv):
        s = q.double() @ kk.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
        return s, torch.softmax(s, dim=-1) @ vv.double()

    s, o = attend(k, v)
    s_hat, o_k = attend(k_hat, v)
    _, o_v = attend(k, v_hat)
    _, o_kv = attend(k_hat, v_hat)
    rel = lambda a: float((a - o).norm() / o.norm())  # noqa: E731
    return {"scores": rel(o_k), "values": rel(o_v), "both": rel(o_kv),
            "score_rmse": float((s_hat - s).pow(2).mean().sqrt())}


def outlier_keys(tokens: int, head_dim: int, outlier_channels: int = 4, outlier_scale: float = 20.0,
                 seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Keys ``[tokens, head_dim]`` with a few channels ``outlier_scale`` times larger than the rest,
    and a per-channel offset, like the key outliers KIVI and KVQuant report (seed 004, 2.3)."""
    integer("tokens", tokens, 1)
    integer("head_dim", head_dim, 1)
    integer("outlier_channels", outlier_channels, 0, head_dim + 1)
    positive("outlier_scale", outlier_scale)
    integer("seed", seed, 0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, head_dim, generator=g, dtype=torch.float64)
    channels = torch.randperm(head_dim, generator=g)[:outlier_channels]
    k[:, channels] = k[:, channels] * outlier_scale + outlier_scale * torch.randn(outlier_channels, generator=g, dtype=torch.float64)
    return k.to(dtype)


# --------------------------------------------------------------------------- fewer entries: GQA and MLA

def gqa_from_mha(model, kv_heads: int):
    """A copy of a Llama-family model with ``kv_heads`` KV heads, made by mean-pooling (section 9.7).

    Consecutive groups of the model's KV heads are averaged into one (k_proj and v_proj rows and
    biases), as the GQA paper converts a multi-head checkpoint before uptraining; query head h keeps
    reading KV head h // (n_q / kv_heads). No uptraining here: the result shows the raw cost.
    """
    import copy

    config = model.config
    old = config.num_key_value_heads
    integer("kv_heads", kv_heads, 1)
    if old % kv_heads or config.num_attention_heads % kv_heads:
        raise ValueError(f"kv_heads must divide the model's {old} KV heads, got {kv_heads}")
    new_config = copy.deepcopy(config)
    new_config.num_key_value_heads = kv_heads
    pooled = type(model)(new_config).to(device=model.device, dtype=model.dtype).eval()
    state = model.state_dict()
    group = old // kv_heads
    for name, tensor in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            head_dim = tensor.shape[0] // old
            state[name] = tensor.reshape(kv_heads, group, head_dim, *tensor.shape[1:]).mean(1).flatten(0, 1)
    pooled.load_state_dict(state)
    pooled.generation_config = copy.deepcopy(model.generation_config)
    pooled.shape = dataclasses.replace(model.shape, kv_heads=kv_heads) if hasattr(model, "shape") else None
    return pooled


def kv_basis(attention, rank: int):
    """Rank-``rank`` orthonormal basis U ``[2 n_kv d_h, rank]`` of one layer's stacked K and V
    projections [W_k; W_v], from their SVD, and the stacked bias (zeros if none)."""
    w = torch.cat([attention.k_proj.weight, attention.v_proj.weight]).detach().double()
    u, _, _ = torch.linalg.svd(w, full_matrices=False)
    integer("rank", rank, 1)
    if rank > u.shape[1]:
        raise ValueError(f"rank must be <= {u.shape[1]} (the rank of [W_k; W_v]), got {rank}")
    bias = [p.bias if p.bias is not None else torch.zeros(p.out_features, device=w.device)
            for p in (attention.k_proj, attention.v_proj)]
    return u[:, :rank], torch.cat(bias).detach().double()


class LatentLayer(_KeepAllLayer):
    """One layer of an MLA-style latent cache: stores c = U^T([k; v] - b), rank numbers per token.

    Keys arrive rotated; the layer undoes the rotation (the latent must not depend on position),
    projects onto U and keeps only c. On read it up-projects [k; v] = U c + b and rotates keys back at
    their positions. With U of full rank this is exact; at rank r it equals attention with
    rank-r K and V projections.
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, basis: torch.Tensor, bias: torch.Tensor, inv_freq, scaling: float):
        super().__init__()
        self.basis, self.bias, self.inv_freq, self.scaling = basis, bias, inv_freq, scaling
        self.latent = self.positions = None

    def lazy_initialization(self, key_states, value_states):
        width = 2 * key_states.shape[1] * key_states.shape[-1]
        if self.basis.shape[0] != width:
            raise ValueError(f"this latent cache was built for [K; V] of {self.basis.shape[0]} elements per token, "
                             f"but the model writes {width} (2 x {key_states.shape[1]} KV heads x head_dim "
                             f"{key_states.shape[-1]}): build LatentKVCache from this model")
        self.device, self.dtype = key_states.device, key_states.dtype
        self.heads, self.head_dim = key_states.shape[1], key_states.shape[-1]
        self.basis, self.bias = self.basis.to(self.device, self.dtype), self.bias.to(self.device, self.dtype)
        self.latent = key_states.new_zeros((key_states.shape[0], 0, self.basis.shape[1]))
        self.positions = torch.zeros((key_states.shape[0], 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, count = key_states.shape[0], key_states.shape[-2]
        pos = _positions_from(kwargs, batch, count, self.positions.shape[-1], self.device)
        raw_k = rotate(key_states, -pos, self.inv_freq, 1.0) / self.scaling
        stacked = torch.cat([raw_k, value_states], dim=1).transpose(1, 2).flatten(2)  # [b, n, 2 h d]
        latent = torch.cat([self.latent, (stacked - self.bias) @ self.basis], dim=1)
        positions = torch.cat([self.positions, pos], dim=-1)
        self.latent, self.positions = latent, positions  # both or neither
        full = (self.latent @ self.basis.T + self.bias).unflatten(2, (2 * self.heads, self.head_dim)).transpose(1, 2)
        keys, values = full[:, : self.heads], full[:, self.heads:]
        return rotate(keys, self.positions, self.inv_freq, self.scaling), values

    def get_seq_length(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    @property
    def nbytes(self) -> int:
        return 0 if self.latent is None else self.latent.numel() * self.latent.element_size()

    def reset(self):
        self.latent = self.positions = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("LatentKVCache does not support crop")


class LatentKVCache(Cache):
    """An MLA-style low-rank latent cache for a RoPE model (section 9.7, DeepSeek-V2's idea).

    Per layer, the stacked K and V projections [W_k; W_v] are factored by SVD; the cache keeps a
    ``rank``-dimensional latent per token and up-projects it to keys and values on every read.
    Bytes per token: layers x rank x element size, against 2 x layers x n_kv x d_h for the full
    cache. Unlike DeepSeek-V2, which trains its latent and keeps d_r separate RoPE dimensions, this
    compresses a model that was not trained for it: the reconstruction error is the price.
    """

    def __init__(self, model, rank: int):
        inv_freq, scaling = rotary_of(model)
        layers = [LatentLayer(*kv_basis(layer.self_attn, rank), inv_freq, scaling)
                  for layer in model.model.layers]
        self.rank = rank
        super().__init__(layers=layers)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


# --------------------------------------------------------------------------- quality on a trained model

def sink_share(model, tokens: torch.Tensor, first: int = 1, skip: int = 16) -> torch.Tensor:
    """``[layers, heads]``: the mean share of attention each head puts on the first ``first`` tokens.

    One forward pass over ``tokens [n]`` (eager attention); averaged over the queries at positions
    ``skip`` to n - 1, where uniform attention would give ``uniform_share(n, first, skip)``. A head
    far above that is an attention sink (StreamingLLM), section 9.7.
    """
    integer("first", first, 1)
    integer("skip", skip, 0)
    ids = tokens.reshape(1, -1).to(model.device)
    if not ids.shape[1] > max(first, skip):
        raise ValueError(f"tokens must be longer than first ({first}) and skip ({skip}), got {ids.shape[1]}")
    with torch.inference_mode():
        out = model(ids, use_cache=False, output_attentions=True)
    if not out.attentions or out.attentions[0] is None:
        raise ValueError("the model returned no attention weights: use attn_implementation='eager'")
    weights = torch.stack([a[0].float() for a in out.attentions])  # [layers, heads, queries, keys]
    return weights[:, :, skip:, :first].sum(-1).mean(-1).cpu()


def uniform_share(n: int, first: int = 1, skip: int = 16) -> float:
    """What ``sink_share`` would be if every query at t spread its attention evenly over t + 1 keys."""
    return float(sum(min(1.0, first / (t + 1)) for t in range(skip, n)) / (n - skip))


@torch.inference_mode()
def recompute_stream_eval(model, tokens: torch.Tensor, window: int, start: int | None = None,
                          stride: int = 1, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding window with recomputation: token t + 1 predicted from the ``window`` newest tokens, run
    from scratch at positions 0..window-1 (no cache carried between steps), section 9.7.

    StreamingLLM's quality baseline: exact attention over the window, at window-squared work per
    token. Evaluated at positions t = start, start + stride, ... (``start`` defaults to window - 1,
    the first full window). Returns ``(positions [m], nll [m])``.
    """
    integer("window", window, 1)
    integer("stride", stride, 1)
    ids = tokens.reshape(-1).to(model.device)
    start = window - 1 if start is None else start
    integer("start", start, window - 1, len(ids) - 1)
    positions = torch.arange(start, len(ids) - 1, stride)
    nll = []
    for chunk in positions.split(batch):
        x = torch.stack([ids[t - window + 1: t + 1] for t in chunk])
        logits = model(x, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        nll.append(torch.nn.functional.cross_entropy(logits, ids[chunk + 1], reduction="none"))
    return positions, torch.cat(nll).cpu()


def cached_keys_values(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys (rotated, as cached) and values of one forward pass over ``tokens [n]``:
    two ``[layers, kv_heads, n, head_dim]`` tensors. What a KV cache would hold, section 9.7."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        model(tokens.reshape(1, -1).to(model.device), use_cache=True, **cache_kwargs(model, cache))
    keys = torch.stack([layer.keys[0] for layer in cache.layers]).float().cpu()
    values = torch.stack([layer.values[0] for layer in cache.layers]).float().cpu()
    return keys, values


def channel_rms(x: torch.Tensor) -> torch.Tensor:
    """``[..., head_dim]``: RMS of each channel over the tokens of ``x [..., tokens, head_dim]``."""
    return x.float().pow(2).mean(-2).sqrt()


@torch.inference_mode()
def quantized_cache_quality(model, chunks: torch.Tensor, bits: int | None, group_size: int = 32,
                            key_groups: str = "channel") -> dict:
    """Perplexity of ``chunks [batch, n]`` when every cached key and value is quantized, section 9.7.

    Each chunk is one prefill through ``QuantizedKVCache(bits, group_size, residual=0, key_groups)``
    so attention reads the quantized keys and values of every complete group (the last partial group
    of ``group_size`` tokens stays exact, as KIVI's residual does); ``bits=None`` is the full-precision
    cache. Returns ``{"ppl", "logits", "nbytes", "full_bytes"}``, where ``nbytes`` is what the cache
    holds and ``full_bytes`` what the same tokens take unquantized.
    """
    from transformers import DynamicCache

    if bits is not None and (isinstance(bits, bool) or bits not in BITS):
        raise ValueError(f"bits must be None (full precision) or one of {BITS}, got {bits!r}")
    ids = chunks.to(model.device)
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"chunks must be [batch, n] with n >= 2, got shape {tuple(ids.shape)}")
    cache = DynamicCache() if bits is None else QuantizedKVCache(bits, group_size, residual=0, key_groups=key_groups)

    logits = model(ids, use_cache=True, **cache_kwargs(model, cache)).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    shape = ModelShape.from_config(model.config)
    full = ids.numel() * shape.kv_bytes_per_token(next(model.parameters()).element_size())
    nbytes = sum(_layer_nbytes(layer) for layer in cache.layers)
    return {"ppl": float(nll.exp()), "logits": logits.cpu(), "nbytes": nbytes, "full_bytes": int(full)}


# --------------------------------------------------------------------------- a long token stream

@dataclass(frozen=True)
class StreamResult:
    """Per-step results of feeding a token stream one token at a time (section 9.7)."""

    nll: torch.Tensor  # [steps] negative log-likelihood of the next token
    logprobs: torch.Tensor  # [steps, vocab] next-token log-probabilities
    mass_first: torch.Tensor | None  # [steps] attention mass on the first tokens (positions < first)
    mass_recent: torch.Tensor | None  # [steps] attention mass on the most recent tokens
    stored: int  # tokens held per layer at the end


@torch.inference_mode()
def stream_eval(model, tokens: torch.Tensor, cache=None, first: int = 4, recent: int = 64,
                attention: bool = False) -> StreamResult:
    """Feed ``tokens [n]`` one at a time through ``model`` with ``cache`` (None: a full cache).

    Step t predicts token t + 1 from everything the cache lets it see. With ``attention=True`` (the
    model must use eager attention) it also records, averaged over layers and heads, how much
    attention mass the newest query puts on the first ``first`` tokens of the stream and on the
    ``recent`` newest ones (absolute positions).
    """
    from transformers import DynamicCache

    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}")
    integer("first", first, 0)
    integer("recent", recent, 0)
    cache = DynamicCache() if cache is None else cache
    ids = tokens.reshape(1, -1).to(model.device)
    n = ids.shape[1]
    if n < 2:
        raise ValueError(f"tokens must hold at least 2 tokens (one prediction), got {n}")
    logprobs, mass_first, mass_recent = [], [], []
    for t in range(n - 1):
        out = model(ids[:, t: t + 1], position_ids=torch.tensor([[t]], device=model.device),
                    **cache_kwargs(model, cache), use_cache=True, output_attentions=attention)
        logprobs.append(torch.log_softmax(out.logits[0, -1].float(), -1))
        if attention:
            weights = torch.stack([a[0, :, -1].float() for a in out.attentions])  # [layers, heads, kv]
            pos = _retained_positions(cache, weights.shape[-1], t)
            mass = weights.mean((0, 1))
            mass_first.append(float(mass[pos < first].sum()))
            mass_recent.append(float(mass[pos > t - recent].sum()))
    logprobs = torch.stack(logprobs)
    nll = -logprobs.gather(1, ids[0, 1:, None].to(logprobs.device))[:, 0]
    as_tensor = lambda xs: torch.tensor(xs) if attention else None  # noqa: E731
    stored = cache.stored_tokens if hasattr(cache, "stored_tokens") else cache.get_seq_length()
    return StreamResult(nll.cpu(), logprobs.cpu(), as_tensor(mass_first), as_tensor(mass_recent), stored)


def _retained_positions(cache, kv_length: int, t: int) -> torch.Tensor:
    layer = cache.layers[0]
    if getattr(layer, "positions", None) is not None:
        return layer.positions[0].cpu()
    return torch.arange(t - kv_length + 1, t + 1)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row of two ``[steps, vocab]`` log-probability tensors, in nats."""
    for name, t in (("reference", reference), ("other", other)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating torch.Tensor of log-probabilities, got {type(t).__name__}")
    if reference.shape != other.shape:
        raise ValueError(f"reference and other must share one shape [steps, vocab], got {tuple(reference.shape)} "
                         f"and {tuple(other.shape)}")
    return (reference.exp() * (reference - other)).sum(-1)


# --------------------------------------------------------------------------- benchmark

def bench_rows(reps: int = 2) -> list:
    """Decode step time at long context for full, windowed and quantized caches (section 9.7).

    One prompt of P tokens, then G decode steps per cache, the caches interleaved ``reps`` times;
    rows give the median step time and the ratios to the full cache, measured in the same run.
    CPU: the tiny Llama at P = 512. GPU: the Llama-3.2-1B shape (random weights, bf16) at
    P = 32,768, window 4,096, KIVI 4-bit.
    """
    import statistics

    from kvlab.lab.bench import Row
    from kvlab.decode import profile_decode
    from kvlab.lab.hardware import on_gpu
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real", max_positions=40_000) if gpu else tiny_model("llama")
    P, G, W = (32_768, 32, 4096) if gpu else (512, 12, 128)
    prompt = torch.randint(0, model.config.vocab_size, (1, P), device=model.device)
    makers = {
        "full": lambda: None,
        f"window {W}": lambda: SlidingWindowCache(W),
        "KIVI 4-bit": lambda: QuantizedKVCache(bits=4, group_size=32, residual=128),
        "KIVI 2-bit": lambda: QuantizedKVCache(bits=2, group_size=32, residual=128),
    }
    profile_decode(model, prompt[:, :64], 4, method="cached")  # warm-up
    steps: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(reps):
        for name, make in makers.items():
            p = profile_decode(model, prompt, G, method="cached", cache=make())
            steps[name].extend(p.step_times[2:])
    median = {name: statistics.median(ts) for name, ts in steps.items()}
    where = f"{model.shape.name}, {str(model.dtype).removeprefix('torch.')}, P={P:,}, batch 1"
    rows = [Row(f"decode step, {name} cache", median[name] * 1e3, "ms", where) for name in makers]
    rows += [Row(f"{name} / full step time", median[name] / median["full"], "x", "ratio of medians, same run")
             for name in makers if name != "full"]
    return rows


def eviction_mask(n: int, num_sink: int = 0, window: int | None = None) -> torch.Tensor:
    """``[n, n]`` boolean mask of what a token-by-token stream through ``SinkCache(num_sink, window)``
    (``rope="original"``) lets each query see: itself, the first ``num_sink`` tokens and the
    ``window`` newest (all earlier tokens when ``window`` is None). Section 9.7."""
    integer("n", n, 0)
    integer("num_sink", num_sink, 0)
    if window is not None:
        integer("window", window, 1)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (j < num_sink) | (i - j < window)
    return allowed


def _in_cache_attention(num_sink: int, window: int, inv_freq: torch.Tensor):
    """Eager attention in which the sink keys sit at their slots of ``SinkCache(num_sink, window,
    rope="cache")``: for the query at t, sink i is min(t, S + W - 1) - i positions back, not t - i.

    Every other key is at its true distance, as in the cache. RoPE scores depend only on the
    difference of positions, so rotating the query back by max(0, t - S - W + 1) and scoring it
    against the sinks as stored gives the same scores as moving the sinks.
    """
    from transformers.models.llama.modeling_llama import repeat_kv

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        keys = repeat_kv(key, module.num_key_value_groups)
        values = repeat_kv(value, module.num_key_value_groups)
        scores = query @ keys.transpose(2, 3) * scaling
        if num_sink:
            n = query.shape[-2]
            shift = (torch.arange(n, device=query.device) - (num_sink + window - 1)).clamp(min=0)
            back = rotate(query, -shift, inv_freq, 1.0)
            scores[..., :num_sink] = back @ keys[..., :num_sink, :].transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return (weights @ values).transpose(1, 2).contiguous(), weights

    return attention


@torch.inference_mode()
def masked_stream_eval(model, tokens: torch.Tensor, num_sink: int = 0, window: int | None = None,
                       first: int = 4, recent: int = 64, rope: str = "original") -> StreamResult:
    """``stream_eval`` in one forward pass: the same attention as streaming the tokens one at a time
    through ``SinkCache(num_sink, window, rope=rope)``, expressed as an explicit mask.

    The model must use eager attention (for the attention mass). ``rope="cache"`` (StreamingLLM's
    positions inside the cache) swaps in an attention function that scores the sinks at their
    in-cache distance for the length of the call. Much faster than stepping on a CPU; tests check
    both conventions against the cache itself.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}")
    integer("num_sink", num_sink, 0)
    if window is not None:
        integer("window", window, 1)  # window 0 would leave a query nothing to attend to
    integer("first", first, 0)
    integer("recent", recent, 0)
    if rope not in ROPE_MODES:
        raise ValueError(f"rope must be one of {ROPE_MODES}, got {rope!r}")
    ids = tokens.reshape(1, -1).to(model.device)
    n = ids.shape[1]
    if n < 2:
        raise ValueError(f"tokens must hold at least 2 tokens (one prediction), got {n}")
    allowed = eviction_mask(n, num_sink, window).to(model.device)
    mask = torch.zeros(n, n, dtype=model.dtype, device=model.device)
    mask = mask.masked_fill(~allowed, torch.finfo(model.dtype).min)[None, None]
    if rope == "cache" and window is not None:
        from transformers import AttentionInterface

        AttentionInterface.register("kvlab_in_cache", _in_cache_attention(num_sink, window, rotary_of(model)[0]))
        before = model.config._attn_implementation
        model.config._attn_implementation = "kvlab_in_cache"
        try:
            out = model(ids, attention_mask=mask, use_cache=False, output_attentions=True)
        finally:
            model.config._attn_implementation = before
    else:
        out = model(ids, attention_mask=mask, use_cache=False, output_attentions=True)
    logprobs = torch.log_softmax(out.logits[0, :-1].float(), -1)
    nll = -logprobs.gather(1, ids[0, 1:, None])[:, 0]
    weights = torch.stack([a[0].float() for a in out.attentions]).mean((0, 1))[:-1]  # [n-1 queries, n keys]
    t = torch.arange(n - 1, device=weights.device)[:, None]
    j = torch.arange(n, device=weights.device)[None, :]
    mass_first = (weights * (j < first)).sum(-1)
    mass_recent = (weights * (j > t - recent)).sum(-1)
    stored = n - 1 if window is None else min(n - 1, num_sink + window)
    return StreamResult(nll.cpu(), logprobs.cpu(), mass_first.cpu(), mass_recent.cpu(), stored)
