"""Every notebook: the theory models the other tables did not reach refuse input outside their
domain (issue 33): a NaN, an infinity, a negative count, a bool where a number belongs, a name that
is not one. Each row calls one public name with one bad argument and checks the error names it."""

import math
from types import SimpleNamespace

import pytest

from kvlab.theory import (
    agreement,
    cache_sizes,
    decode_step,
    kv_traffic,
    long_context,
    matmul,
    memory_wall,
    prefill_attention,
    roofline,
    serving,
    shapes,
    specs,
    speculative,
    ssm,
    units,
    verdict,
    work,
)
from kvlab.theory import parallel as par

NAN, INF = math.nan, math.inf
L70 = shapes.SHAPES["llama-3-70b"]
H = "h200"

# name: (call, error, a regex the message must match: the argument's name)
BAD_CALLS = {
    "agreement.ratio_words NaN": (lambda: agreement.ratio_words(NAN), ValueError, "r must"),
    "agreement.compare NaN measured": (
        lambda: agreement.compare(NAN, 1.0, 0.1),
        ValueError,
        "measured",
    ),
    "agreement.edges negative spread": (lambda: agreement.edges(1.0, -0.1), ValueError, "spread"),
    "agreement.within_factor inf": (
        lambda: agreement.within_factor(INF, 1.0, 2.0),
        ValueError,
        "measured",
    ),
    "agreement.factor_edges bool": (
        lambda: agreement.factor_edges(True, 2.0),
        TypeError,
        "predicted",
    ),
    "cache_sizes.window_span zero window": (
        lambda: cache_sizes.window_span(0, 4),
        ValueError,
        "window",
    ),
    "decode_step.predicted_step_growth NaN bytes": (
        lambda: decode_step.predicted_step_growth(NAN, 10, 1e10),
        ValueError,
        "kv_bytes_per_token",
    ),
    "kv_traffic.compare_with_bytes NaN": (
        lambda: kv_traffic.compare_with_bytes(NAN, 1.0, 0.0),
        ValueError,
        "measured",
    ),
    "kv_traffic.cache_resident negative": (
        lambda: kv_traffic.cache_resident(-1.0, 1024),
        ValueError,
        "nbytes",
    ),
    "long_context.t95 zero df": (lambda: long_context.t95(0), ValueError, "df"),
    "matmul.matmul_flops float n": (lambda: matmul.matmul_flops(1.5, 4, 4), TypeError, "n must"),
    "matmul.matmul_bytes NaN size": (
        lambda: matmul.matmul_bytes(1, 4, 4, NAN),
        ValueError,
        "element_size",
    ),
    "matmul.matmul_intensity zero K": (
        lambda: matmul.matmul_intensity(1, 0, 4, 4),
        ValueError,
        "K must",
    ),
    "matmul.compare_with_roofline NaN seconds": (
        lambda: matmul.compare_with_roofline(NAN, 1, 64, 64, 4, 1e10, 1e10),
        ValueError,
        "seconds",
    ),
    "memory_wall.kv_bound_band NaN w_p": (
        lambda: memory_wall.kv_bound_band(L70, H, NAN),
        ValueError,
        "w_p",
    ),
    "memory_wall.kv_bound_regime_exists bogus hw": (
        lambda: memory_wall.kv_bound_regime_exists(L70, "bogus"),
        ValueError,
        "hw",
    ),
    "memory_wall.ridge_admitted negative context": (
        lambda: memory_wall.ridge_admitted(L70, H, -1),
        ValueError,
        "context",
    ),
    "memory_wall.map_regime bool batch": (
        lambda: memory_wall.map_regime(L70, H, 1024, True),
        TypeError,
        "batch",
    ),
    "memory_wall.recommend bad budget": (
        lambda: memory_wall.recommend(L70, H, 1024, 1, "bogus"),
        ValueError,
        "quality_budget",
    ),
    "parallel.ring_steps zero world": (
        lambda: par.ring_steps("all_reduce", 0),
        ValueError,
        "world",
    ),
    "parallel.vocabulary_bytes NaN": (lambda: par.vocabulary_bytes(L70, 1, NAN), ValueError, "w_p"),
    "parallel.embedding_saving negative batch": (
        lambda: par.embedding_saving(L70, -1),
        ValueError,
        "batch",
    ),
    "parallel.tied_embeddings text shape": (lambda: par.tied_embeddings("x"), TypeError, "shape"),
    "prefill_attention.visible_pairs negative": (
        lambda: prefill_attention.visible_pairs(-1, 4),
        ValueError,
        "query_len",
    ),
    "prefill_attention.tile_keys zero tile": (
        lambda: prefill_attention.tile_keys(4, 4, 0),
        ValueError,
        "tokens_per_tile",
    ),
    "roofline.retained_tokens negative": (
        lambda: roofline.retained_tokens(L70, -1),
        ValueError,
        "context",
    ),
    "roofline.kv_bytes_per_token NaN": (
        lambda: roofline.kv_bytes_per_token(L70, NAN),
        ValueError,
        "w_kv",
    ),
    "roofline.attention_flops_per_token text": (
        lambda: roofline.attention_flops_per_token("llama"),
        TypeError,
        "shape",
    ),
    "roofline.step_bytes bool batch": (
        lambda: roofline.step_bytes(L70, True, 1024),
        TypeError,
        "batch",
    ),
    "roofline.step_flops float context": (
        lambda: roofline.step_flops(L70, 1, 1.5),
        TypeError,
        "context",
    ),
    "roofline.step_time_floor bogus placement": (
        lambda: roofline.step_time_floor(L70, H, 1, 1024, placement="bogus"),
        ValueError,
        "placement",
    ),
    "roofline.admitted zero devices": (
        lambda: roofline.admitted(L70, H, 1, 1024, devices=0),
        ValueError,
        "devices",
    ),
    "roofline.decode_floor_table NaN params": (
        lambda: roofline.decode_floor_table(L70, H, [(1, 1024)], params=NAN),
        ValueError,
        "params",
    ),
    "roofline.arithmetic_intensity zero batch": (
        lambda: roofline.arithmetic_intensity(L70, 1024, 0),
        ValueError,
        "batch",
    ),
    "roofline.kv_intensity_floor inf": (
        lambda: roofline.kv_intensity_floor(L70, INF),
        ValueError,
        "w_kv",
    ),
    "roofline.batch_intensity_ceiling negative": (
        lambda: roofline.batch_intensity_ceiling(L70, -5),
        ValueError,
        "context",
    ),
    "roofline.fixed_point_batch bool": (
        lambda: roofline.fixed_point_batch(L70, True),
        TypeError,
        "w_p",
    ),
    "roofline.ridge_point bogus hw": (lambda: roofline.ridge_point("bogus"), ValueError, "hw"),
    "roofline.ridge_batch NaN": (lambda: roofline.ridge_batch(H, NAN), ValueError, "w_p"),
    "roofline.compute_bound_context zero batch": (
        lambda: roofline.compute_bound_context(L70, H, 0),
        ValueError,
        "batch",
    ),
    "roofline.crossover_context float batch": (
        lambda: roofline.crossover_context(L70, 1.5),
        TypeError,
        "batch",
    ),
    "roofline.capacity_context zero devices": (
        lambda: roofline.capacity_context(L70, H, devices=0),
        ValueError,
        "devices",
    ),
    "roofline.free_beside_weights NaN": (
        lambda: roofline.free_beside_weights(L70, H, NAN),
        ValueError,
        "w_p",
    ),
    "roofline.admitted_rate negative context": (
        lambda: roofline.admitted_rate(L70, H, -1),
        ValueError,
        "context",
    ),
    "roofline.kv_fraction zero batch": (
        lambda: roofline.kv_fraction(L70, 1024, 0),
        ValueError,
        "batch",
    ),
    "roofline.compression_speedup NaN": (
        lambda: roofline.compression_speedup(NAN, 1024, 100.0),
        ValueError,
        "c must",
    ),
    "roofline.effective_bandwidth bogus": (
        lambda: roofline.effective_bandwidth(H, "bogus"),
        ValueError,
        "placement",
    ),
    "roofline.rate_ceiling NaN": (
        lambda: roofline.rate_ceiling(L70, H, w_kv=NAN),
        ValueError,
        "w_kv",
    ),
    "roofline.sharing_factor zero requests": (
        lambda: roofline.sharing_factor(10, 10, 0),
        ValueError,
        "requests",
    ),
    "roofline.prefill_flops hit rate above 1": (
        lambda: roofline.prefill_flops(L70, 100, 1.5),
        ValueError,
        "hit_rate",
    ),
    "roofline.prefill_time zero mfu": (
        lambda: roofline.prefill_time(L70, H, 100, mfu=0.0),
        ValueError,
        "mfu",
    ),
    "roofline.transfer_time NaN": (lambda: roofline.transfer_time(NAN, 1e9), ValueError, "nbytes"),
    "serving.work_ratio text": (lambda: serving.work_ratio("padded", {}), TypeError, "padded"),
    "serving.flat_step_prediction empty": (
        lambda: serving.flat_step_prediction([]),
        ValueError,
        "points",
    ),
    "serving.roofline_throughput_spread NaN": (
        lambda: serving.roofline_throughput_spread(NAN, 2.0, 10.0, 0.1, 1e6, 1e9, 0.1, 1e10),
        ValueError,
        "predicted",
    ),
    "shapes.model_shape text": (lambda: shapes.model_shape("bogus"), TypeError, "shape"),
    "specs.accelerator bogus": (lambda: specs.accelerator("bogus"), ValueError, "hw"),
    "specs.as_link bogus": (lambda: specs.as_link("bogus"), ValueError, "link"),
    "specs.Accelerator negative bandwidth": (
        lambda: specs.Accelerator("x", 80e9, -1.0, 1e15, 1, 1e12, None, "src"),
        ValueError,
        "hbm_bytes_per_s",
    ),
    "specs.Link NaN rate": (lambda: specs.Link("x", NAN, "src"), ValueError, "bytes_per_s"),
    "speculative.expected_tokens alpha above 1": (
        lambda: speculative.expected_tokens(1.5, 4),
        ValueError,
        "alpha",
    ),
    "speculative.empty_fraction text": (
        lambda: speculative.empty_fraction("abc"),
        TypeError,
        "steps",
    ),
    "speculative.verify_time NaN": (lambda: speculative.verify_time(NAN, 4, 8.0), ValueError, "t1"),
    "speculative.speedup bool k": (
        lambda: speculative.speedup(0.5, True, 1.0, 1.0),
        TypeError,
        "k must",
    ),
    "speculative.request_speedup NaN": (
        lambda: speculative.request_speedup(NAN, 0.1, 0.01, 10),
        ValueError,
        "step_speedup",
    ),
    "speculative.best_k NaN alpha": (lambda: speculative.best_k(NAN, 8.0), ValueError, "alpha"),
    "ssm.scan_chunk_size bogus method": (
        lambda: ssm.scan_chunk_size("bogus", None),
        ValueError,
        "method",
    ),
    "ssm.usable_fit NaN": (lambda: ssm.usable_fit(NAN, 1e-9), ValueError, "round_s"),
    "ssm.fastest_order zero length": (
        lambda: ssm.fastest_order(0, 1e-6, 1e-9, 16),
        ValueError,
        "length",
    ),
    "ssm.parallel_break_even bool": (lambda: ssm.parallel_break_even(True), TypeError, "length"),
    "ssm.attention_step_slope NaN": (
        lambda: ssm.attention_step_slope(NAN, 1e10),
        ValueError,
        "kv_bytes_per_token",
    ),
    "ssm.cache_step_slope zero rate": (
        lambda: ssm.cache_step_slope(1024.0, 0.0, 1e10),
        ValueError,
        "read_bytes_per_s",
    ),
    "ssm.is_flat NaN": (lambda: ssm.is_flat(NAN, 1e-9), ValueError, "slope"),
    "ssm.recall_bound zero state": (lambda: ssm.recall_bound(0, 16), ValueError, "state_size"),
    "ssm.at_recall_bound NaN": (lambda: ssm.at_recall_bound(NAN, 4, 16), ValueError, "mean_error"),
    "ssm.sampling_tolerance zero samples": (
        lambda: ssm.sampling_tolerance(0, 4),
        ValueError,
        "samples",
    ),
    "ssm.sampled_agrees NaN": (lambda: ssm.sampled_agrees(NAN, 0.5, 100, 4), ValueError, "sampled"),
    "ssm.lookup_exact NaN": (lambda: ssm.lookup_exact(NAN), ValueError, "max_error"),
    "ssm.SSMShape zero state": (lambda: shapes.SSMShape("x", 2, 64, 0, 128), ValueError, "state"),
    "units.sig NaN digits": (lambda: units.sig(1.0, 0), ValueError, "digits"),
    "verdict.verdicts_within NaN": (
        lambda: verdict.verdicts_within(
            busy_fraction=NAN, bandwidth_fraction=0.5, flops_fraction=0.1, kv_share=0.2
        ),
        ValueError,
        "busy_fraction",
    ),
    "verdict.capacity_batch negative context": (
        lambda: verdict.capacity_batch(L70, H, -1),
        ValueError,
        "context",
    ),
    "verdict.useful_batch text target": (
        lambda: verdict.useful_batch([], "fast"),
        TypeError,
        "target",
    ),
    "verdict.bandwidth_batch NaN step": (
        lambda: verdict.bandwidth_batch(L70, 1024, NAN, 1e10),
        ValueError,
        "step_s",
    ),
    "verdict.flat_step_fraction zero batch": (
        lambda: verdict.flat_step_fraction(0, 0.01, 1e9, 1e6, 1e10),
        ValueError,
        "batch",
    ),
    "verdict.shared_weight_tpot NaN": (
        lambda: verdict.shared_weight_tpot(NAN, 2, 1e6, 1e10),
        ValueError,
        "tpot_1",
    ),
    "verdict.expected_static_idle negative": (
        lambda: verdict.expected_static_idle(-1.0, 10, 5),
        ValueError,
        "cached_idle_s",
    ),
    "verdict.Target NaN": (lambda: verdict.Target(NAN), ValueError, "tpot"),
    "work.check_method bogus": (lambda: work.check_method("bogus"), ValueError, "method"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_naming_its_argument(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_tables_leave_no_unused_import():
    assert SimpleNamespace  # the records' rows build their own arguments
