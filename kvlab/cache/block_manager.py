"""Notebooks 05, 06 and 11: the one block manager of kvlab's serving stack, prefix caching a switch
on it.

:class:`BlockManager` keeps each sequence's block table and block hashes over one
:class:`~kvlab.cache.blocks.BlockAllocator`, as nano-vllm's ``BlockManager`` (Yu 2025) and vLLM's
KV-cache manager (Kwon et al. 2023) do. **Tokens live with the caller** (the engine's ``Request``):
``admit``, ``commit`` and ``resume`` read the sequence's tokens they are handed, and keep none;
with ``checked=True`` they trust them, as the engine's scheduler does after the engine's door.

**A cached block costs no admission capacity**: a freed block keeps its K, V and hash but joins the
free list, so ``num_free`` counts it, and taking it evicts its hash (``stats.evictions``), as in
vLLM v1's single free queue.

**Hashes are registered when committed**: ``commit`` runs when the step that computes the tokens is
scheduled, as vLLM v1 caches a request's full blocks when it allocates the step's slots, so a
request admitted later in the same step reuses them (every layer writes the step's K and V before
its attention reads the pool). SGLang instead holds back a waiting request whose prefix another one
shares, to hit the radix tree in a later batch (``IN_BATCH_PREFIX_CACHING_*``; Zheng et al. 2024).

**Rollback rule**: a call that raises changes nothing; ``restore`` puts back a failed step's tables,
counts and free list, but not a hash the step evicted (it may have overwritten that block): the
cache may lose an entry, never keep a wrong one.

>>> manager = BlockManager(num_blocks=8, block_size=4, prefix_caching=True)
>>> a, _ = manager.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])
>>> manager.commit(a, 9, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # the prefill wrote their K and V
>>> manager.admit([1, 2, 3, 4, 5, 6, 7, 8, 42, 43])[1]  # two blocks served from the cache
8
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvlab._checks import integer
from kvlab.cache import _checks
from kvlab.cache.blocks import (
    PREEMPTION_MODES,
    BlockAllocator,
    BlockTable,
    chain_hash_unchecked,
    root_hash,
)


@dataclass
class _Sequence:
    num_tokens: int  # tokens whose slots are reserved (their ids live with the caller)
    blocks: list[int]
    first_parent: bytes  # the root hash of its salt
    num_computed: int = 0  # leading tokens whose K and V are written
    hashes: list[bytes] = field(default_factory=list)  # of its leading full, written blocks
    state: str = "resident"  # "resident", or "recompute"/"swap" while preempted (no blocks held)

    def copy(self) -> "_Sequence":
        return replace(self, blocks=[*self.blocks], hashes=[*self.hashes])


@dataclass
class CacheStats:
    """Prefix-cache counters; ``hit_rate``: the share of admitted tokens cached blocks served."""

    admissions: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_blocks: int = 0
    evictions: int = 0  # registered blocks whose hash was given up to make room

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool = False,
        bytes_per_block: int | None = None,
    ):
        args = _checks.manager_args(prefix_caching, bytes_per_block, block_size)
        self.prefix_caching, self.bytes_per_block, self.block_size = args
        self.allocator = BlockAllocator(num_blocks)
        self.num_blocks = self.allocator.num_blocks
        self._hash: list[bytes | None] = [None] * self.num_blocks  # what a block is registered as
        self._by_hash: dict[bytes, int] = {}
        self.seqs: dict[int, _Sequence] = {}  # live sequences by id (others only read it)
        self._next_id = 0
        self.stats = CacheStats()

    def new_sequence(self, salt=None) -> int:
        """An empty sequence (no tokens, no blocks); returns its id."""
        return self._add(_Sequence(0, [], root_hash(salt)))

    def admit(self, token_ids, salt=None, checked: bool = False) -> tuple[int, int]:
        """A sequence holding the slots of prompt ``token_ids``; returns ``(seq_id, cached)``, the
        tokens of leading blocks shared from the cache, always leaving one token to compute."""
        tokens = token_ids if checked else _checks.prompt(token_ids)
        first_parent = root_hash(salt)
        hits, hashes = self._match(tokens, first_parent)
        seq = _Sequence(len(tokens), self._take(hits, len(tokens)), first_parent, 0, hashes)
        seq.num_computed = self._count_admission(len(tokens), hits)
        return self._add(seq), seq.num_computed

    def reserve(self, seq_id: int, num_tokens: int, checked=False) -> tuple[int, int] | None:
        """The slots of ``num_tokens`` more tokens. Returns ``(source, copy)`` when the last block
        was partly filled and shared (after a fork): the sequence now writes into ``copy``, and the
        caller copies ``source``'s K and V into it (copy-on-write); else None."""
        if not checked:
            _, num_tokens = _checks.append_count(self.seqs, seq_id, num_tokens)
        seq, pair = self.seqs[seq_id], None
        _checks.free_blocks(self, self._blocks_to_append(seq, num_tokens))
        if num_tokens and self._last_block_shared(seq):
            (copy,) = self._allocate(1)
            pair = (seq.blocks[-1], copy)
            self.allocator.free(seq.blocks[-1])  # others still hold it
            seq.blocks[-1] = copy
        seq.num_tokens += num_tokens
        seq.blocks += self._allocate(self._blocks_for(seq.num_tokens) - len(seq.blocks))
        return pair

    def commit(self, seq_id: int, num_computed: int, token_ids, checked: bool = False) -> None:
        """``seq_id``'s first ``num_computed`` tokens are written, or scheduled to be: register the
        hashes of the full blocks among them that ``token_ids`` holds (its finalized tokens: a
        speculative step's draft is computed, never cached, as in vLLM v1)."""
        if not checked:
            num_computed, token_ids = _checks.commit_args(self, seq_id, num_computed, token_ids)
        seq, size = self.seqs[seq_id], self.block_size
        seq.num_computed = num_computed
        end = min(num_computed, len(token_ids)) // size * size if self.prefix_caching else 0
        for start in range(len(seq.hashes) * size, end, size):  # each full block it fills
            parent = seq.hashes[-1] if seq.hashes else seq.first_parent
            seq.hashes.append(chain_hash_unchecked(parent, token_ids[start : start + size]))
            self._register(seq.blocks[len(seq.hashes) - 1], seq.hashes[-1])

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Give back the slots past ``seq_id``'s first ``num_tokens`` (a speculative step's rejected
        draft): blocks past them return to the free list."""
        seq, num_tokens = _checks.truncation(self.seqs, seq_id, num_tokens, self.block_size)
        for block in reversed(seq.blocks[self._blocks_for(num_tokens) :]):
            self.allocator.free(block, cached=self._hash[block] is not None)
        del seq.blocks[self._blocks_for(num_tokens) :]
        seq.num_tokens, seq.num_computed = num_tokens, min(seq.num_computed, num_tokens)

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing every block of ``seq_id`` (reference counts, no copy)."""
        seq = _checks.forkable(self.seqs, seq_id)
        for block in seq.blocks:
            self.allocator.incref(block)
        return self._add(seq.copy())

    def preempt(self, seq_id: int, mode: str) -> int:
        """Give up ``seq_id``'s blocks (they stay registered); returns its computed tokens, which
        ``"swap"`` keeps (the caller copied their K and V to host memory), ``"recompute"`` not."""
        mode = _checks.preemption(self, seq_id, mode, PREEMPTION_MODES)
        seq = self.seqs[seq_id]
        held = seq.num_computed
        self._release(seq)
        seq.blocks, seq.hashes, seq.state = [], [], mode
        if mode == "recompute":
            seq.num_computed = 0
        return held

    def resume(self, seq_id: int, token_ids, checked: bool = False) -> int:
        """Blocks again for a preempted sequence's ``token_ids`` (those it held, then any new ones);
        returns the tokens cached blocks serve. After a swap the caller copies the rest of its
        written blocks back."""
        tokens = token_ids if checked else _checks.resume_tokens(self.seqs, seq_id, token_ids)
        seq = self.seqs[seq_id]
        hits, hashes = self._resume_hits(seq, tokens)
        seq.blocks, seq.hashes = self._take(hits, len(tokens)), hashes
        seq.num_tokens = len(tokens)
        if seq.state == "recompute":
            seq.num_computed = self._count_admission(len(tokens), hits)
        seq.state = "resident"
        return len(hits) * self.block_size

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``; blocks no one else holds join the free list, keeping their hash."""
        self._release(_checks.sequence(self.seqs, seq_id))
        del self.seqs[seq_id]

    def _match(self, tokens: list[int], first_parent: bytes, limit: int | None = None):
        """Registered blocks serving the longest run of leading full blocks, and their hashes. At
        most ``limit`` blocks; by default leaving at least one token to compute."""
        if not self.prefix_caching:
            return [], []
        limit = (len(tokens) - 1) // self.block_size if limit is None else limit
        hits, hashes, parent, size = [], [], first_parent, self.block_size
        for k in range(limit):
            parent = chain_hash_unchecked(parent, tokens[k * size : (k + 1) * size])
            block = self._by_hash.get(parent)
            if block is None:
                break
            hits.append(block)
            hashes.append(parent)
        return hits, hashes

    def _resume_hits(self, seq: _Sequence, tokens: list[int]):
        if seq.state == "swap":  # every written full block may come from the cache, not the host
            return self._match(tokens, seq.first_parent, seq.num_computed // self.block_size)
        return self._match(tokens, seq.first_parent)

    def _register(self, block: int, h: bytes) -> None:
        """Register ``block`` as ``h``'s unless one already is (a duplicate)."""
        if h not in self._by_hash and self._hash[block] is None:
            self._by_hash[h], self._hash[block] = block, h

    def _evict(self, block: int) -> None:
        del self._by_hash[self._hash[block]]
        self._hash[block] = None
        self.allocator.uncache(block)

    def _take(self, hits: list[int], num_tokens: int) -> list[int]:
        """Hold the hit blocks (taking free ones back) and new blocks for the rest; all or none."""
        _checks.free_blocks(self, self._blocks_needed(num_tokens, hits))
        pool = self.allocator
        for block in hits:
            pool.incref(block) if pool.ref_count(block) else pool.reclaim(block)
        return hits + self._allocate(self._blocks_for(num_tokens) - len(hits))

    def _allocate(self, count: int) -> list[int]:
        """New blocks from the free list; one that still held a hash loses it (an eviction)."""
        blocks = self.allocator.allocate(count)
        for block in blocks:
            if self._hash[block] is not None:
                self._evict(block)
                self.stats.evictions += 1
        return blocks

    def _release(self, seq: _Sequence) -> None:
        for block in reversed(seq.blocks):  # tail first: a chain loses its last block first
            self.allocator.free(block, cached=self._hash[block] is not None)

    def _add(self, seq: _Sequence) -> int:
        seq_id, self._next_id = self._next_id, self._next_id + 1
        self.seqs[seq_id] = seq
        return seq_id

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _blocks_needed(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks taken: new ones, and hits that nobody holds (taken back off the list)."""
        new = self._blocks_for(num_tokens) - len(hits)
        return new + sum(1 for b in hits if self.allocator.ref_count(b) == 0)

    def _blocks_to_append(self, seq: _Sequence, num_tokens: int) -> int:
        new = self._blocks_for(seq.num_tokens + num_tokens) - len(seq.blocks)
        return new + int(num_tokens > 0 and self._last_block_shared(seq))

    def _last_block_shared(self, seq: _Sequence) -> bool:
        partial = seq.num_tokens % self.block_size != 0
        return partial and self.allocator.ref_count(seq.blocks[-1]) > 1

    def _count_admission(self, num_tokens: int, hits: list[int]) -> int:
        """Count an admission in ``stats``; returns the tokens the hits serve."""
        s, cached = self.stats, len(hits) * self.block_size
        s.admissions, s.prompt_tokens = s.admissions + 1, s.prompt_tokens + num_tokens
        s.hit_blocks, s.hit_tokens = s.hit_blocks + len(hits), s.hit_tokens + cached
        return cached

    def __repr__(self) -> str:
        sizes = f"num_blocks={self.num_blocks}, block_size={self.block_size}"
        counts = f"sequences={len(self.seqs)}, free={self.num_free}, cached={self.num_cached}"
        return f"BlockManager({sizes}, prefix_caching={self.prefix_caching}, {counts})"

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached or not)."""
        return self.allocator.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding a registered hash (held or free)."""
        return len(self._by_hash)

    def sequences(self) -> list[int]:
        return list(self.seqs)

    def num_tokens(self, seq_id: int) -> int:
        return _checks.sequence(self.seqs, seq_id).num_tokens

    def num_computed(self, seq_id: int) -> int:
        return _checks.sequence(self.seqs, seq_id).num_computed

    def state(self, seq_id: int) -> str:
        """``"resident"``, or the preemption mode while preempted."""
        return _checks.sequence(self.seqs, seq_id).state

    def block_table(self, seq_id: int) -> list[int]:
        """``seq_id``'s physical blocks in logical order (a copy)."""
        return list(_checks.sequence(self.seqs, seq_id).blocks)

    def table(self, seq_id: int) -> BlockTable:
        blocks, num_tokens = self.block_table(seq_id), self.num_tokens(seq_id)
        return BlockTable(self.block_size, blocks, num_tokens if blocks else 0)

    def ref_count(self, block: int) -> int:
        return self.allocator.ref_count(block)

    def block_hash(self, block: int) -> bytes | None:
        """The hash ``block`` is registered under, or None."""
        return self._hash[integer("block", block, 0, self.num_blocks)]

    def cached_blocks(self) -> dict[bytes, int]:
        """Every registered hash and the block that holds it (a copy)."""
        return dict(self._by_hash)

    def free_order(self) -> list[int]:
        return self.allocator.free_order()

    def lookup(self, token_ids, salt=None) -> int:
        """Leading tokens of ``token_ids`` that ``admit`` would serve from the cache now."""
        return len(self._match(_checks.prompt(token_ids), root_hash(salt))[0]) * self.block_size

    def blocks_to_admit(self, token_ids, salt=None, checked: bool = False) -> int:
        """Free blocks ``admit`` would take now (new ones, and cached ones taken back)."""
        tokens = token_ids if checked else _checks.prompt(token_ids)
        return self._blocks_needed(len(tokens), self._match(tokens, root_hash(salt))[0])

    def last_block_shared(self, seq_id: int) -> bool:
        """Its last block is partly filled and held by another sequence too (after a fork)."""
        return self._last_block_shared(_checks.sequence(self.seqs, seq_id))

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``num_tokens`` more tokens would take (new ones, and a copy-on-write)."""
        return self._blocks_to_append(*_checks.append_count(self.seqs, seq_id, num_tokens))

    def blocks_to_resume(self, seq_id: int, token_ids, checked: bool = False) -> int:
        """Free blocks ``resume(seq_id, token_ids)`` would take now."""
        tokens = token_ids if checked else _checks.resume_tokens(self.seqs, seq_id, token_ids)
        return self._blocks_needed(len(tokens), self._resume_hits(self.seqs[seq_id], tokens)[0])

    def check(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent."""
        _checks.manager_invariants(self)

    def snapshot(self):
        """Everything mutable, copied, for :meth:`restore` after a failed call."""
        seqs = {i: s.copy() for i, s in self.seqs.items()}
        hashes, by_hash, stats = list(self._hash), dict(self._by_hash), replace(self.stats)
        return self, self.allocator.snapshot(), hashes, by_hash, seqs, self._next_id, stats

    def restore(self, snapshot) -> None:
        """Back to ``snapshot``, but a hash evicted since stays evicted (the rollback rule)."""
        _, allocator, hashes, by_hash, seqs, self._next_id, stats = _checks.own_snapshot(
            self, snapshot
        )
        evicted = [b for h, b in by_hash.items() if self._by_hash.get(h) != b]
        self.allocator.restore(allocator)
        self._hash, self._by_hash, self.stats = list(hashes), dict(by_hash), replace(stats)
        self.seqs = {i: s.copy() for i, s in seqs.items()}
        for block in evicted:
            self._evict(block)
        self.stats.evictions += len(evicted)
