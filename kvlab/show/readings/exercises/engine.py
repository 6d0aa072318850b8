"""Notebook 11, the continuous-batching engine: worked solutions of the exercises that have
numbers."""

from __future__ import annotations

from kvlab._checks import instance, unmeasured
from kvlab.show.readings.engine import plural, times
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory.agreement import within_factor
from kvlab.theory.serving import CAPACITY_TOLERANCE, batch_bound


def engine_half_pool(capacity: float, max_batch: int, mean_batch: float, preemptions: int) -> str:
    """Exercise 1 of the engine: half the pool. The pool model
    (:func:`kvlab.theory.serving.batch_bound`) predicts what bounds the batch."""
    if missing := unmeasured(mean_batch=mean_batch):
        return solution(1, missing)
    bound, limit = batch_bound(capacity, max_batch)
    text = (
        f"The pool holds about {capacity:.1f} requests of this trace's mean size once halved (the"
        " capacity line of the right panel moves left by half). "
    )
    if bound == "pool":
        text += (
            f"That is fewer than `max_batch` {max_batch}, so the running batch should stop growing"
            f" near {capacity:.1f}, and requests that grow past their share get preempted."
        )
    else:
        text += f"That is still more than `max_batch` {max_batch}, which stays the bound."
    text += (
        f" Measured at `max_batch` {max_batch} with half the pool: a mean running batch of"
        f" {mean_batch:.1f} and {plural(preemptions, 'preemption')}."
    )
    if within_factor(mean_batch, limit, CAPACITY_TOLERANCE).outcome != "above":
        text += " The batch stays within the bound, as predicted."
    else:
        text += (
            " The batch ran above the mean capacity: short requests take less than the mean share,"
            " so more of them fit at once than the average suggests."
        )
    return solution(1, text)


def engine_swap(recompute: dict, swap: dict) -> str:
    """Exercise 3 of the engine: the life of requests with swap instead of recompute. Each dict
    holds ``preempted`` ((step, request, mode) per preemption), ``steps``, ``readmitted_tokens`` and
    ``readmitted_cached`` (recompute), ``swapped_blocks`` (swap), ``same_tokens`` (outputs equal).
    """
    instance("recompute", recompute, dict)
    instance("swap", swap, dict)
    text = (
        "Only the preempted request's row changes. Recompute sends it back to **waiting**, and when"
        " it returns it goes through **prefill** again; swap marks it **swapped** and, when blocks"
        " free up, copies its blocks back and lets it continue with a **decode** step, since its"
        " keys and values were kept bit for bit in host memory."
    )
    if recompute["preempted"] and recompute["readmitted_tokens"]:
        tokens, cached = recompute["readmitted_tokens"], recompute["readmitted_cached"]
        text += (
            f" In this run the recompute prefill was short: {cached} of the {tokens} tokens it"
            " brought back were served from the prefix cache (its own freed blocks), so it"
            f" computed {tokens - cached} again."
        )
    if swap["preempted"]:
        text += (
            f" With swap the engine preempted {times(len(swap['preempted']))} and copied"
            f" {plural(swap['swapped_blocks'], 'block')} out and back, finishing in {swap['steps']}"
            f" steps against {recompute['steps']} with recompute."
        )
    else:
        text += " With swap this run happened not to preempt at all: the steps fell differently."
    text += " The tokens are " + (
        "the same either way, as they must be."
        if swap["same_tokens"]
        else "not the same: that would be a bug; the engine's tests check both modes."
    )
    return solution(3, text)
