"""Notebooks 05, 06 and 11: the one attention function kvlab registers with Hugging Face transformers.

The model stays the stock ``transformers`` Llama (or Qwen2, Mistral); only its attention function
changes (Wolf et al. 2020). A step's tokens are packed into one row, ``[1, T]``: each *chunk* feeds
the next ``count`` tokens of one sequence whose slots the :class:`~kvlab.cache.paged.PagedKVCache`
has reserved. Before the forward pass, :func:`build_step` turns the chunks into a
:class:`StepMetadata`, built and checked once per step: where each new token's K and V go (its
slot), and what each query attends to. Then every layer calls :func:`paged_attention`, which

1. stores the layer's new K and V at their slots (``store_kv``; a PyTorch copy off the kernel path);
2. attends. One-token chunks (decode steps) go through the paged decode attention over their block
   tables: ``"kernel"``, the Triton kernel; ``"gather"``, vectorised PyTorch; both without checks,
   since the step was checked once. Multi-token chunks (a prefill, a chunk of one, the uncached
   suffix of a prompt whose prefix came from the cache) go through SDPA over their gathered
   context with a causal mask offset by what the context already holds. ``"reference"`` instead
   treats every query token as a decode row of :func:`kvlab.kernels.paged_decode_attention_ref`
   (fp64, from the definition).

A paged prefill kernel can replace step 2's SDPA behind the same metadata (``prefill_context``
and ``prefill_mask`` are all it reads). The one forward call that switches the model to this
function and back is :func:`paged_forward`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab import kernels
from kvlab._checks import causal_lm, one_of, restoring

ATTN_NAME = "kvlab_paged"
ATTENTION_PATHS = ("kernel", "gather", "reference")


@dataclass
class StepMetadata:
    """What every layer needs besides q, k and v, built once per step by :func:`build_step`.

    Tokens are packed ``[1, T]``: first ``num_decode`` one-token chunks, then the longer ones.
    """

    k_pools: list
    v_pools: list
    path: str
    slots: torch.Tensor  # int64 [T]: where each new token's K and V go (block * block_size + offset); -1 skips
    num_decode: int
    decode_tables: torch.Tensor  # int32 [num_decode, width]
    decode_lens: torch.Tensor  # int32 [num_decode]: context length, the new token included
    prefill_context: torch.Tensor  # int64 [K]: the slots of the longer chunks' contexts
    prefill_mask: torch.Tensor  # bool [1, 1, T - num_decode, K]: query may see key
    row_tables: torch.Tensor | None = None  # "reference": int32 [T, width], every token's table
    row_lens: torch.Tensor | None = None  # "reference": int32 [T], every token's context length
    num_splits: int | None = None  # the kernel's split-K count (fixed for a CUDA graph); None: from the width


def build_step(cache, chunks, path: str) -> StepMetadata:
    """The metadata of one step that feeds ``chunks`` (``(seq_id, count)`` pairs) of ``cache``, checked.

    Chunk ``(s, n)`` feeds tokens ``num_computed(s) .. num_computed(s) + n - 1``, whose slots must be
    reserved; one-token chunks come first; a sequence appears once.
    """
    one_of("path", path, ATTENTION_PATHS)
    spans = _check_chunks(cache, chunks)
    bs = cache.block_size
    slots, decode_rows, decode_lens, context, q_owner, q_pos, k_owner, k_pos = ([] for _ in range(8))
    row_tables, row_lens = [], []
    for i, (table, start, end) in enumerate(spans):
        slots += [table[t // bs] * bs + t % bs for t in range(start, end)]
        if path == "reference":
            row_tables += [table] * (end - start)
            row_lens += range(start + 1, end + 1)
        if end - start == 1:
            decode_rows.append(table)
            decode_lens.append(end)
            continue
        context += [table[t // bs] * bs + t % bs for t in range(end)]
        q_owner += [i] * (end - start)
        q_pos += range(start, end)
        k_owner += [i] * end
        k_pos += range(end)
    dev = cache.device
    mask = ((torch.tensor(q_owner)[:, None] == torch.tensor(k_owner)[None, :])
            & (torch.tensor(k_pos)[None, :] <= torch.tensor(q_pos)[:, None]))
    meta = StepMetadata(cache.k_pools, cache.v_pools, path, torch.tensor(slots, dtype=torch.long, device=dev),
                        len(decode_rows), _table_tensor(decode_rows, dev),
                        torch.tensor(decode_lens, dtype=torch.int32, device=dev),
                        torch.tensor(context, dtype=torch.long, device=dev), mask[None, None].to(dev))
    if path == "reference":
        meta.row_tables = _table_tensor(row_tables, dev)
        meta.row_lens = torch.tensor(row_lens, dtype=torch.int32, device=dev)
    return meta


def _check_chunks(cache, chunks) -> list[tuple[list[int], int, int]]:
    """Each chunk's block table and token span, after checking everything the kernels will trust."""
    if isinstance(chunks, (str, bytes)) or not hasattr(chunks, "__iter__"):
        raise TypeError(f"chunks must be a list of (seq_id, count) pairs, got {type(chunks).__name__}")
    chunks, spans, seen, longer = list(chunks), [], set(), False
    if not chunks:
        raise ValueError("chunks must name at least one (seq_id, count) pair")
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, (tuple, list)) or len(chunk) != 2:
            raise TypeError(f"chunks[{i}] must be a (seq_id, count) pair, got {chunk!r}")
        seq_id, count = chunk
        cache.require_in_step(seq_id)  # a live, resident sequence whose layers agree
        start, held = cache.num_computed(seq_id), cache.num_tokens(seq_id)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= held - start:
            raise ValueError(f"sequence {seq_id} has {held - start} reserved token(s) to feed after its "
                             f"{start} computed ones; got a chunk of {count!r}")
        if seq_id in seen:
            raise ValueError(f"sequence {seq_id} appears twice in one step")
        if count == 1 and longer:
            raise ValueError("one-token chunks must come before longer ones (the decode rows are packed first)")
        seen.add(seq_id)
        longer = longer or count > 1
        spans.append((cache.block_table(seq_id), start, start + count))
    return spans


def _table_tensor(rows: list[list[int]], device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=1)
    padded = [r + [0] * (width - len(r)) for r in rows]  # entries past a row's blocks are never read
    return torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(rows), width)


# --------------------------------------------------------------------------- the attention function


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    kvlab_step: StepMetadata | None = None, **kwargs):
    """The attention function registered as ``"kvlab_paged"`` (notebooks 05, 06, 11).

    ``query`` is ``[1, num_q_heads, T, head_dim]``, ``key`` and ``value`` ``[1, num_kv_heads, T,
    head_dim]`` for the step's new tokens (already rotated by RoPE at their true positions). Returns
    ``([1, T, num_q_heads, head_dim], None)`` as transformers expects.
    """
    if not isinstance(kvlab_step, StepMetadata):
        raise ValueError(f"attention {ATTN_NAME!r} needs the kvlab_step= keyword (a StepMetadata), got "
                         f"{kvlab_step!r}; run the model through kvlab.serving.attention.paged_forward")
    meta, layer = kvlab_step, module.layer_idx
    k_pool, v_pool = meta.k_pools[layer], meta.v_pools[layer]
    _store(meta.path, key[0].transpose(0, 1), value[0].transpose(0, 1), k_pool, v_pool, meta.slots)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, num_q_heads, head_dim]
    if meta.path == "reference":
        out = kernels.paged_decode_attention_ref(q.contiguous(), k_pool, v_pool, meta.row_tables, meta.row_lens,
                                                 scale=scale)
        return out[None], None
    parts, d = [], meta.num_decode
    if d:
        parts.append(_decode(meta, q[:d].contiguous(), k_pool, v_pool, scale))
    if q.shape[0] > d:
        parts.append(_prefill(meta, query[:, :, d:], k_pool, v_pool, scale))
    return (torch.cat(parts) if len(parts) > 1 else parts[0])[None], None


def _store(path: str, k_new, v_new, k_pool, v_pool, slots) -> None:
    if path == "kernel":
        kernels.store_kv_unchecked(k_new, v_new, k_pool, v_pool, slots)
        return
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, heads, dim).index_copy_(0, slots, k_new)
    v_pool.view(-1, heads, dim).index_copy_(0, slots, v_new)


def _decode(meta: StepMetadata, q, k_pool, v_pool, scale: float):
    if meta.path == "kernel":
        return kernels.paged_decode_unchecked(q, k_pool, v_pool, meta.decode_tables, meta.decode_lens, scale,
                                              meta.num_splits)
    return kernels.paged_decode_gather_unchecked(q, k_pool, v_pool, meta.decode_tables, meta.decode_lens, scale)


def _prefill(meta: StepMetadata, query, k_pool, v_pool, scale: float):
    """The longer chunks: SDPA over their gathered contexts, each query seeing its own sequence up to itself."""
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    keys = k_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)[None]  # [1, kv_heads, K, dim]
    values = v_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=meta.prefill_mask, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1)  # [T - num_decode, num_q_heads, head_dim]


# --------------------------------------------------------------------------- the model call


def register() -> str:
    """Add ``"kvlab_paged"`` to transformers' attention registry (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)
    return ATTN_NAME


def use_paged_attention(model):
    """Switch ``model`` to the paged attention function for good; returns the model (notebook 05)."""
    causal_lm("model", model).set_attn_implementation(register())
    return model


def paged_forward(model, input_ids, position_ids, meta: StepMetadata, logits_to_keep):
    """One forward pass of ``model`` through :func:`paged_attention`: the logits at ``logits_to_keep``.

    The model is switched to the paged attention for this call only (``kvlab._checks.restoring``),
    unless it already uses it.
    """
    with restoring(model, attn_implementation=register()):
        out = model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                    logits_to_keep=logits_to_keep, kvlab_step=meta)
    return out.logits
