"""Notebook 02, recompute, cache reuse and optimized decode (section 9.2): its readings."""

from __future__ import annotations

import math

from kvlab._checks import instance, record, unmeasured
from kvlab.show.format import si
from kvlab.show.readings.verdicts import verdict_words
from kvlab.theory.agreement import ABOVE, BELOW, CANNOT_TELL, DISAGREES, compare
from kvlab.theory.work import attention_work, pass_time, positions_processed, request_time

MEMORY_WALL = "[The memory wall](10_memory_wall.ipynb)"
PEERS = "kvlab.lab.decode_peers.PeerComparison"


TWO_PASS = (
    "the two-pass model, $T = G\\,a + b\\cdot\\mathrm{positions\\_processed}(P, G)$ with "
    "$t(n) = a + b\\,n$ per pass (`kvlab.theory.work.request_time`)"
)


def speedup_reading(
    P: int,
    G: int,
    a: float,
    b: float,
    naive_s: float,
    cached_s: float,
    worst_error: float,
    naive_growth: float,
    cached_growth: float,
    spread: float,
    step_noise: float,
) -> str:
    """The whole-request speedup of caching against the two-pass model (``work.request_time`` with
    the fitted pass cost ``a + b n``), the speedup against the positions ratio
    (``work.positions_processed``), and each loop's last step over its first against the model's
    (``work.pass_time``), each judged by ``agreement.compare``.

    Times are whole requests, measured, per loop; ``naive_growth`` and ``cached_growth`` are each
    loop's growth from its first step to its last, read off a line through every step
    (``decode_step.fitted_growth``). ``spread``: the run-to-run scatter of the two timed passes the
    model is fitted to and of the loops' steps, added; ``step_noise``: how far the steps scattered
    about those lines (the larger loop's ``fitted_growth`` scatter).
    """
    if missing := unmeasured(
        naive_s=naive_s,
        cached_s=cached_s,
        worst_error=worst_error,
        naive_growth=naive_growth,
        cached_growth=cached_growth,
    ):
        return missing
    naive_pred, cached_pred = request_time(P, G, a, b), request_time(P, G, a, b, cached=True)
    c = compare(naive_s / cached_s, naive_pred / cached_pred, spread)
    text = [
        f"At $P = {P}$ and $G = {G}$, the cached loop finished the request **{c.measured:.1f}"
        f" times** faster than the naive one. {TWO_PASS[0].upper()}{TWO_PASS[1:]}, fitted to two"
        f" timed passes ($a$ = {si(a, 's')}, $b$ = {si(b, 's')} per position), predicted"
        f" {c.predicted:.1f} times: the measured speedup {verdict_words(c)}. The largest gap"
        f" between a predicted request time and its measurement was {worst_error:.0%}."
    ]
    if c.agrees:
        text.append("The cost of a pass, $a + b\\,n$, explains most of both loops' time.")
    elif c.outcome == CANNOT_TELL:
        text.append("This run's spread cannot say whether the model misses.")
    else:
        loops = {"naive": naive_s / naive_pred, "cached": cached_s / cached_pred}
        off = max(loops, key=lambda name: abs(math.log(loops[name])))
        text.append(
            f"Most of the gap is the {off} loop, which took {loops[off]:.2g} times its "
            "predicted time."
        )
        text.append(_REASONS[off, loops[off] > 1])
    text.append(_positions_sentence(P, G, c.measured, spread))
    text.append(_growth_sentence(P, G, a, b, naive_growth, cached_growth, step_noise))
    return " ".join(text)


def _positions_sentence(P: int, G: int, speedup: float, spread: float) -> str:
    """The measured speedup against the positions ratio, the two-pass model without its fixed cost
    a."""
    work = compare(
        speedup, positions_processed(P, G) / positions_processed(P, G, cached=True), spread
    )
    head = (
        f"The naive loop processed {work.predicted:.0f} times as many positions"
        f" (`work.positions_processed`); the time ratio, {work.ratio:.2g} times that, "
        f"{verdict_words(work).replace('the prediction', 'the positions ratio')}."
    )
    if work.agrees:
        return head + " Here the fixed cost per pass is small next to the per-token work."
    if work.side == BELOW:
        return (
            head
            + " It is lower because each pass has a fixed cost $a$ that does not depend on its "
            "length, and the cached loop pays it on every step too."
        )
    return (
        head + " It is higher because the naive loop's attention work grows with the pairs ratio"
        " (`work.attention_work`),"
        f" {attention_work(P, G) / attention_work(P, G, cached=True):.1f} here, faster than its"
        " positions, and on a CPU the activations of a long pass leave the caches."
    )


def _growth_sentence(
    P: int, G: int, a: float, b: float, naive_growth: float, cached_growth: float, noise: float
) -> str:
    """Each loop's growth from first step to last (a line through every step) against the two-pass
    model: a naive pass over P + G - 1 tokens against one over P + 1; a cached step is a one-token
    pass throughout. The tolerance is ``noise``, the steps' scatter about their lines."""
    naive = compare(naive_growth, pass_time(P + G - 1, a, b) / pass_time(P + 1, a, b), noise)
    cached = compare(cached_growth, 1.0, noise)
    text = (
        f"On the right, a line through every naive step rises {naive_growth:.2f} times from the"
        f" first to the last, where the model predicts {naive.predicted:.2f}"
        " ($t(P + G - 1) / t(P + 1)$), and a line through the cached steps"
        f" {cached_growth:.2f} times, where it predicts 1 (every cached step is a one-token pass);"
        f" the steps scattered about their lines by {noise:.0%}."
    )
    if naive.agrees and cached.agrees:
        return (
            text + " Both agree with the model: each naive token costs more than the one before,"
            " while cached tokens cost about the same."
        )
    missed = [name for name, c in (("naive", naive), ("cached", cached)) if c.outcome == DISAGREES]
    if not missed:
        return text + " Against that scatter the run cannot tell whether the growth fits."
    if missed == ["cached"] and cached.side == ABOVE:
        return text + (
            " The cached growth disagrees with the model: each cached step also reads a cache one"
            " token longer, a term the two-pass model leaves out and notebook 01 measures."
        )
    return text + f" The {' and the '.join(missed)} growth disagrees with the two-pass model."


_REASONS = {
    ("cached", True): (
        "Its steps cost more than a one-token pass without a cache: each also reads the growing"
        " cache and `DynamicCache` copies it ([The decode loop](01_decode_loop.ipynb)), and on a"
        " CPU the bookkeeping of a cached step is a large share of a small model's step."
        f" {MEMORY_WALL} takes a step apart."
    ),
    ("cached", False): (
        "Its steps cost less than the one-token pass we timed: that pass ran once, "
        "cold, while the loop's steps reuse warm caches and allocations."
    ),
    ("naive", False): (
        "Its long passes cost less per token than the line through a one-token and a "
        "long pass says: a CPU's matrix products run more efficiently on many rows at "
        "once, so $t(n)$ is not a straight line at these lengths."
    ),
    ("naive", True): (
        "Its long passes cost more per token than the line says, usually because the "
        "activations of a long pass no longer fit the CPU's caches."
    ),
}


def latency_reading(
    P: int,
    G: int,
    ttft_cached: float,
    tpot_naive: float,
    tpot_cached: float,
    tpot_static: float,
    spread: float,
) -> str:
    """TTFT and TPOT of the three loops at one setting; whether the naive and the static loop's TPOT
    differ from the cached one's is decided against ``spread``, how much the cached run's single
    steps moved (``kvlab.theory.decode_step.stands_out``)."""
    if missing := unmeasured(
        ttft_cached=ttft_cached,
        tpot_naive=tpot_naive,
        tpot_cached=tpot_cached,
        tpot_static=tpot_static,
        spread=spread,
    ):
        return missing
    from kvlab.theory.decode_step import stands_out

    text = [
        f"At $P = {P}$ and $G = {G}$, the cached loop's first token took **{si(ttft_cached, 's')}**"
        f" and each later one **{si(tpot_cached, 's')}**."
    ]
    if not stands_out(tpot_naive - tpot_cached, tpot_cached, spread):
        text.append(
            f"The naive loop's later tokens averaged {si(tpot_naive, 's')}, within the spread below"
            " of the cached loop's, although each is a prefill of the sequence so far: at this"
            " short length the fixed cost of a pass hides the extra positions."
        )
    elif tpot_naive > tpot_cached:
        text.append(
            f"The naive loop's later tokens averaged {si(tpot_naive, 's')}, more than the spread "
            "below can explain, because every one of them is a prefill of the sequence so far."
        )
    else:
        text.append(
            f"The naive loop's later tokens averaged {si(tpot_naive, 's')}, less than the cached "
            "loop's by more than the spread below, although each is a prefill of the sequence so "
            "far: on this machine something else (another process, a frequency change) slowed "
            "the cached run."
        )
    text.append(
        f"The uncompiled static loop averaged {si(tpot_static, 's')} per token; single steps of "
        f"the cached run moved by {spread:.0%} of a step (interquartile range over median)."
    )
    if not stands_out(tpot_static - tpot_cached, tpot_cached, spread):
        text.append(
            "The two differ by less than that spread: a preallocated cache does not make an "
            "eager step cheaper on its own, since it attends over all of its slots, masked, from "
            "the first step."
        )
    elif tpot_static > tpot_cached:
        text.append(
            "It was slower than the cached loop by more than that spread: attending over every "
            "preallocated slot, masked, from the first step cost more than the copy it saves."
        )
    else:
        text.append(
            "Here it was faster than the cached loop: writing in place saves the copy that "
            "`DynamicCache` makes on every step, which outweighed attending over the unused, "
            "masked slots."
        )
    text.append(
        "What a preallocated cache buys is a fixed shape and a fixed address for every input, "
        "which is what compilation and CUDA graphs need."
    )
    return " ".join(text)


def compile_reading(
    compile_cost: float,
    t_eager: float,
    t_comp: float,
    spread: float,
    break_even: float,
    tokens: int,
) -> str:
    """The one-time cost of compilation against its per-step gain: the fastest compiled step
    against the fastest eager one (measured in the same rounds, with their ``spread``) judged by
    ``agreement.compare``; where the compiled step is faster beyond doubt, the break-even model
    (``kvlab.theory.work.compile_repaid``) says when it pays in a request of ``tokens`` tokens."""
    if missing := unmeasured(
        compile_cost=compile_cost, t_eager=t_eager, t_comp=t_comp, spread=spread
    ):
        return missing
    from kvlab.theory.work import compile_repaid

    c = compare(t_comp, t_eager, spread)
    text = (
        f"Compilation cost **{si(compile_cost, 's')}** beyond the eager loop's first steps. In the"
        f" same rounds, the fastest steady step took {si(t_eager, 's')} eager and"
        f" {si(t_comp, 's')} compiled, {c.ratio:.2g} times, which {verdict_words(c)}"
        " (the eager step is the prediction: no gain)."
    )
    if c.agrees:
        return text + (
            " The compiled step is no faster within this run's noise, so by the break-even model,"
            " compile time over the gain per step, compiling does not pay for itself on this"
            " machine at this size."
        )
    if c.outcome == CANNOT_TELL:
        return text + (
            " Against the spread of the steps, this run gives no break-even worth stating; a"
            " longer run, or a quieter machine, would decide it."
        )
    if c.side == ABOVE:
        return text + (
            " The compiled step was slower: by the break-even model, compile time over the gain"
            " per step, compiling never pays off at this size on this machine."
        )
    gain = t_eager - t_comp
    text += (
        f" The gain is {si(gain, 's')} per token, so the compiled loop catches up after"
        f" **{break_even:,.0f} tokens**, where the two extrapolated lines in the figure cross"
    )
    if compile_repaid(compile_cost, gain, tokens):
        return text + f": within this {tokens}-token request, which compiling already paid for."
    return text + (
        f": a {tokens}-token request does not repay it. Compiling pays for requests longer than"
        " that, or when one compilation serves many requests, as in a serving engine."
    )


def ttft_reading(ttft: dict, cache_bytes: float, write_rate: float) -> str:
    """Time to first token of the three loops (``ttft``: loop name to a Timing of its prefill,
    fastest repeat taken): the same prefill in each, so the prediction for the slowest is the
    fastest, judged by ``agreement.compare`` with the repeats' spread; what differs is the cache
    each one fills, whose ``cache_bytes`` at ``write_rate`` give the traffic part of a difference.
    """
    instance("ttft", ttft, dict)
    fastest = {name: t.min for name, t in ttft.items()}
    low, high = min(fastest.values()), max(fastest.values())
    spread = max(t.spread_above_min for t in ttft.values())
    c = compare(high, low, spread)
    parts = ", ".join(f"{name} {si(v, 's')}" for name, v in fastest.items())
    repeats = len(next(iter(ttft.values())).times)
    writes = cache_bytes / write_rate
    text = (
        f"The first token, fastest of {repeats} prefills each, interleaved: {parts}. The three"
        " loops run the same prefill over the prompt, so the model predicts the slowest equal to"
        f" the fastest; the slowest is {c.ratio:.2f} times the fastest, which {verdict_words(c)}."
        " What differs is the cache each one fills: none for the naive loop, a `DynamicCache`"
        " holding the prompt's keys and values for the cached one, and a cache allocated for the"
        f" whole request for the static one. Writing the prompt's {si(cache_bytes, 'B')} of keys"
        f" and values takes {si(writes, 's')} at this machine's write rate."
    )
    if c.agrees:
        return text + " At this size the cache is lost in the prefill."
    if c.outcome == CANNOT_TELL:
        return text + " Any difference is within what these repeats resolve."
    if high - low > 10 * writes:
        return text + (
            f" The difference, {si(high - low, 's')}, is far more than those writes: it is the"
            " cache's setup on the host (allocating one tensor per layer, building the masks and"
            " bookkeeping of the cache class), a fixed cost per request that a small model's"
            " prefill does not hide."
        )
    return text + " The difference is those writes: filling the cache is part of the first token."


def explore_reading(
    P: int,
    G: int,
    batch: int,
    model: str,
    ttft: dict,
    tpot: dict,
    time_ratio: float,
    work_ratio: float,
    spread: float,
) -> str:
    """Under the explorer: this setting's latencies, and the measured time ratio (naive over cached)
    against ``work_ratio``, the positions ratio of ``work.positions_processed``, judged by
    ``agreement.compare`` with ``spread``, how much the cached loop's single steps moved."""
    if missing := unmeasured(time_ratio=time_ratio, work_ratio=work_ratio):
        return missing
    text = [
        f"{model}, $P = {P}$, $G = {G}$, batch {batch}: TPOT was {si(tpot['naive'], 's')} naive, "
        f"{si(tpot['cached'], 's')} cached and {si(tpot['static'], 's')} static; TTFT "
        f"{si(min(ttft.values()), 's')} to {si(max(ttft.values()), 's')}."
    ]
    pairs_ratio = attention_work(P, G) / attention_work(P, G, cached=True)
    c = compare(time_ratio, work_ratio, spread)
    text.append(
        f"The naive loop took {time_ratio:.1f} times as long as the cached one. The positions ratio"
        f" (`kvlab.theory.work.positions_processed`, naive over cached) is {work_ratio:.1f}, the"
        " time ratio if every position cost the same and a pass had no fixed cost; with the"
        f" {spread:.0%} by which single cached steps moved as the tolerance, the measured ratio"
        f" {verdict_words(c).replace('the prediction', 'the positions ratio')}."
    )
    if c.agrees:
        text.append(
            "The per-position layer work sets both loops' time here: the fixed cost of a pass is"
            " small next to it, and attention is not yet a large share of a pass."
        )
    elif c.outcome == CANNOT_TELL:
        text.append("The steps moved too much in this run to call the gap.")
    elif c.side == BELOW:
        text.append(
            "The time ratio is lower because the fixed per-pass cost is paid by both loops. The"
            " positions ratio is not a bound in general, though: it counts per-position layer"
            " work, and where attention dominates a pass the naive loop's extra work follows the"
            f" pairs ratio instead, {pairs_ratio:.1f} at this setting."
        )
    else:
        text.append(
            "The time ratio is higher: the positions ratio counts only per-position layer work;"
            f" the naive loop's attention work grows with the pairs ratio, {pairs_ratio:.1f} here,"
            " so where attention is a large share of a pass the time ratio can pass the positions"
            " ratio. On a CPU, the activations of a long naive pass leaving the caches add to it."
        )
    return " ".join(text)


def gpu_break_even_reading(compile_cost: float, measured_gain: float) -> str:
    """What this compile time implies where the per-step gain is one millisecond (a small model's
    kernel-launch gaps on a GPU), beside this run's measured gain; both from ``break_even_tokens``.
    """
    if missing := unmeasured(compile_cost=compile_cost, measured_gain=measured_gain):
        return missing
    from kvlab.theory.work import break_even_tokens

    one_ms = break_even_tokens(compile_cost, 1e-3)
    here = break_even_tokens(compile_cost, measured_gain)
    text = (
        f"This run's compiled step saved {si(measured_gain, 's')} per token"
        if measured_gain > 0
        else "This run's compiled step saved nothing per token"
    )
    return (
        text
        + ". On a GPU the saving is what graph replay removes: the gaps between hundreds of short"
        " kernel launches, about a millisecond per step for a small model. Tracing and code"
        " generation run on the CPU there too, so the compile time stays: at this run's"
        f" {si(compile_cost, 's')}, a 1 ms gain per step breaks even after **{one_ms:,.0f}"
        " tokens** "
        + (f"(against {here:,.0f} at this run's gain)" if math.isfinite(here) else "")
        + ". That is why serving engines compile once per batch size at start-up and reuse the"
        " graphs across requests, rather than paying the cost in any one request."
    )


def peers_reading(result) -> str:
    """kvlab's cached loop against ``generate``, and its compiled static loop against transformers'
    fastest batch-1 path (a ``kvlab.lab.decode_peers.PeerComparison``): that speed-up against 1
    (as fast), with the spread of its rounds, judged by ``agreement.compare``. The page's one
    verdict on compiling is ``compile_reading``'s, so no compiled-against-eager ratio is judged
    here."""
    from kvlab.theory.peers import GENERATE, GENERATE_COMPILED

    record("result", result, PEERS, "where", "device", "seconds", "speedup")
    names = ("cached", GENERATE, "static, compiled", GENERATE_COMPILED)
    timed = {f"result.seconds[{n!r}]": result.seconds.get(n) for n in names}
    if missing := unmeasured(**{k: t and math.fsum(t) for k, t in timed.items()}):
        return missing
    rounds = len(next(iter(result.seconds.values())))
    text = [
        f"On {result.where}, on the {result.device}, every loop decoded exactly `generate`'s tokens"
        f" before any was timed. The figures are ratios of median whole-request times over {rounds}"
        " interleaved rounds, first calls (and so compilation) left out. kvlab's cached loop ran"
        f" at {result.speedup('cached', GENERATE).median:.2f} times the speed of `generate` with"
        " its dynamic cache."
    ]
    r = result.speedup("static, compiled", GENERATE_COMPILED)
    spread = (r.high - r.low) / (2 * r.median)
    c = compare(r.median, 1.0, spread)
    if c.agrees:
        verdict = "as fast, within the spread of the rounds"
    elif c.outcome == CANNOT_TELL:
        verdict = "a difference the rounds cannot resolve"
    else:
        verdict = "faster" if c.side == ABOVE else "slower"
    text.append(
        f"kvlab's compiled static loop ran at {r.median:.2f} times the speed of transformers'"
        " fastest batch-1 path (a static cache and the forward compiled with `reduce-overhead`)"
        f" (single rounds {r.low:.2f} to {r.high:.2f}): {verdict}. Whether compiling pays is the"
        " compile section's question, answered there from single steps; whole requests mix in"
        " the prefill and the cache class."
    )
    return " ".join(text)
