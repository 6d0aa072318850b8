"""kvlab.cache.recurrence: the chapter's two-token recurrence, exactly."""

import math

import pytest

from kvlab.cache.recurrence import (
    SEED_INPUTS,
    SEED_OUTPUTS,
    SEED_RECURRENCE,
    SEED_STATES,
    DiagonalRecurrence,
)
from kvlab.lab.recall import spread_recurrence


def test_seed_two_token_example_exactly():
    states, outputs = SEED_RECURRENCE.run(SEED_INPUTS)
    assert states == [(2.0, 4.0), (2.0, 3.0)]  # h1 = (2, 4), h2 = (2, 3)
    assert outputs == [6.0, 5.0]  # y1 = 6, y2 = 5
    h1, y1 = SEED_RECURRENCE.step((0.0, 0.0), 2.0)
    assert (h1, y1) == ((2.0, 4.0), 6.0)
    assert SEED_RECURRENCE.step(h1, 1.0) == ((2.0, 3.0), 5.0)
    assert tuple(states) == SEED_STATES and tuple(outputs) == SEED_OUTPUTS


def test_recurrence_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="gain must have 2 elements"):
        DiagonalRecurrence((0.5, 0.25), (1.0,), (1.0, 1.0))
    with pytest.raises(ValueError, match="state must have 2 elements"):
        SEED_RECURRENCE.step((0.0,), 1.0)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "recurrence nan input": (
        lambda: spread_recurrence(2).step((0.0, 0.0), math.nan),
        ValueError,
        "x must be a finite number",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
