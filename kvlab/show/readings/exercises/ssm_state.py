"""Notebook 07, hybrid attention and SSM state (section 9.6): worked solutions of the exercises that
have numbers."""

from __future__ import annotations

from kvlab._checks import instance, real, unmeasured
from kvlab.show.format import si
from kvlab.show.readings.exercises.folded import solution
from kvlab.theory import ssm
from kvlab.theory.agreement import FLOOR


def ssm_breakeven(
    name: str,
    d_inner: int,
    conv: int,
    state: int,
    state_bytes: float,
    hidden: int,
    kv_bytes: float,
    tokens: float,
) -> str:
    """Exercise 1 of 9.6: when an attention layer outgrows a Mamba layer."""
    state_bytes = real("state_bytes", state_bytes)
    kv_bytes = real("kv_bytes", kv_bytes)
    tokens = real("tokens", tokens)
    return solution(
        1,
        f"One {name} layer keeps a convolution window and an SSM state:"
        f" $d_\\text{{inner}}(k_\\text{{conv}} + n)$ = {d_inner:,} × ({conv} + {state}) numbers,"
        f" {si(state_bytes, 'B')} in bf16, whatever the length. An attention layer of the same"
        f" width ({hidden:,}, multi-head) stores a key and a value of {hidden:,} numbers per token,"
        f" {si(kv_bytes, 'B')}. `ssm.breakeven_context` divides the two: the attention layer is"
        f" larger after **{tokens:,.0f} tokens**, well inside any real prompt. Grouped-query"
        " attention moves the crossover out in proportion to the group size, not beyond a few"
        " hundred tokens.",
    )


def ssm_narrow_scan(
    dim_before: int,
    dim_after: int,
    state_size: int,
    length: int,
    chunk_size: int,
    tau: float,
    gamma: float,
    winner_before: str,
    times: dict,
    spread: float = 0.0,
) -> str:
    """Exercise 2 of 9.6: a narrower scan makes the per-round cost matter more.

    ``tau`` and ``gamma`` are the cost model's values fitted at ``dim_before``; ``times`` the
    measured seconds of each order at ``length`` tokens and ``dim_after`` channels, ``spread``
    their relative scatter. An order won only when the runner-up took longer by more than the band
    of ``kvlab.theory.agreement`` (the larger of its floor and ``spread``); closer, the run cannot
    tell which won.
    """
    if missing := unmeasured(tau=tau, gamma=gamma):
        return solution(2, missing)
    rows = "\n".join(f"| {m} | {si(t, 's')} |" for m, t in times.items())
    text = (
        "The cost model is $\\tau\\cdot\\text{rounds} +"
        " \\gamma\\cdot\\text{compositions}\\cdot E$ (`kvlab.theory.ssm.scan_time`) with $E$ ="
        f" batch × d × n. Going from d = {dim_before} to d = {dim_after} divides $E$, and with it"
        f" the work term, by {dim_before / dim_after:g}, while the rounds cost the same: the"
        " **round term** gains weight, and the orders with few rounds (parallel, then chunked)"
        " gain on the sequential scan."
    )
    if not ssm.usable_fit(tau, gamma):
        text += (
            " The fit at the wider setting could not tell the two terms apart, so it predicts"
            f" nothing here; at the longest prompt, with d = {dim_after}:\n\n| order | time"
            f" |\n|---|---:|\n{rows}\n\n"
        )
        return solution(2, text + _winner_words(times, spread))
    expected = ssm.fastest_order(length, tau, gamma, dim_after * state_size, chunk_size)
    won = min(times, key=times.get)
    first, second = sorted(times.values())[:2]
    text += (
        f" With the values fitted at d = {dim_before} ($\\tau$ = {si(tau, 's')}, $\\gamma$ ="
        f" {si(gamma, 's')}), `ssm.fastest_order` predicts the **{expected}** scan to win at"
        f" {length:,} tokens (at d = {dim_before} the {winner_before} scan won). Measured at d ="
        f" {dim_after}:\n\n| order | time |\n|---|---:|\n{rows}\n\n"
    )
    if second / first <= 1 + max(FLOOR, spread):
        text += _winner_words(times, spread) + f" The model predicted the {expected} scan."
    elif won == expected:
        text += f"The {won} scan won, as the cost model predicted."
    else:
        text += (
            f"The {won} scan won, not the {expected} one the model predicted. The fit was taken at"
            f" d = {dim_before}; a round's fixed cost is not quite the same at every width (the"
            " tensors of a round shrink with d, and so does the time each operation spends on"
            " them), so the extrapolation misjudges how much of a round is fixed."
        )
    return solution(2, text)


def _winner_words(times: dict, spread: float) -> str:
    """Which order won, or that the two fastest are too close for this run to say."""
    (fast, t1), (runner, t2) = sorted(times.items(), key=lambda kv: kv[1])[:2]
    if t2 / t1 <= 1 + max(FLOOR, spread):
        return (
            f"The {fast} and {runner} scans took {si(t1, 's')} and {si(t2, 's')}, within"
            f" {max(FLOOR, spread):.0%} of each other, the band this run's spread allows: it cannot"
            " tell which order won."
        )
    return f"The {fast} scan won, {t2 / t1:.2f} times faster than the {runner} scan."


def ssm_hybrid_fraction(layers: int, attention_layers: int, fractions: dict) -> str:
    """Exercise 3 of 9.6: the share of an all-attention cache a 1-in-8 hybrid keeps."""
    instance("fractions", fractions, dict)
    parts = ", ".join(f"**{f:.1%}** at {s:,} tokens" for s, f in fractions.items())
    return solution(
        3,
        "The hybrid keeps $k$ attention caches and $L - k$ fixed states: $\\frac{k\\,s\\,K +"
        " (L-k)\\,M_\\text{state}}{L\\,s\\,K}$, which falls toward $k/L$ as $s$ grows. With"
        f" $k/L$ = {attention_layers}/{layers} and this page's layer widths, that is {parts}. At"
        " short context the fixed states dominate, so the hybrid saves little; at long context it"
        f" keeps about one part in {layers // attention_layers}.",
    )


def ssm_full_rank(
    n: int,
    s: int,
    error_full: float,
    rank_full: int,
    s_eq: int,
    rank_equal: int,
    error_equal: float,
) -> str:
    """Exercise 4 of 9.6: a state as large as the sequence, and a state with equal decays."""
    if missing := unmeasured(error_full=error_full, error_equal=error_equal):
        return solution(4, missing)
    text = (
        "With $n = s$ the input map is square and, for distinct decays, invertible in exact"
        " arithmetic: every token can be read back, so the prediction is $1 - n/s$ ="
        f" **{ssm.recall_bound(n, s):g}** (`kvlab.theory.ssm.recall_bound`). Computed at $n = s ="
        f" {n}$: **{error_full:.2g}**, with a numerical rank of {rank_full}."
    )
    if ssm.at_recall_bound(error_full, n, s):
        text += " Zero up to rounding, as predicted."
    else:
        text += (
            f" Not zero: {n} decays packed between 0.5 and 0.99 make the map's rows (powers of each"
            " decay) nearly parallel, so its smallest singular values fall below what fp64"
            " resolves next to its largest, and only its numerical rank is usable: invertible on"
            " paper, not in floating point. A fixed state of many elements needs well-separated"
            " timescales to use them all."
        )
    text += (
        " With all decays equal, every state element is the same weighted sum of the inputs, up to"
        f" its gain: the map has rank **{rank_equal}**, the state holds one number's worth of"
        f" information, and the error is $1 - 1/s$ = **{error_equal:.4f}** at $s = {s_eq}$."
        " Distinct decays are what let a fixed state keep several timescales."
    )
    return solution(4, text)
