"""Prefix caching behind a real model (section 6): a request whose prefix is cached runs only its
suffix through the paged kernel and still produces Hugging Face ``generate``'s greedy tokens on its
whole prompt. The Triton kernel runs under the interpreter on a CPU."""

import pytest
import torch

import kvlab
from kvlab.cache.paged import OutOfBlocksError
from kvlab.serving.prefix_paged import ATTN_NAME, PrefixKVCache, compute_shape, decode_step, generate, measure_ttft, prefill, prefix_cache_for, use_prefix_attention

VOCAB = 512
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel compiled on a GPU, interpreted on a CPU


def _model(arch):
    return kvlab.tiny_model(arch, layers=2, hidden=128, q_heads=4, kv_heads=2, vocab=VOCAB, intermediate=256,
                            device=DEVICE, dtype=torch.float32, seed=5)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return _model(request.param)


@pytest.fixture(scope="module")
def llama():
    return _model("llama")


def _tokens(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _expected(model, prompt, new_tokens):
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=new_tokens,
                             do_sample=False)
    finally:
        model.set_attn_implementation(previous)
    return out[0, len(prompt):].tolist()


def _state(cache: PrefixKVCache):
    p = cache.prefix
    return (p.free_order(), [p.ref_count(b) for b in range(p.num_blocks)], p.cached_blocks(), repr(p.stats),
            {s: (list(cache.table(s).blocks), cache.table(s).num_tokens, list(cache._get(s).layer_tokens))
             for s in cache.sequences()})


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_cached_prefix_gives_generate_tokens(model, block_size):
    """The first request fills the cache (through the plain-PyTorch reference, to keep the Triton
    interpreter's work small); the second runs its suffix and decode steps through the kernel."""
    use_prefix_attention(model)
    cache = prefix_cache_for(model, num_blocks=-(-200 // block_size) * 2, block_size=block_size)
    system = _tokens(40, seed=1)
    first = system + _tokens(5, seed=2)
    second = system + _tokens(3, seed=3)
    a = generate(model, cache, first, 2, attention="reference")
    assert a.cached_tokens == 0 and a.tokens == _expected(model, first, 2)
    b = generate(model, cache, second, 3, attention="kernel")
    assert b.cached_tokens == (40 // block_size) * block_size > 0
    assert b.tokens == _expected(model, second, 3)
    exact = system[:32]  # a whole number of blocks, repeated: one block less is reused
    generate(model, cache, exact, 1, attention="reference")
    c = generate(model, cache, exact, 2, attention="reference")
    assert c.cached_tokens == 32 - block_size
    assert c.tokens == _expected(model, exact, 2)


@pytest.mark.parametrize("block_size", [1, 16])
def test_next_turn_hits_blocks_filled_during_decode(llama, block_size):
    """A chat resends its history: the blocks the reply filled while decoding are hits."""
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=64, block_size=block_size)
    turn1 = _tokens(7, seed=4)
    reply = generate(llama, cache, turn1, 20, attention="reference")
    turn2 = turn1 + reply.tokens + _tokens(3, seed=5)
    again = generate(llama, cache, turn2, 3)
    fed = len(turn1) + len(reply.tokens) - 1  # the last generated token was never fed back
    assert again.cached_tokens == (fed // block_size) * block_size
    assert again.cached_tokens > len(turn1)
    assert again.tokens == _expected(llama, turn2, 3)


@pytest.mark.parametrize("attention", ["reference", "gather"])
def test_other_attention_paths(llama, attention):
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=16, block_size=4)
    shared = _tokens(13, seed=6)
    generate(llama, cache, shared + [1, 2], 2, attention=attention)
    run = generate(llama, cache, shared + [3], 4, attention=attention)
    assert run.cached_tokens == 12 and run.tokens == _expected(llama, shared + [3], 4)


def test_salt_and_batched_decode(llama):
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=32, block_size=4)
    prompt = _tokens(11, seed=7)
    s1, cached1, t1 = prefill(llama, cache, prompt, salt="a")
    s2, cached2, t2 = prefill(llama, cache, prompt, salt="b")
    s3, cached3, t3 = prefill(llama, cache, prompt, salt="a")
    assert (cached1, cached2, cached3) == (0, 0, 8)
    out = [[t1], [t2], [t3]]
    for _ in range(3):
        nxt = decode_step(llama, cache, [s1, s2, s3], [o[-1] for o in out])
        for o, t in zip(out, nxt):
            o.append(t)
    assert out[0] == out[1] == out[2] == _expected(llama, prompt, 4)


def test_out_of_blocks_changes_nothing(llama):
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=4, block_size=4)
    s, _, token = prefill(llama, cache, _tokens(10, seed=8))  # 3 blocks
    before = _state(cache)
    with pytest.raises(OutOfBlocksError, match="need 2 KV-cache block.* bytes needed") as info:
        prefill(llama, cache, _tokens(7, seed=9))
    assert (info.value.needed, info.value.free, info.value.total) == (2, 1, 4)
    assert _state(cache) == before
    decode_step(llama, cache, [s], [token])
    decode_step(llama, cache, [s], [token])  # 12 tokens: the third block is full
    before = _state(cache)
    with pytest.raises(OutOfBlocksError):
        s2, _, _ = prefill(llama, cache, _tokens(5, seed=10))
    assert _state(cache) == before


def test_failed_model_call_is_undone(llama, monkeypatch):
    """A store that fails in the second layer: the admission is undone, hashes and all, so the next
    request with the same prompt computes it again (no hash may claim K and V that were never written)."""
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=16, block_size=4)
    prompt = _tokens(14, seed=11)
    before = _state(cache)
    calls = []
    real = cache._store

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return real(*args)

    cache._store = failing
    with pytest.raises(RuntimeError, match="injected"):
        prefill(llama, cache, prompt)
    assert _state(cache) == before and cache.prefix.num_cached == 0
    cache._store = real
    run = generate(llama, cache, prompt, 3)
    assert run.cached_tokens == 0 and run.tokens == _expected(llama, prompt, 3)


def test_bad_calls(llama):
    use_prefix_attention(llama)
    cache = prefix_cache_for(llama, num_blocks=8, block_size=4)
    with pytest.raises(TypeError, match="admit"):
        cache.new_sequence()
    with pytest.raises(ValueError, match="attention must be one of"):
        prefill(llama, cache, [1, 2], attention="flash")
    with pytest.raises(ValueError, match="at least one token"):
        prefill(llama, cache, [])
    with pytest.raises(TypeError, match="PrefixKVCache"):
        prefill(llama, kvlab.serving.paged_decode.cache_for(llama, 4, 4), [1, 2])
    seq, _ = cache.admit([1, 2, 3])
    k = torch.zeros(4, cache.num_kv_heads, cache.head_dim)
    with pytest.raises(ValueError, match="only 3 slot"):
        cache.append(seq, 0, k, k)
    with pytest.raises(NotImplementedError):
        cache.fork(seq)
    with pytest.raises(ValueError, match="distinct"):
        cache.append_tokens([seq, seq], [1, 2])
    llama.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="use_prefix_attention"):
        prefill(llama, cache, [1, 2])
    use_prefix_attention(llama)
    assert llama.config._attn_implementation == ATTN_NAME


def test_measure_ttft_points(llama):
    points = measure_ttft(llama, 40, [0, 17, 39], block_size=8, warmup=0, reps=1)
    assert [p.cached_tokens for p in points] == [0, 16, 32]
    assert all(p.measured.median > 0 for p in points)
    assert points[0].predicted > points[1].predicted > points[2].predicted > 0
    with pytest.raises(ValueError, match=r"prefix_tokens\[1\] must be an int in \[0, 40\)"):
        measure_ttft(llama, 40, [0, 40])


def test_compute_shape_leaves_out_embeddings(llama):
    shape = compute_shape(llama)
    matrices = sum(p.numel() for n, p in llama.named_parameters() if p.dim() == 2 and "embed" not in n
                   and "lm_head" not in n)
    assert shape.params == matrices


# --------------------------------------------------------------------------- the tensors, without a model

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from kvlab.kernels import store_kv_ref  # noqa: E402


def kv_of(salt, tokens, position, layer):
    """What a model would store for token ``position``: a function of the salt, every token up to
    it and the layer (exact in fp32), standing in for K and V."""
    h = hash((salt, tuple(tokens[: position + 1]), layer)) % 10_007
    return torch.tensor([[float(h), float(layer * 100 + position)]])


class PrefixKVMachine(RuleBasedStateMachine):
    """Random admit / decode / free on the tensor cache: every live sequence's gathered K and V must
    be what computing its tokens would have written, whether its blocks were hits or not."""

    def __init__(self):
        super().__init__()
        self.cache = PrefixKVCache(2, num_blocks=8, block_size=2, num_kv_heads=1, head_dim=2,
                                   dtype=torch.float32, device="cpu", store=store_kv_ref)
        self.live = {}

    def _write(self, seq, start):
        salt, tokens = self.live[seq]
        for layer in range(2):
            rows = torch.cat([kv_of(salt, tokens, p, layer) for p in range(start, len(tokens))])[:, None]
            self.cache.append(seq, layer, rows, -rows)

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=7), salt=st.sampled_from([None, "t"]))
    def admit(self, tokens, salt):
        try:
            seq, cached = self.cache.admit(tokens, salt)
        except OutOfBlocksError:
            return
        assert cached % 2 == 0 and cached < len(tokens)
        self.live[seq] = (salt, list(tokens))
        self._write(seq, cached)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def decode(self, data, token):
        seq = data.draw(st.sampled_from(sorted(self.live)))
        try:
            self.cache.append_tokens([seq], [token])
        except OutOfBlocksError:
            return
        self.live[seq][1].append(token)
        self._write(seq, len(self.live[seq][1]) - 1)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.live)))
        self.cache.free(seq)
        del self.live[seq]

    @invariant()
    def every_sequence_reads_its_own_keys_and_values(self):
        for seq, (salt, tokens) in self.live.items():
            for layer in range(2):
                k, v = self.cache.gather(seq, layer)
                expected = torch.cat([kv_of(salt, tokens, p, layer) for p in range(len(tokens))])[:, None]
                assert torch.equal(k, expected) and torch.equal(v, -expected)
        assert self.cache.num_free + len({b for s in self.live for b in self.cache.table(s).blocks}) == 8


TestPrefixKVMachine = PrefixKVMachine.TestCase
TestPrefixKVMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_trained_model_continues_a_cached_opening_like_generate():
    """The book's trained Llama: a question after a cached opening, its suffix through the kernel."""
    model, tok = kvlab.trained_model(device=DEVICE)
    use_prefix_attention(model)
    cache = prefix_cache_for(model, num_blocks=16, block_size=16)
    opening = tok("And God said, Let there be light: and there was light. And God saw the light, that it was "
                  "good: and God divided the light from the darkness.")["input_ids"]
    generate(model, cache, opening + [5], 1, attention="reference")
    asked = opening + tok(" And God called", add_special_tokens=False)["input_ids"]
    run = generate(model, cache, asked, 4, attention="kernel")
    assert run.cached_tokens == 32 and run.tokens == _expected(model, asked, 4)
