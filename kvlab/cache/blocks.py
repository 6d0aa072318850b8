"""Notebooks 05, 06 and 11: the one block allocator of kvlab's serving stack, block tables and block
hashes.

A paged KV cache stores each sequence in fixed-size blocks found through a per-sequence block table
(Kwon et al. 2023). This module and :mod:`kvlab.cache.block_manager` move block ids only; the K and
V tensors live in :class:`kvlab.cache.paged.PagedKVCache`. :func:`block_hashes` chains the hash of
each full block to its parent's, as vLLM and nano-vllm (Yu 2025) do (vLLM's also carries extra
keys: LoRA adapter ids, multimodal input hashes); :func:`reusable_tokens` is the rule that follows.
SGLang's RadixAttention matches prefixes token by token in a radix tree (Zheng et al. 2024), so a
hit there ends at the first differing token, not at a block boundary.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from kvlab._checks import flag, integer, require_memory
from kvlab._checks import token_ids as checked_tokens
from kvlab.cache import _checks
from kvlab.cache._checks import OutOfBlocksError

MAX_BLOCK_ID = 2**31 - 1  # block tables are int32
BOOKKEEPING_BYTES_PER_BLOCK = 64  # a free-list entry, a reference count and a hash slot, rounded up
PREEMPTION_MODES = ("recompute", "swap")
_ROOT = b"kvlab-prefix-root"


class BlockAllocator:
    """Reference-counted pool of ``num_blocks`` physical KV-cache blocks (notebook 05).

    The free list's front is taken next. A freed block that still holds a reusable hash goes to the
    back (``free(block, cached=True)``: the least recently freed is evicted first), any other to the
    front, where taking it evicts nothing.

    >>> pool = BlockAllocator(4)
    >>> (block,) = pool.allocate(1)
    >>> pool.incref(block)          # a second sequence shares it
    >>> pool.free(block); pool.ref_count(block)
    1
    >>> pool.free(block); pool.num_free
    4
    """

    def __init__(self, num_blocks: int):
        num_blocks = integer("num_blocks", num_blocks, 1, MAX_BLOCK_ID + 1)
        what = f"a pool of {num_blocks:,} blocks (allocator bookkeeping)"  # host memory
        require_memory(what, num_blocks * BOOKKEEPING_BYTES_PER_BLOCK, "cpu")
        self.num_blocks, self._refs = num_blocks, [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks from the front of the free list, each held once; all or none."""
        return self._allocate(integer("count", count, 0))

    def reclaim(self, block: int) -> None:
        """Take a free block back out of the free list (a prefix hit on a block nobody holds)."""
        self._reclaim(_checks.free_block(self, block))

    def incref(self, block: int) -> None:
        """One more holder of a held block (another sequence shares it)."""
        self._refs[_checks.held_block(self, block, "incref")] += 1

    def free(self, block: int, cached: bool = False) -> None:
        """Drop one holder; the last one puts the block on the free list (see the class doc)."""
        flag("cached", cached)
        self._free_block(_checks.held_block(self, block, "free"), cached)

    def _allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocksError(count, len(self._free), self.num_blocks)
        blocks = [self._free.popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            self._refs[block] = 1
        return blocks

    def _reclaim(self, block: int) -> None:
        del self._free[block]
        self._refs[block] = 1

    def _free_block(self, block: int, cached: bool) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None  # at the back: evicted last
            if not cached:
                self._free.move_to_end(block, last=False)

    def uncache(self, block: int) -> None:
        """A free block lost its hash: move it to the front, where taking it evicts nothing."""
        if block in self._free:
            self._free.move_to_end(block, last=False)

    # -- queries and rollback ------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_order(self) -> list[int]:
        """Free blocks in the order they are handed out (the first is taken next)."""
        return list(self._free)

    def ref_count(self, block: int) -> int:
        return self._refs[_checks.known_block(self, block)]

    def snapshot(self):
        return list(self._refs), OrderedDict(self._free)

    def restore(self, snapshot) -> None:
        self._refs, self._free = list(snapshot[0]), OrderedDict(snapshot[1])


class BlockTable:
    """One sequence's logical blocks -> physical blocks (notebook 05): token ``t`` lives in physical
    block ``blocks[t // block_size]`` at offset ``t % block_size``. The seed's request A (block size
    16, logical [0, 1, 2] -> physical [7, 2, 15]):

    >>> BlockTable(16, [7, 2, 15], num_tokens=48).physical_location(17)
    (2, 1)
    """

    def __init__(self, block_size: int, blocks=(), num_tokens: int = 0):
        self.block_size = integer("block_size", block_size, 1)
        self.blocks = _checks.block_ids(blocks, MAX_BLOCK_ID + 1)
        self.num_tokens = _checks.table_tokens(num_tokens, len(self.blocks), block_size)

    def __repr__(self) -> str:
        args = f"block_size={self.block_size}, blocks={self.blocks}, num_tokens={self.num_tokens}"
        return f"BlockTable({args})"

    @property
    def capacity(self) -> int:
        """Tokens the held blocks can store."""
        return len(self.blocks) * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        return -(-integer("num_tokens", num_tokens, 0) // self.block_size)

    def physical_location(self, token: int) -> tuple[int, int]:
        """(physical block, offset) of logical token ``token``."""
        integer("token", token, 0, self.capacity)  # the tokens the blocks held can store
        return self.blocks[token // self.block_size], token % self.block_size

    def slots(self, start: int, end: int) -> list[int]:
        """Flat slots ``block * block_size + offset`` of tokens ``start .. end - 1``."""
        start, end = _checks.token_span(start, end, self.capacity)
        size = self.block_size
        return [self.blocks[t // size] * size + t % size for t in range(start, end)]


def block_hashes(token_ids, block_size: int, salt=None) -> list[bytes]:
    """The chained hashes of the full blocks of ``token_ids`` (notebook 06).

    Hash ``k`` covers tokens ``0 .. (k + 1) * block_size - 1`` and ``salt``: two prompts share hash
    ``k`` only when their first ``k + 1`` blocks hold the same token ids under the same salt.
    A partial last block has no hash.
    """
    tokens = checked_tokens("token_ids", token_ids, empty=True)
    block_size = integer("block_size", block_size)
    parent, hashes = root_hash(salt), []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain_hash_unchecked(parent, tokens[start : start + block_size])
        hashes.append(parent)
    return hashes


def root_hash(salt) -> bytes:
    """Where a chain starts: the root, with the salt (a tenant or isolation key) mixed in."""
    salt = _checks.salt(salt)
    if salt is None:
        key = b""
    elif isinstance(salt, str):
        key = b"s" + salt.encode()
    elif isinstance(salt, bytes):
        key = b"b" + salt
    else:
        key = b"i" + str(int(salt)).encode()
    return hashlib.blake2b(_ROOT + key, digest_size=16).digest()


def chain_hash(parent: bytes, block_tokens) -> bytes:
    """The hash of one full block: its parent's hash and its own token ids, 128-bit BLAKE2b."""
    parent = _checks.parent_hash(parent)
    return chain_hash_unchecked(parent, checked_tokens("block_tokens", block_tokens))


def chain_hash_unchecked(parent: bytes, block_tokens: list[int]) -> bytes:
    """:func:`chain_hash` of a checked parent and token ids (the block manager's loops)."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", block_tokens).tobytes())  # token ids are int64, < 2**63
    return digest.digest()


def reusable_tokens(first_difference: int | None, num_tokens: int, block_size: int) -> int:
    """Tokens of a ``num_tokens``-token prompt that a cache holding another prompt serves, when the
    two first differ at token ``first_difference`` (None: not within this prompt). Notebook 06.

    The whole blocks before the first difference (a partial block has no hash), and never the
    prompt's last token, whose logits give the first output token: a prompt of exactly ``n`` blocks
    reuses at most ``n - 1``.
    """
    num_tokens, block_size = integer("num_tokens", num_tokens), integer("block_size", block_size)
    match = _checks.optional(integer, "first_difference", first_difference, 0)
    return min(num_tokens if match is None else match, num_tokens - 1) // block_size * block_size
