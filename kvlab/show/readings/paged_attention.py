"""Readings of section 9.5, PagedAttention (notebook ``05_paged_attention``)."""

from __future__ import annotations

from kvlab.show.format import si

GEMV = "[GEMV-like behaviour in decode](03_gemv.ipynb)"


def event_reading(snapshot: dict, event: int, num_blocks: int) -> str:
    """Under the block-table explorer: what the event did and which blocks are shared."""
    used = sum(1 for r in snapshot["refs"] if r > 0)
    shared = [b for b, r in enumerate(snapshot["refs"]) if r > 1]
    tables = "; ".join(f"{name} → {blocks} ({n} tokens)" for name, (blocks, n) in sorted(snapshot["tables"].items()))
    text = (f"Event {event}: {snapshot['event']}. Tables: {tables}. {used} of {num_blocks} physical "
            "blocks are in use")
    if shared:
        return text + f"; block{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))} " \
                      f"{'are' if len(shared) > 1 else 'is'} shared by two tables (marked ×2)."
    return text + "; no block is shared."


def waste_reading(runs: dict, predicted: dict, distribution: str, block_size: int, budget: int,
                  trace_n: int) -> str:
    """Under the allocation explorer: waste, batch and preemptions of the three allocators."""
    mx, est, pg = runs["reserve-max"], runs["reserve-estimate"], runs["paged"]
    text = [f"On {trace_n} {distribution} requests with a budget of {budget:,} tokens and {block_size}-token "
            f"blocks, reserving the maximum wasted **{mx.waste_fraction:.0%}** of the allocated KV memory "
            f"(the per-request formula gives {predicted['reserve-max']:.0%}), reserving an estimate "
            f"{est.waste_fraction:.0%}, and paging **{pg.waste_fraction:.1%}**."]
    if pg.waste_fraction < mx.waste_fraction:
        text.append(f"The waste turns into batch size: on average {mx.mean_batch:.1f} requests ran at once "
                    f"under reserve-max and {pg.mean_batch:.1f} under paging, which finished the trace "
                    f"{mx.steps / pg.steps:.1f} times sooner, in decode steps.")
    else:
        text.append(f"Here paging wasted no less than reserving the maximum: with {block_size}-token blocks "
                    "the last block of a short request is mostly empty, so large blocks give back what "
                    f"paging saves. Mean batch {mx.mean_batch:.1f} (reserve-max) against {pg.mean_batch:.1f} "
                    "(paged).")
    if pg.preemptions:
        text.append(f"Paging paid with {pg.preemptions} preemptions, because it admits a request as soon "
                    "as its prompt fits and only finds out later that the running batch needs more blocks "
                    "than exist.")
    else:
        text.append("Paging needed no preemption: the budget held every admitted request to the end.")
    text.append(f"Its block tables took at most {pg.peak_metadata_bytes:,} bytes.")
    return " ".join(text)


def attention_reading(context: int, path: str, paged_bytes_per_s: float, sdpa_bytes_per_s: float,
                      copy_bytes_per_s: float) -> str:
    """Paged against contiguous decode attention at the longest context."""
    ratio = sdpa_bytes_per_s / paged_bytes_per_s  # paged time / contiguous time
    text = (f"At a context of {context:,} tokens the paged path ({path}) read the cache at "
            f"**{si(paged_bytes_per_s, 'B/s')}** and SDPA on the contiguous cache at "
            f"**{si(sdpa_bytes_per_s, 'B/s')}**, so the paged step took {ratio:.1f} times as long; this "
            f"machine copies at {si(copy_bytes_per_s, 'B/s')}.")
    if ratio > 1.1:
        if path == "gather":
            return text + (" On a CPU the gap is the gather: the paged path copies the whole cache before "
                           "attending. A fused kernel reads each block in place, which is the point of "
                           "writing one; whether kvlab's reaches the copy bandwidth is a GPU measurement.")
        return text + (" The kernel reads blocks in place, so the gap is the kernel's own efficiency: "
                       "block-table lookups and smaller tiles than SDPA's.")
    return text + (" The paged path kept up with the contiguous one: reading through a block table cost "
                   "nothing measurable at this size, because the blocks are long enough to stream.")


def preemption_reading(tokens: int, recompute_s: float, swap_s: float, swap_bytes: float,
                       demo_preemptions: int) -> str:
    """Recompute against swap for the largest preempted request."""
    text = (f"For a request holding {tokens} tokens, recompute took **{si(recompute_s, 's')}** and swap "
            f"**{si(swap_s, 's')}** (moving {si(swap_bytes, 'B')}).")
    if swap_s < recompute_s:
        text += (f" Swap was {recompute_s / swap_s:.0f} times cheaper: on this machine a copy of the blocks "
                 "costs less than a prefill of the tokens.")
    else:
        text += (f" Recompute was {swap_s / recompute_s:.1f} times cheaper: the prefill of a short request "
                 "on this small model costs less than moving its blocks and the bookkeeping around it.")
    return text + (f" In the demonstration above, recompute preempted {demo_preemptions} times to finish "
                   "three requests in five blocks.")
