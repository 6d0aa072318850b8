"""kvlab.lab.recall: what a fixed state can recall, exactly and sampled, against attention's
lookup."""

import math

import pytest
import torch

from kvlab.lab.recall import (
    attention_recall,
    linear_recall_error,
    linear_recall_errors,
    spread_recurrence,
)


@pytest.mark.parametrize("n, length", [(1, 1), (2, 5), (4, 4), (4, 12), (6, 3)])
def test_mean_recall_error_is_one_minus_rank_over_length(n, length):
    r = spread_recurrence(n)
    assert linear_recall_error(r, length) == pytest.approx(1 - min(n, length) / length, abs=1e-9)


def test_recall_errors_per_position_and_bad_positions():
    r = spread_recurrence(3)
    errors = linear_recall_errors(r, 9)
    assert errors.shape == (9,) and float(errors.mean()) == pytest.approx(1 - 3 / 9, abs=1e-9)
    assert linear_recall_error(r, 9, 4) == pytest.approx(float(errors[4]))
    with pytest.raises(ValueError, match=r"position must be in \[0, length=9\)"):
        linear_recall_error(r, 9, 9)


def test_recall_error_matches_sampled_least_squares():
    r, length, p = spread_recurrence(3), 10, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, length, generator=g, dtype=torch.float64)
    h = x @ r.input_map(length).T
    readout = torch.linalg.lstsq(h, x[:, p : p + 1]).solution
    sampled = ((x[:, p : p + 1] - h @ readout) ** 2).mean() / (x[:, p] ** 2).mean()
    assert float(sampled) == pytest.approx(linear_recall_error(r, length, p), abs=0.02)


def test_attention_lookup_recalls_any_position():
    x = torch.randn(5, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for p in (0, 17, 39):
        torch.testing.assert_close(attention_recall(x, p), x[:, p], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention_recall(x), x, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="position must be in"):
        attention_recall(x, 40)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "ssm recurrence None": (
        lambda: spread_recurrence(4, fastest=None),
        TypeError,
        "fastest must be",
    ),
    "attention_recall sharpness": (
        lambda: attention_recall(torch.rand(5), sharpness=-1.0),
        ValueError,
        "sharpness must be a finite number > 0",
    ),
    "attention_recall nan": (
        lambda: attention_recall(torch.tensor([1.0, math.nan])),
        ValueError,
        "NaN",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
