"""Notebook 08, long-context variants (section 9.7): rotary position embeddings, applied to a cache.

RoPE (Su et al. 2021) rotates each pair of a query's or key's channels by an angle proportional to
its position, so a score q_t . k_p depends only on t - p. A cached key therefore already carries its
rotation (KV Cache articles, 2026): a cache that moves, evicts or compresses keys must undo the
model's rotation or rotate again with care. ``rotate`` applies Hugging Face's half-split
convention at any (even negative) positions, and rotations compose; ``rotary_of`` reads a model's
frequencies.
"""

from __future__ import annotations

import torch


def rotate(
    x: torch.Tensor, positions, inv_freq: torch.Tensor, scaling: float = 1.0
) -> torch.Tensor:
    """Rotate ``x [..., n, d]`` by RoPE at ``positions`` (``[n]`` or ``[batch, n]``; any real
    numbers).

    Hugging Face's half-split convention (``rotate_half``): dimension i pairs with i + d/2 at
    frequency ``inv_freq[i]``. Rotations compose: rotating by p and then by q is rotating by p + q,
    so a negative position undoes a rotation. Computed in fp32 (fp64 for fp64 inputs).
    """
    if (
        not isinstance(x, torch.Tensor)
        or not x.dtype.is_floating_point
        or x.dim() < 2
        or x.shape[-1] % 2
    ):
        raise ValueError(
            "x must be a floating tensor [..., n, d] with an even d, got"
            f" {getattr(x, 'shape', x)!r}"
        )
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    pos = (
        positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions, dtype=work)
    )
    pos = pos.to(device=x.device, dtype=work)
    if pos.dim() not in (1, 2) or pos.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"positions must be [n] or [batch, n] with n = {x.shape[-2]} (x's tokens), "
            f"got shape {tuple(pos.shape)}"
        )
    if tuple(inv_freq.shape) != (x.shape[-1] // 2,):
        raise ValueError(
            f"inv_freq must have d/2 = {x.shape[-1] // 2} elements, got shape"
            f" {tuple(inv_freq.shape)}"
        )
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
        raise ValueError(
            f"model {type(model).__name__} has no rotary embedding (RoPE); "
            "rope='cache' needs one (gpt2 uses learned positions)"
        )
    return emb.inv_freq.detach(), float(getattr(emb, "attention_scaling", 1.0))
