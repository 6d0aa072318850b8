"""Every notebook: a reading handed a measurement that was not taken (None, NaN, an infinity: a run
that failed, was skipped or was refused) says what was not measured, in one sentence, instead of a
verdict (issue 33). The check is the reading's first line, so the other arguments never matter."""

import inspect
import math
from types import SimpleNamespace

import pytest

from kvlab.show.readings import (
    cache_reuse,
    decode_loop,
    devices,
    diagnosis,
    gemv,
    kv_layout,
    long_context,
    paged_attention,
    prefix_caching,
    speculative,
    ssm_state,
)
from kvlab.show.readings.exercises import cache_reuse as cache_reuse_exercises
from kvlab.show.readings.exercises import decode_loop as decode_loop_exercises
from kvlab.show.readings.exercises import diagnosis as diagnosis_exercises
from kvlab.show.readings.exercises import engine as engine_exercises
from kvlab.show.readings.exercises import kv_layout as kv_layout_exercises
from kvlab.show.readings.exercises import long_context as long_context_exercises
from kvlab.show.readings.exercises import paged_attention as paged_attention_exercises
from kvlab.show.readings.exercises import prefix_caching as prefix_caching_exercises
from kvlab.show.readings.exercises import speculative as speculative_exercises
from kvlab.show.readings.exercises import ssm_state as ssm_state_exercises
from kvlab.theory.long_context import Spread
from kvlab.theory.peers import GENERATE, GENERATE_COMPILED

# reading: the measurements it is handed, each of which may come back unmeasured
BAD_MEASUREMENTS = {
    cache_reuse.speedup_reading: "naive_s cached_s worst_error naive_growth cached_growth",
    cache_reuse.latency_reading: "ttft_cached tpot_naive tpot_cached tpot_static spread",
    cache_reuse.compile_reading: "compile_cost t_eager t_comp spread",
    cache_reuse.explore_reading: "time_ratio work_ratio",
    cache_reuse.gpu_break_even_reading: "compile_cost measured_gain",
    decode_loop.history_reading: "read_bytes_per_s copy_bytes_per_s",
    decode_loop.intercept_reading: "floor_s t0",
    devices.link_reading: "bytes_per_s latency_s",
    devices.step_reading: "one_process_s split_s all_reduce_s",
    devices.crossing_reading: "latency_s",
    diagnosis.reading_methods: "generate_tokens_per_s best_tokens_per_s",
    diagnosis.reading_batch: "bandwidth",
    gemv.step_profile_reading: "step_s step_spread weight_read_s matmul_fraction",
    gemv.explore_reading: "measured_s floor_s floor_copy_s spread",
    gemv.floor_ratio_reading: "r_lo r_hi spread_hi",
    gemv.skinny_reading: "gemv_bytes_per_s read_bytes_per_s matmul_one_flops",
    kv_layout.layout_table: "copy_bw",
    long_context.check_reading: "gap",
    long_context.kivi_layout_reading: "full_ppl",
    long_context.fp8_reading: "full_ppl fp8_ppl int4_ppl",
    long_context.rerotation_reading: "rms_error tv_current tv_own",
    long_context.quant_reading: "pc_rms pt_rms pc_scores pt_scores v_err",
    long_context.kivi_reading: "kl_after agree",
    paged_attention.attention_reading: "copy_bytes_per_s",
    paged_attention.gather_reading: "copy_bytes_per_s",
    prefix_caching.chat_reading: "hit_rate cold_s cached_s hf_cold_s hf_reused_s reuse_spread",
    prefix_caching.ttft_reading: "cold_s warm_s",
    prefix_caching.trace_reading: "lru_hit leaf_hit lfu_hit lru_ttft leaf_ttft lfu_ttft none_ttft",
    prefix_caching.decode_reading: "computed_s cached_s",
    prefix_caching.memory_reading: "hit_rate",
    speculative.acceptance_reading: "alpha empty",
    speculative.speedup_reading: "measured low high",
    speculative.early_exit_reading: "alpha",
    ssm_state.scan_reading: "tau gamma",
    ssm_state.step_reading: "slope_llama slope_mamba read_bytes_per_s copy_bytes_per_s slope_spread",
    ssm_state.recall_reading: "mean_exact mean_sampled first last attention_max",
    # worked solutions of exercises: the sentence inside the folded solution
    cache_reuse_exercises.cache_reuse_doubling: "measured_g measured_2g",
    cache_reuse_exercises.cache_reuse_warm: "steady",
    decode_loop_exercises.decode_loop_gqa: "slope_measured",
    decode_loop_exercises.decode_loop_static: (
        "static_first static_last cached_first cached_last cached_growth"
    ),
    diagnosis_exercises.diagnosis_batch: "step_1 fraction_1",
    diagnosis_exercises.diagnosis_gqa: "measured_share",
    engine_exercises.engine_half_pool: "mean_batch",
    long_context_exercises.long_context_kivi_bytes: "measured",
    long_context_exercises.long_context_conventions: "gap_no_sinks gap_sinks",
    paged_attention_exercises.paged_block_size: "simulated_16",
    prefix_caching_exercises.prefix_ninety: "measured cold",
    speculative_exercises.speculative_best_k_here: "alpha empty",
    ssm_state_exercises.ssm_narrow_scan: "tau gamma",
    ssm_state_exercises.ssm_full_rank: "error_full error_equal",
}
CASES = [
    (reading, measured, missing)
    for reading, names in BAD_MEASUREMENTS.items()
    for measured in [names.split()]
    for missing in measured
]


@pytest.mark.parametrize(
    "reading, measured, missing",
    CASES,
    ids=[f"{r.__module__.rsplit('.', 1)[1]}.{r.__name__}({m})" for r, _, m in CASES],
)
@pytest.mark.parametrize("value", [math.nan, None, math.inf])
def test_a_reading_handed_no_measurement_names_it_instead_of_a_verdict(
    reading, measured, missing, value
):
    kwargs = {name: object() for name in inspect.signature(reading).parameters}
    kwargs.update({name: 1.0 for name in measured}, **{missing: value})
    text = reading(**kwargs)
    said = f"Not measured: {missing} (got {value!r})."
    folded = reading.__module__.startswith("kvlab.show.readings.exercises.")
    assert (said in text and "<details>" in text) if folded else text.startswith(said), text
    assert "no verdict" in text


# readings handed a dict of measurements: (call with one entry unmeasured, the sentence's start)
BAD_MEASURED_DICTS = {
    "handoff_reading": (
        lambda: devices.handoff_reading(100, 100.0, 120, [1e-3, math.nan], 1e-3, 8, 16, 1e-6, 1e-5),
        "Not measured: sends[1] (got nan).",
    ),
    "stream_reading": (
        lambda: long_context.stream_reading(4, 64, 512, {"full": 9.0, "window": math.nan}, {}, 8),
        "Not measured: ppl['window'] (got nan).",
    ),
    "sink_count_reading": (
        lambda: long_context.sink_count_reading(64, {1: 9.0, 4: None}, None, None, 512, 512, 4),
        "Not measured: ppl_by_sinks[4] (got None).",
    ),
    "kivi_residual_quality_reading": (
        lambda: long_context.kivi_residual_quality_reading(
            2, 32, 128, {"ppl": math.inf, "nbytes": 1}, {"ppl": 9.0, "nbytes": 1}
        ),
        "Not measured: with_residual (got inf).",
    ),
}


@pytest.mark.parametrize("name", BAD_MEASURED_DICTS)
def test_a_reading_handed_a_dict_with_a_missing_measurement_names_the_entry(name):
    call, said = BAD_MEASURED_DICTS[name]
    assert call().startswith(said)


def fake(fields, **given):
    """A record with ``fields`` (1 each, ``given`` apart): what a reading's door lets by."""
    return SimpleNamespace(**{**dict.fromkeys(fields, 1), **given})


def timed(fields, seconds):
    return fake(fields, timing=SimpleNamespace(min=seconds))


def read(seconds):
    return timed(kv_layout.READ[1:], seconds)


def append(seconds):
    return timed(kv_layout.APPEND[1:], seconds)


def timing(median):
    return SimpleNamespace(median=median, min=median, max=median)


PEERS = ("where", "device", "seconds", "speedup")
RUN = {GENERATE: (1.0,), GENERATE_COMPILED: (1.0,), "cached": (1.0,)}
DIAGNOSIS = ("method", "context", "batch", "threads", "verdicts", "lever", "flops_fraction")
TRACE = SimpleNamespace(step_s=0.01, busy_fraction=0.9)
SPREAD = Spread(0.5, 0.1, 6, 0.1, 0.9)

# readings handed a record whose measurement is missing: (call, the sentence that names it)
BAD_MEASURED_RECORDS = {
    "peers_reading without a contender": (
        lambda: cache_reuse.peers_reading(fake(PEERS, seconds=RUN)),
        "Not measured: result.seconds['static, compiled'] (got None).",
    ),
    "peers_reading NaN round": (
        lambda: cache_reuse.peers_reading(
            fake(PEERS, seconds={**RUN, "static, compiled": (1.0, math.nan)})
        ),
        "Not measured: result.seconds['static, compiled'] (got nan).",
    ),
    "reading_diagnosis": (
        lambda: diagnosis.reading_diagnosis(
            fake(DIAGNOSIS, trace=TRACE, bandwidth_fraction=math.nan)
        ),
        "Not measured: d.bandwidth_fraction (got nan).",
    ),
    "append_reading": (
        lambda: kv_layout.append_reading(read(1.0), append(1.0), append(math.inf), append(1.0)),
        "Not measured: slot.timing.min (got inf).",
    ),
    "gqa_reading": (
        lambda: kv_layout.gqa_reading(read(1.0), read(None), None),
        "Not measured: small.timing.min (got None).",
    ),
    "kv_layout_batch": (
        lambda: kv_layout_exercises.kv_layout_batch(
            read(math.nan), read(1.0), append(1.0), append(1.0), None
        ),
        "Not measured: lo_read.timing.min (got nan).",
    ),
    "kv_layout_cat": (
        lambda: kv_layout_exercises.kv_layout_cat(read(1.0), append(None)),
        "Not measured: cat.timing.min (got None).",
    ),
    "long_context_sinks": (
        lambda: long_context_exercises.long_context_sinks(
            3, 270, SPREAD, 0, Spread(math.nan, 0.1, 6, 0.1, 0.9), 64
        ),
        "Not measured: kjv_rescue (got nan).",
    ),
    "preemption_reading": (
        lambda: paged_attention.preemption_reading(
            fake(
                ("tokens", "bytes_each_way"),
                recompute=timing(1.0),
                swap_out=timing(1.0),
                swap_in=timing(math.nan),
            ),
            3,
        ),
        "Not measured: cost.swap_in.median (got nan).",
    ),
}


@pytest.mark.parametrize("name", BAD_MEASURED_RECORDS)
def test_a_reading_handed_a_record_with_a_missing_measurement_names_it(name):
    call, said = BAD_MEASURED_RECORDS[name]
    text = call()
    assert said in text and "no verdict" in text, text
