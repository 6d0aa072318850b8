"""kvlab.theory.paging (section 9.5): the per-request waste formula worked by hand, where it stops
predicting a saving, and the bound on paged waste on both sides of its value."""

from types import SimpleNamespace

import pytest

from kvlab.theory.paging import (
    gather_overhead_s,
    paging_saves,
    predicted_waste,
    waste_bound,
    within_waste_bound,
)


def req(prompt, output):
    return SimpleNamespace(prompt=[0] * prompt, max_new_tokens=output)


def test_predicted_waste_by_hand():
    # P 4, G 2: 4 then 5 tokens held, 9 in all; paged (blocks of 4) in 4 + 8 slots, reserve-max in 8
    # + 8
    trace = [req(4, 2)]
    assert predicted_waste(trace, "paged", 4, 8) == pytest.approx(1 - 9 / 12)
    assert predicted_waste(trace, "reserve-max", 4, 8) == pytest.approx(1 - 9 / 16)
    assert predicted_waste([], "paged", 4, 8) == 0.0
    with pytest.raises(ValueError, match="policy must be one of"):
        predicted_waste(trace, "reserve-estimate", 16, 96)


def test_paging_saves_until_blocks_reach_max_len():
    trace, max_len = [req(8, 8), req(3, 12), req(15, 1)], 32
    assert paging_saves(trace, 16, max_len) and paging_saves(trace, int(0.9 * max_len), max_len)
    assert not paging_saves(trace, max_len, max_len) and not paging_saves(
        trace, int(1.1 * max_len) + 1, max_len
    )


def test_waste_bound_flips_at_its_value():
    bound = waste_bound(128, 168.0)
    assert bound == pytest.approx(127 / 295) and waste_bound(1, 50.0) == 0.0
    assert within_waste_bound(0.9 * bound, 128, 168.0) and not within_waste_bound(
        1.1 * bound, 128, 168.0
    )
    with pytest.raises(ValueError, match="mean_tokens must be a finite number >= 0"):
        waste_bound(16, -1.0)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        waste_bound(0, 1.0)


def test_gather_overhead_is_two_read_write_passes():
    assert gather_overhead_s(1e6, 2e9) == pytest.approx(2 * 1e6 / 2e9)  # one copy: read + write
    for args, name in [((0, 1e9), "kv_bytes"), ((1e6, -1.0), "copy_bytes_per_s")]:
        with pytest.raises(ValueError, match=name):
            gather_overhead_s(*args)
