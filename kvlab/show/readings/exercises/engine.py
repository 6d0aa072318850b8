"""Notebook 11, the continuous-batching engine: worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab.show.readings.exercises.folded import solution


def engine_half_pool(capacity: float, max_batch: int, mean_batch: float, preemptions: int) -> str:
    """Exercise 1 of the engine: half the pool."""
    text = (f"The pool holds about {capacity:.1f} requests of this trace's mean size once halved (the capacity "
            "line of the right panel moves left by half). A larger `max_batch` cannot run more than that: the "
            f"running batch should stop growing near {capacity:.1f}, and requests that grow past their share "
            f"get preempted. Measured at `max_batch` {max_batch} with half the pool: a mean running batch of "
            f"{mean_batch:.1f} and {preemptions} preemption{'s' * (preemptions != 1)}.")
    if mean_batch <= capacity * 1.2:
        text += " The batch stops at the pool, as predicted."
    else:
        text += (" The batch ran above the mean capacity: short requests take less than the mean share, so "
                 "more of them fit at once than the average suggests.")
    return solution(1, text)
