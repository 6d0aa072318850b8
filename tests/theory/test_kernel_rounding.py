"""kvlab.theory.kernel_rounding (section 9.5): each dtype's tolerance on both sides of its edge, by
name or by torch.dtype, and a dtype without one refused."""

import pytest

from kvlab.theory.kernel_rounding import (
    ROUNDING_TOLERANCE,
    explained_by_rounding,
    rounding_tolerance,
)


@pytest.mark.parametrize("name", sorted(ROUNDING_TOLERANCE))
def test_explained_by_rounding_on_both_sides_of_each_tolerance(name):
    tol = rounding_tolerance(name)
    assert explained_by_rounding(0.9 * tol, name) and not explained_by_rounding(1.1 * tol, name)


def test_a_torch_dtype_reads_by_its_name():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert rounding_tolerance(dtype) == ROUNDING_TOLERANCE[str(dtype).removeprefix("torch.")]
    with pytest.raises(ValueError, match="dtype must be one of"):
        explained_by_rounding(0.0, torch.float64)


def test_a_dtype_without_a_tolerance_is_refused():
    with pytest.raises(ValueError, match=r"dtype must be one of .*got 'float64'"):
        rounding_tolerance("float64")
