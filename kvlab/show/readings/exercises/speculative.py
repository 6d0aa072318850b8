"""Notebook 13, speculative decoding: worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab._checks import real, unmeasured
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory.speculative import best_k, speedup


def speculative_best_k_here(alpha: float, empty: float, times: dict, task: str) -> str:
    """Exercise 1 of notebook 13: the best k on this machine, from the counted alpha and empty
    fraction of ``task`` and the measured verify times ``times`` (``{positions: seconds}``)."""
    if missing := unmeasured(alpha=alpha, empty=empty):
        return solution(1, missing)
    scores = {
        k: speedup(alpha, k, times[1], times[k + 1], empty=empty)
        for k in sorted(times)
        if k >= 1 and k + 1 in times
    }
    k = max(scores, key=scores.get)
    cost = times[k + 1] / times[1]
    return solution(
        1,
        f"With $\\alpha = {alpha:.2f}$ and {empty:.0%} of the steps empty on the {task} task, and "
        f"the verify steps measured above, the speed-up per step "
        f"$S = E\\,t(1) / t(k+1)$ is largest at **$k = {k}$**: {scores[k]:.2f}x, where one verify "
        f"step of {k + 1} positions costs {cost:.2f} decode steps. "
        + (
            "That is the largest $k$ measured: with guesses this often right, more would still "
            "pay until a pass over more positions grows dearer than the tokens it adds."
            if k == max(scores)
            else "Past it, the extra positions cost more on this CPU (its ridge sits near batch "
            "1) than the few more tokens they bring."
        ),
    )


def speculative_best_k_gpu(alpha: float, ridge_batch: float, device: str) -> str:
    """Exercise 2 of notebook 13: the best k on a GPU whose ridge batch is ``ridge_batch``, for
    prompt lookup (no draft cost) at acceptance ``alpha``."""
    alpha = real("alpha", alpha)
    ridge_batch = real("ridge_batch", ridge_batch)
    k, s = best_k(alpha, ridge_batch, k_max=64)
    k8, limit = speedup(alpha, 8, 1.0, 1.0), 1 / (1 - alpha)
    near = next(j for j in range(1, 65) if speedup(alpha, j, 1.0, 1.0) >= 0.95 * limit)
    return solution(
        2,
        f"On the {device} the ridge batch is about {ridge_batch:.0f} positions, so a verify step "
        f"of up to that many costs one decode step: only $E(\\alpha, k)$ moves. At $\\alpha = "
        f"{alpha:.2f}$ the speed-up climbs with $k$ toward $1/(1-\\alpha) = {limit:.2f}$x and "
        f"never turns down below the ridge (the best $k$ up to 64 is {k}, at {s:.2f}x); "
        f"$k = 8$ gives **{k8:.2f}x** and $k = {near}$ reaches 95% of the limit. On a GPU the "
        "acceptance limits $k$ (and, in a batch, the other requests' share of the step); on this "
        "CPU the verify step's cost does.",
    )
