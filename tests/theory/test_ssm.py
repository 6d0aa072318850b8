"""kvlab.theory.ssm: the work and depth of every scan order, simulated, and the cache arithmetic of 9.6.
"""

import math

import pytest
from hypothesis import given, settings, strategies as st

import kvlab
from kvlab.theory.ssm import attention_kv_bytes, breakeven_context, hybrid_cache_bytes, scan_depth, scan_work


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
    assert per_layer == 1536 * (16 + 4) * 2
    # The same width in attention: 768 KV elements per token for a key and for a value.
    assert breakeven_context(attention_kv_bytes(1, 768), per_layer) == 20
    assert hybrid_cache_bytes(100, 8, 8, 10, 50) == 8000
    assert hybrid_cache_bytes(100, 8, 0, 10, 50) == 400
    assert hybrid_cache_bytes(100, 8, 2, 10, 50, batch=3) == 3 * (2000 + 300)
    with pytest.raises(ValueError, match=r"attention_layers must be in \[0, layers=8\]"):
        hybrid_cache_bytes(100, 8, 9, 10, 50)
    with pytest.raises(ValueError, match="context must be an int >= 0"):
        attention_kv_bytes(-1, 8)


def _blelloch_counts(s):
    """Rounds and operations of Blelloch's scan, simulated on a list (the oracle for the closed forms)."""
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


@pytest.mark.parametrize("s,c", [(2, 1), (7, 3), (64, 64), (100, 16), (1000, 7), (4096, 64), (5, 64)])
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
    "ssm infinite state": (lambda: breakeven_context(4.0, math.inf), ValueError,
                           r"state_bytes must be a finite number > 0"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()

# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {
    "ssm.scan_work length": (lambda x: scan_work(x, "parallel"), "length", 1),
}


@pytest.mark.parametrize("name", INTEGER_ARGUMENTS)
@settings(max_examples=12, deadline=None)
@given(value=st.one_of(st.integers(max_value=-1), st.sampled_from([0.5, 2.0, "3", None, True, math.nan])))
def test_integer_arguments_refuse_what_is_not_an_int_in_range(name, value):
    call, argument, low = INTEGER_ARGUMENTS[name]
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return
    with pytest.raises(TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError,
                       match=argument):
        call(value)
