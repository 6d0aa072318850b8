"""Readings of the prefix-caching section (notebook ``06_prefix_caching``)."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"
PAGED = "[PagedAttention](05_paged_attention.ipynb)"


def identity_reading(rows, block_size: int) -> str:
    """A table of prompt variants against a reference: where their tokens first differ and how many
    blocks a cache of the reference serves. ``rows``: (name, tokens, first differing index, cached tokens)."""
    lines = [f"With blocks of {block_size} tokens, the cache holding the reference prompt serves:", "",
             "| variant | tokens | first differing token | tokens served from cache | blocks reused |",
             "|---|---:|---:|---:|---:|"]
    for name, tokens, first, cached in rows:
        first_text = "none" if first is None else f"{first:,}"
        lines.append(f"| {name} | {tokens:,} | {first_text} | {cached:,} | {cached // block_size} |")
    lines += ["", "Every variant reuses exactly the whole blocks before its first differing token, and nothing "
              "after it, even where the later tokens are the same ids (they now sit at other positions)."]
    return "\n".join(lines)


def ttft_reading(prompt_tokens: int, block_size: int, cold_s: float, warm_s: float, warm_cached: int,
                 cold_pred_s: float, warm_pred_s: float, middle=None) -> str:
    """Under the time-to-first-token figure: cold against the longest cached prefix, measured and
    predicted; ``middle`` = (cached tokens, measured s, predicted s) of a point in between, if given."""
    measured, predicted = cold_s / warm_s, cold_pred_s / warm_pred_s
    head = (f"A {prompt_tokens:,}-token prompt took **{si(cold_s, 's')}** to its first token with nothing "
            f"cached, and **{si(warm_s, 's')}** with {warm_cached:,} tokens cached (blocks of {block_size}): "
            f"{measured:.1f} times faster. Prefill FLOPs at the calibrated rate predict {si(cold_pred_s, 's')} "
            f"and {si(warm_pred_s, 's')}, a factor of {predicted:.1f}; the cold prefill took "
            f"{ratio_text(cold_s, cold_pred_s)} its prediction.")
    if middle is not None:
        cached, mid_s, mid_pred_s = middle
        head += (f" With {cached:,} tokens cached it took {si(mid_s, 's')} against {si(mid_pred_s, 's')} "
                 f"predicted ({ratio_text(mid_s, mid_pred_s)}).")
    if within(measured, predicted, 1.5):
        return head + " The saving follows the FLOPs the cache removes."
    if measured < predicted:
        return (head + " The measured saving is smaller than predicted. The prediction counts only the "
                "matrix multiplications, and those shrink with the uncached suffix; what does not shrink is "
                "the fixed cost of every forward pass (the Python of each layer, kernel launches, gathering "
                "the cached blocks). With a short suffix that floor dominates, which is why the measured "
                "curve flattens at the right of the figure on a CPU.")
    return (head + " The measured saving is larger than predicted: a short suffix's matrices fit the CPU's "
            "caches and multiply faster than the calibrated large matrix multiplication, while the cold "
            "prefill ran at about the calibrated rate.")


def trace_reading(cache_blocks: int, block_size: int, block_bytes: float, lru_hit: float, reserve_hit: float,
                  lru_ttft: float, reserve_ttft: float, none_ttft: float, num_system_prompts: int) -> str:
    """Under the trace figure: the three policies at the cache size the slider picks."""
    head = (f"With {num_system_prompts} system prompt{'s' if num_system_prompts > 1 else ''} and a cache of "
            f"{cache_blocks:,} blocks of {block_size} tokens ({si(cache_blocks * block_bytes, 'B')} of K and V "
            f"for this model), LRU served **{100 * lru_hit:.0f}%** of prompt tokens from the cache and "
            f"evicting nothing (reserve) **{100 * reserve_hit:.0f}%**. The mean predicted time to first token "
            f"is {si(lru_ttft, 's')} with LRU, {si(reserve_ttft, 's')} with reserve and {si(none_ttft, 's')} "
            f"without caching.")
    if lru_hit > reserve_hit + 0.02:
        return (head + " LRU wins here: the chats active now are not the ones that arrived first, and "
                "reserve keeps the first arrivals' histories for good while LRU lets them go.")
    if reserve_hit > lru_hit + 0.02:
        return (head + " Reserve wins here, which LRU was expected to do: a cache just large enough for the "
                "working set lets LRU evict a system prompt's blocks between two uses, while reserve pinned "
                "them when they first arrived.")
    return (head + " The two policies are within two percentage points of each other: at this size the "
            "cache holds nearly everything the trace reuses, so what gets evicted hardly matters, or it is "
            "so small that both keep little more than the system prompts.")


def decode_reading(computed_s: float, cached_s: float, prompt_tokens: int, cached_tokens: int,
                   kv_bytes: float) -> str:
    """Where caching does not help: decode steps after a computed and after a cached prefix."""
    head = (f"After a {prompt_tokens:,}-token prompt, a decode step took **{si(computed_s, 's')}** (median) when "
            f"the prompt had been computed and **{si(cached_s, 's')}** when {cached_tokens:,} of its tokens "
            f"came from the cache. Either way each step reads the same {si(kv_bytes, 'B')} of K and V.")
    if within(cached_s, computed_s, 1.15):
        return head + " The two are equal within noise: the cache saves prefill work, not decode work."
    return (head + " They differ by more than the noise we expect, though both steps do the same work. "
            "On a shared CPU the likely reason is another process running during one of the two runs; "
            "run the cell again and compare the medians.")


def memory_reading(cached_blocks: int, block_bytes: float, hit_rate: float, held_blocks: int) -> str:
    """What a hit costs in memory: the blocks the cache keeps while no request uses them."""
    return (f"At the end of the LRU replay the cache kept {cached_blocks:,} blocks holding reusable K and V, "
            f"{si(cached_blocks * block_bytes, 'B')} for this model, to serve {100 * hit_rate:.0f}% of prompt "
            f"tokens; at its fullest it held {held_blocks:,}. A hit is paid for in memory held between uses: "
            f"those blocks are free to evict, but while they stay they are KV memory that no running request "
            f"is using, which a busier server would rather give to a larger batch ({PAGED}, {MEMORY_WALL}).")
