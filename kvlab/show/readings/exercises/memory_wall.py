"""Notebook 10, the memory-wall model: worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab._checks import instance, real
from kvlab.show.readings.exercises.folded import solution


def wall_fixed_point(b_dagger: float, kv_floor: float, rows: dict, contexts: list) -> str:
    """Exercise 1 of the memory wall: intensity rising or falling with context around b-dagger."""
    b_dagger = real("b_dagger", b_dagger)
    kv_floor = real("kv_floor", kv_floor)
    table = "\n".join(
        f"| {b} | " + " | ".join(f"{ai:.2f}" for ai in ais) + " |" for b, ais in rows.items()
    )
    head = (
        "| batch | "
        + " | ".join(f"s = {s:,}" for s in contexts)
        + " |\n|---:|"
        + "---:|" * len(contexts)
    )
    return solution(
        1,
        f"$b^\\dagger = g\\,w_p/w_{{kv}}$ = **{b_dagger:g}** for Llama-3-8B in bf16. Below it the"
        f" cache's intensity, $2g/w_{{kv}}$ = {kv_floor:g} FLOP per byte, exceeds the weights'"
        " ($2b/w_p$), so more context adds higher-intensity bytes and AI rises toward that limit;"
        " above it AI falls toward the same limit. `rf.arithmetic_intensity` in FLOP per"
        f" byte:\n\n{head}\n{table}\n\nBelow $b^\\dagger$ intensity rises with context, above it it"
        " falls, and at $b^\\dagger$ it does not move.",
    )


def wall_288(
    ratio: float,
    exists: bool,
    s_star8: float,
    s_needed: float,
    s_cap_bf16: float,
    s_cap_2bit: float,
    speedup: float,
) -> str:
    """Exercise 2 of the memory wall: a 288 GB device. ``ratio`` is
    ``kvlab.theory.memory_wall.kv_bound_band`` (s_cap / s*), ``exists`` its
    ``kv_bound_regime_exists``.
    """
    ratio = real("ratio", ratio)
    s_star8 = real("s_star8", s_star8)
    s_needed = real("s_needed", s_needed)
    s_cap_bf16 = real("s_cap_bf16", s_cap_bf16)
    s_cap_2bit = real("s_cap_2bit", s_cap_2bit)
    speedup = real("speedup", speedup)
    text = (
        f"$s_\\text{{cap}}/s^* = (M - P w_p)/(P w_p)$ = **{ratio:.3f}**: "
        + (
            "above 1, so a one-device KV-bound regime now exists, if only a sliver of one (between"
            " $s^*$ and about {:.0f}% beyond it). ".format((ratio - 1) * 100)
            if exists
            else "not above 1, so there is still no one-device KV-bound regime. "
        )
        + "For 4x from a 2-bit cache ($c = 8$), solve $S = c(s + s^*)/(s + c s^*) = 4$: $8(s +"
        f" s^*) = 4s + 32 s^*$, so $s = 6 s^*(b)$. At batch 8, $s^*(8)$ = {s_star8:,.0f} tokens,"
        f" so **{s_needed:,.0f} tokens** (check: $S$ = {speedup:.2f}). In bf16, 8 such sequences"
        f" would not fit ($s_\\text{{cap}}(8)$ = {s_cap_bf16:,.0f}); with the 2-bit cache they do"
        f" up to {s_cap_2bit:,.0f} tokens, so the compression is what makes the point reachable."
    )
    return solution(2, text)


def wall_joint(s1: dict, s32: dict) -> str:
    """Exercise 3 of the memory wall: two halvings are one factor of 4, not two factors of S(2)."""
    instance("s1", s1, dict)
    instance("s32", s32, dict)
    return solution(
        3,
        "Two methods that each halve KV bytes make a joint byte factor $c = 4$; the speedup is"
        " $S(4)$, not $S(2)^2$, because the weights' bytes are paid once whatever the cache's"
        f" factor. At 128k for Llama-3-70B: batch 1 gives $S(2)$ = {s1['half']:.2f}, $S(2)^2$ ="
        f" {s1['half'] ** 2:.2f}, and **$S(4)$ = {s1['joint']:.2f}**; batch 32 gives $S(2)$ ="
        f" {s32['half']:.2f}, $S(2)^2$ = {s32['half'] ** 2:.2f}, and **$S(4)$ ="
        f" {s32['joint']:.2f}**. Multiplying the separate speedups overstates the joint one at both"
        f" batches ({s1['half'] ** 2 / s1['joint']:.2f}x too high at batch 1,"
        f" {s32['half'] ** 2 / s32['joint']:.2f}x at batch 32). The batch matters more than the"
        f" stacking: the same $c = 4$ is worth {s32['joint'] / s1['joint']:.1f} times as much"
        " speedup at batch 32, which is KV-bound, as at batch 1, which is weight-bound.",
    )
