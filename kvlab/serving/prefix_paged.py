"""Prefix caching behind a real model: the K and V tensors of reused blocks (section 6, prefix caching).

- :class:`PrefixKVCache` is a :class:`~kvlab.cache.paged.PagedKVCache` whose blocks are handed out by a
  :class:`~kvlab.cache.prefix.PrefixCache`. ``admit(prompt)`` reserves every block of the prompt, reusing
  cached ones; the model then writes K and V only for the uncached suffix. ``append_tokens``
  reserves the slot of each decode step's input token, and hashes a block once it is full.
- :func:`use_prefix_attention` switches a stock Hugging Face Llama or Qwen2 to the attention function
  ``"kvlab_prefix"``: each layer stores the new tokens' keys and values (already rotated by RoPE at
  their true positions) in the paged cache and attends each new token to everything before it
  through :func:`~kvlab.kernels.paged_decode_attention`, one kernel row per new token (new token
  ``i`` of a suffix that starts after ``c`` cached tokens is a row of length ``c + i + 1``). A
  prefill of the suffix and a decode step are the same call.
- :func:`prefill`, :func:`decode_step` and :func:`generate` drive it; :func:`measure_ttft` times
  the time to first token against the cached prefix length beside ``kvlab.theory.roofline.prefill_time``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab._checks import integer
from kvlab.serving.paged_decode import PagedBatch, cache_for
from kvlab.cache.paged import BlockTable, PagedKVCache, _Sequence
from kvlab.cache.prefix import PrefixCache, _token_list

ATTN_NAME = "kvlab_prefix"
ATTENTION_PATHS = ("kernel", "reference", "gather")


# --------------------------------------------------------------------------- the cache


@dataclass
class _PrefixSequence(_Sequence):
    reserved: int = 0  # tokens whose slots the prefix cache has handed out (the prompt, then each input token)


class PrefixKVCache(PagedKVCache):
    """A paged KV cache with prefix caching: blocks come from ``self.prefix``, a PrefixCache (section 6).

    Sequences are made by :meth:`admit` (not ``new_sequence``); their ids are the PrefixCache's.
    Each layer's ``append`` may only fill slots already reserved by ``admit`` or ``append_tokens``.
    A sequence must be prefilled before another prompt is admitted that could hit its blocks (a
    hit reads K and V that its first owner's prefill writes). ``fork``, ``preempt`` and ``swap_in``
    are not offered: free the sequence and admit it again, and its blocks come back from the cache.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype=torch.float16, device=None, store=None):
        super().__init__(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, store)
        self.prefix = PrefixCache(num_blocks, block_size)

    @property
    def num_free(self) -> int:
        return self.prefix.num_free

    def new_sequence(self) -> int:
        raise TypeError("a PrefixKVCache makes sequences from their tokens: use admit(token_ids)")

    def admit(self, token_ids, salt=None) -> tuple[int, int]:
        """Reserve blocks for prompt ``token_ids``; returns ``(seq_id, cached_tokens)``.

        The first ``cached_tokens`` tokens' K and V are already in the pools (shared blocks); the
        caller runs the model on the rest. Raises OutOfBlocksError (bytes needed and free) and
        changes nothing when the blocks are not there.
        """
        tokens = _token_list(token_ids)
        needed = self.prefix.blocks_to_admit(tokens, salt) if tokens else 0
        if needed > self.num_free:
            raise self._out_of_blocks(needed)
        seq_id, cached = self.prefix.admit(tokens, salt)
        table = BlockTable(self.block_size, self.prefix.block_table(seq_id), cached)
        self._sequences[seq_id] = _PrefixSequence(table, [cached] * self.num_layers, reserved=len(tokens))
        return seq_id, cached

    def append_tokens(self, seq_ids, token_ids) -> None:
        """Reserve one slot for each ``token_ids[i]`` after ``seq_ids[i]``, all or nothing (section 6)."""
        seq_ids = list(seq_ids)
        tokens = _token_list(token_ids)
        if len(tokens) != len(seq_ids) or len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must be distinct and as many as token_ids, got {seq_ids} and {tokens}")
        seqs = [self._require_resident(s) for s in seq_ids]
        needed = sum(self.prefix.blocks_to_append(s) for s in seq_ids)
        if needed > self.num_free:
            raise self._out_of_blocks(needed)
        for seq_id, seq, token in zip(seq_ids, seqs, tokens):
            self.prefix.append(seq_id, token)
            seq.table.blocks = self.prefix.block_table(seq_id)
            seq.reserved += 1

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``; its blocks stay cached (with their K and V) until their memory is needed."""
        self._get(seq_id)
        self.prefix.free(seq_id)
        del self._sequences[seq_id]

    def fork(self, seq_id: int) -> int:
        raise NotImplementedError("fork is not offered with prefix caching: admit the same tokens instead, "
                                  "which shares their full blocks")

    def preempt(self, seq_id: int, mode: str) -> int:
        raise NotImplementedError("preempt is not offered with prefix caching: free the sequence and admit it "
                                  "again later (its blocks come back from the cache unless evicted)")

    def swap_in(self, seq_id: int) -> None:
        raise NotImplementedError("swap_in is not offered with prefix caching")

    def _grow(self, seq, num_tokens, *rest):
        """Layer 0 writes only into reserved slots: the PrefixCache, not the allocator, hands out blocks."""
        free_slots = seq.reserved - seq.table.num_tokens
        if num_tokens > free_slots:
            raise ValueError(f"cannot store {num_tokens} token(s): only {free_slots} slot(s) reserved; "
                             "reserve them with admit(token_ids) or append_tokens(seq_ids, token_ids) first")
        super()._grow(seq, num_tokens, *rest)

    def _snapshot(self):
        seqs = {i: (list(s.table.blocks), s.table.num_tokens, list(s.layer_tokens), s.reserved)
                for i, s in self._sequences.items()}
        return self.prefix._snapshot(), seqs

    def _restore(self, snapshot) -> None:
        prefix, seqs = snapshot
        self.prefix._restore(prefix)
        self._sequences = {i: _PrefixSequence(BlockTable(self.block_size, blocks, tokens), layers, reserved=reserved)
                           for i, (blocks, tokens, layers, reserved) in seqs.items()}


def prefix_cache_for(model, num_blocks: int, block_size: int = 16, device=None, store=None) -> PrefixKVCache:
    """An empty :class:`PrefixKVCache` shaped for ``model`` (layers, KV heads, head dim, dtype)."""
    shaped = cache_for(model, 1, block_size, device=device, store=store)  # reads the shape from the model
    return PrefixKVCache(shaped.num_layers, num_blocks, block_size, shaped.num_kv_heads, shaped.head_dim,
                         dtype=shaped.dtype, device=shaped.device, store=store)


# --------------------------------------------------------------------------- attention


def _attend_rows(query, cache: PagedKVCache, seq_ids, layer: int, before: torch.Tensor, scaling, path: str):
    """New token ``i`` of sequence ``b`` attends to its first ``before[b] + i + 1`` cached tokens."""
    from kvlab.kernels import paged_decode_attention, paged_decode_attention_ref

    batch, heads, tokens, dim = query.shape
    if path == "gather":  # each sequence's blocks gathered once, then SDPA with an offset causal mask
        outs = []
        for b, seq_id in enumerate(seq_ids):
            keys, values = cache.gather(seq_id, layer)  # [length, kv_heads, dim]
            length = keys.shape[0]
            allowed = torch.arange(length, device=query.device)[None, :] <= (
                int(before[b]) + torch.arange(tokens, device=query.device)[:, None])
            out = F.scaled_dot_product_attention(query[b:b + 1], keys.transpose(0, 1)[None].to(query.dtype),
                                                 values.transpose(0, 1)[None].to(query.dtype),
                                                 attn_mask=allowed[None, None], scale=scaling, enable_gqa=True)
            outs.append(out[0].transpose(0, 1))
        return torch.stack(outs)
    attend = paged_decode_attention if path == "kernel" else paged_decode_attention_ref
    rows = query.transpose(1, 2).reshape(batch * tokens, heads, dim).contiguous()
    table = cache.block_tables(seq_ids).repeat_interleave(tokens, dim=0)
    lens = (before.to(torch.int32)[:, None] + torch.arange(1, tokens + 1, dtype=torch.int32, device=before.device))
    out = attend(rows.to(cache.dtype), cache.k_pools[layer], cache.v_pools[layer], table, lens.reshape(-1),
                 scale=scaling)
    return out.to(query.dtype).reshape(batch, tokens, heads, dim)


def prefix_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             paged: PagedBatch | None = None, **kwargs):
    """The attention function registered as ``"kvlab_prefix"`` (section 6).

    ``query`` is ``[batch, num_q_heads, tokens, head_dim]``, ``key`` and ``value``
    ``[batch, num_kv_heads, tokens, head_dim]`` for the new tokens only: an uncached suffix
    (batch 1) or one decode token per sequence. Returns ``([batch, tokens, num_q_heads, head_dim], None)``.
    """
    if paged is None:
        raise ValueError(f"attention '{ATTN_NAME}' needs the paged= keyword (a PagedBatch); "
                         "call the model through kvlab.serving.prefix_paged")
    layer = module.layer_idx
    batch, _, tokens, _ = query.shape
    if len(paged.seq_ids) != batch:
        raise ValueError(f"paged.seq_ids has {len(paged.seq_ids)} ids for a batch of {batch}")
    cache = paged.cache
    before = cache.seq_lens(paged.seq_ids, layer)
    if tokens == 1:
        cache.append_batch(paged.seq_ids, layer, key[:, :, 0], value[:, :, 0])
    else:
        for b, seq_id in enumerate(paged.seq_ids):
            cache.append(seq_id, layer, key[b].transpose(0, 1), value[b].transpose(0, 1))
    return _attend_rows(query, cache, paged.seq_ids, layer, before, scaling, paged.attention), None


def use_prefix_attention(model):
    """Switch ``model`` to the ``"kvlab_prefix"`` attention function; returns the model (section 6)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, prefix_attention_forward)
    model.set_attn_implementation(ATTN_NAME)
    return model


# --------------------------------------------------------------------------- the model calls


def _check_call(model, cache, attention):
    if not isinstance(cache, PrefixKVCache):
        raise TypeError(f"cache must be a kvlab.serving.prefix_paged.PrefixKVCache, got {type(cache).__name__}")
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    if model.config._attn_implementation != ATTN_NAME:
        raise ValueError(f"the model does not use '{ATTN_NAME}' attention: call use_prefix_attention(model) first")


@torch.inference_mode()
def prefill(model, cache: PrefixKVCache, token_ids, salt=None, attention: str = "kernel") -> tuple[int, int, int]:
    """Admit a prompt and run only its uncached suffix (section 6); returns ``(seq_id, cached_tokens, next_token)``.

    ``next_token`` is the greedy choice after the whole prompt. If the model call fails, the cache's
    bookkeeping is put back as it was.
    """
    _check_call(model, cache, attention)
    tokens = _token_list(token_ids)
    snapshot = cache._snapshot()
    seq_id, cached = cache.admit(tokens, salt)
    try:
        ids = torch.tensor([tokens[cached:]], dtype=torch.long, device=model.device)
        positions = torch.arange(cached, len(tokens), dtype=torch.long, device=model.device)[None]
        out = model(ids, position_ids=positions, use_cache=False, logits_to_keep=1,
                    paged=PagedBatch(cache, [seq_id], attention))
    except BaseException:
        cache._restore(snapshot)
        raise
    return seq_id, cached, int(out.logits[0, -1].argmax())


@torch.inference_mode()
def decode_step(model, cache: PrefixKVCache, seq_ids, tokens, attention: str = "kernel") -> list[int]:
    """One decode step: ``tokens[i]`` is fed to ``seq_ids[i]``; returns the greedy next tokens (section 6)."""
    _check_call(model, cache, attention)
    seq_ids = list(seq_ids)
    snapshot = cache._snapshot()
    cache.append_tokens(seq_ids, tokens)
    try:
        ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=model.device)
        positions = cache.seq_lens(seq_ids).to(torch.long)[:, None]  # stored so far = the new token's position
        out = model(ids, position_ids=positions, use_cache=False, logits_to_keep=1,
                    paged=PagedBatch(cache, seq_ids, attention))
    except BaseException:
        cache._restore(snapshot)
        raise
    return out.logits[:, -1].argmax(dim=-1).tolist()


@dataclass(frozen=True)
class Generation:
    """One request through the prefix-cached paged cache: its tokens and how much of its prompt hit."""

    tokens: list
    cached_tokens: int
    prompt_tokens: int


def generate(model, cache: PrefixKVCache, token_ids, max_new_tokens: int, salt=None,
             attention: str = "kernel") -> Generation:
    """Greedy decoding of one prompt on ``cache``, reusing whatever prefix it holds (section 6).

    The sequence is freed at the end: its blocks (prompt and generated tokens) stay cached for the
    next request. The last generated token is never fed back, so its K and V are never computed.
    """
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    tokens = _token_list(token_ids)
    seq_id, cached, token = prefill(model, cache, tokens, salt, attention)
    out = [token]
    try:
        while len(out) < max_new_tokens:
            (token,) = decode_step(model, cache, [seq_id], [token], attention)
            out.append(token)
    finally:
        cache.free(seq_id)
    return Generation(out, cached, len(tokens))


# --------------------------------------------------------------------------- time to first token


def compute_shape(model):
    """``model.shape`` with ``params`` counting only the matrices a prefill multiplies for every prompt
    token: not the embedding table (a lookup) nor the output head (run on the last token only,
    ``logits_to_keep=1``). This is the shape :func:`kvlab.theory.roofline.prefill_time` should see."""
    shape = model.shape
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    embeddings = shape.vocab * shape.hidden * (1 if tied else 2)
    return dataclasses.replace(shape, params=float(shape.params - embeddings))


@dataclass(frozen=True)
class TTFTPoint:
    """Time to first token of one prompt with ``cached_tokens`` of its ``prompt_tokens`` served from the
    cache: ``measured`` (a Timing) and ``predicted`` (seconds, prefill FLOPs at the calibrated rate)."""

    prompt_tokens: int
    cached_tokens: int
    measured: object
    predicted: float


def _fresh(generator, count: int, vocab: int, avoid: int) -> list[int]:
    tokens = torch.randint(0, vocab, (count,), generator=generator).tolist()
    if tokens and tokens[0] == avoid:
        tokens[0] = (avoid + 1) % vocab  # differ at the first uncached position, so nothing after it hits
    return tokens


def measure_ttft(model, prompt_tokens: int, prefix_tokens, block_size: int = 16, warmup: int = 1, reps: int = 3,
                 seed: int = 0, attention: str | None = None) -> list[TTFTPoint]:
    """Time to first token of a ``prompt_tokens``-token prompt whose first ``c`` tokens are cached,
    for each ``c`` in ``prefix_tokens`` (rounded down to whole blocks by the cache), interleaved (section 6).

    Every timed prompt is a shared stream's first ``c`` tokens followed by fresh tokens, so exactly
    the shared blocks hit. ``attention`` defaults to the kernel on a GPU and to the ``"gather"`` path
    on a CPU (the Triton interpreter would time Python), where K and V are stored with ``store_kv_ref``.
    The prediction is :func:`kvlab.theory.roofline.prefill_time` of :func:`compute_shape` on
    :func:`kvlab.lab.gemv.calibrated_device` at utilization 1.
    """
    from kvlab.lab.gemv import calibrated_device
    from kvlab.lab.hardware import on_gpu
    from kvlab.kernels import store_kv_ref
    from kvlab.serving.paged_decode import _merge_timings
    from kvlab.theory.roofline import prefill_time
    from kvlab.lab.timing import measure

    prompt_tokens = integer("prompt_tokens", prompt_tokens, 2)
    block_size = integer("block_size", block_size)
    prefix_tokens = [integer(f"prefix_tokens[{i}]", c, 0, prompt_tokens) for i, c in enumerate(prefix_tokens)]
    attention = attention or ("kernel" if on_gpu() else "gather")
    use_prefix_attention(model)
    per_prompt = -(-prompt_tokens // block_size)
    cache = prefix_cache_for(model, 4 * per_prompt + 4, block_size, store=None if on_gpu() else store_kv_ref)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    shared = torch.randint(0, vocab, (prompt_tokens,), generator=generator).tolist()
    seq, _, _ = prefill(model, cache, shared, attention=attention)  # caches the shared stream's blocks
    cache.free(seq)

    def run(prompt, cached_out):
        seq_id, cached, _ = prefill(model, cache, prompt, attention=attention)
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
        points.append(TTFTPoint(prompt_tokens, cached, _merge_timings(timings[c]), predicted))
    return points


@dataclass(frozen=True)
class DecodeAfterPrefix:
    """Decode steps of two sequences of the same length, one whose prompt was computed in full
    (``computed``) and one whose prompt's prefix came from the cache (``cached``); Timings (section 6)."""

    prompt_tokens: int
    cached_tokens: int
    computed: object
    cached: object
    kv_bytes_per_step: int  # K and V one step of one sequence reads, all layers


def measure_decode_after_prefix(model, prompt_tokens: int, block_size: int = 16, steps: int = 8, seed: int = 0,
                                attention: str | None = None) -> DecodeAfterPrefix:
    """Time decode steps after a cold prefill and after a prefix hit, interleaved (section 6).

    Where caching does not help: a decode step reads every cached token's K and V whether the
    prefill computed them or found them in the cache, so the two should take the same time.
    """
    from kvlab.lab.hardware import on_gpu
    from kvlab.kernels import store_kv_ref
    from kvlab.serving.paged_decode import _merge_timings
    from kvlab.lab.timing import measure

    prompt_tokens = integer("prompt_tokens", prompt_tokens, 2)
    steps = integer("steps", steps)
    attention = attention or ("kernel" if on_gpu() else "gather")
    use_prefix_attention(model)
    per_seq = -(-(prompt_tokens + steps + 1) // block_size)
    cache = prefix_cache_for(model, 3 * per_seq + 2, block_size, store=None if on_gpu() else store_kv_ref)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    shared = torch.randint(0, vocab, (prompt_tokens - 1,), generator=generator).tolist()
    cold, cold_hit, cold_token = prefill(model, cache, shared + [1], attention=attention)
    warm, warm_hit, warm_token = prefill(model, cache, shared + [2], attention=attention)
    state = {cold: cold_token, warm: warm_token}

    def step(seq_id):
        (state[seq_id],) = decode_step(model, cache, [seq_id], [state[seq_id]], attention)

    runs = {cold: [], warm: []}
    for i in range(steps):
        for seq_id in (cold, warm) if i % 2 == 0 else (warm, cold):  # alternate who goes first
            runs[seq_id].append(measure(lambda: step(seq_id), warmup=0, reps=1, device=model.device))
    length = prompt_tokens + steps // 2
    kv_bytes = int(model.shape.kv_bytes_per_token(model.dtype.itemsize) * length)
    return DecodeAfterPrefix(prompt_tokens, warm_hit, _merge_timings(runs[cold]), _merge_timings(runs[warm]),
                             kv_bytes)


# --------------------------------------------------------------------------- benchmark rows


def bench_rows():
    """Time to first token with and without a cached prefix, and hit rates on a chat trace (section 6)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.gemv import calibrated_device
    from kvlab.lab.hardware import on_gpu
    from kvlab.lab.models import tiny_model
    from kvlab.cache.prefix import REPLAY_POLICIES, make_chat_trace, replay
    from kvlab.theory.roofline import prefill_time

    gpu = on_gpu()
    model = tiny_model("llama", size="real" if gpu else "cpu")
    prompt = 4096 if gpu else 512
    points = measure_ttft(model, prompt, [0, prompt * 3 // 4, prompt - 1], block_size=16, reps=5 if gpu else 3)
    cold = points[0]
    rows = [Row(f"TTFT, {prompt}-token prompt, nothing cached", cold.measured.median * 1e3, "ms",
                f"{model.shape.name}, paged cache, block 16")]
    for p in points[1:]:
        rows += [
            Row(f"TTFT cold / TTFT with {p.cached_tokens} cached", cold.measured.median / p.measured.median, "x",
                "ratio of medians, same run"),
            Row(f"predicted cold / cached {p.cached_tokens}", cold.predicted / p.predicted, "x",
                "roofline.prefill_time at the calibrated matmul rate"),
        ]
    trace = make_chat_trace(num_system_prompts=3, num_users=24, turns=3, seed=0)
    shape, hw = compute_shape(model), calibrated_device()
    longest = max(-(-(len(r.prompt) + len(r.reply) - 1) // 16) for r in trace)
    for policy in REPLAY_POLICIES:
        result = replay(trace, 2 * longest, 16, policy)
        note = f"72-request chat trace, 3 system prompts, {2 * longest} blocks of 16"
        rows.append(Row(f"{policy}: prompt tokens served from cache", 100 * result.hit_rate, "%", note))
        ttft = result.mean_ttft(lambda p, c: prefill_time(shape, hw, p, mfu=1.0, prefix_tokens=c))
        rows.append(Row(f"{policy}: mean predicted TTFT", ttft * 1e3, "ms", note + ", prefill_time"))
    return rows
