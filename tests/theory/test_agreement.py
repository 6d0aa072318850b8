"""kvlab.theory.agreement and kvlab.theory.kv_traffic: how a reading compares a measurement with its
model, on both sides of every boundary.
"""

import pytest

from kvlab.theory.agreement import ABOVE, BELOW, WITHIN, compare, edges
from kvlab.theory.kv_traffic import BYTES_TOLERANCE, cache_resident, compare_with_bytes


def test_compare_on_both_sides_of_each_edge():
    low, high = edges(2.0, 1.25)
    assert (low, high) == (1.6, 2.5)
    assert compare(0.9 * low, 2.0, 1.25).outcome == BELOW
    assert compare(1.1 * low, 2.0, 1.25).outcome == WITHIN
    assert (
        compare(0.9 * high, 2.0, 1.25).outcome == WITHIN and compare(0.9 * high, 2.0, 1.25).agrees
    )
    assert compare(1.1 * high, 2.0, 1.25).outcome == ABOVE
    assert (
        compare(-1.0, 2.0, 1.25).outcome == BELOW
    )  # a negative slope is below any positive prediction
    c = compare(2.8, 2.0, 1.25)
    assert (
        c.ratio == pytest.approx(1.4)
        and c.describe()
        == "1.4 times the prediction: above it, beyond the factor 1.25 either way "
        "that counts as agreement"
    )
    assert (
        compare(1.1, 1.0, 1.25).describe()
        == "1.1 times the prediction: within the factor 1.25 either way that counts as agreement"
    )
    assert (
        compare(0.5, 1.0, 1.25).describe().startswith("0.5 times the prediction: below it, beyond")
    )
    assert compare(2.006, 1.0, 2.0).describe().startswith("2.01 times")


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (lambda: compare(1.0, 0.0, 1.25), ValueError, "predicted must be a finite number > 0"),
        (lambda: compare(1.0, 1.0, 1.0), ValueError, "tolerance must be a finite factor > 1"),
        (
            lambda: compare(float("nan"), 1.0, 2.0),
            ValueError,
            "measured must be a finite number, got nan",
        ),
        (lambda: compare("1", 1.0, 2.0), TypeError, "measured must be a finite number, got str"),
        (lambda: cache_resident(0, 1 << 20), ValueError, "nbytes must be a finite number > 0"),
    ],
)
def test_bad_input_names_the_argument(call, kind, words):
    with pytest.raises(kind, match=words):
        call()


def test_bytes_model_and_residency():
    low, high = edges(1e-3, BYTES_TOLERANCE)
    assert (
        compare_with_bytes(0.9 * low, 1e-3).outcome == BELOW
        and compare_with_bytes(1.1 * high, 1e-3).outcome == ABOVE
    )
    from kvlab.theory.kv_traffic import RESIDENT_SHARE

    edge = RESIDENT_SHARE * (32 << 20)
    assert cache_resident(0.9 * edge, 32 << 20) and not cache_resident(1.1 * edge, 32 << 20)
    assert not cache_resident(1.0, None)  # unknown size: never assume residency
