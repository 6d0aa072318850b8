"""Notebook 04, KV-cache layout (section 9.4): worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within
from kvlab.show.readings.exercises.folded import solution


def kv_layout_batch(b_lo: int, b_hi: int, read_pred: tuple, read_meas: tuple, append_meas: tuple) -> str:
    """Exercise 1 of 9.4: read and append time when the batch grows."""
    pred, meas, app = read_pred[1] / read_pred[0], read_meas[1] / read_meas[0], append_meas[1] / append_meas[0]
    text = (f"The read moves $2BsHDw$ bytes, proportional to $B$: going from {b_lo} to {b_hi} sequences should "
            f"multiply its time by **{b_hi / b_lo:g}** (predicted {si(read_pred[0], 's')} and "
            f"{si(read_pred[1], 's')}). The `index` append writes $2BHDw$ bytes, a few kilobytes, so its time is "
            "the fixed cost of one operation and should barely move. Measured: the read went from "
            f"{si(read_meas[0], 's')} to {si(read_meas[1], 's')} (**{meas:.1f}x**), the append from "
            f"{si(append_meas[0], 's')} to {si(append_meas[1], 's')} ({app:.1f}x).")
    if within(meas, pred, 1.5):
        text += " The read scales with its bytes, as predicted."
    else:
        text += (f" The read scaled by {ratio_text(meas, pred)} the predicted factor: a small batch's cache "
                 "partly fits the CPU's last-level cache, so it reads faster than DRAM and the ratio grows; "
                 "on a busy machine contention can move either end.")
    return solution(1, text)


def kv_layout_block1(D: int, w: int, runs_1: dict, runs_16: dict, block: int, gather_1: float,
                     gather_16: float) -> str:
    """Exercise 2 of 9.4: one-token blocks."""
    text = (f"With one token per block, a block of `HND` holds one vector per head, so a head's contiguous run "
            f"is one head vector, $D w$ = **{si(D * w, 'B')}**, the same as `NHD`: the layouts differ only "
            f"inside a block, and a one-token block has no inside. kvlab's runs: `HND` "
            f"{si(runs_1['HND'], 'B')} at block 1 against {si(runs_16['HND'], 'B')} at block {block}; `NHD` "
            f"{si(runs_1['NHD'], 'B')} and {si(runs_16['NHD'], 'B')}. The gather copies the same bytes but "
            f"through {block} times as many table entries and pieces, so it should get slower. Measured on one "
            f"`NHD` read: {si(gather_1, 's')} at block 1 against {si(gather_16, 's')} at block {block} "
            f"({ratio_text(gather_1, gather_16)}).")
    if gather_1 > 1.1 * gather_16:
        text += " Slower, as predicted: per-block indexing costs more than the bytes."
    else:
        text += (" Not slower here: PyTorch's indexed copy handles one-token blocks as one gather over rows, so "
                 "on this machine the table's length costs little next to the bytes. A kernel that loops over "
                 "blocks would show the penalty.")
    return solution(2, text)


def kv_layout_cat(s: int, t_cat: float, t_read: float) -> str:
    """Exercise 3 of 9.4: torch.cat against the read it serves."""
    pred = 2 * (s + 1) / s
    meas = t_cat / t_read
    text = (f"The ratio of bytes is $2 \\cdot 2B(s+1)HDw \\,/\\, 2BsHDw = 2(s+1)/s$, **{pred:.3f}** at $s$ = {s:,}: "
            "growth by concatenation costs about twice the read it serves, because it reads and writes the "
            f"whole cache. Measured at the defaults: {si(t_cat, 's')} against {si(t_read, 's')}, "
            f"**{meas:.1f}x**.")
    if within(meas, pred, 1.5):
        text += " Close to the byte ratio."
    elif meas < pred:
        text += (f" That is {ratio_text(meas, pred)} the byte ratio: the read is slower per byte than a copy, "
                 "because its time includes attention's arithmetic (the scores, the softmax and the weighted "
                 "sum), which a byte count leaves out.")
    else:
        text += (f" That is {ratio_text(meas, pred)} the byte ratio: `torch.cat` also allocates a new tensor "
                 "every step, and on a CPU the allocator's fresh pages cost time on top of the bytes.")
    text += (" Preallocating removes the copy and gives every step the same addresses; the risk is the "
             "memory reserved for tokens that may never come, which is what paging recovers "
             "([PagedAttention](05_paged_attention.ipynb)).")
    return solution(3, text)
