"""Notebooks 07 and 08: the bytes a real transformers cache holds, counted from its tensors.

A prediction of cache size is only as good as what it is checked against: these functions sum the
``nbytes`` of every tensor a Hugging Face cache (Wolf et al. 2020) keeps, attention layers' keys
and values and linear-attention layers' convolution and recurrent states alike, so notebook 07 can
assert that a Llama, a Mamba and a Jamba hold exactly the bytes ``kvlab.theory.ssm`` predicts.
"""

from __future__ import annotations

import torch
from transformers import Cache

from kvlab._checks import instance


def cache_nbytes(cache) -> int:
    """Bytes a transformers cache actually holds: the sum of its tensors' ``nbytes`` (section 9.6).

    Counts each layer's ``keys`` and ``values`` (attention) and ``conv_states`` and
    ``recurrent_states`` (Mamba and other linear-attention layers)."""
    instance("cache", cache, Cache, "a transformers Cache")
    total = 0
    for layer in cache.layers:
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        tensors += layer_states(layer, "conv_states") + layer_states(layer, "recurrent_states")
        total += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))
    return total


def layer_states(layer, name: str) -> list:
    """A linear-attention cache layer's ``conv_states`` or ``recurrent_states`` as a list of
    tensors: transformers 5.14 and later keep a dict of them per layer, 5.5 to 5.13 one tensor."""
    states = getattr(layer, name, None)
    if states is None:
        return []
    return [t for t in states.values() if t is not None] if isinstance(states, dict) else [states]


def layer_kinds(cache) -> list[str]:
    """``"attention"`` or ``"ssm"`` for each layer of a transformers cache."""
    instance("cache", cache, Cache, "a transformers Cache")
    return ["ssm" if hasattr(layer, "recurrent_states") else "attention" for layer in cache.layers]
