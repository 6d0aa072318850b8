"""Context-parallel decode attention (notebook 12, "Decode across devices"): one sequence's cache
split by position across ranks, attended in pieces and merged exactly.

Softmax attention over a union of disjoint token sets is a weighted mean of the attention over
each set, weighted by each set's share of the softmax denominator. So each rank attends the new
query over its own positions only and returns its partial output and the log-sum-exp of its scaled
scores; the ranks all-gather those (a few numbers per query head, whatever the context), and every
rank merges them with ``kvlab.kernels.merge_partials``, the same merge the split-K paged kernel
uses for the splits of one sequence inside a GPU (section 9.5). A rank with no positions returns
lse = -inf and weighs nothing.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from kvlab._checks import integer, integers, positive
from kvlab.parallel import launch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_qkv(q, k, v) -> None:
    for name, t, rank in (("q", q, 3), ("k", k, 4), ("v", v, 4)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
        if t.dtype not in FLOATS:
            raise TypeError(f"{name} must be one of {FLOATS}, got {t.dtype}")
    batch, q_heads, dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(
            f"k and v must be [batch={batch}, kv_heads, tokens, head_dim={dim}], got"
            f" {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.shape[1] < 1 or q_heads % k.shape[1]:
        raise ValueError(
            f"the query heads ({q_heads}) must be a multiple of the KV heads ({k.shape[1]})"
        )


def partial_attention(q, k, v, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one new query per sequence over a shard of its cache, and the shard's
    log-sum-exp.

    ``q`` is ``[batch, q_heads, head_dim]``, ``k`` and ``v`` ``[batch, kv_heads, tokens, head_dim]``
    (grouped-query: each KV head serves q_heads / kv_heads query heads; ``tokens`` may be 0).
    Returns ``(out [batch, q_heads, head_dim], lse [batch, q_heads])`` in fp32 (fp64 for fp64
    inputs); an empty shard gives out = 0 and lse = -inf.
    """
    _check_qkv(q, k, v)
    batch, q_heads, dim = q.shape
    kv_heads = k.shape[1]
    scale = 1 / math.sqrt(dim) if scale is None else positive("scale", scale)
    work = torch.promote_types(q.dtype, torch.float32)
    grouped = q.to(work).view(batch, kv_heads, q_heads // kv_heads, dim)
    scores = torch.einsum("bhgd,bhtd->bhgt", grouped, k.to(work)) * scale
    lse = torch.logsumexp(scores, dim=-1)  # -inf over no tokens
    weights = torch.exp(scores - lse[..., None])
    out = torch.einsum("bhgt,bhtd->bhgd", weights, v.to(work))
    return out.reshape(batch, q_heads, dim), lse.reshape(batch, q_heads)


def split_positions(length: int, world_size: int, cuts=None) -> list[tuple[int, int]]:
    """``[start, end)`` of each rank's positions: as even as possible (the first ``length %
    world_size`` ranks take one more), or cut at ``cuts`` (``world_size - 1`` nondecreasing
    positions in [0, length]; equal cuts leave a rank empty)."""
    length, world_size = integer("length", length, 0), integer("world_size", world_size)
    if cuts is None:
        base, extra = divmod(length, world_size)
        sizes = [base + (r < extra) for r in range(world_size)]
        cuts = [sum(sizes[: r + 1]) for r in range(world_size - 1)]
    cuts = integers("cuts", cuts, 0, length + 1, empty=True)
    if len(cuts) != world_size - 1 or cuts != sorted(cuts):
        raise ValueError(
            f"cuts must be {world_size - 1} nondecreasing positions in [0, {length}], got {cuts}"
        )
    edges = [0, *cuts, length]
    return list(zip(edges[:-1], edges[1:]))


def context_parallel_attention(q, k_shard, v_shard, scale: float | None = None) -> torch.Tensor:
    """Inside a rank: attention of ``q`` over every rank's shard together. Each rank computes its
    partial output and log-sum-exp, all-gathers them and merges (the split-K merge)."""
    from kvlab.kernels import merge_partials

    out, lse = partial_attention(q, k_shard, v_shard, scale)
    world = dist.get_world_size()
    outs, lses = (
        [torch.empty_like(out) for _ in range(world)],
        [torch.empty_like(lse) for _ in range(world)],
    )
    dist.all_gather(outs, out)
    dist.all_gather(lses, lse)
    merged, _ = merge_partials(torch.stack(outs), torch.stack(lses))
    return merged


def _attend_on_rank(rank: int, world_size: int, q, shards, scale) -> torch.Tensor:
    device = launch.rank_device()
    k, v = shards[rank]
    return context_parallel_attention(q.to(device), k.to(device), v.to(device), scale).cpu()


def context_parallel_decode_attention(
    q,
    k,
    v,
    world_size: int = 2,
    cuts=None,
    scale: float | None = None,
    workers: launch.Workers | None = None,
    backend: str | None = None,
    device: str = "cpu",
    timeout: float = 300.0,
) -> torch.Tensor:
    """Decode attention of ``q`` over ``k``, ``v`` (shapes as :func:`partial_attention`) with the
    cache split by position over ``world_size`` ranks (even, or at ``cuts``). Each rank receives
    only its shard; returns the merged output, which every rank must agree on (fp32, fp64 for fp64).
    """
    _check_qkv(q, k, v)
    scale = None if scale is None else positive("scale", scale)
    world_size = launch.world_of(workers, world_size, backend, device)
    bounds = split_positions(k.shape[2], world_size, cuts)
    shards = [(k[:, :, a:b].contiguous(), v[:, :, a:b].contiguous()) for a, b in bounds]
    outs = launch.call(
        workers,
        _attend_on_rank,
        q,
        shards,
        scale,
        world_size=world_size,
        backend=backend,
        device=device,
        timeout=timeout,
    )
    if any(not torch.equal(o, outs[0]) for o in outs):
        raise RuntimeError("the ranks merged different outputs")
    return outs[0]
