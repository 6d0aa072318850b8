"""Notebook 08, long-context variants (section 9.7): what the long-context caches share.

Every cache of ``kvlab.cache.window``, ``kvlab.cache.quantized`` and ``kvlab.cache.latent`` plugs
into a Hugging Face model (Wolf et al. 2020) through transformers' ``Cache`` API: a list of layers,
each with ``update``, ``get_seq_length`` and ``get_mask_sizes``. This module holds the few pieces
they have in common:

- ``LayeredCache``: a cache whose layers are made on first use (a cache built before the model
  runs does not know its layer count), with ``stored_tokens`` and ``nbytes`` over all layers;
- ``KeepAllLayer``: a layer that keeps every token it was given, in whatever compressed form, so
  the attention mask spans the whole history;
- ``written_positions``: the absolute positions of the tokens an ``update`` writes;
- ``layer_nbytes``: the bytes one layer holds.

``get_seq_length`` is the number of tokens the sequence has seen (its next absolute position),
not the number retained.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def written_positions(kwargs, batch: int, count: int, seen: int, device) -> torch.Tensor:
    """Absolute positions ``[batch, count]`` of the tokens being written.

    transformers passes the attention layer's kwargs (``position_ids`` among them) to
    ``Cache.update``; without them, the tokens follow on from those already seen.
    """
    pos = (kwargs.get("kwargs") or {}).get("position_ids") if kwargs else None
    if pos is not None and pos.shape[-1] == count:
        return pos.to(device).expand(batch, count)
    return (torch.arange(count, device=device) + seen).expand(batch, count)


class LayeredCache(Cache):
    """A Cache whose layers are made on first use by ``make_layer()`` (the model's layer count is
    not known until it runs)."""

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
        return max(
            (layer.stored_tokens for layer in self.layers if layer.is_initialized), default=0
        )

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now, over all layers."""
        return sum(layer_nbytes(layer) for layer in self.layers)


def layer_nbytes(layer) -> int:
    """Bytes one cache layer holds now: its own ``nbytes`` if it counts them, else its keys and
    values."""
    if hasattr(layer, "nbytes"):
        return layer.nbytes
    if layer.keys is None:
        return 0
    return (
        layer.keys.numel() * layer.keys.element_size()
        + layer.values.numel() * layer.values.element_size()
    )


class KeepAllLayer(CacheLayerMixin):
    """A layer that keeps every token it was given (compressed): masks span the whole history."""

    @property
    def stored_tokens(self) -> int:
        return self.get_seq_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers < 5.13 asks under this name
        return self.get_max_length()
