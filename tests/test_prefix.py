"""PrefixCache (section 6, prefix caching): scenarios written from the semantics, and random
admit / append / free sequences checked against a shadow model that knows only token lists."""

import doctest

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvlab.cache.prefix
from kvlab.cache.paged import OutOfBlocksError
from kvlab.cache.prefix import PrefixCache, block_hashes


def snapshot(cache: PrefixCache):
    """Everything a failed call must leave alone."""
    return (cache.free_order(), [cache.ref_count(b) for b in range(cache.num_blocks)], cache.cached_blocks(),
            {s: cache.block_table(s) for s in cache.sequences()},
            {s: cache.num_tokens(s) for s in cache.sequences()}, repr(cache.stats), cache.num_free, cache.num_cached)


def test_doctests():
    assert doctest.testmod(kvlab.cache.prefix).failed == 0


# --------------------------------------------------------------------------- scenarios


def test_shared_prefix_across_two_prompts():
    cache = PrefixCache(16, 4)
    a, cached_a = cache.admit(list(range(10)))  # blocks [0-3] [4-7] [8, 9]
    b, cached_b = cache.admit(list(range(8)) + [50, 51, 52])
    assert (cached_a, cached_b) == (0, 8)
    ta, tb = cache.block_table(a), cache.block_table(b)
    assert ta[:2] == tb[:2] and ta[2] != tb[2]
    assert [cache.ref_count(x) for x in ta] == [2, 2, 1]
    assert cache.num_free == 16 - 4 and cache.num_cached == 2  # partial last blocks are not hashed
    assert cache.hit_blocks == 2 and cache.hit_tokens == 8 and cache.hit_rate == pytest.approx(8 / 21)


def test_divergence_inside_a_block_shares_only_the_blocks_before_it():
    cache = PrefixCache(16, 4)
    cache.admit(list(range(12)) + [99])
    _, cached = cache.admit(list(range(6)) + [77] + list(range(7, 12)) + [99])  # token 6 differs: block 1
    assert cached == 4


@pytest.mark.parametrize("k", range(5))
def test_one_changed_token_in_block_k_reuses_exactly_k_blocks(k):
    block_size = 3
    prompt = list(range(100, 100 + 5 * block_size + 1))
    cache = PrefixCache(32, block_size)
    cache.admit(prompt)
    changed = list(prompt)
    changed[k * block_size + 1] += 1000
    assert cache.lookup(changed) == k * block_size
    _, cached = cache.admit(changed)
    assert cached == k * block_size


def test_a_later_match_after_a_difference_is_not_reused():
    """Chained hashes: block 2 matching does not help once block 1 differs (position matters)."""
    cache = PrefixCache(16, 2)
    cache.admit([1, 2, 3, 4, 5, 6, 7])
    _, cached = cache.admit([1, 2, 9, 9, 5, 6, 7])
    assert cached == 2
    _, cached = cache.admit([5, 6, 1, 2, 3])  # the same blocks at other positions
    assert cached == 0


def test_exact_multiple_prompt_repeated_reuses_one_block_less():
    cache = PrefixCache(16, 4)
    prompt = list(range(8))
    a, cached = cache.admit(prompt)
    assert cached == 0 and cache.num_cached == 2  # both blocks full: both hashed
    b, cached = cache.admit(prompt)
    assert cached == 4  # at least one token is computed, so the second block is not reused
    ta, tb = cache.block_table(a), cache.block_table(b)
    assert ta[0] == tb[0] and ta[1] != tb[1]
    assert cache.block_hash(tb[1]) is None and cache.num_cached == 2  # a duplicate, not registered twice
    cache.free(a)
    cache.free(b)
    _, cached = cache.admit(prompt + [8])
    assert cached == 8


def test_single_block_prompts():
    cache = PrefixCache(4, 4)
    _, cached = cache.admit([1, 2, 3, 4])
    assert cached == 0
    _, cached = cache.admit([1, 2, 3, 4])
    assert cached == 0  # one block: it holds the token that must be computed
    _, cached = cache.admit([1])
    assert cached == 0


def test_block_size_one():
    cache = PrefixCache(16, 1)
    cache.admit([5, 6, 7])
    _, cached = cache.admit([5, 6, 7])
    assert cached == 2
    _, cached = cache.admit([5, 6, 8, 9])
    assert cached == 2


def test_salt_isolates_tenants():
    cache = PrefixCache(32, 4)
    prompt = list(range(9))
    cache.admit(prompt, salt="tenant-a")
    assert cache.admit(prompt, salt="tenant-b")[1] == 0
    assert cache.admit(prompt)[1] == 0  # no salt is a tenant of its own
    assert cache.admit(prompt, salt="tenant-a")[1] == 8
    assert cache.admit(prompt, salt=7)[1] == 0 and cache.admit(prompt, salt="7")[1] == 0
    hashes = {s: block_hashes(prompt, 4, salt=s) for s in (None, "tenant-a", "tenant-b")}
    assert len({h[0] for h in hashes.values()}) == 3 and len({h[1] for h in hashes.values()}) == 3


def test_block_hashes_chain_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_hashes([1, 2, 3, 9, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3  # a partial last block has no hash
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]  # block 2's tokens match, its prefix does not
    assert block_hashes([1, 2, 3, 4, 5, 6, 7], 2) == a  # deterministic
    assert block_hashes([3], 4) == []


def test_decode_fills_and_hashes_a_block():
    cache = PrefixCache(8, 4)
    seq, _ = cache.admit([1, 2, 3])
    assert cache.num_cached == 0
    assert cache.blocks_to_append(seq) == 0
    cache.append(seq, 4)  # fills block 0
    assert cache.num_cached == 1 and cache.block_hash(cache.block_table(seq)[0]) == block_hashes([1, 2, 3, 4], 4)[0]
    assert cache.blocks_to_append(seq) == 1
    cache.append(seq, 5)
    assert len(cache.block_table(seq)) == 2 and cache.num_tokens(seq) == 5
    for t in (6, 7, 8):
        cache.append(seq, t)
    assert cache.num_cached == 2
    other, cached = cache.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert cached == 8 and cache.block_table(other)[:2] == cache.block_table(seq)


def test_decode_hashes_the_first_block_with_the_salt():
    cache = PrefixCache(8, 2)
    seq, _ = cache.admit([1], salt="t")
    cache.append(seq, 2)
    assert cache.lookup([1, 2, 3], salt="t") == 2 and cache.lookup([1, 2, 3]) == 0


def test_freed_blocks_stay_cached_and_a_hit_takes_them_off_the_free_list():
    cache = PrefixCache(6, 2)
    a, _ = cache.admit([1, 2, 3, 4, 5])
    blocks = cache.block_table(a)
    cache.free(a)
    assert cache.num_free == 6 and cache.num_cached == 2
    assert all(cache.ref_count(b) == 0 for b in blocks)
    b, cached = cache.admit([1, 2, 3, 4, 9])
    assert cached == 4 and cache.block_table(b)[:2] == blocks[:2]
    assert not set(blocks[:2]) & set(cache.free_order())
    assert cache.num_free == 3 and cache.evictions == 0


def test_lru_evicts_least_recently_freed_and_chain_tail_first():
    cache = PrefixCache(8, 2)
    x, _ = cache.admit([1, 2, 3, 4, 5, 6, 7])  # 3 full blocks + a partial one
    y, _ = cache.admit([10, 11, 12, 13, 14])  # 2 full blocks + a partial one
    tx, ty = cache.block_table(x), cache.block_table(y)
    cache.free(x)  # x freed first: least recently freed
    cache.free(y)
    # Unhashed partial blocks come first (taking them evicts nothing), then x tail first, then y tail first.
    assert cache.free_order() == [ty[2], tx[3], 7, tx[2], tx[1], tx[0], ty[1], ty[0]]
    z, _ = cache.admit(list(range(100, 108)))  # 4 new blocks: the two partials, block 7, then x's tail
    assert cache.evictions == 1
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7]) == 4  # x keeps its head
    assert cache.lookup([10, 11, 12, 13, 14]) == 4  # y untouched
    w, _ = cache.admit(list(range(200, 202)))
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7]) == 2 and cache.evictions == 2
    assert cache.block_table(w) == [tx[1]]
    del z


def test_refreeing_makes_a_block_recent_again():
    cache = PrefixCache(4, 2)
    a, _ = cache.admit([1, 2, 3])
    b, _ = cache.admit([5, 6, 7])
    cache.free(a)
    cache.free(b)
    a2, cached = cache.admit([1, 2, 3])  # a's first block back in use, then freed again: now the newest
    assert cached == 2
    cache.free(a2)
    cache.admit([9, 9, 9, 9, 9])  # three blocks: the two unhashed partials, then b's block (freed before a's)
    assert cache.evictions == 1
    assert cache.lookup([1, 2, 3]) == 2 and cache.lookup([5, 6, 7]) == 0


def test_shared_block_is_freed_only_by_its_last_holder():
    cache = PrefixCache(8, 2)
    a, _ = cache.admit([1, 2, 3])
    b, _ = cache.admit([1, 2, 4])
    c, _ = cache.admit([1, 2, 5])
    shared = cache.block_table(a)[0]
    assert cache.ref_count(shared) == 3
    cache.free(a)
    cache.free(b)
    assert cache.ref_count(shared) == 1 and shared not in cache.free_order()
    cache.free(c)
    assert cache.ref_count(shared) == 0 and shared in cache.free_order()


def test_failed_admission_changes_nothing():
    cache = PrefixCache(4, 2)
    a, _ = cache.admit([1, 2, 3, 4, 5])  # 3 blocks
    cache.free(a)  # all 4 free, 2 of them cached
    keep, _ = cache.admit([7])
    before = snapshot(cache)
    # Would hit the two cached blocks (taking them off the free list) and need 2 new: 4 > 3 free.
    with pytest.raises(OutOfBlocksError, match="need 4 KV-cache block.* only 3 of 4 are free") as info:
        cache.admit([1, 2, 3, 4, 5, 6, 7, 8])
    assert (info.value.needed, info.value.free, info.value.total) == (4, 3, 4)
    assert snapshot(cache) == before
    with pytest.raises(OutOfBlocksError):
        cache.admit(list(range(50, 60)))
    assert snapshot(cache) == before
    assert cache.admit([1, 2, 3, 4, 5, 6])[1] == 4  # and the cache still works


def test_failed_append_changes_nothing():
    cache = PrefixCache(2, 2)
    a, _ = cache.admit([1, 2, 3, 4])
    before = snapshot(cache)
    with pytest.raises(OutOfBlocksError, match="need 1 .* only 0 of 2") as info:
        cache.append(a, 5)
    assert (info.value.needed, info.value.free, info.value.total) == (1, 0, 2)
    assert snapshot(cache) == before


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        PrefixCache(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(4, 0)
    with pytest.raises(TypeError, match="block_size"):
        PrefixCache(4, 2.0)
    with pytest.raises(TypeError, match="num_blocks"):
        PrefixCache(True, 2)
    cache = PrefixCache(4, 2)
    a, _ = cache.admit([1, 2, 3])
    before = snapshot(cache)
    with pytest.raises(ValueError, match="at least one token"):
        cache.admit([])
    with pytest.raises(TypeError, match="tokenize"):
        cache.admit("hello")
    with pytest.raises(ValueError, match=r"token_ids\[1\].*-1"):
        cache.admit([1, -1])
    with pytest.raises(ValueError, match=r"token_ids\[0\]"):
        cache.admit([1.5])
    with pytest.raises(ValueError, match=r"token_ids\[1\].*2\*\*63"):
        cache.admit([1, 2**63])
    with pytest.raises(TypeError, match="salt"):
        cache.admit([1], salt=[1])
    with pytest.raises(ValueError, match="seq_id 99 is not an admitted sequence"):
        cache.append(99, 1)
    with pytest.raises(ValueError, match="seq_id 99"):
        cache.free(99)
    with pytest.raises(ValueError, match="seq_id 99"):
        cache.block_table(99)
    with pytest.raises(ValueError, match="token_id"):
        cache.append(a, -3)
    with pytest.raises(ValueError, match="block"):
        cache.ref_count(4)
    assert snapshot(cache) == before
    cache.free(a)
    with pytest.raises(ValueError, match=f"seq_id {a}"):
        cache.free(a)


def test_tensor_and_numpy_prompts():
    import numpy as np
    import torch

    cache = PrefixCache(8, 2)
    cache.admit(torch.tensor([1, 2, 3]))
    assert cache.admit(np.array([1, 2, 4]))[1] == 2


# --------------------------------------------------------------------------- random sequences


def identity(salt, tokens, k, block_size):
    """What block ``k`` of a sequence holds, by definition: the salt and every token up to its end."""
    return (salt, tuple(tokens[: (k + 1) * block_size]))


class PrefixMachine(RuleBasedStateMachine):
    """Random admit / append / free on a small pool, with a small alphabet so that prefixes collide.

    The shadow model knows each live sequence's tokens and salt, and what each block last held.
    """

    block_size = 2

    def __init__(self):
        super().__init__()
        self.cache = PrefixCache(10, self.block_size)
        self.live = {}  # seq_id -> (salt, tokens)
        self.content = {}  # block -> identity of the full block it holds (as last seen)

    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=9)
    salts = st.sampled_from([None, "t"])

    @rule(tokens=tokens, salt=salts)
    def admit(self, tokens, salt):
        bs = self.cache.block_size
        registered = set(self.cache.cached_blocks().values())
        cached_identities = {self.content[b] for b in registered}
        expected = 0  # the oracle: leading full blocks whose identity some registered block holds
        while expected < (len(tokens) - 1) // bs and identity(salt, tokens, expected, bs) in cached_identities:
            expected += 1
        before = snapshot(self.cache)
        needed = self.cache.blocks_to_admit(tokens, salt)
        try:
            seq, cached = self.cache.admit(tokens, salt)
        except OutOfBlocksError as error:
            assert needed > self.cache.num_free
            assert (error.needed, error.free, error.total) == (needed, self.cache.num_free, 10)
            assert snapshot(self.cache) == before
            return
        assert cached == expected * bs
        table = self.cache.block_table(seq)
        for k in range(expected):  # the hit blocks hold exactly this prefix
            assert self.content[table[k]] == identity(salt, tokens, k, bs)
        assert len(table) == -(-len(tokens) // bs)
        self.live[seq] = (salt, list(tokens))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        seq = data.draw(st.sampled_from(sorted(self.live)))
        before = snapshot(self.cache)
        try:
            self.cache.append(seq, token)
        except OutOfBlocksError:
            assert self.cache.num_free == 0 and snapshot(self.cache) == before
            return
        self.live[seq][1].append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.live)))
        self.cache.free(seq)
        del self.live[seq]

    @invariant()
    def blocks_agree_with_the_shadow(self):
        cache, bs = self.cache, self.cache.block_size
        holders = {}  # block -> number of live sequences holding it
        owners = {}  # block -> identities of the full blocks it stands for
        for seq, (salt, tokens) in self.live.items():
            table = cache.block_table(seq)
            assert len(table) == -(-len(tokens) // bs) and cache.num_tokens(seq) == len(tokens)
            for k, block in enumerate(table):
                holders[block] = holders.get(block, 0) + 1
                full = (k + 1) * bs <= len(tokens)
                owners.setdefault(block, set()).add(identity(salt, tokens, k, bs) if full else ("partial", seq))
        for block, ids in owners.items():
            assert len(ids) == 1, f"block {block} stands for {ids}"  # never two chains, never a shared partial
            (self.content[block],) = ids
        for block in range(cache.num_blocks):
            assert cache.ref_count(block) == holders.get(block, 0)
        assert cache.num_free + len(holders) == cache.num_blocks
        assert set(cache.free_order()) == set(range(cache.num_blocks)) - set(holders)
        for h, block in cache.cached_blocks().items():  # every cached hash maps to the block holding it
            assert cache.block_hash(block) == h
            salt, tokens = self.content[block]
            assert block_hashes(list(tokens), bs, salt)[-1] == h
        assert cache.num_cached == len(set(cache.cached_blocks().values()))

    def teardown(self):
        for seq in list(self.live):
            self.cache.free(seq)
        assert all(self.cache.ref_count(b) == 0 for b in range(self.cache.num_blocks))
        assert self.cache.num_free == self.cache.num_blocks


class PrefixMachineBlockOne(PrefixMachine):
    block_size = 1


class PrefixMachineBlockThree(PrefixMachine):
    block_size = 3


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestPrefixMachine = PrefixMachine.TestCase
TestPrefixMachine.settings = _settings
TestPrefixMachineBlockOne = PrefixMachineBlockOne.TestCase
TestPrefixMachineBlockOne.settings = _settings
TestPrefixMachineBlockThree = PrefixMachineBlockThree.TestCase
TestPrefixMachineBlockThree.settings = _settings


# --------------------------------------------------------------------------- the chat trace and its replay

from kvlab.cache.prefix import REPLAY_POLICIES, make_chat_trace, replay  # noqa: E402


def test_chat_trace_resends_history():
    trace = make_chat_trace(num_system_prompts=2, num_users=5, turns=3, system_tokens=20, user_tokens=4,
                            reply_tokens=3, seed=1)
    assert len(trace) == 15
    last = {}
    for r in trace:
        if r.user in last:
            prev = last[r.user]
            assert r.turn == prev.turn + 1 and r.prompt[: len(prev.prompt) + 3] == prev.prompt + prev.reply
            assert len(r.prompt) == len(prev.prompt) + 3 + 4
        else:
            assert r.turn == 0 and len(r.prompt) == 24
        last[r.user] = r
    systems = {r.system: r.prompt[:20] for r in trace}
    assert all(r.prompt[:20] == systems[r.system] for r in trace)
    assert make_chat_trace(seed=3) == make_chat_trace(seed=3)


def unbounded_oracle(trace, block_size):
    """Cached tokens per request with a cache that never forgets: the longest whole-block prefix
    (leaving one token) that some earlier request's stream covered with full blocks."""
    seen, out = set(), []
    for r in trace:
        k = (len(r.prompt) - 1) // block_size
        while k and tuple(r.prompt[: k * block_size]) not in seen:
            k -= 1
        out.append(k * block_size)
        stream = r.prompt + r.reply[:-1]
        seen.update(tuple(stream[: j * block_size]) for j in range(1, len(stream) // block_size + 1))
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_replay_with_room_for_everything_matches_the_oracle(block_size):
    trace = make_chat_trace(num_system_prompts=2, num_users=6, turns=3, system_tokens=30, user_tokens=5,
                            reply_tokens=6, vocab=50, seed=2)
    total = sum(-(-(len(r.prompt) + len(r.reply)) // block_size) for r in trace)
    expected = unbounded_oracle(trace, block_size)
    for policy in ("lru", "reserve"):
        result = replay(trace, total + 100, block_size, policy)
        assert result.cached_tokens == expected and result.evictions == 0
    assert replay(trace, total, block_size, "none").cached_tokens == [0] * len(trace)


def test_replay_small_cache():
    trace = make_chat_trace(num_users=10, seed=4)
    longest = max(-(-(len(r.prompt) + len(r.reply) - 1) // 16) for r in trace)
    lru, reserve = (replay(trace, longest + 4, 16, p) for p in ("lru", "reserve"))
    assert lru.evictions > 0 and reserve.evictions == 0
    assert reserve.peak_cached <= 4
    assert 0 < reserve.hit_rate and 0 < lru.hit_rate < 1
    assert lru.mean_ttft(lambda p, c: p - c) == pytest.approx(
        sum(p - c for p, c in zip(lru.prompt_tokens, lru.cached_tokens)) / len(trace))
    with pytest.raises(ValueError, match=f"num_blocks must be >= {longest}"):
        replay(trace, longest - 1, 16)
    with pytest.raises(ValueError, match="policy must be one of"):
        replay(trace, 100, 16, "fifo")
    assert REPLAY_POLICIES == ("lru", "reserve", "none")
    with pytest.raises(ValueError, match="think_time"):
        make_chat_trace(think_time=-1)
