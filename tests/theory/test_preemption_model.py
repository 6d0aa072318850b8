"""kvlab.theory.preemption (section 9.5): recompute against swap per token for every shape and
device, the worked numbers recomputed by hand, the verdict flipping at the model's own break-even,
and bad input.
"""

import dataclasses

import pytest

from kvlab.theory.preemption import preemption_per_token, recompute_or_swap
from kvlab.theory.shapes import SHAPES
from kvlab.theory.specs import LINKS, SPECS

L8, L70 = SHAPES["llama-3-8b"], SHAPES["llama-3-70b"]


@pytest.mark.parametrize("device", list(SPECS))
@pytest.mark.parametrize("key", list(SHAPES))
def test_recompute_or_swap_every_shape_and_device(key, device):
    shape, hw = SHAPES[key], SPECS[device]
    r = recompute_or_swap(shape, device)
    active = shape.active_params or shape.params
    k = shape.kv_bytes_per_token(2)
    beta = LINKS[hw.host_link].bytes_per_s_each_way
    assert r.recompute == pytest.approx(2 * active / hw.bf16_flops)
    # only the swap-in delays the request; the swap-out crosses the link too, overlapped by default
    assert r.swap_in == pytest.approx(k / beta) and r.swap_out == pytest.approx(k / beta)
    assert r.swap == pytest.approx(k / beta)
    assert r.ratio == pytest.approx(2 * (active / k) / (hw.bf16_flops / beta))
    assert r.cheaper == ("recompute" if 2 * active / k < hw.bf16_flops / beta else "swap")
    serial = recompute_or_swap(shape, device, overlap_swap_out=False)
    assert serial.swap == pytest.approx(2 * k / beta) and serial.ratio == pytest.approx(r.ratio / 2)
    assert serial.cheaper == ("recompute" if active / k < hw.bf16_flops / beta else "swap")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("key", ["llama-3-8b", "llama-2-13b", "smollm2-135m", "deepseek-v2"])
def test_recompute_or_swap_flips_at_its_break_even(key, overlap):
    """The model's own break-even F / beta, solved for a FLOP rate: 10% either side flips the
    verdict."""
    hw = SPECS["h100-sxm"]
    beta = LINKS[hw.host_link].bytes_per_s_each_way
    even = recompute_or_swap(
        SHAPES[key], hw, overlap_swap_out=overlap
    ).break_even_flops_per_link_byte
    for factor, verdict in ((0.9, "swap"), (1.1, "recompute")):
        moved = dataclasses.replace(hw, bf16_flops=factor * even * beta)
        r = recompute_or_swap(SHAPES[key], moved, overlap_swap_out=overlap)
        assert r.cheaper == verdict and r.ratio == pytest.approx(1 / factor)


def test_recompute_or_swap_worked_numbers():
    # Llama-3-8B on an H100 over PCIe Gen5: 8.03e9 / 131,072 = 61,264.0 params per KV byte against
    # 989.5e12 / 64e9 = 15,460.9 FLOP per link byte. Recompute costs 2 x 8.03e9 / 989.5e12 = 16.2 us
    # per token; the swap-in 131,072 / 64e9 = 2.05 us: swap is 7.92x cheaper on the request's path,
    # 3.96x when the swap-out (another 2.05 us) is not overlapped.
    r = recompute_or_swap(L8, "h100-sxm")
    assert r.params_per_kv_byte == pytest.approx(61_264.0, abs=0.1)
    assert r.flops_per_link_byte == pytest.approx(15_460.9, abs=0.1)
    assert r.recompute == pytest.approx(16.23e-6, rel=1e-3) and r.swap_in == pytest.approx(
        2.048e-6, rel=1e-3
    )
    assert r.ratio == pytest.approx(7.925, abs=1e-3) and r.cheaper == "swap"
    assert recompute_or_swap(L8, "h100-sxm", overlap_swap_out=False).ratio == pytest.approx(
        3.962, abs=1e-3
    )
    # GQA 70B: 2 x 70e9 / 327,680 = 427,246 -> about 27.6x in swap's favour
    assert recompute_or_swap(L70, "h100-sxm").ratio == pytest.approx(
        2 * 213_623.0 / 15_460.9, rel=1e-4
    )
    # MHA models carry many KV bytes per parameter: Llama-2-13B on a B200 (2,250 TFLOP/s over
    # 64 GB/s = 35,156) has 2 x 13e9 / 819,200 = 31,738 -> recompute still wins (0.90)
    r13 = recompute_or_swap(SHAPES["llama-2-13b"], "b200")
    assert (
        r13.ratio == pytest.approx(2 * 15_869.1 / 35_156.25, rel=1e-4)
        and r13.cheaper == "recompute"
    )
    # a mixture of experts multiplies each token by its active parameters only (Mixtral: 12.9e9)
    mix = recompute_or_swap(SHAPES["mixtral-8x7b"], "h100-sxm")
    assert mix.recompute == pytest.approx(2 * 12.9e9 / 989.5e12)
    # a slower link favours recompute in proportion
    slow = recompute_or_swap(L8, "h100-sxm", link="pcie4-x16")
    assert slow.ratio == pytest.approx(r.ratio / 2)
    # MFU scales the FLOP rate
    assert recompute_or_swap(L8, "h100-sxm", mfu=0.5).ratio == pytest.approx(2 * r.ratio)


def test_preemption_per_token_is_the_same_model_from_raw_numbers():
    r = recompute_or_swap(L8, "h100-sxm")
    raw = preemption_per_token(
        L8.params_per_token,
        L8.kv_bytes_per_token(2),
        SPECS["h100-sxm"].bf16_flops,
        LINKS["pcie5-x16"].bytes_per_s_each_way,
    )
    assert (raw.recompute, raw.swap_in, raw.ratio) == pytest.approx(
        (r.recompute, r.swap_in, r.ratio)
    )
    for name, bad in (
        ("params_per_token", 0),
        ("kv_bytes_per_token", -1),
        ("flops", float("nan")),
        ("link_bytes_per_s", 0),
    ):
        args = dict(params_per_token=1e9, kv_bytes_per_token=1e5, flops=1e15, link_bytes_per_s=6e10)
        with pytest.raises(ValueError, match=name):
            preemption_per_token(**{**args, name: bad})
    with pytest.raises(TypeError, match="overlap_swap_out must be a bool"):
        preemption_per_token(1e9, 1e5, 1e15, 6e10, overlap_swap_out=1)


def test_recompute_or_swap_bad_input():
    with pytest.raises(ValueError, match="unknown link 'nvlink9'"):
        recompute_or_swap(L8, "h100-sxm", link="nvlink9")
    with pytest.raises(ValueError, match="mfu"):
        recompute_or_swap(L8, "h100-sxm", mfu=0)
    with pytest.raises(ValueError, match="host_link"):
        recompute_or_swap(L8, dataclasses.replace(SPECS["h100-sxm"], host_link=None))
    with pytest.raises(TypeError, match="link must be"):
        recompute_or_swap(L8, "h100-sxm", link=64e9)
