"""The formulas behind the book's teaching corrections (issue 12), each against arithmetic written
out here: recompute against swap, real memory capacities, one-way link rates, the scope of design
rule 3, compile break-even, and the Blelloch and two-level scans (swap's copy size is tested in
tests/lab/test_lab_paged_attention.py)."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import SHAPES, SPECS
from kvlab.theory import roofline as rf
from kvlab.decode import CompileBreakEven, DecodeProfile, break_even_tokens, compile_break_even
from kvlab.theory.specs import LINKS, exposed_memory, link
from kvlab.cache import ssm

GIB = 2**30
L8, L70, L405 = SHAPES["llama-3-8b"], SHAPES["llama-3-70b"], SHAPES["llama-3.1-405b"]


# ------------------------------------------------------------------ recompute against swap (9.5)


@pytest.mark.parametrize("device", list(SPECS))
@pytest.mark.parametrize("key", list(SHAPES))
def test_recompute_or_swap_every_shape_and_device(key, device):
    shape, hw = SHAPES[key], SPECS[device]
    r = rf.recompute_or_swap(shape, device)
    active = shape.active_params or shape.params
    k = shape.kv_bytes_per_token(2)
    beta = LINKS[hw.host_link].bytes_per_s_each_way
    assert r.recompute == pytest.approx(2 * active / hw.bf16_flops)
    assert r.swap == pytest.approx(2 * k / beta)
    # recompute wins only when params per KV byte is below FLOP/s per link byte/s
    assert r.ratio == pytest.approx((active / k) / (hw.bf16_flops / beta))
    assert r.cheaper == ("recompute" if active / k < hw.bf16_flops / beta else "swap")


def test_recompute_or_swap_worked_numbers():
    # Llama-3-8B on an H100 over PCIe Gen5: 8.03e9 / 131,072 = 61,264.0 params per KV byte against
    # 989.5e12 / 64e9 = 15,460.9 FLOP per link byte: swap is about 3.96x cheaper per token.
    r = rf.recompute_or_swap(L8, "h100-sxm")
    assert r.params_per_kv_byte == pytest.approx(61_264.0, abs=0.1)
    assert r.flops_per_link_byte == pytest.approx(15_460.9, abs=0.1)
    assert r.ratio == pytest.approx(3.962, abs=1e-3) and r.cheaper == "swap"
    # GQA 70B: 70e9 / 327,680 = 213,623 -> about 13.8x in swap's favour
    assert rf.recompute_or_swap(L70, "h100-sxm").ratio == pytest.approx(213_623.0 / 15_460.9, rel=1e-4)
    # MHA models carry many KV bytes per parameter: Llama-2-13B on a B200 (2,250 TFLOP/s over
    # 64 GB/s = 35,156) has 13e9 / 819,200 = 15,869 -> recompute wins (0.45)
    r13 = rf.recompute_or_swap(SHAPES["llama-2-13b"], "b200")
    assert r13.ratio == pytest.approx(15_869.1 / 35_156.25, rel=1e-4) and r13.cheaper == "recompute"
    # a mixture of experts multiplies each token by its active parameters only (Mixtral: 12.9e9)
    mix = rf.recompute_or_swap(SHAPES["mixtral-8x7b"], "h100-sxm")
    assert mix.recompute == pytest.approx(2 * 12.9e9 / 989.5e12)
    # a slower link favours recompute in proportion
    slow = rf.recompute_or_swap(L8, "h100-sxm", link="pcie4-x16")
    assert slow.ratio == pytest.approx(r.ratio / 2)
    # MFU scales the FLOP rate
    assert rf.recompute_or_swap(L8, "h100-sxm", mfu=0.5).ratio == pytest.approx(2 * r.ratio)


def test_recompute_or_swap_bad_input():
    with pytest.raises(ValueError, match="unknown link 'nvlink9'"):
        rf.recompute_or_swap(L8, "h100-sxm", link="nvlink9")
    with pytest.raises(ValueError, match="mfu"):
        rf.recompute_or_swap(L8, "h100-sxm", mfu=0)
    with pytest.raises(ValueError, match="host_link"):
        rf.recompute_or_swap(L8, dataclasses.replace(SPECS["h100-sxm"], host_link=None))
    with pytest.raises(TypeError, match="link must be"):
        rf.recompute_or_swap(L8, "h100-sxm", link=64e9)


# ------------------------------------------------------------------ real capacities (memory wall)


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


def test_counted_params_against_published_counts():
    # Published totals (the checkpoints' safetensors metadata) include the RMSNorm weights, which
    # the count leaves out: 2 per layer and 1 final, each of width hidden.
    for shape, published in ((L8, 8_030_261_248), (L70, 70_553_706_496)):
        norms = (2 * shape.layers + 1) * shape.hidden
        assert shape.counted_params() == published - norms
    assert round(L70.counted_params() / 1e9, 1) == 70.6
    for key in ("mixtral-8x7b", "deepseek-v2"):
        with pytest.raises(ValueError, match="counted_params"):
            SHAPES[key].counted_params()


def test_h200_margin_beside_70b_weights():
    # the seed's rounding: 141e9 - 70e9 * 2 = 1 GB
    assert rf.free_beside_weights(L70, "h200") == pytest.approx(1e9)
    real = dataclasses.replace(L70, params=L70.counted_params())
    margin = rf.free_beside_weights(real, exposed_memory("h200"))
    assert margin == pytest.approx(143_771 * 2**20 - 2 * 70_552_387_584)
    assert 9.6e9 < margin < 9.7e9
    assert rf.free_beside_weights(L405, "h100-sxm") < 0


def test_largest_admitted_batch_notebook_03():
    seed8 = dataclasses.replace(L8, params=8e9)
    assert rf.max_batch(seed8, "h100-sxm", 2048) == (80e9 - 16e9) // (2048 * 131_072) == 238
    real8 = dataclasses.replace(L8, params=L8.counted_params())
    expected = int((81_559 * 2**20 - 2 * 8_029_995_008) // (2048 * 131_072))
    assert rf.max_batch(real8, exposed_memory("h100-sxm"), 2048) == expected == 258
    assert rf.max_batch(L405, "h100-sxm", 2048) == 0
    assert rf.max_batch(L405, "h100-sxm", 2048, devices=16) > 0  # 810 GB of weights
    with pytest.raises(ValueError, match="context"):
        rf.max_batch(L8, "h100-sxm", 0)


# ------------------------------------------------------------------ links: one way, not both


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


# ------------------------------------------------------------------ design rule 3's scope


def test_compression_admits_a_larger_batch_at_the_same_step_floor():
    # 70B on a B200 at 128k: (192e9 - 140e9) / (128,000 * 327,680) = 1.24 -> 1 sequence in bf16;
    # with a 4-bit cache (0.5 bytes per element) 4.96 -> 4 sequences.
    bf16 = rf.admitted_rate(L70, "b200", 128_000)
    int4 = rf.admitted_rate(L70, "b200", 128_000, w_kv=0.5)
    assert (bf16.batch, int4.batch) == (1, 4)
    # 4 x 0.5 = 1 x 2 bytes per element: the same bytes per step, the same floor
    assert int4.step_time == pytest.approx(bf16.step_time) == pytest.approx((140e9 + 128_000 * 327_680) / 8e12)
    assert int4.tokens_per_s / bf16.tokens_per_s == pytest.approx(4)
    # and at fixed batch one, compression barely shortens the step (weight-bound)
    s_star = rf.crossover_context(L70)
    assert 128_000 < s_star and rf.compression_speedup(4, 128_000, s_star) < 1.25
    none = rf.admitted_rate(L405, "b200", 128_000)
    assert none.batch == 0 and none.step_time is None
    rule3 = next(r for r in rf.recommend(L70, "b200", 128_000, 1, "small") if r.rule == 3)
    assert "1 sequence in bf16 and 4 with 4-bit KV" in rule3.reason


# ------------------------------------------------------------------ compile break-even (9.2)


def test_break_even_tokens():
    assert break_even_tokens(10.0, 2e-3) == pytest.approx(5000)  # seconds against milliseconds
    assert break_even_tokens(3.0, 0.0) == math.inf and break_even_tokens(3.0, -1e-3) == math.inf
    with pytest.raises(ValueError, match="compile_seconds"):
        break_even_tokens(-1.0, 1e-3)
    with pytest.raises(TypeError, match="step_gain"):
        break_even_tokens(1.0, "fast")


def _profile(steps):
    return DecodeProfile("static", 1, 8, len(steps) + 1, 0.01, tuple(steps), torch.zeros(1, len(steps) + 1))


def test_compile_break_even_from_profiles():
    eager = _profile([0.004] * 20)
    compiled = _profile([2.0, 0.5] + [0.001] * 18)  # compiles during its first two steps
    r = compile_break_even(eager, compiled, warm=4)
    assert isinstance(r, CompileBreakEven)
    # extra time (2.528 - 0.09 s) plus 21 tokens x 3 ms of gain
    assert r.compile_seconds == pytest.approx(2.528 - 0.09 + 21 * 0.003)
    # the two runs' cumulative times, extrapolated at their steady steps, cross at the break-even
    n = r.tokens
    assert 0.09 + (n - 21) * 0.004 == pytest.approx(2.528 + (n - 21) * 0.001, rel=1e-9)
    assert compile_break_even(eager, compiled, warm=8).compile_seconds == pytest.approx(r.compile_seconds)
    assert r.step_gain == pytest.approx(0.003) and r.tokens == pytest.approx(r.compile_seconds / 0.003)
    with pytest.raises(ValueError, match="warm"):
        compile_break_even(eager, _profile([0.001] * 3), warm=4)
    with pytest.raises(TypeError, match="DecodeProfile"):
        compile_break_even(eager, [0.1], warm=1)
    with pytest.raises(ValueError, match="same number"):
        compile_break_even(eager, _profile([0.001] * 12), warm=4)


# ------------------------------------------------------------------ scans (9.6)


def _blelloch_counts(s):
    """Rounds and operations of Blelloch's scan, simulated on a list (the oracle for the closed forms)."""
    n = 1 << math.ceil(math.log2(s)) if s > 1 else 1
    rounds = ops = 0
    half = 1
    while half < n:
        rounds += 1
        ops += len(range(2 * half - 1, n, 2 * half))
        half *= 2
    half = n // 2
    while half >= 1:
        rounds += 1
        ops += len(range(2 * half - 1, n, 2 * half))
        half //= 2
    return rounds, ops + 2 * s  # own map composed in, then applied to the initial state


def _two_level_counts(s, c):
    chunks = [min(c, s - start) for start in range(0, s, c)]
    hs_rounds = max(math.ceil(math.log2(n)) for n in chunks)
    hs_ops = sum(sum(n - 2**r for r in range(math.ceil(math.log2(n)))) for n in chunks)
    return hs_rounds + len(chunks) - 1, hs_ops + (len(chunks) - 1) + s


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 70), chunk=st.integers(1, 20), seed=st.integers(0, 1000))
def test_new_scan_orders_match_the_sequential_scan(length, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(length, 3, 2, generator=g, dtype=torch.float64)
    b = torch.randn(length, 3, 2, generator=g, dtype=torch.float64)
    h = torch.randn(3, 2, generator=g, dtype=torch.float64)
    ref = ssm.affine_scan(a, b, h, "sequential")
    torch.testing.assert_close(ssm.affine_scan(a, b, h, "blelloch"), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ssm.affine_scan(a, b, h, "two-level", chunk_size=chunk), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("s", [2, 3, 7, 64, 100, 1000, 4096])
def test_blelloch_depth_and_work(s):
    rounds, ops = _blelloch_counts(s)
    assert ssm.scan_depth(s, "blelloch") == rounds == 2 * math.ceil(math.log2(s))
    assert ssm.scan_work(s, "blelloch") == ops
    assert ssm.scan_work(s, "blelloch") <= 6 * s  # O(s), against Hillis-Steele's s log2 s
    if s >= 64:
        assert ssm.scan_work(s, "blelloch") < ssm.scan_work(s, "parallel")


@pytest.mark.parametrize("s,c", [(2, 1), (7, 3), (64, 64), (100, 16), (1000, 7), (4096, 64), (5, 64)])
def test_two_level_depth_and_work(s, c):
    rounds, ops = _two_level_counts(s, c)
    assert ssm.scan_depth(s, "two-level", c) == rounds
    assert ssm.scan_work(s, "two-level", c) == ops
    # the serial-chunk scan pays log2 c + 1 rounds per chunk; the two-level scan log2 c once
    if s > c > 1:
        assert ssm.scan_depth(s, "two-level", c) < ssm.scan_depth(s, "chunked", c)


def test_scan_order_arguments():
    assert ssm.scan_depth(4096, "two-level", 64) == 6 + 63
    with pytest.raises(ValueError, match="chunk_size applies"):
        ssm.scan_depth(100, "blelloch", 16)
    with pytest.raises(ValueError, match="method must be one of"):
        ssm.scan_work(100, "brent-kung")


# ------------------------------------------------------------------ KIVI's residual window (9.7)


def test_kivi_nbytes_matches_the_cache_and_explains_the_short_saving():
    from kvlab.cache import longctx

    torch.manual_seed(0)
    cache = longctx.QuantizedKVCache(bits=2, group_size=32, residual=32)
    k = torch.randn(1, 2, 128, 32)
    cache.update(k, torch.randn_like(k), 0)
    elements = 2 * 2 * 32  # keys and values, one layer, 2 heads of 32
    held = longctx.kivi_nbytes(128, elements, bits=2, group_size=32, residual=32, element_bytes=4, meta_bytes=4)
    assert held == cache.nbytes
    # 96 tokens quantized, 32 residual: the saving is far below the codes' own ratio
    full = 128 * elements * 4
    codes_only = elements * 4 / (longctx.quantized_nbytes(elements, 2, 32, 4))
    assert full / held < codes_only / 2
    long = 1 << 16
    assert full / held < long * elements * 4 / longctx.kivi_nbytes(long, elements, 2, 32, 32, 4, 4) < codes_only
    assert longctx.kivi_nbytes(40, elements, 2, 32, 32, 4, 4) == 40 * elements * 4  # nothing quantized yet
    with pytest.raises(ValueError, match="residual"):
        longctx.kivi_nbytes(10, elements, 2, 32, -1)


def test_cache_bytes_full_attention_reads_forwards():
    from kvlab.cache import longctx

    full = longctx.cache_bytes("mistral-7b", 32_768, full=True)
    assert full == 2 * 32_768 * 32 * 8 * 128 * 2  # no window: every token, every layer
    assert full / longctx.cache_bytes("mistral-7b", 32_768) == 8  # against its own 4,096-token window
    assert longctx.cache_bytes("llama-3-8b", 1000, full=True) == longctx.cache_bytes("llama-3-8b", 1000)
    with pytest.raises(ValueError, match="not both"):
        longctx.cache_bytes("mistral-7b", 32_768, window=4096, full=True)
    with pytest.raises(TypeError, match="full must be a bool"):
        longctx.cache_bytes("mistral-7b", 32_768, full=1)
