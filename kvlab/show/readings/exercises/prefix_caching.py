"""Notebook 06, prefix caching: worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab._checks import instance, integer, unmeasured
from kvlab.cache.blocks import reusable_tokens
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory.agreement import ABOVE, AGREES, CANNOT_TELL, compare
from kvlab.theory.prefix import hit_rate_verdict


def prefix_whole_blocks(prompt: int, block: int, served: int) -> str:
    """Exercise 1 of prefix caching: a prompt of whole blocks sent twice; the block rule
    (:func:`kvlab.cache.blocks.reusable_tokens`) predicts what the second one reuses."""
    prompt = integer("prompt", prompt, 0)
    block = integer("block", block, 0)
    served = integer("served", served, 0)
    blocks, predicted = prompt // block, reusable_tokens(None, prompt, block)
    text = (
        f"{prompt} tokens in blocks of {block} are {blocks} full blocks, all cached after the first"
        " request. But at least one prompt token must be computed, because its logits give the"
        f" first output token, so the second request can reuse at most {predicted // block} blocks:"
        f" it computes **{prompt - predicted} tokens**, the whole last block, not one."
        f" `BlockManager.lookup` serves {served}."
    )
    if served == predicted:
        text += " As predicted."
    else:
        text += (
            " That is not the predicted count: check that the first request was admitted into this"
            " cache."
        )
    return solution(1, text)


def prefix_system_prompts(block: int, blocks: int, hit: dict) -> str:
    """Exercise 2 of prefix caching: more system prompts in the same memory (``hit[policy,
    prompts]`` from the replay, for ``lru`` and ``lfu`` at 1 and 8 prompts)."""
    instance("hit", hit, dict)
    lfu_kept = hit_rate_verdict(hit["lfu", 8] - hit["lfu", 1], hit["lru", 8] - hit["lru", 1])
    text = (
        "With one system prompt every user shares it; with eight, each is shared by fewer users"
        f" and all eight compete for {blocks} blocks of {block} tokens. LRU keeps what was freed"
        " last, the active chats; LFU keeps what was hit most, the prompts several users share."
        " Replayed hit rates, one system prompt against eight: LRU"
        f" {hit['lru', 1]:.0%} to {hit['lru', 8]:.0%}, LFU {hit['lfu', 1]:.0%} to"
        f" {hit['lfu', 8]:.0%}."
    )
    if lfu_kept == "more":
        text += (
            " **LRU** lost more: between two users of one prompt, the other prompts' traffic"
            " pushes it out, while LFU's count keeps it."
        )
    elif lfu_kept == "less":
        text += (
            " **LFU** lost more: its counts favour the prompts that were hit early, while the"
            " users active now need others."
        )
    else:
        text += (
            " The two lost about the same (within two percentage points): at this size neither"
            " keeps much beyond the prompts in use."
        )
    text += (
        " With a salt per user, no block is shared between users at all, not even the system"
        " prompt: what is left is each user's own earlier turns, which the next turn resends, so"
        " the hit rate falls to the share of a prompt that is that user's history."
    )
    return solution(2, text)


def prefix_ninety(
    prompt: int,
    block: int,
    cached: int,
    predicted: float,
    measured: float,
    cold: float,
    spread: float = 0.0,
) -> str:
    """Exercise 3 of prefix caching: time to first token at a 90% hit rate against
    ``roofline.prefill_time`` (``kvlab.theory.agreement.compare`` with the measurement's
    ``spread``)."""
    if missing := unmeasured(measured=measured, cold=cold):
        return solution(3, missing)
    text = (
        f"A 90% hit on a {prompt}-token prompt is rounded down to whole blocks of {block}: {cached}"
        f" cached tokens. The line (prefill FLOPs of the {prompt - cached} new tokens over the"
        f" calibrated matmul rate) predicts **{si(predicted, 's')}**. `measure_ttft` measured"
        f" **{si(measured, 's')}** (against {si(cold, 's')} with nothing cached)."
    )
    c = compare(measured, predicted, spread)
    text += f" That is {c.describe()}."
    if c.outcome == AGREES:
        text += " Close to the line."
    elif c.outcome == CANNOT_TELL:
        text += " This run's repeats scatter too much to say more."
    elif c.side == ABOVE:
        text += (
            " Above the line: the fixed cost of a forward pass (dispatch, the head, the cache"
            " bookkeeping) does not shrink with the hit rate, and at a high hit rate it is most of"
            " what is left."
        )
    else:
        text += " Below the line: the calibrated rate understates what this small prefill reached."
    return solution(3, text)
