"""kvlab.show.readings.gemv: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re

from kvlab.show.readings import gemv as gemv_readings


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


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
