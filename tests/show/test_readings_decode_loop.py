"""kvlab.show.readings.decode_loop: the sentences that depend on a measurement, each fed both
outcomes (CONTRIBUTING.md, readings)."""

import re

import pytest

from kvlab.show.format import si
from kvlab.show.readings import decode_loop
from kvlab.theory import decode_step as dt
from kvlab.theory.agreement import compare


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


K, READ, COPY = 65_536, 10e9, 6e9  # cache bytes per token and the two ceilings
SPREAD = 0.05


def _reading(slope):
    contexts = [264.0, 1032.0, 4104.0]
    steps = [0.03, 0.03 + slope * 768, 0.03 + slope * 3840]
    points = [compare(t, t, SPREAD) for t in steps]
    return no_roles(
        decode_loop.history_reading(K, READ, COPY, slope_c(slope), contexts, steps, points, 88e6)
    )


def slope_c(slope):
    return compare(slope, dt.history_slope(K, READ, COPY), SPREAD)


def test_history_slope_counts_a_read_and_a_copy():
    assert dt.history_slope(K, READ, COPY) == pytest.approx(K / READ + 2 * K / COPY)
    with pytest.raises(ValueError, match="copy_bytes_per_s must be a finite number > 0"):
        dt.history_slope(K, READ, 0)


def test_history_reading_on_every_side_of_the_slope(five):
    predicted = dt.history_slope(K, READ, COPY)
    below, unsure_low, agrees, unsure_high, above = (_reading(s) for s in five(predicted))
    assert si(predicted, "s") in agrees and "explain how the step grows" in agrees
    assert "passes the model does not count" in above and "disagrees" in above
    assert "less than the model predicts" in below
    assert "scatter too widely" in unsure_low and "scatter too widely" in unsure_high
    assert "4,104" in agrees and "agrees at 264 tokens, 1,032 tokens and 4,104 tokens" in agrees
    assert "\\beta_\\text{read}" in agrees


def test_decode_loop_intercept_on_every_side_of_the_floor(five):
    """The floor from the model (weight bytes / bandwidth); steps on every side of its edges."""
    from kvlab.theory.decode_step import weight_read_floor

    floor = weight_read_floor(88e6, 8.8e9)
    below, unsure, near, _, above = (
        no_roles(decode_loop.intercept_reading(floor, t, 0.05)) for t in five(floor)
    )
    assert "already bound by reading its weights" in near and "10 ms" in near
    assert "dispatch" in above and "disagrees" in above
    assert "stayed in the CPU's caches" in below
    assert "too wide" in unsure


@pytest.mark.parametrize(
    "reading, missing",
    [
        (lambda: decode_loop.intercept_reading(1e-3, float("nan"), 0.05), "t0"),
        (lambda: decode_loop.intercept_reading(None, 1e-3, 0.05), "floor_s"),
    ],
)
def test_a_reading_handed_no_measurement_says_so_instead_of_a_verdict(reading, missing):
    text = reading()
    assert text.startswith("Not measured: " + missing) and "no verdict" in text
