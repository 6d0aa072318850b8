"""The roofline floor of a paged prefill attention launch (notebooks 06 and 11): the larger of its
FLOPs at the bf16 rate and its bytes at the HBM bandwidth, from ``prefill_attention_work``'s
figures.
"""

import pytest

from kvlab.theory.prefill_attention import attention_floor, prefill_attention_work
from kvlab.theory.specs import SPECS


def test_the_floor_is_the_larger_ceiling():
    hw = SPECS["h100-sxm"]
    decode = prefill_attention_work([1] * 32, [4096] * 32, 32, 8, 128, 2, 16)
    floor = attention_floor(decode, hw)
    assert floor.memory_s == pytest.approx(decode.tile_bytes / hw.hbm_bytes_per_s)
    assert floor.compute_s == pytest.approx(decode.flops / hw.bf16_flops)
    assert (
        floor.bound == "memory" and floor.seconds == floor.memory_s
    )  # decode: 4 FLOP per 2 bytes per group
    long = prefill_attention_work([8192], [8192], 32, 8, 128, 2, 16)
    assert attention_floor(long, hw, tiled=False).bound == "compute"
    rows = prefill_attention_work([8192], [8192], 32, 8, 128, 2, 16, tokens_per_tile=1)
    assert attention_floor(rows, hw).seconds > attention_floor(long, hw).seconds
    assert attention_floor(long, "h100-sxm") == attention_floor(long, hw)
    with pytest.raises(TypeError, match="PrefillWork"):
        attention_floor(1.0, hw)
