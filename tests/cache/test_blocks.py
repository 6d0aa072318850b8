"""The block allocator and the block manager (notebooks 05, 06, 11): scenarios written from the
semantics, and random sequences of calls checked against a shadow model that knows only token lists.

A hash is registered only once its block is committed (its K and V written): every hit below is on
committed data, and the rollback rule keeps an evicted hash evicted."""

import doctest

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvlab.cache.block_manager
import kvlab.cache.blocks
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.blocks import BlockAllocator, BlockTable, OutOfBlocksError, block_hashes


def state(m: BlockManager):
    """Everything a failed call must leave alone."""
    seqs = {
        s: (m.block_table(s), m.num_tokens(s), m.num_computed(s), m.state(s)) for s in m.sequences()
    }
    return (
        m.free_order(),
        [m.ref_count(b) for b in range(m.num_blocks)],
        m.cached_blocks(),
        seqs,
        repr(m.stats),
    )


def written(m: BlockManager, tokens, salt=None):
    """Admit ``tokens`` and commit them all, as a prefill that wrote every token's K and V."""
    seq, cached = m.admit(tokens, salt)
    m.commit(seq, len(tokens), tokens)
    return seq, cached


def test_doctests():
    assert doctest.testmod(kvlab.cache.blocks).failed == 0
    assert doctest.testmod(kvlab.cache.block_manager).failed == 0


# --------------------------------------------------------------------------- the allocator


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate / share / free / reclaim, with a failing call of every kind between them;
    ``holders`` is the model (block -> references held)."""

    def __init__(self):
        super().__init__()
        self.pool = BlockAllocator(8)
        self.holders = {}

    def _fails(self, call, error, match=None):
        before = (self.pool.free_order(), [self.pool.ref_count(b) for b in range(8)])
        with pytest.raises(error, match=match):
            call()
        assert (self.pool.free_order(), [self.pool.ref_count(b) for b in range(8)]) == before

    @rule(count=st.integers(0, 10))
    def allocate(self, count):
        free_before = self.pool.num_free
        if count > free_before:
            self._fails(
                lambda: self.pool.allocate(count),
                OutOfBlocksError,
                f"need {count} .* only {free_before} of 8 are free",
            )
            return
        front = self.pool.free_order()[:count]
        blocks = self.pool.allocate(count)
        assert blocks == front and not set(blocks) & set(
            self.holders
        )  # never a block someone holds
        self.holders.update(dict.fromkeys(blocks, 1))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data):
        block = data.draw(st.sampled_from(sorted(self.holders)))
        self.pool.incref(block)
        self.holders[block] += 1

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), cached=st.booleans())
    def free(self, data, cached):
        block = data.draw(st.sampled_from(sorted(self.holders)))
        self.pool.free(block, cached=cached)
        self.holders[block] -= 1
        if not self.holders[block]:
            del self.holders[block]
            order = self.pool.free_order()
            assert order[-1 if cached else 0] == block  # cached: taken last; uncached: taken first

    @precondition(lambda self: self.pool.num_free)
    @rule(data=st.data())
    def reclaim(self, data):
        block = data.draw(st.sampled_from(self.pool.free_order()))
        self.pool.reclaim(block)
        self.holders[block] = 1

    @rule(
        bad=st.sampled_from([-1, 8, 1.0, "0", None, True]),
        action=st.sampled_from(["free", "incref", "ref_count"]),
    )
    def bad_block(self, bad, action):
        self._fails(
            lambda: getattr(self.pool, action)(bad),
            (TypeError, ValueError),
            r"block must be an int in \[0, 8\)",
        )

    @rule(bad=st.sampled_from([-1, 2.0, "1", None]))
    def bad_count(self, bad):
        self._fails(
            lambda: self.pool.allocate(bad), (TypeError, ValueError), "count must be an int"
        )

    @rule(block=st.integers(0, 7))
    def misuse(self, block):
        if block in self.holders:
            self._fails(
                lambda: self.pool.reclaim(block),
                ValueError,
                f"cannot reclaim block {block}: it is held",
            )
        else:
            for action in (self.pool.free, self.pool.incref):
                self._fails(lambda: action(block), ValueError, f"block {block}: it is free")

    @invariant()
    def counts_match_holders(self):
        for block in range(8):
            assert self.pool.ref_count(block) == self.holders.get(block, 0)
        assert (
            self.pool.num_free + len(self.holders) == 8 == self.pool.num_free + self.pool.num_used
        )
        assert sorted(self.pool.free_order()) == sorted(set(range(8)) - set(self.holders))

    def teardown(self):
        for block, count in list(self.holders.items()):
            for _ in range(count):
                self.pool.free(block)
        assert all(self.pool.ref_count(b) == 0 for b in range(8)) and self.pool.num_free == 8


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


@given(st.integers(1, 64))
def test_every_block_allocated_exactly_once(num_blocks):
    pool = BlockAllocator(num_blocks)
    blocks = pool.allocate(num_blocks)
    assert sorted(blocks) == list(range(num_blocks)) and pool.num_free == 0
    with pytest.raises(
        OutOfBlocksError, match=f"need 1 KV-cache block\\(s\\) but only 0 of {num_blocks}"
    ):
        pool.allocate(1)


@pytest.mark.parametrize(
    "num_blocks, error, match",
    [
        (0, ValueError, "num_blocks must be"),
        (-3, ValueError, "num_blocks must be"),
        (2.0, TypeError, "num_blocks"),
        (10**12, ValueError, r"num_blocks must be an int in \[1, 2147483648\)"),
        (2**31 - 1, MemoryError, r"bytes but only .* bytes are free"),
    ],
)
def test_bad_pool_size_is_refused(num_blocks, error, match):
    with pytest.raises(error, match=match):
        BlockAllocator(num_blocks)


def test_out_of_blocks_says_bytes_when_it_knows_them():
    error = OutOfBlocksError(3, 1, 8, bytes_per_block=4096)
    assert (error.needed, error.free, error.total) == (3, 1, 8)
    assert "12,288 bytes needed, 4,096 bytes free, 4,096 bytes per block" in str(error)


# --------------------------------------------------------------------------- block tables and
# hashes


def test_seed_lookup_example():
    """Seed 000, section 9.5: request A maps logical [0, 1, 2] to physical [7, 2, 15], block size
    16."""
    table = BlockTable(16, [7, 2, 15], num_tokens=48)
    expected = {
        0: (7, 0),
        15: (7, 15),
        16: (2, 0),
        17: (2, 1),
        31: (2, 15),
        32: (15, 0),
        47: (15, 15),
    }
    for token, location in expected.items():
        assert table.physical_location(token) == location
    assert table.slots(15, 18) == [7 * 16 + 15, 2 * 16 + 0, 2 * 16 + 1]
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 48\)"):
        table.physical_location(48)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: BlockTable(4, ["a"]), TypeError, r"blocks\[0\] must be an int"),
        (lambda: BlockTable(4, [None]), TypeError, r"blocks\[0\] must be an int"),
        (lambda: BlockTable(4, [-1]), ValueError, r"blocks\[0\] must be an int in \[0, "),
        (lambda: BlockTable(4, [1], num_tokens=5), ValueError, r"num_tokens must be in \[0, 4\]"),
        (lambda: BlockTable(0), ValueError, "block_size must be"),
        (
            lambda: BlockTable(4, [1]).physical_location(4),
            ValueError,
            r"token must be an int in \[0, 4\)",
        ),
    ],
)
def test_block_table_refuses_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_block_hashes_chain_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_hashes([1, 2, 3, 9, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3  # a partial last block has no hash
    assert (
        a[0] == b[0] and a[1] != b[1] and a[2] != b[2]
    )  # block 2's tokens match, its prefix does not
    assert block_hashes([1, 2, 3, 4, 5, 6, 7], 2) == a and block_hashes([3], 4) == []
    salted = {s: block_hashes(list(range(9)), 4, salt=s) for s in (None, "a", b"a", 7, "7")}
    assert len({h[0] for h in salted.values()}) == 5
    with pytest.raises(TypeError, match="salt"):
        block_hashes([1], 1, salt=[1])


# --------------------------------------------------------------------------- the block manager


def test_a_reserved_block_is_a_hit_only_once_written():
    m = BlockManager(16, 4, prefix_caching=True)
    a, _ = m.admit(list(range(10)))
    assert m.lookup(list(range(10))) == 0 and m.num_cached == 0  # reserved, not written: no promise
    m.commit(a, 6, range(10))  # the first block is written, the second half
    assert m.lookup(list(range(10))) == 4 and m.num_cached == 1
    m.commit(a, 10, range(10))
    b, cached = m.admit(list(range(8)) + [50, 51, 52])
    assert cached == 8 and m.block_table(a)[:2] == m.block_table(b)[:2]
    assert [m.ref_count(x) for x in m.block_table(a)] == [2, 2, 1]
    assert m.stats.hit_tokens == 8 and m.stats.hit_rate == pytest.approx(8 / 21)
    with pytest.raises(ValueError, match=r"num_computed must be an int in \[10, 11\)"):
        m.commit(a, 9, range(10))  # what is written stays written


def test_only_the_tokens_handed_over_are_cached_and_a_draft_is_given_back():
    """A speculative step computes draft tokens the request does not hold yet: commit hashes only
    the blocks of the tokens it is handed, and truncate gives the rejected slots back."""
    m = BlockManager(8, 2, prefix_caching=True)
    tokens = [1, 2, 3]
    seq, _ = written(m, tokens)
    m.reserve(seq, 4)  # the newest token's slot, then three drafted
    m.commit(seq, 7, tokens)  # all seven computed; only [1, 2] is a full block of finalized tokens
    assert m.num_cached == 1 and len(m.block_table(seq)) == 4 and m.num_free == 4
    tokens += [4, 9]  # the model agreed with the first draft token (4) and then chose 9
    m.truncate(seq, len(tokens) - 1)
    assert (m.num_tokens(seq), m.num_computed(seq), len(m.block_table(seq))) == (4, 4, 2)
    assert m.num_free == 6 and m.num_cached == 1
    m.reserve(seq, 1)
    m.commit(seq, 5, tokens)  # the accepted token's block is cached now that it is the request's
    assert m.num_cached == 2 and m.lookup([1, 2, 3, 4, 7]) == 4
    with pytest.raises(ValueError, match=r"num_tokens must be an int in \[4, 6\)"):
        m.truncate(seq, 3)  # not into a block whose hash it registered
    m.check()


def test_prefix_caching_off_never_registers():
    m = BlockManager(8, 2)
    written(m, [1, 2, 3, 4, 5])
    assert (
        m.num_cached == 0 and m.lookup([1, 2, 3, 4, 5]) == 0 and written(m, [1, 2, 3, 4, 5])[1] == 0
    )


def test_divergence_inside_a_block_shares_only_the_blocks_before_it():
    m = BlockManager(16, 4, prefix_caching=True)
    written(m, list(range(12)) + [99])
    assert m.admit(list(range(6)) + [77] + list(range(7, 12)) + [99])[1] == 4


@pytest.mark.parametrize("k", range(5))
def test_one_changed_token_in_block_k_reuses_exactly_k_blocks(k):
    prompt = list(range(100, 116))
    m = BlockManager(32, 3, prefix_caching=True)
    written(m, prompt)
    changed = list(prompt)
    changed[k * 3 + 1] += 1000
    assert m.lookup(changed) == k * 3 == m.admit(changed)[1]


def test_a_later_match_after_a_difference_is_not_reused():
    m = BlockManager(16, 2, prefix_caching=True)
    written(m, [1, 2, 3, 4, 5, 6, 7])
    assert m.admit([1, 2, 9, 9, 5, 6, 7])[1] == 2
    assert m.admit([5, 6, 1, 2, 3])[1] == 0  # the same blocks at other positions


def test_exact_multiple_prompt_repeated_reuses_one_block_less():
    m = BlockManager(16, 4, prefix_caching=True)
    a, _ = written(m, list(range(8)))
    b, cached = written(m, list(range(8)))
    assert cached == 4  # at least one token is computed, so the second block is not reused
    ta, tb = m.block_table(a), m.block_table(b)
    assert ta[0] == tb[0] and ta[1] != tb[1]
    assert m.block_hash(tb[1]) is None and m.num_cached == 2  # a duplicate, not registered twice
    m.free(a)
    m.free(b)
    assert m.admit(list(range(9)))[1] == 8


def test_single_block_prompts_and_block_size_one():
    m = BlockManager(4, 4, prefix_caching=True)
    written(m, [1, 2, 3, 4])
    assert m.admit([1, 2, 3, 4])[1] == 0 and m.admit([1])[1] == 0
    one = BlockManager(16, 1, prefix_caching=True)
    written(one, [5, 6, 7])
    assert one.admit([5, 6, 7])[1] == 2 and one.admit([5, 6, 8, 9])[1] == 2


def test_salt_isolates_tenants():
    m = BlockManager(64, 4, prefix_caching=True)
    prompt = list(range(9))
    written(m, prompt, salt="tenant-a")
    assert written(m, prompt, salt="tenant-b")[1] == 0 and written(m, prompt)[1] == 0
    assert m.admit(prompt, salt="tenant-a")[1] == 8
    assert m.admit(prompt, salt=7)[1] == 0 and m.admit(prompt, salt="7")[1] == 0


def test_decode_fills_and_registers_a_block_once_written():
    m = BlockManager(8, 4, prefix_caching=True)
    tokens = [1, 2, 3]  # the caller's list: the block manager keeps none
    seq, _ = written(m, tokens)
    tokens.append(4)
    assert m.blocks_to_append(seq) == 0 and m.reserve(seq, 1) is None
    assert m.num_cached == 0  # full, but token 4's K and V are not written yet
    m.commit(seq, 4, tokens)
    assert m.block_hash(m.block_table(seq)[0]) == block_hashes([1, 2, 3, 4], 4)[0]
    assert m.blocks_to_append(seq) == 1
    for t in (5, 6, 7, 8):
        tokens.append(t)
        m.reserve(seq, 1)
        m.commit(seq, m.num_tokens(seq), tokens)
    assert m.num_cached == 2 and len(m.block_table(seq)) == 2
    other, cached = m.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert cached == 8 and m.block_table(other)[:2] == m.block_table(seq)


def test_freed_blocks_stay_cached_and_a_hit_takes_them_off_the_free_list():
    m = BlockManager(6, 2, prefix_caching=True)
    a, _ = written(m, [1, 2, 3, 4, 5])
    blocks = m.block_table(a)
    m.free(a)
    assert m.num_free == 6 and m.num_cached == 2 and all(m.ref_count(b) == 0 for b in blocks)
    b, cached = m.admit([1, 2, 3, 4, 9])
    assert (
        cached == 4
        and m.block_table(b)[:2] == blocks[:2]
        and not set(blocks[:2]) & set(m.free_order())
    )
    assert m.num_free == 3 and m.stats.evictions == 0


def test_lru_evicts_least_recently_freed_and_chain_tail_first():
    m = BlockManager(8, 2, prefix_caching=True)
    x, _ = written(m, [1, 2, 3, 4, 5, 6, 7])  # 3 full blocks + a partial one
    y, _ = written(m, [10, 11, 12, 13, 14])  # 2 full blocks + a partial one
    tx, ty = m.block_table(x), m.block_table(y)
    m.free(x)  # x freed first: least recently freed
    m.free(y)
    # Uncached blocks come first (taking them evicts nothing), then x tail first, then y tail first.
    assert m.free_order() == [ty[2], tx[3], 7, tx[2], tx[1], tx[0], ty[1], ty[0]]
    m.admit(list(range(100, 108)))  # 4 new blocks: the two partials, block 7, then x's tail
    assert m.stats.evictions == 1
    assert m.lookup([1, 2, 3, 4, 5, 6, 7]) == 4 and m.lookup([10, 11, 12, 13, 14]) == 4
    w, _ = m.admit(list(range(200, 202)))
    assert (
        m.lookup([1, 2, 3, 4, 5, 6, 7]) == 2
        and m.stats.evictions == 2
        and m.block_table(w) == [tx[1]]
    )


def test_shared_block_is_freed_only_by_its_last_holder():
    m = BlockManager(8, 2, prefix_caching=True)
    a, _ = written(m, [1, 2, 3])
    b, _ = m.admit([1, 2, 4])
    c, _ = m.admit([1, 2, 5])
    shared = m.block_table(a)[0]
    assert m.ref_count(shared) == 3
    m.free(a)
    m.free(b)
    assert m.ref_count(shared) == 1 and shared not in m.free_order()
    m.free(c)
    assert m.ref_count(shared) == 0 and shared in m.free_order()


def test_fork_shares_and_the_first_write_copies_the_last_block():
    m = BlockManager(8, 4, prefix_caching=True)
    parent, _ = written(m, [1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="not written yet"):
        m.fork(m.admit([9, 9])[0])
    child = m.fork(parent)
    assert m.block_table(child) == m.block_table(parent) and m.blocks_to_append(child) == 1
    last = m.block_table(parent)[1]
    source, copy = m.reserve(child, 1)
    assert source == last and m.block_table(child) == [m.block_table(parent)[0], copy]
    assert m.ref_count(last) == 1 and m.ref_count(copy) == 1 and m.reserve(parent, 1) is None
    m.check()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempt_and_resume_reuse_the_sequences_own_cached_blocks(mode):
    m = BlockManager(8, 2, prefix_caching=True)
    tokens = [1, 2, 3, 4, 5, 6, 7]
    seq, _ = m.admit(tokens)
    m.commit(seq, 5, tokens)  # mid-prefill: blocks 0 and 1 written, block 2 half
    assert m.preempt(seq, mode) == 5 and m.num_free == 8 and m.state(seq) == mode
    assert m.num_computed(seq) == (5 if mode == "swap" else 0) and m.num_cached == 2
    with pytest.raises(ValueError, match="is preempted"):
        m.reserve(seq, 1)
    with pytest.raises(ValueError, match="must hold sequence .*'s 7 tokens"):
        m.resume(seq, tokens[:6])
    assert (
        m.blocks_to_resume(seq, tokens) == 4 and m.resume(seq, tokens) == 4
    )  # the two written blocks come back as hits
    assert m.state(seq) == "resident" and m.num_computed(seq) == (5 if mode == "swap" else 4)
    with pytest.raises(ValueError, match="is not preempted"):
        m.resume(seq, tokens)
    m.check()


def test_failed_admission_and_reservation_change_nothing():
    m = BlockManager(4, 2, prefix_caching=True)
    a, _ = written(m, [1, 2, 3, 4, 5])
    m.free(a)  # all 4 free, 2 of them cached
    keep, _ = m.admit([7])
    before = state(m)
    with pytest.raises(
        OutOfBlocksError, match="need 4 KV-cache block.* only 3 of 4 are free"
    ) as info:
        m.admit([1, 2, 3, 4, 5, 6, 7, 8])  # would take the two cached blocks back and 2 new ones
    assert (info.value.needed, info.value.free, info.value.total) == (4, 3, 4) and state(
        m
    ) == before
    b, _ = written(m, [1, 2, 3, 4, 5])
    before = state(m)
    with pytest.raises(OutOfBlocksError, match="need 1 .* only 0 of 4"):
        m.reserve(b, 2)
    assert state(m) == before


def test_restore_keeps_an_eviction_the_failed_call_made():
    """The rollback rule: a failed call that took a free cached block (evicting its hash) may have
    overwritten it, so a restore puts back everything but that hash."""
    m = BlockManager(4, 2, prefix_caching=True)
    a, _ = written(m, [1, 2, 3, 4, 5])  # blocks 0, 1 registered; block 2 partial
    m.free(a)
    before, snapshot = state(m), m.snapshot()
    b, _ = m.admit([9, 9, 9, 9, 9, 9, 9])  # four blocks: takes both cached ones, evicting them
    assert m.num_cached == 0 and m.stats.evictions == 2
    m.restore(snapshot)  # the model call that was to write them failed
    free, refs, cached, seqs, _ = state(m)
    assert (refs, seqs) == (before[1], before[3]) and cached == {} and m.stats.evictions == 2
    assert sorted(free) == sorted(before[0]) and m.lookup([1, 2, 3, 4, 5]) == 0
    m.check()
    c, _ = m.admit([1, 2, 3, 4, 5])
    assert (
        m.num_computed(c) == 0
    )  # computed again, never read from a block that may hold other K and V


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
    with pytest.raises(TypeError, match="prefix_caching must be True or False"):
        BlockManager(4, 2, prefix_caching=1)
    m = BlockManager(4, 2, prefix_caching=True)
    a, _ = m.admit([1, 2, 3])
    before = state(m)
    for call, error, match in [
        (lambda: m.admit([]), ValueError, "at least one token"),
        (lambda: m.admit("hello"), TypeError, "tokenize"),
        (lambda: m.admit([1, -1]), ValueError, r"token_ids\[1\].*-1"),
        (lambda: m.admit([1.5]), TypeError, r"\[0\]"),
        (lambda: m.admit([1, 2**63]), ValueError, r"2\*\*63"),
        (lambda: m.admit([1], salt=[1]), TypeError, "salt"),
        (lambda: m.reserve(99, 1), ValueError, "seq_id 99 is not a live sequence"),
        (lambda: m.free(99), ValueError, "seq_id 99"),
        (lambda: m.block_table(99), ValueError, "seq_id 99"),
        (lambda: m.reserve(a, -3), ValueError, "num_tokens"),
        (lambda: m.ref_count(4), ValueError, "block"),
        (lambda: m.commit(a, 4, [1, 2, 3]), ValueError, "num_computed"),
        (lambda: m.commit(a, 3, 7), TypeError, "token_ids must be sequence 0's token ids"),
        (lambda: m.truncate(a, 4), ValueError, r"num_tokens must be an int in \[0, 4\)"),
        (lambda: m.commit(a, 3, [1, -2, 3]), ValueError, r"token_ids\[:2\]\[1\]"),
        (lambda: m.preempt(a, "drop"), ValueError, "mode"),
        (lambda: m.blocks_to_append(a, -1), ValueError, "num_tokens"),
        (lambda: m.resume(a, [1, 2, 3]), ValueError, "not"),
    ]:
        with pytest.raises(error, match=match):
            call()
    assert state(m) == before
    m.commit(a, 2, [1, 2, 3])  # its first block is cached: token_ids must hold it from now on
    before = state(m)
    for ids in ([], [1], [1.5, 2, 3]):
        with pytest.raises((TypeError, ValueError), match=r"token_ids"):
            m.commit(a, 3, ids)
    assert state(m) == before
    m.free(a)
    with pytest.raises(ValueError, match=f"seq_id {a}"):
        m.free(a)


def test_tensor_and_numpy_prompts():
    m = BlockManager(8, 2, prefix_caching=True)
    written(m, torch.tensor([1, 2, 3]))
    assert m.admit(np.array([1, 2, 4]))[1] == 2


def test_check_catches_a_broken_count():
    m = BlockManager(8, 2)
    a, _ = m.admit([1, 2, 3])
    m.check()
    m.allocator.incref(m.block_table(a)[0])  # a holder nobody accounts for
    with pytest.raises(AssertionError, match="reference count 2, holders 1"):
        m.check()


# --------------------------------------------------------------------------- random sequences


def identity(salt, tokens, k, block_size):
    """What block ``k`` of a sequence holds, by definition: the salt and every token up to its
    end."""
    return (salt, tuple(tokens[: (k + 1) * block_size]))


class ManagerMachine(RuleBasedStateMachine):
    """Random admit / reserve / commit / fork / preempt / resume / free, and failing calls restored
    from a snapshot, on a small pool with a small alphabet so that prefixes collide. The shadow
    model knows each sequence's salt and tokens, and what each block held when last seen written."""

    block_size = 2

    def __init__(self):
        super().__init__()
        self.m = BlockManager(10, self.block_size, prefix_caching=True)
        self.salt = {}
        self.tokens = {}  # each sequence's tokens: the caller's, as the engine's Request holds them
        self.content = {}  # block -> identity of the written full block it holds

    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=9)

    def _live(self, data, states=("resident",)):
        seqs = [s for s in self.m.sequences() if self.m.state(s) in states]
        return data.draw(st.sampled_from(seqs)) if seqs else None

    @rule(tokens=tokens, salt=st.sampled_from([None, "t"]))
    def admit(self, tokens, salt):
        bs = self.block_size
        registered = {self.content[b] for b in self.m.cached_blocks().values()}
        # the oracle: leading full blocks whose written identity a registered block holds
        expected = 0
        while (
            expected < (len(tokens) - 1) // bs
            and identity(salt, tokens, expected, bs) in registered
        ):
            expected += 1
        before, needed = state(self.m), self.m.blocks_to_admit(tokens, salt)
        try:
            seq, cached = self.m.admit(tokens, salt)
        except OutOfBlocksError as error:
            assert needed > self.m.num_free and (error.needed, error.free) == (
                needed,
                self.m.num_free,
            )
            assert state(self.m) == before
            return
        assert cached == expected * bs == self.m.num_computed(seq)
        self.salt[seq], self.tokens[seq] = salt, tokens

    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def reserve(self, data, tokens):
        seq = self._live(data)
        if seq is None:
            return
        before = state(self.m)
        try:
            self.m.reserve(seq, len(tokens))
        except OutOfBlocksError:
            assert state(self.m) == before
            return
        self.tokens[seq] = self.tokens[seq] + tokens

    @rule(data=st.data(), share=st.floats(0, 1))
    def commit(self, data, share):
        seq = self._live(data)
        if seq is not None:
            done, held = self.m.num_computed(seq), self.m.num_tokens(seq)
            self.m.commit(seq, done + round(share * (held - done)), self.tokens[seq])

    @rule(data=st.data())
    def fork(self, data):
        seq = self._live(data)
        if seq is not None and self.m.num_computed(seq) == self.m.num_tokens(seq):
            child = self.m.fork(seq)
            self.salt[child], self.tokens[child] = self.salt[seq], self.tokens[seq]

    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        seq = self._live(data)
        if seq is not None:
            self.m.preempt(seq, mode)

    @rule(data=st.data())
    def resume(self, data):
        seq = self._live(data, ("recompute", "swap"))
        if seq is None:
            return
        before = state(self.m)
        try:
            self.m.resume(seq, self.tokens[seq])
        except OutOfBlocksError:
            assert state(self.m) == before

    @rule(data=st.data())
    def free(self, data):
        seq = self._live(data, ("resident", "recompute", "swap"))
        if seq is not None:
            self.m.free(seq)
            del self.salt[seq], self.tokens[seq]

    @rule(tokens=tokens)
    def failed_call(self, tokens):
        """A model step that failed after admitting (and maybe evicting): restored from its
        snapshot."""
        before, snapshot = state(self.m), self.m.snapshot()
        try:
            self.m.admit(tokens)
        except OutOfBlocksError:
            pass
        evicted_now = set(snapshot[2]) - set(self.m.cached_blocks())
        self.m.restore(snapshot)
        free, refs, cached, seqs, _ = state(self.m)
        assert (refs, seqs) == (before[1], before[3]) and sorted(free) == sorted(before[0])
        assert cached == {h: b for h, b in before[2].items() if h not in evicted_now}

    @invariant()
    def blocks_agree_with_the_shadow(self):
        m, bs = self.m, self.block_size
        m.check()
        for seq in m.sequences():
            tokens, table = self.tokens[seq], m.block_table(seq)
            for k in range(m.num_computed(seq) // bs if m.state(seq) == "resident" else 0):
                self.content[table[k]] = identity(self.salt[seq], tokens, k, bs)
        for h, block in m.cached_blocks().items():  # a registered block holds what its hash names
            salt, tokens = self.content[block]
            assert block_hashes(list(tokens), bs, salt)[-1] == h

    def teardown(self):
        for seq in self.m.sequences():
            self.m.free(seq)
        assert self.m.num_free == self.m.num_blocks


class ManagerMachineBlockOne(ManagerMachine):
    block_size = 1


class ManagerMachineBlockThree(ManagerMachine):
    block_size = 3


_settings = settings(
    max_examples=80,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = _settings
TestManagerMachineBlockOne = ManagerMachineBlockOne.TestCase
TestManagerMachineBlockOne.settings = _settings
TestManagerMachineBlockThree = ManagerMachineBlockThree.TestCase
TestManagerMachineBlockThree.settings = _settings


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 60), st.integers(0, 70), st.sampled_from([1, 2, 4, 16]), st.integers(0, 10_000)
)
def test_reusable_tokens_is_what_the_block_manager_serves(length, first, block_size, seed):
    """The block rule against the block manager: a cache holding a reference serves a variant that
    first differs at ``first`` exactly ``reusable_tokens(first, ...)``, a partial block never, and
    never the variant's last token."""
    from kvlab.cache.blocks import reusable_tokens

    rng = np.random.default_rng(seed)
    reference = rng.integers(0, 1000, 80).tolist()
    variant = reference[:length]
    differs = first if first < length else None
    if differs is not None:
        variant[first] = (variant[first] + 1) % 1000
    manager = BlockManager(num_blocks=128, block_size=block_size, prefix_caching=True)
    seq, _ = manager.admit(reference)
    manager.commit(seq, len(reference), reference)
    assert manager.lookup(variant) == reusable_tokens(differs, length, block_size)


def test_reusable_tokens_refuses_bad_input():
    from kvlab.cache.blocks import reusable_tokens

    for args, match in [
        ((-1, 10, 4), "first_difference"),
        ((None, 0, 4), "num_tokens"),
        ((None, 10, 0), "block_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            reusable_tokens(*args)


def _manager_with_one():
    m = BlockManager(8, 4, prefix_caching=True)
    seq, _ = m.admit([1, 2, 3])
    return m, seq


# issue 22's bad calls of the block manager: each refused with the argument named, the manager
# unchanged
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, s: m.admit([1.5, -2]), TypeError, r"token_ids\[0\] must be a token id"),
        (lambda m, s: m.admit([-2]), ValueError, r"token_ids\[0\] must be a token id in \[0, "),
        (lambda m, s: m.admit("abcd"), TypeError, "tokenize the text first"),
        (lambda m, s: m.admit(7), TypeError, "token_ids must be a list of token ids"),
        (lambda m, s: m.admit([True, 2]), TypeError, r"token_ids\[0\]"),
        (lambda m, s: m.admit([]), ValueError, "at least one token id"),
        (lambda m, s: m.free(True), TypeError, "seq_id must be an int"),  # never sequence 1
        (
            lambda m, s: m.free(99),
            ValueError,
            "seq_id 99 is not a live sequence",
        ),  # not a bare KeyError
        (lambda m, s: m.reserve(s, 1.0), TypeError, "num_tokens must be an int"),
        (lambda m, s: m.preempt(s, "drop"), ValueError, "mode must be one of"),
        (
            lambda m, s: BlockManager(8, 4, prefix_caching="no"),
            TypeError,
            "prefix_caching must be True or False",
        ),
        (
            lambda m, s: BlockManager(8, 4, bytes_per_block=1.5),
            TypeError,
            "bytes_per_block must be an int",
        ),
    ],
)
def test_block_manager_refuses_bad_input_and_changes_nothing(call, error, match):
    m, seq = _manager_with_one()
    before = state(m)
    with pytest.raises(error, match=match):
        call(m, seq)
    assert state(m) == before
    m.check()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: kvlab.cache.blocks.chain_hash(b"x", [1.5]),
            TypeError,
            r"block_tokens\[0\] must be a token id",
        ),
        (
            lambda: kvlab.cache.blocks.chain_hash(b"x", [-1]),
            ValueError,
            r"block_tokens\[0\] must be a token id",
        ),
        (
            lambda: kvlab.cache.blocks.chain_hash("x", [1]),
            TypeError,
            "parent must be the bytes of a hash",
        ),
        (lambda: kvlab.cache.blocks.root_hash([1]), TypeError, "salt must be"),
    ],
)
def test_hashes_refuse_what_is_not_a_block(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_restore_refuses_another_managers_snapshot_and_changes_nothing():
    a, b = BlockManager(8, 4, prefix_caching=True), BlockManager(8, 4, prefix_caching=True)
    seq, _ = b.admit([1, 2, 3, 4, 5])
    table, free = b.block_table(seq), b.free_order()
    with pytest.raises(ValueError, match="snapshot"):
        b.restore(a.snapshot())
    with pytest.raises(ValueError, match="snapshot"):
        b.restore("bogus")
    assert b.block_table(seq) == table and b.free_order() == free
