"""kvlab.theory.agreement and kvlab.theory.kv_traffic: how a reading compares a measurement with its
model, on both sides of every boundary.
"""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.theory.agreement import (
    ABOVE,
    AGREE_SPREAD_LIMIT,
    AGREES,
    BELOW,
    CANNOT_TELL,
    DISAGREES,
    FLOOR,
    WITHIN,
    combined_spread,
    compare,
    edges,
    factor_edges,
    within_factor,
)
from kvlab.theory.kv_traffic import cache_resident, compare_with_bytes


def test_within_factor_on_both_sides_of_each_edge():
    low, high = factor_edges(2.0, 1.25)
    assert (low, high) == (1.6, 2.5)
    assert within_factor(0.9 * low, 2.0, 1.25).outcome == BELOW
    assert within_factor(1.1 * low, 2.0, 1.25).outcome == WITHIN
    assert (
        within_factor(0.9 * high, 2.0, 1.25).outcome == WITHIN
        and within_factor(0.9 * high, 2.0, 1.25).agrees
    )
    assert within_factor(1.1 * high, 2.0, 1.25).outcome == ABOVE
    assert (
        within_factor(-1.0, 2.0, 1.25).outcome == BELOW
    )  # a negative slope is below any positive prediction
    c = within_factor(2.8, 2.0, 1.25)
    assert (
        c.ratio == pytest.approx(1.4)
        and c.describe()
        == "1.4 times the prediction: above it, beyond the factor 1.25 either way "
        "that counts as agreement"
    )
    assert (
        within_factor(1.1, 1.0, 1.25).describe()
        == "1.1 times the prediction: within the factor 1.25 either way that counts as agreement"
    )
    assert (
        within_factor(0.5, 1.0, 1.25)
        .describe()
        .startswith("0.5 times the prediction: below it, beyond")
    )
    assert within_factor(2.006, 1.0, 2.0).describe().startswith("2.01 times")


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (
            lambda: within_factor(1.0, 0.0, 1.25),
            ValueError,
            "predicted must be a finite number > 0",
        ),
        (lambda: within_factor(1.0, 1.0, 1.0), ValueError, "tolerance must be a finite factor > 1"),
        (
            lambda: within_factor(float("nan"), 1.0, 2.0),
            ValueError,
            "measured must be a finite number, got nan",
        ),
        (
            lambda: within_factor("1", 1.0, 2.0),
            TypeError,
            "measured must be a finite number, got str",
        ),
        (lambda: cache_resident(0, 1 << 20), ValueError, "nbytes must be a finite number > 0"),
        (lambda: compare(1.0, 0.0, 0.1), ValueError, "predicted must be a finite number > 0"),
        (lambda: compare(1.0, 1.0, -0.1), ValueError, "spread must be a finite number >= 0"),
        (lambda: compare(1.0, 1.0, 0.1, floor=1.0), ValueError, r"floor must be in \(0, 1\)"),
        (lambda: compare(1.0, 1.0, "0.1"), TypeError, "spread must be a finite number >= 0"),
        (lambda: edges(1.0, float("inf")), ValueError, "spread must be a finite number >= 0"),
    ],
)
def test_bad_input_names_the_argument(call, kind, words):
    with pytest.raises(kind, match=words):
        call()


def test_bytes_model_and_residency():
    lo_dis, lo_agree, hi_agree, hi_dis = edges(1e-3, 0.05)
    assert compare_with_bytes(0.9 * lo_dis, 1e-3, 0.05).side == BELOW
    assert compare_with_bytes(1.1 * hi_dis, 1e-3, 0.05).side == ABOVE
    assert compare_with_bytes(1.1 * lo_agree, 1e-3, 0.05).agrees
    assert compare_with_bytes((hi_agree * hi_dis) ** 0.5, 1e-3, 0.05).outcome == CANNOT_TELL
    from kvlab.theory.kv_traffic import RESIDENT_SHARE

    edge = RESIDENT_SHARE * (32 << 20)
    assert cache_resident(0.9 * edge, 32 << 20) and not cache_resident(1.1 * edge, 32 << 20)
    assert not cache_resident(1.0, None)  # unknown size: never assume residency


@pytest.mark.parametrize("spread", [0.0, 0.05, FLOOR, 0.2, AGREE_SPREAD_LIMIT])
def test_compare_on_both_sides_of_each_edge_and_in_the_cannot_tell_band(spread):
    lo_dis, lo_agree, hi_agree, hi_dis = edges(2.0, spread)
    band = max(FLOOR, spread)
    assert hi_agree == pytest.approx(2.0 * (1 + band)) and lo_agree == pytest.approx(2 / (1 + band))
    assert hi_dis == pytest.approx(2.0 * (1 + band) ** 3)
    cases = [
        (0.9 * lo_dis, DISAGREES, BELOW),
        (math.sqrt(lo_dis * lo_agree), CANNOT_TELL, BELOW),
        (1.01 * lo_agree, AGREES, None),
        (2.0, AGREES, None),
        (0.99 * hi_agree, AGREES, None),
        (math.sqrt(hi_agree * hi_dis), CANNOT_TELL, ABOVE),
        (1.1 * hi_dis, DISAGREES, ABOVE),
    ]
    for measured, outcome, side in cases:
        c = compare(measured, 2.0, spread)
        assert (c.outcome, c.side) == (outcome, side), (measured, c)
        assert c.agrees == (outcome == AGREES) and c.edges == (lo_dis, lo_agree, hi_agree, hi_dis)
    assert compare(-1.0, 2.0, spread).outcome == DISAGREES  # a negative slope misses any prediction


def test_compare_describes_its_outcome_without_the_rule():
    assert compare(1.04, 1.0, 0.02).describe() == "1.04 times the prediction: agrees"
    assert compare(1.6, 1.0, 0.02).describe() == "1.6 times the prediction: above it"
    assert compare(0.5, 1.0, 0.02).describe() == "0.5 times the prediction: below it"
    assert compare(1.2, 1.0, 0.02).describe().startswith("1.2 times the prediction: cannot tell")
    noisy = "0.95 times the prediction: cannot tell (on it, too scattered to confirm it)"
    assert compare(0.95, 1.0, 0.6).describe() == noisy
    assert compare(1.5, 1.0, 0.6).describe() == (
        "1.5 times the prediction: cannot tell (scattered by 60%)"
    )


def test_a_run_too_noisy_to_confirm_never_agrees():
    lo_dis, lo_agree, hi_agree, hi_dis = edges(1.0, 0.6)
    assert lo_agree == hi_agree == 1.0 and hi_dis == pytest.approx(1.6**3)
    assert compare(1.0, 1.0, 0.6).outcome == CANNOT_TELL
    assert compare(1.1 * hi_dis, 1.0, 0.6).outcome == DISAGREES
    assert compare(0.9 * hi_dis, 1.0, 0.6).outcome == CANNOT_TELL


def test_a_wider_spread_widens_both_bands():
    assert compare(1.25, 1.0, 0.0).outcome == CANNOT_TELL
    assert compare(1.25, 1.0, 0.25).outcome == AGREES
    assert compare(1.5, 1.0, 0.0).outcome == DISAGREES
    assert compare(1.5, 1.0, 0.2).outcome == CANNOT_TELL
    assert compare(1.5, 1.0, 0.1, floor=0.05).band == 0.1
    assert compare(1.01, 1.0, 0.0, floor=0.005).outcome == CANNOT_TELL


def test_combined_spread_adds_and_refuses_a_negative_one():
    assert combined_spread(0.05, 0.02) == pytest.approx(0.07) and combined_spread() == 0
    with pytest.raises(ValueError, match=r"spreads\[1\] must be a finite number >= 0"):
        combined_spread(0.1, -0.1)


log_ratio = st.floats(-1.5, 1.5)
spread = st.floats(0.0, 0.6)


@given(log_ratio, spread, spread, st.floats(0.0, 1.0))
def test_two_honest_runs_never_reach_opposite_verdicts(mu, s1, s2, shift):
    """Run 1 measures the ratio exp(mu); run 2 one that differs by at most the smaller run's band
    (an honest spread), with spreads within a factor two of each other: never agree against
    disagree."""
    if max(s1, s2, FLOOR) > 2 * max(min(s1, s2), FLOOR):
        s2 = s1
    a1 = math.log(1 + max(FLOOR, s1))
    a2 = math.log(1 + max(FLOOR, s2))
    mu2 = mu + (2 * shift - 1) * min(a1, a2)
    one = compare(math.exp(mu), 1.0, s1).outcome
    two = compare(math.exp(mu2), 1.0, s2).outcome
    assert {one, two} != {AGREES, DISAGREES}
