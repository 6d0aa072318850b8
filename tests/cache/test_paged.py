"""The paged KV cache (notebooks 05, 06, 11): pools over one block manager, prefix caching on and
off.

The K and V written here are a deterministic function of what a model would see (the salt, every
token up to a position, the layer), so that the state machine can check, after every call, that each
sequence reads back its own K and V and that every registered block holds exactly what a fresh
computation of its tokens gives, through admit with prefix hits, chunked writes, fork
(copy-on-write), preemption by recompute and by swap, resume, free and failing calls of every
kind."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvlab.cache.blocks import OutOfBlocksError, block_hashes
from kvlab.cache.paged import PagedKVCache, tokens_in_budget
from kvlab.kernels import store_kv_ref
from kvlab.theory.shapes import SHAPES

LAYERS, HEADS, DIM, BLOCK = 2, 2, 4, 2


def kv_of(salt, tokens, position: int, layer: int) -> torch.Tensor:
    """What a model would store for ``tokens[position]``: a function of the salt, every token up to
    it and the layer, exact in fp32. ``[HEADS, DIM]``; V is its negation."""
    h = hash((salt, tuple(tokens[: position + 1]), layer)) % 10_007
    return torch.tensor([[h, layer, position, 1.0], [-h, 1.0, 2.0, float(layer)]])


def rows(salt, tokens, start, end, layer):
    return (
        torch.stack([kv_of(salt, tokens, p, layer) for p in range(start, end)])
        if end > start
        else torch.empty(0, HEADS, DIM)
    )


class FlakyStore:
    """A ``store`` that, when armed, writes half of its tokens (at least one) and then raises."""

    def __init__(self):
        self.armed = False

    def __call__(self, k, v, k_cache, v_cache, slot_mapping):
        if self.armed:
            self.armed = False
            half = (k.shape[0] + 1) // 2  # at least one token written before the failure
            store_kv_ref(k[:half], v[:half], k_cache, v_cache, slot_mapping[:half])
            raise RuntimeError("injected store failure")
        store_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def snapshot(cache: PagedKVCache) -> tuple:
    """Everything a caller can observe: the manager's bookkeeping, each layer's count, resident K
    and V."""
    m = cache.manager
    seqs = {}
    for s in m.sequences():
        resident = m.state(s) == "resident"
        counts = (
            [int(cache.seq_lens([s], layer)[0]) for layer in range(cache.num_layers)]
            if resident
            else None
        )
        data = [cache.gather(s, layer) for layer in range(cache.num_layers)] if resident else None
        seqs[s] = (m.block_table(s), m.num_tokens(s), m.num_computed(s), m.state(s), counts, data)
    return (
        m.free_order(),
        [m.ref_count(b) for b in range(m.num_blocks)],
        m.cached_blocks(),
        replace(m.stats),
        seqs,
    )


def same(a, b, evicts: bool = False) -> bool:
    """``b`` equals ``a``; with ``evicts``, except for the manager's rollback rule: a call that took
    a free block may leave its registered hash evicted (counted in the stats), and the block, free
    again without a hash, at the front of the free list (where taking it evicts nothing)."""
    if evicts and set(b[2].items()) <= set(a[2].items()):
        order = list(a[0])
        for block in [block for h, block in a[2].items() if h not in b[2] and block in order]:
            order.remove(block)
            order.insert(0, block)
        stats = replace(a[3], evictions=a[3].evictions + len(a[2]) - len(b[2]))
        a = (order, a[1], b[2], stats, a[4])
    if a[:4] != b[:4] or a[4].keys() != b[4].keys():
        return False
    for s, old in a[4].items():
        new = b[4][s]
        if old[:5] != new[:5]:
            return False
        if old[5] is not None and not all(
            torch.equal(x, y) for p, q in zip(old[5], new[5]) for x, y in zip(p, q)
        ):
            return False
    return True


def fails_cleanly(cache, call, error, match=None, evicts=False):
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        call()
    assert same(before, snapshot(cache), evicts)
    cache.check()


# --------------------------------------------------------------------------- the state machine


class PagedMachine(RuleBasedStateMachine):
    """See the module docstring. ``self.salt`` and ``self.tokens`` (each sequence's tokens, which
    the caller keeps: the cache keeps none) are the shadow model."""

    prefix_caching = True

    def __init__(self):
        super().__init__()
        self.store = FlakyStore()
        self.cache = PagedKVCache(
            LAYERS,
            6,
            BLOCK,
            HEADS,
            DIM,
            torch.float32,
            "cpu",
            store=self.store,
            prefix_caching=self.prefix_caching,
        )
        self.salt, self.tokens = {}, {}
        self.content = {}  # block -> (salt, tokens) of the written full block it holds

    def _pick(self, data, states=("resident",)):
        seqs = [s for s in self.cache.sequences() if self.cache.state(s) in states]
        return data.draw(st.sampled_from(seqs)) if seqs else None

    def _write(self, seq, count, fail_layer=None):
        """The next ``count`` reserved-or-new tokens' K and V, layer by layer (layer 0 reserves)."""
        c, salt = self.cache, self.salt[seq]
        start, tokens = c.num_computed(seq), self.tokens[seq]
        ids = tokens[: start + count]
        for layer in range(LAYERS):
            k = rows(salt, tokens, start, start + count, layer)
            if layer == fail_layer:
                self.store.armed = True
                fails_cleanly(c, lambda: c.append(seq, layer, k, -k, ids), RuntimeError, "injected")
            c.append(seq, layer, k, -k, ids)

    @rule(
        tokens=st.lists(st.integers(0, 2), min_size=1, max_size=8),
        salt=st.sampled_from([None, "t"]),
        chunk=st.integers(0, 8),
    )
    def admit(self, tokens, salt, chunk):
        c = self.cache
        if c.blocks_to_admit(tokens, salt) > c.num_free:
            fails_cleanly(c, lambda: c.admit(tokens, salt), OutOfBlocksError, "bytes needed")
            return
        seq, cached = c.admit(tokens, salt)
        assert c.num_computed(seq) == cached < len(tokens)
        self.salt[seq], self.tokens[seq] = salt, tokens
        self._write(
            seq, min(chunk, len(tokens) - cached)
        )  # the first chunk of its prefill, maybe empty

    @rule(
        tokens=st.lists(st.integers(0, 2), min_size=2, max_size=10),
        salt=st.sampled_from([None, "t"]),
    )
    def failed_prefill(self, tokens, salt):
        """A model call that admits a prompt, writes layer 0, then fails: restored, except that what
        the admission evicted stays evicted (it may now hold this prompt's K and V)."""
        c = self.cache
        if c.blocks_to_admit(tokens, salt) > c.num_free:
            return
        before = snapshot(c)
        with pytest.raises(RuntimeError, match="the model failed"):
            with c.all_or_nothing():
                seq, cached = c.admit(tokens, salt)
                self.salt[seq] = salt
                c.append(
                    seq,
                    0,
                    rows(salt, tokens, cached, len(tokens), 0),
                    torch.zeros(len(tokens) - cached, HEADS, DIM),
                    tokens,
                )
                raise RuntimeError("the model failed")
        del self.salt[seq]
        after = snapshot(c)
        assert after[1] == before[1] and sorted(after[0]) == sorted(before[0])
        assert (
            set(after[2].items()) <= set(before[2].items()) and after[4].keys() == before[4].keys()
        )

    @rule(data=st.data(), chunk=st.integers(1, 4), fail=st.sampled_from([None, 0, 1]))
    def prefill_chunk(self, data, chunk, fail):
        seq = self._pick(data)
        if seq is not None and self.cache.num_computed(seq) < self.cache.num_tokens(seq):
            self._write(
                seq, min(chunk, self.cache.num_tokens(seq) - self.cache.num_computed(seq)), fail
            )

    @rule(data=st.data(), token=st.integers(0, 2), fail=st.sampled_from([None, 0, 1]))
    def decode(self, data, token, fail):
        c = self.cache
        seq = self._pick(data)
        if seq is None or c.num_computed(seq) != c.num_tokens(seq):
            return
        tokens = self.tokens[seq] + [token]
        k = rows(self.salt[seq], tokens, c.num_tokens(seq), c.num_tokens(seq) + 1, 0)
        if c.blocks_to_append(seq) > c.num_free:
            fails_cleanly(c, lambda: c.append(seq, 0, k, -k, token_ids=tokens), OutOfBlocksError)
            return
        if fail == 0:  # the store fails after layer 0 reserved (maybe copying a shared block first)
            self.store.armed = True
            fails_cleanly(
                c,
                lambda: c.append(seq, 0, k, -k, token_ids=tokens),
                RuntimeError,
                "injected",
                evicts=True,
            )
        c.append(seq, 0, k, -k, token_ids=tokens)
        self.tokens[seq] = tokens
        k1 = rows(self.salt[seq], tokens, len(tokens) - 1, len(tokens), 1)
        if fail == 1:
            self.store.armed = True
            fails_cleanly(c, lambda: c.append(seq, 1, k1, -k1, tokens), RuntimeError, "injected")
            fails_cleanly(c, lambda: c.fork(seq), ValueError, "mid-step")
            fails_cleanly(c, lambda: c.preempt(seq, "swap"), ValueError, "mid-step")
        c.append(seq, 1, k1, -k1, tokens)

    @rule(data=st.data())
    def fork(self, data):
        seq = self._pick(data)
        if seq is None:
            return
        if self.cache.num_computed(seq) != self.cache.num_tokens(seq):
            fails_cleanly(self.cache, lambda: self.cache.fork(seq), ValueError, "not written yet")
            return
        child = self.cache.fork(seq)
        self.salt[child], self.tokens[child] = self.salt[seq], self.tokens[seq]

    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        seq = self._pick(data)
        if seq is not None:
            computed = self.cache.num_computed(seq)
            assert self.cache.preempt(seq, mode) == computed

    @rule(data=st.data(), fail=st.booleans())
    def resume(self, data, fail):
        c = self.cache
        seq = self._pick(data, ("recompute", "swap"))
        if seq is None:
            return
        tokens = self.tokens[seq]
        if c.blocks_to_resume(seq, tokens) > c.num_free:
            fails_cleanly(c, lambda: c.resume(seq, tokens), OutOfBlocksError)
            return
        if fail and c.is_swapped(seq):  # the copy back fails after writing part of it
            real = c._copy_from_host

            def broken(seq_id, first, end):
                real(seq_id, first, (first + end) // 2)
                raise RuntimeError("injected copy failure")

            c._copy_from_host = broken
            try:
                fails_cleanly(
                    c, lambda: c.resume(seq, tokens), RuntimeError, "injected", evicts=True
                )
            finally:
                del c._copy_from_host
        c.resume(seq, tokens)

    @rule(data=st.data())
    def free(self, data):
        seq = self._pick(data, ("resident", "recompute", "swap"))
        if seq is not None:
            self.cache.free(seq)
            del self.salt[seq], self.tokens[seq]

    @rule(
        data=st.data(),
        kind=st.sampled_from(
            [
                "meta",
                "shape",
                "int dtype",
                "layer -1",
                "layer bool",
                "unknown seq",
                "layer 1 ahead",
                "not a tensor",
                "token ids",
                "preempted",
            ]
        ),
    )
    def bad_append(self, data, kind):
        c = self.cache
        seq = (
            self._pick(data, ("resident",))
            if kind != "preempted"
            else self._pick(data, ("recompute", "swap"))
        )
        if seq is None:
            return
        k, layer, error, ids = torch.zeros(1, HEADS, DIM), 0, ValueError, None
        if kind == "meta":
            k = k.to("meta")
        elif kind == "shape":
            k = k[:, :1]
        elif kind == "int dtype":
            k, error = k.long(), TypeError
        elif kind == "layer -1":
            layer = -1
        elif kind == "layer bool":
            layer, error = True, TypeError
        elif kind == "unknown seq":
            seq = 10**6
        elif kind == "layer 1 ahead":
            layer = 1
            k = torch.zeros(c.num_tokens(seq) + 1, HEADS, DIM)
        elif kind == "not a tensor":
            k, error = k.tolist(), TypeError
        elif kind == "token ids":  # not one id per token through the row
            ids = [0] * (c.num_tokens(seq) + 5)
        fails_cleanly(c, lambda: c.append(seq, layer, k, k, token_ids=ids), error)

    @invariant()
    def every_block_holds_what_its_tokens_give(self):
        c = self.cache
        c.check()
        for seq in c.sequences():
            if c.state(seq) != "resident":
                continue
            salt, tokens, table = self.salt[seq], self.tokens[seq], c.block_table(seq)
            for layer in range(LAYERS):
                k, v = c.gather(seq, layer)
                expected = rows(salt, tokens, 0, k.shape[0], layer)
                assert torch.equal(k, expected) and torch.equal(v, -expected)
            for b in range(c.num_computed(seq) // BLOCK):
                self.content[table[b]] = (salt, tuple(tokens[: (b + 1) * BLOCK]))
        for (
            h,
            block,
        ) in c.manager.cached_blocks().items():  # registered: equal to a fresh computation
            salt, tokens = self.content[block]
            assert block_hashes(list(tokens), BLOCK, salt)[-1] == h
            start = len(tokens) - BLOCK
            for layer in range(LAYERS):
                assert torch.equal(
                    c.k_pools[layer][block], rows(salt, tokens, start, len(tokens), layer)
                )


class PagedMachineNoPrefixCaching(PagedMachine):
    prefix_caching = False


_settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPagedMachine = PagedMachine.TestCase
TestPagedMachine.settings = _settings
TestPagedMachineNoPrefixCaching = PagedMachineNoPrefixCaching.TestCase
TestPagedMachineNoPrefixCaching.settings = _settings


# --------------------------------------------------------------------------- scenarios


def _tokens(gen, n):
    return torch.randn(n, HEADS, DIM, generator=gen), torch.randn(n, HEADS, DIM, generator=gen)


def test_copy_on_write_with_the_store_kernel():
    """Through the Triton store_kv: a fork shares blocks; appending to either side copies the shared
    last block."""
    gen = torch.Generator().manual_seed(1)
    cache = PagedKVCache(LAYERS, 8, 4, HEADS, DIM, torch.float32, "cpu")
    parent = cache.new_sequence()
    prompt = [_tokens(gen, 6) for _ in range(LAYERS)]
    for layer, (k, v) in enumerate(prompt):
        cache.append(parent, layer, k, v)
    child = cache.fork(parent)
    shared = cache.block_table(parent)
    assert cache.block_table(child) == shared and all(
        cache.manager.ref_count(b) == 2 for b in shared
    )
    extra = [_tokens(gen, 3) for _ in range(LAYERS)]
    for layer, (k, v) in enumerate(extra):
        cache.append(child, layer, k, v)
    assert cache.block_table(child)[0] == shared[0] and cache.block_table(child)[1] != shared[1]
    assert cache.manager.ref_count(shared[1]) == 1  # the parent keeps the original
    for layer in range(LAYERS):
        assert torch.equal(cache.gather(parent, layer)[0], prompt[layer][0])
        assert torch.equal(
            cache.gather(child, layer)[1], torch.cat([prompt[layer][1], extra[layer][1]])
        )
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
    with pytest.raises(
        OutOfBlocksError,
        match=f"need 1 KV-cache .* only 0 of 2 .*{per_block:,} bytes needed, 0 bytes",
    ):
        cache.append(seq, 0, *_tokens(gen, 4))
    with pytest.raises(ValueError, match="not a live sequence"):
        cache.free(99)
    with pytest.raises(ValueError, match="mode must be one of"):
        cache.preempt(seq, "drop")


def test_prefix_caching_needs_the_sequences_token_ids():
    cache = PagedKVCache(
        1, 4, 2, HEADS, DIM, torch.float32, "cpu", store=store_kv_ref, prefix_caching=True
    )
    seq, _ = cache.admit([5, 6, 7])
    k = rows(None, [5, 6, 7, 8], 0, 4, 0)
    with pytest.raises(ValueError, match="token_ids is required"):
        cache.append(seq, 0, k, k)
    with pytest.raises(ValueError, match="tokens through these rows"):
        cache.append(seq, 0, k, k, token_ids=[5, 6, 7])
    cache.append(seq, 0, k, k, token_ids=[5, 6, 7, 8])  # three reserved slots, one new
    assert cache.num_computed(seq) == 4 and cache.manager.num_cached == 2


def test_commit_over_k_and_v_nobody_wrote_is_refused_and_changes_nothing():
    """By hand, only ``append`` writes K and V: a commit past what every layer holds would register
    blocks of zeros under the prompt's hashes, and a later request would hit them (issue 33). A
    model step commits the tokens it schedules with ``checked=True``, its forward pass writing them.
    """
    cache = PagedKVCache(
        2, 8, 4, HEADS, DIM, torch.float32, "cpu", store=store_kv_ref, prefix_caching=True
    )
    prompt = list(range(1, 10))
    seq, _ = cache.admit(prompt)  # nine slots reserved, none written
    fails_cleanly(cache, lambda: cache.commit(seq, 9, prompt), ValueError, "at most 0.*got 9")
    fails_cleanly(cache, lambda: cache.commit(seq, 1, prompt), ValueError, "at most 0.*got 1")
    k = rows(None, prompt[:6], 0, 6, 0)
    cache.append(seq, 0, k, k, token_ids=prompt[:6])  # layer 0 holds six; layer 1 none
    fails_cleanly(cache, lambda: cache.commit(seq, 6, prompt), ValueError, "mid-step")
    cache.append(seq, 1, k, k, token_ids=prompt[:6])
    fails_cleanly(cache, lambda: cache.commit(seq, 7, prompt), ValueError, "at most 6.*got 7")
    fails_cleanly(cache, lambda: cache.commit(seq, 6, prompt[:5]), ValueError, "first 6 tokens")
    fails_cleanly(cache, lambda: cache.commit(seq, 6, [1.5] * 6), TypeError, r"token_ids\[0\]")
    fails_cleanly(cache, lambda: cache.commit(seq, 5, prompt), ValueError, "int >= 6")
    cache.commit(seq, 6, prompt)  # what is written may be committed (again)
    assert cache.manager.num_cached == 1 and cache.manager.lookup(prompt) == 4
    cache.commit(seq, 9, prompt, checked=True)  # a step scheduling the rest: its pass writes them
    assert cache.num_computed(seq) == 9 and cache.manager.num_cached == 2


def test_a_failing_store_changes_nothing_and_the_retry_takes_the_same_blocks():
    store = FlakyStore()
    cache = PagedKVCache(2, 6, 4, 2, 16, torch.float32, "cpu", store=store)
    seq = cache.new_sequence()
    k = torch.randn(5, 2, 16)
    fails_cleanly(cache, lambda: cache.append(seq, 0, k.to("meta"), k), ValueError, "meta device")
    store.armed = True
    fails_cleanly(cache, lambda: cache.append(seq, 0, k, k), RuntimeError, "injected")
    cache.append(seq, 0, k, k)  # the retry takes the same blocks a first success would
    assert cache.block_table(seq) == [0, 1] and cache.num_free == 4
    store.armed = True
    fails_cleanly(cache, lambda: cache.append(seq, 1, k[:1], k[:1]), RuntimeError, "injected")


def test_copy_on_write_rolls_back_when_the_store_fails():
    store = FlakyStore()
    cache = PagedKVCache(1, 4, 4, 2, 16, torch.float32, "cpu", store=store)
    parent = cache.new_sequence()
    cache.append(parent, 0, torch.randn(2, 2, 16), torch.randn(2, 2, 16))
    child = cache.fork(parent)
    store.armed = True
    k = torch.randn(2, 2, 16)
    fails_cleanly(cache, lambda: cache.append(child, 0, k, k), RuntimeError, "injected")
    assert cache.manager.ref_count(0) == 2
    cache.append(child, 0, k, k)
    cache.append(parent, 0, k, k)
    cache.check()
    assert (
        cache.manager.ref_count(0) == 1
    )  # the child wrote into a private copy; the parent keeps block 0


@settings(max_examples=30, deadline=None)
@given(
    value=st.one_of(
        st.integers(max_value=0), st.sampled_from([0.5, 2.0, "3", None, True, float("nan")])
    )
)
def test_sizes_must_be_positive_ints(value):
    error = TypeError if isinstance(value, (float, str, bool)) or value is None else ValueError
    for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
        args = dict(
            num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=16, device="cpu"
        )
        args[name] = value
        with pytest.raises(error, match=name):
            PagedKVCache(**args)


def _valid_cache():
    cache = PagedKVCache(2, 4, 4, 2, 16, torch.float32, "cpu", store=store_kv_ref)
    seq = cache.new_sequence()
    k = torch.randn(3, 2, 16)
    cache.append(seq, 0, k, k)
    cache.append(seq, 1, k, k)
    return cache, seq


BAD_CALLS = {
    "dtype": (
        lambda: PagedKVCache(1, 2, 4, 1, 16, torch.int32, "cpu"),
        TypeError,
        "dtype must be a floating",
    ),
    "store": (
        lambda: PagedKVCache(1, 2, 4, 1, 16, device="cpu", store="triton"),
        TypeError,
        "store must be",
    ),
    "device": (lambda: PagedKVCache(1, 2, 4, 1, 16, device="gpu0"), ValueError, "device must be"),
    "missing GPU": (
        lambda: PagedKVCache(1, 2, 4, 1, 16, device="cuda:7"),
        ValueError,
        "not available on this machine",
    ),
    "meta device": (
        lambda: PagedKVCache(1, 2, 4, 1, 16, device="meta"),
        ValueError,
        "device must hold data",
    ),
    "beyond memory": (
        lambda: PagedKVCache(80, 10**5, 16, 8, 128, device="cpu"),
        MemoryError,
        r"K and V pools .* bytes but only",
    ),
    "gather layer -1": (
        lambda: _valid_cache()[0].gather(0, -1),
        ValueError,
        r"layer must be an int in \[0, 2\)",
    ),
    "gather unknown seq": (
        lambda: _valid_cache()[0].gather(7, 0),
        ValueError,
        r"seq_id 7 is not a live sequence",
    ),
    "seq_lens layer": (
        lambda: _valid_cache()[0].seq_lens([0], 2),
        ValueError,
        r"layer must be an int in \[0, 2\)",
    ),
    "blocks_to_append negative": (
        lambda: _valid_cache()[0].blocks_to_append(0, -1),
        ValueError,
        "num_tokens",
    ),
    "preempt mode": (
        lambda: _valid_cache()[0].preempt(0, "drop"),
        ValueError,
        r"mode must be one of",
    ),
    "resume resident": (lambda: _valid_cache()[0].resume(0, [1]), ValueError, "is not preempted"),
    "tokens_in_budget nan": (
        lambda: tokens_in_budget(float("nan"), SHAPES["llama-3-8b"]),
        ValueError,
        "budget_bytes must be a finite number",
    ),
    "tokens_in_budget width": (
        lambda: tokens_in_budget(1e9, SHAPES["llama-3-8b"], None),
        TypeError,
        "bytes_per_element must be",
    ),
    "tokens_in_budget shape": (
        lambda: tokens_in_budget(1e9, "llama"),
        TypeError,
        "shape must be a kvlab ModelShape",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_tokens_in_budget_uses_the_model_shape():
    shape = SHAPES[
        "llama-3-8b"
    ]  # 2 * 32 layers * 8 KV heads * 128 dims * 2 bytes = 131,072 bytes per token
    assert shape.kv_bytes_per_token(2) == 131072
    assert tokens_in_budget(16 * 2**30, shape) == 131072
    assert math.isclose(tokens_in_budget(1e9, shape, 1), 1e9 // 65536)
