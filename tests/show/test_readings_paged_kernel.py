"""The readings and worked solutions of the paged-kernel page (notebook 05b, section 9.5): each
outcome-dependent sentence in each of its branches, with the inputs on either side of a branch
computed by the model that decides it (kvlab.lab.paged_kernel.split_grid,
kvlab.theory.kernel_rounding.rounding_tolerance, kvlab.lab.timing.compare_timings), never picked by
hand.
"""

import re

import pytest
import torch

from kvlab.kernels import paged_attention as pa
from kvlab.lab.paged_attention import SplitTiming
from kvlab.lab.paged_kernel import recorded_runs, split_grid
from kvlab.lab.timing import Timing, compare_timings
from kvlab.show.readings import exercises as ex
from kvlab.show.readings import paged_kernel as r
from kvlab.theory.kernel_rounding import rounding_tolerance

H100 = 132
LIMITS = dict(
    programs_per_sm=pa.PROGRAMS_PER_SM, tile_tokens=pa.TILE_TOKENS, min_tiles=pa.MIN_TILES_PER_SPLIT
)


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def folded(text, number):
    assert text.startswith(f"<details>\n<summary>Solution to exercise {number}</summary>\n\n"), text
    return no_roles(text)


def timing(median, spread=0.05):
    return Timing(median, median * (1 - spread), median * (1 + spread), (median,))


def test_source_block_is_a_python_code_block():
    assert r.source_block("def f():\n    pass\n") == "```python\ndef f():\n    pass\n```"


def test_padding_table_gives_the_useful_fraction():
    text = r.padding_reading({4: 16, 32: 32})
    assert "| 4 | 16 | 25% |" in text and "| 32 | 32 | 100% |" in text


def test_programs_reading_on_each_side_of_the_idle_boundary():
    idle_batch = H100 // 8  # 16 x 8 = 128 programs: 4 multiprocessors idle; 17 x 8 = 136 fill them
    idle, full = split_grid(idle_batch, 8, 32768, H100), split_grid(idle_batch + 1, 8, 32768, H100)
    assert idle.idle_unsplit > 0 and full.idle_unsplit == 0 and full.splits > 1
    text = no_roles(r.programs_reading(idle, "an H100", **LIMITS))
    assert (
        f"{idle.idle_unsplit} multiprocessors idle" in text and f"{idle.programs} programs" in text
    )
    text = r.programs_reading(full, "an H100", **LIMITS)
    assert (
        "still cuts each sequence" in text
        and f"{full.programs} programs" in text
        and "no idle" in text
    )
    b1 = r.programs_reading(split_grid(1, 8, 32768, H100), "an H100", **LIMITS)
    assert "8 programs" in b1 and "124 multiprocessors idle" in b1 and "264 programs" in b1
    b32 = r.programs_reading(split_grid(32, 8, 32768, H100), "an H100", **LIMITS)
    assert "256 programs" in b32 and "512 programs, 2 times the grid, 3.9 per multiprocessor" in b32
    filled = split_grid(
        2 * H100, 1, 32768, H100
    )  # wanted = 1: two programs per multiprocessor already
    assert filled.splits == 1 and "keeps one split" in r.programs_reading(
        filled, "an H100", **LIMITS
    )
    short = split_grid(1, 8, 100, H100)  # too short for two splits of two tiles
    assert short.splits == 1 and "too short" in r.programs_reading(short, "an H100", **LIMITS)


def test_fp64_reading_on_each_side_of_the_rounding_tolerance():
    for dtype in (torch.float32, torch.float16):
        tol = rounding_tolerance(dtype)
        good = no_roles(r.fp64_reading({(1, 1): 0.1 * tol, (4, 3): 0.9 * tol}, dtype, [1, 37]))
        assert (
            f"stays within the {tol:.0e}" in good
            and f"**{0.9 * tol:.1e}** (group 4, 3 splits)" in good
        )
        assert "bug in the kernel" in r.fp64_reading({(1, 1): 1.1 * tol}, dtype, [1, 37])
    with pytest.raises(ValueError, match="dtype must be one of"):
        rounding_tolerance(torch.float64)


def _splits(outcome, num_splits, kv_bytes=1e9):
    """A SplitTiming whose split kernel compares with one split as ``outcome`` (compare_timings)."""
    one = timing(4e-3)
    split = {
        "faster": timing(0.9 * one.min / 1.05),
        "slower": timing(1.1 * one.max / 0.95),
        "even": one,
    }[outcome]
    assert compare_timings(split, one).outcome == outcome
    return SplitTiming(num_splits, split, one, timing(3e-3), int(kv_bytes))


def test_split_reading_in_each_branch_of_model_and_measurement():
    context = 65536
    gain = split_grid(1, 8, context, H100, num_splits=16)
    flat = split_grid(1, 8, context, gain.programs_unsplit, num_splits=16)  # the boundary: no gain
    assert gain.predicts_gain and not flat.predicts_gain
    gpu = dict(copy=2e12, gpu=True)
    paid = no_roles(
        r.split_reading(dict(gpu, timing=_splits("faster", 16), grid=gain), 16, context)
    )
    assert (
        "Splitting paid, as the model predicts" in paid
        and f"at most {gain.busy_gain:.3g} times" in paid
    )
    assert "of this GPU's calibrated copy bandwidth" in paid
    assert "The model expected a gain" in r.split_reading(
        dict(gpu, timing=_splits("even", 16), grid=gain), 16, context
    )
    assert "hide memory latency" in r.split_reading(
        dict(gpu, timing=_splits("faster", 16), grid=flat), 16, context
    )
    assert "As the model predicts" in r.split_reading(
        dict(gpu, timing=_splits("slower", 16), grid=flat), 16, context
    )
    cpu, interpreted = dict(copy=1e10, gpu=False), split_grid(1, 2, 1024, 1, num_splits=8)
    slower = r.split_reading(dict(cpu, timing=_splits("slower", 8), grid=interpreted), 8, 1024)
    assert "no parallelism" in slower and "no gain at all" in slower and "bandwidth" not in slower
    lost = compare_timings(_splits("slower", 8).split, _splits("slower", 8).one).ratio
    assert f"the split kernel took **{1 / lost:.2f} times** as long as one split" in slower
    assert "one split took **" in paid and "the split kernel took" not in paid
    assert "not parallel hardware" in r.split_reading(
        dict(cpu, timing=_splits("faster", 8), grid=interpreted), 8, 1024
    )
    one = _splits("even", 1)
    assert "the baseline" in r.split_reading(
        dict(cpu, timing=one, grid=split_grid(1, 2, 1024, 1, 1)), 1, 1024
    )


def test_graph_splits_reading_both_ways():
    fixed = split_grid(1, 8, 8192, H100)
    short, per_step = 1024, pa.choose_num_splits(1, 8, 1024, H100)
    text = no_roles(
        r.graph_splits_reading(fixed, short, per_step, 8192, "an H100", fixed.empty_splits(short))
    )
    assert f"**{fixed.splits} splits**" in text and f"would take {per_step}" in text
    assert f"{fixed.empty_splits(short)} of the {fixed.splits} splits" in text
    wide = split_grid(32, 8, 8192, H100)
    assert wide.empty_splits(short) == 0
    assert "leaves no split empty" in r.graph_splits_reading(
        wide, short, per_step, 8192, "an H100", 0
    )


def _record(device, path, rows=None):
    rows = rows or [
        dict(name="paged attention b4 s512", value=3.2, unit="GB/s", note=f"batch 4, {path} path"),
        dict(name="paged / copy bandwidth b4 s512", value=0.36, unit="fraction", note=""),
    ]
    return {
        "stamp": {"device": device, "date": "2026-12-01"},
        "results": {"9.5 paged attention and admission": rows},
    }


def test_recorded_reading_says_what_the_records_hold():
    assert "No record of this section" in r.recorded_reading(
        recorded_runs([]), "book/data/measurements/"
    )
    cpu = recorded_runs(
        [_record("CPU: AMD EPYC", "gather"), {"stamp": {"device": "x"}, "results": {}}]
    )
    assert len(cpu) == 1 and cpu[0].path == "gather" and not cpu[0].gpu
    text = no_roles(r.recorded_reading(cpu, "book/data/measurements/"))
    assert (
        "1 run of this section, none on a GPU" in text and "gather path, at 36% (b4 s512)" in text
    )
    gpu = recorded_runs(
        [_record("CPU: AMD EPYC", "gather"), _record("NVIDIA H100 80GB HBM3", "kernel")]
    )
    assert gpu[0].gpu and gpu[0].path == "kernel"
    text = r.recorded_reading(gpu, "book/data/measurements/")
    assert (
        "Recorded on **NVIDIA H100 80GB HBM3**" in text
        and "| paged attention b4 s512 | 3.2 GB/s |" in text
    )


def test_paged_kernel_solutions():
    rows = folded(ex.paged_kernel_rows(32, 8, 16), 1)
    assert "$G = 32 / 8 = 4$" in rows and "**25%**" in rows and "hardly shows" in rows
    assert "nothing is wasted" in ex.paged_kernel_rows(32, 2, 16)
    tiles = split_grid(1, 8, 2048, H100)
    splits = folded(
        ex.paged_kernel_splits(tiles, pa.TILE_TOKENS, pa.MIN_TILES_PER_SPLIT, pa.PROGRAMS_PER_SM), 2
    )
    assert (
        f"**{tiles.splits}**" in splits
        and f"{tiles.programs} programs" in splits
        and "idle" in splits
    )
    full = split_grid(1, 8, 32768, H100)
    assert "fills the machine" in ex.paged_kernel_splits(
        full, pa.TILE_TOKENS, pa.MIN_TILES_PER_SPLIT, pa.PROGRAMS_PER_SM
    )
    clean = folded(ex.paged_kernel_empty_split(0.0, 0.0, 24, 24, 0.0, 17), 3)
    assert "difference 0" in clean and "NaN in all 24 rows" in clean and "17 empty splits" in clean
    assert "tl.where(weight[:, None] > 0, part, 0.0)" in clean
    broken = ex.paged_kernel_empty_split(float("nan"), 0.0, 3, 24, 0.5, 17)
    assert "would be a bug" in broken and "3 of the 24 rows" in broken and "is a bug" in broken
