"""kvlab.cache.rope: rotations compose, and match Hugging Face's RoPE."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache.rope import rotary_of, rotate


@settings(max_examples=40, deadline=None)
@given(p=st.floats(-5000, 5000), d=st.floats(-5000, 5000), dim=st.sampled_from([2, 8, 64]))
def test_rotating_by_p_then_d_is_rotating_by_p_plus_d(p, d, dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    x = torch.randn(3, dim, dtype=torch.float64)
    twice = rotate(rotate(x, [p] * 3, inv_freq), [d] * 3, inv_freq)
    assert torch.allclose(twice, rotate(x, [p + d] * 3, inv_freq), atol=1e-9)
    assert torch.allclose(rotate(twice, [-(p + d)] * 3, inv_freq), x, atol=1e-9)  # and it undoes


SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def test_rotate_matches_hf_rope(llama):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x = torch.randn(2, 2, 7, 16)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [0, 0, 1, 2, 3, 4, 5]])
    cos, sin = llama.model.rotary_emb(x, pos)
    _, expected = apply_rotary_pos_emb(x, x, cos, sin)
    inv_freq, scaling = rotary_of(llama)
    assert torch.allclose(rotate(x, pos, inv_freq, scaling), expected, atol=1e-5)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "rotate positions": (
        lambda: rotate(torch.rand(1, 1, 4, 8), torch.arange(3), torch.rand(4)),
        ValueError,
        r"positions must be \[n\] or \[batch, n\] with n = 4",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
