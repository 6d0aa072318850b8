"""kvlab.cache.scan: every order of the affine scan gives the sequential scan's states."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cache.recurrence import SEED_INPUTS, SEED_RECURRENCE
from kvlab.cache.scan import affine_scan


def test_seed_recurrence_is_a_scan_in_every_order():
    r = SEED_RECURRENCE
    xs = torch.tensor(SEED_INPUTS, dtype=torch.float64)
    a = torch.tensor(r.decay, dtype=torch.float64).expand(len(xs), -1)
    b = xs[:, None] * torch.tensor(r.gain, dtype=torch.float64)
    for method, chunk in (("sequential", None), ("parallel", None), ("chunked", 1)):
        states = affine_scan(a, b, method=method, chunk_size=chunk)
        assert states.tolist() == [[2.0, 4.0], [2.0, 3.0]], method
    assert (r.input_map(2) @ xs).tolist() == [2.0, 3.0]


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 70), chunk=st.integers(1, 20), seed=st.integers(0, 1000))
def test_new_scan_orders_match_the_sequential_scan(length, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(length, 3, 2, generator=g, dtype=torch.float64)
    b = torch.randn(length, 3, 2, generator=g, dtype=torch.float64)
    h = torch.randn(3, 2, generator=g, dtype=torch.float64)
    ref = affine_scan(a, b, h, "sequential")
    torch.testing.assert_close(affine_scan(a, b, h, "blelloch"), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        affine_scan(a, b, h, "two-level", chunk_size=chunk), ref, rtol=1e-12, atol=1e-12
    )


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "affine_scan int": (
        lambda: affine_scan(torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long)),
        TypeError,
        "floating dtype",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
