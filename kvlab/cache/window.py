"""Notebook 08, long-context variants (section 9.7): bounded caches, a sliding window and attention
sinks.

A sliding window keeps the ``window`` most recent tokens per layer, as Mistral 7B's rolling buffer
does (Jiang et al. 2023); StreamingLLM (Xiao et al. 2024) also keeps the first ``num_sink`` tokens,
the attention sinks that stabilise windowed eviction. Both hold at most ``num_sink + window``
tokens per layer by construction, and ``kvlab.cached_decode(..., cache=...)`` accepts them.

With RoPE there are two conventions (``kvlab.cache.rope``): ``rope="original"`` stores keys as the
model rotated them, at their absolute positions; ``rope="cache"``, StreamingLLM's, stores them
before rotation and rotates them on read at their slots inside the cache, so no distance exceeds
the cache's length.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from kvlab._checks import causal_lm, integer, one_of
from kvlab.cache.hf_cache import LayeredCache, written_positions
from kvlab.cache.rope import rotary_of, rotate

ROPE_MODES = ("original", "cache")


class BoundedLayer(CacheLayerMixin):
    """One layer of a cache that keeps the first ``num_sink`` tokens plus the ``window`` most
    recent.

    Decoding one token per step, each query sees at most ``num_sink + window`` keys, itself
    included, and the layer never stores more. A multi-token chunk (the prompt) sees the retained
    cache plus itself, causally, and is trimmed after use: eviction happens after prefill.

    ``rope="original"``: keys are stored as the model rotated them, at their absolute positions, so
    a query at t meets a retained key at its true distance t - p. ``rope="cache"`` (StreamingLLM):
    keys are stored before rotation (the layer undoes the model's rotation on write) and are rotated
    on read at their slots in the cache, so distances never exceed ``num_sink + window``.
    """

    is_sliding = True
    is_compileable = False
    is_croppable = False

    def __init__(
        self,
        num_sink: int,
        window: int,
        rope: str = "original",
        inv_freq=None,
        scaling: float = 1.0,
    ):
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
        return torch.cat(
            [
                torch.arange(self.num_sink, device=self.device),
                torch.arange(n - self.window, n, device=self.device),
            ]
        )

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, count = key_states.shape[0], key_states.shape[-2]
        new_pos = written_positions(kwargs, batch, count, self.seen, self.device)
        if self.rope == "cache":
            # Undo the model's rotation (HF multiplies cos and sin by attention_scaling).
            key_states = rotate(key_states, -new_pos, self.inv_freq, 1.0) / self.scaling
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        positions = torch.cat([self.positions, new_pos], dim=-1)
        keep = self._keep(keys.shape[-2])
        # Everything that can fail is done: only now change the layer (a failed update changes
        # nothing).
        self.keys, self.values, self.positions = (
            keys[..., keep, :],
            values[..., keep, :],
            positions[:, keep],
        )
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

    @property
    def stored_tokens(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        stored = 0 if self.keys is None else self.keys.shape[-2]
        kv_length = (
            min(stored + 1, self.num_sink + self.window)
            if query_length == 1
            else stored + query_length
        )
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


def _rope_args(rope: str, model):
    one_of("rope", rope, ROPE_MODES)
    if model is not None:
        causal_lm("model", model)
    if rope == "original":
        return None, 1.0
    if model is None:
        raise ValueError(
            "rope='cache' needs model= (the cache re-rotates keys with the model's RoPE"
            " frequencies)"
        )
    return rotary_of(model)


class SinkCache(LayeredCache):
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
