"""Notebooks 05, 06 and 11: the block allocator, block tables and block hashes of kvlab's serving
stack.

A paged KV cache stores each sequence in fixed-size blocks found through a per-sequence block table
(Kwon et al. 2023); these ids are all this module and :mod:`kvlab.cache.block_manager` move (the K
and V live in :class:`kvlab.cache.paged.PagedKVCache`). :func:`block_hashes` chains each full
block's hash to its parent's, as vLLM and nano-vllm (Yu 2025) do; SGLang's RadixAttention matches
prefixes token by token in a radix tree (Zheng et al. 2024), so a hit there ends at the first
differing token, not at a block boundary.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from kvlab._checks import integer
from kvlab.cache import _checks
from kvlab.cache._checks import OutOfBlocksError  # noqa: F401 (re-exported: callers catch it here)

MAX_BLOCK_ID = 2**31 - 1  # block tables are int32
BOOKKEEPING_BYTES_PER_BLOCK = 64  # a free-list entry, a reference count and a hash slot, rounded up
PREEMPTION_MODES = ("recompute", "swap")
_ROOT = b"kvlab-prefix-root"


class BlockAllocator:
    """Reference-counted pool of ``num_blocks`` physical KV-cache blocks (notebook 05).

    Blocks are taken from the free list's front. A freed block that keeps its hash (``cached``)
    joins the back, to be evicted last; any other joins the front, where taking it evicts nothing.

    >>> pool = BlockAllocator(4)
    >>> (block,) = pool.allocate(1)
    >>> pool.incref(block); pool.free(block); pool.ref_count(block)
    1
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = _checks.pool_size(num_blocks, MAX_BLOCK_ID, BOOKKEEPING_BYTES_PER_BLOCK)
        self._refs = [0] * self.num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self.num_blocks))

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks from the front of the free list, each held once; all or none."""
        count = _checks.allocation(self, count)
        blocks = [self._free.popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            self._refs[block] = 1
        return blocks

    def reclaim(self, block: int) -> None:
        """Take a free block back off the free list (a prefix hit on a block nobody holds)."""
        del self._free[_checks.free_block(self, block)]
        self._refs[block] = 1

    def incref(self, block: int) -> None:
        """One more holder of a held block (another sequence shares it)."""
        self._refs[_checks.held_block(self, block, "incref")] += 1

    def free(self, block: int, cached: bool = False) -> None:
        """Drop one holder; the last one puts the block on the free list."""
        block, cached = _checks.free_args(self, block, cached)
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None  # at the back: evicted last
            if not cached:
                self.uncache(block)

    def uncache(self, block: int) -> None:
        """A free block lost its hash: move it to the front, where taking it evicts nothing."""
        if block in self._free:
            self._free.move_to_end(block, last=False)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_order(self) -> list[int]:
        """Free blocks in the order they are handed out."""
        return list(self._free)

    def ref_count(self, block: int) -> int:
        return self._refs[_checks.known_block(self, block)]

    def snapshot(self):
        return list(self._refs), OrderedDict(self._free)

    def restore(self, snapshot) -> None:
        self._refs, self._free = list(snapshot[0]), OrderedDict(snapshot[1])


class BlockTable:
    """One sequence's logical blocks -> physical blocks (notebook 05): token ``t`` lives in physical
    block ``blocks[t // block_size]`` at offset ``t % block_size``.

    >>> BlockTable(16, [7, 2, 15], num_tokens=48).physical_location(17)
    (2, 1)
    """

    def __init__(self, block_size: int, blocks=(), num_tokens: int = 0):
        table = _checks.table_args(block_size, blocks, num_tokens, MAX_BLOCK_ID + 1)
        self.block_size, self.blocks, self.num_tokens = table

    def __repr__(self) -> str:
        args = f"block_size={self.block_size}, blocks={self.blocks}, num_tokens={self.num_tokens}"
        return f"BlockTable({args})"

    @property
    def capacity(self) -> int:
        """Tokens the held blocks can store."""
        return len(self.blocks) * self.block_size

    def physical_location(self, token: int) -> tuple[int, int]:
        """(physical block, offset) of logical token ``token``."""
        block, offset = divmod(integer("token", token, 0, self.capacity), self.block_size)
        return self.blocks[block], offset

    def slots(self, start: int, end: int) -> list[int]:
        """Flat slots ``block * block_size + offset`` of tokens ``start .. end - 1``."""
        size = self.block_size
        span = range(*_checks.token_span(start, end, self.capacity))
        return [self.blocks[t // size] * size + t % size for t in span]


def block_hashes(token_ids, block_size: int, salt=None) -> list[bytes]:
    """The chained hashes of the full blocks of ``token_ids`` (notebook 06): hash ``k`` covers
    ``salt`` and tokens ``0 .. (k + 1) * block_size - 1``, so two prompts share it only when their
    first ``k + 1`` blocks match under the same salt. A partial last block has no hash."""
    tokens, size = _checks.hash_args(token_ids, block_size)
    hashes = [root_hash(salt)]
    for start in range(0, len(tokens) - size + 1, size):
        hashes.append(chain_hash_unchecked(hashes[-1], tokens[start : start + size]))
    return hashes[1:]


def root_hash(salt) -> bytes:
    """Where a chain starts: the root, with the salt (a tenant or isolation key) mixed in."""
    salt = _checks.salt(salt)
    if isinstance(salt, str):
        key = b"s" + salt.encode()
    elif isinstance(salt, bytes):
        key = b"b" + salt
    else:  # None or an int
        key = b"" if salt is None else b"i" + str(int(salt)).encode()
    return hashlib.blake2b(_ROOT + key, digest_size=16).digest()


def chain_hash(parent: bytes, block_tokens) -> bytes:
    """The hash of one full block: its parent's hash and its own token ids, 128-bit BLAKE2b."""
    return chain_hash_unchecked(*_checks.chain_args(parent, block_tokens))


def chain_hash_unchecked(parent: bytes, block_tokens: list[int]) -> bytes:
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", block_tokens).tobytes())  # token ids are int64, < 2**63
    return digest.digest()


def reusable_tokens(first_difference: int | None, num_tokens: int, block_size: int) -> int:
    """Tokens of a ``num_tokens``-token prompt that a cache holding another prompt serves, when the
    two first differ at token ``first_difference`` (None: not in this prompt): the whole blocks
    before it (a partial block has no hash), never the last token, whose logits give the first
    output token."""
    match, num_tokens, block_size = _checks.reusable_args(first_difference, num_tokens, block_size)
    return min(num_tokens if match is None else match, num_tokens - 1) // block_size * block_size
