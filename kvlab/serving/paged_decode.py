"""A Hugging Face decoder whose decode steps read a paged KV cache (section 9.5, PagedAttention).

The model stays the stock ``transformers`` Llama (or Qwen2, Mistral): only its attention function
changes. :func:`register` adds ``"kvlab_paged"`` to transformers' attention-function registry;
a model switched to it (``model.set_attn_implementation("kvlab_paged")``) is called without a
Hugging Face cache and with a ``paged=`` keyword that names the :class:`~kvlab.cache.paged.PagedKVCache`
and the sequences of the batch. Each layer then

1. appends the new tokens' keys and values (already rotated by RoPE) to the paged cache through
   the ``store_kv`` kernel, and
2. attends: a prefill (one sequence, many tokens) with torch's SDPA over its own prompt, a decode
   step (one token per sequence) with :func:`~kvlab.kernels.paged_decode_attention` over the
   block tables, or its plain-PyTorch reference (``attention="reference"``).

:func:`paged_generate` is a small scheduler on top: it admits prompts while blocks are free,
decodes the running batch one token per step, and preempts the newest request by recompute or
swap when the pool runs out, producing the same greedy tokens as ``model.generate``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvlab._checks import integer, one_of
from kvlab.cache.paged import PREEMPTION_MODES, PagedKVCache

ATTN_NAME = "kvlab_paged"
ATTENTION_PATHS = ("kernel", "reference", "gather")


@dataclass
class PagedBatch:
    """What the attention function needs besides q, k, v: passed to the model as ``paged=``."""

    cache: PagedKVCache
    seq_ids: list[int]
    attention: str = "kernel"


def paged_decode_attention_gather(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """Paged decode attention in vectorised PyTorch: gather through the block table, then SDPA (section 9.5).

    What paging costs without a fused kernel: every step first copies each sequence's blocks
    into a contiguous ``[batch, max_blocks * block_size, kv_heads, head_dim]`` tensor (entries past
    a sequence's length are masked out), then runs torch's SDPA on it. Same signature as the
    kernel, same checks; ``block_table`` entries past a sequence's blocks are never read.
    """
    from kvlab.kernels.paged_attention import _check_inputs  # the kernel's own validation: one rule for all paths

    scale = _check_inputs(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, kernel_limits=False)
    return _gather_attention(q, k_cache, v_cache, block_table, seq_lens, scale)


def _gather_attention(q, k_cache, v_cache, block_table, seq_lens, scale):
    """``paged_decode_attention_gather`` without its checks (and their host sync), for a caller that
    validated the step's tables once, as an engine does (compare ``kernels.paged_attention._launch``)."""
    block_size = k_cache.shape[1]
    in_use = torch.arange(block_table.shape[1], device=q.device)[None, :] * block_size < seq_lens[:, None]
    index = torch.where(in_use, block_table.long(), 0)  # unused entries may hold anything
    keys = k_cache[index].flatten(1, 2).transpose(1, 2)  # [batch, kv_heads, max_blocks * block_size, dim]
    values = v_cache[index].flatten(1, 2).transpose(1, 2)
    valid = torch.arange(keys.shape[2], device=q.device)[None, :] < seq_lens[:, None]
    out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=valid[:, None, None, :],
                                         scale=scale, enable_gqa=True)
    return out[:, :, 0]


def _decode_attention(path: str):
    from kvlab.kernels import paged_decode_attention, paged_decode_attention_ref

    one_of("attention", path, ATTENTION_PATHS)
    return {"kernel": paged_decode_attention, "reference": paged_decode_attention_ref,
            "gather": paged_decode_attention_gather}[path]


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                            paged: PagedBatch | None = None, **kwargs):
    """The attention function registered as ``"kvlab_paged"`` (section 9.5).

    ``query`` is ``[batch, num_q_heads, tokens, head_dim]``, ``key`` and ``value``
    ``[batch, num_kv_heads, tokens, head_dim]`` for the new tokens only. Returns
    ``([batch, tokens, num_q_heads, head_dim], None)`` as transformers expects.
    """
    if not isinstance(paged, PagedBatch):
        raise ValueError(f"attention '{ATTN_NAME}' needs the paged= keyword (a PagedBatch), got {paged!r}; "
                         "call the model through kvlab.serving.paged_decode")
    attend = _decode_attention(paged.attention)  # an unknown path is refused before this layer appends
    layer = module.layer_idx
    batch, _, tokens, _ = query.shape
    if len(paged.seq_ids) != batch:
        raise ValueError(f"paged.seq_ids has {len(paged.seq_ids)} ids for a batch of {batch}")
    cache = paged.cache
    if tokens > 1:  # prefill: one sequence, starting from an empty cache
        if batch != 1 or int(cache.seq_lens(paged.seq_ids, layer)[0]) != 0:
            raise ValueError("a prefill must be one sequence with an empty cache (batch 1, no tokens stored)")
        cache.append(paged.seq_ids[0], layer, key[0].transpose(0, 1), value[0].transpose(0, 1))
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2), None
    cache.append_batch(paged.seq_ids, layer, key[:, :, 0], value[:, :, 0])
    out = attend(query[:, :, 0].contiguous(), cache.k_pools[layer], cache.v_pools[layer],
                 cache.block_tables(paged.seq_ids), cache.seq_lens(paged.seq_ids, layer), scale=scaling)
    return out[:, None], None


def register() -> str:
    """Add ``"kvlab_paged"`` to transformers' attention registry (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention_forward)
    return ATTN_NAME


def use_paged_attention(model):
    """Switch ``model`` to the paged attention function; returns the model (section 9.5)."""
    register()
    model.set_attn_implementation(ATTN_NAME)
    return model


def cache_for(model, num_blocks: int, block_size: int = 16, device=None, store=None) -> PagedKVCache:
    """An empty :class:`PagedKVCache` shaped for ``model`` (its layers, KV heads, head dim and dtype);
    ``store`` replaces the ``store_kv`` kernel (e.g. ``store_kv_ref`` to time host-side work on a CPU)."""
    layers, kv_heads, head_dim = _model_geometry(model)
    return PagedKVCache(layers, num_blocks, block_size, kv_heads, head_dim, dtype=model.dtype,
                        device=device if device is not None else model.device, store=store)


# --------------------------------------------------------------------------- the two model calls


def _model_geometry(model) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of ``model``, as :func:`cache_for` reads them."""
    shape = model.shape if hasattr(model, "shape") else None
    config = model.config
    layers = shape.layers if shape else config.num_hidden_layers
    kv_heads = shape.kv_heads if shape else config.num_key_value_heads
    head_dim = shape.head_dim if shape else getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    return layers, kv_heads, head_dim


def _check_model_and_cache(model, cache, attention: str) -> None:
    """Everything a step needs from ``model`` and ``cache`` together, checked before any layer appends."""
    from kvlab.kernels import SUPPORTED_HEAD_DIMS
    from kvlab.kernels._validation import is_power_of_two

    one_of("attention", attention, ATTENTION_PATHS)
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a kvlab.cache.paged.PagedKVCache, got {type(cache).__name__}")
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        raise ValueError(f"model uses attention {getattr(model.config, '_attn_implementation', None)!r}, not "
                         f"{ATTN_NAME!r}: call kvlab.serving.paged_decode.use_paged_attention(model) first "
                         "(otherwise the cache is never read or written)")
    layers, kv_heads, head_dim = _model_geometry(model)
    model_side = {"num_layers": layers, "num_kv_heads": kv_heads, "head_dim": head_dim, "dtype": model.dtype}
    for name, expected in model_side.items():
        if getattr(cache, name) != expected:
            raise ValueError(f"cache.{name} is {getattr(cache, name)} but the model needs {expected}; "
                             "build the cache with kvlab.serving.paged_decode.cache_for(model, ...)")
    model_device = torch.device(model.device)
    if (cache.device.type, cache.device.index or 0) != (model_device.type, model_device.index or 0):
        raise ValueError(f"cache.device is {cache.device} but the model is on {model_device}; "
                         "build the cache with kvlab.serving.paged_decode.cache_for(model, ...)")
    if attention in ("kernel", "reference"):  # the kernel's limits; the reference checks as the kernel does
        if not is_power_of_two(cache.block_size):
            raise ValueError(f"cache.block_size must be a power of two for attention={attention!r}, got "
                             f"{cache.block_size}; use attention='gather' for other sizes")
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"the model's head_dim {head_dim} must be one of {SUPPORTED_HEAD_DIMS} for "
                             f"attention={attention!r}; use attention='gather'")


def _check_tokens(name: str, tokens, vocab: int) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"{name} must be a list of int token ids or a 1-D integer tensor, "
                            f"got a {tokens.dtype} tensor of shape {tuple(tokens.shape)}")
        tokens = tokens.tolist()
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise TypeError(f"{name} must be a list of int token ids, got {type(tokens).__name__}")
    return [integer(f"{name}[{i}]", t, 0, vocab) for i, t in enumerate(tokens)]


@torch.inference_mode()
def prefill(model, cache: PagedKVCache, seq_id: int, token_ids, attention: str = "kernel") -> int:
    """Run ``token_ids`` (a list) through ``model`` into ``cache`` as ``seq_id``; returns the greedy next token.

    All or nothing: on any error the cache is exactly as before."""
    _check_model_and_cache(model, cache, attention)
    tokens = _check_tokens("token_ids", token_ids, model.config.vocab_size)
    if not tokens:
        raise ValueError("token_ids must hold at least one token")
    seq = cache._require_resident(seq_id)
    if any(seq.layer_tokens):
        raise ValueError(f"sequence {seq_id} already holds tokens {seq.layer_tokens} (per layer); a prefill "
                         "starts from an empty sequence (new_sequence(), or after preempt(..., 'recompute'))")
    needed = cache.blocks_to_append(seq_id, len(tokens))
    if needed > cache.num_free:
        raise cache._out_of_blocks(needed)
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    with cache._all_or_nothing():
        out = model(ids, use_cache=False, logits_to_keep=1, paged=PagedBatch(cache, [seq_id], attention))
    return int(out.logits[0, -1].argmax())


@torch.inference_mode()
def decode_step(model, cache: PagedKVCache, seq_ids, tokens, attention: str = "kernel") -> list[int]:
    """One decode step for a batch: token ``tokens[i]`` is fed to ``seq_ids[i]``; returns the next tokens.

    All or nothing: on any error (even from a layer in the middle of the model) the cache is exactly
    as before, so a retry does not count a token twice."""
    _check_model_and_cache(model, cache, attention)
    if isinstance(seq_ids, (str, bytes, torch.Tensor)) or not hasattr(seq_ids, "__iter__"):
        raise TypeError(f"seq_ids must be a list of sequence ids, got {type(seq_ids).__name__}")
    seq_ids = list(seq_ids)
    tokens = _check_tokens("tokens", tokens, model.config.vocab_size)
    if not seq_ids or len(tokens) != len(seq_ids):
        raise ValueError(f"seq_ids and tokens must be non-empty and of equal length, got {len(seq_ids)} "
                         f"and {len(tokens)}")
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"seq_ids must be distinct, got {seq_ids}")
    for seq_id in seq_ids:
        counts = cache._require_resident(seq_id).layer_tokens
        if len(set(counts)) != 1:
            raise ValueError(f"sequence {seq_id} is mid-step (tokens per layer {counts})")
    needed = sum(cache.blocks_to_append(s) for s in seq_ids)
    if needed > cache.num_free:
        raise cache._out_of_blocks(needed)
    ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=model.device)
    positions = cache.seq_lens(seq_ids).to(torch.long)[:, None]  # the new token's position
    with cache._all_or_nothing():
        out = model(ids, position_ids=positions, use_cache=False, logits_to_keep=1,
                    paged=PagedBatch(cache, seq_ids, attention))
    return out.logits[:, -1].argmax(dim=-1).tolist()


# --------------------------------------------------------------------------- a small scheduler


@dataclass
class _Request:
    index: int
    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    seq_id: int | None = None
    swapped: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated


@dataclass
class PagedRun:
    """What :func:`paged_generate` did: the tokens, and how often it preempted (section 9.5)."""

    tokens: list[list[int]]
    steps: int
    preemptions: int
    recomputed_tokens: int
    swapped_blocks: int
    peak_blocks: int


def _check_generate_args(prompts, max_new_tokens, attention, preemption, max_batch, block_size, num_blocks, vocab):
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a non-empty list of token-id lists (or 1-D tensors)")
    integer("max_new_tokens", max_new_tokens, 1)
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    if preemption not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
    integer("max_batch", max_batch, 1)
    integer("block_size", block_size, 1)
    if num_blocks is not None:
        integer("num_blocks", num_blocks, 1)
    for i, prompt in enumerate(prompts):
        if not _check_tokens(f"prompts[{i}]", prompt, vocab):
            raise ValueError(f"prompts[{i}] must hold at least one token")


def paged_generate(model, prompts, max_new_tokens: int, block_size: int = 16, num_blocks: int | None = None,
                   attention: str = "kernel", preemption: str = "recompute", max_batch: int = 64) -> PagedRun:
    """Greedy decoding of several prompts (of any lengths, unpadded) on a paged KV cache (section 9.5).

    Each step: swapped-out requests come back first, then waiting prompts are prefilled (first
    come, first served) while blocks and ``max_batch`` allow; then every running request decodes
    one token in one batched call. When the step needs more blocks than are free, the newest
    running request is preempted: ``recompute`` frees its blocks and later prefills its prompt and
    generated tokens again; ``swap`` copies its blocks to host memory and back. ``num_blocks``
    defaults to enough for every request at once (no preemption).
    """
    _check_generate_args(prompts, max_new_tokens, attention, preemption, max_batch, block_size, num_blocks,
                         model.config.vocab_size)
    requests = [_Request(i, [int(t) for t in p]) for i, p in enumerate(prompts)]
    longest = max(len(r.prompt) for r in requests) + max_new_tokens
    per_request = -(-longest // block_size)
    num_blocks = num_blocks if num_blocks is not None else per_request * len(requests)
    cache = cache_for(model, num_blocks, block_size)
    if num_blocks < per_request:  # the longest request could never run, even alone
        raise cache._out_of_blocks(per_request)
    use_paged_attention(model)
    scheduler = _Scheduler(model, cache, requests, max_new_tokens, attention, preemption, max_batch)
    scheduler.run()
    return PagedRun([r.generated for r in requests], scheduler.steps, sum(cache.preemptions.values()),
                    scheduler.recomputed_tokens, scheduler.swapped_blocks, scheduler.peak_blocks)


class _Scheduler:
    def __init__(self, model, cache, requests, max_new_tokens, attention, preemption, max_batch):
        self.model, self.cache, self.max_new_tokens = model, cache, max_new_tokens
        self.attention, self.preemption, self.max_batch = attention, preemption, max_batch
        self.waiting = deque(requests)
        self.swapped: deque = deque()
        self.running: list[_Request] = []
        self.steps = self.recomputed_tokens = self.swapped_blocks = self.peak_blocks = 0

    def run(self) -> None:
        while self.waiting or self.swapped or self.running:
            self.steps += 1
            self._resume_and_admit()
            self._make_room()
            if self.running:
                self._decode()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cache.block_size)

    def _resume_and_admit(self) -> None:
        while self.swapped and len(self.running) < self.max_batch:
            request = self.swapped[0]
            if self._blocks_for(len(request.tokens) - 1) > self.cache.num_free:
                return
            self.cache.swap_in(self.swapped.popleft().seq_id)
            self.running.append(request)
        while self.waiting and len(self.running) < self.max_batch:
            request = self.waiting[0]
            if self._blocks_for(len(request.tokens)) > self.cache.num_free:
                return
            self.waiting.popleft()
            self._prefill(request)

    def _prefill(self, request: _Request) -> None:
        """Prompt (and, after a recompute preemption, the tokens generated so far) in one pass."""
        if request.seq_id is None:
            request.seq_id = self.cache.new_sequence()
        elif request.generated:
            self.recomputed_tokens += len(request.tokens)
        token = prefill(self.model, self.cache, request.seq_id, request.tokens, self.attention)
        request.generated.append(token)
        self._retire_if_done(request, running=False)

    def _retire_if_done(self, request: _Request, running: bool = True) -> None:
        if len(request.generated) >= self.max_new_tokens:
            self.cache.free(request.seq_id)
            if running:
                self.running.remove(request)
        elif not running:
            self.running.append(request)

    def _make_room(self) -> None:
        """Preempt the newest running requests until this step's appends fit."""
        while self.running:
            needed = sum(self.cache.blocks_to_append(r.seq_id) for r in self.running)
            if needed <= self.cache.num_free:
                return
            victim = self.running.pop()
            if self.preemption == "swap":
                self.swapped_blocks += len(self.cache.table(victim.seq_id).blocks)
                self.cache.preempt(victim.seq_id, "swap")
                self.swapped.appendleft(victim)
            else:
                self.cache.preempt(victim.seq_id, "recompute")
                self.waiting.appendleft(victim)

    def _decode(self) -> None:
        batch = list(self.running)
        ids = [r.seq_id for r in batch]
        next_tokens = decode_step(self.model, self.cache, ids, [r.generated[-1] for r in batch], self.attention)
        self.peak_blocks = max(self.peak_blocks, self.cache.num_blocks - self.cache.num_free)
        for request, token in zip(batch, next_tokens):
            request.generated.append(token)
            self._retire_if_done(request)


# --------------------------------------------------------------------------- measured costs


@dataclass(frozen=True)
class PreemptionCost:
    """Measured cost of taking one sequence's blocks away and giving them back (section 9.5).

    ``recompute``: drop the blocks, then prefill the ``tokens`` again with the real model into
    fresh blocks. ``swap``: copy the blocks to host memory (pinned on a GPU) and back.
    Both are :class:`kvlab.lab.timing.Timing` of the whole round trip.
    """

    tokens: int
    blocks: int
    swap_bytes: int  # bytes copied to the host and back (both directions)
    recompute: object
    swap: object


def measure_preemption_cost(model, num_tokens: int, block_size: int = 16, warmup: int = 1, reps: int = 3,
                            seed: int = 0) -> PreemptionCost:
    """Time recompute and swap of one ``num_tokens``-token sequence on ``model``, interleaved (section 9.5).

    On a CPU the cache is written with ``store_kv_ref`` (the Triton interpreter would time Python,
    not memory); on a GPU with the ``store_kv`` kernel.
    """
    from kvlab.lab.hardware import on_gpu
    from kvlab.kernels import store_kv_ref
    from kvlab.lab.timing import measure

    integer("num_tokens", num_tokens, 2)
    integer("block_size", block_size, 1)
    integer("reps", reps, 1)
    integer("warmup", warmup, 0)
    use_paged_attention(model)
    blocks = -(-num_tokens // block_size)
    cache = cache_for(model, blocks, block_size, store=None if on_gpu() else store_kv_ref)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=generator).tolist()
    seq = cache.new_sequence()
    prefill(model, cache, seq, tokens)

    def recompute():
        cache.preempt(seq, "recompute")
        prefill(model, cache, seq, tokens)

    def swap():
        cache.preempt(seq, "swap")
        cache.swap_in(seq)

    timings = {"recompute": [], "swap": []}
    for _ in range(reps):  # interleaved, so that drift on a shared machine hits both alike
        timings["recompute"].append(measure(recompute, warmup=warmup, reps=1, device=model.device))
        timings["swap"].append(measure(swap, warmup=warmup, reps=1, device=model.device))
    merged = {k: _merge_timings(v) for k, v in timings.items()}
    return PreemptionCost(num_tokens, blocks, 2 * blocks * cache.bytes_per_block, merged["recompute"], merged["swap"])


def _merge_timings(parts):
    from kvlab.lab.timing import Timing

    times = tuple(t for part in parts for t in part.times)
    ordered = sorted(times)
    return Timing(ordered[len(ordered) // 2], ordered[0], ordered[-1], times)


# --- swap's transfer: many small copies against one large one (section 9.5) -----------------------

@dataclass(frozen=True)
class HostCopy:
    """Moving ``blocks`` blocks of ``block_bytes`` each from the device to host memory, timed one
    copy per block (``per_block``) and as one copy of the same bytes (``one_copy``)."""

    block_bytes: int
    blocks: int
    per_block: object  # Timing
    one_copy: object  # Timing

    @property
    def total_bytes(self) -> int:
        return self.block_bytes * self.blocks

    @property
    def bytes_per_s(self) -> float:
        """Rate of the block-by-block copy."""
        return self.total_bytes / self.per_block.median

    @property
    def one_copy_bytes_per_s(self) -> float:
        return self.total_bytes / self.one_copy.median

    @property
    def efficiency(self) -> float:
        """Block-by-block rate as a fraction of the one-copy rate."""
        return self.one_copy.median / self.per_block.median


def _copy_blocks(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool) -> None:
    """One copy per row: the way a swap that copies block by block moves a cache."""
    for i in range(src.shape[0]):
        dst[i].copy_(src[i], non_blocking=non_blocking)


def measure_host_copy(total_bytes: int, block_bytes, device=None, warmup: int = 1, reps: int = 5) -> list[HostCopy]:
    """Time a swap-out's transfer against block size (section 9.5): ``total_bytes`` of device
    memory copied to host memory as one copy per block of each size in ``block_bytes``, and as one
    copy. On a GPU the host buffer is pinned and the copies cross PCIe; on a CPU "host" and
    "device" are the same DRAM, and the per-copy cost is dispatch. The PagedAttention paper
    measured swap losing to recompute at small block sizes for this reason: many small transfers
    use the link poorly. (``PagedKVCache`` gathers a sequence's blocks on the device and moves them
    in one copy per layer stack, which avoids it.)

    Each block size copies the largest whole number of its blocks that fits in ``total_bytes``.
    Returns one ``HostCopy`` per block size, in the order given.
    """
    from kvlab._checks import integer
    from kvlab.lab.hardware import device as default_device
    from kvlab.lab.timing import measure

    total_bytes = integer("total_bytes", total_bytes, 4)
    sizes = [block_bytes] if isinstance(block_bytes, int) and not isinstance(block_bytes, bool) else list(block_bytes)
    if not sizes:
        raise ValueError("block_bytes must name at least one block size")
    for b in sizes:
        integer("block_bytes", b, 4, total_bytes + 1)
        if b % 4:
            raise ValueError(f"block_bytes must be a multiple of 4 (fp32 elements), got {b}")
    dev = torch.device(device) if device is not None else default_device()
    pin = dev.type == "cuda"
    src = torch.empty(total_bytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty(total_bytes // 4, dtype=torch.float32, pin_memory=pin)
    results = []
    for b in sizes:
        blocks = total_bytes // b
        rows_src = src[: blocks * b // 4].view(blocks, b // 4)
        rows_dst = dst[: blocks * b // 4].view(blocks, b // 4)
        per_block = measure(lambda: _copy_blocks(rows_src, rows_dst, pin), warmup=warmup, reps=reps, device=dev)
        one = measure(lambda: rows_dst.copy_(rows_src, non_blocking=pin), warmup=warmup, reps=reps, device=dev)
        results.append(HostCopy(b, blocks, per_block, one))
    return results


@dataclass(frozen=True)
class AttentionTiming:
    """One decode step of attention over ``batch`` sequences of ``context`` tokens (section 9.5)."""

    paged: object  # Timing of the paged path
    contiguous: object  # Timing of torch SDPA over a contiguous [batch, kv_heads, context, head_dim] cache
    kv_bytes: int  # K and V bytes one step must read
    path: str  # "kernel" or "reference"

    @property
    def paged_bytes_per_s(self) -> float:
        return self.kv_bytes / self.paged.median

    @property
    def contiguous_bytes_per_s(self) -> float:
        return self.kv_bytes / self.contiguous.median


def compare_attention(batch: int, context: int, block_size: int = 16, num_q_heads: int = 8, num_kv_heads: int = 2,
                      head_dim: int = 64, dtype=None, path: str | None = None, identity_table: bool = False,
                      num_splits: int | None = None, warmup: int = 2, reps: int = 5,
                      seed: int = 0) -> AttentionTiming:
    """Paged decode attention against torch SDPA on a contiguous cache, same data, interleaved (section 9.5).

    ``path`` defaults to the Triton kernel on a GPU and, on a CPU (where the interpreter's speed says
    nothing about the kernel), to ``"gather"``, the vectorised PyTorch paged path;
    ``"reference"`` is the per-sequence plain-PyTorch reference of ``kvlab.kernels``. The paged
    cache's blocks are a random permutation of the pool, or in order with ``identity_table``.
    The kernel path validates its inputs once and times the launches alone; ``num_splits`` is
    passed to it (None: its automatic choice).
    """
    from kvlab.lab.hardware import device_and_dtype, on_gpu
    from kvlab.lab.timing import measure

    path = path or ("kernel" if on_gpu() else "gather")
    if path not in ATTENTION_PATHS:
        raise ValueError(f"path must be one of {ATTENTION_PATHS}, got {path!r}")
    for name, value in (("batch", batch), ("context", context), ("block_size", block_size),
                        ("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("reps", reps)):
        integer(name, value, 1)
    integer("warmup", warmup, 0)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    dev, dtype = device_and_dtype(None, dtype)
    generator = torch.Generator().manual_seed(seed)
    per_seq = -(-context // block_size)
    order = torch.arange(batch * per_seq) if identity_table else torch.randperm(batch * per_seq, generator=generator)
    table = order.reshape(batch, per_seq).to(dev, torch.int32)
    pool_shape = (batch * per_seq, block_size, num_kv_heads, head_dim)
    k_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    v_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    # The same keys and values, laid out contiguously per sequence for SDPA.
    k_flat = k_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    v_flat = v_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    q = torch.randn(batch, num_q_heads, head_dim, generator=generator).to(dev, dtype)
    if path == "kernel":
        from kvlab.kernels import paged_decode_launcher

        paged = paged_decode_launcher(q, k_pool, v_pool, table, lens, num_splits=num_splits)
    else:
        attend = _decode_attention(path)

        def paged():
            return attend(q, k_pool, v_pool, table, lens)

    def contiguous():
        return F.scaled_dot_product_attention(q[:, :, None], k_flat, v_flat, enable_gqa=True)

    with torch.inference_mode():
        torch.testing.assert_close(paged().float(), contiguous()[:, :, 0].float(), atol=2e-2, rtol=2e-2)
        runs = {"paged": [], "contiguous": []}
        for _ in range(reps):
            runs["paged"].append(measure(paged, warmup=warmup if not runs["paged"] else 0, reps=1))
            runs["contiguous"].append(measure(contiguous, warmup=warmup if not runs["contiguous"] else 0, reps=1))
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return AttentionTiming(_merge_timings(runs["paged"]), _merge_timings(runs["contiguous"]), kv_bytes, path)


def bench_rows():
    """Paged vs contiguous decode attention, and the admission simulator's figures (section 9.5)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate, on_gpu
    from kvlab.cache.paged import make_trace, simulate

    gpu = on_gpu()
    rows = []
    heads = (32, 8, 128) if gpu else (8, 2, 64)
    shape = dict(zip(("num_q_heads", "num_kv_heads", "head_dim"), heads))
    cases = [(32, 4096), (32, 16384), (1, 32768)] if gpu else [(4, 512), (4, 2048)]
    copy = calibrate().copy_bytes_per_s
    for batch, context in cases:
        t = compare_attention(batch, context, 16, reps=10 if gpu else 5, **shape)
        where = f"batch {batch}, context {context}, block 16"
        rows += [
            Row(f"paged attention b{batch} s{context}", t.paged_bytes_per_s / 1e9, "GB/s", f"{where}, {t.path} path"),
            Row(f"paged / copy bandwidth b{batch} s{context}", t.paged_bytes_per_s / copy, "fraction",
                "K+V bytes read once / calibrated copy bandwidth"),
            Row(f"SDPA contiguous b{batch} s{context}", t.contiguous_bytes_per_s / 1e9, "GB/s", f"{where}, contiguous cache"),
            Row(f"paged / SDPA time b{batch} s{context}", t.paged.median / t.contiguous.median, "x",
                "ratio of medians, same run"),
        ]
    if gpu:  # the kernel against itself: block-table indirection, and what split-K buys at batch 1
        permuted = compare_attention(32, 16384, 16, reps=10, **shape)
        ordered = compare_attention(32, 16384, 16, reps=10, identity_table=True, **shape)
        split = compare_attention(1, 32768, 16, reps=10, **shape)
        one = compare_attention(1, 32768, 16, reps=10, num_splits=1, **shape)
        rows += [
            Row("permuted / identity table time b32 s16384", permuted.paged.median / ordered.paged.median, "x",
                "same kernel; blocks in random order vs in order"),
            Row("num_splits=1 / split-K time b1 s32768", one.paged.median / split.paged.median, "x",
                "same kernel; automatic num_splits vs one split"),
        ]
    # swap's transfer: one copy per 16-token block of one layer's K (Llama-3-8B: 16 x 8 x 128 x 2 bytes)
    # against one copy of the same bytes; on a GPU device-to-pinned-host over PCIe
    total = (256 << 20) if gpu else (32 << 20)
    for r in measure_host_copy(total, [16 * 8 * 128 * 2, 1 << 20], reps=5):
        rows.append(Row(f"host copy in {r.block_bytes // 1024} KiB blocks / one copy", r.efficiency, "fraction",
                        f"{r.blocks} copies of {r.block_bytes:,} B against one of {r.total_bytes:,} B, same run"))
    trace = make_trace(200, "lognormal", mean_prompt=64, mean_output=128, max_len=512, seed=0)
    for policy in ("reserve-max", "reserve-estimate", "paged"):
        result = simulate(trace, policy, budget_tokens=8192, block_size=16, max_len=512)
        note = "200 lognormal requests, 8192-token budget, block 16"
        rows += [
            Row(f"{policy}: KV memory wasted", 100 * result.waste_fraction, "%", note),
            Row(f"{policy}: mean running batch", result.mean_batch, "requests", note),
            Row(f"{policy}: steps to finish the trace", result.steps, "steps", note),
        ]
    return rows
