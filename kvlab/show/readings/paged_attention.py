"""Readings of section 9.5, PagedAttention (notebook ``05_paged_attention``)."""

from __future__ import annotations

from kvlab._checks import instance, integer, record, unmeasured
from kvlab.lab.timing import compare_timings
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.theory.agreement import ABOVE, AGREES, BELOW, DISAGREES, compare
from kvlab.theory.paging import gather_overhead_s, paging_saves

GEMV = "[GEMV-like behaviour in decode](03_gemv.ipynb)"
PREEMPTION_COST = "kvlab.lab.preemption.PreemptionCost"


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
    ``paging_saves``, and the simulated saving is held against the formula's by
    ``kvlab.theory.agreement.compare`` with no spread: the simulation is deterministic, so only the
    band's floor separates the two)."""
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
            f"under reserve-max and {pg.mean_batch:.1f} under paging, which finished the trace in"
            f" {mx.steps / pg.steps:.1f} times fewer decode steps."
        )
        # The formula's saving (reserve-max's waste minus paging's) against the simulated one.
        saved = compare(
            mx.waste_fraction - pg.waste_fraction,
            predicted["reserve-max"] - predicted["paged"],
            0.0,
        )
        if saved.outcome == DISAGREES and saved.side == BELOW:
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
        if pg.recomputed_tokens:
            text.append(
                f"Each preempted request was recomputed: {pg.recomputed_tokens:,} tokens prefilled"
                " again in all, which the simulator charges nothing (it counts decode steps), so"
                " in time paging's lead is smaller than in steps."
            )
    else:
        text.append(
            "Paging needed no preemption: the budget held every admitted request to the end."
        )
    text.append(f"Its block tables took at most {pg.peak_metadata_bytes:,} bytes.")
    return " ".join(text)


def attention_reading(context: int, timing, copy_bytes_per_s: float) -> str:
    """Paged against contiguous decode attention at the longest context (``timing``: an
    ``AttentionTiming``). On the gather path the gap between the fastest repeats is read against
    ``gather_overhead_s`` at the rate of the copy timed in the same loop, and so is the gather
    alone (``kvlab.theory.agreement.compare``, spreads from the scatter of each minimum); elsewhere
    the verdict is ``kvlab.lab.timing.compare_timings`` on the two timings' repeats."""
    if missing := unmeasured(copy_bytes_per_s=copy_bytes_per_s):
        return missing
    text = (
        f"At a context of {context:,} tokens the paged path ({timing.path}) read the cache at"
        f" **{si(timing.paged_bytes_per_s, 'B/s')}** and SDPA on the contiguous cache at"
        f" **{si(timing.contiguous_bytes_per_s, 'B/s')}** (medians of one loop that alternates"
        " them)."
    )
    if timing.path == "gather" and timing.copy is not None:
        return text + gather_reading(timing, copy_bytes_per_s)
    c = compare_timings(timing.contiguous, timing.paged)  # ratio: paged time / contiguous time
    text += f" The paged step took {c.ratio:.1f} times as long."
    if c.outcome == "faster":
        return (
            text + " The kernel reads blocks in place, so the gap is the kernel's own efficiency: "
            "block-table lookups and smaller tiles than SDPA's."
        )
    if c.outcome == "even":
        return text + (
            " The repeats of the two overlap, so this run cannot tell them apart: at this size"
            " reading through a block table cost nothing the noise does not cover."
        )
    return (
        text + " The paged path beat SDPA on the contiguous cache by more than the spread of the"
        " repeats. SDPA is not written for a single query token (its kernels tile the queries),"
        " and at this size that cost more than reading through a block table."
    )


def gather_reading(timing, copy_bytes_per_s: float) -> str:
    """The gather path's gap, its model and the term the model leaves out."""
    if missing := unmeasured(copy_bytes_per_s=copy_bytes_per_s):
        return missing
    kv, copy = timing.kv_bytes, timing.copy
    rate = 2 * kv / copy.min  # the copy beside reads and writes kv bytes
    extra = gather_overhead_s(kv, rate)
    gap = timing.paged.min - timing.contiguous.min
    gap_spread = (
        timing.paged.min * timing.paged.spread_above_min
        + timing.contiguous.min * timing.contiguous.spread_above_min
    ) / max(gap, 1e-12)
    whole = compare(gap, extra, gap_spread + copy.spread_above_min)
    alone = compare(
        timing.gather.min, extra, timing.gather.spread_above_min + copy.spread_above_min
    )
    text = (
        " On a CPU the paged path gathers before it attends: it copies the"
        f" {si(kv, 'B')} of keys and values out of their blocks (and zeroes the few slots past"
        " each sequence's end), one pass over those bytes (`gather_overhead_s`). A plain copy of"
        f" the same bytes, timed in the same loop, ran at {si(rate, 'B/s')} (they fit the CPU's"
        f" last-level cache; the large-buffer copy rate is {si(copy_bytes_per_s, 'B/s')}), so the"
        " gather"
        f" should add {si(extra, 's')}. The gather alone took {si(timing.gather.min, 's')},"
        f" {alone.describe()}; the whole gap (fastest repeats) was {si(gap, 's')},"
        f" {whole.describe()}."
    )
    if whole.outcome == AGREES:
        return text + (
            " The gather's copy is the gap. A fused kernel reads each block in place, which is the"
            " point of writing one."
        )
    rest = max(gap - timing.gather.min, 0.0)
    if whole.outcome == DISAGREES and whole.side == ABOVE:
        return text + (
            f" The model misses the other {si(rest, 's')}: SDPA then attends over the gathered keys"
            " through a transposed, strided view with a mask, and on this CPU that takes longer"
            " than the same attention over the contiguous cache (its fast path wants contiguous"
            " keys and no mask). The model prices the copy, not what it does to the attention"
            " after it; a fused kernel pays neither."
            + (
                ""
                if alone.outcome != DISAGREES
                else " The gather itself is slower than a copy of its bytes too: it copies block"
                " by block through an index and builds its masks, work a plain copy does not do."
            )
        )
    if whole.outcome == DISAGREES:
        return text + (
            " The gap is smaller than the copy predicts: SDPA over the gathered keys read them"
            " while they were still in the CPU's caches."
        )
    return text + (
        f" This run cannot tell: the gap sits {whole.side} the copy by more than its spread, not"
        f" by enough to call the model wrong. Of the gap, the gather itself took"
        f" {si(timing.gather.min, 's')}; the rest, {si(rest, 's')}, is SDPA attending over the"
        " gathered, strided keys, a term the model does not have."
    )


def preemption_reading(cost, demo_preemptions: int) -> str:
    """Recompute against swap for the largest preempted request (``cost``: a ``PreemptionCost``).
    The request waits for the recompute or for the swap-in; the verdict is ``compare_timings`` of
    the two.
    """
    demo_preemptions = integer("demo_preemptions", demo_preemptions, 0)
    timed = ("recompute", "swap_out", "swap_in")
    record("cost", cost, PREEMPTION_COST, "tokens", "bytes_each_way", *timed)
    if missing := unmeasured(**{f"cost.{t}.median": getattr(cost, t).median for t in timed}):
        return missing
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
