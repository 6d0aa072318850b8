"""kvlab.theory.peers (section 9.2): every target is met at 1.1x of it and missed at 0.9x."""

import pytest

from kvlab.theory.peers import GENERATE_COMPILED, TARGETS, target_met


@pytest.mark.parametrize("factor, met", [(0.9, False), (1.0, True), (1.1, True)])
def test_target_met_on_both_sides(factor, met):
    assert ("static, compiled", GENERATE_COMPILED) in TARGETS
    assert all(target_met(factor * target, target) is met for target in TARGETS.values())
