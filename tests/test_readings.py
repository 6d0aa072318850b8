"""Readings (kvlab.show.readings): each outcome-dependent sentence, fed both outcomes.

A reading must change with its condition and stay true to the numbers it is given: the tests feed
each function a measurement that agrees with its prediction and one that does not, and check that
the text quotes the numbers and says which of the two happened.
"""

import re

import pytest

from kvlab.show.readings import decode_loop, ratio_text, sci, within


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_helpers():
    assert within(1.0, 1.2, 1.25) and not within(1.0, 2.0, 1.25) and not within(0.0, 1.0, 2)
    assert ratio_text(2.1, 1.0) == "2.1 times" and ratio_text(45.0, 1.0) == "45 times"
    assert sci(3.13e8) == r"$3.13 \times 10^{8}$" and sci(655_000) == "655,000" and sci(12.5) == "12.5"


# -- 9.1 the decode loop -------------------------------------------------------------------------


@pytest.mark.parametrize("measured, verdict", [(1.1e-3, "sits on the line"), (3e-3, "slower than the bytes"),
                                               (0.5e-3, "faster than the line")])
def test_decode_loop_step(measured, verdict):
    text = no_roles(decode_loop.step_reading(1024, 32, measured, 1e-3))
    assert verdict in text and "1,024-token" in text and "31 decode steps" in text


def test_decode_loop_slope_both_outcomes():
    args = dict(s0=256, t0=0.030, s_long=4096, t_long=0.080, cache_long_bytes=2e8, weight_bytes=9e7)
    agree = no_roles(decode_loop.slope_reading(5e-6, 6e-6, **args))
    steep = no_roles(decode_loop.slope_reading(5e-6, 40e-6, **args))
    flat = no_roles(decode_loop.slope_reading(5e-6, 1e-6, **args))
    assert "within a factor of two" in agree and "1.2 times" in agree
    assert "more than twice" in steep and "8 times" in steep and "within" not in steep
    assert "less than half" in flat and "0.2 times" in flat
    assert "keeps growing" in agree
    level = no_roles(decode_loop.slope_reading(5e-6, 6e-6, **{**args, "t_long": 0.031}))
    assert "barely grew" in level and "keeps growing" not in level


def test_decode_loop_intercept_both_outcomes():
    above = decode_loop.intercept_reading(0.010, 0.034)
    near = decode_loop.intercept_reading(0.010, 0.012)
    assert "longer" in above and "10 ms" in above and "34 ms" in above
    assert "close to the floor" in near and "longer" not in near


# -- 9.2 recompute, cache reuse, optimized decode ------------------------------------------------

from kvlab.show.readings import cache_reuse  # noqa: E402


def test_cache_reuse_speedup_both_outcomes():
    common = dict(P=64, G=64, worst_error=0.2, work_ratio=48, naive_growth=3.0, cached_growth=1.1)
    agree = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=2, **common))
    slow_cached = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=0.6, **common))
    fast_naive = no_roles(cache_reuse.speedup_reading(naive_s=3, naive_pred=11, cached_s=2, cached_pred=2, **common))
    assert "within a factor of 1.5" in agree and "5.0 times" in agree and "5.5 times" in agree
    assert "cached loop, which took 3.3 times its prediction" in slow_cached and "DynamicCache" in slow_cached
    assert "naive loop, which took 0.27 times" in fast_naive and "not a straight line" in fast_naive
    assert "but its time ratio is smaller" in agree
    big = no_roles(cache_reuse.speedup_reading(naive_s=100, naive_pred=100, cached_s=2, cached_pred=2,
                                               **{**common, "work_ratio": 20}))
    assert "and its time ratio is as large" in big
    flat = no_roles(cache_reuse.speedup_reading(naive_s=10, naive_pred=11, cached_s=2, cached_pred=2,
                                                **{**common, "naive_growth": 1.1}))
    assert "can hide it" in flat and "1.1 times the first" in flat


def test_cache_reuse_latency_both_outcomes():
    usual = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.08, 0.017, 0.018))
    odd = no_roles(cache_reuse.latency_reading(96, 32, 0.07, 0.015, 0.017, 0.010))
    assert "because every one of them is a prefill" in usual and "does not make an eager step cheaper" in usual
    assert "no more than the cached loop" in odd and "Here it was faster" in odd
    assert "17 ms" in usual and "70 ms" in usual


def test_cache_reuse_compile_both_outcomes():
    pays = no_roles(cache_reuse.compile_reading(60.0, 6e-3, 1e-3, 12_000))
    never = no_roles(cache_reuse.compile_reading(60.0, 1e-3, 1.5e-3, float("inf")))
    assert "12,000 tokens" in pays and "gain of 5 ms" in pays
    assert "never" in never and "500 µs slower" in never and "tokens" not in never


def test_cache_reuse_explore_both_outcomes():
    tt, tp = {"naive": 0.07, "cached": 0.07, "static": 0.08}, {"naive": 0.08, "cached": 0.02, "static": 0.02}
    below = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 3.0, 7.0))
    above = no_roles(cache_reuse.explore_reading(32, 8, 1, "cpu", tt, tp, 9.0, 7.0))
    assert "below the positions ratio of 7.0" in below and "above the positions ratio" in above


# -- 9.3 GEMV-like behaviour in decode -----------------------------------------------------------

from kvlab.show.readings import gemv as gemv_readings  # noqa: E402


def test_gemv_copy_speed_both_outcomes():
    fast = no_roles(gemv_readings.gemv_reading(0.5, 9e9, 10e9))
    slow = no_roles(gemv_readings.gemv_reading(0.5, 2e9, 10e9))
    assert "about the speed of one" in fast and "90%" in fast
    assert "did not" in slow and "20%" in slow and "about the speed of one" not in slow


def test_gemv_ridge_fitted_knee_beside_calibrated():
    args = dict(ridge_cal=4.0, n_ridge_cal=8.0, matmul_flops=40e9, copy_bytes_per_s=10e9)
    agree = no_roles(gemv_readings.ridge_reading(**args, fit_knee=5.0, fit_n=10, fit_bandwidth=6e9, fit_peak=30e9))
    early = no_roles(gemv_readings.ridge_reading(**args, fit_knee=1.0, fit_n=2, fit_bandwidth=10e9, fit_peak=10e9))
    late = no_roles(gemv_readings.ridge_reading(**args, fit_knee=20.0, fit_n=40, fit_bandwidth=2e9, fit_peak=40e9))
    none = no_roles(gemv_readings.ridge_reading(**args, fit_knee=float("nan"), fit_n=float("nan"),
                                                fit_bandwidth=1e9, fit_peak=1e10))
    assert "measured knee at 5 FLOP" in agree and "4 FLOP per byte" in agree and "within a factor of two" in agree
    assert "bent earlier" in early and "25% of the calibrated matmul rate" in early
    assert "bent later" in late and "20% of the copy bandwidth" in late
    assert "finds no knee" in none and "measured knee" not in none
    curve = gemv_readings.ridge_reading(**args, fit_knee=5.0, fit_n=10, fit_bandwidth=6e9, fit_peak=30e9,
                                        fit_rms_log_error=0.4)
    assert "bend gradually" in curve and "bend gradually" not in agree


def test_gemv_doubling_both_outcomes():
    flat = no_roles(gemv_readings.doubling_reading([1, 2, 4, 8, 16], [1.0, 1.1, 1.2, 1.3, 2.6], 8))
    steep = no_roles(gemv_readings.doubling_reading([1, 2, 4, 8], [9.0, 25.0, 33.0, 40.0], 16))
    assert "barely changed" in flat and "1.10, 1.09, 1.08" in flat and "2.00" not in flat
    assert "did not" in steep and "2.78 times from $n = 1$ to 2" in steep
    assert "No doubling" in gemv_readings.doubling_reading([1, 2], [1.0, 2.0], 1.5)


def test_gemv_step_profile_both_outcomes():
    big = no_roles(gemv_readings.step_profile_reading("m", 0.010, 65e6, 0.008, 0.7, 1.0))
    small = no_roles(gemv_readings.step_profile_reading("m", 0.024, 65e6, 0.0067, 0.18, 0.3))
    assert "80%" in big and "most of the step" in big and "does run at copy speed" in big
    assert "28%" in small and "smaller part" in small and "only 30% of copy speed" in small


def test_gemv_explorer_and_floor_ratio_both_outcomes():
    near = no_roles(gemv_readings.explore_reading(4, 1024, 0.012, 0.005, 0.008))
    far = no_roles(gemv_readings.explore_reading(4, 1024, 0.050, 0.005, 0.008))
    below = no_roles(gemv_readings.explore_reading(4, 1024, 0.004, 0.005, 0.008))
    assert "Close to the floor" in near and "Well above" in far and "should not happen" in below
    closer = no_roles(gemv_readings.floor_ratio_reading(1, 256, 4.5, 16, 4096, 1.5))
    not_closer = no_roles(gemv_readings.floor_ratio_reading(1, 256, 4.5, 16, 4096, 5.3))
    assert "approaches the floor" in closer and "here it did not" in not_closer and "5.3 times" in not_closer


# -- 9.4 KV-cache layout -------------------------------------------------------------------------

from types import SimpleNamespace  # noqa: E402

from kvlab.show.readings import kv_layout  # noqa: E402


def _read(median, predicted=1e-3, kv_bytes=33.6e6, frac=0.4):
    return SimpleNamespace(timing=SimpleNamespace(median=median), predicted_s=predicted, kv_bytes=kv_bytes,
                           kv_bytes_per_s=kv_bytes / median, fraction_of_copy=frac)


def test_kv_layout_table_is_a_pipe_table_with_ratios():
    reads = {"BHTD": _read(0.010), "BTHD": _read(0.016), "NHD": _read(0.027), "HND": _read(0.027)}
    text = no_roles(kv_layout.layout_table(reads, 7.4e9, 2, 4096))
    assert "|---|---:|---:|---:|" in text and "| `NHD` (gather) |" in text and "| 1.6 |" in text
    assert "batch 2, context 4,096" in text and "7.4 GB/s" in text


def test_kv_layout_append_both_outcomes():
    usual = no_roles(kv_layout.append_reading(0.012, 5e-6, 9e-5, 0.018, 4096))
    odd = no_roles(kv_layout.append_reading(0.012, 1e-6, 9e-5, 0.006, 4096))
    assert "smaller than the byte ratio" in usual and "1.5 times the read" in usual
    assert "at least the byte ratio" in odd and "expected to take longer" in odd and "0.5 times" in odd


def test_kv_layout_explorer_and_gqa_both_outcomes():
    appends = {"index": SimpleNamespace(timing=SimpleNamespace(median=5e-6))}
    on = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(1.2e-3), appends))
    slow = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(4e-3), appends))
    fast = no_roles(kv_layout.explore_reading("BHTD", 4096, _read(0.3e-3), appends))
    assert "about the copy bandwidth" in on and "slower than its bytes" in slow and "faster than its bytes" in fast
    assert "index 5 µs" in on
    follows = no_roles(kv_layout.gqa_reading(8, 2, 4, 3.5))
    less = no_roles(kv_layout.gqa_reading(8, 2, 4, 1.5))
    more = no_roles(kv_layout.gqa_reading(8, 2, 4, 9.0))
    assert "Time follows bytes" in follows and "fell less" in less and "fell more" in more


# -- 9.5 PagedAttention --------------------------------------------------------------------------

from kvlab.show.readings import paged_attention  # noqa: E402


def _sim(waste, batch, steps, preemptions=0, meta=120):
    return SimpleNamespace(waste_fraction=waste, mean_batch=batch, steps=steps, preemptions=preemptions,
                           peak_metadata_bytes=meta)


def test_paged_event_reading_names_shared_blocks():
    snap = {"event": "B forks", "tables": {"B": ([3, 4], 11), "B'": ([3, 4], 11)}, "refs": [0, 0, 0, 2, 2] + [0] * 11}
    text = no_roles(paged_attention.event_reading(snap, 4, 16))
    assert "blocks 3, 4 are shared" in text and "2 of 16" in text
    alone = {"event": "A arrives", "tables": {"A": ([0], 5)}, "refs": [1] + [0] * 15}
    assert "no block is shared" in paged_attention.event_reading(alone, 0, 16)


def test_paged_waste_both_outcomes():
    pred = {"reserve-max": 0.67, "paged": 0.04}
    wins = no_roles(paged_attention.waste_reading(
        {"reserve-max": _sim(0.67, 7.1, 300), "reserve-estimate": _sim(0.43, 9, 250),
         "paged": _sim(0.043, 20.5, 100, preemptions=12)}, pred, "lognormal", 16, 4096, 120))
    loses = no_roles(paged_attention.waste_reading(
        {"reserve-max": _sim(0.30, 7.1, 300), "reserve-estimate": _sim(0.43, 9, 250),
         "paged": _sim(0.45, 6.0, 320)}, pred, "uniform", 128, 4096, 120))
    assert "**4.3%**" in wins and "3.0 times sooner" in wins and "12 preemptions" in wins
    assert "no less than reserving the maximum" in loses and "no preemption" in loses and "sooner" not in loses


def test_paged_attention_and_preemption_both_outcomes():
    gap = no_roles(paged_attention.attention_reading(4096, "gather", 0.5e9, 1.1e9, 5e9))
    kernel_gap = no_roles(paged_attention.attention_reading(4096, "triton", 0.5e9, 1.1e9, 5e9))
    even = no_roles(paged_attention.attention_reading(4096, "gather", 1.1e9, 1.1e9, 5e9))
    assert "2.2 times as long" in gap and "the gather" in gap
    assert "kernel's own efficiency" in kernel_gap and "kept up" in even
    swap = no_roles(paged_attention.preemption_reading(384, 0.1, 0.0005, 1.6e6, 2))
    rec = no_roles(paged_attention.preemption_reading(384, 0.001, 0.003, 1.6e6, 2))
    assert "Swap was 200 times cheaper" in swap and "Recompute was 3.0 times cheaper" in rec


# -- 9.6 hybrid attention and SSM state ----------------------------------------------------------

from kvlab.show.readings import ssm_state  # noqa: E402


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


# -- 9.7 long-context attention variants ---------------------------------------------------------

from kvlab.show.readings import long_context  # noqa: E402


def test_long_context_stream_both_outcomes():
    args = dict(window=32, sinks=4, kl_sinks=0.05, vocab=4096, t_end=511, mass_recent=0.07)
    usual = no_roles(long_context.stream_reading(kl_before=0.0, kl_window=0.06, loss_full=8.3, loss_window=8.31,
                                                 mass_first=0.008, **args))
    odd = no_roles(long_context.stream_reading(kl_before=0.3, kl_window=0.0, loss_full=5.0, loss_window=6.0,
                                               mass_first=0.2, **args))
    assert "rounding error" in usual and "becomes positive" in usual and "hardly moves" in usual
    assert "no attention sinks" in usual and "near $\\ln V" in usual
    assert "a bug to report" in odd and "carried no weight" in odd and "moved from 5.000" in odd
    assert "more than their share" in odd and "away from" in odd
    no_sinks = long_context.stream_reading(kl_before=0.0, kl_window=0.06, loss_full=8.3, loss_window=8.31,
                                           mass_first=0.008, **{**args, "kl_sinks": None})
    assert "sinks plus" not in no_sinks


def test_long_context_conventions_rerotation_both_outcomes():
    same = no_roles(long_context.convention_reading(0.05, 0.049, 0.07))
    apart = no_roles(long_context.convention_reading(0.05, 0.2, 0.07))
    assert "about equally far" in same and "different amounts" in apart
    big = no_roles(long_context.rerotation_reading(95, 1.22, 0.05, 0.04))
    small = no_roles(long_context.rerotation_reading(95, 0.05, 0.01, 0.01))
    assert "not rounding errors" in big and "low-frequency" in small


def test_long_context_quant_kivi_fewer_both_outcomes():
    good = no_roles(long_context.quant_reading(2, 32, 2.0, 4.5, 0.1, 0.3, 0.2, 0.1, 6.4))
    odd = no_roles(long_context.quant_reading(2, 16, 5.0, 4.5, 0.3, 0.1, 0.2, 0.4, 4.0))
    assert "only the outlier channels pay" in good and "within 10%" in good and "not 8 times" in good
    assert "expected to win" in odd and "misses one measured RMS error by 40%" in odd
    agree = no_roles(long_context.kivi_reading(2, 32, 1.8, 0.001, 0.98))
    disagree = no_roles(long_context.kivi_reading(2, 0, 6.0, 0.3, 0.5))
    assert "still agrees" in agree and "only 50%" in disagree
    exact = no_roles(long_context.fewer_reading(512, 0.047, 128, 0.046, 2e-8))
    lossy = no_roles(long_context.fewer_reading(512, 0.047, 128, 0.046, 1e-3))
    assert "is exact" in exact and "lost something" in lossy
