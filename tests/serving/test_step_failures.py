"""Random interleavings of admit, prefill in chunks, decode, preemption (recompute and swap),
failing model calls (a layer that raises in the middle of a prefill and of a decode step) and free,
on a real model with prefix caching on. After every call the block manager's invariants hold, and
every registered block's K and V equal a fresh computation of its tokens by Hugging Face's own
forward pass: a hit can only ever read what the model would compute (notebooks 05, 06, 11)."""

import functools

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvlab
from kvlab.cache.blocks import OutOfBlocksError
from kvlab.serving.engine import Engine
from kvlab.serving.paged_decode import cache_for, decode_step, generate, prefill
from kvlab.versions import returned_cache

BLOCK = 4
PREFIXES = ([3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8])


@functools.lru_cache(maxsize=1)
def _model():
    m = kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=64,
        q_heads=4,
        kv_heads=2,
        vocab=128,
        intermediate=128,
        device="cpu",
        dtype=torch.float32,
        seed=11,
    )
    m.set_attn_implementation("sdpa")
    return m


@functools.lru_cache(maxsize=None)
def fresh_keys_values(tokens: tuple) -> list:
    """Per layer, the K and V Hugging Face computes for ``tokens`` from nothing: ``[tokens, heads,
    dim]``."""
    model = _model()
    with torch.inference_mode():
        out = model(torch.tensor([list(tokens)]), use_cache=True)
    cache = returned_cache(out)
    return [
        (layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1)) for layer in cache.layers
    ]


class raising_layer:
    """While active, the model's last decoder layer raises after its attention has stored K and
    V."""

    def __init__(self, model):
        self.mlp = model.model.layers[-1].mlp

    def __enter__(self):
        def fail(*args, **kwargs):
            raise RuntimeError("injected failure in the last layer")

        self.mlp.forward = fail

    def __exit__(self, *exc):
        del self.mlp.forward


def state(cache):
    m = cache.manager
    seqs = {
        s: (m.block_table(s), m.num_tokens(s), m.num_computed(s), m.state(s)) for s in m.sequences()
    }
    return m.free_order(), [m.ref_count(b) for b in range(m.num_blocks)], m.cached_blocks(), seqs


class StepsWithFailures(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.model = _model()
        self.cache = cache_for(self.model, 6, BLOCK, prefix_caching=True)
        self.tokens = {}  # each sequence's tokens: the caller keeps them, the cache none
        self.next_token = {}  # a sequence whose tokens are all computed -> the token its last logits chose
        self.content = {}  # block -> the tokens of the written full block it holds (as last seen)

    def _pick(self, data, want):
        c = self.cache
        seqs = [s for s in c.sequences() if want(s)]
        return data.draw(st.sampled_from(seqs)) if seqs else None

    def _resident(self, s):
        return self.cache.state(s) == "resident"

    def _uncomputed(self, s):
        return self._resident(s) and self.cache.num_computed(s) < self.cache.num_tokens(s)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        cut=st.integers(1, 8),
        own=st.lists(st.integers(0, 127), max_size=5),
    )
    def admit(self, prefix, cut, own):
        tokens = prefix[:cut] + own
        if self.cache.blocks_to_admit(tokens) <= self.cache.num_free:
            self.tokens[self.cache.admit(tokens)[0]] = tokens

    @precondition(lambda self: self.cache.manager.num_cached)
    @rule(tokens=st.lists(st.integers(0, 127), min_size=9, max_size=20))
    def failed_generate(self, tokens):
        """A whole request whose prefill fails in its last layer: its admission may have taken (and
        evicted) cached blocks and every layer written into them; all of it is undone but the
        evictions.
        """
        if self.cache.blocks_to_admit(tokens) > self.cache.num_free:
            return
        before = state(self.cache)
        with raising_layer(self.model), pytest.raises((RuntimeError, OutOfBlocksError)) as failure:
            generate(self.model, self.cache, tokens, 2, attention="gather")
        after = state(self.cache)
        if (
            failure.type is OutOfBlocksError
        ):  # the whole generation does not fit: refused before it starts
            assert "bytes needed" in str(failure.value) and after == before
            return
        assert "injected" in str(failure.value)
        assert (
            after[1] == before[1]
            and after[3] == before[3]
            and sorted(after[0]) == sorted(before[0])
        )
        assert set(after[2].items()) <= set(before[2].items())

    @precondition(lambda self: any(self._uncomputed(s) for s in self.cache.sequences()))
    @rule(data=st.data(), chunk=st.integers(1, 6), fail=st.booleans())
    def prefill_chunk(self, data, chunk, fail):
        seq = self._pick(data, self._uncomputed)
        if seq is None:
            return
        if fail:  # a prefill that fails in its last layer, after layer 0 stored its chunk
            before = state(self.cache)
            with raising_layer(self.model), pytest.raises(RuntimeError, match="injected"):
                prefill(self.model, self.cache, seq, self.tokens[seq], "gather", chunk)
            assert (
                state(self.cache) == before
            )  # reserved slots only: nothing to allocate, nothing evicted
        token = prefill(self.model, self.cache, seq, self.tokens[seq], "gather", chunk)
        if token is not None:
            self.next_token[seq] = token

    @precondition(lambda self: self.next_token)
    @rule(data=st.data(), fail=st.booleans())
    def decode(self, data, fail):
        c = self.cache
        ready = [
            s
            for s in c.sequences()
            if self._resident(s) and s in self.next_token and c.num_computed(s) == c.num_tokens(s)
        ]
        if not ready:
            return
        seqs = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        tokens = [self.tokens[s] + [self.next_token[s]] for s in seqs]
        if sum(c.blocks_to_append(s) for s in seqs) > c.num_free:
            before = state(c)
            with pytest.raises(OutOfBlocksError):
                decode_step(self.model, c, seqs, tokens, attention="gather")
            assert state(c) == before
            return
        if fail:  # fails after reserving (perhaps evicting cached blocks) and storing layer 0
            before = state(c)
            with raising_layer(self.model), pytest.raises(RuntimeError, match="injected"):
                decode_step(self.model, c, seqs, tokens, attention="gather")
            after = state(c)
            assert (
                after[1] == before[1]
                and after[3] == before[3]
                and sorted(after[0]) == sorted(before[0])
            )
            assert set(after[2].items()) <= set(
                before[2].items()
            )  # an eviction stands, nothing else changed
        self.next_token.update(
            zip(seqs, decode_step(self.model, c, seqs, tokens, attention="gather"))
        )
        self.tokens.update(zip(seqs, tokens))

    @precondition(lambda self: any(self._resident(s) for s in self.cache.sequences()))
    @rule(data=st.data(), mode=st.sampled_from(["recompute", "swap"]))
    def preempt(self, data, mode):
        seq = self._pick(data, self._resident)  # mid-prefill included
        if seq is not None:
            self.cache.preempt(seq, mode)
            if mode == "recompute":
                self.next_token.pop(seq, None)

    @precondition(lambda self: any(not self._resident(s) for s in self.cache.sequences()))
    @rule(data=st.data())
    def resume(self, data):
        seq = self._pick(data, lambda s: not self._resident(s))
        tokens = self.tokens.get(seq)
        if seq is not None and self.cache.blocks_to_resume(seq, tokens) <= self.cache.num_free:
            self.cache.resume(seq, tokens)

    @precondition(lambda self: self.cache.sequences())
    @rule(data=st.data())
    def free(self, data):
        seq = self._pick(data, lambda s: True)
        if seq is not None:
            self.cache.free(seq)
            self.next_token.pop(seq, None)
            del self.tokens[seq]

    @invariant()
    def cached_blocks_hold_what_the_model_computes(self):
        c = self.cache
        c.check()
        for seq in c.sequences():
            if self._resident(seq):
                tokens, table = self.tokens[seq], c.block_table(seq)
                for k in range(c.num_computed(seq) // BLOCK):
                    self.content[table[k]] = tuple(tokens[: (k + 1) * BLOCK])
        for block in c.manager.cached_blocks().values():
            tokens = self.content[block]
            for layer, (k, v) in enumerate(fresh_keys_values(tokens)):
                torch.testing.assert_close(
                    c.k_pools[layer][block], k[-BLOCK:], atol=1e-5, rtol=1e-5
                )
                torch.testing.assert_close(
                    c.v_pools[layer][block], v[-BLOCK:], atol=1e-5, rtol=1e-5
                )


TestStepsWithFailures = StepsWithFailures.TestCase
TestStepsWithFailures.settings = settings(
    max_examples=12,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- the engine, with
# failing steps


def engine_state(engine):
    """What a failed step must leave as it was: the cache, the queues, every request and the
    counters."""
    s = engine.scheduler
    requests = {
        r.id: (r.state, r.seq, list(r.output), r.preemptions) for r in engine.requests.values()
    }
    queues = ([r.id for r in s.waiting], [r.id for r in s.running], [r.id for r in s.swapped])
    return state(engine.cache), queues, requests, engine.stats.steps, len(engine.events)


@functools.lru_cache(maxsize=None)
def greedy(prompt: tuple, new: int) -> list:
    model = _model()
    ids = torch.tensor([list(prompt)])
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
    )[0, len(prompt) :].tolist()


class EngineWithFailures(RuleBasedStateMachine):
    """Requests arrive between steps; some steps fail in the model's last layer (after layer 0
    stored its K and V) and must change nothing, some arrivals are bad and must change nothing. The
    pool is large enough that no step preempts (a preemption made to run a step stands when it
    fails), so after each failure the engine equals its snapshot exactly; at the end every request's
    tokens are ``generate``'s."""

    def __init__(self):
        super().__init__()
        self.engine = Engine(
            _model(),
            num_blocks=64,
            block_size=BLOCK,
            max_batch=3,
            max_batched_tokens=6,
            prefix_caching=True,
            attention="reference",
            debug=True,
        )

    @rule(
        prefix=st.sampled_from(PREFIXES),
        cut=st.integers(1, 8),
        own=st.lists(st.integers(0, 127), max_size=4),
        new=st.integers(1, 4),
    )
    def add(self, prefix, cut, own, new):
        self.engine.add_request(prefix[:cut] + own, new)

    @rule(
        bad=st.sampled_from(
            [([1, 128], 2), ([1.0, 2], 2), ([True], 2), ("ab", 2), ([1], 0), ([1], True)]
        )
    )
    def add_bad(self, bad):
        before = engine_state(self.engine)
        with pytest.raises((TypeError, ValueError)):
            self.engine.add_request(*bad)
        assert engine_state(self.engine) == before

    @precondition(lambda self: self.engine.has_work())
    @rule(fail=st.booleans())
    def step(self, fail):
        if fail:
            before = engine_state(self.engine)
            with raising_layer(self.engine.model), pytest.raises(RuntimeError, match="injected"):
                self.engine.step()
            assert engine_state(self.engine) == before
        self.engine.step()

    @invariant()
    def consistent(self):
        self.engine.check_invariants()

    def teardown(self):
        while self.engine.has_work():
            self.engine.step()
        for r in self.engine.requests.values():
            assert r.output == greedy(tuple(r.prompt), r.max_new_tokens)


TestEngineWithFailures = EngineWithFailures.TestCase
TestEngineWithFailures.settings = settings(
    max_examples=8,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
