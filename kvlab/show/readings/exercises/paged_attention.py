"""Notebook 05, PagedAttention (section 9.5): worked solutions of the exercises that have
numbers."""

from __future__ import annotations

from kvlab._checks import instance, unmeasured
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory.paging import waste_bound, within_waste_bound


def paged_block_size(
    block: int, mean_tokens: float, formula: float, simulated, simulated_16: float
) -> str:
    """Exercise 1 of 9.5: the paged allocator's waste at a larger block size. ``simulated`` is the
    simulator's ``SimResult``; the verdict is ``kvlab.theory.paging.within_waste_bound`` with the
    tokens its running requests held on average."""
    if missing := unmeasured(simulated_16=simulated_16):
        return solution(1, missing)
    bound = waste_bound(block, mean_tokens)
    held = simulated.mean_tokens_held
    text = (
        "A running request wastes at most $B - 1$ slots, the unused tail of its last block, and"
        f" about $(B-1)/2$ on average. With $B = {block}$ and requests holding {mean_tokens:.0f}"
        " tokens on average over their lives, the bound is $(B-1)/(\\bar L + B - 1)$ ="
        f" **{bound:.0%}**, and half a block of waste per request gives about"
        f" {(block - 1) / 2 / (mean_tokens + (block - 1) / 2):.0%}; the per-request formula of the"
        f" page, which follows every step of the trace, gives {formula:.0%}. The simulator measured"
        f" **{simulated.waste_fraction:.0%}**, against {simulated_16:.0%} at block 16. Its running"
        f" requests held {held:.0f} tokens on average over its steps, which puts the bound at"
        f" {waste_bound(block, held):.0%}."
    )
    if within_waste_bound(simulated.waste_fraction, block, held):
        text += " It stays under the bound: the block size, not the allocator, sets paged waste."
    else:
        text += (
            " It is above the bound computed from its own steps, which no allocation of whole"
            " blocks can exceed: the simulator's accounting is wrong, a bug."
        )
    return solution(1, text)


def paged_fork_append(before: dict, after: dict, copied_from: int, copied_to: int) -> str:
    """Exercise 2 of 9.5: appending to B instead of its fork B'."""
    instance("before", before, dict)
    instance("after", after, dict)
    return solution(
        2,
        "After the fork, B and B' share every block, including B's partly filled last block"
        f" ({copied_from}). Whichever of the two writes first gets the copy: appending to **B**"
        f" copies that block into a free one ({copied_to}) and points **B's** table at it, and B'"
        f" keeps the original. B's table goes from {before['B']} to {after['B']}; B' stays"
        f" {after[chr(66) + chr(39)]}. The 5 tokens fill the copied block's empty slots first and"
        " take a new block only for what does not fit. Copy-on-write does not care which sharer"
        " writes; it protects the one that did not.",
    )


def paged_swap_steps(steps: dict, preemptions: dict, recomputed: int) -> str:
    """Exercise 3 of 9.5: the simulator's steps to finish a trace with swap instead of recompute."""
    instance("steps", steps, dict)
    instance("preemptions", preemptions, dict)
    same = steps["swap"] == steps["recompute"]
    text = (
        "The simulator counts decode steps, one token per running request per step, and charges no"
        f" step for a prefill. Recompute re-prefills a preempted request ({recomputed:,} tokens"
        " here) at no cost in steps, and swap copies blocks at no cost in steps either, so the"
        " prediction is **the same number of steps**, or nearly: the two may readmit requests in a"
        f" different order. Measured: {steps['recompute']:,} steps with recompute"
        f" ({preemptions['recompute']} preemptions), {steps['swap']:,} with swap"
        f" ({preemptions['swap']})."
    )
    if same:
        text += " The same, as predicted."
    else:
        text += (
            f" They differ by {abs(steps['swap'] - steps['recompute']):,} steps: a swapped request"
            " comes back first and keeps its blocks' worth of tokens, which changes which requests"
            " run together. The time difference, prefill against copies, is what the measurement"
            " above shows."
        )
    return solution(3, text)
