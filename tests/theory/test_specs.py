"""kvlab.theory.specs: the accelerators and links as their vendors give them, and what a driver
exposes."""

import pytest

from kvlab.theory import roofline as rf
from kvlab.theory.specs import LINKS, SPECS, exposed_memory, link, spec


def test_specs_have_every_device_and_field():
    assert set(SPECS) == {"h100-sxm", "h200", "b200", "mi300x", "a100-80gb", "l4", "t4"}
    for key, s in SPECS.items():
        assert s.hbm_bytes > 0 and s.hbm_bytes_per_s > 0 and s.bf16_flops > 0 and s.dies >= 1, key
        assert s.die_bytes_per_s * s.dies == pytest.approx(s.hbm_bytes_per_s, rel=0.02), key
        assert s.source
    # Seed 004 appendix B.4: ridge points 295, 281 and 247 FLOP/B.
    assert round(SPECS["h100-sxm"].ridge_point) == 295
    assert round(SPECS["b200"].ridge_point) == 281
    assert round(SPECS["mi300x"].ridge_point) == 247


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match="unknown device 'h300'.*h100-sxm"):
        spec("h300")


GIB = 2**30


def test_exposed_memory_against_the_marketed_figures():
    h200, h100 = exposed_memory("h200"), exposed_memory("h100-sxm")
    assert h200.hbm_bytes == 143_771 * 2**20 and round(h200.hbm_bytes / GIB, 1) == 140.4
    assert round(h200.hbm_bytes / 1e9, 1) == 150.8  # "about 150e9 bytes", not 141e9
    assert round(h100.hbm_bytes / GIB, 1) == 79.6 and round(h100.hbm_bytes / 1e9, 1) == 85.5
    assert SPECS["h200"].hbm_bytes == 141e9  # the seed's decimal constant stays
    with pytest.raises(ValueError, match="not recorded"):
        exposed_memory("b200")
    with pytest.raises(ValueError, match="unknown device"):
        exposed_memory("h300")


def test_nvlink_one_way_fetch_takes_twice_the_bidirectional_figure():
    nvlink = link("nvlink4")
    assert nvlink.bytes_per_s_both_ways == 900e9 and nvlink.bytes_per_s_each_way == 450e9
    assert LINKS["pcie5-x16"].bytes_per_s_each_way == 64e9  # PCIe is quoted per direction
    cache = 41_943_040_000  # the 128k Llama-3-70B cache of seed 004, appendix B.5
    seed = rf.transfer_time(cache, 900e9, codec=4)
    one_way = rf.transfer_time(cache, nvlink.bytes_per_s_each_way, codec=4)
    assert round(seed * 1e3) == 12 and one_way == pytest.approx(2 * seed)
    assert round(one_way * 1e3, 1) == 23.3
    with pytest.raises(ValueError, match="unknown link"):
        link("nvlink")


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("hbm_bytes", -1, ValueError),
        ("hbm_bytes_per_s", float("inf"), ValueError),
        ("dies", 1.5, TypeError),
        ("bf16_flops", True, TypeError),
    ],
)
def test_accelerator_refuses_bad_figures(field, value, error):
    """issue 22: a negative memory or an infinite bandwidth is refused, naming the field."""
    import dataclasses

    with pytest.raises(error, match=field):
        dataclasses.replace(spec("h100-sxm"), **{field: value})
