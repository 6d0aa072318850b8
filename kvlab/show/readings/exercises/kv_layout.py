"""Notebook 04, KV-cache layout (section 9.4): worked solutions of the exercises that have numbers.

Each prediction is the bytes model of ``kvlab.lab.layout_timing`` (``predicted_s``: bytes read over
the read bandwidth, bytes copied over the copy rate); each decision is
``kvlab.theory.kv_traffic.compare_with_bytes`` on fastest repeats, with the two timings' spreads
added as the tolerance.
"""

from __future__ import annotations

from kvlab._checks import instance, integer, record, unmeasured
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.show.readings.kv_layout import APPEND, READ
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory.agreement import ABOVE, AGREES, BELOW, CANNOT_TELL, combined_spread
from kvlab.theory.kv_traffic import cache_resident, compare_with_bytes


def _ratio(a, b, predicted: float):
    """Measurement ``a`` over ``b`` (fastest repeats) against the bytes model's ratio."""
    spread = combined_spread(a.timing.spread_above_min, b.timing.spread_above_min)
    return compare_with_bytes(a.timing.min / b.timing.min, predicted, spread)


def _missed(c, side: str) -> bool:
    return c.outcome not in (AGREES, CANNOT_TELL) and c.side == side


def kv_layout_batch(lo_read, hi_read, lo_append, hi_append, llc: int | None) -> str:
    """Exercise 1 of 9.4: read and append time when the batch grows (``BHTD`` read and index append
    measurements at the two batches; ``llc`` the device's last-level cache in bytes)."""
    record("lo_read", lo_read, *READ)
    record("hi_read", hi_read, *READ)
    record("lo_append", lo_append, *APPEND)
    record("hi_append", hi_append, *APPEND)
    llc = None if llc is None else integer("llc", llc)
    runs = {"lo_read": lo_read, "hi_read": hi_read, "lo_append": lo_append, "hi_append": hi_append}
    if missing := unmeasured(**{f"{k}.timing.min": m.timing.min for k, m in runs.items()}):
        return solution(1, missing)
    b_lo, b_hi = lo_read.batch, hi_read.batch
    c = _ratio(hi_read, lo_read, hi_read.predicted_s / lo_read.predicted_s)
    app = hi_append.timing.min / lo_append.timing.min
    text = (
        f"The read moves $2BsHDw$ bytes, proportional to $B$: going from {b_lo} to {b_hi} sequences"
        f" should multiply its time by **{c.predicted:g}** (the bytes model:"
        f" {si(lo_read.predicted_s, 's')} and {si(hi_read.predicted_s, 's')}). The `index` append"
        " writes $2BHDw$ bytes, a few kilobytes, so its time is the fixed cost of one operation"
        " and should barely move. Measured: the append went from"
        f" {si(lo_append.timing.min, 's')} to {si(hi_append.timing.min, 's')} ({app:.1f}x),"
        f" and the read (the two batches timed in alternation) from {si(lo_read.timing.min, 's')}"
        f" to {si(hi_read.timing.min, 's')},"
        f" **{c.measured:.2f}x**, {c.ratio:.2f} times the prediction, which {verdict_words(c)}."
    )
    if _missed(c, BELOW):
        if cache_resident(lo_read.kv_bytes, llc) and not cache_resident(hi_read.kv_bytes, llc):
            text += (
                f" The read grew less than its bytes: the {b_lo}-sequence cache"
                f" ({si(lo_read.kv_bytes, 'B')}) fits in this device's {si(llc, 'B')} last-level"
                f" cache with room to spare and the {b_hi}-sequence one does not, so the smaller"
                " batch read faster than DRAM."
            )
        else:
            text += (
                " The read grew less than its bytes although both caches sit on the same side of"
                " the last-level cache: the smaller batch paid more time per byte, so part of its"
                " read is a cost that does not grow with the batch, which the bytes model leaves"
                " out."
            )
    elif _missed(c, ABOVE):
        text += (
            " The read grew more than its bytes: the larger batch moved each byte more slowly than"
            " the smaller one, which the bytes model, one rate for every size, does not predict."
        )
    elif c.agrees:
        text += " The read scales with its bytes, as predicted."
    return solution(1, text)


def kv_layout_block1(
    D: int, w: int, runs_1: dict, runs_16: dict, block: int, gather_1, gather_16
) -> str:
    """Exercise 2 of 9.4: one-token blocks (``gather_1``, ``gather_16``: ``NHD`` read
    measurements)."""
    instance("runs_1", runs_1, dict)
    instance("runs_16", runs_16, dict)
    c = _ratio(gather_1, gather_16, gather_1.predicted_s / gather_16.predicted_s)
    text = (
        "With one token per block, a block of `HND` holds one vector per head, so a head's"
        f" contiguous run is one head vector, $D w$ = **{si(D * w, 'B')}**, the same as `NHD`: the"
        " layouts differ only inside a block, and a one-token block has no inside. kvlab's runs:"
        f" `HND` {si(runs_1['HND'], 'B')} at block 1 against {si(runs_16['HND'], 'B')} at block"
        f" {block}; `NHD` {si(runs_1['NHD'], 'B')} and {si(runs_16['NHD'], 'B')}. The gather copies"
        f" the same bytes through {block} times as many pieces: the bytes model puts block 1 at"
        f" {c.predicted:.3f} times block {block}, the longer block table adding almost nothing, so"
        " any slowdown is the pieces'. Measured on one `NHD` read:"
        f" {si(gather_1.timing.min, 's')} at block 1 against {si(gather_16.timing.min, 's')}"
        f" at block {block}, {c.ratio:.2f} times the prediction, which {verdict_words(c)}."
    )
    if _missed(c, ABOVE):
        text += " Slower than its bytes: per-block indexing costs more than the bytes."
    elif _missed(c, BELOW):
        text += (
            " Faster than its bytes say, which indexing cannot explain: the one-token blocks"
            " read more bytes per second than the 16-token ones, against the bytes model."
        )
    elif c.agrees:
        text += (
            " Not slower here: PyTorch's indexed copy handles one-token blocks as one gather over"
            " rows, so on this machine the table's length costs little next to the bytes. A kernel"
            " that loops over blocks would show the penalty."
        )
    return solution(2, text)


def kv_layout_cat(read, cat) -> str:
    """Exercise 3 of 9.4: ``torch.cat`` growth (an append measurement) against the read it
    serves."""
    record("read", read, *READ)
    record("cat", cat, *APPEND)
    if missing := unmeasured(
        **{"read.timing.min": read.timing.min, "cat.timing.min": cat.timing.min}
    ):
        return solution(3, missing)
    s = read.context
    c = _ratio(cat, read, cat.predicted_s / read.predicted_s)
    text = (
        "The ratio of bytes is $2 \\cdot 2B(s+1)HDw \\,/\\, 2BsHDw = 2(s+1)/s$,"
        f" **{2 * (s + 1) / s:.3f}** at $s$ = {s:,}: growth by concatenation costs about twice the"
        " read it serves, because it reads and writes the whole cache. Measured at the defaults:"
        f" {si(cat.timing.min, 's')} against {si(read.timing.min, 's')},"
        f" **{c.measured:.2f}x**, {c.ratio:.2f} times the prediction, which {verdict_words(c)}."
    )
    if _missed(c, BELOW):
        text += (
            " Below the byte ratio: the read is slower per byte than a copy, because its time"
            " includes attention's arithmetic (the scores, the softmax and the weighted sum), which"
            " a byte count leaves out."
        )
    elif _missed(c, ABOVE):
        text += (
            " Above the byte ratio: `torch.cat` also allocates a new tensor every step, and on a"
            " CPU the allocator's fresh pages cost time on top of the bytes."
        )
    elif c.agrees:
        text += " Close to the byte ratio."
    text += (
        " Preallocating removes the copy and gives every step the same addresses; the risk is the "
        "memory reserved for tokens that may never come, which is what paging recovers "
        "([PagedAttention](05_paged_attention.ipynb))."
    )
    return solution(3, text)
