"""Notebook 04, KV-cache layout (section 9.4): its readings."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within


def layout_table(reads: dict, beta: float, batch: int, context: int) -> str:
    """The four layouts' reads side by side, as a Markdown table.

    ``reads`` maps a layout name to its read measurement (``kv_bytes``, ``kv_bytes_per_s``,
    ``fraction_of_copy``, ``timing.median``), in display order, ``BHTD`` first.
    """
    base = reads["BHTD"].timing.median
    first = next(iter(reads.values()))
    lines = [f"At the default setting (batch {batch}, context {context:,}), one layer's read covers "
             f"{si(first.kv_bytes, 'B')} of keys and values. The calibrated copy bandwidth is "
             f"{si(beta, 'B/s')}, counting reads plus writes. Measured side by side, in three "
             "interleaved rounds, the read streamed K and V at:", "",
             "| layout | K+V read per second | moved bytes per second / copy bandwidth | time / `BHTD` time |",
             "|---|---:|---:|---:|"]
    for name, r in reads.items():
        label = f"`{name}`" + (" (gather)" if name in ("NHD", "HND") else "")
        lines.append(f"| {label} | {si(r.kv_bytes_per_s, 'B/s')} | {r.fraction_of_copy:.0%} | "
                     f"{r.timing.median / base:.1f} |")
    return "\n".join(lines)


def append_reading(t_read: float, t_index: float, t_slot: float, t_cat: float, bytes_ratio: float) -> str:
    """The read path against the append paths, in time and in bytes."""
    time_ratio = t_read / t_index
    text = [f"In-place appends cost {si(t_index, 's')} (`BHTD` index) and {si(t_slot, 's')} (`NHD` slot, "
            f"including `store_kv`'s argument checks) per step. The read cost **{si(t_read, 's')}**, "
            f"{time_ratio:,.0f} times as long. Counted in bytes, the read moves {bytes_ratio:,.0f} times "
            "the append's bytes, and that ratio grows with every token, which is why the read path is "
            "the one to optimize at long context."]
    if time_ratio < bytes_ratio:
        text.append("The measured time ratio is smaller than the byte ratio because an append's time is "
                    "almost all fixed per-operation cost.")
    else:
        text.append("The measured time ratio is at least the byte ratio, which an append's fixed "
                    "per-operation cost should prevent; the read was probably slowed by another process "
                    "on this shared machine (rerun the cell).")
    if t_cat > t_read:
        text.append(f"Growth by `torch.cat` took **{si(t_cat, 's')}** per step, {ratio_text(t_cat, t_read)} "
                    "the read it serves: it copies the whole cache to add one token. A preallocated or "
                    "paged cache removes that term entirely.")
    else:
        text.append(f"Growth by `torch.cat` took {si(t_cat, 's')} per step, {ratio_text(t_cat, t_read)} the "
                    "read it serves. Its bytes are twice the read's, so it was expected to take longer; "
                    "a copy streams faster than attention reads on this machine, since attention also "
                    "computes. A preallocated or paged cache still removes the term entirely.")
    return " ".join(text)


def explore_reading(layout: str, context: int, read, appends: dict) -> str:
    """Under the layout explorer: the selected context's read against its prediction and the appends."""
    text = [f"`{layout}` at {context:,} tokens: the read took **{si(read.timing.median, 's')}** against a "
            f"prediction of {si(read.predicted_s, 's')} ({ratio_text(read.timing.median, read.predicted_s)})."]
    if within(read.timing.median, read.predicted_s, 1.5):
        text.append("It streams at about the copy bandwidth.")
    elif read.timing.median > read.predicted_s:
        text.append("It is slower than its bytes: shorter contiguous runs, attention's own arithmetic, or "
                    "another process on the machine.")
    else:
        text.append("It is faster than its bytes: part of the cache stayed in the CPU's last-level cache "
                    "between repeats.")
    parts = ", ".join(f"{m} {si(a.timing.median, 's')}" for m, a in appends.items())
    text.append(f"Appends: {parts}.")
    return " ".join(text)


def gqa_reading(h_mha: int, h_small: int, bytes_ratio: float, time_ratio: float) -> str:
    """Fewer KV heads: the read time against the bytes."""
    text = (f"Going from {h_mha} KV heads to {h_small}, with the query heads unchanged, cut the cache by "
            f"{bytes_ratio:.0f} times and the read time by **{time_ratio:.1f} times**.")
    if within(time_ratio, bytes_ratio, 1.5):
        return text + " Time follows bytes while the read is bandwidth-bound."
    if time_ratio < bytes_ratio:
        return text + (" Time fell less than the bytes: at few KV heads each byte serves more query heads, "
                       "so attention's arithmetic and fixed per-call costs, not bytes, set the smaller "
                       "read's time.")
    return text + (" Time fell more than the bytes: the smaller cache stayed in the CPU's last-level cache "
                   "between repeats and was read faster than DRAM.")
