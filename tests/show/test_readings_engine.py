"""The readings of notebook 11 (the engine), each outcome-dependent sentence in both of its
branches, with inputs on both sides of each boundary computed by the model that decides it (the work
ratios of padded ``generate`` against the engine, the flat-step model, the pool model)."""

import dataclasses

import pytest

from kvlab.lab.engine import CurvePoint, PaddedRun, ServingComparison
from kvlab.show.readings.engine import (
    burst_reading,
    comparison_reading,
    curve_predictions,
    curve_reading,
    life_reading,
    number,
    times,
)
from kvlab.theory import serving as model
from kvlab.theory.agreement import edges


def test_counts_read_as_words():
    assert (number(0), number(3), number(12), times(1), times(2), times(4)) == (
        "no",
        "three",
        "12",
        "once",
        "twice",
        "four times",
    )


def test_life_reading_both_outcomes():
    busy = life_reading(
        dict(
            requests=5,
            steps=21,
            chunked=3,
            preempted=[(9, 2, "recompute")],
            readmitted_tokens=17,
            readmitted_cached=16,
            stalled=2,
            cached_tokens=8,
        ),
        4,
        12,
        8,
    )
    calm = life_reading(
        dict(
            requests=5,
            steps=9,
            chunked=0,
            preempted=[],
            readmitted_tokens=0,
            readmitted_cached=0,
            stalled=0,
            cached_tokens=0,
        ),
        4,
        12,
        8,
    )
    evicted = life_reading(
        dict(
            requests=5,
            steps=21,
            chunked=0,
            preempted=[(9, 2, "recompute"), (12, 3, "recompute")],
            readmitted_tokens=17,
            readmitted_cached=0,
            stalled=0,
            cached_tokens=0,
        ),
        4,
        12,
        8,
    )
    swapped = life_reading(
        dict(
            requests=5,
            steps=21,
            chunked=0,
            preempted=[(9, 2, "swap")],
            readmitted_tokens=0,
            readmitted_cached=0,
            stalled=0,
            cached_tokens=0,
        ),
        4,
        12,
        8,
    )
    assert "five requests" in busy and "Three of them" in busy and "ran in chunks" in busy
    assert "ran out once, at step 9, when request 2" in busy and "16 of its 17 tokens" in busy
    assert "only one was computed again" in busy and "vLLM V1 makes recompute its default" in busy
    assert "8 prompt tokens" in busy
    assert (
        "no prefill was chunked" in calm and "never ran out" in calm and "prefix cache" not in calm
    )
    assert "ran out twice, first at step 9" in evicted and "paid for its whole prefill" in evicted
    assert (
        "by swap, copying its blocks to host memory" in swapped
        and "No request preempted by recompute" in swapped
    )


def _comparison(padding_speedup, caching_speedup, cb_speedup):
    """A comparison whose measured speed-ups are the given factors; the work ratios come from these
    runs."""
    padded = PaddedRun(
        [[1]] * 8,
        [1.0] * 8,
        2.0,
        prefill_rows=400,
        decode_rows=300,
        carried_rows=120,
        padding_tokens=80,
        forward_passes=60,
    )
    cached = dict(
        prefill_tokens=200, generated_tokens=200, requests=8, steps=40, prefix_hit_rate=0.5
    )
    bare = dict(prefill_tokens=320, generated_tokens=200, requests=8, steps=40, prefix_hit_rate=0.0)
    seconds = {
        model.GENERATE: (2.0,),
        model.ENGINE_NO_CACHE: (2.0 / padding_speedup,),
        model.ENGINE: (2.0 / padding_speedup / caching_speedup,),
    }
    seconds[model.CB] = (seconds[model.ENGINE][0] * cb_speedup,)
    return ServingComparison(
        8,
        200,
        8,
        seconds,
        {k: True for k in seconds},
        {model.ENGINE: cached, model.ENGINE_NO_CACHE: bare},
        {model.ENGINE: 0.5, model.GENERATE: 1.0},
        padded,
    )


def test_comparison_reading_decides_by_the_work_models():
    probe = _comparison(1.0, 1.0, 1.0)
    ratio = model.work_ratio(probe.padded, probe.engine_metrics[model.ENGINE_NO_CACHE])
    rows = (320 + 200) / (200 + 200)  # prefix caching's row ratio, the steps staying the same
    assert ratio.steps == pytest.approx(60 / 40) and ratio.rows == pytest.approx(
        (400 + 300) / (320 + 200 - 8)
    )
    tol = model.SPEEDUP_TOLERANCE
    text = comparison_reading(
        _comparison(1.1 * ratio.high * tol, 1.1 * rows * tol, 1.1 * tol), on_gpu=False
    )
    assert (
        text.count("did better than its work predicts") == 3
        and "120 of its 300 decode rows (40%)" in text
    )
    text = comparison_reading(
        _comparison(0.9 * ratio.high * tol, 0.9 * rows * tol, 0.9 * tol), on_gpu=True
    )
    assert text.count("follows it") == 3 and "CUDA graphs" not in text
    text = comparison_reading(
        _comparison(0.9 * ratio.low / tol, 0.9 / tol, 0.9 / tol), on_gpu=False
    )
    assert text.count("did worse than its work predicts") == 3 and "CUDA graphs" in text
    assert (
        "80 padding tokens" in text
        and "50% of admitted tokens" in text
        and "returns a batch only" in text
    )
    assert "Times are from one round" in text


def test_comparison_reading_says_why_nothing_was_served_from_the_cache():
    probe = _comparison(1.0, 1.0, 1.0)
    probe.engine_metrics[model.ENGINE]["prefix_hit_rate"] = 0.0
    text = comparison_reading(probe, on_gpu=True)
    assert (
        "served no admitted token from cached blocks" in text
        and "each compute their own copy" in text
    )
    three = dataclasses.replace(probe, seconds={k: v * 3 for k, v in probe.seconds.items()})
    assert "medians of 3 interleaved rounds" in comparison_reading(three, on_gpu=True)


def _curve(last_tokens_per_s, spread=0.08):
    """Three points: one request at 20 tokens/s, then 3.9 and 4.4 mean requests; weights of 80 MB
    at 10 GB/s (8 ms) and 40 MFLOP a request at 10 GFLOP/s for one row, 20 GFLOP/s for four."""
    ceil = dict(read_rate=1e10, matmul_spread=0.0)
    return [
        CurvePoint(1, 20.0, 0.05, 1.0, 0, 0.2, spread, matmul_rate=1e10, **ceil),
        CurvePoint(4, 60.0, 0.057, 3.9, 0, 0.2, spread, matmul_rate=2e10, **ceil),
        CurvePoint(8, last_tokens_per_s, 0.06, 4.4, 2, 0.2, spread, matmul_rate=2e10, **ceil),
    ]


def test_curve_reading_decides_by_the_roofline_and_pool_models():
    sizes = dict(weight_bytes=80e6, sequence_flops=40e6)
    predicted, spreads = curve_predictions(_curve(1.0), **sizes)
    # One request: 50 ms a step, of which the weights' 8 ms; 4.4 requests: 50 - 8 + 8.8 ms.
    assert predicted[2] == pytest.approx(4.4 / (0.050 - 0.008 + 4.4 * 40e6 / 2e10))
    # The middle point sits on its prediction, so the last point decides.
    middle = predicted[1]

    def at(last):
        points = _curve(last)
        points[1] = dataclasses.replace(points[1], tokens_per_s=middle)
        return points

    lo_d, lo_a, hi_a, hi_d = edges(predicted[2], spreads[2])
    text = curve_reading(at(predicted[2]), capacity=4.5, chosen=4, **sizes)
    assert (
        "Over the curve the model agrees" in text
        and "the pool, not `max_batch`, bounds" in text
        and "preempted twice" in text
    )
    assert "20% of the tokens admitted came from cached" in text and "roofline_throughput" in text
    assert "disagrees: throughput fell short" in curve_reading(
        at(0.9 * lo_d), capacity=4.5, chosen=4, **sizes
    )
    assert "disagrees: throughput beat it" in curve_reading(
        at(1.1 * hi_d), capacity=4.5, chosen=4, **sizes
    )
    for inside in ((lo_d * lo_a) ** 0.5, (hi_a * hi_d) ** 0.5):
        assert "cannot tell" in curve_reading(at(inside), capacity=4.5, chosen=4, **sizes)
    for edge in (1.01 * lo_a, 0.99 * hi_a):
        assert "model agrees" in curve_reading(at(edge), capacity=4.5, chosen=4, **sizes)
    bound, _ = model.batch_bound(8.0, 8)
    assert bound == "max_batch" and "does not bind" in curve_reading(
        at(1.0), capacity=8.0, chosen=1, **sizes
    )
    assert model.batch_bound(8.0 * 0.99, 8)[0] == "pool"
    flat = [dataclasses.replace(p, prefix_hit_rate=0.0) for p in _curve(21.0)[:2]]
    assert "no admission hit" in curve_reading(flat, capacity=20.0, chosen=1, **sizes)
    assert "was off" in curve_reading(flat, capacity=20.0, chosen=1, prefix_caching=False, **sizes)


def test_burst_reading_says_whether_the_system_prompt_was_computed_once():
    once = burst_reading(16, 1152, 192, 192, True, (3.2, 3.0, 3.4))
    assert "**192**" in once and "exactly what computing the system prompt once" in once
    assert "3.20** times" in once and "(rounds 3.00 to 3.40)" in once
    assert "equal `generate`'s" in once
    assert "rounds" not in burst_reading(16, 1152, 192, 192, True, (3.2, 3.2, 3.2))
    assert "first token was 12.5 ms" in burst_reading(16, 1152, 192, 192, True, None, 0.0125)
    again = burst_reading(16, 1152, 1152, 192, True)
    assert "+960 against computing" in again and "computed shared blocks again" in again
    assert "times the engine" not in again
    wrong = burst_reading(16, 1152, 192, 192, False, (3.2, 3.0, 3.4))
    assert "no time is reported" in wrong and "times the engine" not in wrong


def test_chunk_reading_on_every_side_of_no_change():
    from kvlab.show.readings.engine import chunk_reading
    from kvlab.theory.agreement import edges

    lo_d, lo_a, hi_a, hi_d = edges(1.0, 0.1)

    def text(ttft_ratio, tpot_ratio):
        return chunk_reading(
            12, 256, (ttft_ratio * 0.5, 0.5), (tpot_ratio * 0.08, 0.08), (0.1, 0.1)
        )

    trade = text(1.1 * hi_d, 0.9 * lo_d)
    assert (
        "TTFT rose to" in trade
        and "TPOT fell to" in trade
        and "as chunked prefill predicts" in trade
    )
    assert "cannot tell" not in trade and "256" in trade
    both = text(1.1 * hi_d, 1.1 * hi_d)
    assert "TPOT rose too" in both and "fixed cost" in both
    assert "costs less" in trade
    held = text(1.1 * hi_d, 1.0)
    assert "as chunked prefill predicts" in held and "time per token holds" in held
    flat = text(1.0, 1.0)
    assert "did not move beyond the noise" in flat and "did not lengthen the first token" in flat
    unsure = text((hi_a * hi_d) ** 0.5, 1.0)
    assert "cannot tell" in unsure and "did not lengthen" in unsure
    quiet = text(1.1 * hi_d, (lo_a * lo_d) ** 0.5)
    assert (
        "TPOT fell" in quiet and "cannot tell" in quiet and "as chunked prefill predicts" in quiet
    )
