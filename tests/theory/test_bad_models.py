"""The models the readings decide by refuse input outside their domain (issue 33): a NaN, an
infinity, a negative count, a bool where a number belongs, ``'no'`` where a flag belongs, lists that
do not pair up. Each returned a number or a verdict before; each now raises naming the argument."""

import math
from types import SimpleNamespace

import pytest

from kvlab.theory import (
    cache_sizes,
    decode_step,
    kernel_rounding,
    long_context,
    matmul,
    paging,
    peers,
    prefill_attention,
    prefix,
    serving,
    verdict,
    work,
)
from kvlab.theory import parallel as par
from kvlab.theory.shapes import SHAPES

NAN, INF = math.nan, math.inf
L70, L1B = SHAPES["llama-3-70b"], SHAPES["llama-3.2-1b"]
TRACE = [SimpleNamespace(prompt=[1] * 10, max_new_tokens=20)]  # 29 tokens at its longest
WORK = prefill_attention.prefill_attention_work([8], [8], 32, 8, 128, 2, 16)

# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "near_floor NaN step": (lambda: decode_step.near_floor(NAN, 1.0), ValueError, "step"),
    "near_floor negative floor": (lambda: decode_step.near_floor(1.0, -1.0), ValueError, "floor"),
    "near_floor band below 1": (lambda: decode_step.near_floor(1.0, 1.0, 0.5), ValueError, "band"),
    "stands_out inf change": (lambda: decode_step.stands_out(INF, 1.0, 0.1), ValueError, "change"),
    "stands_out bool step": (lambda: decode_step.stands_out(0.1, True, 0.1), TypeError, "step"),
    "stands_out negative spread": (
        lambda: decode_step.stands_out(0.1, 1.0, -0.1),
        ValueError,
        "spread",
    ),
    "predicted_step NaN t0": (
        lambda: decode_step.predicted_step(NAN, 10, 100, 1024, 1e10),
        ValueError,
        "t0",
    ),
    "step_slope negative bytes": (
        lambda: decode_step.step_slope(-1024, 1e10),
        ValueError,
        "kv_bytes_per_token",
    ),
    "step_slope float passes": (
        lambda: decode_step.step_slope(1024, 1e10, 2.5),
        TypeError,
        "passes",
    ),
    "step_spread one step": (lambda: decode_step.step_spread([1.0]), ValueError, "step_times"),
    "step_spread NaN step": (
        lambda: decode_step.step_spread([1.0, NAN, 2]),
        ValueError,
        "step_times",
    ),
    "fitted_growth two steps": (
        lambda: decode_step.fitted_growth([1.0, 2.0]),
        ValueError,
        "at least three",
    ),
    "fitted_growth zero step": (
        lambda: decode_step.fitted_growth([1.0, 0.0, 2.0]),
        ValueError,
        "step_times",
    ),
    "weight_read_floor negative": (
        lambda: decode_step.weight_read_floor(-1, 1e10),
        ValueError,
        "weight_bytes",
    ),
    "rounding_rms negative step": (lambda: cache_sizes.rounding_rms(-1.0), ValueError, "step"),
    "rounding_rms NaN": (lambda: cache_sizes.rounding_rms(NAN), ValueError, "step"),
    "rounding_explains NaN measured": (
        lambda: cache_sizes.rounding_explains(NAN, 0.1),
        ValueError,
        "measured_rms",
    ),
    "explained_by_rounding NaN": (
        lambda: kernel_rounding.explained_by_rounding(NAN, "float32"),
        ValueError,
        "difference",
    ),
    "target_met NaN": (lambda: peers.target_met(NAN, 1.0), ValueError, "value"),
    "target_met bool target": (lambda: peers.target_met(1.0, True), TypeError, "target"),
    "hit_rate_verdict NaN": (lambda: prefix.hit_rate_verdict(NAN, 0.5), ValueError, "hit"),
    "hit_rate_verdict baseline inf": (
        lambda: prefix.hit_rate_verdict(0.5, math.inf),
        ValueError,
        "baseline_hit",
    ),
    "hit_rate_verdict negative margin": (
        lambda: prefix.hit_rate_verdict(0.5, 0.4, -0.1),
        ValueError,
        "margin",
    ),
    "speedup_verdict tolerance below 1": (
        lambda: serving.speedup_verdict(2.0, 1.0, 3.0, 0.5),
        ValueError,
        "tolerance",
    ),
    "batch_bound NaN capacity": (lambda: serving.batch_bound(NAN, 8), ValueError, "capacity"),
    "batch_bound float max_batch": (lambda: serving.batch_bound(4.0, 8.5), TypeError, "max_batch"),
    "within_waste_bound NaN waste": (
        lambda: paging.within_waste_bound(NAN, 16, 100),
        ValueError,
        "waste",
    ),
    "within_waste_bound waste above 1": (
        lambda: paging.within_waste_bound(1.5, 16, 100),
        ValueError,
        "waste",
    ),
    "predicted_waste max_len below the longest": (
        lambda: paging.predicted_waste(TRACE, "reserve-max", 16, 10),
        ValueError,
        "max_len",
    ),
    "paging_saves max_len below the longest": (
        lambda: paging.paging_saves(TRACE, 16, 10),
        ValueError,
        "max_len",
    ),
    "sink_heads share NaN": (
        lambda: long_context.sink_heads([[0.5, NAN]], 0.1),
        ValueError,
        r"share\[0\]\[1\]",
    ),
    "outlier_count negative ratio": (
        lambda: long_context.outlier_count([1.0, -5.0]),
        ValueError,
        r"ratios\[1\]",
    ),
    "outlier_count text": (lambda: long_context.outlier_count("abc"), TypeError, "ratios"),
    "keys_have_outliers NaN": (
        lambda: long_context.keys_have_outliers([NAN], [1.0]),
        ValueError,
        "key_ratios",
    ),
    "same_up_to_rounding NaN": (lambda: long_context.same_up_to_rounding(NAN), ValueError, "gap"),
    "block_means inf": (lambda: long_context.block_means([1.0, INF], 1), ValueError, "values"),
    "fit_roofline lists of different lengths": (
        lambda: matmul.fit_roofline([1, 2, 4, 8], [1e9, 2e9]),
        ValueError,
        "intensities and rates must have the same length",
    ),
    "fit_roofline NaN rate": (
        lambda: matmul.fit_roofline([1, 2], [1e9, NAN]),
        ValueError,
        r"rates\[1\]",
    ),
    "link_table world 3": (
        lambda: par.link_table([L70, L1B], "h200", 1, 4096, 3),
        ValueError,
        "world must split",
    ),
    "link_table world 0": (
        lambda: par.link_table([L70, L1B], "h200", 1, 4096, 0),
        ValueError,
        "world must be an int",
    ),
    "tensor_parallel_step vocab_sharded 'no'": (
        lambda: par.tensor_parallel_step(L1B, "h200", 1, 1024, 2, "nvlink4", vocab_sharded="no"),
        TypeError,
        "vocab_sharded must be True or False",
    ),
    "attention_floor tiled 'no'": (
        lambda: prefill_attention.attention_floor(WORK, "h200", tiled="no"),
        TypeError,
        "tiled must be True or False",
    ),
    "pass_time negative a": (lambda: work.pass_time(10, -1.0, 0.1), ValueError, r"\ba must"),
    "pass_time negative b": (lambda: work.pass_time(10, 1.0, -0.1), ValueError, r"\bb must"),
    "pass_time negative tokens": (lambda: work.pass_time(-10, 1.0, 0.1), ValueError, "tokens"),
    "request_time negative cost": (
        lambda: work.request_time(4, 2, -1.0, 0.1),
        ValueError,
        r"\ba must",
    ),
    "compile_repaid float tokens": (
        lambda: work.compile_repaid(1.0, 0.01, 2.5),
        TypeError,
        "tokens",
    ),
    "compile_repaid NaN gain": (
        lambda: work.compile_repaid(1.0, NAN, 100),
        ValueError,
        "step_gain",
    ),
    "compare_loops NaN": (
        lambda: verdict.compare_loops(NAN, 100.0, 0.1),
        ValueError,
        "tokens_per_s",
    ),
    "compare_idle graphed 'no'": (
        lambda: verdict.compare_idle(0.1, 0.2, 10, 10, "no", 0.1),
        TypeError,
        "graphed",
    ),
    "compare_idle negative idle": (
        lambda: verdict.compare_idle(-0.1, 0.2, 10, 10, False, 0.1),
        ValueError,
        "static_idle_s",
    ),
    "compare_batch_tpot NaN": (
        lambda: verdict.compare_batch_tpot(NAN, 0.01, 0.1),
        ValueError,
        "tpot_b",
    ),
    "past_ridge negative intensity": (
        lambda: verdict.past_ridge(-1.0, 10.0),
        ValueError,
        "intensity",
    ),
    "exceeds_ceilings NaN": (
        lambda: verdict.exceeds_ceilings(NAN, 0.5),
        ValueError,
        "bandwidth_fraction",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_the_models_still_answer_inside_their_domain():
    assert decode_step.near_floor(1.2, 1.0) and not decode_step.near_floor(2.0, 1.0)
    assert matmul.fit_roofline([1, 2, 4, 8], [1e9, 2e9, 3e9, 3e9]).points == 4
    assert len(par.link_table([L70, L1B], "h200", 1, 4096, 2)) == 4
    assert paging.paging_saves(TRACE, 16, 29)
    assert prefix.hit_rate_verdict(-0.1, 0.2) == "less"  # differences of hit rates may be negative
    assert work.pass_time(10, 1.0, 0.1) == 2.0
