"""Physical KV-cache blocks, block tables, a paged KV cache, and an admission simulator (section 9.5).

- :class:`BlockAllocator` hands out the ids of fixed-size physical blocks, the entries of a
  block table. Blocks are reference counted so that several sequences can share one (a forked
  request, a common prefix): a block returns to the free pool only when its last holder frees it.
- :class:`BlockTable` maps one sequence's logical blocks to physical ones.
- :class:`PagedKVCache` holds the per-layer K and V pools the attention kernel reads, grows
  sequences block by block, forks them with copy-on-write, and preempts them by recompute or swap.
- :func:`make_trace` and :func:`simulate` compare contiguous reservation with paged allocation
  on a request trace (``kvlab.serving.paged_decode.measure_preemption_cost`` times recompute against swap).
"""

from __future__ import annotations

from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from kvlab._checks import integer, one_of, require_memory
from kvlab.lab.hardware import device as default_device
from kvlab.kernels import store_kv  # also switches on the Triton interpreter without CUDA (import it before transformers)


class OutOfBlocksError(MemoryError):
    """Not enough free blocks; ``needed`` and ``free`` say by how much."""

    def __init__(self, needed: int, free: int, total: int):
        super().__init__(f"need {needed} KV-cache block(s) but only {free} of {total} are free; "
                         "free or preempt a sequence first")
        self.needed, self.free, self.total = needed, free, total


MAX_BLOCK_ID = 2**31 - 1  # block tables are int32
BOOKKEEPING_BYTES_PER_BLOCK = 64  # a free-list entry, a reference count and an int object, rounded up


class BlockAllocator:
    """Reference-counted pool of ``num_blocks`` physical KV-cache blocks (section 9.5).

    >>> pool = BlockAllocator(4)
    >>> block = pool.allocate()
    >>> pool.incref(block)          # a second sequence shares it
    >>> pool.free(block); pool.ref_count(block)
    1
    >>> pool.free(block); pool.num_free
    4
    """

    def __init__(self, num_blocks: int):
        # Block ids are int32 in the block tables the kernels read; the free list and the counts
        # take host memory per block, so an impossible pool is refused here, not by the OOM killer.
        num_blocks = integer("num_blocks", num_blocks, 1, MAX_BLOCK_ID + 1)
        require_memory(f"a pool of {num_blocks:,} blocks (allocator bookkeeping)",
                       num_blocks * BOOKKEEPING_BYTES_PER_BLOCK, "cpu")
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """One free block, now held once (reference count 1)."""
        return self.allocate_many(1)[0]

    def allocate_many(self, count: int) -> list[int]:
        """``count`` free blocks, or none at all if fewer are free."""
        count = integer("count", count, 0)
        if count > len(self._free):
            raise OutOfBlocksError(count, len(self._free), self.num_blocks)
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._ref_counts[block] = 1
        return blocks

    def _snapshot(self):
        return list(self._free), list(self._ref_counts)

    def _restore(self, snapshot) -> None:
        free, ref_counts = snapshot
        self._free, self._ref_counts = deque(free), list(ref_counts)

    def _unallocate(self, blocks: list[int]) -> None:
        """Undo ``allocate_many`` (blocks just taken and not shared since): back to the front of the
        free list in their old order, so that a retried call takes the very same blocks."""
        for block in blocks:
            self._ref_counts[block] = 0
        self._free.extendleft(reversed(blocks))

    def incref(self, block: int) -> None:
        """One more holder of an allocated block (sharing it with another sequence)."""
        self._require_allocated(block, "incref")
        self._ref_counts[block] += 1

    def free(self, block: int) -> None:
        """Drop one holder; the block becomes free when its last holder is gone."""
        self._require_allocated(block, "free")
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            self._free.append(block)

    def ref_count(self, block: int) -> int:
        self._require_known(block)
        return self._ref_counts[block]

    def _require_known(self, block: int) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be an int in [0, {self.num_blocks}), got {block!r}")

    def _require_allocated(self, block: int, action: str) -> None:
        self._require_known(block)
        if self._ref_counts[block] == 0:
            raise ValueError(f"cannot {action} block {block}: it is free (not allocated)")


# --------------------------------------------------------------------------- block tables


class BlockTable:
    """One sequence's logical blocks -> physical blocks (section 9.5).

    Token ``t`` lives in logical block ``t // block_size`` at offset ``t % block_size``;
    ``blocks[logical]`` is the physical block. The seed's example (request A, block size 16,
    logical [0, 1, 2] -> physical [7, 2, 15]):

    >>> table = BlockTable(16, [7, 2, 15], num_tokens=48)
    >>> table.physical_location(17)
    (2, 1)
    """

    def __init__(self, block_size: int, blocks=(), num_tokens: int = 0):
        self.block_size = integer("block_size", block_size, 1)
        self.blocks = [integer(f"blocks[{i}]", b, 0, MAX_BLOCK_ID + 1) for i, b in enumerate(blocks)]
        integer("num_tokens", num_tokens, 0)
        if not 0 <= num_tokens <= len(self.blocks) * block_size:
            raise ValueError(f"num_tokens must be in [0, {len(self.blocks) * block_size}] for "
                             f"{len(self.blocks)} block(s) of {block_size}, got {num_tokens}")
        self.num_tokens = num_tokens

    def __repr__(self) -> str:
        return f"BlockTable(block_size={self.block_size}, blocks={self.blocks}, num_tokens={self.num_tokens})"

    @property
    def capacity(self) -> int:
        """Tokens the held blocks can store."""
        return len(self.blocks) * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        integer("num_tokens", num_tokens, 0)
        return -(-num_tokens // self.block_size)

    def physical_location(self, token: int) -> tuple[int, int]:
        """(physical block, offset) of logical token ``token``."""
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.capacity:
            raise ValueError(f"token must be an int in [0, {self.capacity}) (the blocks held), got {token!r}")
        return self.blocks[token // self.block_size], token % self.block_size

    def slots(self, start: int, end: int) -> list[int]:
        """Flat slots ``block * block_size + offset`` of tokens ``start .. end - 1``."""
        integer("start", start, 0)
        integer("end", end, start)
        locations = (self.physical_location(t) for t in range(start, end))
        return [block * self.block_size + offset for block, offset in locations]


# --------------------------------------------------------------------------- the paged KV cache


@dataclass
class _Sequence:
    table: BlockTable
    layer_tokens: list[int]  # tokens stored per layer; layer 0 leads, the others follow it
    swapped: tuple | None = None  # (k, v) host copies while swapped out


def copy_blocks_to_host(k_pools, v_pools, blocks: list[int]) -> tuple:
    """K and V of ``blocks`` in every layer, copied to host memory: ``(k, v)``, each
    ``[layers, len(blocks), block_size, kv_heads, head_dim]``. Section 9.5 (swap preemption).

    On a GPU the host copies are pinned, so the transfer runs at the link's speed; the call returns
    once they are complete.
    """
    device = k_pools[0].device
    index = torch.tensor(blocks, dtype=torch.long, device=device)
    pin = device.type == "cuda"
    host = []
    for pools in (k_pools, v_pools):
        stacked = torch.stack([pool[index] for pool in pools])
        copy = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=pin)
        copy.copy_(stacked, non_blocking=pin)
        host.append(copy)
    if pin:
        torch.cuda.synchronize(device)
    return tuple(host)


class PagedKVCache:
    """A paged KV cache: per-layer K and V pools and one block table per sequence (section 9.5).

    ``k_pools[layer]`` and ``v_pools[layer]`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    All layers of a sequence share one block table: token ``t`` sits in the same block and offset
    in every layer. Appending to layer 0 is what grows the table (allocating a block when the
    sequence crosses a block boundary, copying a shared last block first); layers 1.. then write
    into slots layer 0 already owns, and may not run ahead of it.

    ``fork`` shares every block of a sequence (reference counts); the first append that would
    write into a shared block copies it first (copy-on-write), in every layer. Preemption frees
    a sequence's blocks either by dropping them (``preempt(..., "recompute")``: the caller
    re-prefills later) or by copying them to host memory (``"swap"``, undone by ``swap_in``);
    ``preemptions`` counts both.

    A call that fails changes nothing: every method checks its arguments first, and ``append``,
    ``append_batch`` and ``swap_in`` give back what they took if the store or copy fails.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype=torch.float16, device=None, store=None):
        for name, value in (("num_layers", num_layers), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            integer(name, value, 1)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if store is not None and not callable(store):
            raise TypeError(f"store must be None or a function like kvlab.kernels.store_kv, got {store!r}")
        try:
            self.device = torch.device(device) if device is not None else default_device()
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch.device or a name like 'cpu' or 'cuda', got {device!r}") from None
        if self.device.type == "meta":
            raise ValueError("device must hold data (e.g. 'cpu' or 'cuda'), got 'meta'")
        self.allocator = BlockAllocator(num_blocks)
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        require_memory(f"K and V pools {shape} x {num_layers} layers", num_blocks * self.bytes_per_block, self.device)
        self.k_pools = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v_pools = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._store = store if store is not None else store_kv
        self._sequences: dict[int, _Sequence] = {}
        self._next_id = 0
        self.preemptions = Counter()  # {"recompute": n, "swap": n}

    # -- sizes -------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def sequences(self) -> list[int]:
        return list(self._sequences)

    def table(self, seq_id: int) -> BlockTable:
        return self._get(seq_id).table

    def _get(self, seq_id) -> _Sequence:
        try:
            return self._sequences[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"seq_id {seq_id!r} is not a live sequence; live: {sorted(self._sequences)}") from None

    def _require_resident(self, seq_id) -> _Sequence:
        seq = self._get(seq_id)
        if seq.swapped is not None:
            raise ValueError(f"sequence {seq_id} is swapped out to host memory; swap_in({seq_id}) first")
        return seq

    def _out_of_blocks(self, needed: int) -> OutOfBlocksError:
        error = OutOfBlocksError(needed, self.num_free, self.num_blocks)
        error.args = (f"{error.args[0]} ({needed * self.bytes_per_block:,} bytes needed, "
                      f"{self.num_free * self.bytes_per_block:,} bytes free, "
                      f"{self.bytes_per_block:,} bytes per block)",)
        return error

    def _snapshot(self):
        """The bookkeeping a failed multi-layer call must put back: allocator, tables, counts, swaps.
        (Not the pools' contents: a failed call writes only into slots no sequence claims.) A subclass
        with more state (prefix hashes) extends this and ``_restore``."""
        sequences = {i: (list(s.table.blocks), s.table.num_tokens, list(s.layer_tokens), s.swapped)
                     for i, s in self._sequences.items()}
        return self.allocator._snapshot(), sequences, self._next_id, Counter(self.preemptions)

    def _restore(self, snapshot) -> None:
        allocator, sequences, self._next_id, self.preemptions = snapshot
        self.allocator._restore(allocator)
        self._sequences = {i: _Sequence(BlockTable(self.block_size, blocks, num_tokens), layer_tokens, swapped)
                           for i, (blocks, num_tokens, layer_tokens, swapped) in sequences.items()}

    @contextmanager
    def _all_or_nothing(self):
        """Everything as it was if the block raises: for calls that append to several layers one
        after another, such as a model's decode step (``kvlab.serving.paged_decode``)."""
        snapshot = self._snapshot()
        try:
            yield
        except BaseException:
            self._restore(snapshot)
            raise

    # -- sequences ---------------------------------------------------------------------------

    def new_sequence(self) -> int:
        """Register an empty sequence (no blocks yet); returns its id."""
        seq_id = self._next_id
        self._next_id += 1
        self._sequences[seq_id] = _Sequence(BlockTable(self.block_size), [0] * self.num_layers)
        return seq_id

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks that appending ``num_tokens`` tokens to ``seq_id`` would take (new + copy-on-write)."""
        seq = self._require_resident(seq_id)
        integer("num_tokens", num_tokens, 0)
        table = seq.table
        new = table.blocks_for(table.num_tokens + num_tokens) - len(table.blocks)
        return max(0, new) + int(self._last_block_is_shared(table) and num_tokens > 0)

    def _last_block_is_shared(self, table: BlockTable) -> bool:
        """The next token would land in a block another sequence still reads."""
        partial = table.num_tokens % self.block_size != 0
        return partial and self.allocator.ref_count(table.blocks[-1]) > 1

    def _grow(self, seq: _Sequence, num_tokens: int, taken: list[int], replaced: list[int]) -> None:
        """Layer 0 only: make room for ``num_tokens`` more tokens, all or nothing.

        Blocks taken go to ``taken``; a shared last block copied for writing goes to ``replaced``,
        whose hold is dropped only once the whole call has succeeded (see ``_append``)."""
        table = seq.table
        cow = self._last_block_is_shared(table)
        new = max(0, table.blocks_for(table.num_tokens + num_tokens) - len(table.blocks))
        if cow + new > self.num_free:
            raise self._out_of_blocks(cow + new)
        if cow:
            (copy,) = self.allocator.allocate_many(1)
            taken.append(copy)
            for k_pool, v_pool in zip(self.k_pools, self.v_pools):
                k_pool[copy].copy_(k_pool[table.blocks[-1]])
                v_pool[copy].copy_(v_pool[table.blocks[-1]])
            replaced.append(table.blocks[-1])
            table.blocks[-1] = copy
        fresh = self.allocator.allocate_many(new)
        taken += fresh
        table.blocks += fresh
        table.num_tokens += num_tokens

    def _check_layer(self, layer) -> int:
        return integer("layer", layer, 0, self.num_layers)

    def _check_follows_layer0(self, seq_id, seq: _Sequence, layer: int, num_tokens: int) -> None:
        start = seq.layer_tokens[layer]
        if layer > 0 and start + num_tokens > seq.layer_tokens[0]:
            raise ValueError(f"layer {layer} of sequence {seq_id} would hold {start + num_tokens} tokens but layer 0 "
                             f"holds {seq.layer_tokens[0]}: append to layer 0 first (it allocates the blocks)")

    def _check_kv(self, k, v, num_tokens=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` and ``v`` checked and converted to the pools' device and dtype (before anything changes)."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3 or tuple(t.shape[1:]) != (self.num_kv_heads, self.head_dim):
                raise ValueError(f"{name} must be [tokens, {self.num_kv_heads}, {self.head_dim}] "
                                 f"(num_kv_heads, head_dim), got {tuple(t.shape)}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating-point tensor (stored as {self.dtype}), got {t.dtype}")
            if t.device.type == "meta":
                raise ValueError(f"{name} is on the meta device (no data); pass a tensor on {self.device}")
        if k.shape != v.shape or (num_tokens is not None and k.shape[0] != num_tokens):
            raise ValueError(f"k and v must both be [{num_tokens or 'tokens'}, {self.num_kv_heads}, "
                             f"{self.head_dim}], got {tuple(k.shape)} and {tuple(v.shape)}")
        return k.to(self.device, self.dtype), v.to(self.device, self.dtype)

    def append(self, seq_id: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k`` and ``v`` (``[tokens, num_kv_heads, head_dim]``) after ``seq_id``'s tokens in ``layer``.

        All or nothing: on any error no block, count or table has changed."""
        layer = self._check_layer(layer)
        seq = self._require_resident(seq_id)
        k, v = self._check_kv(k, v)
        self._check_follows_layer0(seq_id, seq, layer, k.shape[0])
        self._append(layer, [seq], [k.shape[0]], k, v)

    def append_batch(self, seq_ids, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """One new token per sequence (row ``i`` of ``k``/``v`` to ``seq_ids[i]``), in one store launch.

        All or nothing across the batch: on any error no sequence has changed."""
        if isinstance(seq_ids, (str, bytes, torch.Tensor)) or not hasattr(seq_ids, "__iter__"):
            raise TypeError(f"seq_ids must be a list of sequence ids, got {type(seq_ids).__name__}")
        seq_ids = list(seq_ids)
        layer = self._check_layer(layer)
        seqs = [self._require_resident(s) for s in seq_ids]
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must be distinct, got {seq_ids}")
        k, v = self._check_kv(k, v, num_tokens=len(seq_ids))
        for seq_id, seq in zip(seq_ids, seqs):
            self._check_follows_layer0(seq_id, seq, layer, 1)
        needed = sum(self.blocks_to_append(s) for s in seq_ids) if layer == 0 else 0
        if needed > self.num_free:
            raise self._out_of_blocks(needed)
        self._append(layer, seqs, [1] * len(seqs), k, v)

    def _append(self, layer: int, seqs: list[_Sequence], counts: list[int], k, v) -> None:
        """Reserve every slot, store, and only then drop the holds copy-on-write replaced; if the
        store (or anything else) fails, put every table, count and block back as it was."""
        saved = [(seq, list(seq.table.blocks), seq.table.num_tokens, list(seq.layer_tokens)) for seq in seqs]
        taken, replaced, slots = [], [], []
        try:
            for seq, count in zip(seqs, counts):
                if count == 0:
                    continue
                if layer == 0:
                    self._grow(seq, count, taken, replaced)
                start = seq.layer_tokens[layer]
                seq.layer_tokens[layer] = start + count
                slots += seq.table.slots(start, start + count)
            if slots:
                self._write(layer, k, v, slots)
        except BaseException:
            for seq, blocks, num_tokens, layer_tokens in saved:
                seq.table.blocks, seq.table.num_tokens, seq.layer_tokens = blocks, num_tokens, layer_tokens
            self.allocator._unallocate(taken)
            raise
        for block in replaced:
            self.allocator.free(block)

    def _write(self, layer: int, k, v, slots: list[int]) -> None:
        mapping = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self._store(k, v, self.k_pools[layer], self.v_pools[layer], mapping)

    def fork(self, seq_id: int) -> int:
        """A new sequence that shares every block of ``seq_id`` (reference counts, no copy)."""
        seq = self._require_resident(seq_id)
        if len(set(seq.layer_tokens)) != 1:
            raise ValueError(f"sequence {seq_id} is mid-step (tokens per layer {seq.layer_tokens}); "
                             "fork it when every layer holds the same tokens")
        for block in seq.table.blocks:
            self.allocator.incref(block)
        child = self.new_sequence()
        self._sequences[child] = _Sequence(BlockTable(self.block_size, seq.table.blocks, seq.table.num_tokens),
                                           list(seq.layer_tokens))
        return child

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id`` and its hold on every block."""
        seq = self._get(seq_id)
        for block in seq.table.blocks:
            self.allocator.free(block)
        del self._sequences[seq_id]

    # -- what the attention kernel reads -----------------------------------------------------

    def block_tables(self, seq_ids) -> torch.Tensor:
        """``int32 [batch, max_blocks]``; entries past a sequence's blocks are 0 (never read)."""
        tables = [self._require_resident(s).table.blocks for s in list(seq_ids)]
        width = max((len(t) for t in tables), default=0) or 1
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.device).reshape(len(tables), width)

    def seq_lens(self, seq_ids, layer: int | None = None) -> torch.Tensor:
        """``int32 [batch]``: tokens stored for each sequence (in ``layer``; default layer 0)."""
        layer = self._check_layer(0 if layer is None else layer)
        return torch.tensor([self._get(s).layer_tokens[layer] for s in seq_ids], dtype=torch.int32,
                            device=self.device)

    def gather(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_id``'s K and V in ``layer`` in logical order, contiguous ``[tokens, num_kv_heads, head_dim]``."""
        layer = self._check_layer(layer)
        seq = self._require_resident(seq_id)
        length = seq.layer_tokens[layer]
        blocks = torch.tensor(seq.table.blocks[: seq.table.blocks_for(length)], dtype=torch.long, device=self.device)
        k = self.k_pools[layer][blocks].flatten(0, 1)[:length]
        v = self.v_pools[layer][blocks].flatten(0, 1)[:length]
        return k.contiguous(), v.contiguous()

    # -- preemption --------------------------------------------------------------------------

    def preempt(self, seq_id: int, mode: str) -> int:
        """Take ``seq_id``'s blocks back; returns the number of tokens whose K and V it held.

        ``"recompute"``: the blocks are freed and the sequence is emptied; the caller re-prefills
        its tokens later (section 9.5, vLLM's default). ``"swap"``: the blocks are copied to host
        memory first and ``swap_in`` brings them back.
        """
        one_of("mode", mode, PREEMPTION_MODES)
        seq = self._require_resident(seq_id)
        if len(set(seq.layer_tokens)) != 1:
            raise ValueError(f"sequence {seq_id} is mid-step (tokens per layer {seq.layer_tokens})")
        tokens = seq.table.num_tokens
        if mode == "swap":
            self._swap_out(seq)
        else:
            for block in seq.table.blocks:
                self.allocator.free(block)
            seq.table = BlockTable(self.block_size)
            seq.layer_tokens = [0] * self.num_layers
        self.preemptions[mode] += 1
        return tokens

    def _swap_out(self, seq: _Sequence) -> None:
        host = copy_blocks_to_host(self.k_pools, self.v_pools, seq.table.blocks)
        for block in seq.table.blocks:
            self.allocator.free(block)
        seq.swapped = host
        seq.table.blocks = []  # num_tokens stays: swap_in needs blocks_for(num_tokens) blocks back

    def swap_in(self, seq_id: int) -> None:
        """Bring a swapped-out sequence back into fresh blocks (never shared again)."""
        seq = self._get(seq_id)
        if seq.swapped is None:
            raise ValueError(f"sequence {seq_id} is not swapped out")
        count = seq.table.blocks_for(seq.table.num_tokens)
        if count > self.num_free:
            raise self._out_of_blocks(count)
        blocks = self.allocator.allocate_many(count)
        try:
            index = torch.tensor(blocks, dtype=torch.long, device=self.device)
            k_host, v_host = seq.swapped
            for layer in range(self.num_layers):
                self.k_pools[layer][index] = k_host[layer].to(self.device, non_blocking=True)
                self.v_pools[layer][index] = v_host[layer].to(self.device, non_blocking=True)
        except BaseException:
            self.allocator._unallocate(blocks)
            raise
        seq.table.blocks = blocks
        seq.swapped = None

    def is_swapped(self, seq_id: int) -> bool:
        return self._get(seq_id).swapped is not None


# --------------------------------------------------------------------------- admission simulator

DISTRIBUTIONS = ("uniform", "lognormal", "bimodal")
POLICIES = ("reserve-max", "reserve-estimate", "paged")
PREEMPTION_MODES = ("recompute", "swap")
TABLE_ENTRY_BYTES = 4  # one int32 block id per block-table entry
REGION_BYTES = 8  # a contiguous region: int32 start and int32 length


@dataclass(frozen=True)
class Request:
    """One request of a trace: ``prompt`` tokens in, ``output`` tokens out (both >= 1)."""

    id: int
    prompt: int
    output: int

    def __post_init__(self):
        integer("id", self.id, 0)
        integer("prompt", self.prompt, 1)
        integer("output", self.output, 1)  # a request that generates nothing would never finish

    @property
    def final(self) -> int:
        """Tokens whose K and V the request holds when it finishes."""
        return self.prompt + self.output


def _draw(rng, distribution: str, mean: float, size: int):
    if distribution == "uniform":  # integers 1 .. 2 mean - 1: mean ``mean``
        return rng.integers(1, max(2, round(2 * mean)), size=size)
    if distribution == "lognormal":  # sigma 1, mu chosen so that the mean is ``mean``
        return np.rint(rng.lognormal(np.log(mean) - 0.5, 1.0, size=size))
    # bimodal: half short (0.25 mean), half long (1.75 mean), each times a uniform 0.5..1.5 jitter
    centre = np.where(rng.random(size) < 0.5, 0.25, 1.75) * mean
    return np.rint(centre * rng.uniform(0.5, 1.5, size=size))


def make_trace(n: int, distribution: str = "lognormal", mean_prompt: float = 64, mean_output: float = 128,
               max_len: int = 512, seed: int = 0) -> list[Request]:
    """``n`` requests with prompt and output lengths drawn from ``distribution`` (section 9.5).

    ``uniform``: integers in [1, 2 mean - 1]; ``lognormal``: sigma 1 (a long tail, as in chat
    traces); ``bimodal``: half at a quarter of the mean, half at 1.75 times it, each jittered by
    a uniform factor in [0.5, 1.5]. Lengths are then clipped so that ``1 <= prompt``,
    ``1 <= output`` and ``prompt + output <= max_len`` (which moves the means slightly).
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    integer("n", n, 0)
    integer("max_len", max_len, 2)
    for name, value in (("mean_prompt", mean_prompt), ("mean_output", mean_output)):
        if not value >= 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    rng = np.random.default_rng(seed)
    prompts = np.clip(_draw(rng, distribution, mean_prompt, n), 1, max_len - 1).astype(int)
    outputs = np.clip(_draw(rng, distribution, mean_output, n), 1, max_len - prompts).astype(int)
    return [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]


@dataclass
class _Running:
    request: Request
    generated: int = 0  # tokens generated so far; the request holds prompt + generated tokens
    region: tuple[int, int] | None = None  # contiguous: (start, reserved tokens)
    blocks: int = 0  # paged: blocks held
    reserve_max: bool = False  # reserve-estimate: outgrew its estimate once, now reserves max_len

    @property
    def length(self) -> int:
        return self.request.prompt + self.generated


@dataclass
class SimResult:
    """What one allocator did with one trace (section 9.5). Token-steps sum a quantity over steps.

    ``used``: slots holding a token's K and V. ``reserved``: reserved slots that a later token of
    the same request will fill (reservation waste). ``internal``: reserved slots no token will ever
    fill (internal fragmentation: the reservation exceeded the request's final length).
    ``final_block``: empty slots in paged requests' last blocks. ``external``: free slots while the
    queue's head was refused although that many were free in total (holes too small; contiguous only).
    """

    policy: str
    budget_tokens: int
    block_size: int
    max_batch: int
    steps: int = 0
    admitted: int = 0  # admissions, re-admissions after preemption included
    completed: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0  # prefill work redone after recompute preemptions
    swapped_blocks: int = 0  # blocks copied to host (and later back) by swap preemptions
    used: int = 0
    reserved: int = 0
    internal: int = 0
    final_block: int = 0
    external: int = 0
    peak_batch: int = 0
    peak_metadata_bytes: int = 0
    batch_by_step: list = field(default_factory=list)
    completed_by_step: list = field(default_factory=list)  # cumulative

    @property
    def allocated(self) -> int:
        return self.used + self.reserved + self.internal + self.final_block

    @property
    def waste_fraction(self) -> float:
        """Share of allocated KV memory not holding a token, averaged over the run (time-weighted)."""
        return 1 - self.used / self.allocated if self.allocated else 0.0

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_by_step) / len(self.batch_by_step) if self.batch_by_step else 0.0


class _Contiguous:
    """First-fit over a line of ``budget`` token slots: the lowest-addressed hole that is large enough."""

    def __init__(self, budget: int):
        self.budget, self.regions = budget, []  # sorted (start, size)

    def free_total(self) -> int:
        return self.budget - sum(size for _, size in self.regions)

    def allocate(self, size: int):
        cursor = 0
        for i, (start, length) in enumerate(self.regions):
            if start - cursor >= size:
                self.regions.insert(i, (cursor, size))
                return cursor, size
            cursor = start + length
        if self.budget - cursor >= size:
            self.regions.append((cursor, size))
            return cursor, size
        return None

    def release(self, region) -> None:
        self.regions.remove(region)


def _check_trace(trace) -> list:
    if isinstance(trace, (str, bytes)) or not hasattr(trace, "__iter__"):
        raise TypeError(f"trace must be a list of kvlab.cache.paged.Request, got {type(trace).__name__}")
    trace = list(trace)
    for i, request in enumerate(trace):
        if not isinstance(request, Request):
            raise TypeError(f"trace[{i}] must be a kvlab.cache.paged.Request, got {type(request).__name__}")
    return trace


def _check_sim_args(policy, budget_tokens, block_size, max_batch, preemption, trace, max_len):
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if preemption not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
    for name, value in (("budget_tokens", budget_tokens), ("block_size", block_size), ("max_batch", max_batch),
                        ("max_len", max_len)):
        integer(name, value, 1)
    longest = max((r.final for r in trace), default=0)
    if longest > max_len:
        raise ValueError(f"max_len ({max_len}) must be >= the longest request in the trace ({longest} tokens)")
    need = max_len if policy != "paged" else -(-longest // block_size) * block_size
    if trace and need > budget_tokens:
        raise ValueError(f"budget_tokens ({budget_tokens}) cannot hold one request: {policy} needs {need} tokens")


def simulate(trace, policy: str, budget_tokens: int, block_size: int = 16, max_batch: int = 256,
             max_len: int | None = None, estimate: int | None = None, preemption: str = "recompute") -> SimResult:
    """Run ``trace`` through one KV allocator, one decode step at a time (section 9.5).

    Every request arrives at step 0 and waits in a first-come-first-served queue. Each step:

    1. **admit** from the head of the queue while ``max_batch`` allows and the head fits (no
       skipping: a refused head blocks the queue). Swapped-out requests come back first.
       ``reserve-max`` reserves ``max_len`` contiguous slots (first fit); ``reserve-estimate``
       reserves ``prompt + estimate`` (first fit; ``estimate`` defaults to the trace's mean output);
       ``paged`` takes ``ceil(prompt / block_size)`` blocks of a pool of ``budget // block_size``;
    2. **decode**: every running request, oldest first, generates one token and stores its K and V.
       A paged request that crosses a block boundary takes one block; when none is free the
       newest running request is preempted (vLLM's choice; possibly the request itself), by
       ``preemption``: ``recompute`` frees its blocks and sends it to the head of the queue, where
       its prompt and generated tokens will be prefilled again; ``swap`` copies its blocks to the
       host and brings them back when enough are free. A ``reserve-estimate`` request that outgrows
       its region is preempted (recompute) and readmitted reserving ``max_len``;
    3. **account**: the memory of this step is summed into ``SimResult`` (see its fields), then
       finished requests (``generated == output``) free their memory.

    A request holds ``prompt + generated`` tokens; one with output ``G`` admitted at step ``t``
    finishes at step ``t + G - 1`` unless preempted.
    """
    trace = _check_trace(trace)
    max_len = max_len if max_len is not None else max((r.final for r in trace), default=1)
    _check_sim_args(policy, budget_tokens, block_size, max_batch, preemption, trace, max_len)
    if estimate is None:
        estimate = max(1, round(sum(r.output for r in trace) / max(1, len(trace))))
    integer("estimate", estimate, 1)
    result = SimResult(policy, budget_tokens, block_size, max_batch)
    sim = _Simulation(policy, budget_tokens, block_size, max_batch, max_len, estimate, preemption, result)
    sim.run(trace)
    return result


class _Simulation:
    def __init__(self, policy, budget, block_size, max_batch, max_len, estimate, preemption, result):
        self.policy, self.block_size, self.max_batch = policy, block_size, max_batch
        self.max_len, self.estimate, self.preemption, self.result = max_len, estimate, preemption, result
        self.memory = _Contiguous(budget) if policy != "paged" else None
        self.free_blocks = budget // block_size
        self.running: list[_Running] = []
        self.queue: deque = deque()
        self.swapped: deque = deque()

    def run(self, trace) -> None:
        self.queue.extend(_Running(r) for r in trace)
        while self.queue or self.running or self.swapped:
            self.result.steps += 1
            self._admit()
            self._decode()
            self._account()
            self._finish()

    # -- memory per policy -----------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _try_take(self, item: _Running) -> bool:
        if self.policy == "paged":
            need = self._blocks_for(item.length)
            if need > self.free_blocks:
                return False
            self.free_blocks -= need
            item.blocks = need
            return True
        if self.policy == "reserve-max" or item.reserve_max:
            size = self.max_len
        else:
            size = min(self.max_len, item.request.prompt + self.estimate)
        region = self.memory.allocate(size)
        if region is None:
            if self.memory.free_total() >= size:
                self.result.external += self.memory.free_total()
            return False
        item.region = region
        return True

    def _release(self, item: _Running) -> None:
        if self.policy == "paged":
            self.free_blocks += item.blocks
            item.blocks = 0
        else:
            self.memory.release(item.region)
            item.region = None

    # -- the three phases ------------------------------------------------------------------

    def _admit(self) -> None:
        while self.swapped and len(self.running) < self.max_batch:
            item = self.swapped[0]
            need = self._blocks_for(item.length)
            if need > self.free_blocks:
                return  # swapped requests go first; new ones wait behind them
            self.swapped.popleft()
            self.free_blocks -= need
            item.blocks = need
            self.running.append(item)
        while self.queue and len(self.running) < self.max_batch and self._try_take(self.queue[0]):
            self.running.append(self.queue.popleft())
            self.result.admitted += 1

    def _decode(self) -> None:
        for item in list(self.running):
            if item not in self.running:
                continue  # preempted earlier in this step
            if self.policy == "paged":
                if item.length % self.block_size == 0 and not self._take_block(item):
                    continue
            elif item.length + 1 > item.region[1]:
                self._preempt(item, "recompute", reserve_max=True)
                continue
            item.generated += 1

    def _take_block(self, item: _Running) -> bool:
        """One more block for ``item``, preempting the newest requests if needed; False if ``item`` was."""
        while self.free_blocks == 0:
            victim = self.running[-1]
            self._preempt(victim, self.preemption)
            if victim is item:
                return False
        self.free_blocks -= 1
        item.blocks += 1
        return True

    def _preempt(self, item: _Running, mode: str, reserve_max: bool = False) -> None:
        self.running.remove(item)
        self.result.preemptions += 1
        if mode == "swap":
            self.result.swapped_blocks += item.blocks
            self.free_blocks += item.blocks
            item.blocks = 0
            self.swapped.appendleft(item)
            return
        self._release(item)
        self.result.recomputed_tokens += item.length
        item.reserve_max = item.reserve_max or reserve_max
        self.queue.appendleft(item)

    def _account(self) -> None:
        r = self.result
        for item in self.running:
            r.used += item.length
            if self.policy == "paged":
                r.final_block += item.blocks * self.block_size - item.length
            else:
                size = item.region[1]
                r.reserved += min(size, item.request.final) - item.length
                r.internal += max(0, size - item.request.final)
        if self.policy == "paged":
            widest = max((item.blocks for item in self.running), default=0)
            metadata = TABLE_ENTRY_BYTES * len(self.running) * widest  # the int32 [batch, max_blocks] tensor
        else:
            metadata = REGION_BYTES * len(self.running)
        r.peak_metadata_bytes = max(r.peak_metadata_bytes, metadata)
        r.peak_batch = max(r.peak_batch, len(self.running))
        r.batch_by_step.append(len(self.running))

    def _finish(self) -> None:
        for item in [i for i in self.running if i.generated == i.request.output]:
            self._release(item)
            self.running.remove(item)
            self.result.completed += 1
        self.result.completed_by_step.append(self.result.completed)


def tokens_in_budget(budget_bytes: float, shape, bytes_per_element: float = 2) -> int:
    """KV slots (tokens, all layers) that ``budget_bytes`` holds for a ``ModelShape`` (section 9.5)."""
    from kvlab._checks import positive
    from kvlab.theory.shapes import ModelShape

    positive("budget_bytes", budget_bytes)
    positive("bytes_per_element", bytes_per_element)
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a kvlab ModelShape (see kvlab.theory.shapes.SHAPES), got {type(shape).__name__}")
    return int(budget_bytes // shape.kv_bytes_per_token(bytes_per_element))
