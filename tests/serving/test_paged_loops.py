"""A Hugging Face Llama decoding on the paged KV cache through the one attention function (notebook
05).

The oracle is Hugging Face's own ``generate`` (greedy, its own cache and attention), run on each
prompt alone. The paged run batches prompts of different lengths without padding; ``prefill`` and
``decode_step`` are all or nothing, even when a layer in the middle of the model fails.
"""

import functools

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvlab
from kvlab.cache.blocks import OutOfBlocksError
from kvlab.cache.paged import PagedKVCache
from kvlab.serving.attention import ATTN_NAME
from kvlab.serving.paged_decode import (
    cache_for,
    decode_step,
    paged_generate,
    prefill,
    use_paged_attention,
)

NEW_TOKENS = 6


@functools.lru_cache(maxsize=None)
def _model():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=512,
        intermediate=256,
        device="cpu",
        dtype=torch.float32,
        seed=3,
    )


@pytest.fixture
def model():
    m = _model()
    m.set_attn_implementation("sdpa")
    return m


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in lengths]


def _generate_each(model, prompts, new_tokens):
    model.set_attn_implementation("sdpa")
    return [
        model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=new_tokens,
            do_sample=False,
        )[0, len(p) :].tolist()
        for p in prompts
    ]


@pytest.mark.parametrize("lengths", [[7], [5, 17, 3]])
def test_paged_decode_matches_generate(model, lengths):
    prompts = _prompts(lengths)
    expected = _generate_each(model, prompts, NEW_TOKENS)
    run = paged_generate(model, prompts, NEW_TOKENS, block_size=4)
    assert model.config._attn_implementation == "sdpa"  # switched for each call only
    assert run.tokens == expected and run.preemptions == 0


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_keeps_the_tokens(model, preemption):
    prompts = _prompts([7, 7, 3], seed=1)
    expected = _generate_each(model, prompts, NEW_TOKENS)
    # 5 blocks of 4 admit all three (2 + 2 + 1 blocks), but they grow to 3 + 3 + 3: someone is
    # preempted.
    run = paged_generate(
        model,
        prompts,
        NEW_TOKENS,
        block_size=4,
        num_blocks=5,
        preemption=preemption,
        attention="gather",
    )
    assert run.tokens == expected
    assert run.preemptions >= 1 and run.peak_blocks <= 5
    assert (run.recomputed_tokens > 0) == (preemption == "recompute")
    assert (run.swapped_blocks > 0) == (preemption == "swap")


def test_chunked_prefill_and_a_forked_decode_give_generates_tokens(model):
    """The plain loop by hand: a prompt prefilled 3 tokens at a time, then a fork that decodes on
    its own (its first token copies the shared, partly filled last block)."""
    prompt = _prompts([10], seed=2)[0]
    expected = _generate_each(model, [prompt], 4)[0]
    cache = cache_for(model, 8, 4)
    seq = cache.new_sequence()
    assert prefill(model, cache, seq, prompt, attention="gather", max_tokens=3) is None
    while (token := prefill(model, cache, seq, prompt, attention="gather", max_tokens=3)) is None:
        pass
    child, tokens = cache.fork(seq), prompt + [token]  # the caller keeps the child's tokens
    for _ in range(3):
        tokens += decode_step(model, cache, [child], [tokens], attention="gather")
    assert tokens[len(prompt) :] == expected
    assert cache.block_table(child)[:2] == cache.block_table(seq)[:2]
    assert cache.block_table(child)[2] != cache.block_table(seq)[2]
    cache.check()


def test_bad_arguments(model):
    with pytest.raises(OutOfBlocksError, match="need 4 KV-cache block.* bytes needed"):
        paged_generate(model, _prompts([10]), NEW_TOKENS, block_size=4, num_blocks=3)
    with pytest.raises(ValueError, match="preemption must be one of"):
        paged_generate(model, _prompts([3]), 2, preemption="drop")
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        paged_generate(model, _prompts([3]), 0)
    for fn in (paged_generate,):
        with pytest.raises(ValueError, match=r"block_size must be an int >= 1, got 0"):
            fn(model, [[1, 2, 3]], 2, block_size=0)
    use_paged_attention(model)
    assert model.config._attn_implementation == ATTN_NAME
    with pytest.raises(ValueError, match="needs the kvlab_step= keyword"):
        model(torch.tensor([[1, 2]]), use_cache=False)


# --------------------------------------------------------------------------- all or nothing


def _cache(num_blocks=16, block_size=4, **changes):
    args = dict(
        num_layers=2,
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=2,
        head_dim=32,
        dtype=torch.float32,
        device="cpu",
    )
    args.update(changes)
    return PagedKVCache(**args)


def snapshot(cache):
    m = cache.manager
    seqs = {
        s: (
            m.block_table(s),
            m.num_tokens(s),
            m.num_computed(s),
            m.state(s),
            (
                [cache.gather(s, l) for l in range(cache.num_layers)]
                if m.state(s) == "resident"
                else None
            ),
        )
        for s in m.sequences()
    }
    return m.free_order(), [m.ref_count(b) for b in range(m.num_blocks)], m.cached_blocks(), seqs


def assert_same(a, b):
    assert a[:3] == b[:3] and a[3].keys() == b[3].keys()
    for s in a[3]:
        assert a[3][s][:4] == b[3][s][:4]
        if a[3][s][4] is not None:
            assert all(
                torch.equal(x, y) for p, q in zip(a[3][s][4], b[3][s][4]) for x, y in zip(p, q)
            )


def fails_cleanly(cache, call, error, match=None):
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        call()
    assert_same(before, snapshot(cache))
    cache.check()


class failing_layer:
    """While active, decoder layer ``index``'s MLP raises: the layers before it have stored K and
    V."""

    def __init__(self, model, index):
        self.mlp = model.model.layers[index].mlp

    def __enter__(self):
        def fail(*args, **kwargs):
            raise RuntimeError("injected failure in a layer")

        self.mlp.forward = fail

    def __exit__(self, *exc):
        del self.mlp.forward


MISMATCHED_CACHES = {  # a cache built for another model: refused before any layer writes
    "dtype": (
        dict(dtype=torch.float16),
        r"cache.dtype is torch.float16 but the model needs torch.float32",
    ),
    "layers": (dict(num_layers=3), r"cache.num_layers is 3 but the model needs 2"),
    "kv heads": (dict(num_kv_heads=4), r"cache.num_kv_heads is 4 but the model needs 2"),
    "head dim": (dict(head_dim=16), r"cache.head_dim is 16 but the model needs 32"),
    "block size": (
        dict(block_size=3),
        r"block_size must be a power of two for attention='kernel', got 3",
    ),
}


@pytest.mark.parametrize("case", MISMATCHED_CACHES)
def test_a_cache_that_does_not_fit_the_model_is_refused_first(model, case):
    changes, message = MISMATCHED_CACHES[case]
    cache = _cache(**changes)
    seq = cache.new_sequence()
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [1, 2, 3], attention="kernel"),
        ValueError,
        message,
    )
    fails_cleanly(
        cache,
        lambda: decode_step(model, cache, [seq], [[1]], attention="kernel"),
        ValueError,
        message,
    )


@pytest.mark.parametrize(
    "case",
    [
        "attention name",
        "token out of vocab",
        "unfinished prefill",
        "out of blocks",
        "layer 0 fails",
        "layer 1 fails",
        "not a cache",
        "duplicate",
        "unknown seq",
    ],
)
def test_decode_step_fails_cleanly(model, case):
    cache = _cache()
    seq = cache.new_sequence()
    prefill(model, cache, seq, [1, 2, 3], attention="gather")
    attention, seqs, tokens, error, match, layer = (
        "gather",
        [seq],
        [[1, 2, 3, 4]],
        ValueError,
        None,
        None,
    )
    if case == "attention name":
        attention, match = (
            "flash",
            r"attention must be one of \('kernel', 'gather', 'reference'\), got 'flash'",
        )
    elif case == "token out of vocab":
        tokens, match = [[1, 2, 3, 512]], r"token_ids\[0\]\[3\] must be a token id in \[0, 512\)"
    elif case == "unfinished prefill":
        cache.reserve(seq, 1)
        match = "prefill it first"
    elif case == "out of blocks":
        while cache.num_free:
            prefill(model, cache, cache.new_sequence(), [1], attention="gather")
        decode_step(model, cache, [seq], tokens, attention="gather")  # seq's block is now full
        tokens, error, match = [[1, 2, 3, 4, 5]], OutOfBlocksError, "bytes needed"
    elif case.startswith("layer"):
        layer, error, match = int(case[6]), RuntimeError, "injected"
    elif case == "not a cache":
        cache_arg = object()
        with pytest.raises(TypeError, match="cache must be a kvlab.cache.paged.PagedKVCache"):
            decode_step(model, cache_arg, seqs, tokens)
        return
    elif case == "duplicate":
        seqs, tokens, match = [seq, seq], tokens * 2, "distinct"
    elif case == "unknown seq":
        seqs, match = [10**6], "not a live sequence"
    if layer is None:
        fails_cleanly(
            cache,
            lambda: decode_step(model, cache, seqs, tokens, attention=attention),
            error,
            match,
        )
        return
    with failing_layer(model, layer):
        fails_cleanly(
            cache,
            lambda: decode_step(model, cache, seqs, tokens, attention=attention),
            error,
            match,
        )


def test_failed_prefill_and_decode_step_retried_give_the_first_success(model):
    clean, flaky = _cache(), _cache()
    for cache in (clean, flaky):
        cache.new_sequence()
    expected = prefill(model, clean, 0, [5, 6, 7, 8, 9], attention="gather")
    with failing_layer(model, 1):
        fails_cleanly(
            flaky,
            lambda: prefill(model, flaky, 0, [5, 6, 7, 8, 9], attention="gather"),
            RuntimeError,
        )
    assert prefill(model, flaky, 0, [5, 6, 7, 8, 9], attention="gather") == expected
    tokens = [[5, 6, 7, 8, 9, expected]]
    step = decode_step(model, clean, [0], tokens, attention="gather")
    with failing_layer(model, 1):
        fails_cleanly(
            flaky, lambda: decode_step(model, flaky, [0], tokens, attention="gather"), RuntimeError
        )
    assert decode_step(model, flaky, [0], tokens, attention="gather") == step
    assert_same(snapshot(clean), snapshot(flaky))


def test_prefill_refuses_what_it_cannot_run(model):
    cache = _cache()
    seq = cache.new_sequence()
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [], attention="gather"),
        ValueError,
        "at least one token id",
    )
    prefill(model, cache, seq, [1, 2], attention="gather")
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [1, 2], attention="gather"),
        ValueError,
        "no token left",
    )
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [1], attention="gather"),
        ValueError,
        "must hold sequence 0's 2 tokens",
    )
    seq = cache.new_sequence()
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [1, -2], attention="gather"),
        ValueError,
        r"token_ids\[1\] must be a token id in \[0, 512\)",
    )
    fails_cleanly(
        cache,
        lambda: prefill(model, cache, seq, [1], attention="gather", max_tokens=0),
        ValueError,
        "max_tokens must be an int >= 1",
    )


class DecodeWithFailures(RuleBasedStateMachine):
    """Prefill and decode steps of a real model on two caches: ``clean`` sees every valid call,
    ``faulty`` also a failing call of every kind between them. The two must stay identical
    (snapshots), so each failed call changed nothing and the valid call after it is a first success;
    tokens agree too."""

    def __init__(self):
        super().__init__()
        self.model = _model()
        self.clean, self.faulty = _cache(num_blocks=12), _cache(num_blocks=12)
        self.running = {}  # seq -> its tokens (the caller's: the cache keeps none)

    def _both(self, call):
        a, b = call(self.clean), call(self.faulty)
        assert a == b
        return a

    @precondition(lambda self: len(self.running) < 4)
    @rule(prompt=st.lists(st.integers(0, 511), min_size=1, max_size=9), fail_first=st.booleans())
    def admit(self, prompt, fail_first):
        seq = self._both(lambda c: c.new_sequence())
        if self.clean.blocks_to_append(seq, len(prompt)) > self.clean.num_free:
            fails_cleanly(
                self.faulty,
                lambda: prefill(self.model, self.faulty, seq, prompt, attention="gather"),
                OutOfBlocksError,
            )
            self._both(lambda c: c.free(seq))
            return
        if fail_first:  # the prefill fails in its last layer, after layer 0 stored its K and V
            with failing_layer(self.model, 1):
                fails_cleanly(
                    self.faulty,
                    lambda: prefill(self.model, self.faulty, seq, prompt, attention="gather"),
                    RuntimeError,
                    "injected",
                )
        self.running[seq] = prompt + [
            self._both(lambda c: prefill(self.model, c, seq, prompt, attention="gather"))
        ]

    @precondition(lambda self: self.running)
    @rule(fail=st.sampled_from([None, 0, 1]))
    def step(self, fail):
        seqs = sorted(self.running)
        tokens = [self.running[s] for s in seqs]
        if sum(self.clean.blocks_to_append(s) for s in seqs) > self.clean.num_free:
            fails_cleanly(
                self.faulty,
                lambda: decode_step(self.model, self.faulty, seqs, tokens, attention="gather"),
                OutOfBlocksError,
            )
            self._both(lambda c: c.free(seqs[-1]))
            del self.running[seqs[-1]]
            return
        if fail is not None:
            with failing_layer(self.model, fail):
                fails_cleanly(
                    self.faulty,
                    lambda: decode_step(self.model, self.faulty, seqs, tokens, attention="gather"),
                    RuntimeError,
                    "injected",
                )
        new = self._both(lambda c: decode_step(self.model, c, seqs, tokens, attention="gather"))
        for seq, token in zip(seqs, new):
            self.running[seq] = self.running[seq] + [token]

    @invariant()
    def caches_agree(self):
        assert_same(snapshot(self.clean), snapshot(self.faulty))
        self.faulty.check()


TestDecodeWithFailures = DecodeWithFailures.TestCase
TestDecodeWithFailures.settings = settings(
    max_examples=10,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_model_geometry_names_a_missing_model():
    from kvlab.serving.runner import model_geometry

    with pytest.raises(TypeError, match="model must be a Hugging Face causal LM"):
        model_geometry(None)
