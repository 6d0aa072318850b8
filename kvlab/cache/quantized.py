"""Notebook 08, long-context variants (section 9.7): a KV cache with narrower entries, in KIVI's
layout.

``quantize`` stores a tensor at 2, 4 or 8 bits in groups: each group of ``group_size`` consecutive
elements along one axis shares a scale and a zero point (its minimum), x ~ code x scale + zero,
and the codes are packed 8 // bits to a byte. Rounding to the nearest level bounds every element's
error by half its group's step (the KV Cache Memory Wall, 2026, section 2.3).

``QuantizedKVCache`` is KIVI's cache (Liu et al. 2024): keys quantized per channel (groups that
span tokens, because a few key channels carry outliers; Hooper et al. 2024), values per token,
and the ``residual`` newest tokens kept exact until a whole group has arrived. Its ``nbytes`` is
what it holds now, codes, scales, zero points and residual; ``kvlab.theory.cache_sizes.kivi_nbytes``
predicts it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvlab._checks import integer, one_of
from kvlab.cache.hf_cache import KeepAllLayer, LayeredCache
from kvlab.theory.cache_sizes import BITS

KEY_GROUPS = ("channel", "token")


@dataclass(frozen=True)
class QuantizedTensor:
    """Asymmetric min-max quantization in groups, with packed codes (section 9.7; KV Cache Memory
    Wall, 2026, section 2.3).

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
        return _ungroup(
            self.scale.expand(*self.scale.shape[:-1], self.group_size), self.axis, self.shape
        )

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
        raise TypeError(
            f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    one_of("bits", bits, BITS)  # 4.0 too is refused: bits shift and pack codes
    integer("group_size", group_size, 1)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -x.dim() <= axis < x.dim():
        raise ValueError(
            f"axis must be an int in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d tensor, got"
            f" {axis!r}"
        )
    axis = axis % x.dim()
    if x.shape[axis] % group_size:
        raise ValueError(
            f"group_size ({group_size}) must divide the length of axis {axis} ({x.shape[axis]})"
        )
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


def _cat_quantized(a: QuantizedTensor | None, b: QuantizedTensor, axis: int) -> QuantizedTensor:
    """Join two quantized tensors of the same layout along ``axis`` of the original shape."""
    if a is None:
        return b
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    dim = -2 if axis == a.axis else _moved_shape(range(len(shape)), a.axis).index(axis)
    cat = lambda x, y: torch.cat([x, y], dim=dim)  # noqa: E731
    return dataclasses.replace(
        a,
        codes=cat(a.codes, b.codes),
        scale=cat(a.scale, b.scale),
        zero=cat(a.zero, b.zero),
        shape=tuple(shape),
    )


class QuantizedLayer(KeepAllLayer):
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
            raise ValueError(
                f"group_size ({self.group_size}) must divide the head dimension "
                f"({key_states.shape[-1]}): values are quantized per token in channel groups"
            )
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
            qkeys = _cat_quantized(
                qkeys, quantize(oldest_k, self.bits, g, axis=self.key_axis), axis=2
            )
            qvalues = _cat_quantized(qvalues, quantize(oldest_v, self.bits, g, axis=-1), axis=2)
        # Everything that can fail is done: only now change the layer (a failed update changes
        # nothing).
        self.keys, self.values, self.qkeys, self.qvalues = keys, values, qkeys, qvalues
        if self.qkeys is None:
            return self.keys, self.values
        return (
            torch.cat([self.qkeys.dequantize(), self.keys], dim=-2),
            torch.cat([self.qvalues.dequantize(), self.values], dim=-2),
        )

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


class QuantizedKVCache(LayeredCache):
    """KIVI's KV-cache layout, usable in ``cached_decode(..., cache=...)`` (section 9.7).

    Keys per channel and values per token, at ``bits`` in {2, 4, 8} with ``group_size``-element
    groups, and the ``residual`` most recent tokens kept in full precision. ``nbytes`` is what the
    cache holds now: packed codes, scales, zero points and the residual. ``key_groups="token"``
    quantizes keys per token too, for comparison with KIVI's per-channel keys.
    """

    def __init__(
        self, bits: int = 2, group_size: int = 32, residual: int = 128, key_groups: str = "channel"
    ):
        one_of("bits", bits, BITS)
        integer("group_size", group_size, 1)
        integer("residual", residual, 0)
        one_of("key_groups", key_groups, KEY_GROUPS)
        self.bits, self.group_size, self.residual, self.key_groups = (
            bits,
            group_size,
            residual,
            key_groups,
        )
        super().__init__(lambda: QuantizedLayer(bits, group_size, residual, key_groups))
