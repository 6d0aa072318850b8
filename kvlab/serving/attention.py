"""Notebooks 05, 06 and 11: the one attention function kvlab registers with Hugging Face
transformers.

The model stays the stock ``transformers`` Llama (or Qwen2, Mistral); only its attention function
changes (Wolf et al. 2020). A step's tokens are packed into one row, ``[1, T]``: each *chunk* feeds
tokens of one sequence whose slots the :class:`~kvlab.cache.paged.PagedKVCache` has reserved and
committed for the step. Before the forward pass, :func:`build_step` turns the chunks into a
:class:`StepMetadata`, built and checked once per step: where each new token's K and V go (its
slot), and what each query attends to. Then every layer calls :func:`paged_attention`, which

1. stores the layer's new K and V at their slots, every chunk's of the step;
2. then attends, by one of three paths that give the same result.

The order is what makes prefix sharing within a step correct: a request admitted behind another
in the same step reads blocks that the other's chunk fills in this very pass, and at every layer
those K and V are in the pool before any query reads it. The three paths:


   - ``"kernel"``, the Triton kernels: one-token chunks (decode steps) through the paged decode
     kernel over their block tables, longer chunks (a prompt, a chunk of one, the uncached suffix
     after a cached prefix) through the paged prefill ("extend") kernel, which reads each
     sequence's cached blocks through its block table and its own chunk causally
     (:mod:`kvlab.kernels.paged_prefill`); the step's cumulative query lengths, context lengths and
     query tiles are planned once, here, not in every layer;
   - ``"gather"``, vectorised PyTorch, for a CPU (where the kernels run in Triton's interpreter):
     decode rows by gathering each table's blocks; each longer chunk through SDPA over its gathered
     context, with a causal mask offset by what the context already holds (one SDPA per chunk, so no
     query is scored against another sequence's keys only to be masked);
   - ``"reference"``: every query token as one decode row of
     :func:`kvlab.kernels.paged_decode_attention_ref` (fp64, from the definition). Each row reads
     its whole context, so a chunk of ``n`` tokens reads its prefix ``n`` times: the oracle, not a
     way to prefill.

Both fast paths skip the kernels' own checks, since the step was checked once. Engines prefill the
same way as the kernel path: vLLM through FlashAttention's varlen kernel with block tables (Dao
2023), SGLang and others through FlashInfer's paged prefill (Ye et al. 2025). The one forward call
that switches the model to this function and back is :func:`paged_forward`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from kvlab import kernels
from kvlab._checks import causal_lm, integer, one_of, restoring

ATTN_NAME = "kvlab_paged"
ATTENTION_PATHS = ("kernel", "gather", "reference")


@dataclass
class StepMetadata:
    """What every layer needs besides q, k and v, built once per step by :func:`build_step`.

    Tokens are packed ``[1, T]``: first ``num_decode`` one-token chunks, then the longer ones. Each
    path fills only the fields it reads.
    """

    k_pools: list
    v_pools: list
    path: str
    slots: (
        torch.Tensor
    )  # int64 [T]: where each new token's K and V go (block * block_size + offset); -1 skips
    num_decode: int
    decode_tables: torch.Tensor  # int32 [num_decode, width]
    decode_lens: torch.Tensor  # int32 [num_decode]: context length, the new token included
    # query heads per KV head (the model's GQA group), as the kernel's tiles were planned
    group: int = 1
    # "kernel", the longer chunks:
    prefill_tables: torch.Tensor | None = None  # int32 [num_prefill, width]
    # int32 [num_prefill + 1]: chunk b is rows cu[b] .. cu[b + 1] - 1
    cu_query_lens: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None  # int32 [num_prefill]: cached plus new tokens
    tiles: torch.Tensor | None = None  # int32 [num_tiles, 2]: kernels.plan_query_tiles
    # "gather", the longer chunks:
    # int64 [K]: the slots of the longer chunks' contexts, chunk by chunk
    prefill_context: torch.Tensor | None = None
    # per chunk (first query row, end row, first context slot, end slot)
    prefill_spans: list | None = None
    # per chunk bool [n, c]: query may see key (None: nothing cached, plain causal)
    prefill_masks: list | None = None
    # "reference", every token:
    row_tables: torch.Tensor | None = None  # int32 [T, width], every token's table
    row_lens: torch.Tensor | None = None  # int32 [T], every token's context length
    # the decode kernel's split-K count (fixed for a CUDA graph); None: from the width
    num_splits: int | None = None


def build_step(cache, chunks, path: str, group: int = 1) -> StepMetadata:
    """The metadata of one step that feeds ``chunks`` of ``cache``, checked.

    A chunk ``(seq_id, start, token_ids)`` (:class:`~kvlab.serving.request.Chunk`) feeds tokens
    ``start .. start + n - 1`` of a sequence, whose slots must be reserved and committed for this
    step (``cache.commit``); one-token chunks come first; a sequence appears once. ``group`` is the
    model's query heads per KV head, for which the kernel path plans its query tiles.
    """
    one_of("path", path, ATTENTION_PATHS)
    integer("group", group, 1)  # query heads per KV head
    spans = _check_chunks(cache, chunks)
    bs, dev = cache.block_size, cache.device
    slots = [table[t // bs] * bs + t % bs for table, start, end in spans for t in range(start, end)]
    decode = [(table, end) for table, start, end in spans if end - start == 1]
    longer = [span for span in spans if span[2] - span[1] > 1]
    meta = StepMetadata(
        cache.k_pools,
        cache.v_pools,
        path,
        torch.tensor(slots, dtype=torch.long, device=dev),
        len(decode),
        _table_tensor([t for t, _ in decode], dev),
        torch.tensor([n for _, n in decode], dtype=torch.int32, device=dev),
        group,
    )
    if path == "kernel":
        _plan_kernel_prefill(meta, longer, group, dev)
    elif path == "gather":
        meta.prefill_context, meta.prefill_spans, meta.prefill_masks = _gather_prefill(
            longer, bs, dev
        )
    else:
        meta.row_tables = _table_tensor(
            [table for table, start, end in spans for _ in range(start, end)], dev
        )
        meta.row_lens = torch.tensor(
            [t + 1 for _, start, end in spans for t in range(start, end)],
            dtype=torch.int32,
            device=dev,
        )
    return meta


def _plan_kernel_prefill(meta: StepMetadata, longer, group: int, dev) -> None:
    """The paged prefill kernel's inputs for the longer chunks, and its query tiles, once per
    step."""
    query_lens = [end - start for _, start, end in longer]
    context_lens = [end for _, _, end in longer]
    meta.prefill_tables = _table_tensor([table for table, _, _ in longer], dev)
    meta.cu_query_lens = torch.tensor([0, *accumulate(query_lens)], dtype=torch.int32, device=dev)
    meta.context_lens = torch.tensor(context_lens, dtype=torch.int32, device=dev)
    meta.tiles = kernels.plan_query_tiles(query_lens, context_lens, group, dev)


def _gather_prefill(longer, bs: int, dev) -> tuple[torch.Tensor, list, list]:
    """The longer chunks' contexts as one list of slots, where each chunk's queries and keys sit in
    the packed rows, and each chunk's causal mask offset by what its context already holds."""
    context, spans, masks, rows = [], [], [], 0
    for table, start, end in longer:
        spans.append((rows, rows + end - start, len(context), len(context) + end))
        context += [table[t // bs] * bs + t % bs for t in range(end)]
        rows += end - start
        # query start + i sees keys 0 .. start + i
        masks.append(
            None
            if start == 0
            else torch.arange(end, device=dev)[None, :]
            <= torch.arange(start, end, device=dev)[:, None]
        )
    return torch.tensor(context, dtype=torch.long, device=dev), spans, masks


def _check_chunks(cache, chunks) -> list[tuple[list[int], int, int]]:
    """Each chunk's block table and token span, after checking everything the kernels will trust."""
    if isinstance(chunks, (str, bytes)) or not hasattr(chunks, "__iter__"):
        raise TypeError(
            f"chunks must be a list of (seq_id, start, token_ids) chunks, got"
            f" {type(chunks).__name__}"
        )
    chunks, spans, seen, longer = list(chunks), [], set(), False
    if not chunks:
        raise ValueError("chunks must name at least one (seq_id, start, token_ids) chunk")
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, (tuple, list)) or len(chunk) != 3:
            raise TypeError(
                f"chunks[{i}] must be a (seq_id, start, token_ids) chunk, got {chunk!r}"
            )
        seq_id, start, token_ids = chunk
        cache.require_in_step(seq_id)  # a live, resident sequence whose layers agree
        start, count = integer(f"chunks[{i}].start", start, 0), len(token_ids)
        committed = cache.num_computed(seq_id)
        if not 1 <= count <= committed - start:
            raise ValueError(
                f"sequence {seq_id} has {committed - start} committed token(s) from position "
                f"{start} (slots reserved and committed for this step); got a chunk of {count}"
            )
        if seq_id in seen:
            raise ValueError(f"sequence {seq_id} appears twice in one step")
        if count == 1 and longer:
            raise ValueError(
                "one-token chunks must come before longer ones (the decode rows are packed first)"
            )
        seen.add(seq_id)
        longer = longer or count > 1
        spans.append((cache.block_table(seq_id), start, start + count))
    return spans


def _table_tensor(rows: list[list[int]], device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=1)
    padded = [r + [0] * (width - len(r)) for r in rows]  # entries past a row's end: never read
    return torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(rows), width)


# --------------------------------------------------------------------------- the attention function


def paged_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    kvlab_step: StepMetadata | None = None,
    **kwargs,
):
    """The attention function registered as ``"kvlab_paged"`` (notebooks 05, 06, 11).

    ``query`` is ``[1, num_q_heads, T, head_dim]``, ``key`` and ``value`` ``[1, num_kv_heads, T,
    head_dim]`` for the step's new tokens (already rotated by RoPE at their true positions). Returns
    ``([1, T, num_q_heads, head_dim], None)`` as transformers expects.
    """
    if not isinstance(kvlab_step, StepMetadata):
        raise ValueError(
            f"attention {ATTN_NAME!r} needs the kvlab_step= keyword (a StepMetadata), got "
            f"{kvlab_step!r}; run the model through kvlab.serving.attention.paged_forward"
        )
    meta, layer = kvlab_step, module.layer_idx
    k_pool, v_pool = meta.k_pools[layer], meta.v_pools[layer]
    if query.shape[1] != meta.group * k_pool.shape[2]:
        raise ValueError(
            f"the step was built for {meta.group} query head(s) per KV head but the model has "
            f"{query.shape[1]} query and {k_pool.shape[2]} KV heads; pass group= to build_step"
        )
    _store(meta.path, key[0].transpose(0, 1), value[0].transpose(0, 1), k_pool, v_pool, meta.slots)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, num_q_heads, head_dim]
    if meta.path == "reference":
        out = kernels.paged_decode_attention_ref(
            q.contiguous(), k_pool, v_pool, meta.row_tables, meta.row_lens, scale=scale
        )
        return out[None], None
    parts, d = [], meta.num_decode
    if d:
        parts.append(_decode(meta, q[:d].contiguous(), k_pool, v_pool, scale))
    if q.shape[0] > d:
        parts.append(_prefill(meta, q[d:], k_pool, v_pool, scale))
    return (torch.cat(parts) if len(parts) > 1 else parts[0])[None], None


def _store(path: str, k_new, v_new, k_pool, v_pool, slots) -> None:
    if path == "kernel":
        kernels.paged_store(k_new, v_new, k_pool, v_pool, slots)
        return
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, heads, dim).index_copy_(0, slots, k_new)
    v_pool.view(-1, heads, dim).index_copy_(0, slots, v_new)


def _decode(meta: StepMetadata, q, k_pool, v_pool, scale: float):
    if meta.path == "kernel":
        return kernels.paged_decode(
            q, k_pool, v_pool, meta.decode_tables, meta.decode_lens, scale, meta.num_splits
        )
    return kernels.paged_decode_gather(
        q, k_pool, v_pool, meta.decode_tables, meta.decode_lens, scale
    )


def _prefill(meta: StepMetadata, q, k_pool, v_pool, scale: float):
    """The longer chunks, ``q`` ``[T - num_decode, num_q_heads, head_dim]``: each query sees its own
    sequence up to itself. The kernel reads the blocks in place; the gather path copies the contexts
    out and runs SDPA chunk by chunk."""
    if meta.path == "kernel":
        return kernels.paged_extend(
            q,
            k_pool,
            v_pool,
            meta.prefill_tables,
            meta.cu_query_lens,
            meta.context_lens,
            scale,
            meta.tiles,
        )
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    keys = k_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)  # [kv_heads, K, dim]
    values = v_pool.view(-1, heads, dim)[meta.prefill_context].transpose(0, 1)
    queries, parts = q.transpose(0, 1), []  # [num_q_heads, T - num_decode, dim]
    for (q0, q1, k0, k1), mask in zip(
        meta.prefill_spans, meta.prefill_masks
    ):  # one SDPA per chunk: no cross pairs
        parts.append(
            F.scaled_dot_product_attention(
                queries[None, :, q0:q1],
                keys[None, :, k0:k1],
                values[None, :, k0:k1],
                attn_mask=mask,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=True,
            )[0]
        )
    return torch.cat(parts, dim=1).transpose(0, 1)  # [T - num_decode, num_q_heads, head_dim]


# --------------------------------------------------------------------------- the model call


def register() -> str:
    """Add ``"kvlab_paged"`` to transformers' attention registry (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)
    return ATTN_NAME


def use_paged_attention(model):
    """Switch ``model`` to the paged attention function for good; returns the model (notebook
    05)."""
    causal_lm("model", model).set_attn_implementation(register())
    return model


def paged_forward(model, input_ids, position_ids, meta: StepMetadata, logits_to_keep):
    """One forward pass of ``model`` through :func:`paged_attention`: the logits at
    ``logits_to_keep``.

    The model is switched to the paged attention for this call only (``kvlab._checks.restoring``),
    unless it already uses it.
    """
    with restoring(model, attn_implementation=register()):
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=logits_to_keep,
            kvlab_step=meta,
        )
    return out.logits
