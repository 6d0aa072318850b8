"""kvlab.show.readings.ssm_state: every decision fed inputs on both sides of the boundary that the
model of kvlab.theory.ssm itself puts there (CONTRIBUTING.md, readings).
"""

import re

import pytest

from kvlab.show.readings import ssm_state
from kvlab.theory import ssm
from kvlab.theory.agreement import factor_edges


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


S, DIM, N, C = 1024, 64, 16, 16
E = DIM * N
GAMMA = 3.74e-6 / E  # the issue's fit: gamma E = 3.74 µs


def times(tau, ratio_factor=1.0, winner_swap=False):
    """Measured times that the cost model predicts at ``tau`` (sequential over parallel scaled by
    ``ratio_factor``), or with the winner swapped."""
    t = {m: ssm.scan_time(S, m, C if m == "chunked" else None, tau, GAMMA, E) for m in ssm.METHODS}
    t["sequential"] *= ratio_factor
    if winner_swap:
        t["sequential"], t["parallel"] = t["parallel"], t["sequential"]
    return t


def test_scan_reading_on_both_sides_of_the_break_even():
    edge = (
        ssm.parallel_break_even(S) * GAMMA * E
    )  # the round cost at which the model changes its winner
    cheap, costly = 0.9 * edge, 1.1 * edge
    seq = no_roles(ssm_state.scan_reading(S, DIM, N, C, times(cheap), cheap, GAMMA))
    par = no_roles(ssm_state.scan_reading(S, DIM, N, C, times(costly), costly, GAMMA))
    assert "predicts the sequential scan to win" in seq and "explains the points" in seq
    assert "predicts the parallel scan to win" in par and "explains the points" in par
    assert f"{ssm.parallel_break_even(S):.3g}" in seq and "ssm.parallel_break_even" in seq
    wrong = no_roles(
        ssm_state.scan_reading(S, DIM, N, C, times(cheap, winner_swap=True), cheap, GAMMA)
    )
    assert "predicted the sequential scan to win and the parallel scan won" in wrong
    # The winner right but the margin past the tolerance on each side.
    low, high = factor_edges(1.0, ssm.SCAN_TOLERANCE)
    for factor in (1.1 * high, 0.9 * low):
        t = times(0.2 * edge, ratio_factor=factor)
        text = ssm_state.scan_reading(S, DIM, N, C, t, 0.2 * edge, GAMMA)
        assert "but not the margin" in text, factor
    bad = ssm_state.scan_reading(S, DIM, N, C, times(cheap), -1e-6, GAMMA)
    assert "could not be told apart" in bad


def test_scan_reading_on_the_issues_numbers():
    # tau = 25.3 µs, gamma E = 3.74 µs at s = 1024: sequential 29.7 ms, parallel 38.6 ms, ratio 1.30
    tau = 25.3e-6
    t = {"sequential": 29.7e-3, "parallel": 38.6e-3 * 1.32 / 1.30, "chunked": 30e-3}
    text = ssm_state.scan_reading(S, DIM, N, C, t, tau, GAMMA)
    assert "predicts the sequential scan to win" in text and "explains the points" in text
    assert "29.7 ms sequential and 38.6 ms parallel" in text


def test_ssm_step_reading_both_sides():
    k, beta = 4096.0, 8e9
    predicted = ssm.attention_step_slope(k, beta)
    low, high = factor_edges(predicted, ssm.SLOPE_TOLERANCE)
    flat_edge = ssm.FLAT_SHARE * predicted
    args = dict(
        llama="L",
        mamba="M",
        s0=256,
        s1=8192,
        llama_t=(0.034, 0.166),
        mamba_t=(0.043, 0.050),
        kv_bytes_per_token=k,
        bandwidth=beta,
    )
    near = no_roles(
        ssm_state.step_reading(slope_llama=predicted, slope_mamba=0.9 * flat_edge, **args)
    )
    steep = no_roles(
        ssm_state.step_reading(slope_llama=1.1 * high, slope_mamba=0.9 * flat_edge, **args)
    )
    shallow = no_roles(
        ssm_state.step_reading(slope_llama=0.9 * low, slope_mamba=-0.9 * flat_edge, **args)
    )
    noisy = no_roles(
        ssm_state.step_reading(slope_llama=predicted, slope_mamba=1.1 * flat_edge, **args)
    )
    assert "within a factor of 2" in near and "noise of a shared machine:" in near
    assert "exceeds the prediction" in steep and "below the prediction" in shallow
    assert "Rerun the cell" in noisy and "3k/\\beta" in near


def test_ssm_recall_both_sides():
    n, s, samples = 8, 64, 2000
    bound = ssm.recall_bound(n, s)
    tol = ssm.sampling_tolerance(samples, n)
    exact = no_roles(
        ssm_state.recall_reading(
            n, s, bound, bound + 0.9 * tol, samples, 0.71, 0.035, 0.9 * ssm.LOOKUP_TOLERANCE
        )
    )
    assert (
        "exactly the bound" in exact
        and "lands on the exact value" in exact
        and "recovers every position" in exact
    )
    off = no_roles(
        ssm_state.recall_reading(
            n,
            s,
            bound + 10 * ssm.RANK_TOLERANCE,
            bound + 1.1 * tol,
            samples,
            0.9,
            0.01,
            1.1 * ssm.LOOKUP_TOLERANCE,
        )
    )
    assert "rank-deficient" in off and "more than the" in off and "not sharp enough" in off


@pytest.mark.parametrize("s", [64, 1024, 4096])
def test_break_even_matches_the_issue_formula(s):
    import math

    log = math.log2(s)
    assert ssm.parallel_break_even(s) == pytest.approx((s * log - s) / (s - log), rel=0.1)
