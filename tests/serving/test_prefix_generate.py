"""Prefix caching behind a real model (notebook 06): a request whose prefix is cached runs only its
suffix, and still produces Hugging Face ``generate``'s greedy tokens on its whole prompt. The first
request of each test runs the plain-PyTorch paths; the second the Triton kernels (interpreted on a
CPU).
"""

import pytest
import torch

import kvlab
from kvlab.cache.blocks import OutOfBlocksError
from kvlab.serving.paged_decode import cache_for, decode_step, generate, prefill

VOCAB = 512
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _model(arch):
    return kvlab.tiny_model(
        arch,
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        vocab=VOCAB,
        intermediate=256,
        device=DEVICE,
        dtype=torch.float32,
        seed=5,
    )


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return _model(request.param)


@pytest.fixture(scope="module")
def llama():
    return _model("llama")


def _tokens(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _expected(model, prompt, new_tokens):
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
    )
    return out[0, len(prompt) :].tolist()


def _state(cache):
    m = cache.manager
    return (
        m.free_order(),
        [m.ref_count(b) for b in range(m.num_blocks)],
        m.cached_blocks(),
        repr(m.stats),
        {s: (m.block_table(s), m.num_tokens(s), m.num_computed(s)) for s in m.sequences()},
    )


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_cached_prefix_gives_generate_tokens(model, block_size):
    cache = cache_for(model, -(-200 // block_size) * 2, block_size, prefix_caching=True)
    system = _tokens(40, seed=1)
    first, second = system + _tokens(5, seed=2), system + _tokens(3, seed=3)
    a = generate(model, cache, first, 2, attention="reference")
    assert a.cached_tokens == 0 and a.tokens == _expected(model, first, 2)
    b = generate(model, cache, second, 3, attention="kernel")
    assert b.cached_tokens == (40 // block_size) * block_size > 0
    assert b.tokens == _expected(model, second, 3)
    exact = system[:32]  # a whole number of blocks, repeated: one block less is reused
    generate(model, cache, exact, 1, attention="gather")
    c = generate(model, cache, exact, 2, attention="gather")
    assert c.cached_tokens == 32 - block_size and c.tokens == _expected(model, exact, 2)
    cache.check()


@pytest.mark.parametrize("block_size", [1, 16])
def test_next_turn_hits_blocks_filled_during_decode(llama, block_size):
    """A chat resends its history: the blocks the reply filled while decoding are hits."""
    cache = cache_for(llama, 64, block_size, prefix_caching=True)
    turn1 = _tokens(7, seed=4)
    reply = generate(llama, cache, turn1, 20, attention="gather")
    turn2 = turn1 + reply.tokens + _tokens(3, seed=5)
    again = generate(llama, cache, turn2, 3, attention="gather")
    fed = len(turn1) + len(reply.tokens) - 1  # the last generated token was never fed back
    assert again.cached_tokens == (fed // block_size) * block_size > len(turn1)
    assert again.tokens == _expected(llama, turn2, 3)


def test_salt_and_batched_decode(llama):
    cache = cache_for(llama, 32, 4, prefix_caching=True)
    prompt = _tokens(11, seed=7)
    seqs, out = [], []
    for salt in ("a", "b", "a"):
        seq, cached = cache.admit(prompt, salt)
        seqs.append(seq)
        out.append(prompt + [prefill(llama, cache, seq, prompt, attention="gather")])
        assert cached == (8 if len(seqs) == 3 else 0)
    for _ in range(3):
        for o, t in zip(out, decode_step(llama, cache, seqs, out, attention="gather")):
            o.append(t)
    assert out[0] == out[1] == out[2] == prompt + _expected(llama, prompt, 4)


def test_out_of_blocks_changes_nothing(llama):
    cache = cache_for(llama, 4, 4, prefix_caching=True)
    tokens = list(_tokens(10, seed=8))
    s, _ = cache.admit(tokens)  # 3 blocks
    tokens.append(prefill(llama, cache, s, tokens, attention="gather"))
    before = _state(cache)
    with pytest.raises(OutOfBlocksError, match="needs 2 KV-cache block.* bytes needed") as info:
        generate(llama, cache, _tokens(7, seed=9), 2)
    assert (info.value.needed, info.value.free, info.value.total) == (2, 1, 4) and _state(
        cache
    ) == before
    tokens += decode_step(llama, cache, [s], [tokens], attention="gather")
    tokens += decode_step(llama, cache, [s], [tokens], attention="gather")  # the third block full
    before = _state(cache)
    with pytest.raises(OutOfBlocksError):
        generate(llama, cache, _tokens(5, seed=10), 2)
    assert _state(cache) == before


def test_failed_prefill_is_undone_and_registers_nothing(llama):
    """A prefill that fails in its last layer: the admission is undone, and since a block's hash is
    registered only once its K and V are written, no hash claims K and V that were never written;
    the next request with the same prompt computes it again."""
    cache = cache_for(llama, 16, 4, prefix_caching=True)
    prompt = _tokens(14, seed=11)
    before = _state(cache)
    mlp = llama.model.layers[-1].mlp

    def fail(*args, **kwargs):
        raise RuntimeError("injected")

    mlp.forward = fail
    try:
        with pytest.raises(RuntimeError, match="injected"):
            generate(llama, cache, prompt, 3, attention="gather")
    finally:
        del mlp.forward
    assert _state(cache) == before and cache.manager.num_cached == 0
    run = generate(llama, cache, prompt, 3, attention="gather")
    assert run.cached_tokens == 0 and run.tokens == _expected(llama, prompt, 3)


def test_bad_calls(llama):
    cache = cache_for(llama, 8, 4, prefix_caching=True)
    with pytest.raises(ValueError, match="attention must be one of"):
        generate(llama, cache, [1, 2], 1, attention="flash")
    with pytest.raises(ValueError, match="at least one token"):
        generate(llama, cache, [], 1)
    with pytest.raises(TypeError, match="PagedKVCache"):
        prefill(llama, object(), 0, [1, 2])
    seq, _ = cache.admit([1, 2, 3])
    with pytest.raises(ValueError, match="token_ids is required with prefix caching on"):
        cache.append(seq, 0, *(2 * [torch.zeros(4, cache.num_kv_heads, cache.head_dim)]))
    with pytest.raises(ValueError, match="not written yet"):
        cache.fork(seq)
    assert not cache.manager.cached_blocks()


def test_trained_model_continues_a_cached_opening_like_generate():
    """The book's trained Llama: a question after a cached opening, its suffix through the
    kernel."""
    model, tok = kvlab.trained_model(device=DEVICE)
    cache = cache_for(model, 16, 16, prefix_caching=True)
    opening = tok(
        "And God said, Let there be light: and there was light. And God saw the light, that it was "
        "good: and God divided the light from the darkness."
    )["input_ids"]
    generate(model, cache, opening + [5], 1, attention="reference")
    asked = opening + tok(" And God called", add_special_tokens=False)["input_ids"]
    run = generate(model, cache, asked, 4, attention="kernel")
    assert run.cached_tokens == 32 and run.tokens == _expected(model, asked, 4)


def test_issue_22_hash_before_write_classes_are_gone(llama):
    """The prefix-cache bugs of issue 22, in the one serving stack (a hash registered only once its
    block's K and V are written): (1) a failed prefill whose admission evicted a freed prompt's
    cached blocks, and whose layer 0 then overwrote them, leaves no hash behind, so a later request
    of that prompt decodes generate's tokens; (2) a prompt admitted but never prefilled offers no
    hit to a longer prompt that starts with it."""
    cache = cache_for(llama, 5, 4, prefix_caching=True)
    prompt, other = _tokens(12, seed=21), _tokens(13, seed=22)
    assert generate(llama, cache, prompt, 2, attention="gather").tokens == _expected(
        llama, prompt, 2
    )
    assert cache.manager.num_cached == 3  # the prompt's 3 full blocks, freed and cached
    mlp = llama.model.layers[-1].mlp

    def fail(*args, **kwargs):
        raise RuntimeError("injected")

    mlp.forward = fail
    try:  # other's 4 blocks take the 2 free ones and evict 2 of the prompt's; layer 0 writes into them
        with pytest.raises(RuntimeError, match="injected"):
            generate(llama, cache, other, 1, attention="gather")
    finally:
        del mlp.forward
    assert cache.manager.num_cached < 3  # what the failure evicted stays evicted
    run = generate(llama, cache, prompt, 2, attention="gather")
    assert run.tokens == _expected(llama, prompt, 2)

    cache = cache_for(llama, 16, 4, prefix_caching=True)
    seq, _ = cache.admit(prompt)  # admitted, never prefilled
    longer = prompt + [20]
    run = generate(llama, cache, longer, 2, attention="gather")
    assert run.cached_tokens == 0 and run.tokens == _expected(llama, longer, 2)
    cache.free(seq)
