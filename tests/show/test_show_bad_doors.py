"""Every notebook: the figures, widgets and formatting helpers that no other table reached refuse a
bad argument at the door, naming it (issue 33)."""

import inspect
import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import kvlab.show.readings.cache_reuse as cache_reuse_r  # noqa: E402
import kvlab.show.readings.capacity as capacity_r  # noqa: E402
import kvlab.show.readings.devices as devices_r  # noqa: E402
import kvlab.show.readings.diagnosis as diagnosis_r  # noqa: E402
import kvlab.show.readings.engine as engine_r  # noqa: E402
import kvlab.show.readings.exercises.engine as exercises_engine_r  # noqa: E402
import kvlab.show.readings.exercises.kv_layout as exercises_kv_layout_r  # noqa: E402
import kvlab.show.readings.exercises.long_context as exercises_long_context_r  # noqa: E402
import kvlab.show.readings.exercises.memory_wall as exercises_memory_wall_r  # noqa: E402
import kvlab.show.readings.exercises.paged_attention as exercises_paged_attention_r  # noqa: E402
import kvlab.show.readings.exercises.prefix_caching as exercises_prefix_caching_r  # noqa: E402
import kvlab.show.readings.exercises.ssm_state as exercises_ssm_state_r  # noqa: E402
import kvlab.show.readings.gemv as gemv_r  # noqa: E402
import kvlab.show.readings.kv_layout as kv_layout_r  # noqa: E402
import kvlab.show.readings.long_context as long_context_r  # noqa: E402
import kvlab.show.readings.paged_attention as paged_attention_r  # noqa: E402
import kvlab.show.readings.paged_kernel as paged_kernel_r  # noqa: E402
import kvlab.show.readings.preemption as preemption_r  # noqa: E402
import kvlab.show.readings.prefix_caching as prefix_caching_r  # noqa: E402
import kvlab.show.readings.ssm_state as ssm_state_r  # noqa: E402
import kvlab.show.readings.trained_model as trained_model_r  # noqa: E402
from kvlab.show import format as fmt  # noqa: E402
from kvlab.show import notebook, plots, readings, widgets  # noqa: E402
from kvlab.show.readings import (  # noqa: E402
    capacity,
    devices,
    engine,
    long_context,
    preemption,
    speculative,
    verdicts,
)
from kvlab.show.readings.exercises import decode_loop as decode_loop_exercises  # noqa: E402
from kvlab.show.readings.exercises import diagnosis as diagnosis_exercises  # noqa: E402
from kvlab.show.readings.exercises import folded  # noqa: E402
from kvlab.show.readings.exercises import gemv as gemv_exercises  # noqa: E402
from kvlab.show.readings.exercises import long_context as long_context_exercises  # noqa: E402
from kvlab.show.readings.exercises import memory_wall as memory_wall_exercises  # noqa: E402
from kvlab.show.readings.exercises import paged_kernel as paged_kernel_exercises  # noqa: E402
from kvlab.show.readings.exercises import prefix_caching as prefix_caching_exercises  # noqa: E402
from kvlab.show.readings.exercises import speculative as speculative_exercises  # noqa: E402
from kvlab.show.readings.exercises import ssm_state as ssm_state_exercises  # noqa: E402
from kvlab.theory.long_context import Spread  # noqa: E402
from kvlab.theory.roofline import decode_floor_table as floor_table  # noqa: E402
from kvlab.theory.shapes import SHAPES  # noqa: E402

NAN = math.nan

# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "format.sci NaN": (lambda: fmt.sci(NAN), ValueError, "x must"),
    "notebook.table int caption": (
        lambda: notebook.table(["a"], [[1]], caption=3),
        TypeError,
        "caption",
    ),
    "plots.stamp_corner text figure": (lambda: plots.stamp_corner("fig"), TypeError, "fig must"),
    "plots.new_figure NaN width": (lambda: plots.new_figure(width=NAN), ValueError, "width"),
    "plots.measured_vs_predicted unpaired": (
        lambda: plots.measured_vs_predicted(
            None, [1, 2], [1.0], [1.0, 2.0], xlabel="x", ylabel="y"
        ),
        ValueError,
        "x, measured and predicted must have the same length",
    ),
    "plots.roofline_axes NaN peak": (
        lambda: plots.roofline_axes(None, NAN, 1e9),
        ValueError,
        "peak_flops",
    ),
    "plots.timeline text spans": (lambda: plots.timeline(None, "abc", 0.0), TypeError, "spans"),
    "plots.timeline NaN row": (lambda: plots.timeline(None, [], NAN), ValueError, "y must"),
    "plots.step_timelines text": (lambda: plots.step_timelines("p"), TypeError, "panels"),
    "plots.useful_batch_figure NaN target": (
        lambda: plots.useful_batch_figure([], NAN, 4, None, "t"),
        ValueError,
        "tpot_target_s",
    ),
    "plots.workload_bytes text": (lambda: plots.workload_bytes("d"), TypeError, "diagnoses"),
    "widgets.Explorer text measure": (
        lambda: widgets.Explorer("m", {"a": [1]}, lambda *a: None),
        TypeError,
        "measure",
    ),
    "readings.ratio_text NaN": (lambda: readings.ratio_text(NAN, 1.0), ValueError, "measured"),
    "readings.within bool factor": (lambda: readings.within(1.0, 1.0, True), TypeError, "factor"),
    "engine.number bool": (lambda: engine.number(True), TypeError, "n must"),
    "engine.times negative": (lambda: engine.times(-2), ValueError, "n must"),
    "engine.plural float": (lambda: engine.plural(1.5, "step"), TypeError, "n must"),
    "devices.binary_bytes NaN": (lambda: devices.binary_bytes(NAN), ValueError, "n must"),
    "verdicts.method_note zero": (lambda: verdicts.method_note(0), ValueError, "repeats"),
    "verdicts.verdict_words text": (lambda: verdicts.verdict_words("agrees"), TypeError, "c must"),
    "speculative.spread high below low": (lambda: speculative.spread(2.0, 1.0), ValueError, "high"),
    "speculative.decide NaN": (
        lambda: speculative.decide(NAN, 1.0, 1.1, 1.0),
        ValueError,
        "measured",
    ),
    "folded.count NaN": (lambda: folded.count(NAN), ValueError, "n must"),
    "capacity.w4_links NaN": (lambda: capacity.w4_links(NAN), ValueError, "cache_bytes"),
    "capacity.seed_nvlink_seconds negative": (
        lambda: capacity.seed_nvlink_seconds(-1.0),
        ValueError,
        "cache_bytes",
    ),
    "widgets.markdown_html int": (lambda: widgets.markdown_html(3), TypeError, "text must"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_naming_its_argument(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# readings of model numbers (not measurements): each number a model computed, refused at the door
# when it is NaN or a bool rather than printed
BAD_MODEL_NUMBERS = {
    capacity.h200_margin_reading: "context_cap_seed",
    capacity.engine_fraction_reading: "weight_bytes device_bytes fraction",
    capacity.kivi_residual_reading: "element_bytes held",
    capacity.nvlink_reading: "cache_bytes codec recompute_seconds",
    capacity.placement_reading: "gain_b200 gain_mi300x",
    capacity.rule3_reading: "speedup_c4",
    capacity.margins_table: "w_p",
    devices.exercise_heads: "kv_per_token",
    devices.exercise_latency: "saved_s bytes_s latency_s",
    devices.exercise_handoff: "nbytes prefill_s",
    engine.curve_predictions: "weight_bytes sequence_flops",
    engine.curve_reading: "capacity weight_bytes sequence_flops",
    diagnosis_exercises.diagnosis_naive_ridge: "ridge closed_form intensity",
    gemv_exercises.gemv_big_product: "read_bytes_per_s matmul_flops",
    gemv_exercises.gemv_h200_batch: "step rate step32 rate32",
    gemv_exercises.gemv_attention_ridge: "ridge",
    memory_wall_exercises.wall_fixed_point: "b_dagger kv_floor",
    memory_wall_exercises.wall_288: "ratio s_star8 s_needed s_cap_bf16 s_cap_2bit speedup",
    speculative_exercises.speculative_best_k_gpu: "alpha ridge_batch",
    ssm_state_exercises.ssm_breakeven: "state_bytes kv_bytes tokens",
    long_context.sink_reading: "uniform",
    preemption.crossover_table: "w_kv",
    preemption.decides_reading: "params kv_bytes_per_token flops link_bytes_per_s block_efficiency",
}
NUMBER_CASES = [(r, a.split(), one) for r, a in BAD_MODEL_NUMBERS.items() for one in a.split()]


@pytest.mark.parametrize(
    "reading, numbers, bad", NUMBER_CASES, ids=[f"{r.__name__}({b})" for r, _, b in NUMBER_CASES]
)
@pytest.mark.parametrize("value, error", [(NAN, ValueError), (True, TypeError)])
def test_a_reading_refuses_a_model_number_that_is_no_number(reading, numbers, bad, value, error):
    kwargs = {name: object() for name in inspect.signature(reading).parameters}
    kwargs.update(dict.fromkeys(numbers, 1.0), **{bad: value})
    with pytest.raises(error, match=f"{bad} must"):
        reading(**kwargs)


# readings whose flags, names and tables are declared at the door: (the typed arguments, by type)
BAD_KINDS = {
    cache_reuse_r.ttft_reading: {"ttft": "dict"},
    capacity_r.seed_corrections_reading: {"fixed_points": "dict"},
    devices_r.tensor_parallel_reading: {"version": "str", "vocab_sharded": "bool"},
    devices_r.handoff_tables_reading: {"prefill_table": "list", "decode_table": "list"},
    devices_r.collective_reading: {"kind": "str"},
    devices_r.recorded_reading: {"rows_by_device": "dict"},
    diagnosis_r.reading_timeline: {"gpu": "bool"},
    diagnosis_r.reading_workloads: {"diagnoses": "dict"},
    diagnosis_r.reading_real_model: {"random_name": "str", "real_name": "str"},
    engine_r.life_reading: {"counts": "dict"},
    engine_r.comparison_reading: {"on_gpu": "bool"},
    engine_r.burst_reading: {"same_tokens": "bool"},
    exercises_engine_r.engine_swap: {"recompute": "dict", "swap": "dict"},
    exercises_kv_layout_r.kv_layout_block1: {"runs_1": "dict", "runs_16": "dict"},
    exercises_long_context_r.long_context_outliers: {"flat": "dict", "aligned": "dict"},
    exercises_memory_wall_r.wall_joint: {"s1": "dict", "s32": "dict"},
    exercises_paged_attention_r.paged_fork_append: {"before": "dict", "after": "dict"},
    exercises_paged_attention_r.paged_swap_steps: {"steps": "dict", "preemptions": "dict"},
    exercises_prefix_caching_r.prefix_system_prompts: {"hit": "dict"},
    exercises_ssm_state_r.ssm_hybrid_fraction: {"fractions": "dict"},
    gemv_r.gpu_batching_reading: {"name": "str"},
    kv_layout_r.explore_reading: {"layout": "str", "appends": "dict"},
    long_context_r.spread_text: {"pieces": "str"},
    long_context_r.model_reading: {"name": "str", "dtype": "str"},
    long_context_r.needle_reading: {"probes": "list", "answer": "str"},
    long_context_r.fewer_reading: {"rows": "list", "gqa": "str", "latent": "str"},
    paged_attention_r.event_reading: {"snapshot": "dict"},
    paged_attention_r.waste_reading: {"runs": "dict", "predicted": "dict", "distribution": "str"},
    paged_kernel_r.source_block: {"source": "str"},
    paged_kernel_r.programs_reading: {"where": "str"},
    paged_kernel_r.fp64_reading: {"errors": "dict"},
    paged_kernel_r.split_reading: {"result": "dict"},
    paged_kernel_r.graph_splits_reading: {"where": "str"},
    paged_kernel_r.padding_reading: {"rows": "dict"},
    paged_kernel_r.recorded_reading: {"runs": "list", "folder": "str"},
    gemv_r.latency_throughput_reading: {"rows": "list"},
    preemption_r.host_copy_reading: {"copies": "list"},
    prefix_caching_r.prefill_cost_reading: {"hw_name": "str", "what": "str"},
    trained_model_r.model_reading: {"m": "dict"},
    ssm_state_r.memory_reading: {"measured": "dict", "predicted": "dict"},
    trained_model_r.contrast_reading: {"small": "dict", "kjv": "dict", "kjv_sinks": "list"},
}
VALID = {"bool": True, "dict": {}, "str": "", "list": []}
KIND_CASES = [(r, typed, one) for r, typed in BAD_KINDS.items() for one in typed]


@pytest.mark.parametrize(
    "reading, typed, bad", KIND_CASES, ids=[f"{r.__name__}({b})" for r, _, b in KIND_CASES]
)
def test_a_reading_refuses_an_argument_of_the_wrong_kind(reading, typed, bad):
    kwargs = {name: object() for name in inspect.signature(reading).parameters}
    kwargs.update({name: VALID[kind] for name, kind in typed.items()}, **{bad: 1.5})
    with pytest.raises(TypeError, match=f"{bad} must"):
        reading(**kwargs)


# readings and solutions of counts: each count declared at the door (an int >= 0)
BAD_COUNTS = {
    capacity.largest_batch_reading: "context",
    engine.chunk_reading: "small large",
    paged_kernel_exercises.paged_kernel_rows: "q_heads kv_heads rows",
    prefix_caching_exercises.prefix_whole_blocks: "prompt block served",
    long_context_exercises.long_context_onset: "sinks budget onset_sinks onset_window tokens",
    decode_loop_exercises.decode_loop_window: "P G W naive_pairs cached_pairs dense_naive dense_cached",
    long_context_exercises.long_context_sinks: "heads sink_heads kjv_heads budget",
    paged_kernel_exercises.paged_kernel_splits: "tile_tokens min_tiles programs_per_sm",
    paged_kernel_exercises.paged_kernel_empty_split: "rows nan_rows empty_splits",
    paged_attention_r.preemption_reading: "demo_preemptions",
    preemption_r.cached_recompute_reading: "num_requests num_blocks",
    prefix_caching_r.identity_reading: "block_size",
}
COUNT_CASES = [(r, a.split(), one) for r, a in BAD_COUNTS.items() for one in a.split()]


@pytest.mark.parametrize(
    "reading, counts, bad", COUNT_CASES, ids=[f"{r.__name__}({b})" for r, _, b in COUNT_CASES]
)
@pytest.mark.parametrize("value, error", [(-1, ValueError), (True, TypeError), (2.5, TypeError)])
def test_a_reading_refuses_a_count_that_is_no_count(reading, counts, bad, value, error):
    kwargs = {name: object() for name in inspect.signature(reading).parameters}
    kwargs.update(dict.fromkeys(counts, 1), **{bad: value})
    with pytest.raises(error, match=f"{bad} must be an int"):
        reading(**kwargs)


class Anything:
    """A stand-in for any record: it has every field, so a reading's door lets it by and the
    argument under test is the one refused."""

    def __getattr__(self, name):
        return self


ANY = Anything()
SPREAD = Spread(0.5, 0.1, 6, 0.1, 0.9)
UNADMITTED = floor_table(SHAPES["llama-3-70b"], "t4", [(1, 8192), (32, 2048), (32, 8192)])

# readings handed something that is not the record, list or row they read: (call, error, a regex
# the message must match, naming the argument)
BAD_READING_CALLS = {
    "peers_reading float": (
        lambda: cache_reuse_r.peers_reading(1.5),
        TypeError,
        "result must be a kvlab.lab.decode_peers.PeerComparison",
    ),
    "verdict_label text": (
        lambda: diagnosis_r.verdict_label("weights"),
        TypeError,
        "d must be a kvlab.lab.diagnose.Diagnosis",
    ),
    "reading_diagnosis None": (lambda: diagnosis_r.reading_diagnosis(None), TypeError, "d must"),
    "kv_layout_batch float append": (
        lambda: exercises_kv_layout_r.kv_layout_batch(ANY, ANY, ANY, 1.5, None),
        TypeError,
        "hi_append must be a kvlab.lab.layout_timing.AppendMeasurement",
    ),
    "kv_layout_batch float llc": (
        lambda: exercises_kv_layout_r.kv_layout_batch(ANY, ANY, ANY, ANY, 2.5),
        TypeError,
        "llc must be an int",
    ),
    "kv_layout_batch negative llc": (
        lambda: exercises_kv_layout_r.kv_layout_batch(ANY, ANY, ANY, ANY, -1),
        ValueError,
        "llc must be an int",
    ),
    "kv_layout_cat dict": (
        lambda: exercises_kv_layout_r.kv_layout_cat(ANY, {}),
        TypeError,
        "cat must be a kvlab.lab.layout_timing.AppendMeasurement",
    ),
    "long_context_sinks float spread": (
        lambda: exercises_long_context_r.long_context_sinks(3, 270, 0.5, 0, SPREAD, 64),
        TypeError,
        "one_vs_four must be a Spread",
    ),
    "long_context_sinks more sink heads than heads": (
        lambda: exercises_long_context_r.long_context_sinks(300, 270, SPREAD, 0, SPREAD, 64),
        ValueError,
        r"sink_heads must be an int in \[0, 271\)",
    ),
    "paged_kernel_splits dict grid": (
        lambda: paged_kernel_exercises.paged_kernel_splits({}, 64, 4, 2),
        TypeError,
        "grid must be a kvlab.lab.paged_kernel.SplitGrid",
    ),
    "paged_kernel_rows zero KV heads": (
        lambda: paged_kernel_exercises.paged_kernel_rows(8, 0, 16),
        ValueError,
        "kv_heads must be an int >= 1",
    ),
    "paged_kernel_empty_split more NaN rows than rows": (
        lambda: paged_kernel_exercises.paged_kernel_empty_split(0.0, 0.0, 5, 4, 0.0, 2),
        ValueError,
        r"nan_rows must be an int in \[0, 5\)",
    ),
    "paged_kernel_empty_split None difference": (
        lambda: paged_kernel_exercises.paged_kernel_empty_split(None, 0.0, 4, 4, 0.0, 2),
        TypeError,
        "masked_difference must",
    ),
    "paged_kernel_empty_split negative difference": (
        lambda: paged_kernel_exercises.paged_kernel_empty_split(0.0, -1.0, 4, 4, 0.0, 2),
        ValueError,
        "lse_difference must",
    ),
    "paged_kernel_empty_split bool largest": (
        lambda: paged_kernel_exercises.paged_kernel_empty_split(0.0, 0.0, 4, 4, False, 2),
        TypeError,
        "stage_one_largest must",
    ),
    "latency_throughput_reading no rows": (
        lambda: gemv_r.latency_throughput_reading([]),
        ValueError,
        "rows must begin with three admitted rows",
    ),
    "latency_throughput_reading a row not admitted": (
        lambda: gemv_r.latency_throughput_reading(UNADMITTED),
        ValueError,
        r"rows must begin with three admitted rows .*, got step times \[None, None, None\]",
    ),
    "append_reading int slot": (
        lambda: kv_layout_r.append_reading(ANY, ANY, 3, ANY),
        TypeError,
        "slot must be a kvlab.lab.layout_timing.AppendMeasurement",
    ),
    "gqa_reading text": (
        lambda: kv_layout_r.gqa_reading(ANY, "small", None),
        TypeError,
        "small must be a kvlab.lab.layout_timing.ReadMeasurement",
    ),
    "gqa_reading float llc": (
        lambda: kv_layout_r.gqa_reading(ANY, ANY, 1.5),
        TypeError,
        "llc must be an int",
    ),
    "channel_reading empty": (
        lambda: long_context_r.channel_reading([], [1.0], [1.0], [1.0]),
        ValueError,
        "key_ratio_by_layer must hold at least one number",
    ),
    "channel_reading bool": (
        lambda: long_context_r.channel_reading([1.0], [True], [1.0], [1.0]),
        TypeError,
        r"value_ratio_by_layer\[0\] must",
    ),
    "channel_reading NaN": (
        lambda: long_context_r.channel_reading([1.0], [1.0], [1.0, NAN], [1.0]),
        ValueError,
        r"key_ratios\[1\] must",
    ),
    "channel_reading text": (
        lambda: long_context_r.channel_reading([1.0], [1.0], [1.0], "ab"),
        TypeError,
        "value_ratios must be a list",
    ),
    "preemption_reading float": (
        lambda: paged_attention_r.preemption_reading(1.0, 3),
        TypeError,
        "cost must be a kvlab.lab.preemption.PreemptionCost",
    ),
    "padding_reading empty": (
        lambda: paged_kernel_r.padding_reading({}),
        ValueError,
        "rows' group sizes must hold at least one",
    ),
    "padding_reading fewer rows than the group": (
        lambda: paged_kernel_r.padding_reading({32: 16}),
        ValueError,
        r"rows\[32\] must be an int >= 32",
    ),
    "padding_reading negative group": (
        lambda: paged_kernel_r.padding_reading({-4: 16}),
        ValueError,
        "rows' group sizes",
    ),
    "recorded_reading None": (
        lambda: paged_kernel_r.recorded_reading(None, "book/data/measurements/"),
        TypeError,
        "runs must be a list",
    ),
    "recorded_reading float run": (
        lambda: paged_kernel_r.recorded_reading([1.5], "book/data/measurements/"),
        TypeError,
        r"runs\[0\] must be a kvlab.lab.paged_kernel.RecordedRun",
    ),
    "crossover_reading unknown shape": (
        lambda: preemption_r.crossover_reading(["bogus"]),
        ValueError,
        r"shapes\[0\] must be one of",
    ),
    "crossover_reading no device": (
        lambda: preemption_r.crossover_reading(None, []),
        ValueError,
        "devices must name at least one",
    ),
    "crossover_reading text": (
        lambda: preemption_r.crossover_reading("llama-3-8b"),
        TypeError,
        "shapes must be a list",
    ),
    "crossover_table unknown device": (
        lambda: preemption_r.crossover_table(None, ["bogus"]),
        ValueError,
        r"devices\[0\] must be one of",
    ),
    "cached_recompute_reading float": (
        lambda: preemption_r.cached_recompute_reading(1.0, 3, 8),
        TypeError,
        "r must be a kvlab.lab.preemption.CachedRecompute",
    ),
    "identity_reading no rows": (
        lambda: prefix_caching_r.identity_reading([], 16),
        ValueError,
        "rows must hold at least one variant",
    ),
    "identity_reading short row": (
        lambda: prefix_caching_r.identity_reading([("a", 40)], 16),
        ValueError,
        r"rows\[0\] must be \(name, tokens, first, served\)",
    ),
    "identity_reading more served than tokens": (
        lambda: prefix_caching_r.identity_reading([("a", 40, 20, 48)], 16),
        ValueError,
        r"rows\[0\]'s served tokens must be an int in \[0, 41\)",
    ),
    "identity_reading text": (
        lambda: prefix_caching_r.identity_reading("abc", 16),
        TypeError,
        "rows must be a list",
    ),
}


@pytest.mark.parametrize("name", BAD_READING_CALLS)
def test_a_reading_refuses_what_it_cannot_read_naming_the_argument(name):
    call, error, message = BAD_READING_CALLS[name]
    with pytest.raises(error, match=message):
        call()
