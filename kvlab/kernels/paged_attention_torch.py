"""Notebooks 05 and 05b: the paged kernels in plain PyTorch, each with its kernel's signature and
checks: the oracles the kernels are tested against, off the lesson path.

:func:`paged_decode_attention_ref` and :func:`paged_prefill_attention_ref` are the answers the
decode and prefill kernels are tested against, in fp64, and :func:`store_kv_ref` the store's;
:func:`paged_decode_attention_gather` is what paging costs without a fused kernel, and
:func:`merge_partials` the arithmetic of the decode kernel's second stage (and of context
parallelism).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.kernels._validation import (
    check_decode_args,
    check_merge_partials,
    check_prefill_args,
    check_store,
)


def paged_decode_attention_ref(
    q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None
):
    """Paged decode attention in fp64, from the definition. ``num_splits`` is checked and otherwise
    ignored: one pass is the definition the splits must reproduce."""
    scale = check_decode_args(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)
    group, block_size = q.shape[1] // k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)  # keys and values: [length, num_q_heads, head_dim]
    for b, length in enumerate(seq_lens.tolist()):
        blocks = block_table[b, : -(-length // block_size)].long()
        keys = k_cache[blocks].flatten(0, 1)[:length].repeat_interleave(group, dim=1).double()
        values = v_cache[blocks].flatten(0, 1)[:length].repeat_interleave(group, dim=1).double()
        scores = torch.einsum("hd,thd->ht", q[b].double(), keys) * scale
        out[b] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


def paged_decode_attention_gather(
    q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None
):
    """Paged decode attention in vectorised PyTorch: every step copies each sequence's blocks into a
    contiguous ``[batch, max_blocks * block_size, kv_heads, head_dim]`` tensor, then runs torch's
    SDPA on it. The kernel's checks, but not its limits: any block size and head_dim."""
    args = (q, k_cache, v_cache, block_table, seq_lens)
    scale = check_decode_args(*args, scale, num_splits, kernel_limits=False)
    return paged_decode_gather(*args, scale)


def paged_decode_gather(q, k_cache, v_cache, block_table, seq_lens, scale: float):
    """:func:`paged_decode_attention_gather` without its checks (and their host sync)."""
    keys, values, valid = gather_blocks(k_cache, v_cache, block_table, seq_lens)
    out = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True
    )
    return out[:, :, 0]


def gather_blocks(k_cache, v_cache, block_table, seq_lens):
    """The gather of :func:`paged_decode_gather`, the part a fused kernel does not do: each
    sequence's blocks copied out of the pools in table order (``index_select`` over whole blocks,
    one streaming copy), then the slots past each sequence's end zeroed. Returns keys and values as
    ``[batch, kv_heads, slots, head_dim]`` views and the ``[batch, slots]`` mask of valid slots.

    On a CPU only the rows past each end are zeroed (``index_fill_``): a ``masked_fill_`` whose
    mask is broadcast over heads and channels runs there at well under the copy rate, a second
    pass over every byte. On a GPU the ``masked_fill_`` streams at memory speed and keeps every
    shape static (no ``nonzero``, so no host sync and nothing that stops a graph capture)."""
    batch, width = block_table.shape
    block_size, lens = k_cache.shape[1], seq_lens[:, None]
    in_use = torch.arange(width, device=k_cache.device)[None, :] * block_size < lens
    index = torch.where(in_use, block_table.long(), 0).flatten()  # unused entries may hold anything
    valid = torch.arange(width * block_size, device=k_cache.device)[None, :] < lens
    # A slot past a sequence's end may hold anything, even NaN: zero it.
    unused = ~valid[:, :, None, None]

    past_end = None if k_cache.is_cuda else (~valid).flatten().nonzero().squeeze(1)

    def gather(cache):  # [batch, slots, kv_heads, dim] -> [batch, kv_heads, slots, dim]
        blocks = cache.index_select(0, index).view(batch, width * block_size, *cache.shape[2:])
        if past_end is None:
            blocks.masked_fill_(unused, 0)
        else:
            blocks.view(batch * width * block_size, -1).index_fill_(0, past_end, 0)
        return blocks.transpose(1, 2)

    return gather(k_cache), gather(v_cache), valid


def merge_partials(outs: torch.Tensor, lses: torch.Tensor):
    """``(out, lse)`` of the union of disjoint parts of a sequence, exactly what one pass gives:
    ``outs[i]`` ``[num_parts, ..., head_dim]`` is softmax attention over part ``i`` alone and
    ``lses[i]`` the natural log-sum-exp of its scaled scores (``-inf`` for an empty part)."""
    check_merge_partials(outs, lses)
    top = lses.max(dim=0).values
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # all empty: not -inf - -inf
    weights = torch.exp(lses - top)  # <= 1, and exactly 0 for an empty part
    # An empty part's output is undefined (may be NaN); mask it so 0 * NaN cannot leak in.
    parts = torch.where(weights[..., None] > 0, outs, torch.zeros_like(outs))
    total = weights.sum(dim=0)
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    out = (weights[..., None] * parts).sum(dim=0) / safe_total[..., None]
    lse = torch.where(total > 0, top + torch.log(safe_total), torch.full_like(total, float("-inf")))
    return out, lse


def paged_prefill_attention_ref(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Plain-PyTorch paged prefill attention in float64, same signature and checks."""
    scale = check_prefill_args(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale)
    group = q.shape[1] // k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    cu = cu_query_lens.tolist()
    for b, context in enumerate(context_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if start == end:
            continue
        blocks = block_table[b, : -(-context // block_size)].long()
        keys = k_cache[blocks].flatten(0, 1)[:context].double().repeat_interleave(group, dim=1)
        values = v_cache[blocks].flatten(0, 1)[:context].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("ihd,thd->hit", q[start:end].double(), keys) * scale
        query_pos = torch.arange(context - (end - start), context, device=q.device)
        hidden = torch.arange(context, device=q.device)[None, :] > query_pos[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
        out[start:end] = torch.einsum("hit,thd->ihd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


def store_kv_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Plain-PyTorch :func:`store_kv`, same signature and checks."""
    check_store(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    k_cache[slots // block_size, slots % block_size] = k[keep]
    v_cache[slots // block_size, slots % block_size] = v[keep]
