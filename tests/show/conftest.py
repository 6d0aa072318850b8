"""Shared by the readings' tests: measurements on every side of a comparison's edges."""

import math

import pytest

from kvlab.theory.agreement import edges

SPREAD = 0.05


def five_sides(predicted, spread=SPREAD):
    """(disagrees below, cannot tell below, agrees, cannot tell above, disagrees above): 10% past
    each disagreement edge of ``agreement.edges``, the geometric middle of each cannot-tell band,
    and the prediction itself."""
    lo_dis, lo_agree, hi_agree, hi_dis = edges(predicted, spread)
    return (
        0.9 * lo_dis,
        math.sqrt(lo_dis * lo_agree),
        predicted,
        math.sqrt(hi_agree * hi_dis),
        1.1 * hi_dis,
    )


@pytest.fixture
def five():
    """``five(predicted, spread=0.05)``: the five measurements of ``five_sides``."""
    return five_sides
