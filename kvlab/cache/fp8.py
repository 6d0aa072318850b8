"""Notebook 08, long-context variants (section 9.7): an FP8 KV cache, what serving engines ship.

vLLM and SGLang store the cache in 8-bit floating point when asked (``kv_cache_dtype="fp8"``,
OCP's E4M3 format: 4 exponent bits, 3 mantissa bits, largest finite value 448). Each layer's keys
and values carry one scale per tensor, ``amax / 448``, so that the largest element lands on the
format's largest value; engines calibrate it on sample data, or read it from the checkpoint, and
keep it fixed while serving. ``FP8KVCache`` does the same: each layer's scales are set by the first
tokens it sees (the prompt's prefill) and later tokens are clamped into that range.

Unlike the integer groups of ``kvlab.cache.quantized``, a float format keeps a relative precision
(an element is rounded to within 2^-4 of itself) over a wide range with one scale, and needs no
zero point: one byte per element and two scales per layer.
"""

from __future__ import annotations

import torch

from kvlab.cache.hf_cache import KeepAllLayer, LayeredCache

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448.0


def fp8_scale(x: torch.Tensor) -> torch.Tensor:
    """One per-tensor scale, ``amax / 448`` (1 for an all-zero tensor), as a float32 scalar."""
    amax = x.detach().abs().amax().float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` rounded to E4M3, clamped to its finite range (an element past the calibrated
    range saturates instead of becoming NaN)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def from_fp8(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (codes.float() * scale).to(dtype)


class FP8Layer(KeepAllLayer):
    """One layer of an FP8 cache: keys and values stored in E4M3 with one fixed scale each."""

    is_sliding = False
    is_compileable = False

    def __init__(self):
        super().__init__()
        self.key_scale = self.value_scale = None

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_scale, self.value_scale = fp8_scale(key_states), fp8_scale(value_states)
        self.keys = to_fp8(key_states[..., :0, :], self.key_scale)
        self.values = to_fp8(value_states[..., :0, :], self.value_scale)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, to_fp8(key_states, self.key_scale)], dim=-2)
        self.values = torch.cat([self.values, to_fp8(value_states, self.value_scale)], dim=-2)
        return (
            from_fp8(self.keys, self.key_scale, self.dtype),
            from_fp8(self.values, self.value_scale, self.dtype),
        )

    def get_seq_length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    @property
    def nbytes(self) -> int:
        """One byte per stored element, plus the two float32 scales."""
        if not self.is_initialized:
            return 0
        return self.keys.numel() + self.values.numel() + 2 * 4

    def reset(self):
        self.keys = self.values = self.key_scale = self.value_scale = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("FP8KVCache does not support crop")


class FP8KVCache(LayeredCache):
    """An FP8 (E4M3) KV cache with one scale per layer for keys and one for values, set by the first
    tokens each layer sees; usable in ``cached_decode(..., cache=...)`` (section 9.7)."""

    def __init__(self):
        super().__init__(FP8Layer)
