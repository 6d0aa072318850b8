"""Readings of section 9.5, PagedAttention (notebook ``05_paged_attention``)."""

from __future__ import annotations

from kvlab._checks import instance, unmeasured
from kvlab.lab.timing import compare_timings
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.theory.agreement import ABOVE, AGREES, DISAGREES, compare, within_factor
from kvlab.theory.paging import gather_overhead_s, paging_saves

GEMV = "[GEMV-like behaviour in decode](03_gemv.ipynb)"


def event_reading(snapshot: dict, event: int, num_blocks: int) -> str:
    """Under the block-table explorer: what the event did and which blocks are shared."""
    instance("snapshot", snapshot, dict)
    used = sum(1 for r in snapshot["refs"] if r > 0)
    shared = [b for b, r in enumerate(snapshot["refs"]) if r > 1]
    tables = "; ".join(
        f"{name} → {blocks} ({n} tokens)"
        for name, (blocks, n) in sorted(snapshot["tables"].items())
    )
    text = (
        f"Event {event}: {snapshot['event']}. Tables: {tables}. {used} of {num_blocks} physical "
        "blocks are in use"
    )
    if shared:
        return (
            text + f"; block{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))} "
            f"{'are' if len(shared) > 1 else 'is'} shared by two tables (marked ×2)."
        )
    return text + "; no block is shared."


# The simulated waste saving agrees with the per-request formula's within this factor.
SAVING_TOLERANCE = 2.0


def waste_reading(
    runs: dict,
    predicted: dict,
    trace,
    distribution: str,
    block_size: int,
    budget: int,
    max_len: int,
) -> str:
    """Under the allocation explorer: waste, batch and preemptions of the three allocators, read
    against the per-request formula (``kvlab.theory.paging.predicted_waste``; the verdict is
    ``paging_saves``, and the simulated saving is held against the formula's within
    ``SAVING_TOLERANCE``)."""
    instance("runs", runs, dict)
    instance("predicted", predicted, dict)
    instance("distribution", distribution, str)
    mx, est, pg = runs["reserve-max"], runs["reserve-estimate"], runs["paged"]
    text = [
        f"On {len(trace)} {distribution} requests with a budget of {budget:,} tokens and"
        f" {block_size}-token blocks, reserving the maximum wasted **{mx.waste_fraction:.0%}** of"
        f" the allocated KV memory, reserving an estimate {est.waste_fraction:.0%}, and paging"
        f" **{pg.waste_fraction:.1%}**. The per-request formula, $1 - \\sum (P + g - 1) / \\sum"
        f" \\text{{slots}}(g)$, predicts {predicted['reserve-max']:.0%} and"
        f" {predicted['paged']:.1%} for the first and the last."
    ]
    saves = paging_saves(trace, block_size, max_len)
    if saves:
        text.append(
            f"The waste turns into batch size: on average {mx.mean_batch:.1f} requests ran at once "
            f"under reserve-max and {pg.mean_batch:.1f} under paging, which finished the trace "
            f"{mx.steps / pg.steps:.1f} times sooner, in decode steps."
        )
        # The formula's saving (reserve-max's waste minus paging's) against the simulated one.
        saved = within_factor(
            mx.waste_fraction - pg.waste_fraction,
            predicted["reserve-max"] - predicted["paged"],
            SAVING_TOLERANCE,
        )
        if saved.outcome == "below":
            text.append(
                "The simulation contradicts the formula here: the waste paging saved is"
                f" {saved.describe()}. The formula ignores queueing and preemption, and readmitted"
                " requests start a partly filled block again."
            )
    else:
        text.append(
            f"The formula predicts no saving: with {block_size}-token blocks a request's blocks"
            f" hold at least the {max_len} slots of a maximal reservation, so blocks this large"
            f" give back what paging saves. Mean batch {mx.mean_batch:.1f} (reserve-max) against"
            f" {pg.mean_batch:.1f} (paged)."
        )
    if pg.preemptions:
        text.append(
            f"Paging paid with {pg.preemptions} preemptions, because it admits a request as soon "
            "as its prompt fits and only finds out later that the running batch needs more blocks "
            "than exist."
        )
    else:
        text.append(
            "Paging needed no preemption: the budget held every admitted request to the end."
        )
    text.append(f"Its block tables took at most {pg.peak_metadata_bytes:,} bytes.")
    return " ".join(text)


def attention_reading(
    context: int, timing, copy_bytes_per_s: float, gap_spread: float = 0.0
) -> str:
    """Paged against contiguous decode attention at the longest context (``timing``: an
    ``AttentionTiming``); the verdict is ``kvlab.lab.timing.compare_timings`` on the two timings'
    repeats. On the gather path the gap between the fastest repeats is compared with
    ``gather_overhead_s`` (``kvlab.theory.agreement.compare``, band ``gap_spread``: the gap's
    relative scatter from one run to the next)."""
    if missing := unmeasured(copy_bytes_per_s=copy_bytes_per_s, gap_spread=gap_spread):
        return missing
    c = compare_timings(timing.contiguous, timing.paged)  # ratio: paged time / contiguous time
    text = (
        f"At a context of {context:,} tokens the paged path ({timing.path}) read the cache at"
        f" **{si(timing.paged_bytes_per_s, 'B/s')}** and SDPA on the contiguous cache at"
        f" **{si(timing.contiguous_bytes_per_s, 'B/s')}**, so the paged step took {c.ratio:.1f}"
        " times as long (medians of one loop that alternates the two); this machine copies at"
        f" {si(copy_bytes_per_s, 'B/s')}."
    )
    if c.outcome == "faster":
        if timing.path == "gather":
            extra = gather_overhead_s(timing.kv_bytes, copy_bytes_per_s)
            gap = timing.paged.min - timing.contiguous.min
            g = compare(gap, extra, gap_spread)
            text += (
                " On a CPU the paged path gathers before it attends: it copies the"
                f" {si(timing.kv_bytes, 'B')} of keys and values out of their blocks and zeroes"
                " the slots past each sequence's end, two passes that would take"
                f" {si(extra, 's')} at the copy bandwidth (`gather_overhead_s`). The measured gap"
                f" (fastest repeats) is {si(gap, 's')}, {g.describe()}."
            )
            if g.outcome == AGREES:
                return text + (
                    " The gather's two passes are the gap. A fused kernel reads each block in"
                    " place, which is the point of writing one; whether kvlab's reaches the copy"
                    " bandwidth is a GPU measurement."
                )
            if g.outcome == DISAGREES and g.side == ABOVE:
                return text + (
                    " The model misses what the passes cost beyond their bytes: the gather is an"
                    " advanced index (`k_cache[index]`), which PyTorch's CPU path moves element by"
                    " element, several times slower than a copy of the same bytes (an"
                    " `index_select` over whole blocks runs near the copy rate); the zeroing is a"
                    " `masked_fill_`, and SDPA then reads the gathered keys through a transposed,"
                    " strided view. None of that is reading the cache, and a fused kernel does"
                    " none of it."
                )
            if g.outcome == DISAGREES:
                return text + (
                    " The gap is smaller than the two passes predict: part of the gathered cache"
                    " stayed in the CPU's caches, which a copy of this size mostly does not."
                )
            return text + (
                f" This run cannot tell: the gap sits {g.side} the two passes by more than its"
                " spread, not by enough to call the model wrong."
            )
        return (
            text + " The kernel reads blocks in place, so the gap is the kernel's own efficiency: "
            "block-table lookups and smaller tiles than SDPA's."
        )
    if c.outcome == "even":
        return (
            text
            + " Within the spread of the repeats the paged path kept up with the contiguous one:"
            " reading through a block table cost nothing measurable at this size."
        )
    return (
        text + " The paged path beat SDPA on the contiguous cache by more than the spread of the"
        " repeats. SDPA is not written for a single query token (its kernels tile the queries),"
        " and at this size that cost more than reading through a block table."
    )


def preemption_reading(cost, demo_preemptions: int) -> str:
    """Recompute against swap for the largest preempted request (``cost``: a ``PreemptionCost``).
    The request waits for the recompute or for the swap-in; the verdict is ``compare_timings`` of
    the two.
    """
    c = compare_timings(cost.swap_in, cost.recompute)  # ratio: recompute / swap-in
    text = (
        f"For a request holding {cost.tokens} tokens, recompute took"
        f" **{si(cost.recompute.median, 's')}**; swap took {si(cost.swap_out.median, 's')} to copy"
        f" its blocks out and **{si(cost.swap_in.median, 's')}** to copy them back,"
        f" {si(cost.bytes_each_way, 'B')} each way. The request waits for the recompute or for the"
        " swap-in; the swap-out happens when it is preempted, and on a GPU it can overlap the"
        " batch's compute (kvlab's `copy_blocks_to_host` waits for its copies, so here it adds to"
        " that step)."
    )
    if c.outcome == "faster":
        text += (
            f" The swap-in was {ratio_text(c.ratio, 1)} cheaper than the recompute: on this machine"
            " a copy of the blocks costs less than a prefill of the tokens."
        )
    elif c.outcome == "slower":
        text += (
            f" Recompute was {ratio_text(1 / c.ratio, 1)} cheaper than the swap-in: the prefill of"
            " a short request on this small model costs less than moving its blocks and the"
            " bookkeeping around it."
        )
    else:
        text += (
            " The two are within the spread of their repeats: at this size neither is clearly"
            " cheaper on this machine."
        )
    return (
        text
        + f" In the demonstration above, recompute preempted {demo_preemptions} times to finish "
        "three requests in five blocks."
    )
