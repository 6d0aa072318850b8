"""Notebook 05b, the paged decode kernel (section 9.5): how far from fp64 attention its rounding
takes it.

- ``ROUNDING_TOLERANCE``, per dtype name, and ``rounding_tolerance``: the largest difference from
  fp64 attention that the kernel's rounding explains;
- ``explained_by_rounding``: whether a measured largest difference is within it.

Pure Python: a dtype is its name (``"float16"``) or a ``torch.dtype``, read by its name, so that a
reading decides without importing torch. The kernel's grid and records are in
``kvlab.lab.paged_kernel``.
"""

from __future__ import annotations

from kvlab._checks import nonnegative

# The kernel against fp64 attention. In fp16 and bf16 it rounds the softmax weights to the cache's
# dtype before the second product and rounds the output once: about two units of that dtype's
# roundoff (2^-10 and 2^-7) on outputs of order one. In fp32 its sums run in another order than
# the oracle's over up to thousands of terms: 1e-5, about 80 units of fp32 roundoff.
ROUNDING_TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def rounding_tolerance(dtype) -> float:
    """The largest difference from fp64 attention that the paged kernel's rounding in ``dtype``
    explains."""
    name = str(dtype).removeprefix("torch.")
    if name not in ROUNDING_TOLERANCE:
        raise ValueError(
            f"dtype must be one of {list(ROUNDING_TOLERANCE)} (or their torch.dtype), got {dtype!r}"
        )
    return ROUNDING_TOLERANCE[name]


def explained_by_rounding(difference: float, dtype) -> bool:
    """Whether a largest difference from fp64 attention is within what ``dtype`` rounding
    explains."""
    return nonnegative("difference", difference) <= rounding_tolerance(dtype)
