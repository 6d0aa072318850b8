"""Notebooks 05, 06 and 11: the attention function kvlab registers with Hugging Face transformers
(Wolf et al. 2020) in a stock Llama, Qwen2 or Mistral.

A step's tokens are packed into one row, ``[1, T]``, each chunk one sequence's committed slots;
:func:`build_step` builds its :class:`StepMetadata` once. Every layer's :func:`paged_attention`
first stores the layer's new K and V at their slots, every chunk's, and only then attends. So a
request admitted behind another in the same step (prefix sharing) reads blocks the other's chunk
fills in this very pass: at every layer their K and V are in the pool before any query reads it.
Three paths give the same result:

- ``"kernel"``: decode rows through the paged decode kernel, longer chunks through the paged
  prefill ("extend") kernel over each sequence's block table, as vLLM uses FlashAttention's varlen
  kernel (Dao 2023) and SGLang FlashInfer (Ye et al. 2025);
- ``"gather"``, PyTorch for a CPU (where the kernels run in Triton's interpreter): decode rows by
  gathering blocks, each longer chunk by SDPA over its gathered context, causally offset;
- ``"reference"``: every token as one fp64 row of :func:`kvlab.kernels.paged_decode_attention_ref`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from kvlab import kernels
from kvlab._checks import causal_lm, restoring
from kvlab.serving import _checks
from kvlab.serving._checks import ATTENTION_PATHS  # noqa: F401 (the three paths above)

ATTN_NAME = "kvlab_paged"


@dataclass
class StepMetadata:
    """What every layer needs besides q, k and v: first ``num_decode`` decode rows (the one-token
    chunks; every token on the reference path), then the longer chunks. Each path fills the fields
    it reads; tables are int32 ``[rows, width]``."""

    k_pools: list
    v_pools: list
    path: str
    slots: torch.Tensor  # int64 [T]: block * block_size + offset of each new K and V; -1 skips
    num_decode: int
    decode_tables: torch.Tensor
    decode_lens: torch.Tensor  # each decode row's context length, its new token included
    group: int = 1  # query heads per KV head, for which the kernel's tiles were planned
    prefill_tables: torch.Tensor | None = None  # "kernel": the longer chunks' tables, ...
    cu_query_lens: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    tiles: torch.Tensor | None = None
    prefill_context: torch.Tensor | None = None  # "gather": the longer chunks' context slots, ...
    prefill_spans: list | None = None  # per chunk (row0, row1, slot0, slot1)
    prefill_masks: list | None = None
    num_splits: int | None = None  # the decode kernel's split-K count (fixed for a CUDA graph)


def build_step(cache, chunks, path: str, group: int = 1, checked: bool = False) -> StepMetadata:
    """The metadata of a step; ``group``: the model's query heads per KV head."""
    if not checked:  # the engine's scheduler made its chunks; a caller's are checked here
        _checks.build_step(cache, chunks, path, group)
    spans = [(cache.block_table(seq), start, start + len(ids)) for seq, start, ids, *_ in chunks]
    bs, dev = cache.block_size, cache.device
    slots = [t[p // bs] * bs + p % bs for t, start, end in spans for p in range(start, end)]
    if path == "reference":  # every token as one decode row
        decode, longer = [(table, p + 1) for table, s, e in spans for p in range(s, e)], []
    else:
        decode = [(table, end) for table, start, end in spans if end - start == 1]
        longer = [span for span in spans if span[2] - span[1] > 1]
    tables, lens = _table_tensor([t for t, _ in decode], dev), _int32([n for _, n in decode], dev)
    slots = torch.tensor(slots, dtype=torch.long, device=dev)
    meta = StepMetadata(cache.k_pools, cache.v_pools, path, slots, len(decode), tables, lens, group)
    if path == "kernel":  # the prefill kernel's inputs, and its query tiles
        query_lens, context_lens = [e - s for _, s, e in longer], [e for _, _, e in longer]
        meta.prefill_tables = _table_tensor([table for table, _, _ in longer], dev)
        meta.cu_query_lens = _int32([0, *accumulate(query_lens)], dev)
        meta.context_lens = _int32(context_lens, dev)
        meta.tiles = kernels.plan_query_tiles(query_lens, context_lens, group, dev)
    elif path == "gather":
        _plan_gather_prefill(meta, longer, bs, dev)
    return meta


def _plan_gather_prefill(meta: StepMetadata, longer, bs: int, dev) -> None:
    """The longer chunks' context slots, query and key spans, and offset causal masks."""
    context, spans, masks, rows = [], [], [], 0
    for table, start, end in longer:
        spans.append((rows, rows + end - start, len(context), len(context) + end))
        context += [table[t // bs] * bs + t % bs for t in range(end)]
        rows += end - start
        seen = torch.arange(end, device=dev)[None] <= torch.arange(start, end, device=dev)[:, None]
        masks.append(None if start == 0 else seen)  # query start + i sees keys 0 .. start + i
    meta.prefill_context = torch.tensor(context, dtype=torch.long, device=dev)
    meta.prefill_spans, meta.prefill_masks = spans, masks


def _int32(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _table_tensor(rows: list[list[int]], device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=1)
    padded = [r + [0] * (width - len(r)) for r in rows]  # entries past a row's end: never read
    return _int32(padded, device).reshape(len(rows), width)


def paged_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, kvlab_step=None, **kwargs
):
    """The attention function registered as ``"kvlab_paged"``: ``query`` ``[1, num_q_heads, T,
    head_dim]``, ``key`` and ``value`` ``[1, num_kv_heads, T, head_dim]`` for the step's new tokens
    (rotated at their true positions); returns ``([1, T, num_q_heads, head_dim], None)``."""
    if not isinstance(kvlab_step, StepMetadata):
        raise _checks.no_step(ATTN_NAME, kvlab_step)
    meta, layer = kvlab_step, module.layer_idx
    _checks.heads(meta, query, layer)
    k_pool, v_pool = meta.k_pools[layer], meta.v_pools[layer]
    _store(meta.path, key[0].transpose(0, 1), value[0].transpose(0, 1), k_pool, v_pool, meta.slots)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, d = query[0].transpose(0, 1), meta.num_decode  # [T, num_q_heads, head_dim]
    parts = [_decode(meta, q[:d].contiguous(), k_pool, v_pool, scale)] if d else []
    if q.shape[0] > d:
        parts.append(_prefill(meta, q[d:], k_pool, v_pool, scale))
    return torch.cat(parts)[None], None


def _store(path: str, k_new, v_new, k_pool, v_pool, slots) -> None:
    if path == "kernel":
        return kernels.paged_store(k_new, v_new, k_pool, v_pool, slots)
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, heads, dim).index_copy_(0, slots, k_new)
    v_pool.view(-1, heads, dim).index_copy_(0, slots, v_new)


def _decode(meta: StepMetadata, q, k_pool, v_pool, scale: float):
    tables, lens = meta.decode_tables, meta.decode_lens
    if meta.path == "kernel":
        return kernels.paged_decode(q, k_pool, v_pool, tables, lens, scale, meta.num_splits)
    if meta.path == "reference":
        return kernels.paged_decode_attention_ref(q, k_pool, v_pool, tables, lens, scale)
    return kernels.paged_decode_gather(q, k_pool, v_pool, tables, lens, scale)


def _prefill(meta: StepMetadata, q, k_pool, v_pool, scale: float):
    """Each query over its own sequence up to itself (no query scored against another's keys)."""
    if meta.path == "kernel":
        return kernels.paged_extend(
            q, k_pool, v_pool, meta.prefill_tables, meta.cu_query_lens, meta.context_lens, scale,
            meta.tiles,
        )  # fmt: skip
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    keys = k_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)[None]
    values = v_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)[None]
    queries, parts = q.transpose(0, 1)[None], []  # [1, num_q_heads, rows, dim]
    for (q0, q1, k0, k1), mask in zip(meta.prefill_spans, meta.prefill_masks):
        parts.append(
            F.scaled_dot_product_attention(
                queries[:, :, q0:q1], keys[:, :, k0:k1], values[:, :, k0:k1], attn_mask=mask,
                is_causal=mask is None, scale=scale, enable_gqa=True,
            )[0]
        )  # fmt: skip
    return torch.cat(parts, dim=1).transpose(0, 1)  # [rows, num_q_heads, head_dim]


def register() -> str:
    """Add ``"kvlab_paged"`` to transformers' attention registry (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)
    return ATTN_NAME


def use_paged_attention(model):
    """Switch ``model`` to the paged attention function for good; returns it (notebook 05)."""
    causal_lm("model", model).set_attn_implementation(register())
    return model


def paged_forward(model, input_ids, position_ids, meta: StepMetadata, logits_to_keep):
    """One forward pass through :func:`paged_attention` (for this call only): the kept logits."""
    with restoring(model, attn_implementation=register()):
        return model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False,
            logits_to_keep=logits_to_keep, kvlab_step=meta,
        ).logits  # fmt: skip
