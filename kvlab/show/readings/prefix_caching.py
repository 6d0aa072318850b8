"""Readings of the prefix-caching section (notebook ``06_prefix_caching``).

Each sentence that decides between outcomes takes the decision from the model that predicts it: the
block rule (:func:`kvlab.cache.blocks.reusable_tokens`), prefill FLOPs
(:func:`kvlab.theory.roofline.prefill_time`, judged by :func:`agreement.compare` through
:func:`kvlab.theory.prefix.ttft_saving`), a trace's replay under
three eviction rules (:func:`kvlab.theory.prefix.hit_rate_verdict`), equal bytes per decode step
(:func:`kvlab.theory.prefix.decode_steps_compare`) and the roofline of a prefill attention launch
(:func:`kvlab.theory.prefill_attention.attention_floor`).
"""

from __future__ import annotations

from kvlab._checks import instance, integer, items, unmeasured
from kvlab.cache.blocks import reusable_tokens
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory.agreement import ABOVE, AGREES, CANNOT_TELL, DISAGREES, compare
from kvlab.theory.prefix import decode_steps_compare, hit_rate_verdict, ttft_saving

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"
PAGED = "[PagedAttention](05_paged_attention.ipynb)"
RULE = "whole blocks before the first differing token, and never the prompt's last token"


def _variant(name: str, row: tuple) -> tuple:
    """One row of ``identity_reading``: (name, tokens, first differing index or None, served)."""
    if len(row) != 4:
        raise ValueError(f"{name} must be (name, tokens, first, served), got {row!r}")
    label, tokens, first, served = row
    tokens = integer(f"{name}'s tokens", tokens)
    first = None if first is None else integer(f"{name}'s first differing token", first, 0)
    return label, tokens, first, integer(f"{name}'s served tokens", served, 0, tokens + 1)


def identity_reading(rows, block_size: int) -> str:
    """A table of prompt variants against a reference: where their tokens first differ, the tokens
    the block rule predicts a cache of the reference serves, and the tokens the block manager
    served. ``rows``: (name, tokens, first differing index or None, served tokens)."""
    block_size = integer("block_size", block_size)
    rows = items("rows", rows, tuple, what="(name, tokens, first, served) tuples")
    if not rows:
        raise ValueError("rows must hold at least one variant, got an empty list")
    rows = [_variant(f"rows[{i}]", row) for i, row in enumerate(rows)]
    lines = [
        f"With blocks of {block_size} tokens, the cache holding the reference serves:",
        "",
        (
            "| variant | tokens | first differing token | predicted by the rule | served | blocks"
            " reused |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    wrong = []
    for name, tokens, first, served in rows:
        predicted = reusable_tokens(first, tokens, block_size)
        if predicted != served:
            wrong.append(f"{name} ({served:,} served, {predicted:,} predicted)")
        first_text = "none" if first is None else f"{first:,}"
        lines.append(
            f"| {name} | {tokens:,} | {first_text} | {predicted:,} | {served:,} |"
            f" {served // block_size} |"
        )
    lines.append("")
    if not wrong:
        lines.append(
            f"Every variant got exactly what the rule predicts ({RULE}) and nothing after it, "
            "even where later token ids are the same: they sit at other positions, behind a parent "
            "hash that differs."
        )
    else:
        lines.append(
            f"The rule ({RULE}) predicted other counts for: {', '.join(wrong)}. A cache serving"
            " more than the rule allows would be reusing K and V computed for other tokens; one"
            " serving less has lost blocks it should hold (evicted, or never registered because"
            " their K and V were not written). Check that the reference was committed into this"
            " cache."
        )
    return "\n".join(lines)


def chat_reading(
    system_tokens: int,
    block_size: int,
    questions: int,
    hit_rate: float,
    cold_s: float,
    cached_s: float,
    hf_cold_s: float,
    hf_reused_s: float,
    pred_cold_s: float,
    pred_cached_s: float,
    pred_hf_reused_s: float,
    reuse_spread: float = 0.0,
    saving_spread: float = 0.0,
) -> str:
    """The real chat prompts: kvlab's prefix cache against computing everything and against
    transformers' copied prefix cache. Times are mean time to first token per question (medians over
    rounds); the predictions are prefill FLOPs at the calibrated matmul rate
    (``roofline.prefill_time``). ``reuse_spread``: the relative spread of transformers' time over
    kvlab's from one interleaved round to the next, the band of the three-outcome comparison of
    that ratio with its FLOPs (``kvlab.theory.agreement.compare``); ``saving_spread`` the same for
    kvlab's cold time over its cached one."""
    if missing := unmeasured(
        hit_rate=hit_rate,
        cold_s=cold_s,
        cached_s=cached_s,
        hf_cold_s=hf_cold_s,
        hf_reused_s=hf_reused_s,
        reuse_spread=reuse_spread,
    ):
        return missing
    saving = ttft_saving(cold_s, cached_s, pred_cold_s, pred_cached_s, saving_spread)
    text = [
        f"{questions} questions behind one system prompt of {system_tokens:,} tokens: the cache"
        f" served **{hit_rate:.0%}** of their prompt tokens. Time to first token was"
        f" **{si(cached_s, 's')}** with the system prompt's blocks cached and **{si(cold_s, 's')}**"
        f" with nothing cached, a saving of {saving.measured:.1f} times; prefill FLOPs at the"
        f" calibrated rate (`roofline.prefill_time`) predict {saving.predicted:.1f} times:"
        f" {saving.comparison.describe()}."
    ]
    if saving.verdict == "agrees":
        text.append("The saving follows the FLOPs the cache removes.")
    elif saving.verdict == "cannot tell":
        text.append("This run's rounds scatter too much to say whether it follows the FLOPs.")
    elif saving.verdict == "below":
        text.append(
            "The saving is smaller than the FLOPs predict: through the two points, each prefill"
            f" has about {si(max(saving.fixed_s, 0.0), 's')} that does not shrink with the cached"
            " prefix (the Python of every layer, the output head, the cache's bookkeeping), and on"
            " a short suffix that is most of what is left."
        )
    else:
        text.append(
            "The saving is larger than the FLOPs predict: the short suffix's matrices fit the CPU's"
            " caches and multiply faster than the calibrated large matrix multiplication."
        )
    measured, predicted = hf_reused_s / cached_s, pred_hf_reused_s / pred_cached_s
    text.append(
        "The way a reader reuses a prefix with transformers, a `DynamicCache` prefilled with the"
        f" system prompt and copied for every request, took {si(hf_reused_s, 's')} (and"
        f" {si(hf_cold_s, 's')} with nothing cached): {ratio_text(hf_reused_s, cached_s)} kvlab's"
        " time. It computes fewer tokens, since it caches the prefix token by token and kvlab only"
        f" in whole blocks of {block_size}: {1 - predicted:.0%} fewer FLOPs, so the FLOPs predict"
        f" {predicted:.2f} times kvlab's time."
    )
    c = compare(measured, predicted, reuse_spread)
    text.append(f"Measured: {c.describe()} (its rounds {reuse_spread:.0%} apart).")
    if c.outcome == AGREES:
        text.append("The two follow their FLOPs: a prefix cache saves the same work either way.")
    elif c.outcome == DISAGREES and c.side == ABOVE:
        text.append(
            "transformers took longer than its FLOPs predict: copying the whole prefix cache for"
            " every request (a deep copy of every layer's K and V) and `generate`'s own setup are"
            " paid per request, while kvlab's blocks are shared in place; neither is in the FLOPs."
        )
    elif c.outcome == DISAGREES:
        text.append(
            "kvlab took longer than the FLOPs predict against transformers: its step builds the "
            "paged metadata and gathers the cached blocks for attention, work a contiguous cache "
            "does not do, and on a short suffix that shows."
        )
    else:
        text.append(
            f"This run cannot tell: the ratio sits {c.side} the FLOPs' prediction by more than its"
            " rounds' spread, not by enough to call it a miss."
        )
    return " ".join(text)


def ttft_reading(
    prompt_tokens: int,
    block_size: int,
    cold_s: float,
    warm_s: float,
    warm_cached: int,
    cold_pred_s: float,
    warm_pred_s: float,
    middle=None,
    spread: float = 0.0,
) -> str:
    """Under the time-to-first-token figure: cold against the longest cached prefix, measured and
    predicted (``roofline.prefill_time``); ``middle`` = (cached tokens, measured s, predicted s) of
    a point in between, if given; ``spread`` the measured saving's relative scatter (the two
    timings' added), the band of ``kvlab.theory.agreement.compare``."""
    if missing := unmeasured(cold_s=cold_s, warm_s=warm_s):
        return missing
    saving = ttft_saving(cold_s, warm_s, cold_pred_s, warm_pred_s, spread)
    head = (
        f"A {prompt_tokens:,}-token prompt took **{si(cold_s, 's')}** to its first token with"
        f" nothing cached, and **{si(warm_s, 's')}** with {warm_cached:,} tokens cached (blocks of"
        f" {block_size}): {saving.measured:.1f} times faster. Prefill FLOPs at the calibrated rate"
        f" (`roofline.prefill_time`) predict {si(cold_pred_s, 's')} and {si(warm_pred_s, 's')}, a"
        f" factor of {saving.predicted:.1f}; the saving is {saving.comparison.describe()}. The"
        f" cold prefill took {ratio_text(cold_s, cold_pred_s)} its prediction."
    )
    if middle is not None:
        cached, mid_s, mid_pred_s = middle
        head += (
            f" With {cached:,} tokens cached it took {si(mid_s, 's')} against {si(mid_pred_s, 's')}"
            f" predicted ({ratio_text(mid_s, mid_pred_s)})."
        )
    if saving.verdict == "agrees":
        return head + " The saving follows the FLOPs the cache removes."
    if saving.verdict == "cannot tell":
        return head + (
            f" This run cannot tell: the saving sits {saving.comparison.side} the prediction by"
            " more than its spread, not by enough to call the model wrong."
        )
    if saving.verdict == "below":
        return (
            head + " The measured saving is smaller than predicted. The prediction counts only the"
            " matrix multiplications, which shrink with the uncached suffix; a straight line"
            " through the cold and the cached point puts about"
            f" {si(max(saving.fixed_s, 0.0), 's')} per prefill beside them that does not shrink"
            " (the Python of each layer, kernel launches, gathering the cached blocks). With a"
            " short suffix that floor dominates."
        )
    return (
        head
        + " The measured saving is larger than predicted: a short suffix's matrices fit the CPU's"
        " caches and multiply faster than the calibrated large matrix multiplication, while the"
        " cold prefill ran at about the calibrated rate."
    )


LEAF_FIRST = {
    "tie": (
        " Leaf-first LRU matches LRU within two points: a request frees its last block first, so"
        " a chain's root is freed after its leaves and LRU already evicts leaves first."
    ),
    "more": (
        " Leaf-first LRU served more: LRU gave up blocks that cached blocks still chain from (a"
        " copy freed before its child), and every block behind such a gap is unreachable."
    ),
    "less": (
        " Leaf-first LRU served less: it kept parents whose children were not asked for again"
        " and evicted fresher leaves in their place."
    ),
}
LFU = {
    "tie": (
        " LFU matches LRU within two points: at this size the blocks hit most and the blocks"
        " freed last are nearly the same."
    ),
    "more": (
        " LFU served more: a block hit before outranks every block not hit yet, so it kept the"
        " system prompts, which LRU let bursts of new chats push out."
    ),
    "less": (
        " LFU served less: a count only grows while its block stays cached, so blocks hit often"
        " earlier keep their place while the active chats' fresh history, not hit yet, goes first"
        " and is computed again at the next turn."
    ),
}


def trace_reading(
    cache_blocks: int,
    block_size: int,
    block_bytes: float,
    lru_hit: float,
    leaf_hit: float,
    lfu_hit: float,
    lru_ttft: float,
    leaf_ttft: float,
    lfu_ttft: float,
    none_ttft: float,
    num_system_prompts: int,
) -> str:
    """Under the trace figure: LRU, leaf-first LRU and LFU at the cache size the slider picks, each
    of the other two against LRU (``hit_rate_verdict``)."""
    if missing := unmeasured(
        lru_hit=lru_hit,
        leaf_hit=leaf_hit,
        lfu_hit=lfu_hit,
        lru_ttft=lru_ttft,
        leaf_ttft=leaf_ttft,
        lfu_ttft=lfu_ttft,
        none_ttft=none_ttft,
    ):
        return missing
    head = (
        f"With {num_system_prompts} system prompt{'s' if num_system_prompts > 1 else ''} and"
        f" {cache_blocks:,} blocks of {block_size} tokens"
        f" ({si(cache_blocks * block_bytes, 'B')} of K and V), the cache served"
        f" **{100 * lru_hit:.0f}%** of prompt tokens under LRU, **{100 * leaf_hit:.0f}%** under"
        f" leaf-first LRU and **{100 * lfu_hit:.0f}%** under LFU; mean predicted time to first"
        f" token {si(lru_ttft, 's')}, {si(leaf_ttft, 's')} and {si(lfu_ttft, 's')}, against"
        f" {si(none_ttft, 's')} without caching."
    )
    return (
        head
        + LEAF_FIRST[hit_rate_verdict(leaf_hit, lru_hit)]
        + LFU[hit_rate_verdict(lfu_hit, lru_hit)]
    )


def decode_reading(
    computed_s: float,
    cached_s: float,
    prompt_tokens: int,
    cached_tokens: int,
    kv_bytes: float,
    spread: float = 0.0,
) -> str:
    """Where caching does not help: decode steps after a computed and after a cached prefix,
    predicted equal because they read the same bytes (``decode_steps_compare`` with the two
    timings' ``spread``)."""
    if missing := unmeasured(computed_s=computed_s, cached_s=cached_s):
        return missing
    head = (
        f"After a {prompt_tokens:,}-token prompt, a decode step took **{si(computed_s, 's')}**"
        f" (fastest repeat) when the prompt had been computed and **{si(cached_s, 's')}** when"
        f" {cached_tokens:,} of its tokens came from the cache. Either way each step reads the same"
        f" {si(kv_bytes, 'B')} of K and V, so the two should take the same time."
    )
    c = decode_steps_compare(computed_s, cached_s, spread)
    head += f" Their ratio is {c.ratio:.2f}: {verdict_words(c)}."
    if c.outcome == AGREES:
        return head + " The cache saves prefill work, not decode work."
    if c.outcome == CANNOT_TELL:
        return head + " Within this run's noise neither step is clearly slower."
    return head + (
        " They differ by more than the noise, though both steps read the same bytes: the model"
        " has no term for that. On a shared CPU a neighbour that slowed most repeats of one of the"
        " two is the usual cause; run the cell again."
    )


def memory_reading(
    cached_blocks: int,
    block_bytes: float,
    hit_rate: float,
    peak_cached: int,
    evictions: int,
    requests: int,
    demo_blocks: int,
    demo_evicted: int,
) -> str:
    """What a cached block costs: not admission capacity (``num_free`` counts it), but evictions and
    the hash table. ``demo_*``: a request that took every block of a cache full of cached blocks."""
    if missing := unmeasured(hit_rate=hit_rate):
        return missing
    text = [
        f"At the end of the LRU replay {cached_blocks:,} free blocks still held reusable K and V"
        f" ({si(cached_blocks * block_bytes, 'B')}), serving {100 * hit_rate:.0f}% of prompt"
        f" tokens; at most {peak_cached:,} were cached at once. They cost a new request nothing:"
        " `num_free` counts a cached block as free, and admission evicts its hash when it takes"
        f" it; above, a request needing all {demo_blocks:,} blocks of a cache whose every block"
        f" was cached was admitted at once and evicted {demo_evicted:,} hashes."
    ]
    if evictions:
        text.append(
            f"What caching costs is churn, {requests:,} requests giving up {evictions:,} hashes to"
            " make room (a prefix evicted and asked for again is computed again), and the hash"
            f" table, one entry per cached block, looked up on every admission ({PAGED},"
            f" {MEMORY_WALL})."
        )
    else:
        text.append(
            "The replay evicted nothing, so the only cost was the hash table: one entry per cached"
            f" block, looked up on every admission ({PAGED})."
        )
    return " ".join(text)


def prefill_cost_reading(cost, hw_name: str, what: str) -> str:
    """How this page's prefill attention runs and what it would cost on ``hw_name``. ``cost``: a
    :class:`kvlab.lab.prefix.PrefillAttentionCost` (per layer, times ``cost.layers``); ``what``: the
    step.
    """
    instance("hw_name", hw_name, str)
    instance("what", what, str)
    L = cost.layers
    kernel, rows = cost.kernel_floor, cost.rows_floor
    text = [
        f"For {what}, prefill attention does {cost.kernel.flops * L:.3g} FLOP over all {L} layers"
        f" and must read {si(cost.kernel.bytes * L, 'B')} (each context's K and V once, the queries"
        " and the outputs). Run as one decode row per query token, as the reference path does,"
        " every row reads its whole context again:"
        f" {si(cost.rows.tile_bytes * L, 'B')}. The paged prefill kernel reads the context once per"
        f" tile of {cost.tokens_per_tile} query tokens with all the query heads of a KV head:"
        f" {si(cost.kernel.tile_bytes * L, 'B')}, an upper bound that the GPU's caches lower."
    ]
    floors = [
        (
            name,
            floor,
            f"{si(floor.seconds * L, 's')}, set by "
            + (
                "its FLOPs at the bf16 rate"
                if floor.bound == "compute"
                else "its bytes at the HBM bandwidth"
            ),
        )
        for name, floor in (
            ("decode rows", rows),
            ("the kernel's tiles", kernel),
            ("every byte read once", cost.compulsory_floor),
        )
    ]
    text.append(
        f"On an {hw_name} (the roofline: the larger of FLOPs over the bf16 rate and bytes over the"
        " HBM bandwidth, `attention_floor`), the floor is "
        + "; ".join(f"for {n}, {t}" for n, _, t in floors)
        + "."
    )
    if kernel.bound == "memory" and cost.compulsory_floor.bound == "compute":
        text.append(
            "The gap between the last two is what the GPU's L2 cache recovers when neighbouring"
            " tiles read the same blocks at about the same time; a tile of more query rows would"
            " need less of it."
        )
    text.append(
        "Serving engines prefill the same way as the kernel: vLLM with FlashAttention's varlen"
        " kernel reading block tables, SGLang and others with FlashInfer's paged prefill."
    )
    return " ".join(text)
