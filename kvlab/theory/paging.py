"""Notebook 05, PagedAttention (section 9.5): how much KV memory reservation and paging waste, by
formula.

- ``predicted_waste``: the per-request formula the simulation of ``kvlab.lab.paging`` is read
  against, and ``paging_saves``, whether it predicts that paging wastes less than reserving
  ``max_len`` per request (Kwon et al. 2023);
- ``waste_bound`` and ``within_waste_bound``: the most paged allocation can waste, and whether a
  measured waste respects it;
- ``gather_overhead_s``: what the gather path's copy of a paged cache adds to a decode step.

Pure Python: a trace is any sequence of requests with a ``prompt`` and a ``max_new_tokens``
(``kvlab.lab.paging.make_trace`` draws them).
"""

from __future__ import annotations

from kvlab._checks import integer, one_of, positive, real


def predicted_waste(trace, policy: str, block_size: int, max_len: int) -> float:
    """The per-request formula (notebook 05): waste = 1 - sum_r sum_g (P_r + g - 1) / sum_r sum_g
    slots_r(g).

    A request with prompt P and output G holds P + g - 1 tokens at its g-th step, in ``max_len``
    slots (``reserve-max``) or ``block_size * ceil((P + g - 1) / block_size)`` (``paged``). It
    follows every request through every step of its life and ignores queueing and preemption.
    """
    one_of("policy", policy, ("reserve-max", "paged"))
    integer("block_size", block_size, 1)
    integer("max_len", max_len, 1)
    longest = max((len(r.prompt) + r.max_new_tokens - 1 for r in trace), default=0)
    if max_len < longest:
        raise ValueError(
            f"max_len must hold the trace's longest request ({longest} tokens), got {max_len}"
        )
    used = slots = 0
    for r in trace:
        for step in range(1, r.max_new_tokens + 1):
            n = len(r.prompt) + step - 1
            used += n
            slots += max_len if policy == "reserve-max" else -(-n // block_size) * block_size
    return 1 - used / slots if slots else 0.0


def paging_saves(trace, block_size: int, max_len: int) -> bool:
    """Whether the per-request formula predicts that paged allocation wastes less than reserving
    ``max_len`` per request: true while a request's blocks hold fewer slots than ``max_len`` at some
    step."""
    return predicted_waste(trace, "paged", block_size, max_len) < predicted_waste(
        trace, "reserve-max", block_size, max_len
    )


def waste_bound(block_size: int, mean_tokens: float) -> float:
    """(B - 1) / (L + B - 1): the most paged allocation wastes, time-weighted, when running requests
    hold ``mean_tokens`` = L tokens on average, since each wastes at most B - 1 slots of its last
    block.
    """
    integer("block_size", block_size, 1)
    mean_tokens = real("mean_tokens", mean_tokens, 0)
    return (
        (block_size - 1) / (mean_tokens + block_size - 1) if mean_tokens + block_size > 1 else 0.0
    )


def within_waste_bound(waste: float, block_size: int, mean_tokens: float) -> bool:
    """Whether a measured paged waste respects :func:`waste_bound` (a simulation that breaks it
    miscounts)."""
    return real("waste", waste, 0, 1) <= waste_bound(block_size, mean_tokens)


def gather_overhead_s(kv_bytes: float, copy_bytes_per_s: float) -> float:
    """Seconds the gather path adds to a decode step at the copy bandwidth (notebook 05): it copies
    the keys and values out of their blocks, one pass that reads and writes ``kv_bytes`` (the copy
    bandwidth counts bytes read plus written); zeroing the few slots past each sequence's end
    costs next to nothing beside it.
    """
    return 2 * positive("kv_bytes", kv_bytes) / positive("copy_bytes_per_s", copy_bytes_per_s)
