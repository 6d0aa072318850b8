"""Notebook 08, long-context variants (section 9.7): fewer entries per token, by sharing or by
projection.

- ``gqa_from_mha``: a copy of a Llama-family model with fewer KV heads, each the mean of a group
  of the original heads, as Ainslie et al. 2023 convert a multi-head checkpoint before uptraining
  (without the uptraining: the result shows the raw cost);
- ``LatentKVCache``: an MLA-style cache (DeepSeek-AI 2024) that keeps, per layer and token, a
  ``rank``-dimensional latent of the stacked keys and values and up-projects it on every read.
  Unlike DeepSeek-V2, which trains its latent and keeps separate RoPE dimensions, it compresses a
  model that was not trained for it: the reconstruction error is the price.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from transformers.cache_utils import Cache

from kvlab._checks import integer
from kvlab.cache.hf_cache import KeepAllLayer, written_positions
from kvlab.cache.rope import rotary_of, rotate


def gqa_from_mha(model, kv_heads: int):
    """A copy of a Llama-family model with ``kv_heads`` KV heads, made by mean-pooling (section
    9.7).

    Consecutive groups of the model's KV heads are averaged into one (k_proj and v_proj rows and
    biases), as the GQA paper converts a multi-head checkpoint before uptraining; query head h keeps
    reading KV head h // (n_q / kv_heads). No uptraining here: the result shows the raw cost.
    """
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
            state[name] = (
                tensor.reshape(kv_heads, group, head_dim, *tensor.shape[1:]).mean(1).flatten(0, 1)
            )
    pooled.load_state_dict(state)
    pooled.generation_config = copy.deepcopy(model.generation_config)
    pooled.shape = (
        dataclasses.replace(model.shape, kv_heads=kv_heads) if hasattr(model, "shape") else None
    )
    return pooled


def kv_basis(attention, rank: int | None = None):
    """Rank-``rank`` orthonormal basis U ``[2 n_kv d_h, rank]`` of one layer's stacked K and V
    projections [W_k; W_v], from their SVD (columns by falling singular value; ``rank=None``: all
    of them), and the stacked bias (zeros if none)."""
    w = torch.cat([attention.k_proj.weight, attention.v_proj.weight]).detach().double()
    u, _, _ = torch.linalg.svd(w, full_matrices=False)
    if rank is not None:
        _check_rank(rank, u.shape[1])
        u = u[:, :rank]
    bias = [
        p.bias if p.bias is not None else torch.zeros(p.out_features, device=w.device)
        for p in (attention.k_proj, attention.v_proj)
    ]
    return u, torch.cat(bias).detach().double()


def kv_bases(model) -> list:
    """``kv_basis`` of every layer at full rank: one SVD per layer, to build ``LatentKVCache``s of
    several ranks from (``LatentKVCache(model, rank, bases=...)`` keeps the first ``rank`` columns).
    """
    return [kv_basis(layer.self_attn) for layer in model.model.layers]


def _check_rank(rank: int, full: int) -> None:
    integer("rank", rank, 1)
    if rank > full:
        raise ValueError(f"rank must be <= {full} (the rank of [W_k; W_v]), got {rank}")


class LatentLayer(KeepAllLayer):
    """One layer of an MLA-style latent cache: stores c = U^T([k; v] - b), rank numbers per token.

    Keys arrive rotated; the layer undoes the rotation (the latent must not depend on position),
    projects onto U and keeps only c. On read it up-projects [k; v] = U c + b and rotates keys back
    at their positions. With U of full rank this is exact; at rank r it equals attention with rank-r
    K and V projections.
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
            raise ValueError(
                f"this latent cache was built for [K; V] of {self.basis.shape[0]} elements per"
                f" token, but the model writes {width} (2 x {key_states.shape[1]} KV heads x"
                f" head_dim {key_states.shape[-1]}): build LatentKVCache from this model"
            )
        self.device, self.dtype = key_states.device, key_states.dtype
        self.heads, self.head_dim = key_states.shape[1], key_states.shape[-1]
        self.basis, self.bias = (
            self.basis.to(self.device, self.dtype),
            self.bias.to(self.device, self.dtype),
        )
        self.latent = key_states.new_zeros((key_states.shape[0], 0, self.basis.shape[1]))
        self.positions = torch.zeros((key_states.shape[0], 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, count = key_states.shape[0], key_states.shape[-2]
        pos = written_positions(kwargs, batch, count, self.positions.shape[-1], self.device)
        raw_k = rotate(key_states, -pos, self.inv_freq, 1.0) / self.scaling
        stacked = (
            torch.cat([raw_k, value_states], dim=1).transpose(1, 2).flatten(2)
        )  # [b, n, 2 h d]
        latent = torch.cat([self.latent, (stacked - self.bias) @ self.basis], dim=1)
        positions = torch.cat([self.positions, pos], dim=-1)
        self.latent, self.positions = latent, positions  # both or neither
        full = (
            (self.latent @ self.basis.T + self.bias)
            .unflatten(2, (2 * self.heads, self.head_dim))
            .transpose(1, 2)
        )
        keys, values = full[:, : self.heads], full[:, self.heads :]
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

    Per layer, the stacked K and V projections [W_k; W_v] are factored by SVD (or taken from
    ``bases=kv_bases(model)``, computed once for several ranks); the cache keeps a
    ``rank``-dimensional latent per token and up-projects it to keys and values on every read.
    Bytes per token: layers x rank x element size, against 2 x layers x n_kv x d_h for the full
    cache. Unlike DeepSeek-V2, which trains its latent and keeps d_r separate RoPE dimensions, this
    compresses a model that was not trained for it: the reconstruction error is the price.
    """

    def __init__(self, model, rank: int, bases: list | None = None):
        inv_freq, scaling = rotary_of(model)
        if bases is None:
            bases = [kv_basis(layer.self_attn, rank) for layer in model.model.layers]
        elif not isinstance(bases, list) or len(bases) != len(model.model.layers):
            raise ValueError(
                "bases must be kv_bases(model), one (U, bias) per layer of the model's "
                f"{len(model.model.layers)}, got {type(bases).__name__}"
            )
        for u, _ in bases:
            _check_rank(rank, u.shape[1])
        layers = [LatentLayer(u[:, :rank], bias, inv_freq, scaling) for u, bias in bases]
        self.rank = rank
        super().__init__(layers=layers)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
