"""A continuous-batching engine on the paged KV cache (notebook 11, beyond one request).

The parts of section 9.5 running together, in the shape of nano-vllm and vLLM:

- :class:`Request`: one prompt, its generated tokens, where it is in its life, and its timings.
- a **block manager**, one object the scheduler calls: :class:`kvlab.cache.prefix.PrefixCache` with
  prefix caching on, :class:`PlainBlocks` without (the same calls, never a hit). It only moves
  block ids; the K and V live in the runner's pools.
- :class:`Scheduler`: each step, it makes room for the running requests' next tokens (preempting
  the newest when blocks run out), brings swapped requests back, then admits waiting ones while
  blocks (above a watermark), ``max_batch`` and the step's token budget allow; long prompts are
  prefilled in chunks of that budget.
- :class:`ModelRunner`: builds the step's metadata once (slots, block tables, lengths, the
  prefill mask), runs the Hugging Face model once over every scheduled token, and samples greedily.
  Every layer stores its new K and V, then attends: one-token entries through the paged decode
  attention (the Triton kernel on a GPU), prefill chunks through SDPA over their gathered context.
  On a GPU, decode-only steps replay CUDA graphs captured per batch size.
- :class:`Engine`: ``add_request`` / ``step`` / ``generate``, an event log and metrics.

The pools have :class:`kvlab.cache.paged.PagedKVCache`'s layout (``[num_blocks, block_size, kv_heads,
head_dim]`` per layer) but are not one: a ``PagedKVCache`` keeps a block table per sequence of its
own, while here the block manager owns the tables and the runner only reads them, once per step.
The last part of the file measures the engine: request traces (:func:`make_requests`), padded
static ``generate`` batches (:func:`static_generate`), the two compared (:func:`compare_with_generate`)
and the latency-throughput curve (:func:`latency_throughput`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F

from kvlab import _checks
from kvlab.kernels import paged_decode_attention_ref  # also switches on the Triton interpreter without CUDA
from kvlab.serving.paged_decode import _gather_attention
from kvlab.cache.paged import PREEMPTION_MODES, BlockAllocator, copy_blocks_to_host

ATTN_NAME = "kvlab_engine"
ATTENTION_PATHS = ("kernel", "gather", "reference")
SUPPORTED_MODELS = ("llama", "qwen2", "mistral")
CPU_KV_BUDGET_BYTES = 64 * 2**20  # the pool on a CPU, when num_blocks is not given
GPU_MEMORY_FRACTION = 0.9  # of the memory free after the weights, on a GPU
WATERMARK = 0.01  # share of the pool admission leaves free, so that a new request does not force a preemption


# --------------------------------------------------------------------------- requests


@dataclass(eq=False)  # a request is itself: compared by identity
class Request:
    """One request's life: ``waiting`` -> ``running`` (prefill in chunks, then decode) -> ``finished``,
    possibly ``preempted`` back to ``waiting`` (recompute) or to ``swapped`` on the way; or ``rejected``.

    ``num_computed`` tokens of ``tokens`` have their K and V in the pool; the block manager holds
    ``held`` tokens' slots (all of the prompt from admission on; one more token per decode step).
    """

    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float
    output: list[int] = field(default_factory=list)
    state: str = "waiting"
    seq: int | None = None  # the block manager's id while the request holds blocks
    held: int = 0
    num_computed: int = 0
    host_kv: tuple | None = None  # K and V copied to the host while swapped out
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    admitted_tokens: int = 0  # tokens handed to the block manager over all admissions
    cached_tokens: int = 0  # of which the prefix cache already held
    error: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def decoding(self) -> bool:
        """Every token but the newest is in the pool: the next step feeds that one."""
        return self.state == "running" and self.num_computed == self.held == len(self.prompt) + len(self.output) - 1

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds."""
        if self.finish_time is None or len(self.output) < 2:
            return None
        return (self.finish_time - self.first_token_time) / (len(self.output) - 1)


@dataclass(frozen=True)
class Event:
    """One line of the engine's log: at ``step``, request ``request`` did ``kind`` (``detail``: tokens or mode)."""

    step: int
    request: int
    kind: str  # arrive, reject, admit, prefill, decode, preempt, resume, finish
    detail: object = None


# --------------------------------------------------------------------------- block managers


class PlainBlocks:
    """Block bookkeeping without prefix caching: :class:`~kvlab.cache.prefix.PrefixCache`'s calls, never a hit."""

    def __init__(self, num_blocks: int, block_size: int):
        self.allocator = BlockAllocator(num_blocks)
        self.num_blocks, self.block_size = num_blocks, block_size
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next = 0

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def admit(self, token_ids, salt=None) -> tuple[int, int]:
        blocks = self.allocator.allocate_many(-(-len(token_ids) // self.block_size))
        seq, self._next = self._next, self._next + 1
        self._tables[seq], self._lengths[seq] = blocks, len(token_ids)
        return seq, 0

    def blocks_to_admit(self, token_ids, salt=None) -> int:
        return -(-len(token_ids) // self.block_size)

    def append(self, seq: int, token_id: int) -> None:
        if self._lengths[seq] % self.block_size == 0:
            self._tables[seq].append(self.allocator.allocate())
        self._lengths[seq] += 1

    def free(self, seq: int) -> None:
        for block in self._tables.pop(seq):
            self.allocator.free(block)
        del self._lengths[seq]

    def block_table(self, seq: int) -> list[int]:
        return list(self._tables[seq])

    def ref_count(self, block: int) -> int:
        return self.allocator.ref_count(block)


def _prefix_cache(num_blocks: int, block_size: int):
    from kvlab.cache.prefix import PrefixCache

    return PrefixCache(num_blocks, block_size)


# --------------------------------------------------------------------------- scheduling


@dataclass
class Scheduled:
    """One entry of a step: feed ``request.tokens[start:start + count]`` at positions ``start..``."""

    request: Request
    start: int
    count: int
    kind: str  # "decode" or "prefill"

    @property
    def completes(self) -> bool:
        """After this entry every token of the request is in the pool: its last logits give the next token."""
        return self.start + self.count == len(self.request.prompt) + len(self.request.output)


class Scheduler:
    """Who runs this step, and with how many tokens (notebook 11).

    Order of one step: (1) make room for every decoding request's next token, preempting the
    newest decoding request while blocks are short (a request in the middle of its prefill is never
    the victim: its blocks are reserved and half written, and with prefix caching already named by
    their hashes); (2) if nothing was preempted, bring swapped requests back, oldest first; (3) one
    token for each decoding request; (4) the next prefill chunk of each running request, first come
    first served, within ``max_batched_tokens``; (5) if nothing is swapped or was preempted, admit
    waiting requests while ``max_batch``, the token budget and the blocks allow. Admission asks the
    block manager how many free blocks the request would take (a prefix hit on a block someone holds
    takes none) and leaves a watermark free unless nothing else is running.

    A request that reads a block another request has admitted but not yet written (a prefix hit on
    a prompt still being prefilled, or on a block a decode step is filling) waits, its step given no
    tokens, until that block is written.
    """

    def __init__(self, blocks, block_size, max_batch, max_batched_tokens, preemption, watermark_blocks, runner, log):
        self.blocks, self.block_size = blocks, block_size
        self.max_batch, self.max_batched_tokens = max_batch, max_batched_tokens
        self.preemption, self.watermark_blocks = preemption, watermark_blocks
        self.runner, self.log = runner, log
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> list[Scheduled]:
        preempted = self._make_room()
        if not preempted:
            self._swap_in()
        unready = self._unready_blocks()
        decoding = [r for r in self.running if r.decoding and self._ready(r, unready)]
        for request in decoding:
            self.blocks.append(request.seq, request.tokens[-1])  # the slot of the token fed this step
            request.held += 1
        plan = [Scheduled(r, r.num_computed, 1, "decode") for r in decoding]
        budget = self.max_batched_tokens - len(plan)
        unready = self._unready_blocks()  # the blocks those appends filled are not written yet either
        for request in self.running:
            if budget and request not in decoding and request.num_computed < request.held and self._ready(
                    request, unready):
                budget -= self._plan_prefill(plan, request, budget)
        while (not preempted and not self.swapped and self.waiting and budget
               and len(self.running) < self.max_batch and self._can_admit(self.waiting[0])):
            request = self.waiting.popleft()
            self._admit(request)
            if self._ready(request, unready):
                budget -= self._plan_prefill(plan, request, budget)
            unready |= self._unwritten(request)
        return sorted(plan, key=lambda e: e.count > 1)  # one-token entries first: the decode attention takes them

    # -- preemption --------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _make_room(self) -> bool:
        """Preempt the newest decoding requests until every decoding request's next token has a slot."""
        preempted = False
        while True:
            decoding = [r for r in self.running if r.decoding]
            needed = sum(1 for r in decoding if r.held % self.block_size == 0)
            if needed <= self.blocks.num_free or not decoding:
                return preempted
            self._preempt(decoding[-1])
            preempted = True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        request.preemptions += 1
        if self.preemption == "swap":
            request.host_kv = self.runner.copy_out(self.blocks.block_table(request.seq), request.num_computed)
            request.state = "swapped"
            self.swapped.appendleft(request)
        else:
            request.num_computed = 0
            request.state = "waiting"
            self.waiting.appendleft(request)
        self.blocks.free(request.seq)
        request.seq, request.held = None, 0
        self.log(request, "preempt", self.preemption)

    def _swap_in(self) -> None:
        while self.swapped and len(self.running) < self.max_batch:
            request = self.swapped[0]
            if not self._fits(self.blocks.blocks_to_admit(request.tokens[: request.num_computed])):
                return
            self.swapped.popleft()
            seq, cached = self.blocks.admit(request.tokens[: request.num_computed])
            request.admitted_tokens += request.num_computed
            request.cached_tokens += cached
            first_copied = cached // self.block_size  # blocks the prefix cache still had need no copy
            self.runner.copy_in(self.blocks.block_table(seq)[first_copied:], request.host_kv, first_copied)
            request.seq, request.held, request.host_kv, request.state = seq, request.num_computed, None, "running"
            self.running.append(request)
            self.log(request, "resume", "swap")

    # -- admission and prefill ---------------------------------------------------------------

    def _fits(self, blocks: int) -> bool:
        if not self.running:  # alone, a request may use the whole pool (add_request checked it fits)
            return blocks <= self.blocks.num_free
        return blocks <= self.blocks.num_free - self.watermark_blocks

    def _can_admit(self, request: Request) -> bool:
        return self._fits(self.blocks.blocks_to_admit(request.tokens))

    def _admit(self, request: Request) -> None:
        tokens = request.tokens
        request.seq, cached = self.blocks.admit(tokens)
        request.held, request.num_computed, request.state = len(tokens), cached, "running"
        request.admitted_tokens += len(tokens)
        request.cached_tokens += cached
        self.running.append(request)
        self.log(request, "resume" if request.preemptions else "admit", cached)

    def _plan_prefill(self, plan: list[Scheduled], request: Request, budget: int) -> int:
        count = min(request.held - request.num_computed, budget)
        plan.append(Scheduled(request, request.num_computed, count, "prefill"))
        return count

    def _unwritten(self, request: Request) -> set[int]:
        """Blocks of ``request`` not yet completely written (the tokens it has not computed)."""
        return set(self.blocks.block_table(request.seq)[request.num_computed // self.block_size:])

    def _unready_blocks(self) -> set[int]:
        unready: set[int] = set()
        for request in self.running:
            unready |= self._unwritten(request)
        return unready

    def _ready(self, request: Request, unready: set[int]) -> bool:
        """Every block this request will read as already computed is written (by it or by another)."""
        done = self.blocks.block_table(request.seq)[: request.num_computed // self.block_size]
        return unready.isdisjoint(done)


# --------------------------------------------------------------------------- the model runner


@dataclass
class StepMetadata:
    """Everything the attention layers need besides q, k and v, built once per step (notebook 11).

    Tokens are packed ``[1, T]``: first ``num_decode`` one-token entries, then the prefill chunks.
    """

    k_pools: list
    v_pools: list
    slots: torch.Tensor  # int64 [T]: where each new token's K and V go (block * block_size + offset)
    num_decode: int
    decode_tables: torch.Tensor  # int32 [num_decode, width]
    decode_lens: torch.Tensor  # int32 [num_decode]: context length, new token included
    context_slots: torch.Tensor  # int64 [K]: the prefill chunks' contexts, gathered from the pool
    prefill_mask: torch.Tensor  # bool [1, 1, T - num_decode, K]: query may see key
    attend: object  # the decode attention: (q, k_pool, v_pool, tables, lens, scale) -> out
    num_splits: int | None = None  # fixed split-K count (CUDA graphs); None: chosen per step


def engine_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     engine_step: StepMetadata | None = None, **kwargs):
    """The attention function registered as ``"kvlab_engine"`` (notebook 11).

    Store every new token's K and V in this layer's pools, then attend: decode entries with the
    paged decode attention over their block tables, prefill chunks with SDPA over their context.
    """
    if engine_step is None:
        raise ValueError(f"attention '{ATTN_NAME}' needs the engine_step= keyword; run the model through kvlab.serving.engine")
    meta, layer = engine_step, module.layer_idx
    k_pool, v_pool = meta.k_pools[layer], meta.v_pools[layer]
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, kv_heads, head_dim]
    k_pool.view(-1, heads, dim).index_copy_(0, meta.slots, k_new)
    v_pool.view(-1, heads, dim).index_copy_(0, meta.slots, v_new)
    outputs = []
    d = meta.num_decode
    if d:
        q = query[0, :, :d].transpose(0, 1).contiguous()  # [num_decode, q_heads, head_dim]
        out = meta.attend(q, k_pool, v_pool, meta.decode_tables, meta.decode_lens, scaling, meta.num_splits)
        outputs.append(out[None])
    if query.shape[2] > d:
        keys = k_pool.view(-1, heads, dim)[meta.context_slots].transpose(0, 1)[None]  # [1, kv_heads, K, dim]
        values = v_pool.view(-1, heads, dim)[meta.context_slots].transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(query[:, :, d:], keys, values, attn_mask=meta.prefill_mask,
                                             scale=scaling, enable_gqa=True)
        outputs.append(out.transpose(1, 2))
    return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0], None


def _kernel_attend(q, k_pool, v_pool, tables, lens, scale, num_splits):
    """The Triton kernel without its per-call checks: the runner validated the step's metadata once."""
    from kvlab.kernels.paged_attention import _launch, choose_num_splits, multiprocessor_count

    if num_splits is None:
        longest = tables.shape[1] * k_pool.shape[1]
        num_splits = choose_num_splits(q.shape[0], k_pool.shape[2], longest, multiprocessor_count(q.device))
    return _launch(q, k_pool, v_pool, tables, lens, scale if scale is not None else q.shape[-1] ** -0.5, num_splits)


def _gather_attend(q, k_pool, v_pool, tables, lens, scale, num_splits):
    """The gather path without its per-call checks (a host sync per layer): the runner validated the step's
    metadata once."""
    return _gather_attention(q, k_pool, v_pool, tables, lens, scale)


def _reference_attend(q, k_pool, v_pool, tables, lens, scale, num_splits):
    return paged_decode_attention_ref(q, k_pool, v_pool, tables, lens, scale=scale)


ATTEND = {"kernel": _kernel_attend, "gather": _gather_attend, "reference": _reference_attend}


def _model_geometry(model) -> tuple[int, int, int]:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


class ModelRunner:
    """The pools, the step's metadata, one forward pass per step, greedy sampling (notebook 11).

    The pools hold ``num_blocks + 1`` blocks: the last is a scratch block that padded rows of a
    CUDA-graph batch write to and read from, never handed out.
    """

    def __init__(self, model, num_blocks: int, block_size: int, attention: str, cuda_graphs: bool, max_batch: int):
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_NAME, engine_attention)
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.device, self.dtype = model.device, model.dtype
        self.num_layers, self.kv_heads, self.head_dim = _model_geometry(model)
        shape = (num_blocks + 1, block_size, self.kv_heads, self.head_dim)
        self.k_pools = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.v_pools = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.scratch = num_blocks
        self.attention = attention
        self.graphs = None
        if cuda_graphs and self.device.type == "cuda":
            try:
                self.graphs = CudaGraphs(self, max_batch)
            except RuntimeError as error:  # a model whose forward cannot be captured still runs, eagerly
                warnings.warn(f"CUDA-graph capture failed, decoding eagerly: {error}", RuntimeWarning, stacklevel=3)

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.kv_heads * self.head_dim * element

    # -- swap --------------------------------------------------------------------------------

    def copy_out(self, table: list[int], num_tokens: int) -> tuple:
        """The K and V of a request's first ``num_tokens`` tokens, copied to host memory (pinned on a GPU)."""
        return copy_blocks_to_host(self.k_pools, self.v_pools, table[: -(-num_tokens // self.block_size)])

    def copy_in(self, blocks: list[int], host_kv: tuple, first: int) -> None:
        """Write host copies of logical blocks ``first, first + 1, ...`` into physical ``blocks``."""
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        for pools, host in zip((self.k_pools, self.v_pools), host_kv):
            for layer, pool in enumerate(pools):
                pool[index] = host[layer, first: first + len(blocks)].to(self.device, non_blocking=True)

    # -- one step ----------------------------------------------------------------------------

    def metadata(self, plan: list[Scheduled], tables: list[list[int]]) -> StepMetadata:
        """The step's slots, decode block tables and lengths, prefill contexts and mask, checked once."""
        bs = self.block_size
        slots, context, q_owner, q_pos, k_owner, k_pos = [], [], [], [], [], []
        decode_rows, decode_lens = [], []
        for i, (entry, table) in enumerate(zip(plan, tables)):
            end = entry.start + entry.count
            if len(table) * bs < end or len(set(table)) != len(table):
                raise RuntimeError(f"request {entry.request.id}: block table {table} cannot hold {end} tokens")
            slots += [table[t // bs] * bs + t % bs for t in range(entry.start, end)]
            if entry.count == 1:
                decode_rows.append(table)
                decode_lens.append(end)
                continue
            context += [table[t // bs] * bs + t % bs for t in range(end)]
            q_owner += [i] * entry.count
            q_pos += range(entry.start, end)
            k_owner += [i] * end
            k_pos += range(end)
        if len(set(slots)) != len(slots):
            raise RuntimeError("two tokens of one step would write the same slot")
        width = max((len(t) for t in decode_rows), default=1)
        rows = [t + [self.scratch] * (width - len(t)) for t in decode_rows]
        dev = self.device
        q_owner, q_pos = torch.tensor(q_owner), torch.tensor(q_pos)
        k_owner, k_pos = torch.tensor(k_owner), torch.tensor(k_pos)
        mask = (q_owner[:, None] == k_owner[None, :]) & (k_pos[None, :] <= q_pos[:, None])
        return StepMetadata(
            self.k_pools, self.v_pools, torch.tensor(slots, dtype=torch.long, device=dev), len(decode_rows),
            torch.tensor(rows, dtype=torch.int32, device=dev).reshape(len(rows), width),
            torch.tensor(decode_lens, dtype=torch.int32, device=dev),
            torch.tensor(context, dtype=torch.long, device=dev), mask[None, None].to(dev), ATTEND[self.attention])

    @torch.inference_mode()
    def run(self, plan: list[Scheduled], tables: list[list[int]]) -> list[int]:
        """One forward pass over every scheduled token; the greedy next token of each entry.

        The plan lists decode entries first. Entries whose tokens are not all computed yet (a prefill
        chunk that is not the last) get a token too, which the engine ignores.
        """
        if self.graphs is not None and all(e.count == 1 for e in plan) and self.graphs.covers(tables):
            return self.graphs.run(plan, tables)
        meta = self.metadata(plan, tables)
        ids = [t for e in plan for t in e.request.tokens[e.start: e.start + e.count]]
        positions = [p for e in plan for p in range(e.start, e.start + e.count)]
        last = torch.tensor(list(accumulate(e.count for e in plan)), device=self.device) - 1
        logits = self._forward(torch.tensor([ids], device=self.device), torch.tensor([positions], device=self.device),
                               meta, last)
        return logits[0].argmax(dim=-1).tolist()

    def _forward(self, ids, positions, meta, logits_to_keep):
        """The model with the engine's attention switched on for this call only."""
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(ATTN_NAME)
        try:
            out = self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=logits_to_keep,
                             engine_step=meta)
        finally:
            self.model.set_attn_implementation(previous)
        return out.logits


class CudaGraphs:
    """Decode-only steps captured as CUDA graphs, one per batch size, and replayed (notebook 11, GPU only).

    A step with ``B`` decoding requests replays the graph of the smallest captured size ``>= B``;
    the extra rows feed token 0 at position 0 into the scratch block, and their outputs are dropped.
    The block tables are as wide as the longest sequence the pool or the model allows, so one graph
    serves every context length, and split-K uses a fixed count chosen for that width.
    Written for CUDA; kvlab's CPU path never constructs it.
    """

    def __init__(self, runner: ModelRunner, max_batch: int):
        self.runner = runner
        dev = runner.device
        positions = getattr(runner.model.config, "max_position_embeddings", None) or runner.num_blocks * runner.block_size
        self.width = min(runner.num_blocks, -(-positions // runner.block_size))
        self.sizes = sorted({1, 2, 4, 8, *range(16, max_batch + 1, 16), max_batch})
        self.sizes = [b for b in self.sizes if b <= max_batch]
        top = self.sizes[-1]
        self.ids = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.positions = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.slots = torch.zeros(top, dtype=torch.long, device=dev)
        self.tables = torch.full((top, self.width), runner.scratch, dtype=torch.int32, device=dev)
        self.lens = torch.ones(top, dtype=torch.int32, device=dev)
        self.graphs, self.logits = {}, {}
        self.capture()

    def covers(self, tables: list[list[int]]) -> bool:
        """A captured graph can run this decode step: the batch and every block table fit its buffers."""
        return len(tables) <= self.sizes[-1] and all(len(t) <= self.width for t in tables)

    def _meta(self, batch: int) -> StepMetadata:
        from kvlab.kernels.paged_attention import choose_num_splits, multiprocessor_count

        r = self.runner
        splits = choose_num_splits(batch, r.kv_heads, self.width * r.block_size, multiprocessor_count(r.device))
        empty = torch.zeros(0, dtype=torch.long, device=r.device)
        return StepMetadata(r.k_pools, r.v_pools, self.slots[:batch], batch, self.tables[:batch], self.lens[:batch],
                            empty, torch.zeros((1, 1, 0, 0), dtype=torch.bool, device=r.device), _kernel_attend, splits)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for batch in reversed(self.sizes):  # the largest first, so that the smaller ones reuse its memory
            meta = self._meta(batch)
            self.slots[:batch] = self.runner.scratch * self.runner.block_size
            args = (self.ids[:, :batch], self.positions[:, :batch], meta, 0)
            self.runner._forward(*args)  # warm-up outside the graph
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = self.runner._forward(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[batch] = graph

    def run(self, plan: list[Scheduled], tables: list[list[int]]) -> list[int]:
        r, bs = self.runner, self.runner.block_size
        batch = next(b for b in self.sizes if b >= len(plan))
        n = len(plan)
        ids = [e.request.tokens[e.start] for e in plan] + [0] * (batch - n)
        positions = [e.start for e in plan] + [0] * (batch - n)
        slots = [t[e.start // bs] * bs + e.start % bs for e, t in zip(plan, tables)]
        slots += [r.scratch * bs] * (batch - n)
        rows = [t + [r.scratch] * (self.width - len(t)) for t in tables] + [[r.scratch] * self.width] * (batch - n)
        lens = [e.start + 1 for e in plan] + [1] * (batch - n)
        self.ids[0, :batch].copy_(torch.tensor(ids), non_blocking=True)
        self.positions[0, :batch].copy_(torch.tensor(positions), non_blocking=True)
        self.slots[:batch].copy_(torch.tensor(slots), non_blocking=True)
        self.tables[:batch].copy_(torch.tensor(rows, dtype=torch.int32), non_blocking=True)
        self.lens[:batch].copy_(torch.tensor(lens, dtype=torch.int32), non_blocking=True)
        self.graphs[batch].replay()
        return self.logits[batch][0, :n].argmax(dim=-1).tolist()


# --------------------------------------------------------------------------- the engine


@dataclass
class EngineStats:
    """What the engine did since it was built or last reset (notebook 11)."""

    steps: int = 0
    wall_s: float = 0.0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    batch_sizes: list = field(default_factory=list)  # requests scheduled per step

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


class Engine:
    """Continuous batching over a Hugging Face causal LM on a paged KV cache (notebook 11).

    ``num_blocks=None`` sizes the pool from the memory free after the weights on a GPU
    (``GPU_MEMORY_FRACTION`` of it), or from ``kv_budget_bytes`` (default ``CPU_KV_BUDGET_BYTES``)
    on a CPU. ``attention`` picks the decode attention: ``"kernel"`` (the Triton kernel; the default
    on a GPU), ``"gather"`` (vectorised PyTorch, the default on a CPU where the kernel runs in
    Triton's interpreter) or ``"reference"``. ``cuda_graphs`` (default: on a GPU) replays decode
    steps as CUDA graphs. ``debug=True`` checks the allocator's invariants after every step.
    Decoding is greedy and runs each request for exactly its ``max_new_tokens`` (no stop token).
    """

    def __init__(self, model, num_blocks: int | None = None, block_size: int = 16, max_batch: int = 32,
                 max_batched_tokens: int = 2048, prefix_caching: bool = True, preemption: str = "recompute", *,
                 kv_budget_bytes: int | None = None, attention: str | None = None, cuda_graphs: bool | None = None,
                 watermark: float = WATERMARK, debug: bool = False):
        if getattr(model.config, "model_type", None) not in SUPPORTED_MODELS:
            raise ValueError(f"model must be one of the architectures {SUPPORTED_MODELS} (rotary positions, grouped "
                             f"KV heads), got {getattr(model.config, 'model_type', type(model).__name__)!r}")
        block_size = _checks.integer("block_size", block_size)
        max_batch = _checks.integer("max_batch", max_batch)
        max_batched_tokens = _checks.integer("max_batched_tokens", max_batched_tokens, low=max_batch)
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be a bool, got {prefix_caching!r}")
        on_cuda = model.device.type == "cuda"
        attention = attention or ("kernel" if on_cuda else "gather")
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        _check_kernel_shape(model, block_size, attention)
        if num_blocks is None:
            num_blocks = _pool_size(model, block_size, kv_budget_bytes)
        num_blocks = _checks.integer("num_blocks", num_blocks)
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.max_batch, self.max_batched_tokens = max_batch, max_batched_tokens
        self.prefix_caching, self.preemption, self.debug = prefix_caching, preemption, debug
        self.vocab_size = model.config.vocab_size
        self.window = _attention_window(model.config)
        self.runner = ModelRunner(model, num_blocks, block_size, attention,
                                  on_cuda if cuda_graphs is None else cuda_graphs and on_cuda, max_batch)
        self.blocks = _prefix_cache(num_blocks, block_size) if prefix_caching else PlainBlocks(num_blocks, block_size)
        watermark_blocks = math.ceil(watermark * num_blocks)
        self.scheduler = Scheduler(self.blocks, block_size, max_batch, max_batched_tokens, preemption,
                                   watermark_blocks, self.runner, self._log)
        self.requests: dict[int, Request] = {}
        self.events: list[Event] = []
        self.stats = EngineStats()
        self._next_id = self._idle_steps = 0

    # -- sizes -------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- requests ----------------------------------------------------------------------------

    def _check_prompt(self, prompt, name: str) -> list[int]:
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor of token ids, got shape {tuple(prompt.shape)}")
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(f"{name} must be a list of token ids, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError(f"{name} is empty: a request needs at least one prompt token")
        for i, t in enumerate(prompt):
            _checks.integer(f"{name}[{i}]", t, low=0, high=self.vocab_size)
        blocks = self._blocks_for(len(prompt))
        if blocks > self.num_blocks:
            raise ValueError(f"{name} has {len(prompt)} tokens: {blocks} blocks ({blocks * self.bytes_per_block:,} "
                             f"bytes) but the pool holds {self.num_blocks} blocks ({self.pool_bytes:,} bytes) in all")
        if self.window is not None and len(prompt) > self.window:
            raise ValueError(f"{name} has {len(prompt)} tokens, more than the model's attention window "
                             f"({self.window}); this engine attends to the whole context")
        return [int(t) for t in prompt]

    def add_request(self, prompt, max_new_tokens: int) -> Request:
        """Queue one request (``prompt``: token ids); returns it. Bad input raises before anything changes.

        A request that could never fit (its prompt and all but its last new token need more blocks
        than the pool has) is not queued: it comes back ``rejected``, ``error`` saying the bytes it
        needs and the bytes the pool has, and a warning says the same.
        """
        prompt = self._check_prompt(prompt, "prompt")
        max_new_tokens = _checks.integer("max_new_tokens", max_new_tokens)
        return self._add(prompt, max_new_tokens)

    def _add(self, prompt: list[int], max_new_tokens: int) -> Request:
        request = Request(self._next_id, prompt, max_new_tokens, time.perf_counter())
        self._next_id += 1
        self.requests[request.id] = request
        self._log(request, "arrive", len(prompt))
        longest = len(prompt) + max_new_tokens - 1  # the last token is never stored
        if self.window is not None and longest > self.window:
            return self._reject(request, f"its {longest} tokens exceed the model's attention window ({self.window})")
        blocks = self._blocks_for(longest)
        if blocks > self.num_blocks:
            return self._reject(request, f"it needs {blocks} blocks ({blocks * self.bytes_per_block:,} bytes: "
                                         f"{len(prompt)} prompt + {max_new_tokens - 1} generated tokens stored) "
                                         f"but the pool has {self.num_blocks} blocks ({self.pool_bytes:,} bytes)")
        self.scheduler.waiting.append(request)
        return request

    def _reject(self, request: Request, why: str) -> Request:
        request.state, request.error = "rejected", f"request {request.id} rejected: {why}"
        self._log(request, "reject")
        warnings.warn(request.error, RuntimeWarning, stacklevel=3)
        return request

    def _log(self, request: Request, kind: str, detail=None) -> None:
        self.events.append(Event(self.stats.steps, request.id, kind, detail))

    # -- stepping ----------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Request]:
        """Schedule, run one forward pass, sample; returns the requests that finished in this step."""
        start = time.perf_counter()
        self.stats.steps += 1
        plan = self.scheduler.schedule()
        finished = []
        if plan:
            tables = [self.blocks.block_table(e.request.seq) for e in plan]
            next_tokens = self.runner.run(plan, tables)
            now = time.perf_counter()
            for entry, token in zip(plan, next_tokens):
                finished += self._advance(entry, token, now)
        self._idle_steps = 0 if plan else self._idle_steps + 1
        if self._idle_steps > 2 and self.has_work():  # a scheduler bug, never a normal state: fail loudly
            raise RuntimeError(f"the scheduler made no progress for {self._idle_steps} steps: "
                               f"{len(self.scheduler.waiting)} waiting, {len(self.scheduler.running)} running, "
                               f"{len(self.scheduler.swapped)} swapped, {self.blocks.num_free} blocks free")
        self.stats.batch_sizes.append(len(plan))
        self.stats.wall_s += time.perf_counter() - start
        if self.debug:
            self.check_invariants()
        return finished

    def _advance(self, entry: Scheduled, token: int, now: float) -> list[Request]:
        request = entry.request
        request.num_computed += entry.count
        self._log(request, entry.kind, entry.count)
        if entry.kind == "prefill":
            self.stats.prefill_tokens += entry.count
        if not entry.completes:
            return []
        request.output.append(token)
        self.stats.generated_tokens += 1
        if request.first_token_time is None:
            request.first_token_time = now
        if len(request.output) < request.max_new_tokens:
            return []
        self.blocks.free(request.seq)
        request.seq, request.held, request.state, request.finish_time = None, 0, "finished", now
        self.scheduler.running.remove(request)
        self._log(request, "finish", len(request.output))
        return [request]

    def generate(self, prompts, max_new_tokens) -> list[list[int] | None]:
        """Greedy continuation of each prompt (a list of token-id lists), ``max_new_tokens`` each (an int
        or one per prompt); runs until every request has finished. A request that can never fit the pool
        is rejected (``None`` in its place, and a warning with the bytes it needs); the others complete.
        Every argument is checked before any request is queued.
        """
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise TypeError("prompts must be a non-empty list of token-id lists")
        checked = [self._check_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        if isinstance(max_new_tokens, (list, tuple)):
            if len(max_new_tokens) != len(prompts):
                raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {len(prompts)} prompts")
            counts = [_checks.integer(f"max_new_tokens[{i}]", n) for i, n in enumerate(max_new_tokens)]
        else:
            counts = [_checks.integer("max_new_tokens", max_new_tokens)] * len(prompts)
        requests = [self._add(p, n) for p, n in zip(checked, counts)]
        while self.has_work():
            self.step()
        return [r.output if r.state == "finished" else None for r in requests]

    # -- metrics and checks ------------------------------------------------------------------

    def metrics(self, requests=None) -> dict:
        """Per-request and total figures: time to first token, time per output token, tokens per second,
        batch size per step, preemptions and prefix hit rate (notebook 11)."""
        done = [r for r in (requests if requests is not None else self.requests.values()) if r.state == "finished"]
        ttfts = [r.ttft for r in done]
        tpots = [r.tpot for r in done if r.tpot is not None]
        admitted = sum(r.admitted_tokens for r in done)
        return {
            "requests": len(done),
            "generated_tokens": sum(len(r.output) for r in done),
            "tokens_per_s": self.stats.tokens_per_s,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "mean_tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "mean_batch": self.stats.mean_batch,
            "steps": self.stats.steps,
            "preemptions": sum(r.preemptions for r in done),
            "prefix_hit_rate": sum(r.cached_tokens for r in done) / admitted if admitted else 0.0,
        }

    def check_invariants(self) -> None:
        """The allocator's invariants (the debug hook the tests call after every step).

        Every block is counted once: free plus held equals the pool; a block's reference count equals
        the number of live requests holding it; no table names a block twice; a block two requests
        share sits at the same place in both, under the same tokens; each table covers its tokens.
        """
        holders: Counter = Counter()
        placed: dict[int, tuple[int, tuple]] = {}
        live = [r for r in self.requests.values() if r.seq is not None]
        for request in live:
            table = self.blocks.block_table(request.seq)
            _require(len(set(table)) == len(table), f"request {request.id}'s table names a block twice: {table}")
            _require(len(table) == self._blocks_for(request.held),
                     f"request {request.id} holds {request.held} tokens in {len(table)} blocks")
            _require(request.num_computed <= request.held, f"request {request.id} computed more than it holds")
            tokens = request.tokens
            for index, block in enumerate(table):
                _require(0 <= block < self.num_blocks, f"block {block} is outside the pool")
                holders[block] += 1
                content = (index, tuple(tokens[: (index + 1) * self.block_size]))
                if block in placed:
                    _require(placed[block] == content and len(content[1]) == (index + 1) * self.block_size,
                             f"block {block} is shared by tables that disagree on its place or tokens")
                placed.setdefault(block, content)
        _require(self.blocks.num_free + len(holders) == self.num_blocks,
                 f"free ({self.blocks.num_free}) + held ({len(holders)}) != pool ({self.num_blocks})")
        counts = getattr(self.blocks, "ref_count", None)
        if counts is not None:
            for block, n in holders.items():
                _require(counts(block) == n, f"block {block}: reference count {counts(block)}, holders {n}")
        if self.prefix_caching:  # a registered hash names exactly the tokens its holders have there
            from kvlab.cache.prefix import block_hashes

            for request in live:
                expected = block_hashes(request.tokens[: request.held], self.block_size)
                for index, block in enumerate(self.blocks.block_table(request.seq)[: len(expected)]):
                    registered = self.blocks.block_hash(block)
                    _require(registered in (None, expected[index]),
                             f"block {block} is cached under a hash other than its tokens' (request {request.id})")

    def all_blocks_free_or_cached(self) -> bool:
        """After the work is done: no block is held by anyone (each is free, or free and cached)."""
        return self.blocks.num_free == self.num_blocks and not any(r.seq is not None for r in self.requests.values())


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"engine invariant broken: {message}")


def _attention_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _check_kernel_shape(model, block_size: int, attention: str) -> None:
    if attention != "kernel":
        return
    from kvlab.kernels import SUPPORTED_HEAD_DIMS

    _, _, head_dim = _model_geometry(model)
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two for the Triton kernel, got {block_size}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the model's head_dim ({head_dim}) must be one of {SUPPORTED_HEAD_DIMS} for the kernel")


def _pool_size(model, block_size: int, kv_budget_bytes: int | None) -> int:
    """Blocks that fit the memory left after the weights (GPU) or ``kv_budget_bytes`` (CPU)."""
    layers, kv_heads, head_dim = _model_geometry(model)
    per_block = 2 * layers * block_size * kv_heads * head_dim * torch.empty((), dtype=model.dtype).element_size()
    if kv_budget_bytes is None:
        if model.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(model.device)
            kv_budget_bytes = int(GPU_MEMORY_FRACTION * free)
        else:
            kv_budget_bytes = CPU_KV_BUDGET_BYTES
    kv_budget_bytes = _checks.integer("kv_budget_bytes", kv_budget_bytes)
    if kv_budget_bytes < per_block:
        raise ValueError(f"kv_budget_bytes ({kv_budget_bytes:,}) must hold at least one block ({per_block:,} bytes)")
    return kv_budget_bytes // per_block


def timeline(events, num_steps: int) -> dict[int, list[str | None]]:
    """Each request's state at steps ``1 .. num_steps``, read from an engine's event log (notebook 11).

    A state is what the request did in that step (``prefill``, ``decode``) or, in a step that gave it
    no tokens, where it was: ``waiting`` (not yet admitted, or preempted by recompute), ``swapped``,
    ``stalled`` (running but given no tokens: the budget ran out, or a block it shares is still
    being written); ``None`` before it arrived and after it finished.
    """
    states: dict[int, list[str | None]] = {}
    carried: dict[int, str | None] = {}
    by_step: dict[int, list[Event]] = {}
    for event in events:
        by_step.setdefault(event.step, []).append(event)
    for step in range(0, num_steps + 1):
        worked = {}
        for event in by_step.get(step, []):
            states.setdefault(event.request, [None] * num_steps)
            if event.kind == "arrive":
                carried[event.request] = "waiting"
            elif event.kind in ("admit", "resume"):
                carried[event.request] = "stalled"
            elif event.kind == "preempt":
                carried[event.request] = "swapped" if event.detail == "swap" else "waiting"
            elif event.kind in ("prefill", "decode"):
                worked[event.request] = event.kind
            elif event.kind in ("finish", "reject"):
                worked.setdefault(event.request, carried.get(event.request))
                carried[event.request] = None
        if step == 0:
            continue
        for request, row in states.items():
            row[step - 1] = worked.get(request, carried.get(request))
    return states


# --------------------------------------------------------------------------- measured against generate


def make_requests(n: int, distribution: str = "lognormal", mean_prompt: float = 32, mean_output: float = 16,
                  max_len: int = 256, shared_prompts: int = 2, shared_len: int = 32, shared_fraction: float = 0.5,
                  vocab: int = 8192, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """A request trace for the engine (notebook 11): ``(prompts, max_new_tokens)``.

    Lengths come from :func:`kvlab.cache.paged.make_trace` (``distribution``, means, ``max_len``);
    a ``shared_fraction`` of the prompts begin with one of ``shared_prompts`` system prompts of
    ``shared_len`` tokens (chosen at random), the rest of each prompt is random token ids.
    """
    import numpy as np

    from kvlab.cache.paged import make_trace

    if not 0 <= shared_fraction <= 1:
        raise ValueError(f"shared_fraction must be in [0, 1], got {shared_fraction!r}")
    shared_prompts = _checks.integer("shared_prompts", shared_prompts, low=0)
    shared_len = _checks.integer("shared_len", shared_len, low=0)
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, vocab, shared_len).tolist() for _ in range(shared_prompts)]
    prompts, news = [], []
    for r in make_trace(n, distribution, mean_prompt, mean_output, max_len=max_len, seed=seed):
        own = rng.integers(0, vocab, r.prompt).tolist()
        shared = systems and rng.random() < shared_fraction
        prompts.append(systems[rng.integers(len(systems))] + own if shared else own)
        news.append(r.output)
    return prompts, news


def static_generate(model, prompts, max_new_tokens, batch_size: int) -> tuple[list[list[int]], list[float]]:
    """``model.generate`` the way a reader would batch it (notebook 11): ``batch_size`` requests at a time
    in arrival order, left-padded to the longest prompt, each batch run to its longest ``max_new_tokens``.

    Returns each request's own tokens (cut to its ``max_new_tokens``) and the time, from the start,
    at which its batch returned.
    """
    pad = model.generation_config.pad_token_id or 0
    model.set_attn_implementation("sdpa")
    outputs, done_at, start = [], [], time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        batch, news = prompts[first: first + batch_size], max_new_tokens[first: first + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max(news), do_sample=False,
                                 pad_token_id=pad)
        finished = time.perf_counter() - start
        outputs += [row[width: width + n].tolist() for row, n in zip(out, news)]
        done_at += [finished] * len(batch)
    return outputs, done_at


@dataclass(frozen=True)
class Comparison:
    """The engine and padded static ``generate`` batches on one trace (notebook 11)."""

    requests: int
    generated_tokens: int
    engine_s: float
    generate_s: float
    engine_latency_s: float  # mean time from arrival (all at t = 0) to a request's last token
    generate_latency_s: float
    same_tokens: bool
    engine_metrics: dict

    @property
    def engine_tokens_per_s(self) -> float:
        return self.generated_tokens / self.engine_s

    @property
    def generate_tokens_per_s(self) -> float:
        return self.generated_tokens / self.generate_s

    @property
    def speedup(self) -> float:
        return self.generate_s / self.engine_s


def compare_with_generate(model, prompts, max_new_tokens, max_batch: int = 8, block_size: int = 16,
                          num_blocks: int | None = None, prefix_caching: bool = True, reps: int = 1,
                          **engine_options) -> Comparison:
    """Time a fresh engine and padded static ``generate`` batches of ``max_batch`` on the same trace,
    interleaved ``reps`` times (the faster run of each kept), after one small warm-up of each."""
    reps = _checks.integer("reps", reps)
    options = dict(num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                   prefix_caching=prefix_caching, **engine_options)
    Engine(model, **options).generate(prompts[:2], 2)
    static_generate(model, prompts[:2], [2, 2], max_batch)
    best = None
    for _ in range(reps):
        expected, done_at = static_generate(model, prompts, list(max_new_tokens), max_batch)
        engine = Engine(model, **options)
        requests = [engine.add_request(p, n) for p, n in zip(prompts, max_new_tokens)]
        start = time.perf_counter()
        while engine.has_work():
            engine.step()
        engine_s = time.perf_counter() - start
        run = Comparison(len(prompts), sum(max_new_tokens), engine_s, done_at[-1],
                         sum(r.finish_time - start for r in requests) / len(requests), sum(done_at) / len(done_at),
                         [r.output for r in requests] == expected, engine.metrics())
        best = run if best is None else Comparison(
            run.requests, run.generated_tokens, min(run.engine_s, best.engine_s), min(run.generate_s, best.generate_s),
            min(run.engine_latency_s, best.engine_latency_s), min(run.generate_latency_s, best.generate_latency_s),
            run.same_tokens and best.same_tokens, run.engine_metrics)
    return best


@dataclass(frozen=True)
class CurvePoint:
    """One engine run of the latency-throughput curve (notebook 11)."""

    max_batch: int
    tokens_per_s: float
    mean_tpot_s: float
    mean_batch: float
    preemptions: int
    prefix_hit_rate: float


def latency_throughput(model, prompts, max_new_tokens, batches=(1, 2, 4, 8, 16), **engine_options) -> list[CurvePoint]:
    """The engine on one trace at each ``max_batch`` of ``batches``: tokens per second against time per
    output token (notebook 11). A fresh engine per point, so no point inherits another's cached prefixes."""
    points = []
    for max_batch in batches:
        engine = Engine(model, max_batch=max_batch, **engine_options)
        engine.generate(prompts, list(max_new_tokens))
        m = engine.metrics()
        points.append(CurvePoint(max_batch, m["tokens_per_s"], m["mean_tpot_s"] or 0.0, m["mean_batch"],
                                 m["preemptions"], m["prefix_hit_rate"]))
    return points


def bench_rows():
    """The engine against padded static ``generate`` batches on the same trace (notebook 11)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate, on_gpu
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    n, batch = (64, 64) if gpu else (24, 8)
    prompts, news = make_requests(n, mean_prompt=64 if gpu else 32, mean_output=64 if gpu else 16,
                                  max_len=512 if gpu else 128, vocab=model.config.vocab_size, seed=0)
    result = compare_with_generate(model, prompts, news, max_batch=batch, reps=2)
    where = f"{model.shape.name}, {n} requests, max_batch {batch}, {str(model.dtype).removeprefix('torch.')}"
    rows = [
        Row("engine / padded generate tokens/s", result.speedup, "x", f"{where}; same trace, one run"),
        Row("engine tokens/s", result.engine_tokens_per_s, "tokens/s", where),
        Row("engine mean latency / generate's", result.engine_latency_s / result.generate_latency_s, "x",
            "mean time from arrival to last token"),
        Row("engine tokens equal generate's", float(result.same_tokens), "bool", "greedy, per request"),
    ]
    if gpu:  # weight bytes read per step over the step time, against the calibrated copy bandwidth
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        steps = result.engine_metrics["steps"]
        achieved = weight_bytes * steps / result.engine_s
        rows += [Row("engine weight bandwidth", achieved / 1e9, "GB/s", "weight bytes x steps / wall time (KV reads not counted)"),
                 Row("engine / copy bandwidth", achieved / calibrate().copy_bytes_per_s, "fraction",
                     "1.0 = the weight-bandwidth floor at this batch")]
    return rows
