"""Notebook 05, PagedAttention (section 9.5): readings on preemption, recompute against swap.

The per-token arithmetic for every published shape and device, and what decides on the reader's
own machine."""

from __future__ import annotations

from kvlab.theory.specs import LINKS, SPECS
from kvlab.theory.shapes import SHAPES
from kvlab.show.format import si
from kvlab.theory.roofline import recompute_or_swap


def crossover_table(shapes=None, devices=None, w_kv: float = 2) -> str:
    """A Markdown table: recompute / swap per token for each shape (rows) on each device's host link
    (columns). Above 1 swap is cheaper; below 1 (in bold) recompute is."""
    shapes = list(SHAPES) if shapes is None else list(shapes)
    devices = list(SPECS) if devices is None else list(devices)
    head = "| model | params / KV byte | " + " | ".join(SPECS[d].name.replace("NVIDIA ", "").replace("AMD Instinct ", "")
                                                        for d in devices) + " |"
    rule = "|---|---:|" + "---:|" * len(devices)
    links = "| *FLOP/s / link bytes/s* | | " + " | ".join(
        f"*{recompute_or_swap(SHAPES[shapes[0]], d, w_kv=w_kv).flops_per_link_byte:,.0f}* "
        f"({LINKS[SPECS[d].host_link].name.replace(' x16', '')})" for d in devices) + " |"
    rows = []
    for key in shapes:
        cells = []
        for d in devices:
            r = recompute_or_swap(SHAPES[key], d, w_kv=w_kv)
            cells.append(f"**{r.ratio:.2f}**" if r.cheaper == "recompute" else f"{r.ratio:.1f}")
        p_k = recompute_or_swap(SHAPES[key], devices[0], w_kv=w_kv).params_per_kv_byte
        rows.append(f"| {SHAPES[key].name} | {p_k:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, links, *rows])


def crossover_reading(shapes=None, devices=None) -> str:
    """Which (shape, device) pairs favour recompute, counted from the table."""
    shapes = list(SHAPES) if shapes is None else list(shapes)
    devices = list(SPECS) if devices is None else list(devices)
    wins = [(k, d) for k in shapes for d in devices if recompute_or_swap(SHAPES[k], d).cheaper == "recompute"]
    gqa = [k for k in shapes if SHAPES[k].group > 1 and SHAPES[k].latent_dim is None and SHAPES[k].params > 5e9]
    worst = min(recompute_or_swap(SHAPES[k], d).ratio for k in gqa for d in devices) if gqa else None
    losers = sorted({k for k, _ in wins}, key=lambda k: recompute_or_swap(SHAPES[k], devices[0]).params_per_kv_byte)
    described = ", ".join(f"{SHAPES[k].name} ({'multi-head attention' if SHAPES[k].group == 1 else 'small, with a deep cache'})"
                          for k in losers)
    text = (f"Of {len(shapes) * len(devices)} pairs, recompute is cheaper per token in **{len(wins)}**, all of them "
            f"models with few parameters per cache byte: {described or 'none'}.")
    if worst is not None:
        text += (f" For the grouped-query models of several billion parameters, swap over the host link is at "
                 f"least **{worst:.1f} times** cheaper at the arithmetic level, on every device listed.")
    return text + (" A mixture of experts counts its active parameters (a token multiplies only those); "
                   "DeepSeek-V2's latent cache has so few bytes per token that swap wins by a wide margin.")


def host_copy_reading(copies: list, page_block_bytes: int, page_block_tokens: int) -> str:
    """The measured host transfer rate against block size."""
    rows = "\n".join(f"| {si(c.block_bytes, 'B')} | {c.blocks:,} | {si(c.bytes_per_s, 'B/s')} | "
                     f"{c.efficiency:.0%} |" for c in copies)
    small, big = copies[0], copies[-1]
    text = ("| block | copies | rate, one copy per block | share of one large copy |\n|---:|---:|---:|---:|\n"
            f"{rows}\n\nCopying {si(small.total_bytes, 'B')} in blocks of {si(small.block_bytes, 'B')} ran at "
            f"{small.efficiency:.0%} of the rate of one copy of the same bytes; in blocks of "
            f"{si(big.block_bytes, 'B')}, at {big.efficiency:.0%}. (One layer's K for one of this page's "
            f"{page_block_tokens}-token blocks is {si(page_block_bytes, 'B')}.)")
    if small.efficiency < 0.5:
        text += (" Small copies waste most of the link: each pays a fixed cost (a launch, a driver call, "
                 "here a Python call) that a large copy pays once.")
    else:
        text += (" Here even small copies keep most of the rate: their fixed cost is small next to "
                 "their bytes on this machine.")
    return text


def decides_reading(params: float, kv_bytes_per_token: float, flops: float, link_bytes_per_s: float,
                    block_efficiency: float, recompute_per_token: float, swap_per_token: float) -> str:
    """Which effect decides recompute against swap on this machine: the arithmetic or the copies.

    ``link_bytes_per_s`` is the one-way rate of the swap link: on a CPU half the calibrated copy
    bandwidth, which counts each byte read and written.
    """
    arithmetic = (params / kv_bytes_per_token) / (flops / link_bytes_per_s)
    blocked = arithmetic * block_efficiency
    measured = recompute_per_token / swap_per_token
    text = (f"On this machine, for this page's model: $P/K$ = {params / kv_bytes_per_token:,.0f} parameters per "
            f"cache byte against $F/\\beta$ = {flops / link_bytes_per_s:,.0f} FLOP per byte moved one way, so the "
            f"arithmetic puts recompute at **{arithmetic:.1f} times** swap's cost per token. Moving the blocks "
            f"one small copy at a time, at {block_efficiency:.0%} of the copy rate, would make it "
            f"{blocked:.1f} times. Measured per token: recompute {si(recompute_per_token, 's')}, swap "
            f"{si(swap_per_token, 's')}, a ratio of {measured:.1f}.")
    if (arithmetic > 1) == (blocked > 1):
        text += (" Both readings agree, so the arithmetic decides here: "
                 f"{'swap' if arithmetic > 1 else 'recompute'} is cheaper whatever the copy size.")
    else:
        text += (" The two disagree, so transfer efficiency decides: with many small copies recompute wins, "
                 "with one large copy per sequence swap does. kvlab's swap gathers a sequence's blocks first "
                 "and moves them in one copy per layer stack.")
    if (measured > 1) != (arithmetic > 1):
        text += (" The measurement disagrees with the arithmetic: at these small sizes a recompute is mostly "
                 "the model's fixed per-call cost and a swap mostly bookkeeping, neither of which the "
                 "per-token formula counts.")
    return text
