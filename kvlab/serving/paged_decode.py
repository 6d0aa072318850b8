"""Notebooks 05 and 06: plain decode loops on the paged KV cache, through the one attention
function.

A stock Hugging Face Llama (or Qwen2, Mistral) decodes from a
:class:`~kvlab.cache.paged.PagedKVCache` (Kwon et al. 2023) with no other change than its attention
function (:mod:`kvlab.serving.attention`):

- :func:`prefill` runs a sequence's tokens whose K and V are not written yet, all at once or
  ``max_tokens`` at a time; after a prefix hit (prefix caching on, notebook 06) that is only the
  uncached suffix, at its true positions;
- :func:`decode_step` feeds one token to each of a batch of sequences;
- :func:`generate` is the one-prompt loop of notebook 06: admit (reusing whatever prefix the cache
  holds), prefill, decode, free (the blocks stay cached for the next request);
- :func:`paged_generate` is notebook 05's multi-request loop: the engine of notebook 11 on unpadded
  prompts of any lengths, preempting by recompute or swap when blocks run out.

``prefill`` and ``decode_step`` are all or nothing: if anything fails, even a layer in the middle of
the model, the cache is as before (an evicted hash stays evicted), so a retry gives what a first
success would have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab._checks import causal_lm, integer, integers, one_of
from kvlab._checks import token_ids as _token_ids  # prefill and generate take token_ids=
from kvlab.cache.paged import PagedKVCache
from kvlab.serving import _checks
from kvlab.serving.attention import ATTENTION_PATHS, use_paged_attention  # noqa: F401 (notebook 05)
from kvlab.serving.engine import Engine
from kvlab.serving.request import Chunk
from kvlab.serving.runner import ModelRunner, cache_for, model_geometry  # noqa: F401 (cache_for)


@torch.inference_mode()
def prefill(
    model, cache: PagedKVCache, seq_id: int, token_ids=None, attention="kernel", max_tokens=None
) -> int | None:
    """Run ``seq_id``'s not yet computed tokens through ``model`` (after reserving ``token_ids``
    behind them, if given); returns the greedy next token, or None if ``max_tokens`` stopped the
    chunk short of the sequence's last token."""
    runner = ModelRunner(model, cache, attention)  # checks the model against the cache first
    vocab = model.config.vocab_size
    new = [] if token_ids is None else _token_ids("token_ids", token_ids, vocab, empty=True)
    start, count, fed = _checks.prefill_span(cache, seq_id, new, vocab, max_tokens)
    with cache.all_or_nothing():
        if new:
            cache.reserve(seq_id, new)
        cache.commit(seq_id, start + count)  # the step is scheduled: its slots count as written
        (next_token,) = runner.run([Chunk(seq_id, start, fed[:count])])
    return next_token if count == len(fed) else None


@torch.inference_mode()
def decode_step(model, cache: PagedKVCache, seq_ids, tokens, attention="kernel") -> list[int]:
    """One decode step for a batch: ``tokens[i]`` is fed to ``seq_ids[i]``; returns the next
    tokens."""
    runner = ModelRunner(model, cache, attention)
    seq_ids = integers("seq_ids", seq_ids, 0)
    tokens = _token_ids("tokens", tokens, model.config.vocab_size)
    _checks.decoding(cache, seq_ids, tokens)
    with cache.all_or_nothing():
        chunks = []
        for seq_id, token in zip(seq_ids, tokens):
            cache.reserve(seq_id, [token])
            chunks.append(Chunk(seq_id, cache.num_computed(seq_id), [token]))
            cache.commit(seq_id, cache.num_tokens(seq_id))
        return runner.run(chunks)


@dataclass(frozen=True)
class Generation:
    """One prompt through the paged cache: its tokens, and how much of its prompt the cache
    served."""

    tokens: list
    cached_tokens: int
    prompt_tokens: int


def generate(
    model, cache: PagedKVCache, token_ids, max_new_tokens: int, salt=None, attention="kernel",
    stop=None,
) -> Generation:  # fmt: skip
    """Greedy decoding of one prompt on ``cache``, reusing whatever prefix it holds (notebook 06).

    Stops after ``max_new_tokens``, or at the first token in ``stop`` (token ids, kept in the
    output, as ``model.generate`` keeps its end-of-sequence token). The sequence is freed at the
    end; with prefix caching its full blocks (prompt and generated tokens) stay cached for the next
    request. The last generated token is never fed back, so its K and V are never computed. All or
    nothing: a generation the free blocks cannot hold to ``max_new_tokens`` is refused before it
    starts (:class:`OutOfBlocksError`, with the bytes it needs and the bytes free), and if anything
    fails on the way the cache is as before.
    """
    one_of("attention", attention, ATTENTION_PATHS)
    _checks.cache_fits(model, cache, attention, model_geometry(model))
    max_new_tokens = integer("max_new_tokens", max_new_tokens)
    tokens = _token_ids("token_ids", token_ids, model.config.vocab_size)
    stop = _checks.stop_tokens(stop, model.config.vocab_size)
    what = f"a {len(tokens)}-token prompt and {max_new_tokens} new tokens"
    _checks.blocks_free(cache, _blocks_to_generate(cache, tokens, max_new_tokens, salt), what)
    with cache.all_or_nothing():
        seq_id, cached = cache.admit(tokens, salt)
        out = [prefill(model, cache, seq_id, attention=attention)]
        while len(out) < max_new_tokens and out[-1] not in stop:
            out += decode_step(model, cache, [seq_id], out[-1:], attention)
        cache.free(seq_id)
    return Generation(out, cached, len(tokens))


def _blocks_to_generate(cache, tokens: list[int], max_new_tokens: int, salt) -> int:
    """Admitting the prompt, then the blocks its new tokens grow into (the last is never stored)."""
    stored = len(tokens) + max_new_tokens - 1
    grown = -(-stored // cache.block_size) - -(-len(tokens) // cache.block_size)
    return cache.blocks_to_admit(tokens, salt) + grown


@dataclass(frozen=True)
class PagedRun:
    """What :func:`paged_generate` did: the tokens, and how often it preempted (notebook 05)."""

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
    """Greedy decoding of several prompts (of any lengths, unpadded) on a paged KV cache (notebook
    05).

    The engine of notebook 11 with prefix caching off and no chunking: each step, swapped-out
    requests come back first, waiting prompts are admitted (first come, first served) while blocks
    and ``max_batch`` allow and prefilled in the same forward pass as the running requests' decode
    tokens. When the step needs more blocks than are free, the newest running request is preempted:
    by ``recompute`` (it is prefilled again later, prompt and generated tokens) or ``swap`` (its
    blocks go to host memory and back). ``num_blocks`` defaults to enough for every request at once.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a non-empty list of token-id lists (or 1-D tensors)")
    vocab = causal_lm("model", model).config.vocab_size
    prompts = [_token_ids(f"prompts[{i}]", p, vocab) for i, p in enumerate(prompts)]
    max_new_tokens = integer("max_new_tokens", max_new_tokens)
    block_size, max_batch = integer("block_size", block_size), integer("max_batch", max_batch)
    longest = -(-(max(map(len, prompts)) + max_new_tokens - 1) // block_size)  # in blocks
    num_blocks = longest * len(prompts) if num_blocks is None else integer("num_blocks", num_blocks)
    engine = Engine(
        model, num_blocks, block_size, max_batch, max(max_batch, sum(map(len, prompts))), False,
        preemption, attention=attention, cuda_graphs=False, watermark=0.0,
    )  # fmt: skip
    _checks.blocks_free(engine.cache, longest, free=num_blocks)  # the longest could never run
    tokens, stats = engine.generate(prompts, max_new_tokens), engine.scheduler.stats
    return PagedRun(
        tokens, engine.stats.steps, stats.preemptions, stats.recomputed_tokens,
        stats.swapped_blocks, engine.stats.peak_blocks,
    )  # fmt: skip
