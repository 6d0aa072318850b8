"""Physical KV-cache blocks and who holds them (section 9.5, PagedAttention).

A :class:`BlockAllocator` hands out the ids of fixed-size physical blocks, the
entries of a block table. Blocks are reference counted so that several sequences can
share one (a forked request, a common prefix): a block returns to the free pool only
when its last holder frees it.
"""

from __future__ import annotations

from collections import deque


class OutOfBlocksError(MemoryError):
    """Not enough free blocks; ``needed`` and ``free`` say by how much."""

    def __init__(self, needed: int, free: int, total: int):
        super().__init__(f"need {needed} KV-cache block(s) but only {free} of {total} are free; "
                         "free or preempt a sequence first")
        self.needed, self.free, self.total = needed, free, total


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
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks must be an int >= 1, got {type(num_blocks).__name__}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
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
        if count > len(self._free):
            raise OutOfBlocksError(count, len(self._free), self.num_blocks)
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._ref_counts[block] = 1
        return blocks

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
