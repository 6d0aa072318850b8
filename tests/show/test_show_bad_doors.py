"""Every notebook: the figures, widgets and formatting helpers that no other table reached refuse a
bad argument at the door, naming it (issue 33)."""

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from kvlab.show import format as fmt  # noqa: E402
from kvlab.show import notebook, plots, readings, widgets  # noqa: E402
from kvlab.show.readings import capacity, devices, engine, speculative, verdicts  # noqa: E402
from kvlab.show.readings.exercises import folded  # noqa: E402

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
