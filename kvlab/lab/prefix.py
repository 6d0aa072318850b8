"""Notebook 06: what prefix caching saves, measured, and how eviction policies compare on a chat
trace.

- :func:`make_chat_trace` and :func:`replay`: a multi-tenant chat trace (a few shared system
  prompts, many users, turns that resend the whole history) run through the block manager with
  prefix caching on, one request at a time (KV Cache articles, 2026);
- :func:`simulate_eviction`: the same trace through a block-level cache keyed by the chained hashes,
  under another eviction rule: LRU (the block manager's), leaf-first LRU (SGLang's radix tree,
  Zheng et al. 2024) or LFU.
- :func:`measure_ttft`: time to first token against the cached prefix, beside
  :func:`kvlab.theory.roofline.prefill_time` (KV Cache Memory Wall, 2026);
  :func:`measure_decode_after_prefix`: decode steps after a cold prefill and after a prefix hit.
- against transformers' way of reusing a prefix: :mod:`kvlab.lab.prefix_reuse`;
- :func:`prefill_kernel_rows`: on a GPU, the paged prefill kernel's share of the copy bandwidth and
  of the matmul rate (:func:`kvlab.lab.paged_attention.paged_prefill_work`);
- :func:`bench_rows`: the section's rows of ``python -m kvlab bench``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import torch

from kvlab import _checks
from kvlab._checks import integer, integers, items, one_of, real, require_memory
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.blocks import MAX_BLOCK_ID, block_hashes
from kvlab.lab.timing import measure, merge_timings
from kvlab.serving.paged_decode import cache_for, decode_step, prefill

REPLAY_POLICIES = ("lru", "none")
EVICTION_POLICIES = ("lru", "leaf-lru", "lfu")


@dataclass(frozen=True)
class ChatRequest:
    """One turn of one user's chat: ``prompt`` resends the system prompt and the whole history."""

    user: int
    turn: int
    system: int
    prompt: tuple
    reply: tuple


def make_chat_trace(
    num_system_prompts: int = 3,
    num_users: int = 24,
    turns: int = 3,
    system_tokens: int = 192,
    user_tokens: int = 24,
    reply_tokens: int = 24,
    think_time: float = 6.0,
    vocab: int = 8192,
    seed: int = 0,
) -> list:
    """A multi-tenant chat trace (notebook 06): a few shared system prompts, many users, multi-turn
    chats.

    Each user picks one of ``num_system_prompts`` system prompts at random and holds ``turns``
    turns; turn ``t``'s prompt is the system prompt, then every earlier user message and reply, then
    a new user message of ``user_tokens`` tokens; the reply has ``reply_tokens`` tokens. Users
    arrive one after another (exponential gaps of mean 1) and each next turn follows after an
    exponential think time of mean ``think_time`` (in the same units), so that only some chats are
    active at a time. Requests are ordered by time. Token ids are random in ``[0, vocab)``.
    """
    import numpy as np

    for name, value, low in (
        ("num_system_prompts", num_system_prompts, 1),
        ("num_users", num_users, 1),
        ("turns", turns, 1),
        ("system_tokens", system_tokens, 0),
        ("user_tokens", user_tokens, 1),
        ("reply_tokens", reply_tokens, 1),
        ("vocab", vocab, 2),
        ("seed", seed, 0),
    ):
        integer(name, value, low)
    think_time = real("think_time", think_time, 0)
    # Every prompt resends its history: a user's turns hold about turns^2 / 2 messages in all.
    tokens = num_system_prompts * system_tokens + num_users * turns * (
        system_tokens + (turns + 1) * (user_tokens + reply_tokens)
    )
    require_memory(
        f"a chat trace of {num_users * turns:,} requests ({tokens:,} token ids)", 40 * tokens, "cpu"
    )
    rng = np.random.default_rng(seed)
    draw = lambda n: tuple(int(t) for t in rng.integers(0, vocab, n))  # noqa: E731
    systems = [draw(system_tokens) for _ in range(num_system_prompts)]
    choice = rng.integers(0, num_system_prompts, num_users)
    starts = np.cumsum(rng.exponential(1.0, num_users))
    times = starts[:, None] + np.cumsum(rng.exponential(think_time, (num_users, turns)), axis=1)
    times[:, 0] = starts
    order = sorted((times[u, t], u, t) for u in range(num_users) for t in range(turns))
    history = {u: systems[choice[u]] for u in range(num_users)}
    trace = []
    for _, u, t in order:
        prompt = history[u] + draw(user_tokens)
        reply = draw(reply_tokens)
        trace.append(ChatRequest(u, t, int(choice[u]), prompt, reply))
        history[u] = prompt + reply
    return trace


@dataclass
class ReplayResult:
    """What one cache policy did with a chat trace (notebook 06): per request, prompt and cached
    tokens."""

    policy: str
    num_blocks: int
    block_size: int
    prompt_tokens: list = field(default_factory=list)
    cached_tokens: list = field(default_factory=list)
    evictions: int = 0
    peak_cached: int = 0  # most blocks holding a reusable hash at once
    final_cached: int = 0  # blocks holding a reusable hash when the trace ends

    @property
    def hit_rate(self) -> float:
        total = sum(self.prompt_tokens)
        return sum(self.cached_tokens) / total if total else 0.0

    def mean_ttft(self, prefill_seconds) -> float:
        """Mean time to first token, with ``prefill_seconds(prompt_tokens, cached_tokens)`` per
        request."""
        times = [prefill_seconds(p, c) for p, c in zip(self.prompt_tokens, self.cached_tokens)]
        return sum(times) / len(times) if times else 0.0


def _trace_args(trace, num_blocks, block_size):
    """The door of :func:`replay` and :func:`simulate_eviction`: the trace and sizes, checked (block
    ids as the block manager's: int32)."""
    num_blocks = integer("num_blocks", num_blocks, 1, MAX_BLOCK_ID + 1)
    block_size = integer("block_size", block_size)
    what = "ChatRequest (make_chat_trace)"
    trace = items("trace", trace, ChatRequest, what=what, each=f"a {what}")
    longest = max((-(-(len(r.prompt) + len(r.reply) - 1) // block_size) for r in trace), default=0)
    if longest > num_blocks:
        raise ValueError(
            f"num_blocks must be >= {longest} (the longest request's blocks at block size "
            f"{block_size}), got {num_blocks}"
        )
    return trace, num_blocks, block_size


def replay(trace, num_blocks: int, block_size: int, policy: str = "lru") -> ReplayResult:
    """Run a chat trace through a prefix cache of ``num_blocks`` blocks, one request at a time
    (notebook 06).

    Each request is admitted, its prompt committed as computed (the prefill wrote it), its reply
    reserved and committed token by token (all but the last, which is never fed back), and freed;
    its full blocks stay cached. ``lru`` is the block manager as it is: it evicts the least recently
    freed block first, a request's last block before its first. ``none`` computes every prompt in
    full. ``num_blocks`` must hold the longest request.
    """
    one_of("policy", policy, REPLAY_POLICIES)
    trace, num_blocks, block_size = _trace_args(trace, num_blocks, block_size)
    result = ReplayResult(policy, num_blocks, block_size)
    if policy == "none":
        result.prompt_tokens = [len(r.prompt) for r in trace]
        result.cached_tokens = [0] * len(trace)
        return result
    manager = BlockManager(num_blocks, block_size, prefix_caching=True)
    for request in trace:
        seq_id, cached = manager.admit(request.prompt)
        tokens = request.prompt + request.reply[:-1]
        manager.commit(seq_id, len(request.prompt), tokens)
        for _ in request.reply[:-1]:
            manager.reserve(seq_id, 1)
            manager.commit(seq_id, manager.num_tokens(seq_id), tokens)
        manager.free(seq_id)
        result.prompt_tokens.append(len(request.prompt))
        result.cached_tokens.append(cached)
        result.peak_cached = max(result.peak_cached, manager.num_cached)
    result.evictions, result.final_cached = manager.stats.evictions, manager.num_cached
    return result


# --------------------------------------------------------------------------- eviction rules


class _EvictionCache:
    """Cached full blocks keyed by their chained hash, one request at a time (notebook 06).

    It does what :class:`BlockManager` does with a chat request, block for block: a request holds
    its leading hits and new blocks, registers each full block when it is written unless its hash
    is cached already, and frees its blocks last first. Only which free cached block gives up its
    hash to make room is the policy's: the least recently freed (``lru``, the block manager's
    order), the least recently freed that no cached block chains from (``leaf-lru``), or the least
    often hit, the least recently freed first among equals (``lfu``).
    """

    def __init__(self, num_blocks: int, block_size: int, policy: str):
        self.num_blocks, self.block_size, self.policy = num_blocks, block_size, policy
        self.parent: dict[bytes, bytes | None] = {}  # every cached hash, held or free
        self.children: Counter = Counter()  # cached hashes chained from each hash
        self.hits: Counter = Counter()  # times each cached hash served a request
        # Free cached hashes, the least recently freed first.
        self.free: OrderedDict[bytes, None] = OrderedDict()
        self.held: list[bytes | None] = []  # the running request's blocks: its hash, or None
        self.written = 0  # the running request's leading blocks already registered (or hits)
        self.evictions = 0

    def run(self, prompt: tuple, reply: tuple) -> int:
        """One request: admit, write the prompt, decode the reply, free; returns the tokens its
        hits served."""
        size, tokens = self.block_size, prompt + reply[:-1]
        hashes = block_hashes(tokens, size)
        hits = 0
        while hits < (len(prompt) - 1) // size and hashes[hits] in self.free:
            hits += 1
        for h in hashes[:hits]:
            del self.free[h]
            self.hits[h] += 1
        self.held, self.written = list(hashes[:hits]), hits
        self._allocate(-(-len(prompt) // size) - hits)
        self._register(hashes, len(prompt) // size)
        for end in range(len(prompt) + 1, len(tokens) + 1):  # one reply token at a time
            if (end - 1) % size == 0:
                self._allocate(1)
            self._register(hashes, end // size)
        for h in reversed(self.held):  # last block first, as BlockManager.free
            if h is not None:
                self.free[h] = None
        return hits * size

    def _register(self, hashes: list, full_blocks: int) -> None:
        for k in range(self.written, full_blocks):
            h = hashes[k]
            if h not in self.parent:  # else a copy is cached already: this block stays unhashed
                self.held[k], self.parent[h] = h, hashes[k - 1] if k else None
                self.children[self.parent[h]] += 1
        self.written = max(self.written, full_blocks)

    def _allocate(self, count: int) -> None:
        for _ in range(count):
            if self.num_blocks - len(self.held) - len(self.free) == 0:  # no block without a hash
                self._evict(self._victim())
            self.held.append(None)

    def _victim(self) -> bytes:
        if self.policy == "lfu":
            return min(self.free, key=self.hits.__getitem__)  # the first of equals: least recent
        if self.policy == "leaf-lru":
            leaf = next((h for h in self.free if not self.children[h]), None)
            if leaf is not None:
                return leaf
        return next(iter(self.free))

    def _evict(self, h: bytes) -> None:
        del self.free[h]
        self.children[self.parent.pop(h)] -= 1
        del self.hits[h]
        self.evictions += 1


def simulate_eviction(trace, num_blocks: int, block_size: int, policy: str = "lru") -> ReplayResult:
    """Run a chat trace as :func:`replay` does, through a cache of ``num_blocks`` blocks that gives
    up blocks by ``policy`` (notebook 06).

    The cache keys each full block by its chained hash (:func:`kvlab.cache.blocks.block_hashes`).
    ``lru`` evicts the least recently freed block, a request's last block before its first, as
    :class:`BlockManager` does (its cached tokens per request are :func:`replay`'s); ``leaf-lru``
    only a block that no cached block chains from, a leaf of the prefix tree, least recently freed
    first, as SGLang's radix cache evicts (Zheng et al. 2024; where every free cached block has a
    cached child, the least recently freed); ``lfu`` the block that served the fewest requests
    since it was cached, the least recently freed first among equals.
    """
    one_of("policy", policy, EVICTION_POLICIES)
    trace, num_blocks, block_size = _trace_args(trace, num_blocks, block_size)
    cache = _EvictionCache(num_blocks, block_size, policy)
    result = ReplayResult(policy, num_blocks, block_size)
    for request in trace:
        result.cached_tokens.append(cache.run(request.prompt, request.reply))
        result.prompt_tokens.append(len(request.prompt))
        result.peak_cached = max(result.peak_cached, len(cache.parent))
    result.evictions, result.final_cached = cache.evictions, len(cache.parent)
    return result


# --------------------------------------------------------------------------- time to first token


def compute_shape(model):
    """``model.shape`` with ``params`` counting only the matrices a prefill multiplies for every
    prompt token: not the embedding table (a lookup) nor the output head (run on the last token
    only, ``logits_to_keep=1``). This is the shape :func:`kvlab.theory.roofline.prefill_time` should
    see.
    """
    from kvlab.lab.repeatable_step import model_shape_of

    shape = model_shape_of(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    embeddings = shape.vocab * shape.hidden * (1 if tied else 2)
    return dataclasses.replace(shape, params=float(shape.params - embeddings))


@dataclass(frozen=True)
class TTFTPoint:
    """Time to first token of one prompt with ``cached_tokens`` of its ``prompt_tokens`` served from
    the cache: ``measured`` (a Timing) and ``predicted`` (seconds, prefill FLOPs at the calibrated
    rate).
    """

    prompt_tokens: int
    cached_tokens: int
    measured: object
    predicted: float


def _attention(attention, gpu: bool) -> str:
    from kvlab.serving.attention import ATTENTION_PATHS

    return (
        ("kernel" if gpu else "gather")
        if attention is None
        else one_of("attention", attention, ATTENTION_PATHS)
    )


def _fresh(generator, count: int, vocab: int, avoid: int) -> list[int]:
    tokens = torch.randint(0, vocab, (count,), generator=generator).tolist()
    if tokens and tokens[0] == avoid:  # differ at the first uncached position: nothing after hits
        tokens[0] = (avoid + 1) % vocab
    return tokens


def measure_ttft(
    model,
    prompt_tokens: int,
    prefix_tokens,
    block_size: int = 16,
    warmup: int = 1,
    reps: int = 3,
    seed: int = 0,
    attention: str | None = None,
) -> list[TTFTPoint]:
    """Time to first token of a ``prompt_tokens``-token prompt whose first ``c`` tokens are cached,
    for each ``c`` in ``prefix_tokens`` (rounded down to whole blocks by the cache), interleaved
    (notebook 06).

    Every timed prompt is a shared stream's first ``c`` tokens followed by fresh tokens, so exactly
    the shared blocks hit. ``attention`` defaults to the kernels on a GPU and to the ``"gather"``
    path on a CPU (the Triton interpreter would time Python). The prediction is
    :func:`kvlab.theory.roofline.prefill_time` of :func:`compute_shape` on
    :func:`kvlab.lab.hardware.calibrated_device` at utilization 1.
    """
    from kvlab.devices import on_gpu
    from kvlab.lab.hardware import calibrated_device
    from kvlab.theory.roofline import prefill_time

    _checks.causal_lm("model", model)
    limit = getattr(model.config, "max_position_embeddings", None) or 2**31
    prompt_tokens = integer("prompt_tokens", prompt_tokens, 2, limit + 1)  # positions the model has
    prefix_tokens = integers("prefix_tokens", prefix_tokens, 0, prompt_tokens)
    block_size, warmup, reps = (
        integer("block_size", block_size),
        integer("warmup", warmup, 0),
        integer("reps", reps),
    )
    seed = integer("seed", seed, 0)
    attention = _attention(attention, on_gpu())
    per_prompt = -(-prompt_tokens // block_size)
    cache = cache_for(model, 4 * per_prompt + 4, block_size, prefix_caching=True)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    shared = torch.randint(0, vocab, (prompt_tokens,), generator=generator).tolist()
    seq, _ = cache.admit(shared)
    prefill(model, cache, seq, shared, attention)  # caches the shared stream's blocks
    cache.free(seq)

    def run(prompt, cached_out):
        seq_id, cached = cache.admit(prompt)
        prefill(model, cache, seq_id, prompt, attention)
        cached_out.append((seq_id, cached))

    timings = {c: [] for c in prefix_tokens}
    hits = {c: [] for c in prefix_tokens}
    for rep in range(warmup + reps):  # interleaved over c, so that drift hits every point alike
        for c in prefix_tokens:
            prompt = shared[:c] + _fresh(generator, prompt_tokens - c, vocab, shared[c])
            done = []
            timing = measure(lambda: run(prompt, done), warmup=0, reps=1, device=model.device)
            seq_id, cached = done[0]
            cache.free(seq_id)
            if rep >= warmup:
                timings[c].append(timing)
                hits[c].append(cached)
    shape, hw = compute_shape(model), calibrated_device()
    points = []
    for c in prefix_tokens:
        cached = min(hits[c])
        predicted = prefill_time(shape, hw, prompt_tokens, mfu=1.0, prefix_tokens=cached)
        points.append(TTFTPoint(prompt_tokens, cached, merge_timings(timings[c]), predicted))
    return points


@dataclass(frozen=True)
class DecodeAfterPrefix:
    """Decode steps of two sequences of the same length, one whose prompt was computed in full
    (``computed``) and one whose prompt's prefix came from the cache (``cached``); Timings (notebook
    06).
    """

    prompt_tokens: int
    cached_tokens: int
    computed: object
    cached: object
    kv_bytes_per_step: int  # K and V one step of one sequence reads, all layers


def measure_decode_after_prefix(
    model,
    prompt_tokens: int,
    block_size: int = 16,
    steps: int = 8,
    seed: int = 0,
    attention: str | None = None,
) -> DecodeAfterPrefix:
    """Time decode steps after a cold prefill and after a prefix hit, interleaved (notebook 06).

    Where caching does not help: a decode step reads every cached token's K and V whether the
    prefill computed them or found them in the cache, so the two should take the same time.
    """
    from kvlab.devices import on_gpu

    _checks.causal_lm("model", model)
    limit = getattr(model.config, "max_position_embeddings", None) or 2**31
    steps = integer(
        "steps", steps, 1, max(2, limit - 2)
    )  # a prompt of 2, the steps and one token after fit
    block_size, seed = integer("block_size", block_size), integer("seed", seed, 0)
    prompt_tokens = integer("prompt_tokens", prompt_tokens, 2, limit - steps)
    attention = _attention(attention, on_gpu())
    per_seq = -(-(prompt_tokens + steps + 1) // block_size)
    cache = cache_for(model, 3 * per_seq + 2, block_size, prefix_caching=True)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    shared = torch.randint(0, vocab, (prompt_tokens - 1,), generator=generator).tolist()
    cold, _ = cache.admit(shared + [1])
    cold_token = prefill(model, cache, cold, shared + [1], attention)
    warm, warm_hit = cache.admit(shared + [2])
    warm_token = prefill(model, cache, warm, shared + [2], attention)
    state = {cold: shared + [1, cold_token], warm: shared + [2, warm_token]}  # each one's tokens

    def step(seq_id):
        state[seq_id] += decode_step(model, cache, [seq_id], [state[seq_id]], attention)

    runs = {cold: [], warm: []}
    for i in range(steps):
        for seq_id in (cold, warm) if i % 2 == 0 else (warm, cold):  # alternate who goes first
            runs[seq_id].append(
                measure(lambda: step(seq_id), warmup=0, reps=1, device=model.device)
            )
    length = prompt_tokens + steps // 2
    kv_bytes = int(model.shape.kv_bytes_per_token(model.dtype.itemsize) * length)
    return DecodeAfterPrefix(
        prompt_tokens, warm_hit, merge_timings(runs[cold]), merge_timings(runs[warm]), kv_bytes
    )


@dataclass(frozen=True)
class PrefillAttentionCost:
    """One step's prefill attention on an accelerator, all layers (notebooks 06 and 11): its work as
    the paged prefill kernel's query tiles request it and as one decode row per query token, each
    with the roofline's floor (:func:`kvlab.theory.prefill_attention.attention_floor`)."""

    layers: int
    tokens_per_tile: int
    kernel: object  # PrefillWork of one layer, the kernel's tiles
    rows: object  # PrefillWork of one layer, one query token per row
    kernel_floor: object  # AttentionFloor of one layer
    rows_floor: object
    compulsory_floor: object  # every byte read once


def prefill_attention_cost(
    shape, hw, query_lens, context_lens, element_bytes: int = 2, block_size: int = 16
) -> PrefillAttentionCost:
    """Prefill attention of chunks of ``query_lens`` new tokens at the end of ``context_lens`` on
    ``hw``, for a model of ``shape`` (a ``ModelShape``), with the kernel's query tile for its GQA
    group."""
    from kvlab import kernels
    from kvlab.theory.prefill_attention import attention_floor, prefill_attention_work

    group = shape.q_heads // shape.kv_heads
    per_tile = kernels.configs.query_tokens_per_tile(group)
    args = (
        query_lens,
        context_lens,
        shape.q_heads,
        shape.kv_heads,
        shape.head_dim,
        element_bytes,
        block_size,
    )
    kernel, rows = prefill_attention_work(*args, per_tile), prefill_attention_work(*args, 1)
    return PrefillAttentionCost(
        shape.layers,
        per_tile,
        kernel,
        rows,
        attention_floor(kernel, hw),
        attention_floor(rows, hw),
        attention_floor(kernel, hw, tiled=False),
    )


# --------------------------------------------------------------------------- the prefill kernel on
# a GPU


def prefill_kernel_rows(reps: int = 10) -> list:
    """On a GPU: the paged prefill kernel on a Llama-3-8B-like layer (32 query heads, 8 KV heads,
    head dim 128, bf16, blocks of 16) for a batch of chunks behind cached prefixes, its bytes and
    FLOPs (:func:`kvlab.lab.paged_attention.paged_prefill_work`) over the measured time, as shares
    of the calibrated copy bandwidth and matmul rate."""
    reps = integer("reps", reps)
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.paged_attention import paged_prefill_launcher, paged_prefill_work

    calibration, rows = calibrate(), []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch, cached, new in ((8, 3584, 512), (32, 1024, 128), (4, 0, 2048)):
        context = cached + new
        blocks = -(-context // 16)
        k = torch.randn(
            batch * blocks, 16, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen
        )
        v = torch.randn_like(k)
        table = (
            torch.randperm(batch * blocks, device="cuda", generator=gen)
            .to(torch.int32)
            .reshape(batch, blocks)
        )
        q = torch.randn(batch * new, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        cu = torch.arange(0, batch * new + 1, new, device="cuda", dtype=torch.int32)
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        launch = paged_prefill_launcher(q, k, v, table, cu, lens)
        t = measure(launch, warmup=3, reps=reps, device="cuda").median
        work = paged_prefill_work(q, k, cu, lens)
        where = f"batch {batch}, {cached} cached + {new} new tokens, bf16, block 16"
        rows += [
            Row(f"prefill kernel b{batch} c{cached} n{new}", t * 1e6, "us", where),
            Row(
                f"prefill kernel / copy bandwidth b{batch} c{cached} n{new}",
                work.tile_bytes / t / calibration.copy_bytes_per_s,
                "fraction",
                "bytes the query tiles request / time / calibrated copy bandwidth",
            ),
            Row(
                f"prefill kernel / matmul rate b{batch} c{cached} n{new}",
                work.flops / t / calibration.matmul_flops,
                "fraction",
                "attention FLOPs / time / calibrated matmul rate",
            ),
        ]
    return rows


# --------------------------------------------------------------------------- benchmark rows


def bench_rows():
    """Time to first token with and without a cached prefix, and hit rates on a chat trace (notebook
    06)."""
    from kvlab.devices import on_gpu
    from kvlab.lab.bench import Row
    from kvlab.lab.engine import burst_rows
    from kvlab.lab.hardware import calibrated_device
    from kvlab.lab.models import tiny_model
    from kvlab.lab.prefix_reuse import reuse_rows
    from kvlab.theory.roofline import prefill_time

    gpu = on_gpu()
    model = tiny_model("llama", size="real" if gpu else "cpu")
    prompt = 4096 if gpu else 512
    points = measure_ttft(
        model, prompt, [0, prompt * 3 // 4, prompt - 1], block_size=16, reps=5 if gpu else 3
    )
    cold = points[0]
    rows = [
        Row(
            f"TTFT, {prompt}-token prompt, nothing cached",
            cold.measured.median * 1e3,
            "ms",
            f"{model.shape.name}, paged cache, block 16",
        )
    ]
    for p in points[1:]:
        rows += [
            Row(
                f"TTFT cold / TTFT with {p.cached_tokens} cached",
                cold.measured.median / p.measured.median,
                "x",
                "ratio of medians, same run",
            ),
            Row(
                f"predicted cold / cached {p.cached_tokens}",
                cold.predicted / p.predicted,
                "x",
                "roofline.prefill_time at the calibrated matmul rate",
            ),
        ]
    trace = make_chat_trace(num_system_prompts=3, num_users=24, turns=3, seed=0)
    shape, hw = compute_shape(model), calibrated_device()
    longest = max(-(-(len(r.prompt) + len(r.reply) - 1) // 16) for r in trace)
    for policy in ("lru", "leaf-lru", "lfu", "none"):
        run = replay if policy in REPLAY_POLICIES else simulate_eviction
        result = run(trace, 2 * longest, 16, policy)
        note = f"72-request chat trace, 3 system prompts, {2 * longest} blocks of 16"
        rows.append(
            Row(f"{policy}: prompt tokens served from cache", 100 * result.hit_rate, "%", note)
        )
        ttft = result.mean_ttft(lambda p, c: prefill_time(shape, hw, p, mfu=1.0, prefix_tokens=c))
        rows.append(
            Row(f"{policy}: mean predicted TTFT", ttft * 1e3, "ms", note + ", prefill_time")
        )
    rows += reuse_rows(model, prompt, reps=5 if gpu else 3)  # kvlab.lab.prefix_reuse
    rows += burst_rows(model, reps=3 if gpu else 2)  # kvlab.lab.engine: a burst and staggered
    if gpu:
        rows += prefill_kernel_rows()
    return rows
