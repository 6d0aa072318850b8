"""Notebook 04, KV-cache layout (section 9.4): its readings.

Every time on the page is predicted by the bytes model of ``kvlab.lab.layout_timing``: attention's
read of K and V over the read bandwidth and every copy (reads plus writes) over the copy rate, its
``predicted_s``.
A reading that decides whether a time follows its bytes calls
``kvlab.theory.kv_traffic.compare_with_bytes`` (``agreement.compare`` with the spread of the
timings behind it), and names the likely cause of a read that beats its bytes with
``cache_resident``.
"""

from __future__ import annotations

from kvlab._checks import instance, integer, record, unmeasured
from kvlab.show.format import si
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory.agreement import ABOVE, AGREES, BELOW, CANNOT_TELL, combined_spread
from kvlab.theory.kv_traffic import cache_resident, compare_with_bytes

MODEL = (
    "the bytes model (`kvlab.lab.layout_timing`: bytes read over the read bandwidth, bytes copied"
    " over the copy rate)"
)
# the measurement records of kvlab.lab.layout_timing, by the fields the readings use
READ = (
    "kvlab.lab.layout_timing.ReadMeasurement",
    "batch",
    "context",
    "kv_heads",
    "kv_bytes",
    "timing",
    "predicted_s",
)
APPEND = ("kvlab.lab.layout_timing.AppendMeasurement", "new_bytes", "timing", "predicted_s")


def layout_table(reads: dict, read_bw, copy_bw: float, batch: int, context: int) -> str:
    """The four layouts' reads side by side, as a Markdown table.

    ``reads`` maps a layout name to its read measurement (``kv_bytes``, ``kv_bytes_per_s``,
    ``predicted_s``, ``timing.min``), in display order, ``BHTD`` first; ``read_bw`` is the read
    bandwidth measured in the same rounds (a ``Ceiling``: ``rate`` and ``spread``) and ``copy_bw``
    the copy rate. No read from memory can stream K and V faster than the read bandwidth; a row
    that does beyond the spread is marked and explained.
    """
    if missing := unmeasured(copy_bw=copy_bw):
        return missing
    base = reads["BHTD"].timing.min
    first = next(iter(reads.values()))
    lines = [
        (
            f"At the default setting (batch {batch}, context {context:,}), one layer's read covers"
            f" {si(first.kv_bytes, 'B')} of keys and values. A read-only stream measured in the"
            f" same rounds ran at {si(read_bw.rate, 'B/s')} (repeats within {read_bw.spread:.0%});"
            f" the copy rate is {si(copy_bw, 'B/s')}, counting reads plus writes. The"
            " ceilings' time prices attention's read at the first and a gather's copy at the"
            " second. Fastest of three interleaved rounds:"
        ),
        "",
        "| layout | K+V read per second | of the read bandwidth | ceilings' time / measured |"
        " time / `BHTD` time |",
        "|---|---:|---:|---:|---:|",
    ]
    beyond = []
    for name, r in reads.items():
        label = f"`{name}`" + (" (gather)" if name in ("NHD", "HND") else "")
        share = r.kv_bytes_per_s / read_bw.rate
        if share > 1 + read_bw.spread + r.timing.spread_above_min:
            beyond.append(name)
        lines.append(
            f"| {label} | {si(r.kv_bytes_per_s, 'B/s')} | {share:.0%} |"
            f" {r.predicted_s / r.timing.min:.0%} | {r.timing.min / base:.1f} |"
        )
    if beyond:
        lines += [
            "",
            f"{', '.join(f'`{n}`' for n in beyond)} read faster than the read bandwidth beyond the"
            " spread: its keys and values were served partly from the last-level cache.",
        ]
    return "\n".join(lines)


def _residency(read, llc: int | None) -> str:
    """Why a read can beat its bytes: its cache fits the device's largest hardware cache, or not."""
    where = (
        f"this device's {si(llc, 'B')} last-level cache"
        if llc
        else "the device's last-level cache (size unknown)"
    )
    if cache_resident(read.kv_bytes, llc):
        return (
            f"its {si(read.kv_bytes, 'B')} of keys and values fit in {where} with room to spare, so"
            " repeats read them from there rather than from DRAM"
        )
    return (
        f"its {si(read.kv_bytes, 'B')} of keys and values do not fit in {where} with room to spare,"
        " so the likelier cause is a calibration taken while the machine was busier than during"
        " this read"
    )


def _missed(c, side: str) -> bool:
    """Whether a comparison disagrees on ``side``."""
    return c.outcome not in (AGREES, CANNOT_TELL) and c.side == side


def append_reading(read, index, slot, cat) -> str:
    """The read path against the append paths: ``read`` (a ``BHTD`` read measurement), the ``index``
    and ``cat`` appends of the same cache and the ``NHD`` ``slot`` append, each with its
    ``predicted_s`` and its timing's spread.
    """
    record("read", read, *READ)
    record("index", index, *APPEND)
    record("slot", slot, *APPEND)
    record("cat", cat, *APPEND)
    runs = {"read": read, "index": index, "slot": slot, "cat": cat}
    if missing := unmeasured(**{f"{k}.timing.min": m.timing.min for k, m in runs.items()}):
        return missing
    time_ratio = read.timing.min / index.timing.min
    bytes_ratio = read.kv_bytes / index.new_bytes
    text = [
        f"In-place appends cost {si(index.timing.min, 's')} (`BHTD` index) and"
        f" {si(slot.timing.min, 's')} (`NHD` slot, its arguments checked once before timing) per"
        f" step. The read cost **{si(read.timing.min, 's')}**, {time_ratio:,.0f} times the index"
        f" append, while it moves {bytes_ratio:,.0f} times the append's new bytes ($s$ ="
        f" {read.context:,}): a ratio that grows with every token, so the read path is the one to"
        " optimize at long context. The append's time is almost all the fixed cost of one"
        " operation, which a byte count leaves out, so the time ratio stays far below $s$."
    ]
    spread = combined_spread(cat.timing.spread_above_min, read.timing.spread_above_min)
    c = compare_with_bytes(
        cat.timing.min / read.timing.min, cat.predicted_s / read.predicted_s, spread
    )
    text.append(
        f"Growth by `torch.cat` took **{si(cat.timing.min, 's')}** per step: it reads and writes"
        f" the whole cache to add one token, so {MODEL} puts it at {c.predicted:.2f} times"
        f" the read; measured, {c.ratio:.2f} times, which {verdict_words(c)}."
    )
    if _missed(c, BELOW):
        text.append(
            "Less than its bytes say: the read is slower per byte than its stream, because"
            " attention also computes (scores, softmax, the weighted sum) and SDPA makes its own"
            " passes, which a byte count leaves out."
        )
    elif _missed(c, ABOVE):
        text.append(
            "More than its bytes say: `torch.cat` allocates a new tensor every step, and fresh"
            " pages cost the allocator and the operating system time on top of the copy."
        )
    elif c.agrees:
        text.append("As its bytes say.")
    return " ".join(text) + " A preallocated or paged cache removes this term entirely."


def explore_reading(
    layout: str, context: int, read, appends: dict, llc: int | None, ceiling_spread: float
) -> str:
    """Under the layout explorer: the selected context's read against the bytes model, and the
    appends. ``llc``: the device's last-level cache in bytes
    (``kvlab.lab.layout_timing.last_level_cache_bytes``); ``ceiling_spread``: the spread of the
    calibrated ceilings the prediction uses, added to the read's own.
    """
    instance("layout", layout, str)
    instance("appends", appends, dict)
    spread = combined_spread(read.timing.spread_above_min, ceiling_spread)
    c = compare_with_bytes(read.timing.min, read.predicted_s, spread)
    text = [
        f"`{layout}` at {context:,} tokens: the read took **{si(read.timing.min, 's')}**;"
        f" {MODEL} predicts {si(read.predicted_s, 's')}: {c.ratio:.2f} times, which"
        f" {verdict_words(c)}."
    ]
    if _missed(c, BELOW):
        text.append(f"It beat its bytes: {_residency(read, llc)}.")
    elif _missed(c, ABOVE):
        text.append(
            "It is slower than its bytes: shorter contiguous runs, attention's own passes, or "
            "another process on the machine."
        )
    elif c.agrees:
        text.append("It streams at about its ceilings.")
    parts = ", ".join(f"{m} {si(a.timing.min, 's')}" for m, a in appends.items())
    text.append(f"Appends: {parts}.")
    return " ".join(text)


def gqa_reading(mha, small, llc: int | None) -> str:
    """Fewer KV heads: ``mha`` and ``small`` are read measurements with the same query heads; the
    time ratio (fastest repeats) is held against the bytes model's, with the two timings' spreads
    added as the tolerance."""
    record("mha", mha, *READ)
    record("small", small, *READ)
    llc = None if llc is None else integer("llc", llc)
    runs = {"mha": mha, "small": small}
    if missing := unmeasured(**{f"{k}.timing.min": m.timing.min for k, m in runs.items()}):
        return missing
    bytes_ratio = mha.predicted_s / small.predicted_s
    spread = combined_spread(mha.timing.spread_above_min, small.timing.spread_above_min)
    c = compare_with_bytes(mha.timing.min / small.timing.min, bytes_ratio, spread)
    text = (
        f"Going from {mha.kv_heads} KV heads to {small.kv_heads}, with the query heads unchanged,"
        f" cut the cache by {mha.kv_bytes / small.kv_bytes:.3g} times ({si(mha.kv_bytes, 'B')} to"
        f" {si(small.kv_bytes, 'B')}) and the read time by **{c.measured:.3g} times**."
        f" {MODEL.capitalize()} predicts a fall of {bytes_ratio:.3g} times: the measured fall"
        f" {verdict_words(c)}."
    )
    if _missed(c, ABOVE):
        both = cache_resident(mha.kv_bytes, llc)
        if cache_resident(small.kv_bytes, llc) and not both:
            why = (
                f"the smaller cache fits in this device's {si(llc, 'B')} last-level cache with room"
                " to spare and the larger one does not, so repeats read the smaller one from that"
                " cache, faster than DRAM"
            )
        else:
            why = (
                "the two caches sit on the same side of the device's last-level cache"
                f" ({si(llc, 'B') if llc else 'size unknown'}), yet the larger read paid more time"
                " per byte, which the bytes model, one rate for every size, does not predict"
            )
        return text + f" Time fell more than the bytes: {why}."
    if _missed(c, BELOW):
        return (
            text
            + " Time fell less than the bytes: at few KV heads each byte serves more query heads,"
            " so attention's arithmetic and fixed per-call costs, not bytes, set the smaller"
            " read's time."
        )
    if c.outcome == CANNOT_TELL:
        return text
    return text + " Time follows bytes: the read is bandwidth-bound."
