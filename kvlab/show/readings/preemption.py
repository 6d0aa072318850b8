"""Notebook 05, PagedAttention (section 9.5): readings on preemption, recompute against swap.

The per-token arithmetic for every published shape and device (``kvlab.theory.preemption``:
recompute 2 P / F against a swap-in of K / beta, the swap-out overlapped), what decides on the
reader's own machine, and what a recompute recomputes once prefix caching keeps the request's
blocks.
"""

from __future__ import annotations

from kvlab._checks import instance, integer, items, one_of, real, record
from kvlab.lab.timing import compare_timings
from kvlab.show.format import si
from kvlab.theory.preemption import preemption_per_token, recompute_or_swap
from kvlab.theory.shapes import SHAPES
from kvlab.theory.specs import LINKS, SPECS


def _keys(name: str, value, table: dict) -> list[str]:
    """``value``, a non-empty list of ``table``'s keys, as a list; None for every key."""
    if value is None:
        return list(table)
    value = items(name, value, str, what="names")
    if not value:
        raise ValueError(f"{name} must name at least one of {tuple(table)}, got an empty list")
    return [one_of(f"{name}[{i}]", key, tuple(table)) for i, key in enumerate(value)]


def crossover_table(shapes=None, devices=None, w_kv: float = 2) -> str:
    """A Markdown table: recompute / swap per token for each shape (rows) on each device's host link
    (columns). Above 1 swap is cheaper; below 1 (in bold) recompute is."""
    w_kv = real("w_kv", w_kv)
    shapes = _keys("shapes", shapes, SHAPES)
    devices = _keys("devices", devices, SPECS)
    head = (
        "| model | params / KV byte | "
        + " | ".join(
            SPECS[d].name.replace("NVIDIA ", "").replace("AMD Instinct ", "") for d in devices
        )
        + " |"
    )
    rule = "|---|---:|" + "---:|" * len(devices)
    links = (
        "| *FLOP/s / link bytes/s* | | "
        + " | ".join(
            f"*{recompute_or_swap(SHAPES[shapes[0]], d, w_kv=w_kv).flops_per_link_byte:,.0f}* "
            f"({LINKS[SPECS[d].host_link].name.replace(' x16', '')})"
            for d in devices
        )
        + " |"
    )
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
    """Which (shape, device) pairs favour recompute, counted from the table, with the swap-out
    overlapped and, for comparison, with an engine that waits for it."""
    shapes = _keys("shapes", shapes, SHAPES)
    devices = _keys("devices", devices, SPECS)
    pairs = [(k, d) for k in shapes for d in devices]
    wins = [(k, d) for k, d in pairs if recompute_or_swap(SHAPES[k], d).cheaper == "recompute"]
    serial = [
        (k, d)
        for k, d in pairs
        if recompute_or_swap(SHAPES[k], d, overlap_swap_out=False).cheaper == "recompute"
    ]
    gqa = [
        k
        for k in shapes
        if SHAPES[k].group > 1 and SHAPES[k].latent_dim is None and SHAPES[k].params > 5e9
    ]
    worst = (
        min(recompute_or_swap(SHAPES[k], d).ratio for k in gqa for d in devices) if gqa else None
    )
    losers = sorted(
        {k for k, _ in wins},
        key=lambda k: recompute_or_swap(SHAPES[k], devices[0]).params_per_kv_byte,
    )
    described = ", ".join(
        f"{SHAPES[k].name}"
        f" ({'multi-head attention' if SHAPES[k].group == 1 else 'small, with a deep cache'})"
        for k in losers
    )
    text = (
        f"Of {len(pairs)} pairs, recompute is cheaper per token in **{len(wins)}**, all of them"
        f" models with few parameters per cache byte: {described or 'none'}."
    )
    if worst is not None:
        text += (
            " For the grouped-query models of several billion parameters, swap over the host link"
            f" is at least **{worst:.1f} times** cheaper at the arithmetic level, on every device"
            " listed."
        )
    text += (
        " An engine that waits for the swap-out doubles swap's cost (2K/β), and recompute is then"
        f" cheaper in {len(serial)} pairs."
    )
    return (
        text
        + " A mixture of experts counts its active parameters (a token multiplies only those); "
        "DeepSeek-V2's latent cache has so few bytes per token that swap wins by a wide margin."
    )


def host_copy_reading(copies: list, page_block_bytes: int, page_block_tokens: int) -> str:
    """The measured host transfer rate against block size; the verdict is the fixed-cost model of a
    copy (``HostCopy.fixed_cost_dominates``: t = t0 + b / beta, t0 against b / beta)."""
    instance("copies", copies, (list, tuple), "a list")
    rows = "\n".join(
        f"| {si(c.block_bytes, 'B')} | {c.blocks:,} | {si(c.bytes_per_s, 'B/s')} | "
        f"{c.efficiency:.0%} |"
        for c in copies
    )
    small, big = copies[0], copies[-1]
    text = (
        "| block | copies | rate, one copy per block | share of one large copy"
        f" |\n|---:|---:|---:|---:|\n{rows}\n\nCopying {si(small.total_bytes, 'B')} in blocks of"
        f" {si(small.block_bytes, 'B')} ran at {small.efficiency:.0%} of the rate of one copy of"
        f" the same bytes; in blocks of {si(big.block_bytes, 'B')}, at {big.efficiency:.0%}. (One"
        f" layer's K for one of this page's {page_block_tokens}-token blocks is"
        f" {si(page_block_bytes, 'B')}.) In the fixed-cost model of a copy, $t = t_0 + b/\\beta$,"
        f" each {si(small.block_bytes, 'B')} copy spent {si(small.transfer_s, 's')} moving its"
        " bytes at the one-copy rate"
    )
    if small.fixed_cost_dominates:
        return (
            text
            + f" and {si(small.fixed_cost_s, 's')} on everything else: small copies waste most of"
            " the link, because each pays a fixed cost (a launch, a driver call, here a Python"
            " call) that a large copy pays once."
        )
    return (
        text + f" and {si(max(small.fixed_cost_s, 0.0), 's')} on everything else, less than its"
        " transfer: here even small copies keep most of the rate."
    )


def decides_reading(
    params: float,
    kv_bytes_per_token: float,
    flops: float,
    link_bytes_per_s: float,
    block_efficiency: float,
    cost,
) -> str:
    """Which effect decides recompute against swap on this machine: the arithmetic or the copies,
    and whether the measurement (``cost``, a ``PreemptionCost``) agrees.

    The model is ``kvlab.theory.preemption.preemption_per_token``: recompute 2 P / F against the
    swap-in K / beta that the request waits for. ``link_bytes_per_s`` is the one-way rate of the
    swap link: on a CPU half the calibrated copy bandwidth, which counts each byte read and written.
    """
    params = real("params", params)
    kv_bytes_per_token = real("kv_bytes_per_token", kv_bytes_per_token)
    flops = real("flops", flops)
    link_bytes_per_s = real("link_bytes_per_s", link_bytes_per_s)
    block_efficiency = real("block_efficiency", block_efficiency)
    model = preemption_per_token(params, kv_bytes_per_token, flops, link_bytes_per_s)
    blocked = preemption_per_token(
        params, kv_bytes_per_token, flops, link_bytes_per_s * block_efficiency
    )
    measured = compare_timings(cost.swap_in, cost.recompute)  # ratio: recompute / swap-in
    n = cost.tokens
    text = (
        f"On this machine, for this page's model: $P/K$ = {model.params_per_kv_byte:,.0f}"
        f" parameters per cache byte against $F/\\beta$ = {model.flops_per_link_byte:,.0f} FLOP per"
        " byte moved one way. The model (`kvlab.theory.preemption.preemption_per_token`) charges"
        f" recompute $2P/F$ = {si(model.recompute, 's')} per token and the swap-in $K/\\beta$ ="
        f" {si(model.swap_in, 's')}, so recompute costs **{model.ratio:.1f} times** the swap-in."
        f" Moving the blocks one small copy at a time, at {block_efficiency:.0%} of the copy rate,"
        f" would make it {blocked.ratio:.1f} times. Measured per token: recompute"
        f" {si(cost.recompute.median / n, 's')}, swap-in {si(cost.swap_in.median / n, 's')}, a"
        f" ratio of {measured.ratio:.1f}."
    )
    if model.cheaper == blocked.cheaper:
        text += (
            " Both agree, so the arithmetic decides here: "
            f"{model.cheaper} is cheaper whatever the copy size."
        )
    else:
        text += (
            " The two disagree, so transfer efficiency decides: with many small copies recompute"
            " wins, with one large copy per sequence swap does. kvlab's swap gathers a sequence's"
            " blocks first and moves them in one copy per layer stack."
        )
    verdict = {"faster": "swap", "slower": "recompute"}.get(measured.outcome)
    if verdict is None:
        return text + " The measurement cannot tell them apart: the repeats of the two overlap."
    if verdict == model.cheaper:
        return (
            text
            + f" The measurement agrees: {verdict} was cheaper, beyond the spread of the repeats."
        )
    return (
        text
        + f" The measurement disagrees with the arithmetic: {verdict} was cheaper. At these small"
        " sizes a recompute is mostly the model's fixed per-call cost and a swap mostly"
        " bookkeeping, neither of which the per-token formula counts."
    )


def cached_recompute_reading(r, num_requests: int, num_blocks: int) -> str:
    """What recompute preemption recomputed once prefix caching kept the requests' blocks (``r``: a
    ``kvlab.lab.preemption.CachedRecompute``), split by why each token was or was not served."""
    num_requests = integer("num_requests", num_requests)
    num_blocks = integer("num_blocks", num_blocks)
    fields = ("block_size", "prompt_tokens", "held", "served", "prefill_tokens", "same_tokens")
    record("r", r, "kvlab.lab.preemption.CachedRecompute", *fields)
    text = (
        f"{num_requests} requests ({r.prompt_tokens:,} prompt tokens) ran through the engine in"
        f" {num_blocks} blocks of {r.block_size} tokens, preempting by recompute. The {len(r.held)}"
        f" preemptions dropped the K and V of **{r.dropped:,} tokens**. With prefix caching on, the"
        f" readmissions found **{r.from_cache:,}** of them still cached"
        f" ({r.from_cache / max(1, r.dropped):.0%}) and recomputed {r.recomputed:,}:"
        f" {r.partial_block_tokens:,} in partly filled last blocks, which are never hashed, and"
        f" {r.evicted_tokens:,} in full blocks that the pool had handed to the running requests"
        " before the preempted request came back. In all the engine prefilled"
        f" {r.prefill_tokens[True]:,} tokens with caching on and {r.prefill_tokens[False]:,} with"
        " it off"
    )
    text += (
        ", and generated the same tokens both ways."
        if r.same_tokens
        else (
            "; the two runs generated different tokens, which is a bug: caching must not change"
            " greedy output."
        )
    )
    if r.evicted_tokens == 0:
        return (
            text
            + " No full block was handed out: a recompute redid only the partial last blocks, the"
            " case in which recompute costs almost nothing."
        )
    return (
        text
        + " Had every request come back before its blocks were reused, recompute would have redone"
        f" only the {r.partial_block_tokens:,} partial-block tokens. The pool reused the rest"
        " because a preemption happens when the pool is full, so the preempted request's blocks"
        " are the oldest entries of the free list, which hands out its oldest entry first (its"
        " last block first, so the prefix survives longest), and the request comes back only"
        " once its whole footprint is free again, typically after another request finishes."
    )
