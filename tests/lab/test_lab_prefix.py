"""Notebook 06's measurements: the chat trace, its replay through the block manager against an
oracle that never forgets, and the time-to-first-token helpers (never a timing asserted)."""

import math
import random

import pytest
import torch

import kvlab
from kvlab.lab.prefix import (
    EVICTION_POLICIES,
    REPLAY_POLICIES,
    ChatRequest,
    compute_shape,
    make_chat_trace,
    measure_decode_after_prefix,
    measure_ttft,
    replay,
    simulate_eviction,
)


@pytest.fixture(scope="module")
def llama():
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
        seed=5,
    )


def test_chat_trace_resends_history():
    trace = make_chat_trace(
        num_system_prompts=2,
        num_users=5,
        turns=3,
        system_tokens=20,
        user_tokens=4,
        reply_tokens=3,
        seed=1,
    )
    assert len(trace) == 15
    last = {}
    for r in trace:
        if r.user in last:
            prev = last[r.user]
            assert (
                r.turn == prev.turn + 1
                and r.prompt[: len(prev.prompt) + 3] == prev.prompt + prev.reply
            )
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
        seen.update(
            tuple(stream[: j * block_size]) for j in range(1, len(stream) // block_size + 1)
        )
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_replay_with_room_for_everything_matches_the_oracle(block_size):
    trace = make_chat_trace(
        num_system_prompts=2,
        num_users=6,
        turns=3,
        system_tokens=30,
        user_tokens=5,
        reply_tokens=6,
        vocab=50,
        seed=2,
    )
    total = sum(-(-(len(r.prompt) + len(r.reply)) // block_size) for r in trace)
    expected = unbounded_oracle(trace, block_size)
    result = replay(trace, total + 100, block_size)
    assert result.cached_tokens == expected and result.evictions == 0
    for policy in EVICTION_POLICIES:  # with room for everything no rule evicts anything
        result = simulate_eviction(trace, total + 100, block_size, policy)
        assert result.cached_tokens == expected and result.evictions == 0
    assert replay(trace, total, block_size, "none").cached_tokens == [0] * len(trace)


def test_replay_small_cache():
    trace = make_chat_trace(num_users=10, seed=4)
    longest = max(-(-(len(r.prompt) + len(r.reply) - 1) // 16) for r in trace)
    lru = replay(trace, longest + 4, 16)
    assert lru.evictions > 0 and 0 < lru.hit_rate < 1
    assert lru.mean_ttft(lambda p, c: p - c) == pytest.approx(
        sum(p - c for p, c in zip(lru.prompt_tokens, lru.cached_tokens)) / len(trace)
    )
    with pytest.raises(ValueError, match=f"num_blocks must be >= {longest}"):
        replay(trace, longest - 1, 16)
    with pytest.raises(ValueError, match="policy must be one of"):
        replay(trace, 100, 16, "fifo")
    assert REPLAY_POLICIES == ("lru", "none")
    assert EVICTION_POLICIES == ("lru", "leaf-lru", "lfu")
    with pytest.raises(ValueError, match=f"num_blocks must be >= {longest}"):
        simulate_eviction(trace, longest - 1, 16, "lfu")
    with pytest.raises(ValueError, match="think_time"):
        make_chat_trace(think_time=-1)


def same_replay(trace, num_blocks, block_size):
    """The oracle: the block manager's replay, request by request, evictions and cached counts."""
    manager, simulated = (
        replay(trace, num_blocks, block_size),
        simulate_eviction(trace, num_blocks, block_size, "lru"),
    )
    assert simulated.cached_tokens == manager.cached_tokens
    assert simulated.prompt_tokens == manager.prompt_tokens
    fields = ("evictions", "peak_cached", "final_cached")
    assert [getattr(simulated, f) for f in fields] == [getattr(manager, f) for f in fields]
    return manager


@pytest.mark.parametrize("block_size", [16, 32])
def test_simulated_lru_is_the_block_manager_on_the_notebook_trace(block_size):
    trace = make_chat_trace(num_system_prompts=3, num_users=24, turns=3, seed=1)  # notebook 06's
    for num_blocks in (24, 48, 128, 256):
        same_replay(trace, num_blocks, block_size)


def test_simulated_lru_is_the_block_manager_on_random_traces():
    rng = random.Random(7)
    for seed in range(120):
        block_size = rng.choice([1, 2, 3, 4, 8])
        trace = make_chat_trace(
            num_system_prompts=rng.randint(1, 4),
            num_users=rng.randint(1, 8),
            turns=rng.randint(1, 4),
            system_tokens=rng.randint(0, 20),
            user_tokens=rng.randint(1, 6),
            reply_tokens=rng.randint(1, 6),
            think_time=4 * rng.random(),
            vocab=rng.choice([2, 5, 50]),  # a small vocabulary repeats blocks across users
            seed=seed,
        )
        longest = max(-(-(len(r.prompt) + len(r.reply) - 1) // block_size) for r in trace)
        same_replay(trace, longest + rng.randint(0, 30), block_size)


def request(prompt, reply, user=0):
    return ChatRequest(user, 0, 0, tuple(prompt), tuple(reply))


def test_leaf_first_keeps_a_shared_system_prompt_that_lru_evicts():
    system = list(range(1, 9))  # two blocks of 4
    trace = [
        request(system, [20, 21, 22, 23, 24]),  # caches both system blocks and a reply block
        # exactly two blocks: its second block is never looked up (one token is always computed),
        # so it is written again beside the cached copy, and its reply block chains from that
        # copy, which was freed earlier than its new child
        request(system, [30, 31, 32, 33, 34], user=1),
        request(range(100, 112), [9], user=2),  # another tenant: two blocks must go
        request(system + [40, 41, 42], [9], user=3),
    ]
    lru, leaf = (simulate_eviction(trace, 5, 4, p) for p in ("lru", "leaf-lru"))
    assert lru.cached_tokens == replay(trace, 5, 4).cached_tokens == [0, 4, 0, 4]
    assert leaf.cached_tokens == [0, 4, 0, 8]  # LRU gave up the system prompt's second block


def test_lfu_keeps_the_block_hit_most_and_breaks_ties_by_recency():
    a, b, c, d = ([k] * 4 + [k + 1] for k in (10, 20, 30, 40))  # one full block each, and a token
    trace = [request(p, [9]) for p in (a, a, b, c, d, a, c, b)]
    lru, lfu = (simulate_eviction(trace, 4, 4, p) for p in ("lru", "lfu"))
    # d needs a block with three cached: LRU gives up a's (the least recently freed), LFU b's
    # (a was hit once; b and c never, and b was freed before c)
    assert lru.cached_tokens[5] == 0 and lfu.cached_tokens[5:] == [4, 4, 0]
    assert lru.cached_tokens == replay(trace, 4, 4).cached_tokens


def test_measure_ttft_points(llama):
    points = measure_ttft(llama, 40, [0, 17, 39], block_size=8, warmup=0, reps=1)
    assert [p.cached_tokens for p in points] == [0, 16, 32]
    assert all(p.measured.median > 0 for p in points)
    assert points[0].predicted > points[1].predicted > points[2].predicted > 0
    with pytest.raises(ValueError, match=r"prefix_tokens\[1\] must be an int in \[0, 40\)"):
        measure_ttft(llama, 40, [0, 40])


def test_decode_after_a_prefix_hit(llama):
    after = measure_decode_after_prefix(llama, 24, block_size=8, steps=2)
    assert after.cached_tokens == 16 and after.computed.median > 0 and after.cached.median > 0
    assert after.kv_bytes_per_step == llama.shape.kv_bytes_per_token(4) * 25


def test_compute_shape_leaves_out_embeddings(llama):
    shape = compute_shape(llama)
    matrices = sum(
        p.numel()
        for n, p in llama.named_parameters()
        if p.dim() == 2 and "embed" not in n and "lm_head" not in n
    )
    assert shape.params == matrices


def test_prefix_reuse_against_transformers_copied_cache(llama):
    from kvlab.lab import prefix_reuse as lab

    gen = torch.Generator().manual_seed(2)
    head = torch.randint(0, 512, (37,), generator=gen).tolist()
    prompts = [head + torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 1)]
    assert lab.shared_prefix(prompts) == 37
    result = lab.compare_prefix_reuse(llama, prompts, block_size=8, reps=2)
    assert result.same_first_tokens and result.shared == 37 and result.cached == [32, 32, 32]
    assert all(len(s) == 2 for s in result.seconds.values()) and set(result.seconds) == set(
        lab.REUSE_CONTENDERS
    )
    assert result.hit_rate == pytest.approx(96 / sum(map(len, prompts)))
    median, low, high = result.speedup(lab.KVLAB_CACHED, lab.HF_REUSED)
    assert low <= median <= high
    with pytest.raises(ValueError, match="less than one block"):
        lab.compare_prefix_reuse(llama, [[1, 2, 3], [1, 2, 4]], block_size=8)
    with pytest.raises(ValueError, match="at least two"):
        lab.compare_prefix_reuse(llama, [head], block_size=8)


def test_prefill_attention_cost():
    from kvlab.lab import prefix as lab
    from kvlab.theory.shapes import SHAPES

    cost = lab.prefill_attention_cost(SHAPES["llama-3-8b"], "h100-sxm", [512, 1], [4096, 300])
    assert cost.tokens_per_tile == 64 // 4 and cost.layers == 32
    assert (
        cost.rows.tile_bytes > cost.kernel.tile_bytes > cost.kernel.bytes
        and cost.rows.flops == cost.kernel.flops
    )


# issue 22's bad calls of this module: (call on the fixture's model, error, a pattern naming the
# argument)
BAD_CALLS = {
    "think_time inf": (
        lambda m: make_chat_trace(think_time=math.inf),
        ValueError,
        "think_time must be a finite",
    ),
    "turns True": (lambda m: make_chat_trace(turns=True), TypeError, "turns must be an int"),
    "replay policy": (
        lambda m: replay(make_chat_trace(), 8, 4, policy="fifo"),
        ValueError,
        "policy must be one of",
    ),
    "simulate_eviction policy": (
        lambda m: simulate_eviction(make_chat_trace(), 64, 16, policy="fifo"),
        ValueError,
        "policy must be one of",
    ),
    "simulate_eviction trace": (
        lambda m: simulate_eviction([("a", 1)], 64, 16),
        TypeError,
        "trace",
    ),
    "ttft warmup -1": (
        lambda m: measure_ttft(m, 32, [0], warmup=-1),
        ValueError,
        "warmup must be an int",
    ),
    "ttft reps 0": (lambda m: measure_ttft(m, 32, [0], reps=0), ValueError, "reps must be an int"),
    "ttft attention": (
        lambda m: measure_ttft(m, 32, [0], attention="flash"),
        ValueError,
        "attention must be one of",
    ),
    "ttft seed str": (
        lambda m: measure_ttft(m, 32, [0], seed="1"),
        TypeError,
        "seed must be an int",
    ),
    "ttft block_size 3.0": (
        lambda m: measure_ttft(m, 32, [0], block_size=3.0),
        TypeError,
        "block_size must be an int",
    ),
    "decode steps True": (
        lambda m: measure_decode_after_prefix(m, 32, steps=True),
        TypeError,
        "steps must be an int",
    ),
    "decode attention": (
        lambda m: measure_decode_after_prefix(m, 32, attention=1),
        ValueError,
        "attention must be one of",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_and_leaves_the_model_as_it_was(llama, name):
    call, error, match = BAD_CALLS[name]
    before = llama.config._attn_implementation
    with pytest.raises(error, match=match):
        call(llama)
    assert llama.config._attn_implementation == before  # not left on kvlab's attention
    llama(torch.tensor([[1, 2, 3]]))  # a plain forward pass still works
