"""Readings of notebook 11, the continuous-batching engine (notebook ``11_engine``)."""

from __future__ import annotations

from kvlab.show.format import si


def life_reading(counts: dict, block_size: int, num_blocks: int, budget: int) -> str:
    """The life of a handful of requests. ``counts`` has ``requests``, ``steps``, ``chunked`` (requests
    whose prefill took more than one step), ``preemptions``, ``stalled`` (request-steps given no tokens
    while running) and ``cached_tokens``."""
    text = [f"The engine served {counts['requests']} requests in {counts['steps']} steps, with a pool of "
            f"{num_blocks} blocks of {block_size} tokens and a budget of {budget} tokens per step."]
    if counts["chunked"]:
        text.append(f"{counts['chunked']} of them had prompts longer than what a step had left, so their "
                    "prefill ran in chunks over several steps while the others kept decoding.")
    else:
        text.append("Every prompt fitted in what its first step had left, so no prefill was chunked; a "
                    "smaller budget or a longer prompt would split one.")
    if counts["preemptions"]:
        text.append(f"The pool ran out {counts['preemptions']} time(s): the newest running request lost "
                    "its blocks and went back to the head of the queue, and came back when blocks were free.")
    else:
        text.append("The pool never ran out, so nothing was preempted; the trace was meant to force it, "
                    "and a pool a few blocks smaller would.")
    if counts["cached_tokens"]:
        text.append(f"{counts['cached_tokens']} prompt tokens were served from the prefix cache instead of "
                    "being computed again.")
    return " ".join(text)


def comparison_reading(requests: int, max_batch: int, engine_tps: float, generate_tps: float,
                       engine_latency: float, generate_latency: float, mean_batch: float, on_gpu: bool) -> str:
    """The engine against padded static ``generate`` batches on one trace (tokens already asserted equal)."""
    ratio = engine_tps / generate_tps
    text = [f"On {requests} requests, both produced the same tokens for every request. The engine generated "
            f"**{engine_tps:.0f} tokens/s** and padded `generate` batches of {max_batch} **{generate_tps:.0f} "
            f"tokens/s**, a ratio of **{ratio:.2f}**."]
    if ratio >= 1:
        text.append("The engine wins because a batch never waits for its longest member: a finished "
                    "request's slot goes to the next one at once, and no step computes padding.")
    else:
        expected = "2" if on_gpu else "1"
        text.append(f"The expectation was at least {expected} times `generate`'s rate; this run fell short. On "
                    "a shared CPU the engine's per-step Python work (scheduling, building the step's tables) "
                    "is a larger share of a small model's step than on a GPU, and noise from other processes "
                    "can swing one run either way.")
    if engine_latency <= generate_latency:
        text.append(f"A request waited {si(engine_latency, 's')} on average for its last token against "
                    f"{si(generate_latency, 's')} with `generate`, which returns a batch only when its "
                    "longest request is done.")
    else:
        text.append(f"A request waited {si(engine_latency, 's')} on average for its last token against "
                    f"{si(generate_latency, 's')} with `generate`: here the engine's mixing of prefills "
                    "into decode steps slowed the requests already running more than batching saved.")
    text.append(f"The engine's running batch averaged {mean_batch:.1f} requests per step.")
    return " ".join(text)


def curve_reading(points, capacity: float, chosen: int, prefix_caching: bool = True) -> str:
    """The latency-throughput curve. ``points``: :class:`kvlab.lab.engine.CurvePoint` in ``max_batch`` order;
    ``capacity``: mean requests the pool holds at once; ``chosen``: the slider's ``max_batch``."""
    first, best = points[0], max(points, key=lambda p: p.tokens_per_s)
    here = next(p for p in points if p.max_batch == chosen)
    text = [f"At `max_batch` {chosen} the engine made {here.tokens_per_s:.0f} tokens/s at "
            f"{si(here.mean_tpot_s, 's')} per output token, running {here.mean_batch:.1f} requests per step "
            "on average."]
    if best.tokens_per_s > 1.2 * first.tokens_per_s:
        text.append(f"Throughput grew from {first.tokens_per_s:.0f} tokens/s at one request to "
                    f"{best.tokens_per_s:.0f} at `max_batch` {best.max_batch}: a decode step reads the "
                    "weights once for the whole batch.")
    else:
        text.append(f"Throughput barely moved ({first.tokens_per_s:.0f} tokens/s at one request, at most "
                    f"{best.tokens_per_s:.0f}). The expectation was growth with the batch, since a step reads "
                    "the weights once for every request in it; a step this small on a CPU is dominated by "
                    "fixed per-step costs, or the pool held too few requests for the batch to grow.")
    if first.tokens_per_s > 0 and best is not first:
        share = best.tokens_per_s / (best.mean_batch * first.tokens_per_s / first.mean_batch)
        if share >= 2 / 3:
            text.append(f"At `max_batch` {best.max_batch} that is {share:.0%} of the flat-step prediction "
                        f"({best.mean_batch:.1f} requests per step times the one-request rate): the "
                        "weights read once per step still set the cost of a step.")
        else:
            text.append(f"At `max_batch` {best.max_batch} that is only {share:.0%} of the flat-step prediction "
                        f"({best.mean_batch:.1f} requests per step times the one-request rate). The "
                        "prediction assumes a step costs the same at any batch; here steps grew with it, "
                        "because prefill chunks ride along in the decode steps and, on a CPU, the per-token "
                        "work of a small model is not small next to reading its weights.")
    widest = max(p.mean_batch for p in points)
    if widest < 0.9 * points[-1].max_batch:
        text.append(f"The running batch never averaged more than {widest:.1f} requests although "
                    f"`max_batch` went to {points[-1].max_batch}: the pool, which holds about "
                    f"{capacity:.1f} mean requests at once, is the limit there, not `max_batch`.")
    else:
        text.append(f"The running batch kept up with `max_batch` (the pool holds about {capacity:.1f} mean "
                    "requests at once, so it did not bind on this trace).")
    if not prefix_caching:
        text.append("Prefix caching was off: every prompt token, shared system prompts included, was computed.")
    elif here.prefix_hit_rate > 0:
        text.append(f"With prefix caching on, {here.prefix_hit_rate:.0%} of the tokens admitted came from cached "
                    "blocks (the shared system prompts), prefill work the engine did not repeat.")
    else:
        text.append("Prefix caching was on but no admission hit the cache: the pool evicted the shared "
                    "prompts' blocks before the next request that shared them arrived.")
    preempted = sum(p.preemptions for p in points)
    if preempted:
        text.append(f"Across the curve the engine preempted {preempted} time(s) when growing requests "
                    "outran the free blocks.")
    return " ".join(text)
