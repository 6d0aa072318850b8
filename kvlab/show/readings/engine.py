"""Readings of notebook 11, the continuous-batching engine (notebook ``11_engine``).

Each sentence that decides between outcomes takes the decision from the model that predicts it:
two cost models of a step (:func:`kvlab.theory.serving.work_ratio`, judged by
:func:`kvlab.theory.serving.speedup_verdict`), the roofline of the latency-throughput curve with
this machine's ceilings (:func:`kvlab.theory.serving.roofline_throughput`, judged by
:func:`kvlab.theory.serving.curve_agreement`) and the pool model of what bounds the batch
(:func:`kvlab.theory.serving.batch_bound`).
"""

from __future__ import annotations

from kvlab._checks import flag, instance, integer, real
from kvlab.show.format import si
from kvlab.theory.agreement import AGREES, DISAGREES, compare
from kvlab.theory.serving import (
    CB,
    CB_NO_SHARING,
    ENGINE,
    ENGINE_NO_CACHE,
    GENERATE,
    batch_bound,
    curve_agreement,
    roofline_throughput,
    roofline_throughput_spread,
    speedup_verdict,
    work_ratio,
)

_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def number(n: int) -> str:
    """A count as a word up to nine, in digits above."""
    n = integer("n", n, 0)
    return _WORDS[n] if 0 <= n < len(_WORDS) else f"{n:,}"


def times(n: int) -> str:
    """``once``, ``twice``, ``three times``, ..."""
    return {1: "once", 2: "twice"}.get(n, f"{number(n)} times")


def plural(n: int, noun: str) -> str:
    return f"{number(n)} {noun}{'' if n == 1 else 's'}"


def life_reading(counts: dict, block_size: int, num_blocks: int, budget: int) -> str:
    """The life of a handful of requests. ``counts`` has ``requests``, ``steps``, ``chunked``
    (requests whose prefill took more than one step), ``preempted`` (one ``(step, request, mode)``
    per preemption), ``readmitted_tokens`` and ``readmitted_cached`` (tokens of the requests
    readmitted after a recompute preemption, and of those the ones the prefix cache served),
    ``stalled`` (request-steps given no tokens while running) and ``cached_tokens`` (prompt tokens
    first admissions found cached)."""
    instance("counts", counts, dict)
    text = [
        f"The engine served {plural(counts['requests'], 'request')} in {counts['steps']} steps,"
        f" with a pool of {num_blocks} blocks of {block_size} tokens and a budget of {budget}"
        " tokens per step."
    ]
    if counts["chunked"]:
        text.append(
            f"{number(counts['chunked']).capitalize()} of them had prompts longer than what a step"
            " had left, so their prefill ran in chunks over several steps while the others kept"
            " decoding."
        )
    else:
        text.append(
            "Every prompt fitted in what its first step had left, so no prefill was chunked; a "
            "smaller budget or a longer prompt would split one."
        )
    preempted = counts["preempted"]
    if preempted:
        step, request, mode = preempted[0]
        where = (
            f"first at step {step}, when request {request}"
            if len(preempted) > 1
            else f"at step {step}, when request {request}"
        )
        text.append(
            f"The pool ran out {times(len(preempted))}, {where} was the newest running request and"
            " the decoding requests' next tokens needed more blocks than were free: the scheduler"
            " preempted it "
            + (
                "by swap, copying its blocks to host memory until blocks were free again."
                if mode == "swap"
                else (
                    "by recompute, giving its blocks back (their hashes kept) and "
                    "sending it to the head of the queue."
                )
            )
        )
        text.append(_readmission(counts["readmitted_tokens"], counts["readmitted_cached"]))
    else:
        text.append(
            "The pool never ran out, so nothing was preempted; the trace was meant to force it, "
            "and a pool a few blocks smaller would."
        )
    if counts["cached_tokens"]:
        text.append(
            f"On first admission {counts['cached_tokens']} prompt tokens were served from the"
            " prefix cache instead of being computed again."
        )
    return " ".join(text)


def _readmission(tokens: int, cached: int) -> str:
    if not tokens:
        return "No request preempted by recompute came back during the run."
    if cached:
        return (
            f"When it came back, {cached} of its {tokens} tokens were served from the prefix cache,"
            " most of them from its own freed blocks, which were still there; only"
            f" {number(tokens - cached)} {'was' if tokens - cached == 1 else 'were'} computed"
            " again. With prefix caching, recompute preemption often recomputes almost nothing;"
            " vLLM V1 makes recompute its default, its documentation saying it costs less than"
            " swapping in that architecture ([vLLM V1 documentation](../book/references.md))."
        )
    return (
        f"When it came back none of its {tokens} tokens were cached any more (its freed blocks had"
        " been taken by others, or prefix caching was off), so recompute paid for its whole"
        " prefill again."
    )


def _speedup_sentence(measured: float, low: float, high: float, model: str) -> str:
    verdict = speedup_verdict(measured, low, high)
    prediction = f"{low:.2f}" if abs(high - low) < 0.005 else f"{low:.2f} to {high:.2f}"
    text = f"The measured ratio is {measured:.2f}; {model} predicts {prediction}"
    if verdict == "within":
        return text + ", and the measurement follows it."
    if verdict == "below":
        return (
            text + ": the engine did worse than its work predicts. Its per-step Python (scheduling,"
            " building the step's tables, gathering blocks on a CPU) costs more than the batched"
            " work it saves here, and noise from other processes can swing one run either way."
        )
    return (
        text
        + ": the engine did better than its work predicts, so the peer spent more than its work "
        "on something else (its own per-step or per-request overhead)."
    )


def comparison_reading(result, on_gpu: bool) -> str:
    """The engine against padded ``generate``, against itself without prefix caching, and against
    transformers' continuous batching, on one request set (``result``: a
    :class:`kvlab.lab.engine.ServingComparison` whose tokens all agreed)."""
    flag("on_gpu", on_gpu)
    padded, rounds = result.padded, len(result.seconds[ENGINE])
    head = (
        f"On {result.requests} requests every contender produced the same tokens for every request;"
        f" {result.generated_tokens} were generated. "
        + (
            f"Times are medians of {rounds} interleaved rounds."
            if rounds > 1
            else "Times are from one round, the contenders run one after another."
        )
    )
    parts = [head]
    if ENGINE_NO_CACHE in result.seconds:
        bare = result.speedup(ENGINE_NO_CACHE, GENERATE)
        ratio = work_ratio(padded, result.engine_metrics[ENGINE_NO_CACHE])
        parts.append(
            "**Padding.** With prefix caching off, so that only the batching differs, the engine"
            f" ran **{bare.median:.2f} times** as fast as padded `generate` batches of"
            f" {result.max_batch}. Padded `generate` carried {padded.carried_rows:,} of its"
            f" {padded.decode_rows:,} decode rows"
            f" ({padded.carried_rows / max(padded.decode_rows, 1):.0%}) for requests that had"
            " already ended at their end-of-turn token or their length, until the longest of their"
            f" batch was done, and prefilled {padded.padding_tokens:,} padding tokens. "
            + _speedup_sentence(
                bare.median,
                ratio.low,
                ratio.high,
                "the work it computes (token rows: "
                f"{ratio.rows:.2f}; forward passes: {ratio.steps:.2f})",
            )
        )
        cached = result.speedup(ENGINE, ENGINE_NO_CACHE)
        m, m0 = result.engine_metrics[ENGINE], result.engine_metrics[ENGINE_NO_CACHE]
        rows = (m0["prefill_tokens"] + m0["generated_tokens"]) / (
            m["prefill_tokens"] + m["generated_tokens"]
        )
        served = (
            f"On, it served {m['prefix_hit_rate']:.0%} of admitted tokens from cached blocks (the"
            " shared system prompt)"
            if m["prefix_hit_rate"] > 0
            else (
                "On, it served no admitted token from cached blocks: a block is shared only once"
                " its keys and values are written (kvlab's choice, as vLLM v1's), so requests"
                " admitted together, before the shared prompt's first step wrote it, each compute"
                " their own copy, and a shared prefix shorter than a block is never shared"
            )
        )
        parts.append(
            f"**Prefix caching.** {served}; the engine ran {cached.median:.2f} times as fast as "
            "with it off. "
            + _speedup_sentence(
                cached.median,
                min(rows, 1.0),
                max(rows, 1.0),
                f"the rows it no longer computes ({rows:.2f}; the forward "
                "passes stay the same, 1.00)",
            )
        )
    for peer in (CB, CB_NO_SHARING):
        if peer in result.seconds:
            s = result.speedup(ENGINE, peer)
            parts.append(
                f"**{peer.capitalize()}.** The engine ran {s.median:.2f} times as fast (one round "
                f"{s.low:.2f} to {s.high:.2f}). Neither pads, so the same work predicts 1. "
                + _speedup_sentence(s.median, 1.0, 1.0, "equal work")
            )
    engine_latency, generate_latency = result.latency_s[ENGINE], result.latency_s[GENERATE]
    if engine_latency <= generate_latency:
        parts.append(
            f"A request waited {si(engine_latency, 's')} on average for its last token with the"
            f" engine against {si(generate_latency, 's')} with `generate`, which returns a batch"
            " only when its longest request is done."
        )
    else:
        parts.append(
            f"A request waited {si(engine_latency, 's')} on average for its last token with the"
            f" engine against {si(generate_latency, 's')} with `generate`: here the engine's mixing"
            " of prefills into decode steps slowed the requests already running more than batching"
            " saved."
        )
    if not on_gpu:
        parts.append(
            "On a GPU the engine replays its decode steps as CUDA graphs, which takes its per-step"
            " Python off the critical path; the CPU measures a small model where that work is a"
            " large share of a step."
        )
    return "\n\n".join(parts)


def curve_predictions(points, weight_bytes: float, sequence_flops: float):
    """The roofline's tokens per second at each point's mean batch
    (:func:`kvlab.theory.serving.roofline_throughput`, anchored at the first point's rate per
    request and its matmul rate) and the relative spread behind each comparison."""
    weight_bytes = real("weight_bytes", weight_bytes)
    sequence_flops = real("sequence_flops", sequence_flops)
    first = points[0]
    rate_1 = first.tokens_per_s / first.mean_batch
    predicted, spreads = [], []
    for p in points:
        t = roofline_throughput(
            rate_1,
            p.mean_batch,
            weight_bytes,
            sequence_flops,
            p.read_rate,
            first.matmul_rate,
            p.matmul_rate,
        )
        predicted.append(t)
        spreads.append(
            roofline_throughput_spread(
                t,
                p.mean_batch,
                rate_1,
                first.spread,
                sequence_flops,
                p.matmul_rate,
                p.matmul_spread,
                p.spread,
            )
        )
    return predicted, spreads


def curve_reading(
    points,
    capacity: float,
    chosen: int,
    prefix_caching: bool = True,
    weight_bytes: float = 1.0,
    sequence_flops: float = 1.0,
) -> str:
    """The latency-throughput curve. ``points``: :class:`kvlab.lab.engine.CurvePoint` in
    ``max_batch`` order, measured with their ceilings; ``capacity``: mean requests the pool holds
    at once; ``chosen``: the slider's ``max_batch``; ``weight_bytes`` and ``sequence_flops``: a
    step's weight bytes and one request's FLOPs, for the roofline
    (:func:`kvlab.theory.serving.roofline_throughput`)."""
    capacity = real("capacity", capacity)
    weight_bytes = real("weight_bytes", weight_bytes)
    sequence_flops = real("sequence_flops", sequence_flops)
    first = points[0]
    here = next(p for p in points if p.max_batch == chosen)
    text = [
        f"At `max_batch` {chosen} the engine made {here.tokens_per_s:.0f} tokens/s at"
        f" {si(here.mean_tpot_s, 's')} per output token, running {here.mean_batch:.1f} requests per"
        " step on average."
    ]
    predicted, spreads = curve_predictions(points, weight_bytes, sequence_flops)
    outcome, checks = curve_agreement([p.tokens_per_s for p in points], predicted, spreads)
    # The point the reading names: the furthest of those that decided the curve's outcome.
    deciding = [i for i in range(1, len(points)) if checks[i].outcome == outcome] or [0]
    worst = max(deciding, key=lambda i: abs(checks[i].ratio - 1))
    w = points[worst]
    flat = w.mean_batch * first.tokens_per_s / first.mean_batch
    text.append(
        "The roofline with this machine's ceilings (`kvlab.theory.serving.roofline_throughput`:"
        " the weights read at the read bandwidth, each request's products at the matmul rate"
        " measured at the running batch's rows, anchored at `max_batch` 1) predicts"
        f" {predicted[worst]:.0f} tokens/s at `max_batch` {w.max_batch}, where the engine ran"
        f" {w.mean_batch:.1f} requests per step and made {w.tokens_per_s:.0f}:"
        f" {checks[worst].describe()} (the spread behind it: {checks[worst].spread:.0%}). A step"
        f" that cost the same whatever the batch would have made {flat:.0f}."
    )
    if outcome == AGREES:
        text.append(
            "Over the curve the model agrees: on this CPU the products of a few rows run far below"
            " the large-product rate, so a fuller step costs more and throughput grows more slowly"
            " than the batch. On a GPU the matmul rate grows with the rows up to a ridge of"
            " hundreds of requests, and the same model gives the flat step."
        )
    elif outcome == DISAGREES and checks[worst].side == "below":
        text.append(
            "Over the curve the model disagrees: throughput fell short of it. The term it misses"
            " grows with the batch outside the products the probe times: prefill chunks riding in"
            " the decode steps, and each request's attention and scheduling."
        )
    elif outcome == DISAGREES:
        text.append(
            "Over the curve the model disagrees: throughput beat it. The `max_batch` 1 run, which"
            " anchors every prediction, carried costs a fuller step shares out (its prefills ran"
            " alone), or was slowed by other work on this machine."
        )
    else:
        text.append(
            "Over the curve this run cannot tell: a point sits further from the model than its"
            " spread explains, but not far enough to call it a miss."
        )
    bound, limit = batch_bound(capacity, points[-1].max_batch)
    widest = max(p.mean_batch for p in points)
    if bound == "pool":
        text.append(
            f"The pool holds about {capacity:.1f} mean requests at once, fewer than the largest"
            f" `max_batch` ({points[-1].max_batch}), so the pool, not `max_batch`, bounds the batch"
            f" there; the running batch averaged at most {widest:.1f}."
        )
    else:
        text.append(
            f"The pool holds about {capacity:.1f} mean requests at once, more than the largest"
            f" `max_batch` ({points[-1].max_batch}), so it does not bind on this trace; the running"
            f" batch averaged at most {widest:.1f}."
        )
    if not prefix_caching:
        text.append(
            "Prefix caching was off: every prompt token, shared system prompts included, was"
            " computed."
        )
    elif here.prefix_hit_rate > 0:
        text.append(
            f"With prefix caching on, {here.prefix_hit_rate:.0%} of the tokens admitted came from"
            " cached blocks (the shared system prompts), prefill work the engine did not repeat."
        )
    else:
        text.append(
            "Prefix caching was on but no admission hit the cache: the pool evicted the shared "
            "prompts' blocks before the next request that shared them arrived."
        )
    preempted = sum(p.preemptions for p in points)
    if preempted:
        text.append(
            f"Across the curve the engine preempted {times(preempted)} when growing requests "
            "outran the free blocks."
        )
    return " ".join(text)


def burst_reading(
    requests: int,
    prompt_tokens: int,
    computed: int,
    once: int,
    same_tokens: bool,
    peer_ratio: tuple[float, float, float] | None = None,
    ttft_s: float | None = None,
) -> str:
    """A burst behind one system prompt (notebook 11): the prompt tokens the engine's prefill steps
    computed (``computed``) against computing the system prompt once and every request's own tokens
    (``once``); ``peer_ratio`` is transformers' continuous batching's time over the engine's
    (median, lowest and highest round), or None when not timed; ``ttft_s`` the engine's mean time
    to first token."""
    flag("same_tokens", same_tokens)
    text = (
        f"The {number(requests)} prompts hold {prompt_tokens:,} tokens; the engine's prefill steps "
        f"computed **{computed:,}** of them"
    )
    if computed == once:
        text += (
            f", exactly what computing the system prompt once and each request's own tokens takes "
            f"({once:,}). The first request's chunk registered the prompt's full blocks when it was"
            " scheduled, and the requests admitted behind it in the same step reused them."
        )
    else:
        text += (
            f", {computed - once:+,} against computing the system prompt once and each request's "
            f"own tokens ({once:,}): some requests computed shared blocks again."
        )
    if not same_tokens:
        return text + " A contender's tokens differ from `generate`'s, so no time is reported."
    text += " Every request's tokens equal `generate`'s."
    if ttft_s is not None:
        text += f" The engine's mean time to first token was {si(ttft_s, 's')}."
    if peer_ratio is not None:
        median, low, high = peer_ratio
        spread = f" (rounds {low:.2f} to {high:.2f})" if high - low >= 0.005 else ""
        text += (
            f" Over the burst, {CB} with its block sharing took **{median:.2f}** times the"
            f" engine's time{spread}."
        )
    return text


def chunk_reading(
    small: int,
    large: int,
    ttft: tuple[float, float],
    tpot: tuple[float, float],
    spreads: tuple[float, float],
) -> str:
    """Chunked prefill's trade-off, measured: mean TTFT and mean TPOT at a small token budget per
    step (``small``) against a large one (``large``); ``ttft`` and ``tpot`` are (small, large),
    ``spreads`` the relative spread behind the TTFT and the TPOT ratios. Each ratio is compared
    with "no change" (``kvlab.theory.agreement.compare``): agreement means the budget did not
    move it beyond the noise."""
    small, large = integer("small", small, 0), integer("large", large, 0)
    t, p = compare(ttft[0], ttft[1], spreads[0]), compare(tpot[0], tpot[1], spreads[1])

    def moved(c, what):
        if c.outcome == AGREES:
            return f"{what} did not move beyond the noise ({c.ratio:.2f} times)"
        way = "rose" if c.side == "above" else "fell"
        if c.outcome == DISAGREES:
            return f"{what} {way} to {c.ratio:.2f} times"
        return f"{what} {way} to {c.ratio:.2f} times, within the noise band (cannot tell)"

    text = (
        f"With a budget of {small} tokens per step instead of {large:,}, mean time to first token"
        f" went from {si(ttft[1], 's')} to {si(ttft[0], 's')} and mean time per output token from"
        f" {si(tpot[1], 's')} to {si(tpot[0], 's')}: {moved(t, 'TTFT')}, {moved(p, 'TPOT')}. "
    )
    if t.outcome == DISAGREES and t.side == "above" and p.side != "above":
        cheaper = (
            ", and each step, carrying less prefill, costs less"
            if p.side == "below"
            else ", so their time per token holds"
        )
        return text + (
            "The trade-off as chunked prefill predicts it: a prompt fed a few tokens per step"
            f" waits many steps for its first token, while the running decodes are never held"
            f" back{cheaper}."
        )
    if t.outcome == DISAGREES and t.side == "above":
        return text + (
            "TTFT rose as predicted, but TPOT rose too: on this CPU every step pays a fixed cost"
            " (Python, dispatch), so the extra steps a small budget takes show in each"
            " request's time per token."
        )
    return text + (
        "The budget did not lengthen the first token here: the prompts are short beside the"
        " budget, so few of them needed more than one step to prefill."
    )
