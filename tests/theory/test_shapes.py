"""kvlab.theory.shapes: the published shapes, their per-token bytes and parameter counts."""

import dataclasses

import pytest

from kvlab.theory.shapes import SHAPES, ModelShape


def test_kv_bytes_per_token_from_the_seeds():
    assert SHAPES["llama-3-8b"].kv_bytes_per_token() == 131_072  # seed 000 section 9.3
    assert SHAPES["llama-3-70b"].kv_bytes_per_token() == 327_680  # seed 004 appendix B.4
    assert SHAPES["llama-3.1-405b"].kv_bytes_per_token() == 516_096  # seed 004 B.3
    assert SHAPES["llama-2-13b"].kv_bytes_per_token() == 819_200  # seed 004 section 2.1: 0.82 MB
    assert SHAPES["deepseek-v2"].kv_bytes_per_token() == 69_120  # seed 004 section 2.1, MLA
    assert SHAPES["llama-3-8b"].kv_bytes_per_token(1) == 65_536


def test_shapes_have_the_issue_keys_and_seed_parameter_counts():
    assert {
        "llama-3-8b",
        "llama-3-70b",
        "llama-3.1-405b",
        "llama-2-13b",
        "mixtral-8x7b",
        "mistral-7b",
        "deepseek-v2",
        "llama-3.2-1b",
        "qwen2.5-0.5b",
        "smollm2-135m",
    } <= set(SHAPES)
    assert SHAPES["llama-3-8b"].params == 8.03e9
    assert SHAPES["llama-3-70b"].params == 70e9
    assert SHAPES["llama-3.1-405b"].params == 405e9
    assert SHAPES["mistral-7b"].window == 4096


def test_model_shape_rejects_nonsense():
    with pytest.raises(ValueError, match="layers must be an int >= 1"):
        ModelShape("x", 0, 8, 8, 64, 512, 1e6, 100)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelShape("x", 2, 8, 3, 64, 512, 1e6, 100)
    with pytest.raises(ValueError, match="bytes_per_element must be a finite number > 0"):
        SHAPES["llama-3-8b"].kv_bytes_per_token(0)


L8, L70, L405 = SHAPES["llama-3-8b"], SHAPES["llama-3-70b"], SHAPES["llama-3.1-405b"]


def test_counted_params_against_published_counts():
    # Published totals (the checkpoints' safetensors metadata) include the RMSNorm weights, which
    # the count leaves out: 2 per layer and 1 final, each of width hidden.
    for shape, published in ((L8, 8_030_261_248), (L70, 70_553_706_496)):
        norms = (2 * shape.layers + 1) * shape.hidden
        assert shape.counted_params() == published - norms
    assert round(L70.counted_params() / 1e9, 1) == 70.6
    for key in ("mixtral-8x7b", "deepseek-v2"):
        with pytest.raises(ValueError, match="counted_params"):
            SHAPES[key].counted_params()


# issue 22's bad calls of ModelShape: (fields replaced on a valid shape, error, a pattern naming the
# field)
BAD_FIELDS = {
    "params inf": (dict(params=float("inf")), ValueError, "params must be a finite number > 0"),
    "params True": (dict(params=True), TypeError, "params must be"),
    "window 0": (dict(window=0), ValueError, "window must be an int >= 1"),
    "layers 2.0": (dict(layers=2.0), TypeError, "layers must be an int"),
    "vocab str": (dict(vocab="100"), TypeError, "vocab must be an int"),
}


@pytest.mark.parametrize("name", BAD_FIELDS)
def test_model_shape_refuses_each_bad_field(name):
    fields, error, match = BAD_FIELDS[name]
    with pytest.raises(error, match=match):
        dataclasses.replace(SHAPES["llama-3-8b"], **fields)
