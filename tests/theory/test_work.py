"""kvlab.theory.work: the closed forms of sections 9.1, 9.2 and 9.8 against counting, roofline and
arithmetic."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import SHAPES
from kvlab.theory import roofline
from kvlab.theory.shapes import ModelShape
from kvlab.theory.work import (
    attention_work,
    break_even_tokens,
    pass_time,
    positions_processed,
    request_time,
    step_work,
)


def _brute_force(P, G, cached):
    positions = pairs = 0
    for j in range(G):
        n = P + j  # the sequence length when the j-th token is predicted
        if cached and j > 0:
            positions += 1
            pairs += n
        else:
            positions += n
            pairs += n * n
    return positions, pairs


@settings(max_examples=200, deadline=None)
@given(P=st.integers(1, 3000), G=st.integers(0, 600), cached=st.booleans())
def test_closed_forms_equal_counting(P, G, cached):
    assert (positions_processed(P, G, cached), attention_work(P, G, cached)) == _brute_force(
        P, G, cached
    )


@settings(max_examples=100, deadline=None)
@given(P=st.integers(1, 500), G=st.integers(1, 200), a=st.floats(0, 1), b=st.floats(0, 1e-3))
def test_request_time_sums_its_passes(P, G, a, b):
    """The two-pass model of a request is the sum of its passes: naive, P + j tokens each; cached,
    one pass over P then G - 1 one-token passes."""
    naive = sum(pass_time(P + j, a, b) for j in range(G))
    cached = pass_time(P, a, b) + (G - 1) * pass_time(1, a, b)
    assert request_time(P, G, a, b) == pytest.approx(naive, rel=1e-9, abs=1e-12)
    assert request_time(P, G, a, b, cached=True) == pytest.approx(cached, rel=1e-9, abs=1e-12)


def test_closed_forms_reject_bad_sizes():
    with pytest.raises(ValueError, match="P must be an int >= 1"):
        positions_processed(0, 5)
    with pytest.raises(TypeError, match="G must be an int"):
        attention_work(4, 2.5)


def test_break_even_tokens():
    assert break_even_tokens(10.0, 2e-3) == pytest.approx(5000)  # seconds against milliseconds
    assert break_even_tokens(3.0, 0.0) == math.inf and break_even_tokens(3.0, -1e-3) == math.inf
    with pytest.raises(ValueError, match="compile_seconds"):
        break_even_tokens(-1.0, 1e-3)
    with pytest.raises(TypeError, match="step_gain"):
        break_even_tokens(1.0, "fast")


@pytest.mark.parametrize(
    "key", ["llama-3-8b", "llama-2-13b", "mistral-7b", "deepseek-v2", "qwen2.5-0.5b"]
)
@pytest.mark.parametrize("batch,context", [(1, 1), (3, 517), (32, 8192), (7, 131072)])
@pytest.mark.parametrize("w", [1, 2, 4])
def test_step_work_equals_roofline(key, batch, context, w):
    shape = SHAPES[key]
    for method in ("cached", "static", "paged"):
        work = step_work(shape, batch, context, method, w, w)
        assert work.weights_read == roofline.step_bytes(shape, batch, context, w, w).weights
        assert work.kv_read == roofline.step_bytes(shape, batch, context, w, w).kv
        assert work.kv_written == batch * roofline.kv_bytes_per_token(shape, w)
        assert work.flops == roofline.step_flops(shape, batch, context).total


@st.composite
def shapes(draw):
    kv = draw(st.integers(1, 16))
    return ModelShape(
        "random",
        draw(st.integers(1, 96)),
        kv * draw(st.integers(1, 8)),
        kv,
        draw(st.sampled_from([32, 64, 80, 128])),
        draw(st.integers(64, 16384)),
        float(draw(st.integers(10**6, 10**12))),
        draw(st.integers(100, 300000)),
        window=draw(st.one_of(st.none(), st.integers(1, 8192))),
    )


@settings(max_examples=200, deadline=None)
@given(
    shape=shapes(),
    batch=st.integers(1, 512),
    context=st.integers(1, 10**6),
    w=st.sampled_from([1, 2, 4]),
)
def test_step_work_equals_roofline_for_random_shapes(shape, batch, context, w):
    work = step_work(shape, batch, context, "cached", w, w)
    read = roofline.step_bytes(shape, batch, context, w, w)
    assert (work.weights_read, work.kv_read) == (read.weights, read.kv)
    assert work.kv_written == batch * roofline.kv_bytes_per_token(shape, w)
    assert work.flops == roofline.step_flops(shape, batch, context).total
    assert 0 <= work.kv_share <= 1


@pytest.mark.parametrize("key", ["llama-3-8b", "mistral-7b"])
@pytest.mark.parametrize("batch,context", [(1, 1), (2, 37), (3, 5000)])
def test_naive_step_flops_from_the_definition(key, batch, context):
    shape = SHAPES[key]
    n = context + 1
    attention = 4 * shape.layers * shape.q_heads * shape.head_dim
    # Position i (1-based) of the full pass attends to min(i, window) keys; every position does 2P.
    expected = batch * sum(
        2 * shape.params + attention * min(i, shape.window or i) for i in range(1, n + 1)
    )
    work = step_work(shape, batch, context, "naive", 2, 2)
    assert work.flops == pytest.approx(expected, rel=1e-12)
    assert (work.kv_read, work.kv_written) == (0, 0)
    assert work.weights_read == roofline.step_bytes(shape, batch, context).weights


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "work counter cached": (
        lambda: positions_processed(4, 2, cached="yes"),
        TypeError,
        "cached must be",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {
    "positions_processed P": (lambda x: positions_processed(x, 2), "P", 1),
    "attention_work G": (lambda x: attention_work(4, x), "G", 0),
}


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


def test_break_even_tokens_refuses_infinite_and_boolean_times():
    with pytest.raises(ValueError, match="compile_seconds must be a finite number"):
        break_even_tokens(math.inf, 1e-3)
    with pytest.raises(ValueError, match="step_gain must be a finite number"):
        break_even_tokens(1.0, math.inf)
    with pytest.raises(TypeError, match="compile_seconds must be"):
        break_even_tokens(True, 1e-3)
