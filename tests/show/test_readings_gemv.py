"""kvlab.show.readings.gemv: every decision fed measurements built from its model on both sides of
each edge of ``kvlab.theory.agreement.edges`` and inside the cannot-tell band, so a wrong model or
inequality fails (CONTRIBUTING.md, readings).
"""

import re

import pytest

from kvlab import SHAPES
from kvlab.show.format import si
from kvlab.show.readings import gemv as gemv_readings
from kvlab.show.readings import verdicts
from kvlab.theory import roofline
from kvlab.theory.agreement import compare

SPREAD = 0.05


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_skinny_reading_on_every_side_of_the_roofline(five):
    predicted = 9e-3
    below, unsure_low, agrees, unsure_high, above = five(predicted)
    cs = [compare(t, predicted, SPREAD) for t in (agrees, above, unsure_high, below)]
    text = no_roles(
        gemv_readings.skinny_reading(
            [1, 2, 4, 8], cs, ["memory", "compute", "compute", "compute"], 10e9, 11e9, 10e9
        )
    )
    assert "91% of the read bandwidth" in text and "9 ms" in text and "agrees" in text
    assert "compute-bound by $n = 2$" in text and "never free" in text
    assert "disagrees at $n = 2$" in text and "the measurement above it" in text
    assert "below it" in text and "cannot be judged at $n = 4$" in text
    assert "neither streams" in text and "pessimistic" in text
    first_unsure = no_roles(
        gemv_readings.skinny_reading(
            [1], [compare(unsure_low, predicted, SPREAD)], ["memory"], 10e9, 11e9, 10e9
        )
    )
    assert "cannot tell: it is below" in first_unsure and "stays on its bytes term" in first_unsure
    late = gemv_readings.skinny_reading(
        [1, 64], [cs[0], cs[0]], ["memory", "compute"], 10e9, 11e9, 1e12
    )
    assert "flat up to $n = 64$" in late and "neither streams" not in late


def test_sweep_summary_lists_each_outcome_and_refuses_a_mismatch(five):
    p = 1.0
    below, unsure, agrees, _, above = five(p)
    cs = [compare(t, p, SPREAD) for t in (agrees, agrees, above, below, unsure)]
    text = verdicts.sweep_summary(["a", "b", "c", "d", "e"], cs, "the model")
    assert text.startswith("Over the sweep, the model agrees at a and b")
    assert "c (1.5 times), the measurement above it" in text
    assert "d (0.68 times), the measurement below it" in text and "cannot be judged at e" in text
    with pytest.raises(ValueError, match="labels and comparisons"):
        verdicts.sweep_summary(["a"], cs)


def test_method_note_states_the_rule_once():
    note = verdicts.method_note(9)
    assert "fastest of 9 repeats" in note and "10%" in note and "33%" in note and "25%" in note


def test_step_profile_on_every_side_of_the_weight_read_floor(five):
    floor = 65e6 / 10e9
    gemv = compare(1.0, 0.9, SPREAD)
    below, unsure, agrees, _, above = (
        no_roles(gemv_readings.step_profile_reading("m", t, SPREAD, 65e6, floor, 0.7, gemv))
        for t in five(floor)
    )
    assert "faster than reading its weights" in below
    assert "memory-bound GEMV" in agrees and "agrees" in agrees
    assert "smaller part" in above and "6.5 ms" in above and "disagrees" in above
    assert "cannot tell" in unsure and "faster than reading" in unsure
    assert "90% of its roofline rate" in above


@pytest.fixture
def floors():
    """A step's floors from the roofline model: the cache read once and counted three times."""
    shape = SHAPES["smollm2-135m"]
    return (
        roofline.step_time_floor(shape, "h100-sxm", 4, 1024),
        roofline.step_time_floor(shape, "h100-sxm", 4, 1024, w_kv=6),
    )


def test_gemv_explorer_on_every_side_of_the_step_floor(floors, five):
    floor, floor_copy = floors
    below, unsure, agrees, unsure_high, above = (
        no_roles(gemv_readings.explore_reading(4, 1024, t, floor, floor_copy, SPREAD))
        for t in five(floor_copy)
    )
    assert "Below it" in below and "disagrees" in below
    assert "Close to the floor" in agrees
    assert "Above the floor" in above and "step_time_floor" in above
    assert si(floor_copy, "s") in above
    assert "cannot tell" in unsure and "cannot tell" in unsure_high


def test_gemv_floor_ratio_on_every_side_of_the_step_floor(five):
    below, unsure, agrees, _, above = (
        no_roles(gemv_readings.floor_ratio_reading(1, 256, 4.5, 16, 4096, r, SPREAD))
        for r in five(1.0)
    )
    assert "faster than its floor allows" in below
    assert "meets the floor" in agrees and "cannot tell" in unsure
    assert "here it did not" in above and "1.5 times" in above and "4.5 times its floor" in above


def test_latency_throughput_reading_recomputes_the_seed():
    rows = roofline.decode_floor_table(
        SHAPES["llama-3-8b"], "h100-sxm", [(1, 8192), (32, 2048), (32, 8192)], params=8e9
    )
    text = gemv_readings.latency_throughput_reading(rows)
    assert "22 times at 2,048 tokens each and 11 times at 8,192" in text
    assert "196 to 4,360 or 2,129 tokens/s" in text and "5.1 ms to 7.3 or 15.0 ms" in text
    assert "**latency**" in text
    # the notebook passes the whole of Table 9.1, whose fourth row (batch 345) is not admitted
    table = roofline.decode_floor_table(
        SHAPES["llama-3-8b"],
        "h100-sxm",
        [(1, 8192), (32, 2048), (32, 8192), (345, 2048)],
        params=8e9,
    )
    assert table[3].step_time is None
    assert gemv_readings.latency_throughput_reading(table) == text


def test_gpu_batching_reading_quotes_the_datasheet_and_gpt_fast():
    text = gemv_readings.gpu_batching_reading("A100", 153.0, 159.0, 2.039e12)
    assert "2.04 TB/s" in text and "153 FLOP per byte" in text and "159" in text
    assert "1,397 GB/s" in text and "PyTorch gpt-fast, 2023" in text


def test_verdict_words_name_each_outcome_and_a_run_too_noisy_to_agree():
    assert verdicts.verdict_words(compare(1.0, 1.0, 0.05)) == "agrees"
    assert verdicts.verdict_words(compare(2.0, 1.0, 0.05)).startswith("disagrees: it is above")
    unsure = verdicts.verdict_words(compare(1.2, 1.0, 0.05))
    assert unsure.startswith("cannot tell: it is above") and "noise band" in unsure
    noisy = verdicts.verdict_words(compare(0.999, 1.0, 0.30))  # on it, but spread past the limit
    assert "on the prediction" in noisy and "below" not in noisy
    far = verdicts.verdict_words(compare(2.9, 1.0, 2.0))  # far off, in a run scattered by 200%
    assert far == "cannot tell: the repeats scattered by 200%, too much to call it"
