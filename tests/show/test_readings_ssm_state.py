"""kvlab.show.readings.ssm_state: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re

from kvlab.show.readings import ssm_state


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_ssm_scan_both_regimes_and_outcomes():
    # E = 64 * 16 = 1024 elements; gamma * E = 1.2 µs per round
    cheap_round = dict(length=1024, dim=64, state_size=16, chunk_size=16, tau=0.2e-6, gamma=1.2e-6 / 1024)
    costly_round = {**cheap_round, "tau": 14e-6}
    seq_wins = no_roles(ssm_state.scan_reading(t_seq=0.067, t_par=0.087, t_chunk=0.075, **cheap_round))
    par_wins_anyway = no_roles(ssm_state.scan_reading(t_seq=0.087, t_par=0.065, t_chunk=0.075, **cheap_round))
    par_wins = no_roles(ssm_state.scan_reading(t_seq=0.087, t_par=0.065, t_chunk=0.075, **costly_round))
    seq_wins_anyway = no_roles(ssm_state.scan_reading(t_seq=0.067, t_par=0.087, t_chunk=0.075, **costly_round))
    assert "A round is cheap" in seq_wins and "sequential scan won" in seq_wins and "1.30 times slower" in seq_wins
    assert "A round is cheap" in par_wins_anyway and "does not explain" in par_wins_anyway
    assert "dispatch) dominates" in par_wins and "the parallel scan won" in par_wins and "1.34 times faster" in par_wins
    assert "A round is cheap" not in par_wins and "does not explain" in seq_wins_anyway
    bad_fit = ssm_state.scan_reading(t_seq=0.067, t_par=0.087, t_chunk=0.075, **{**cheap_round, "tau": -1e-6})
    assert "could not be told apart" in bad_fit


def test_ssm_step_both_outcomes():
    args = dict(llama="L", mamba="M", s0=256, s1=8192, llama_t=(0.034, 0.166), mamba_t=(0.043, 0.050))
    near = no_roles(ssm_state.step_reading(slope_llama=16e-6, slope_mamba=0.9e-6, slope_pred=10e-6, **args))
    steep = no_roles(ssm_state.step_reading(slope_llama=79e-6, slope_mamba=0.9e-6, slope_pred=10e-6, **args))
    flat = no_roles(ssm_state.step_reading(slope_llama=3e-6, slope_mamba=0.9e-6, slope_pred=10e-6, **args))
    noisy = no_roles(ssm_state.step_reading(slope_llama=16e-6, slope_mamba=8e-6, slope_pred=10e-6, **args))
    assert "within a factor of two" in near and "noise of a shared machine:" in near
    assert "exceeds the prediction" in steep and "7.9 times" in steep
    assert "below the prediction" in flat and "Rerun the cell" in noisy


def test_ssm_recall_both_outcomes():
    exact = no_roles(ssm_state.recall_reading(8, 64, 0.875, 0.871, 2000, 0.71, 0.035, 1e-12))
    deficient = no_roles(ssm_state.recall_reading(16, 16, 0.2, 0.4, 2000, 0.9, 0.01, 0.02))
    assert "exactly $1 - n/s$" in exact and "lands on the exact value" in exact and "recovers every position" in exact
    assert "rank-deficient" in deficient and "off the exact value" in deficient and "not sharp enough" in deficient
