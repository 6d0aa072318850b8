"""Notebooks 05 and 06: plain decode loops on the paged KV cache (Kwon et al. 2023).

:func:`prefill` and :func:`decode_step` are all or nothing: if even a layer in the middle of the
model fails, the cache is as before (an evicted hash stays evicted), so a retry gives what a first
success would have; :func:`generate` and :func:`paged_generate` loop over them, or an engine."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.cache.paged import PagedKVCache
from kvlab.serving import _checks
from kvlab.serving.attention import use_paged_attention  # noqa: F401 (notebook 05)
from kvlab.serving.engine import Engine
from kvlab.serving.request import Chunk
from kvlab.serving.runner import ModelRunner, cache_for, model_geometry  # noqa: F401 (cache_for)


@torch.inference_mode()
def prefill(model, cache, seq_id, token_ids, attention="kernel", max_tokens=None, checked=False):
    """Run ``seq_id``'s uncomputed tokens, at most ``max_tokens``; ``token_ids`` are the sequence's
    tokens (those it holds slots for, then any new ones, whose slots it reserves). The greedy next
    token, or None if ``max_tokens`` stopped short of the sequence's last token."""
    runner = ModelRunner(model, cache, attention, checked=checked)  # the model fits the cache
    if not checked:
        token_ids, max_tokens = _checks.prefill(model, cache, seq_id, token_ids, max_tokens)
    start = cache.num_computed(seq_id)
    count = len(token_ids) - start  # every uncomputed token, or the first max_tokens of them
    count = count if max_tokens is None else min(count, max_tokens)
    with cache.all_or_nothing():
        cache.reserve(seq_id, len(token_ids) - cache.num_tokens(seq_id))
        cache.commit(seq_id, start + count, token_ids, checked=True)  # the run below writes them
        chunk = Chunk(seq_id, start, token_ids[start : start + count])
        (next_token,) = runner.run([chunk], checked=True)
    return next_token if start + count == len(token_ids) else None


@torch.inference_mode()
def decode_step(model, cache, seq_ids, token_ids, attention="kernel", checked=False) -> list[int]:
    """Feed each of ``seq_ids`` the last of its ``token_ids`` (the others computed): next tokens."""
    runner = ModelRunner(model, cache, attention, checked=checked)
    if not checked:
        seq_ids, token_ids = _checks.decode_step(model, cache, seq_ids, token_ids)
    with cache.all_or_nothing():
        for seq_id, tokens in zip(seq_ids, token_ids):
            cache.reserve(seq_id, 1)
            cache.commit(seq_id, len(tokens), tokens, checked=True)  # the run below writes it
        chunks = [Chunk(s, len(t) - 1, t[-1:]) for s, t in zip(seq_ids, token_ids)]
        return runner.run(chunks, checked=True)


@dataclass(frozen=True)
class Generation:
    """One prompt's tokens, and how much of its prompt the cache served."""

    tokens: list
    cached_tokens: int
    prompt_tokens: int


def generate(
    model, cache: PagedKVCache, token_ids, max_new_tokens: int, salt=None, attention="kernel",
    stop=None,
) -> Generation:  # fmt: skip
    """Greedy decoding of one prompt, reusing whatever prefix ``cache`` holds, until
    ``max_new_tokens`` or a token in ``stop`` (kept); then freed, its full blocks staying cached.
    All or nothing: a generation the free blocks cannot hold is refused before it starts."""
    tokens, max_new_tokens, stop = _checks.generate(
        model, cache, token_ids, max_new_tokens, salt, attention, stop, model_geometry(model)
    )
    with cache.all_or_nothing():
        seq_id, cached = cache.admit(tokens, salt, checked=True)
        sequence = tokens + [prefill(model, cache, seq_id, tokens, attention, checked=True)]
        while len(sequence) - len(tokens) < max_new_tokens and sequence[-1] not in stop:
            sequence += decode_step(model, cache, [seq_id], [sequence], attention, checked=True)
        cache.free(seq_id)
    return Generation(sequence[len(tokens) :], cached, len(tokens))


@dataclass(frozen=True)
class PagedRun:
    """What :func:`paged_generate` did: the tokens, and how often it preempted."""

    tokens: list[list[int]]
    steps: int
    preemptions: int
    recomputed_tokens: int
    swapped_blocks: int
    peak_blocks: int


def paged_generate(
    model, prompts, max_new_tokens: int, block_size: int = 16, num_blocks: int | None = None,
    attention: str = "kernel", preemption: str = "recompute", max_batch: int = 64,
) -> PagedRun:  # fmt: skip
    """Greedy decoding of several unpadded prompts by notebook 11's engine, preempting when blocks
    run out; ``num_blocks`` defaults to enough for every request at once."""
    args = _checks.paged_generate(model, prompts, max_new_tokens, block_size, max_batch, num_blocks)
    prompts, max_new_tokens, block_size, max_batch = args
    longest = -(-(max(map(len, prompts)) + max_new_tokens - 1) // block_size)  # in blocks
    num_blocks = longest * len(prompts) if num_blocks is None else num_blocks
    engine = Engine(
        model, num_blocks, block_size, max_batch, max(max_batch, sum(map(len, prompts))), False,
        preemption, attention=attention, cuda_graphs=False, watermark=0.0,
    )  # fmt: skip
    _checks.blocks_free(engine.cache, longest, free=num_blocks)  # the longest could never run
    tokens, s = engine.generate(prompts, max_new_tokens), engine.scheduler.stats
    preempted = (s.preemptions, s.recomputed_tokens, s.swapped_blocks)
    return PagedRun(tokens, engine.stats.steps, *preempted, engine.stats.peak_blocks)
