"""kvlab.theory.matmul: the counts of a matrix product and the two-segment roofline fit (section
9.3)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.theory.matmul import (
    batch_at_intensity,
    compare_with_roofline,
    fit_roofline,
    matmul_bytes,
    matmul_flops,
    matmul_intensity,
    ridge_intensity,
    roofline_time,
)


def test_counts_equal_the_formulas():
    n, K, N, w = 3, 4096, 6144, 4
    assert matmul_flops(n, K, N) == 2 * 3 * 4096 * 6144
    assert matmul_bytes(n, K, N, w) == (4096 * 6144 + 3 * 4096 + 3 * 6144) * 4
    assert matmul_intensity(n, K, N, w) == matmul_flops(n, K, N) / matmul_bytes(n, K, N, w)


def test_gemv_intensity_is_about_2_over_w_and_bounded():
    # batch one: 2KN FLOP on about KN w bytes, so 2 / w FLOP/B (1 for bf16, 0.5 for fp32)
    assert matmul_intensity(1, 8192, 8192, 2) == pytest.approx(1.0, rel=1e-3)
    assert matmul_intensity(1, 4096, 6144, 4) == pytest.approx(0.5, rel=1e-3)
    # however large n grows, at most 2KN / ((K + N) w)
    ceiling = 2 * 8192 * 8192 / ((8192 + 8192) * 2)
    assert matmul_intensity(10**9, 8192, 8192, 2) < ceiling
    assert matmul_intensity(10**9, 8192, 8192, 2) == pytest.approx(ceiling, rel=1e-4)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 10**5),
    K=st.integers(1, 20_000),
    N=st.integers(1, 20_000),
    w=st.sampled_from([1, 2, 4]),
)
def test_batch_at_intensity_inverts_the_intensity(n, K, N, w):
    assert batch_at_intensity(matmul_intensity(n, K, N, w), K, N, w) == pytest.approx(n, rel=1e-9)


def test_batch_at_intensity_beyond_reach_is_infinite():
    # the 8192 x 8192 bf16 ceiling is 4096 FLOP/B: the H100 ridge (295) is reached, 5000 never is
    assert batch_at_intensity(295, 8192, 8192, 2) == pytest.approx(
        295 * 2 * 8192**2 / (2 * 8192**2 - 295 * 2 * 16384)
    )
    assert batch_at_intensity(5000, 8192, 8192, 2) == math.inf


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (lambda: matmul_flops(0, 8, 8), ValueError, "n must be an int >= 1"),
        (lambda: matmul_flops(1.5, 8, 8), TypeError, "n must be an int"),
        (lambda: matmul_bytes(1, -8, 8, 2), ValueError, "K must be an int >= 1"),
        (lambda: matmul_bytes(1, 8, 8, 0), ValueError, "element_size"),
        (lambda: matmul_intensity(1, 8, True, 2), TypeError, "N must be an int"),
        (lambda: batch_at_intensity(0, 8, 8, 2), ValueError, "intensity"),
    ],
)
def test_bad_input_names_the_argument(call, kind, words):
    with pytest.raises(kind) as info:
        call()
    assert words in str(info.value)


@settings(max_examples=40, deadline=None)
@given(bw=st.floats(1e9, 1e12), ridge=st.floats(2.0, 300.0), noise_seed=st.integers(0, 2**16))
def test_fit_roofline_recovers_both_segments(bw, ridge, noise_seed):
    rng = random.Random(noise_seed)
    xs = [ridge * 2.0**e for e in range(-5, 5)]  # five points each side of the knee
    ys = [min(bw * x, bw * ridge) * (1 + rng.uniform(-0.05, 0.05)) for x in xs]
    fit = fit_roofline(xs, ys)
    assert fit.bandwidth == pytest.approx(bw, rel=0.06)
    assert fit.peak == pytest.approx(bw * ridge, rel=0.06)
    assert fit.knee == pytest.approx(ridge, rel=0.12)


def test_fit_roofline_is_not_anchored_to_the_first_point():
    xs = [0.5, 1, 2, 4, 8, 16, 32, 64]
    ys = [min(10e9 * x, 40e9) for x in xs]
    # one fast first point moves an extrapolation from it (to 2.7) much more than the fit
    ys[0] *= 1.5
    fit = fit_roofline(xs, ys)
    anchored = max(ys) / (ys[0] / xs[0])
    assert anchored < 3 and 3.3 <= fit.knee <= 4.5


def test_fit_roofline_without_a_bend_has_no_knee():
    xs = [1, 2, 4, 8, 16]
    assert math.isnan(fit_roofline(xs, [3e9 * x for x in xs]).knee)
    assert math.isnan(fit_roofline(xs, [5e10] * 5).knee)
    with pytest.raises(ValueError, match="at least two points"):
        fit_roofline([1], [1])


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "gemv infinite intensity": (
        lambda: batch_at_intensity(math.inf, 64, 64, 2),
        ValueError,
        r"intensity must be a finite number",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {"gemv.matmul_flops n": (lambda x: matmul_flops(x, 8, 8), "n", 1)}


@pytest.mark.parametrize("name", INTEGER_ARGUMENTS)
@settings(max_examples=12, deadline=None)
@given(
    value=st.one_of(
        st.integers(max_value=-1), st.sampled_from([0.5, 2.0, "3", None, True, math.nan])
    )
)
def test_integer_arguments_refuse_what_is_not_an_int_in_range(name, value):
    call, argument, low = INTEGER_ARGUMENTS[name]
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return
    with pytest.raises(
        TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError,
        match=argument,
    ):
        call(value)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 4096), bandwidth=st.floats(1e9, 1e13), peak=st.floats(1e10, 1e16))
def test_roofline_time_switches_at_the_ridge(n, bandwidth, peak):
    """Bytes over bandwidth below the ridge, FLOPs over peak above it; the two meet where the
    product's intensity equals ridge_intensity."""
    K, N, w = 1024, 2048, 2
    t = roofline_time(n, K, N, w, bandwidth, peak)
    by_bytes, by_flops = matmul_bytes(n, K, N, w) / bandwidth, matmul_flops(n, K, N) / peak
    assert t == max(by_bytes, by_flops)
    assert (by_bytes >= by_flops) == (
        matmul_intensity(n, K, N, w) <= ridge_intensity(peak, bandwidth) * (1 + 1e-12)
    ) or math.isclose(by_bytes, by_flops, rel_tol=1e-9)


def test_compare_with_roofline_and_bad_ceilings():
    t = roofline_time(1, 4096, 4096, 4, 1e10, 1e11)
    assert compare_with_roofline(t, 1, 4096, 4096, 4, 1e10, 1e11).agrees
    assert compare_with_roofline(3 * t, 1, 4096, 4096, 4, 1e10, 1e11).outcome == "above"
    assert ridge_intensity(1e11, 1e10) == 10
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="bandwidth must be a finite number > 0"):
            roofline_time(1, 8, 8, 2, bad, 1e9)
    with pytest.raises(TypeError, match="peak"):
        ridge_intensity("1e9", 1e9)
