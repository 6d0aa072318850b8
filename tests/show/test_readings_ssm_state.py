"""kvlab.show.readings.ssm_state: every decision fed inputs on both sides of the boundary that the
model of kvlab.theory.ssm itself puts there (CONTRIBUTING.md, readings).
"""

import re

import pytest

from kvlab.show.readings import ssm_state
from kvlab.theory import ssm
from kvlab.theory.agreement import edges


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
    # The winner right but the margin past the disagreement edge on each side, inside the
    # agreement band, and in the cannot-tell band between them (spread 15%).
    low_d, low_a, high_a, high_d = edges(1.0, 0.15)
    for factor, words in (
        (1.1 * high_d, "but not the margin"),
        (0.9 * low_d, "but not the margin"),
        (0.95 * high_a, "explains the points"),
        (1.05 * low_a, "explains the points"),
        ((high_a * high_d) ** 0.5, "this run cannot tell"),
        ((low_a * low_d) ** 0.5, "this run cannot tell"),
    ):
        t = times(0.2 * edge, ratio_factor=factor)
        text = ssm_state.scan_reading(S, DIM, N, C, t, 0.2 * edge, GAMMA, 0.15)
        assert words in text, (factor, text)
    bad = ssm_state.scan_reading(S, DIM, N, C, times(cheap), -1e-6, GAMMA)
    assert "could not be told apart" in bad


def test_scan_reading_on_the_issues_numbers():
    # tau = 25.3 µs, gamma E = 3.74 µs at s = 1024: sequential 29.7 ms, parallel 38.6 ms, ratio 1.30
    tau = 25.3e-6
    t = {"sequential": 29.7e-3, "parallel": 38.6e-3 * 1.32 / 1.30, "chunked": 30e-3}
    text = ssm_state.scan_reading(S, DIM, N, C, t, tau, GAMMA)
    assert "predicts the sequential scan to win" in text and "explains the points" in text
    assert "29.7 ms sequential and 38.6 ms parallel" in text


def test_ssm_step_reading_on_every_side():
    k, read, copy = 4096.0, 11e9, 12e9
    predicted = ssm.cache_step_slope(k, read, copy)
    assert predicted == pytest.approx(k / read + 2 * k / copy)
    lo_d, lo_a, hi_a, hi_d = edges(predicted, 0.2)
    flat_edge = ssm.FLAT_SHARE * predicted
    args = dict(
        llama="L",
        mamba="M",
        s0=2048,
        s1=8192,
        llama_t=(0.034, 0.166),
        mamba_t=(0.043, 0.050),
        kv_bytes_per_token=k,
        read_bytes_per_s=read,
        copy_bytes_per_s=copy,
        slope_spread=0.2,
    )

    def text(slope, mamba=0.9 * flat_edge):
        return no_roles(ssm_state.step_reading(slope_llama=slope, slope_mamba=mamba, **args))

    for agree in (predicted, 0.99 * hi_a, 1.01 * lo_a):
        assert "one read and one copy of the cache" in text(agree)
    assert "exceeds the two passes" in text(1.1 * hi_d)
    assert "below the two passes" in text(0.9 * lo_d)
    for inside in ((hi_a * hi_d) ** 0.5, (lo_a * lo_d) ** 0.5):
        assert "This run cannot tell" in text(inside)
    assert "noise of a shared machine." in text(predicted) and "k/R + 2k/C" in text(predicted)
    assert "as large as the attention growth" in text(predicted, 1.1 * flat_edge)
    assert "as large as the attention growth" in text(predicted, -1.1 * flat_edge)


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


def test_memory_reading_exact_or_not():
    predicted = {16: 1000, 64: 2000, 256: 6000}
    same = ssm_state.memory_reading(dict(predicted), predicted, 1, 4)
    assert "exactly" in same and "20.8 B per token" in same and "other 3" in same
    off = ssm_state.memory_reading({**predicted, 64: 2048}, predicted, 2, 4)
    assert "differs from the formula" in off and "At 64 tokens" in off
