"""Worked solutions (kvlab.show.readings.exercises): folded, quoting the numbers they are given, and
saying which outcome happened where a solution depends on a measurement."""

import re

import pytest

from kvlab.show.readings import exercises as ex


def folded(text, number):
    assert text.startswith(f"<details>\n<summary>Solution to exercise {number}</summary>\n\n"), text
    assert text.rstrip().endswith("</details>")
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_solution_wrapper():
    folded(ex.solution(2, "Body."), 2)
    for bad in (0, True, "1"):
        with pytest.raises(ValueError, match="number"):
            ex.solution(bad, "Body.")
    with pytest.raises(ValueError, match="body"):
        ex.solution(1, "  ")
    assert ex.count(131_072) == "131,072" and ex.count(3.13e8).startswith("$3.13")


def test_decode_loop_solutions():
    t = folded(ex.decode_loop_gqa(8, 2, 8e-6, 2e-6, 16e-6), 1)
    assert "**4**" in t and "2 µs" in t
    t = folded(ex.decode_loop_window(512, 512, 128, 50_003_968, 131_072, 313_000_000, 655_104), 2)
    assert "131,072" in t and r"\min(P+j,\,W)" in t


def test_decode_loop_static_follows_the_growth_model_on_both_sides():
    """The cached steps' growth from the page's model (3k(G-1)/beta), against a spread solved from that
    growth: at 0.9x of it the growth stands out, at 1.1x it does not; the static steps likewise."""
    from kvlab.lab.decode_timing import predicted_step_growth

    growth = predicted_step_growth(kv_bytes_per_token=65_536, tokens=31, bandwidth=10e9)
    first = 20e-3
    threshold = growth / first  # the spread at which the growth just stands out
    shows = folded(ex.decode_loop_static(256, 32, 30e-3, 30e-3, first, first + growth, growth, 0.9 * threshold), 3)
    assert "this run can show it" in shows and "flat, as predicted" in shows
    hidden = folded(ex.decode_loop_static(256, 32, 30e-3, 30e-3, first, 0.8 * first, growth, 1.1 * threshold), 3)
    assert "cannot show it" in hidden and "not the history" in hidden
    moved = ex.decode_loop_static(256, 32, 30e-3, 30e-3 * (1 + 1.1 * threshold), first, first, growth, threshold)
    assert "more than the spread" in moved
    still = ex.decode_loop_static(256, 32, 30e-3, 30e-3 * (1 + 0.9 * threshold), first, first, growth, threshold)
    assert "flat, as predicted" in still


def test_cache_reuse_solutions_and_corrections():
    from kvlab.show.readings import cache_reuse

    ok = folded(ex.cache_reuse_doubling(128, 32, 0.01, 1e-4, 5_088, 10_208, 0.8, 1.6), 1)
    assert "The prediction holds" in ok
    off = folded(ex.cache_reuse_doubling(128, 32, 0.01, 1e-4, 5_088, 10_208, 0.8, 3.2), 1)
    assert "the predicted factor" in off
    w = folded(ex.cache_reuse_warm({2: 10.0, 8: 10.5}, [5.0, 2.0, 0.01], 0.001), 2)
    assert "| 8 | 10.5 s |" in w and "second compilation" in w
    assert "one-time work remains" in ex.cache_reuse_warm({2: 10.0}, [5.0, 0.014, 0.001], 0.0014)
    assert "already steady" in ex.cache_reuse_warm({2: 10.0}, [5.0, 0.0015, 0.001], 0.0014)
    # the positions ratio is no bound: the reading names the pairs ratio either way
    tt, tp = {"naive": 0.07, "cached": 0.07, "static": 0.08}, {"naive": 0.08, "cached": 0.02, "static": 0.02}
    above = cache_reuse.explore_reading(512, 512, 1, "cpu", tt, tp, 9.0, 7.0)
    assert "pairs ratio, 477.8 here" in above  # against a positions ratio of 384 at P = G = 512


def test_gemv_solutions_and_capacity_readings():
    from kvlab.show.readings import capacity

    near = folded(ex.gemv_big_product(8192, 28672, 4, 6e9, 0.15), 1)
    assert "157 ms" in near and "time is bytes" in near
    far = folded(ex.gemv_big_product(8192, 28672, 4, 6e9, 0.6), 1)
    assert "rate changed" in far
    assert "Measure it" in ex.gemv_big_product(8192, 28672, 2, 6e9, None)
    t = folded(ex.gemv_h200_batch(116, 0.0293, 3961, 0.0105, 3050), 2)
    assert "**116 sequences**" in t
    t = folded(ex.gemv_attention_ridge(295.4, {2: 295.4, 0.5: 73.9}, 64), 3)
    assert "| 0.5 | 74 |" in t
    real = capacity.largest_batch_reading(2048)
    assert "**258** instead of 238" in real and "79.6 GiB" in real
    margin = capacity.h200_margin_reading(3052)
    assert "**1 GB**" in margin and "**9.7 GB**" in margin and "140.4 GiB" in margin and "70.55e9" in margin
    short = capacity.largest_batch_reading(1024)  # half the context: twice the batch, past the ridge batch
    assert "That reaches the ridge batch of 295" in short


def test_kv_layout_solutions():
    ok = folded(ex.kv_layout_batch(2, 8, (5e-3, 20e-3), (10e-3, 42e-3), (5e-6, 6e-6)), 1)
    assert "**4**" in ok and "as predicted" in ok
    off = folded(ex.kv_layout_batch(2, 8, (5e-3, 20e-3), (2e-3, 42e-3), (5e-6, 6e-6)), 1)
    assert "last-level cache" in off
    runs1, runs16 = {"HND": 256, "NHD": 256}, {"HND": 4096, "NHD": 256}
    assert "Slower, as predicted" in folded(ex.kv_layout_block1(64, 4, runs1, runs16, 16, 13e-3, 11e-3), 2)
    assert "Not slower here" in folded(ex.kv_layout_block1(64, 4, runs1, runs16, 16, 11e-3, 11e-3), 2)
    assert "Close to the byte ratio" in folded(ex.kv_layout_cat(4096, 28e-3, 14e-3), 3)
    assert "arithmetic" in ex.kv_layout_cat(4096, 15e-3, 14e-3)
    assert "allocates" in ex.kv_layout_cat(4096, 60e-3, 14e-3)


def test_paged_attention_solutions_and_preemption_readings():
    from kvlab.lab.paged_attention import HostCopy
    from kvlab.show.readings import preemption
    from kvlab.lab.timing import Timing

    t = folded(ex.paged_block_size(128, 168, 0.43, 0.27, 0.27, 0.04), 1)
    assert "**43%**" in t and "27%" in t and "stays under the bound" in t
    assert "above the bound" in ex.paged_block_size(128, 168, 0.43, 0.27, 0.5, 0.04)
    t = folded(ex.paged_fork_append({"B": [3, 4], "B'": [3, 4]}, {"B": [3, 9], "B'": [3, 4]}, 4, 9), 2)
    assert "[3, 9]" in t and "B' stays [3, 4]" in t
    assert "The same, as predicted" in folded(ex.paged_swap_steps({"recompute": 789, "swap": 789},
                                                                  {"recompute": 131, "swap": 131}, 9234), 3)
    assert "They differ by 11" in ex.paged_swap_steps({"recompute": 789, "swap": 800}, {"recompute": 1, "swap": 1}, 9)
    table = preemption.crossover_table()
    assert table.count("\n") == 2 + 11 and "**0.45**" in table  # Llama-2-13B on a B200: recompute wins
    assert "**14**" in preemption.crossover_reading()

    def copy(block, seconds, one):
        timing = lambda s: Timing(s, s, s, (s,))  # noqa: E731
        return HostCopy(block, 1024, timing(seconds), timing(one))

    slow = preemption.host_copy_reading([copy(8192, 1.0, 0.04), copy(1 << 20, 0.05, 0.04)], 8192, 16)
    assert "4%" in slow and "waste most of the link" in slow
    fast = preemption.host_copy_reading([copy(8192, 0.05, 0.04), copy(1 << 20, 0.04, 0.04)], 8192, 16)
    assert "keep most of the rate" in fast
    agree = preemption.decides_reading(1e6, 1e3, 1e11, 5e9, 0.5, 2e-4, 1e-6)
    assert "the arithmetic decides" in agree
    flip = preemption.decides_reading(1e6, 1e3, 1e11, 5e9, 0.01, 2e-4, 1e-6)
    assert "transfer efficiency decides" in flip
    odd = preemption.decides_reading(1e6, 1e3, 1e11, 5e9, 0.5, 1e-6, 2e-4)
    assert "measurement disagrees" in odd


def test_ssm_solutions():
    t = folded(ex.ssm_breakeven("Mamba-1.4B", 4096, 4, 16, 163_840, 2048, 8192, 20.0), 1)
    assert "**20 tokens**" in t
    times = {"sequential": 0.023, "parallel": 0.013, "chunked": 0.027}
    assert "The parallel scan won" in folded(ex.ssm_narrow_scan(64, 8, "chunked", "parallel", times), 2)
    assert "still won" in ex.ssm_narrow_scan(64, 8, "sequential", "sequential", times)
    t = folded(ex.ssm_hybrid_fraction(8, 1, {256: 0.193, 131_072: 0.125}), 3)
    assert "**19.3%** at 256 tokens" in t
    exact = folded(ex.ssm_full_rank(8, 8, 1e-16, 8, 64, 1, 0.984375), 4)
    assert "as predicted" in exact and "rank **1**" in exact
    assert "not in floating point" in ex.ssm_full_rank(16, 16, 0.25, 12, 64, 1, 0.984375)


def test_long_context_solutions_and_kivi_reading():
    from kvlab.show.readings import capacity

    assert "Both as predicted" in folded(ex.long_context_onset(4, 32, 37, 37), 1)
    assert "Not where predicted" in ex.long_context_onset(4, 32, 38, 37)
    flat = {"per-channel keys": {"rms": 0.394}, "per-token keys": {"rms": 0.409}}
    t = folded(ex.long_context_outliers(flat, {"per-channel keys": 0.82, "per-token keys": 0.66}), 2)
    assert "Per-token wins, as predicted" in t
    assert "Per-channel still wins" in ex.long_context_outliers(flat, {"per-channel keys": 0.5, "per-token keys": 0.66})
    assert "Exactly the prediction" in folded(ex.long_context_kivi_bytes(4, 0, 100_000, 100_000, 260_000), 3)
    assert "check the group size" in ex.long_context_kivi_bytes(4, 0, 100_000, 120_000, 260_000)
    assert "the same outputs" in folded(ex.long_context_conventions(9.5e-7, 0.074), 4)
    assert "more than rounding" in ex.long_context_conventions(0.01, 0.074)
    k = capacity.kivi_residual_reading(127, 32, 32, 2, 1024, 4, 4, held=127 * 1024 * 4 / 1.8)
    assert "Why only 1.8 times?" in k and "**63 stay in full precision**" in k and "31 newer ones" in k


def test_memory_wall_solutions_and_readings():
    from kvlab import SHAPES
    from kvlab.theory import roofline as rf
    from kvlab.show.readings import capacity

    t = folded(ex.wall_fixed_point(4, 4, {1: [1.0, 2.0], 4: [4.0, 4.0], 32: [26.0, 5.6]}, [1000, 64000]), 1)
    assert "**4**" in t and "| 32 | 26.00 | 5.60 |" in t
    t = folded(ex.wall_288(1.057, 53_406, 320_435, 56_458, 451_660, 4.0), 2)
    assert "now exists" in t and "**320,435 tokens**" in t
    assert "still no one-device" in ex.wall_288(0.9, 53_406, 320_435, 56_458, 451_660, 4.0)
    t = folded(ex.wall_joint({"half": 1.13, "joint": 1.21}, {"half": 1.83, "joint": 3.12}), 3)
    assert "**$S(4)$ = 3.12**" in t and "at both batches" in t
    nv = capacity.nvlink_reading(41.94e9, 4, 0.01165, 25.0, 0.655)
    assert "**23.3 ms**" in nv and "450 GB/s" in nv and "900 GB/s" in nv
    assert "interleave" in capacity.placement_reading(2.0, 8.0)
    L70 = SHAPES["llama-3-70b"]
    r3 = capacity.rule3_reading(L70.name, "NVIDIA B200", 128_000, 1.21, rf.admitted_rate(L70, "b200", 128_000),
                                rf.admitted_rate(L70, "b200", 128_000, w_kv=0.5))
    assert "**1 sequence in bf16**" in r3 and "**4 with a 4-bit cache**" in r3 and "**4.0 times**" in r3
    none = capacity.rule3_reading(SHAPES["llama-3.1-405b"].name, "NVIDIA B200", 128_000, 1.0,
                                  rf.admitted_rate(SHAPES["llama-3.1-405b"], "b200", 128_000),
                                  rf.admitted_rate(SHAPES["llama-3.1-405b"], "b200", 128_000, w_kv=0.5))
    assert "**0 sequences in bf16**" in none and "tokens/s rises" not in none


def test_margins_table_seed_against_exposed():
    from kvlab.show.readings import capacity

    t = capacity.margins_table()
    rows = [line for line in t.splitlines() if line.startswith("| Llama-3-70B")]
    assert rows == ["| Llama-3-70B | does not fit | does not fit | 1.0 GB | 9.7 GB |"]
    assert "| Llama-3-8B | 63.9 GB | 69.5 GB |" in t and "79.6 GiB" in t and "140.4 GiB" in t


def test_prefix_caching_and_engine_solutions():
    assert "As predicted" in folded(ex.prefix_whole_blocks(64, 16, 48), 1)
    assert "not the predicted count" in ex.prefix_whole_blocks(64, 16, 32)
    hit = {("lru", 1): 0.74, ("lru", 8): 0.39, ("reserve", 1): 0.66, ("reserve", 8): 0.24}
    assert "**reserve** lost more" in folded(ex.prefix_system_prompts(16, 32, hit), 2)
    hit_lru = {("lru", 1): 0.74, ("lru", 8): 0.2, ("reserve", 1): 0.66, ("reserve", 8): 0.5}
    assert "Here LRU lost more" in ex.prefix_system_prompts(16, 32, hit_lru)
    assert "Close to the line" in folded(ex.prefix_ninety(256, 16, 224, 0.037, 0.044, 0.186), 3)
    assert "fixed cost of a forward pass" in ex.prefix_ninety(256, 16, 224, 0.037, 0.09, 0.186)
    assert "as predicted" in folded(ex.engine_half_pool(1.7, 8, 1.2, 1), 1)
    assert "short requests take less" in ex.engine_half_pool(1.7, 8, 3.0, 0)


def test_long_context_trained_solution():
    t = folded(ex.long_context_trained(0.8, 0.004, 3.10, 3.09, 64, 0.30, 0.10, (64, 128)), 5)
    assert "has a sink head" in t and "closer with the larger window" in t
    t = ex.long_context_trained(0.01, 0.004, 3.10, 3.09, 64, 0.10, 0.30, (64, 128))
    assert "no head sinks" in t and "not closer" in t


def test_diagnosis_solutions():
    flat = folded(ex.diagnosis_batch(0.004, 250, 32, 2e-3, 2.4e-3, 0.08, "overhead", "overhead"), 1)
    assert "**250**" in flat and "batch 32" in flat and "nearly flat" in flat
    grew = ex.diagnosis_batch(0.004, 250, 32, 2e-3, 9e-3, 0.03, "overhead", "weights")
    assert "did not stay flat" in grew and "4.50 times" in grew
    assert "scales from there" not in folded(ex.diagnosis_batch(0.5, 2, 2, 2e-3, 2.1e-3, 0.9, "weights", "weights"), 1)
    t = folded(ex.diagnosis_gqa(16, 2, 520, 0.83, 0.39, 0.40, "kv", "overhead"), 2)
    assert "**39.0%**" in t and "lever worked" in t
    assert "verdict stays" in ex.diagnosis_gqa(16, 2, 520, 0.83, 0.55, 0.56, "kv", "kv")
    assert "did not rest on the cache" in ex.diagnosis_gqa(16, 2, 520, 0.83, 0.39, 0.4, "overhead", "overhead")
    agree = folded(ex.diagnosis_naive_ridge(20.0, 4, 40, 39, 72, 36.5, "compute"), 3)
    assert "**39**" in agree and "past the ridge point" in agree and "agrees" in agree
    assert "agrees" in ex.diagnosis_naive_ridge(20.0, 4, 40, 39, 20, 10.0, "weights")
    assert "not compute" in ex.diagnosis_naive_ridge(20.0, 4, 40, 39, 72, 36.5, "overhead")
    assert "tip either way" in ex.diagnosis_naive_ridge(20.0, 4, 40, 39, 20, 10.0, "compute")


def test_paged_kernel_solutions():
    rows = folded(ex.paged_kernel_rows(32, 8, 16), 1)
    assert "$G = 32 / 8 = 4$" in rows and "**25%**" in rows and "hardly shows" in rows
    assert "nothing is wasted" in ex.paged_kernel_rows(32, 2, 16)
    splits = folded(ex.paged_kernel_splits(132, 8, 2048, 33, 16, 16, 64, 2), 2)
    assert "**16**" in splits and "128 programs" in splits and "idle" in splits
    assert "fills the machine" in ex.paged_kernel_splits(132, 8, 32768, 33, 256, 33, 64, 2)
    clean = folded(ex.paged_kernel_empty_split(0.0, 0.0), 3)
    assert "exactly those of the other splits" in clean
    assert "bug" in ex.paged_kernel_empty_split(float("nan"), 0.0)
