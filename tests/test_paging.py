"""BlockAllocator (section 9.5): property and stateful tests against a plain model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.cache.paged import BlockAllocator, OutOfBlocksError


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


# =========================================================================== block tables and PagedKVCache

import math  # noqa: E402
from collections import Counter  # noqa: E402

import torch  # noqa: E402

from kvlab.kernels import store_kv_ref  # noqa: E402
from kvlab.cache.paged import BlockTable, PagedKVCache, Request, make_trace, simulate, tokens_in_budget
from kvlab.theory.shapes import SHAPES  # noqa: E402


def test_seed_lookup_example():
    """Seed 000, section 9.5: request A maps logical [0, 1, 2] to physical [7, 2, 15], block size 16."""
    table = BlockTable(16, [7, 2, 15], num_tokens=48)
    expected = {0: (7, 0), 15: (7, 15), 16: (2, 0), 17: (2, 1), 31: (2, 15), 32: (15, 0), 47: (15, 15)}
    for token, location in expected.items():
        assert table.physical_location(token) == location
    assert table.slots(15, 18) == [7 * 16 + 15, 2 * 16 + 0, 2 * 16 + 1]
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 48\)"):
        table.physical_location(48)


LAYERS, HEADS, DIM = 2, 2, 4


def _tokens(gen, n):
    """K and V for n tokens; every value distinct enough that a misplaced token shows."""
    return torch.randn(n, HEADS, DIM, generator=gen), torch.randn(n, HEADS, DIM, generator=gen)


class PagedCacheMachine(RuleBasedStateMachine):
    """Random admit / append / fork / preempt (recompute or swap) / finish sequences on a small pool.

    ``expected[seq][layer]`` is what the sequence must read back (a plain Python model). The stateful
    run uses ``store_kv_ref`` for speed; the kernel path is tested below and in test_paged_attention.
    """

    def __init__(self):
        super().__init__()
        self.cache = PagedKVCache(LAYERS, 12, 4, HEADS, DIM, torch.float32, "cpu", store=store_kv_ref)
        self.expected = {}  # resident sequences: seq -> [(k, v) per layer]
        self.swapped = {}  # swapped-out sequences: seq -> the same
        self.gen = torch.Generator().manual_seed(0)

    def _append_all_layers(self, seq, n):
        needed = self.cache.blocks_to_append(seq, n)
        if needed > self.cache.num_free:
            before = (list(self.cache.table(seq).blocks), self.cache.num_free)
            with pytest.raises(OutOfBlocksError, match=r"bytes needed"):
                self.cache.append(seq, 0, *_tokens(self.gen, n))
            assert (self.cache.table(seq).blocks, self.cache.num_free) == before  # all or nothing
            return
        for layer in range(LAYERS):
            k, v = _tokens(self.gen, n)
            self.cache.append(seq, layer, k, v)
            old_k, old_v = self.expected[seq][layer]
            self.expected[seq][layer] = (torch.cat([old_k, k]), torch.cat([old_v, v]))

    @rule(n=st.integers(1, 9))
    def admit(self, n):
        seq = self.cache.new_sequence()
        self.expected[seq] = [(torch.empty(0, HEADS, DIM), torch.empty(0, HEADS, DIM))] * LAYERS
        self._append_all_layers(seq, n)

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), n=st.integers(1, 5))
    def append(self, data, n):
        self._append_all_layers(data.draw(st.sampled_from(sorted(self.expected))), n)

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.expected)))
        child = self.cache.fork(parent)
        self.expected[child] = list(self.expected[parent])

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        seq = data.draw(st.sampled_from(sorted(self.expected)))
        count = sum(self.cache.preemptions.values())
        tokens = self.cache.preempt(seq, mode)
        assert tokens == len(self.expected[seq][0][0])
        assert sum(self.cache.preemptions.values()) == count + 1
        if mode == "swap":
            self.swapped[seq] = self.expected.pop(seq)
        else:  # recompute: the caller stores the same tokens again (here: the same K and V)
            kept = self.expected[seq]
            self.expected[seq] = [(torch.empty(0, HEADS, DIM), torch.empty(0, HEADS, DIM))] * LAYERS
            if math.ceil(tokens / 4) <= self.cache.num_free:
                for layer, (k, v) in enumerate(kept):
                    self.cache.append(seq, layer, k, v)
                self.expected[seq] = kept

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        seq = data.draw(st.sampled_from(sorted(self.swapped)))
        blocks = math.ceil(len(self.swapped[seq][0][0]) / 4)
        if blocks > self.cache.num_free:
            with pytest.raises(OutOfBlocksError):
                self.cache.swap_in(seq)
            return
        self.cache.swap_in(seq)
        self.expected[seq] = self.swapped.pop(seq)

    @precondition(lambda self: self.expected or self.swapped)
    @rule(data=st.data())
    def finish(self, data):
        seq = data.draw(st.sampled_from(sorted([*self.expected, *self.swapped])))
        self.cache.free(seq)
        self.expected.pop(seq, None)
        self.swapped.pop(seq, None)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        # Copy-on-write never changes a block another sequence still reads: check the data itself.
        for seq, layers in self.expected.items():
            for layer, (k, v) in enumerate(layers):
                got_k, got_v = self.cache.gather(seq, layer)
                assert torch.equal(got_k, k) and torch.equal(got_v, v)

    @invariant()
    def reference_counts_equal_holders(self):
        holders = Counter(b for s in self.expected for b in self.cache.table(s).blocks)
        for seq in self.expected:
            blocks = self.cache.table(seq).blocks
            assert len(blocks) == len(set(blocks)) == math.ceil(self.cache.table(seq).num_tokens / 4)
        for block in range(12):
            assert self.cache.allocator.ref_count(block) == holders[block]  # no block owned twice unknowingly
        assert self.cache.num_free + len(holders) == 12  # free plus used equals total

    def teardown(self):
        for seq in [*self.expected, *self.swapped]:
            self.cache.free(seq)
        assert all(self.cache.allocator.ref_count(b) == 0 for b in range(12))
        assert self.cache.num_free == 12


TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_copy_on_write_with_the_store_kernel():
    """Through the Triton store_kv: a fork shares blocks; appending to either side copies the shared last block."""
    gen = torch.Generator().manual_seed(1)
    cache = PagedKVCache(LAYERS, 8, 4, HEADS, DIM, torch.float32, "cpu")
    parent = cache.new_sequence()
    prompt = [_tokens(gen, 6) for _ in range(LAYERS)]
    for layer, (k, v) in enumerate(prompt):
        cache.append(parent, layer, k, v)
    child = cache.fork(parent)
    shared = list(cache.table(parent).blocks)
    assert cache.table(child).blocks == shared and all(cache.allocator.ref_count(b) == 2 for b in shared)
    extra = [_tokens(gen, 3) for _ in range(LAYERS)]
    for layer, (k, v) in enumerate(extra):
        cache.append(child, layer, k, v)
    assert cache.table(child).blocks[0] == shared[0] and cache.table(child).blocks[1] != shared[1]
    assert cache.allocator.ref_count(shared[1]) == 1  # the parent keeps the original
    for layer in range(LAYERS):
        assert torch.equal(cache.gather(parent, layer)[0], prompt[layer][0])
        assert torch.equal(cache.gather(child, layer)[1], torch.cat([prompt[layer][1], extra[layer][1]]))
    tables = cache.block_tables([parent, child])
    assert tables.dtype == torch.int32 and tables.shape == (2, 3)
    assert cache.seq_lens([parent, child]).tolist() == [6, 9]


def test_layers_follow_layer_zero_and_errors_name_the_problem():
    cache = PagedKVCache(LAYERS, 2, 4, HEADS, DIM, torch.float32, "cpu", store=store_kv_ref)
    seq = cache.new_sequence()
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="append to layer 0 first"):
        cache.append(seq, 1, *_tokens(gen, 1))
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 2\)"):
        cache.append(seq, 2, *_tokens(gen, 1))
    with pytest.raises(ValueError, match=r"k must be \[tokens, 2, 4\]"):
        cache.append(seq, 0, torch.zeros(1, 3, DIM), torch.zeros(1, 3, DIM))
    cache.append(seq, 0, *_tokens(gen, 5))
    with pytest.raises(ValueError, match="mid-step"):
        cache.fork(seq)
    per_block = 2 * LAYERS * 4 * HEADS * DIM * 4
    with pytest.raises(OutOfBlocksError, match=f"need 1 KV-cache .* only 0 of 2 .*{per_block:,} bytes needed, 0 bytes"):
        cache.append(seq, 0, *_tokens(gen, 4))
    with pytest.raises(ValueError, match="not a live sequence"):
        cache.free(99)
    with pytest.raises(ValueError, match="mode must be one of"):
        cache.preempt(seq, "drop")


# =========================================================================== the admission simulator
# Small traces worked out by hand; see simulate's docstring for the step rules.

HAND_TRACE = [Request(0, 4, 4), Request(1, 10, 2), Request(2, 5, 1)]


def test_reserve_max_by_hand():
    # budget 64, max_len 32: A at [0, 32), B at [32, 64); C waits until B finishes after step 2.
    # step 1: lengths A 5, B 11 -> used 16; reserved (8-5)+(12-11) = 4; internal (32-8)+(32-12) = 44
    # step 2: A 6, B 12 -> used 18, reserved 2, internal 44; B done
    # step 3: C admitted at [32, 64): A 7, C 6 -> used 13, reserved 1, internal 24+26 = 50; C done
    # step 4: A 8 -> used 8, reserved 0, internal 24; A done
    r = simulate(HAND_TRACE, "reserve-max", budget_tokens=64, block_size=16, max_len=32)
    assert (r.steps, r.used, r.reserved, r.internal, r.final_block) == (4, 55, 7, 162, 0)
    assert r.allocated == 64 + 64 + 64 + 32
    assert r.completed_by_step == [0, 1, 2, 3] and r.admitted == 3 and r.peak_batch == 2
    assert r.peak_metadata_bytes == 2 * 8 and r.preemptions == 0
    assert r.waste_fraction == pytest.approx(1 - 55 / 224)


def test_paged_by_hand():
    # block 16, 4 blocks: every request takes one block and never crosses a boundary.
    # step 1: A 5, B 11, C 6 -> used 22, final-block waste 48 - 22 = 26; C done
    # step 2: A 6, B 12 -> used 18, waste 14; B done.  step 3: A 7 (waste 9).  step 4: A 8 (waste 8)
    r = simulate(HAND_TRACE, "paged", budget_tokens=64, block_size=16, max_len=32)
    assert (r.steps, r.used, r.final_block, r.reserved, r.internal) == (4, 22 + 18 + 7 + 8, 26 + 14 + 9 + 8, 0, 0)
    assert r.peak_metadata_bytes == 3 * 1 * 4 and r.completed_by_step == [1, 2, 2, 3]


def test_paged_preemption_by_hand():
    # block 2, 3 blocks; A and B are (prompt 2, output 3) and take one block each at admission.
    # step 1: A (len 2) takes the last free block -> 3; B needs one, none free: B, the newest, is
    #         preempted (2 tokens to recompute). used 3, final-block waste 4 - 3 = 1.
    # step 2: B readmitted into the freed block; A -> 4; B needs a block again: preempted (4). used 4, waste 0.
    # step 3: B readmitted; A (len 4) needs a block: B preempted (6) and A takes its block -> 5, done.
    # steps 4-6: B alone: 3 (waste 1), 4 (0), 5 (1).
    trace = [Request(0, 2, 3), Request(1, 2, 3)]
    r = simulate(trace, "paged", budget_tokens=6, block_size=2, max_len=5)
    assert (r.steps, r.preemptions, r.recomputed_tokens, r.admitted, r.completed) == (6, 3, 6, 5, 2)
    assert (r.used, r.final_block, r.swapped_blocks) == (3 + 4 + 5 + 3 + 4 + 5, 1 + 0 + 1 + 1 + 0 + 1, 0)
    # The same with swap: B's one block goes to the host and back three times; nothing is recomputed.
    s = simulate(trace, "paged", budget_tokens=6, block_size=2, max_len=5, preemption="swap")
    assert (s.steps, s.preemptions, s.swapped_blocks, s.recomputed_tokens, s.admitted) == (6, 3, 3, 0, 2)
    assert (s.used, s.final_block) == (r.used, r.final_block)


def test_reserve_estimate_overflow_by_hand():
    # estimate 2 (mean output of [1, 3]): A (2, 1) reserves 4, B (2, 3) reserves 4; budget 8.
    # step 1: A 3 done; B 3.  step 2: B 4 (= its region).  step 3: B would need 5 > 4: preempted
    # (4 tokens to recompute), readmitted at step 4 with max_len 6, and finishes at step 4.
    r = simulate([Request(0, 2, 1), Request(1, 2, 3)], "reserve-estimate", budget_tokens=8, block_size=2,
                 max_len=6)
    assert r.preemptions == 1 and r.recomputed_tokens == 4 and r.admitted == 3 and r.completed == 2
    assert r.steps == 4


@pytest.mark.parametrize("distribution", ["uniform", "lognormal", "bimodal"])
def test_trace_lengths_are_bounded_and_reproducible(distribution):
    trace = make_trace(500, distribution, mean_prompt=40, mean_output=80, max_len=300, seed=3)
    assert trace == make_trace(500, distribution, mean_prompt=40, mean_output=80, max_len=300, seed=3)
    assert all(r.prompt >= 1 and r.output >= 1 and r.final <= 300 for r in trace)
    mean_output = sum(r.output for r in trace) / len(trace)
    assert 0.7 * 80 < mean_output < 1.3 * 80  # clipping moves the mean a little


@given(seed=st.integers(0, 1000), policy=st.sampled_from(["reserve-max", "reserve-estimate", "paged"]),
       block=st.sampled_from([1, 4, 16]), mode=st.sampled_from(["recompute", "swap"]))
@settings(max_examples=30, deadline=None)
def test_simulator_conserves_work(seed, policy, block, mode):
    trace = make_trace(30, "lognormal", mean_prompt=20, mean_output=30, max_len=128, seed=seed)
    r = simulate(trace, policy, budget_tokens=512, block_size=block, max_len=128, max_batch=8, preemption=mode)
    assert r.completed == len(trace) and r.completed_by_step[-1] == len(trace)
    assert max(r.batch_by_step) <= 8
    # Every token of every request is held for exactly one step per step it exists (no preemption),
    # so used token-steps are at least sum over requests of (prompt + 1 + ... + prompt + output).
    assert r.used >= sum(q.output * q.prompt + q.output * (q.output + 1) // 2 for q in trace)
    if policy == "paged" and mode == "recompute":
        assert r.swapped_blocks == 0
    if policy != "paged":
        assert r.final_block == 0


def test_simulator_and_trace_reject_bad_input():
    with pytest.raises(ValueError, match="policy must be one of"):
        simulate(HAND_TRACE, "buddy", 64)
    with pytest.raises(ValueError, match="cannot hold one request"):
        simulate(HAND_TRACE, "reserve-max", 16, max_len=32)
    with pytest.raises(ValueError, match="max_len .* must be >= the longest"):
        simulate(HAND_TRACE, "paged", 64, max_len=8)
    with pytest.raises(ValueError, match="distribution must be one of"):
        make_trace(4, "zipf")
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        make_trace(-1)


def test_tokens_in_budget_uses_the_model_shape():
    shape = SHAPES["llama-3-8b"]  # 2 * 32 layers * 8 KV heads * 128 dims * 2 bytes = 131,072 bytes per token
    assert shape.kv_bytes_per_token(2) == 131072
    assert tokens_in_budget(16 * 2**30, shape) == 131072
