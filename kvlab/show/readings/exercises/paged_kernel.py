"""Notebook 05b, the paged decode kernel (section 9.5): worked solutions of the exercises that have
numbers."""

from __future__ import annotations

import math

from kvlab._checks import integer, nonnegative, record
from kvlab.show.readings.exercises.folded import solution

GRID = "kvlab.lab.paged_kernel.SplitGrid"


def paged_kernel_rows(q_heads: int, kv_heads: int, rows: int) -> str:
    """Exercise 1 of the paged kernel: the useful share of ``tl.dot`` rows for a GQA group."""
    q_heads = integer("q_heads", q_heads, 0)
    kv_heads = integer("kv_heads", kv_heads)
    rows = integer("rows", rows)
    group = q_heads // kv_heads
    text = (
        f"One program serves one KV head and its group of $G = {q_heads} / {kv_heads} = {group}$"
        f" query heads. `tl.dot` needs at least 16 rows, so the kernel pads the group to {rows}"
        f" rows (`group_rows({group})`): **{group / rows:.0%}** of the rows it multiplies are"
        " useful. "
    )
    if group >= rows:
        text += (
            "The group fills the tile, so nothing is wasted; the key and value tiles are still read"
            " once for the whole group, which is the point of grouped-query attention."
        )
    else:
        text += (
            "The padded rows cost tensor-core arithmetic, not memory traffic: the key and value"
            " tiles are read once for the group either way, and decode is bound by that read, so"
            " the waste hardly shows in the step time."
        )
    return solution(1, text)


def paged_kernel_splits(grid, tile_tokens: int, min_tiles: int, programs_per_sm: int) -> str:
    """Exercise 2 of the paged kernel: how many splits ``choose_num_splits`` picks at batch 1
    (``grid``: :func:`kvlab.lab.paged_kernel.split_grid`, whose ``bound`` says which limit set the
    count)."""
    tile_tokens = integer("tile_tokens", tile_tokens)
    min_tiles = integer("min_tiles", min_tiles)
    programs_per_sm = integer("programs_per_sm", programs_per_sm)
    record(
        "grid", grid, GRID, "multiprocessors", "kv_heads", "context", "wanted", "useful", "splits"
    )
    sms, heads, context = grid.multiprocessors, grid.kv_heads, grid.context
    text = (
        f"At batch 1 there are only {heads} programs without splitting (one per KV head), for {sms}"
        f" multiprocessors. To give every multiprocessor {programs_per_sm} programs the kernel"
        f" would want $\\lceil {programs_per_sm} \\cdot {sms} / {heads} \\rceil = {grid.wanted}$"
        f" splits. But each split should keep at least {min_tiles} tiles of {tile_tokens} tokens,"
        " so that its fixed cost (loading the query, writing a partial result and its log-sum-exp)"
        f" is spread over enough keys: $\\lceil {context} / ({tile_tokens} \\cdot {min_tiles})"
        f" \\rceil = {grid.useful}$ splits at most. `choose_num_splits` takes the smaller,"
        f" **{grid.splits}**"
    )
    if grid.bound == "tiles":
        return solution(
            2,
            text + f", so at context {context:,} the grid has {grid.programs} programs and leaves "
            "part of the machine idle: the sequence is too short to split further usefully.",
        )
    return solution(
        2,
        text + f", which fills the machine with {grid.programs} programs: the sequence is long "
        "enough for every split to keep its minimum of tiles.",
    )


def _largest(name: str, value) -> float:
    """``value``, the largest absolute value (or difference) measured: a number >= 0, or NaN, which
    this exercise looks for (a merge that multiplies NaN by 0), and so not a missing measurement."""
    if isinstance(value, float) and math.isnan(value):
        return value
    return nonnegative(name, value)


def paged_kernel_empty_split(
    masked_difference: float,
    lse_difference: float,
    nan_rows: int,
    rows: int,
    stage_one_largest: float,
    empty_splits: int,
) -> str:
    """Exercise 3 of the paged kernel: empty splits whose outputs are NaN, merged by
    ``merge_partials`` and by the Triton merge, and what stage 1 itself stores there (all measured
    in the notebook)."""
    rows = integer("rows", rows)
    nan_rows = integer("nan_rows", nan_rows, 0, rows + 1)
    empty_splits = integer("empty_splits", empty_splits)
    masked_difference = _largest("masked_difference", masked_difference)
    lse_difference = _largest("lse_difference", lse_difference)
    stage_one_largest = _largest("stage_one_largest", stage_one_largest)
    text = (
        "Prediction: an empty split has weight $e^{-\\infty - M} = 0$, so a merge that leaves it"
        " out gives the merge of the other splits, whatever its output holds. A merge that only"
        " weighs it does not: $0 \\cdot \\text{NaN}$ is NaN. "
    )
    if masked_difference == 0 and lse_difference == 0:
        text += (
            "Measured: `merge_partials` gives exactly the merge of the non-empty splits (difference"
            " 0), because it masks the outputs of zero-weight splits before the sum. "
        )
    else:
        text += (
            "Measured: `merge_partials` differs from the merge of the non-empty splits by"
            f" {masked_difference:.3g} in the output and {lse_difference:.3g} in the log-sum-exp."
            " That would be a bug: it masks empty splits, so they must not change the result. "
        )
    if nan_rows == rows:
        text += (
            f"The Triton merge, `merge_splits`, returned NaN in all {rows} rows that had an empty"
            " split: it computes $0 \\cdot \\text{NaN}$, because it weighs the empty split's"
            " output instead of masking it. "
        )
    else:
        text += (
            f"The Triton merge returned NaN in {nan_rows} of the {rows} rows that had an empty"
            " split; a merge that does not mask should give NaN in all of them, one that masks in"
            " none. "
        )
    if stage_one_largest == 0:
        text += (
            "The kernel is still exact, because its stage 1 writes output 0 and log-sum-exp"
            f" $-\\infty$ into every split that holds no token: the {empty_splits} empty splits of"
            " this batch held exactly 0, and $0 \\cdot 0 = 0$. "
        )
    else:
        text += (
            f"Stage 1 left up to {stage_one_largest:.3g} in an empty split's output, not 0: with"
            " the merge as it is, that is a bug. "
        )
    return solution(
        3,
        text
        + "The defensive merge masks the part before the sum, `part = tl.where(weight[:, None] > 0,"
        " part, 0.0)`, as `merge_partials` does, at the cost of a select per element. It matters"
        " wherever the partials come from something other than this stage 1, for example one that"
        " skips the store of an empty split: its buffer comes from `torch.empty`, which may hold"
        " NaN.",
    )
