"""Notebooks 05, 06 and 11: the paged KV cache, per-layer K and V pools over one block manager.

``k_pools[layer]`` and ``v_pools[layer]`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``
(Kwon et al. 2023); every layer shares one :class:`~kvlab.cache.block_manager.BlockManager`'s
block tables. A model step (:mod:`kvlab.serving`) reserves its slots, stores every layer's K and V
and commits; notebook 05 writes by hand, one layer at a time (``append``). ``fork`` shares every
block, and the first write into a shared, partly filled last block copies it (copy-on-write). A
call that fails changes nothing (``all_or_nothing``, under the block manager's rollback rule).
"""

from __future__ import annotations

import functools
from collections import Counter

import torch

from kvlab import kernels
from kvlab._checks import restoring
from kvlab.cache import _checks
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.blocks import PREEMPTION_MODES
from kvlab.devices import device as default_device


def _ask_manager(query):
    """The block manager's ``query``, asked of a paged cache (same name, signature and doc)."""

    @functools.wraps(query)
    def ask(self, *args, **kwargs):
        return query(self.manager, *args, **kwargs)

    return ask


class PagedKVCache:
    """``store`` writes the by-hand ``append`` (default :func:`kvlab.kernels.store_kv`)."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype=torch.float16,
        device=None,
        store=None,
        prefix_caching: bool = False,
    ):
        sizes = num_layers, block_size, num_kv_heads, head_dim
        *sizes, self.dtype, self._store, device = _checks.cache_args(*sizes, dtype, store, device)
        self.num_layers, self.block_size, self.num_kv_heads, self.head_dim = sizes
        self.device = device or default_device()
        self.manager = BlockManager(num_blocks, block_size, prefix_caching, self.bytes_per_block)
        self.num_blocks = self.manager.num_blocks
        shape = (self.num_blocks, block_size, num_kv_heads, head_dim)
        _checks.pool_memory(self, shape)  # refused before anything is allocated
        new_pool = functools.partial(torch.zeros, shape, dtype=self.dtype, device=self.device)
        self.k_pools = [new_pool() for _ in range(num_layers)]
        self.v_pools = [new_pool() for _ in range(num_layers)]
        self.layer_tokens: dict[int, list[int]] = {}  # per sequence: tokens each layer holds
        self.host: dict[int, tuple] = {}  # swapped-out sequences' K and V
        self.preemptions = Counter()  # {"recompute": n, "swap": n}

    def new_sequence(self, salt=None) -> int:
        """An empty sequence (no blocks yet); returns its id."""
        seq_id = self.manager.new_sequence(salt)
        self.layer_tokens[seq_id] = [0] * self.num_layers
        return seq_id

    def admit(self, token_ids, salt=None, checked: bool = False) -> tuple[int, int]:
        """:meth:`BlockManager.admit`; the cached tokens' K and V are already in the pools."""
        seq_id, cached = self.manager.admit(token_ids, salt, checked)
        self.layer_tokens[seq_id] = [cached] * self.num_layers
        return seq_id, cached

    def reserve(self, seq_id: int, num_tokens: int) -> None:
        """:meth:`BlockManager.reserve`, copying a shared last block in every layer."""
        self._reserve(seq_id, _checks.step_count(self, seq_id, num_tokens))

    def commit(self, seq_id: int, num_computed: int, token_ids, checked: bool = False) -> None:
        """:meth:`BlockManager.commit` over K and V that every layer holds (``append`` wrote them),
        or, ``checked``, that the model step being scheduled writes (the scheduler, the loops)."""
        if not checked:
            num_computed, token_ids = _checks.written(self, seq_id, num_computed, token_ids)
        self.manager.commit(seq_id, num_computed, token_ids, checked=True)
        self.layer_tokens[seq_id] = [num_computed] * self.num_layers

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """:meth:`BlockManager.truncate`, in every layer."""
        self.manager.truncate(_checks.in_step(self, seq_id), num_tokens)
        self.layer_tokens[seq_id] = [self.num_computed(seq_id)] * self.num_layers

    def append(self, seq_id: int, layer: int, k, v, token_ids=None) -> None:
        """Store ``k`` and ``v`` after ``seq_id``'s tokens in ``layer``. Layer 0 goes first and
        reserves the slots past those held; ``token_ids``: the sequence's tokens through these rows
        (required with prefix caching: the hashes are made of them). A token that every layer holds
        counts as computed."""
        layer, k, v, ids = _checks.append_args(self, seq_id, layer, k, v, token_ids)
        start = self.layer_tokens[seq_id][layer]
        with self.all_or_nothing():
            if layer == 0:
                self._reserve(seq_id, max(0, start + len(k) - self.num_tokens(seq_id)))
            slots = self.manager.table(seq_id).slots(start, start + len(k))
            slots = torch.tensor(slots, dtype=torch.int64, device=self.device)
            (self._store or kernels.store_kv)(k, v, self.k_pools[layer], self.v_pools[layer], slots)
            self.layer_tokens[seq_id][layer] = start + len(k)
            self.manager.commit(seq_id, min(self.layer_tokens[seq_id]), ids, checked=True)

    def fork(self, seq_id: int) -> int:
        """A new sequence that shares every block of ``seq_id`` (reference counts, no copy)."""
        child = self.manager.fork(_checks.in_step(self, seq_id))
        self.layer_tokens[child] = list(self.layer_tokens[seq_id])
        return child

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id`` and its hold on every block."""
        self.manager.free(seq_id)
        del self.layer_tokens[seq_id]
        self.host.pop(seq_id, None)

    def _reserve(self, seq_id: int, num_tokens: int) -> None:
        if not (num_tokens and self.manager.last_block_shared(seq_id)):
            self.manager.reserve(seq_id, num_tokens, checked=True)  # all or nothing: no copy
            return
        with self.all_or_nothing():  # copy-on-write: the shared last block's K and V, every layer
            source, copy = self.manager.reserve(seq_id, num_tokens, checked=True)
            for pool in (*self.k_pools, *self.v_pools):
                pool[copy].copy_(pool[source])

    def preempt(self, seq_id: int, mode: str) -> int:
        """:meth:`BlockManager.preempt`, even mid-prefill; ``"swap"`` first copies the written
        blocks' K and V to host memory."""
        mode = _checks.preemption(self, seq_id, mode, PREEMPTION_MODES)
        if mode == "swap":
            written = -(-self.num_computed(seq_id) // self.block_size)
            table = self.manager.block_table(seq_id)[:written]
            self.host[seq_id] = _copy_to_host(self.k_pools, self.v_pools, table)
        held = self.manager.preempt(seq_id, mode)
        self.layer_tokens[seq_id] = [self.num_computed(seq_id)] * self.num_layers
        self.preemptions[mode] += 1
        return held

    def resume(self, seq_id: int, token_ids, checked: bool = False) -> int:
        """:meth:`BlockManager.resume`, copying back from host memory what a swap saved."""
        swapped = self.is_swapped(seq_id)
        with self.all_or_nothing():
            cached = self.manager.resume(seq_id, token_ids, checked)
            computed = self.num_computed(seq_id)
            if swapped:
                end = -(-computed // self.block_size)
                self._copy_from_host(seq_id, cached // self.block_size, end)
                self.manager.commit(seq_id, computed, token_ids, checked)
        self.host.pop(seq_id, None)
        self.layer_tokens[seq_id] = [computed] * self.num_layers
        return cached

    def _copy_from_host(self, seq_id: int, first: int, end: int) -> None:
        """Host copies of logical blocks ``first .. end - 1`` back into the pools."""
        blocks = self.manager.block_table(seq_id)[first:end]
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        for pools, host in zip((self.k_pools, self.v_pools), self.host[seq_id]):
            for layer, pool in enumerate(pools):
                pool[index] = host[layer, first:end].to(self.device, non_blocking=True)

    def block_tables(self, seq_ids) -> torch.Tensor:
        """``int32 [batch, max_blocks]``; entries past a sequence's blocks are 0 (never read)."""
        tables = [self.manager.block_table(s) for s in _checks.resident(self, seq_ids)]
        width = max((len(t) for t in tables), default=0) or 1
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.device).reshape(len(tables), width)

    def seq_lens(self, seq_ids, layer: int | None = None) -> torch.Tensor:
        """``int32 [batch]``: tokens stored for each sequence (in ``layer``; default layer 0)."""
        layer, seq_ids = _checks.lens_args(self, seq_ids, layer)
        lengths = [self.layer_tokens[s][layer] for s in seq_ids]
        return torch.tensor(lengths, dtype=torch.int32, device=self.device)

    def gather(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_id``'s K and V in ``layer``, contiguous ``[tokens, num_kv_heads, head_dim]``."""
        layer = _checks.gather_layer(self, seq_id, layer)
        length = self.layer_tokens[seq_id][layer]
        table = self.manager.block_table(seq_id)[: -(-length // self.block_size)]
        blocks = torch.tensor(table, dtype=torch.long, device=self.device)
        k = self.k_pools[layer][blocks].flatten(0, 1)[:length]
        v = self.v_pools[layer][blocks].flatten(0, 1)[:length]
        return k.contiguous(), v.contiguous()

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    # The block manager's queries, asked of the cache (the scheduler asks either one).
    num_free = property(lambda self: self.manager.num_free)
    prefix_caching = property(lambda self: self.manager.prefix_caching)
    sequences = _ask_manager(BlockManager.sequences)
    table = _ask_manager(BlockManager.table)
    block_table = _ask_manager(BlockManager.block_table)
    state = _ask_manager(BlockManager.state)
    num_tokens = _ask_manager(BlockManager.num_tokens)
    num_computed = _ask_manager(BlockManager.num_computed)
    blocks_to_admit = _ask_manager(BlockManager.blocks_to_admit)
    blocks_to_append = _ask_manager(BlockManager.blocks_to_append)
    blocks_to_resume = _ask_manager(BlockManager.blocks_to_resume)

    def is_swapped(self, seq_id: int) -> bool:
        return self.manager.state(seq_id) == "swap"

    def require_in_step(self, seq_id) -> None:
        """Refuse a sequence that is unknown, preempted, or mid-way through a by-hand append."""
        _checks.in_step(self, seq_id)

    def check(self) -> None:
        """The block manager's invariants, and each sequence's layers between computed and held."""
        _checks.paged_invariants(self)

    def snapshot(self):
        """The bookkeeping, not the pools: a failed call writes only slots nothing vouches for."""
        layers = {i: list(t) for i, t in self.layer_tokens.items()}
        return self.manager.snapshot(), layers, dict(self.host), Counter(self.preemptions)

    def restore(self, snapshot) -> None:
        manager, layers, host, self.preemptions = snapshot
        self.manager.restore(manager)
        self.layer_tokens, self.host = {i: list(t) for i, t in layers.items()}, dict(host)

    def all_or_nothing(self):
        """Everything as it was if the block raises (a model step, a write, a copy)."""
        return restoring(self)


def copy_blocks_to_host(k_pools, v_pools, blocks: list[int]) -> tuple:
    """``(k, v)`` of ``blocks`` in every layer, copied to (pinned) host memory, each ``[layers,
    len(blocks), block_size, kv_heads, head_dim]`` (notebook 05, swap preemption)."""
    return _copy_to_host(k_pools, v_pools, _checks.pool_blocks(k_pools, v_pools, blocks))


def _copy_to_host(k_pools, v_pools, blocks: list[int]) -> tuple:
    device = k_pools[0].device
    index, pin = torch.tensor(blocks, dtype=torch.long, device=device), device.type == "cuda"
    host = []
    for pools in (k_pools, v_pools):
        stacked = torch.stack([pool[index] for pool in pools])
        copy = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=pin)
        copy.copy_(stacked, non_blocking=pin)
        host.append(copy)
    if pin:
        torch.cuda.synchronize(device)  # the call returns once the copies are complete
    return tuple(host)


def tokens_in_budget(budget_bytes: float, shape, bytes_per_element: float = 2) -> int:
    """KV slots (tokens, all layers) that ``budget_bytes`` holds for a ``ModelShape``."""
    shape = _checks.budget_args(budget_bytes, shape, bytes_per_element)
    return int(budget_bytes // shape.kv_bytes_per_token(bytes_per_element))


__all__ = ["PREEMPTION_MODES", "PagedKVCache", "copy_blocks_to_host", "tokens_in_budget"]
