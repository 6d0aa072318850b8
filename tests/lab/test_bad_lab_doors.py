"""Every notebook: the lab's public names that no other table reached refuse a bad argument at the
door, naming it, before they allocate, time or load anything (issue 33)."""

import math

import pytest
import torch

import kvlab
from kvlab.lab import (
    batch_tpot,
    bench,
    cache_bytes,
    cache_quality,
    decode_peers,
    decode_timing,
    diagnose,
    engine,
    gemv,
    hardware,
    layout_timing,
    paged_attention,
    paged_kernel,
    paging,
    parallel,
    preemption,
    prefix,
    prefix_reuse,
    pretrained,
    recall,
    repeatable_step,
    skinny,
    speculative,
    ssm_timing,
    streams,
    timing,
    trained,
)

NAN = math.nan
IDS = torch.tensor([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def tiny():
    return kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, kv_heads=1, vocab=64)


# name: (call on the fixture's model, error, a regex the message must match: the argument's name)
BAD_CALLS = {
    "gemv.alternating_product no vectors": (
        lambda m: gemv.alternating_product([torch.zeros(4, 4)], 0, None),
        ValueError,
        "n must",
    ),
    "batch_tpot.min_scatter text": (lambda m: batch_tpot.min_scatter("t"), TypeError, "timing"),
    "batch_tpot.time_beside zero rows": (
        lambda m: batch_tpot.time_beside(lambda: None, 0),
        ValueError,
        "rows",
    ),
    "batch_tpot.step_beside_ceilings text stepper": (
        lambda m: batch_tpot.step_beside_ceilings("step", 1),
        TypeError,
        "stepper",
    ),
    "bench.benchmark bogus": (lambda m: bench.benchmark(3), TypeError, "name"),
    "bench.table text": (lambda m: bench.table("rows"), TypeError, "results"),
    "bench.to_json text": (lambda m: bench.to_json("rows"), TypeError, "results"),
    "bench.chapter_heading int": (lambda m: bench.chapter_heading(3), TypeError, "section"),
    "bench.records_markdown text": (lambda m: bench.records_markdown("x"), TypeError, "records"),
    "bench.load_records a file": (lambda m: bench.load_records(__file__), ValueError, "folder"),
    "cache_bytes.cache_nbytes text": (lambda m: cache_bytes.cache_nbytes("c"), TypeError, "cache"),
    "cache_bytes.layer_states int name": (
        lambda m: cache_bytes.layer_states(object(), 3),
        TypeError,
        "name",
    ),
    "cache_bytes.layer_kinds text": (lambda m: cache_bytes.layer_kinds("c"), TypeError, "cache"),
    "cache_quality.attention_error list": (
        lambda m: cache_quality.attention_error([1.0], *[torch.ones(1, 2, 4)] * 4),
        TypeError,
        "q",
    ),
    "cache_quality.rerotation_scores negative position": (
        lambda m: cache_quality.rerotation_scores(
            torch.ones(2, 8), torch.ones(4, 2, 8), torch.ones(4), -1, [0, 1, 2, 3]
        ),
        ValueError,
        "query_position",
    ),
    "cache_quality.cached_keys_values float tokens": (
        lambda m: cache_quality.cached_keys_values(m, torch.ones(1, 4)),
        TypeError,
        "tokens",
    ),
    "cache_quality.channel_rms list": (lambda m: cache_quality.channel_rms([1.0]), TypeError, "x"),
    "cache_quality.over_median list": (
        lambda m: cache_quality.over_median([1.0]),
        TypeError,
        "rms",
    ),
    "cache_quality.bench_rows zero reps": (
        lambda m: cache_quality.bench_rows(0),
        ValueError,
        "reps",
    ),
    "decode_peers.compiled_peer text": (
        lambda m: decode_peers.compiled_peer("model"),
        TypeError,
        "model",
    ),
    "decode_peers.contenders float tokens": (
        lambda m: decode_peers.contenders(m, IDS, 1.5),
        TypeError,
        "max_new_tokens",
    ),
    "decode_peers.ratio_rows text": (lambda m: decode_peers.ratio_rows("r"), TypeError, "result"),
    "decode_peers.floor_rows text gpu": (
        lambda m: decode_peers.floor_rows(m, IDS, 4, "no"),
        TypeError,
        "gpu",
    ),
    "decode_peers.compile_rows text": (
        lambda m: decode_peers.compile_rows("r"),
        TypeError,
        "result",
    ),
    "decode_peers.bench_rows zero reps": (
        lambda m: decode_peers.bench_rows(reps=0),
        ValueError,
        "reps",
    ),
    "decode_peers.quick_rows bool": (
        lambda m: decode_peers.quick_rows(True),
        TypeError,
        "new_tokens",
    ),
    "decode_timing.bench_rows zero reps": (
        lambda m: decode_timing.bench_rows(reps=0),
        ValueError,
        "reps",
    ),
    "diagnose.threads_text zero": (lambda m: diagnose.threads_text(0), ValueError, "threads"),
    "diagnose.calibration zero": (lambda m: diagnose.calibration(0), ValueError, "threads"),
    "diagnose.this_machine NaN": (lambda m: diagnose.this_machine(NAN), ValueError, "memory"),
    "engine.chat_requests text questions": (
        lambda m: engine.chat_requests(None, "abc"),
        TypeError,
        "questions",
    ),
    "engine.continuous_batching zero block": (
        lambda m: engine.continuous_batching(m, [[1, 2]], [2], block_size=0),
        ValueError,
        "block_size",
    ),
    "engine.peer_rows text": (lambda m: engine.peer_rows("r", "cpu"), TypeError, "result"),
    "engine.burst_requests bool n": (
        lambda m: engine.burst_requests(64, True),
        TypeError,
        "n must",
    ),
    "engine.prefill_tokens text flag": (
        lambda m: engine.prefill_tokens(m, [[1, 2]], [2], staggered="no"),
        TypeError,
        "staggered",
    ),
    "engine.burst_rows zero reps": (lambda m: engine.burst_rows(m, 0), ValueError, "reps"),
    "engine.cuda_graph_rows zero reps": (
        lambda m: engine.cuda_graph_rows(m, [[1, 2]], [2], 0),
        ValueError,
        "reps",
    ),
    "engine.quoting_requests zero n": (
        lambda m: engine.quoting_requests(None, 0),
        ValueError,
        "n must",
    ),
    "engine.speculation_rows zero k": (lambda m: engine.speculation_rows(0), ValueError, "k must"),
    "engine.timeline negative steps": (lambda m: engine.timeline([], -1), ValueError, "num_steps"),
    "gemv.default_sizes text gpu": (lambda m: gemv.default_sizes("no"), TypeError, "gpu must"),
    "gemv.random_cache zero batch": (lambda m: gemv.random_cache(m, 0, 8), ValueError, "batch"),
    "gemv.RandomCacheStep zero context": (
        lambda m: gemv.RandomCacheStep(m, 1, 0),
        ValueError,
        "context",
    ),
    "gemv.profile_step zero reps": (lambda m: gemv.profile_step(m, reps=0), ValueError, "reps"),
    "gemv.bench_rows text result": (lambda m: gemv.bench_rows("sweep"), TypeError, "result"),
    "hardware.stamp_line text": (lambda m: hardware.stamp_line("s"), ValueError, "s must"),
    "hardware.write_probe zero": (lambda m: hardware.write_probe(0), ValueError, "nbytes"),
    "hardware.copy_probe bool": (lambda m: hardware.copy_probe(True), TypeError, "nbytes"),
    "hardware.read_bandwidth zero reps": (lambda m: hardware.read_bandwidth(0), ValueError, "reps"),
    "hardware.write_bandwidth zero reps": (
        lambda m: hardware.write_bandwidth(0),
        ValueError,
        "reps",
    ),
    "hardware.copy_bandwidth zero reps": (lambda m: hardware.copy_bandwidth(0), ValueError, "reps"),
    "hardware.matmul_rate zero n": (lambda m: hardware.matmul_rate(0), ValueError, "n must"),
    "hardware.memory_bytes bogus": (lambda m: hardware.memory_bytes("bogus"), ValueError, "device"),
    "layout_timing.contiguous_runs text": (
        lambda m: layout_timing.contiguous_runs("geometry", 4),
        TypeError,
        "geometry",
    ),
    "layout_timing.read_traffic text": (
        lambda m: layout_timing.read_traffic("cache"),
        TypeError,
        "cache",
    ),
    "layout_timing.measure_append text": (
        lambda m: layout_timing.measure_append("cache"),
        TypeError,
        "cache",
    ),
    "layout_timing.bench_rows zero rounds": (
        lambda m: layout_timing.bench_rows(0),
        ValueError,
        "rounds",
    ),
    "paged_attention.paged_decode_launcher list": (
        lambda m: paged_attention.paged_decode_launcher([1.0], None, None, None, None),
        TypeError,
        "q",
    ),
    "paged_attention.paged_prefill_launcher list": (
        lambda m: paged_attention.paged_prefill_launcher([1.0], None, None, None, None, None),
        TypeError,
        "q",
    ),
    "paged_attention.compare_attention zero batch": (
        lambda m: paged_attention.compare_attention(0, 16),
        ValueError,
        "batch",
    ),
    "paged_attention.compare_splits zero splits": (
        lambda m: paged_attention.compare_splits(1, 16, 0),
        ValueError,
        "num_splits",
    ),
    "paging.make_trace zero n": (lambda m: paging.make_trace(-1), ValueError, "n must"),
    "paged_kernel.recorded_runs text": (
        lambda m: paged_kernel.recorded_runs("abc"),
        TypeError,
        "records",
    ),
    "pretrained.install text run": (lambda m: pretrained.install("pip"), TypeError, "run must"),
    "ssm_timing.mamba_path bogus device": (
        lambda m: ssm_timing.mamba_path("bogus"),
        ValueError,
        "device",
    ),
    "trained.trained_model bogus attention": (
        lambda m: trained.trained_model(attn_implementation="bogus"),
        ValueError,
        "attn_implementation",
    ),
    "paging.ContiguousMemory zero budget": (
        lambda m: paging.ContiguousMemory(0, 16),
        ValueError,
        "budget",
    ),
    "parallel.predicted_collective bogus kind": (
        lambda m: parallel.predicted_collective("bogus", 1024.0, 2, None),
        ValueError,
        "kind",
    ),
    "parallel.measure_collectives bogus kind": (
        lambda m: parallel.measure_collectives(None, None, "bogus"),
        ValueError,
        "kind",
    ),
    "parallel.compare_tensor_parallel_step zero steps": (
        lambda m: parallel.compare_tensor_parallel_step(None, None, steps=0),
        ValueError,
        "steps",
    ),
    "parallel.bench_rows world 0": (lambda m: parallel.bench_rows(0), ValueError, "world_size"),
    "parallel.recorded_rows text": (lambda m: parallel.recorded_rows("r"), TypeError, "records"),
    "preemption.measure_preemption_cost zero tokens": (
        lambda m: preemption.measure_preemption_cost(m, 0),
        ValueError,
        "num_tokens",
    ),
    "preemption.copy_block_by_block list": (
        lambda m: preemption.copy_block_by_block([1.0], torch.ones(2)),
        TypeError,
        "src",
    ),
    "preemption.cached_recompute_rows text gpu": (
        lambda m: preemption.cached_recompute_rows("no"),
        TypeError,
        "gpu",
    ),
    "preemption.recompute_workload text gpu": (
        lambda m: preemption.recompute_workload(64, "no"),
        TypeError,
        "gpu",
    ),
    "prefix.compute_shape text": (lambda m: prefix.compute_shape("model"), TypeError, "model"),
    "prefix.prefill_attention_cost bogus hw": (
        lambda m: prefix.prefill_attention_cost(kvlab.SHAPES["llama-3.2-1b"], "bogus", [8], [8]),
        ValueError,
        "hw",
    ),
    "prefix.prefill_kernel_rows zero reps": (
        lambda m: prefix.prefill_kernel_rows(0),
        ValueError,
        "reps",
    ),
    "prefix_reuse.shared_prefix text": (
        lambda m: prefix_reuse.shared_prefix("abc"),
        TypeError,
        "prompts",
    ),
    "prefix_reuse.compare_prefix_reuse zero reps": (
        lambda m: prefix_reuse.compare_prefix_reuse(m, [[1, 2, 3, 4], [1, 2, 3, 5]], reps=0),
        ValueError,
        "reps",
    ),
    "prefix_reuse.reuse_rows zero prompt": (
        lambda m: prefix_reuse.reuse_rows(m, 0),
        ValueError,
        "prompt",
    ),
    "recall.linear_recall_errors text": (
        lambda m: recall.linear_recall_errors("r", 4),
        TypeError,
        "recurrence",
    ),
    "repeatable_step.measurement_threads zero": (
        lambda m: repeatable_step.measurement_threads(m, 0),
        ValueError,
        "threads",
    ),
    "repeatable_step.check_ids float": (
        lambda m: repeatable_step.check_ids(torch.ones(1, 3)),
        TypeError,
        "input_ids",
    ),
    "repeatable_step.model_shape_of text": (
        lambda m: repeatable_step.model_shape_of("model"),
        TypeError,
        "model",
    ),
    "repeatable_step.element_bytes text": (
        lambda m: repeatable_step.element_bytes("model"),
        TypeError,
        "model",
    ),
    "repeatable_step.prepared_ids bogus method": (
        lambda m: repeatable_step.prepared_ids(m, IDS, 8, "bogus"),
        ValueError,
        "method",
    ),
    "repeatable_step.tile_prompt zero context": (
        lambda m: repeatable_step.tile_prompt(IDS, 0),
        ValueError,
        "context",
    ),
    "repeatable_step.sync bogus": (lambda m: repeatable_step.sync("bogus"), ValueError, "device"),
    "repeatable_step.RepeatableStep bogus method": (
        lambda m: repeatable_step.RepeatableStep(m, IDS, "bogus"),
        ValueError,
        "method",
    ),
    "repeatable_step.step_time zero reps": (
        lambda m: repeatable_step.step_time(m, IDS, "cached", reps=0),
        ValueError,
        "reps",
    ),
    "repeatable_step.prefill_time zero reps": (
        lambda m: repeatable_step.prefill_time(m, IDS, reps=0),
        ValueError,
        "reps",
    ),
    "skinny.default_sizes text gpu": (lambda m: skinny.default_sizes("no"), TypeError, "gpu"),
    "speculative.task_ids bogus": (
        lambda m: speculative.task_ids(None, "bogus"),
        ValueError,
        "task",
    ),
    "speculative.replay zero k": (
        lambda m: speculative.replay([1, 2], [3], 0),
        ValueError,
        "k must",
    ),
    "speculative.verify_times zero reps": (
        lambda m: speculative.verify_times(m, IDS, reps=0),
        ValueError,
        "reps",
    ),
    "speculative.generate_run float tokens": (
        lambda m: speculative.generate_run(m, IDS, 1.5),
        TypeError,
        "new_tokens",
    ),
    "speculative.contenders zero k": (
        lambda m: speculative.contenders(m, IDS, 4, k=0),
        ValueError,
        "k must",
    ),
    "speculative.predicted_speedup zero k": (
        lambda m: speculative.predicted_speedup(m, IDS, [1, 2], 0),
        ValueError,
        "k must",
    ),
    "speculative.bench_rows zero rounds": (
        lambda m: speculative.bench_rows(rounds=0),
        ValueError,
        "rounds",
    ),
    "streams.stream_eval negative first": (
        lambda m: streams.stream_eval(m, torch.tensor([1, 2, 3]), first=-1),
        ValueError,
        "first",
    ),
    "timing.merge_timings text": (lambda m: timing.merge_timings("t"), TypeError, "parts"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_naming_its_argument(tiny, name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call(tiny)
