"""Every notebook: the figures, widgets and formatting helpers that no other table reached refuse a
bad argument at the door, naming it (issue 33)."""

import inspect
import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

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
from kvlab.show.readings.exercises import diagnosis as diagnosis_exercises  # noqa: E402
from kvlab.show.readings.exercises import folded  # noqa: E402
from kvlab.show.readings.exercises import gemv as gemv_exercises  # noqa: E402
from kvlab.show.readings.exercises import memory_wall as memory_wall_exercises  # noqa: E402
from kvlab.show.readings.exercises import speculative as speculative_exercises  # noqa: E402
from kvlab.show.readings.exercises import ssm_state as ssm_state_exercises  # noqa: E402

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
    gemv_exercises.gemv_big_product: "gemv_bytes_per_s matmul_flops",
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
