"""BlockAllocator (section 9.5): property and stateful tests against a plain model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.paging import BlockAllocator, OutOfBlocksError


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate / share / free sequences; ``holders`` is one entry per reference held."""

    def __init__(self):
        super().__init__()
        self.pool = BlockAllocator(8)
        self.holders = []

    @precondition(lambda self: self.pool.num_free > 0)
    @rule()
    def allocate(self):
        block = self.pool.allocate()
        assert block not in self.holders  # never hand out a block someone still holds
        self.holders.append(block)

    @rule(count=st.integers(0, 10))
    def allocate_many(self, count):
        free_before = self.pool.num_free
        if count > free_before:
            with pytest.raises(OutOfBlocksError, match=f"need {count} .* only {free_before} of 8 are free"):
                self.pool.allocate_many(count)
            assert self.pool.num_free == free_before  # all or nothing
            return
        blocks = self.pool.allocate_many(count)
        assert len(set(blocks)) == count and not set(blocks) & set(self.holders)
        self.holders.extend(blocks)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data):
        block = data.draw(st.sampled_from(self.holders))
        self.pool.incref(block)
        self.holders.append(block)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def free(self, data):
        block = data.draw(st.sampled_from(self.holders))
        self.pool.free(block)
        self.holders.remove(block)

    @rule(block=st.integers(0, 7))
    def free_or_share_a_free_block_fails(self, block):
        if block not in self.holders:
            with pytest.raises(ValueError, match=f"block {block}: it is free"):
                self.pool.free(block)
            with pytest.raises(ValueError, match=f"block {block}: it is free"):
                self.pool.incref(block)

    @invariant()
    def counts_match_holders(self):
        for block in range(8):
            assert self.pool.ref_count(block) == self.holders.count(block)

    @invariant()
    def free_plus_used_is_total(self):
        assert self.pool.num_free + len(set(self.holders)) == 8
        assert self.pool.num_free + self.pool.num_used == 8

    def teardown(self):
        for block in list(self.holders):
            self.pool.free(block)
        assert all(self.pool.ref_count(b) == 0 for b in range(8))  # reference counts return to zero
        assert self.pool.num_free == 8


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(st.integers(1, 64))
def test_every_block_allocated_exactly_once(num_blocks):
    pool = BlockAllocator(num_blocks)
    blocks = [pool.allocate() for _ in range(num_blocks)]
    assert sorted(blocks) == list(range(num_blocks)) and pool.num_free == 0
    with pytest.raises(OutOfBlocksError, match=f"need 1 KV-cache block\\(s\\) but only 0 of {num_blocks}"):
        pool.allocate()


@pytest.mark.parametrize("block", [-1, 4, 1.0, True, None])
def test_unknown_block_is_rejected(block):
    pool = BlockAllocator(4)
    pool.allocate()
    for action in (pool.free, pool.incref, pool.ref_count):
        with pytest.raises(ValueError, match=r"block must be an int in \[0, 4\)"):
            action(block)


@pytest.mark.parametrize("num_blocks,error", [(0, ValueError), (-3, ValueError), (2.0, TypeError)])
def test_bad_pool_size_is_rejected(num_blocks, error):
    with pytest.raises(error, match="num_blocks must be"):
        BlockAllocator(num_blocks)
