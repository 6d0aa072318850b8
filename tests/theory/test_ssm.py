"""kvlab.theory.ssm: the work and depth of every scan order, simulated, and the cache arithmetic of
9.6."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.theory import ssm
from kvlab.theory.ssm import (
    attention_kv_bytes,
    breakeven_context,
    hybrid_cache_bytes,
    scan_depth,
    scan_work,
)


def test_scan_counts():
    assert [scan_depth(n, "parallel") for n in (1, 2, 3, 4, 5, 1024)] == [0, 1, 2, 2, 3, 10]
    assert scan_depth(1000, "sequential") == 1000
    assert scan_depth(10, "chunked", 4) == 2 * 3 + 2
    # Hillis-Steele on 8 tokens: rounds of 7, 6 and 4 compositions, then 8 applications.
    assert scan_work(8, "parallel") == 7 + 6 + 4 + 8
    assert scan_work(10, "chunked", 4) == 2 * (3 + 2 + 4) + (1 + 2)


def test_budget_arithmetic_and_its_checks():
    shape = kvlab.theory.shapes.SSM_SHAPES["mamba-130m"]
    per_layer = shape.state_bytes_per_layer(2)
    # The convolution keeps k_conv - 1 = 3 past inputs per channel (vLLM's conv state), not 4.
    assert per_layer == 1536 * (16 + 3) * 2 == 58_368
    # transformers' cache keeps the whole window of k_conv inputs: the 61,440 B of a larger count.
    assert shape.state_bytes_per_layer(2, conv_inputs=4) == 1536 * (16 + 4) * 2 == 61_440
    # The same width in attention: 768 KV elements per token for a key and for a value.
    assert breakeven_context(attention_kv_bytes(1, 768), per_layer) == 19
    # Mamba-2 hybrids: n = 128 and the SSM state in fp32 put the break-even in the hundreds.
    mamba2_like = kvlab.theory.shapes.SSMShape("mamba2-like", 1, 768, 128, 1, conv_kernel=4)
    assert (
        breakeven_context(attention_kv_bytes(1, 768), mamba2_like.state_bytes_per_layer(2, 4)) > 200
    )
    for bad in (2, 5, 3.0):
        with pytest.raises((ValueError, TypeError), match="conv_inputs"):
            shape.state_bytes_per_layer(2, conv_inputs=bad)
    assert hybrid_cache_bytes(100, 8, 8, 10, 50) == 8000
    assert hybrid_cache_bytes(100, 8, 0, 10, 50) == 400
    assert hybrid_cache_bytes(100, 8, 2, 10, 50, batch=3) == 3 * (2000 + 300)
    with pytest.raises(ValueError, match=r"attention_layers must be in \[0, layers=8\]"):
        hybrid_cache_bytes(100, 8, 9, 10, 50)
    with pytest.raises(ValueError, match="context must be an int >= 0"):
        attention_kv_bytes(-1, 8)


def _blelloch_counts(s):
    """Rounds and operations of Blelloch's scan, simulated on a list (the oracle for the closed
    forms)."""
    n = 1 << math.ceil(math.log2(s)) if s > 1 else 1
    rounds = ops = 0
    half = 1
    while half < n:
        rounds += 1
        ops += len(range(2 * half - 1, n, 2 * half))
        half *= 2
    half = n // 2
    while half >= 1:
        rounds += 1
        ops += len(range(2 * half - 1, n, 2 * half))
        half //= 2
    return rounds, ops + 2 * s  # own map composed in, then applied to the initial state


def _two_level_counts(s, c):
    chunks = [min(c, s - start) for start in range(0, s, c)]
    hs_rounds = max(math.ceil(math.log2(n)) for n in chunks)
    hs_ops = sum(sum(n - 2**r for r in range(math.ceil(math.log2(n)))) for n in chunks)
    return hs_rounds + len(chunks) - 1, hs_ops + (len(chunks) - 1) + s


@pytest.mark.parametrize("s", [2, 3, 7, 64, 100, 1000, 4096])
def test_blelloch_depth_and_work(s):
    rounds, ops = _blelloch_counts(s)
    assert scan_depth(s, "blelloch") == rounds == 2 * math.ceil(math.log2(s))
    assert scan_work(s, "blelloch") == ops
    assert scan_work(s, "blelloch") <= 6 * s  # O(s), against Hillis-Steele's s log2 s
    if s >= 64:
        assert scan_work(s, "blelloch") < scan_work(s, "parallel")


@pytest.mark.parametrize(
    "s,c", [(2, 1), (7, 3), (64, 64), (100, 16), (1000, 7), (4096, 64), (5, 64)]
)
def test_two_level_depth_and_work(s, c):
    rounds, ops = _two_level_counts(s, c)
    assert scan_depth(s, "two-level", c) == rounds
    assert scan_work(s, "two-level", c) == ops
    # the serial-chunk scan pays log2 c + 1 rounds per chunk; the two-level scan log2 c once
    if s > c > 1:
        assert scan_depth(s, "two-level", c) < scan_depth(s, "chunked", c)


def test_scan_order_arguments():
    assert scan_depth(4096, "two-level", 64) == 6 + 63
    with pytest.raises(ValueError, match="chunk_size applies"):
        scan_depth(100, "blelloch", 16)
    with pytest.raises(ValueError, match="method must be one of"):
        scan_work(100, "brent-kung")


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "ssm infinite state": (
        lambda: breakeven_context(4.0, math.inf),
        ValueError,
        r"state_bytes must be a finite number > 0",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {"ssm.scan_work length": (lambda x: scan_work(x, "parallel"), "length", 1)}


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


# --- the cost model the scan reading decides with (issue 21, item 4)
# ------------------------------------


def test_scan_time_is_rounds_plus_compositions():
    tau, gamma, elements = 25.3e-6, 3.74e-6 / 1024, 1024  # the fit: gamma * E = 3.74 µs
    seq = ssm.scan_time(1024, "sequential", None, tau, gamma, elements)
    par = ssm.scan_time(1024, "parallel", None, tau, gamma, elements)
    assert seq == pytest.approx(1024 * tau + 1024 * gamma * elements)
    assert par == pytest.approx(
        10 * tau + 10_241 * gamma * elements
    )  # ceil(log2 s) rounds, s log2 s work
    assert seq == pytest.approx(29.7e-3, rel=0.01) and par == pytest.approx(38.6e-3, rel=0.01)
    assert par / seq == pytest.approx(1.30, abs=0.01)
    assert (
        ssm.fastest_order(1024, tau, gamma, elements, methods=("sequential", "parallel"))
        == "sequential"
    )
    with pytest.raises(ValueError, match="round_s must be a finite number > 0"):
        ssm.scan_time(1024, "parallel", None, 0.0, gamma, elements)


@given(st.integers(2, 1 << 14))
@settings(max_examples=60, deadline=None)
def test_parallel_break_even_is_where_the_model_changes_its_winner(s):
    # The boundary from the model's own counts, and scan_time on both sides of it.
    ratio = ssm.parallel_break_even(s)
    gamma, elements = 1e-9, 64
    for factor, winner in ((0.9, "sequential"), (1.1, "parallel")):
        tau = factor * ratio * gamma * elements
        assert (
            ssm.fastest_order(s, tau, gamma, elements, methods=("sequential", "parallel")) == winner
        )
    log = math.log2(s)
    if s >= 64:  # about (s log2 s - s) / (s - log2 s) once ceil(log2 s) is close to log2 s
        assert ratio == pytest.approx((s * log - s) / (s - log), rel=0.15)


def test_parallel_break_even_of_short_sequences():
    assert (
        ssm.parallel_break_even(1) == 0.0 and ssm.parallel_break_even(2) == 1.0
    )  # (3 - 2) / (2 - 1)
    assert ssm.parallel_break_even(1024) == pytest.approx((10_241 - 1024) / (1024 - 10))


def test_step_slope_flatness_and_recall_models():
    slope = ssm.attention_step_slope(2048, 10e9)
    assert slope == pytest.approx(3 * 2048 / 10e9)
    edge = ssm.FLAT_SHARE * slope
    assert (
        ssm.is_flat(0.9 * edge, slope)
        and ssm.is_flat(-0.9 * edge, slope)
        and not ssm.is_flat(1.1 * edge, slope)
    )
    assert ssm.recall_bound(8, 64) == 1 - 8 / 64 and ssm.recall_bound(16, 8) == 0.0
    assert ssm.at_recall_bound(0.875, 8, 64) and not ssm.at_recall_bound(
        0.875 + 2 * ssm.RANK_TOLERANCE, 8, 64
    )
    tol = ssm.sampling_tolerance(2000, 8)
    assert tol == pytest.approx(3 * math.sqrt(2 / 2000) + 8 / 2000)
    assert ssm.sampled_agrees(0.875 + 0.9 * tol, 0.875, 2000, 8) and not ssm.sampled_agrees(
        0.875 + 1.1 * tol, 0.875, 2000, 8
    )
    assert ssm.lookup_exact(0.9 * ssm.LOOKUP_TOLERANCE) and not ssm.lookup_exact(
        1.1 * ssm.LOOKUP_TOLERANCE
    )
