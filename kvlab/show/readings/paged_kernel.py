"""Readings of the paged decode kernel page (notebook ``05b_paged_kernel``, section 9.5)."""

from __future__ import annotations

from kvlab._checks import instance, integer, integers, record
from kvlab.lab.timing import compare_timings
from kvlab.show.format import si
from kvlab.theory.kernel_rounding import explained_by_rounding, rounding_tolerance


def source_block(source: str) -> str:
    """A kernel's source as a Markdown code block: the page shows the package's own code."""
    instance("source", source, str)
    return f"```python\n{source.rstrip()}\n```"


def padding_reading(rows: dict[int, int]) -> str:
    """How many of the ``tl.dot`` rows a GQA group fills, for each group size (``{group: padded
    rows}``)."""
    instance("rows", rows, dict)
    groups = integers("rows' group sizes", list(rows))  # at least one, each >= 1
    rows = {g: integer(f"rows[{g}]", rows[g], g) for g in groups}  # padded rows: >= the group
    cells = "\n".join(f"| {g} | {p} | {g / p:.0%} |" for g, p in sorted(rows.items()))
    return (
        "| query heads per KV head | rows given to `tl.dot` | rows doing useful work"
        f" |\n|---:|---:|---:|\n{cells}"
    )


def _per_sm(programs: int, multiprocessors: int) -> str:
    return f"{programs / multiprocessors:.2g} per multiprocessor"


def programs_reading(
    grid, where: str, programs_per_sm: int, tile_tokens: int, min_tiles: int
) -> str:
    """Programs of an unsplit grid against the multiprocessors that could run them, and the split
    that ``choose_num_splits`` picks (``grid``: :func:`kvlab.lab.paged_kernel.split_grid`)."""
    instance("where", where, str)
    one, sms = grid.programs_unsplit, grid.multiprocessors
    text = (
        f"On {where}, with {sms} multiprocessors, a decode step at batch {grid.batch} with"
        f" {grid.kv_heads} KV heads launches {one} program{'s' * (one != 1)} without splitting,"
        f" {_per_sm(one, sms)}. "
    )
    if grid.idle_unsplit and grid.splits == 1:
        return (
            text
            + f"That leaves {grid.idle_unsplit} multiprocessors idle, but the context is too short"
            f" to give two splits {min_tiles} tiles of {tile_tokens} tokens each, so"
            " `choose_num_splits` keeps one split."
        )
    if grid.idle_unsplit:
        text += (
            f"That leaves {grid.idle_unsplit} multiprocessors idle while one program walks the"
            f" whole context, so `choose_num_splits` cuts each sequence into {grid.splits} parts:"
            f" {grid.programs} programs"
        )
        if grid.bound == "occupancy":
            return text + f", {_per_sm(grid.programs, sms)}."
        return (
            text
            + f", as many as the context allows with at least {min_tiles} tiles of {tile_tokens}"
            f" tokens per split; {max(0, sms - grid.programs)} multiprocessors stay idle."
        )
    if grid.splits > 1:
        return (
            text + "Every multiprocessor already has a program, but `choose_num_splits` aims for"
            f" {programs_per_sm} per multiprocessor, so it still cuts each sequence into"
            f" {grid.splits} parts: {grid.programs} programs, {grid.splits} times the grid,"
            f" {_per_sm(grid.programs, sms)}. The extra programs occupy no idle multiprocessor"
            " (the grid model's bound on the gain, `busy_gain`, is 1); they give each"
            " multiprocessor a second program to run while the first waits on memory, against"
            " the cost of a merge over the parts."
        )
    if grid.wanted <= 1:
        return (
            text + f"That is already {programs_per_sm} or more per multiprocessor, so"
            " `choose_num_splits` keeps one split."
        )
    return (
        text
        + f"The context is too short to give two splits {min_tiles} tiles of {tile_tokens} tokens"
        " each, so `choose_num_splits` keeps one split."
    )


def fp64_reading(errors: dict, dtype, lengths) -> str:
    """The kernel against attention computed in fp64 from the definition, on random block tables;
    the verdict is :func:`kvlab.theory.kernel_rounding.explained_by_rounding`."""
    instance("errors", errors, dict)
    worst_case, worst = max(errors.items(), key=lambda kv: kv[1])
    tolerance, name = rounding_tolerance(dtype), str(dtype).removeprefix("torch.")
    rows = "\n".join(f"| {g} | {s} | {e:.1e} |" for (g, s), e in sorted(errors.items()))
    table = f"| GQA group | splits | largest difference from fp64 |\n|---:|---:|---:|\n{rows}\n\n"
    where = f"sequence lengths {', '.join(map(str, lengths))}, randomly permuted block tables"
    if explained_by_rounding(worst, dtype):
        return (
            table
            + f"In every run ({where}) the kernel in {name} stays within the {tolerance:.0e} that"
            f" {name} rounding explains (`kvlab.theory.kernel_rounding.rounding_tolerance`); the"
            f" largest difference is **{worst:.1e}** (group {worst_case[0]}, {worst_case[1]}"
            " splits). Splits beyond a short sequence's tiles are empty, and they change"
            " nothing."
        )
    return (
        table + f"The kernel in {name} differs from fp64 attention by up to **{worst:.1e}** (group "
        f"{worst_case[0]}, {worst_case[1]} splits; {where}), more than the {tolerance:.0e} that "
        f"{name} rounding explains: that is a bug in the kernel or its wrapper, not rounding."
    )


def _bandwidth(timing, copy_bytes_per_s: float) -> str:
    return (
        f"It read the {si(timing.kv_bytes, 'B')} of keys and values at"
        f" {si(timing.split_bytes_per_s, 'B/s')},"
        f" **{timing.split_bytes_per_s / copy_bytes_per_s:.0%}** of this GPU's calibrated copy"
        " bandwidth. "
    )


def split_reading(result: dict, num_splits: int, context: int) -> str:
    """Under the split-K explorer: the kernel with ``num_splits`` splits against one split, timed in
    one alternating loop (``result["timing"]``, a ``SplitTiming``), read against the grid model
    (``result["grid"]``, a ``SplitGrid``: what splitting can gain at most)."""
    instance("result", result, dict)
    timing, grid, gpu = result["timing"], result["grid"], result["gpu"]
    slots = (
        f"on {grid.multiprocessors} multiprocessors"
        if gpu
        else "which Triton's interpreter runs one after another"
    )
    if num_splits == 1:
        text = (
            f"At context {context:,}, batch 1, the kernel with one split took"
            f" {si(timing.split.median, 's')}: the baseline. Every other slider position times its"
            " split count against one split in one loop that alternates the two. "
        )
        return text + (_bandwidth(timing, result["copy"]) if gpu else "")
    c = compare_timings(timing.split, timing.one)
    text = (
        f"At context {context:,}, batch 1, the kernel with {num_splits} splits took"
        f" {si(timing.split.median, 's')} and with one split {si(timing.one.median, 's')}, in one"
        " loop that alternates them: "
        + (
            f"one split took **{c.ratio:.2f} times** as long. "
            if c.ratio >= 1
            else f"the split kernel took **{1 / c.ratio:.2f} times** as long as one split. "
        )
        + "The grid model bounds the gain by the multiprocessors kept busy: "
        f"{grid.programs_unsplit} programs without splitting and {grid.programs} with, {slots}, so "
        + (f"at most {grid.busy_gain:.3g} times. " if grid.predicts_gain else "no gain at all. ")
    )
    if gpu:
        text += _bandwidth(timing, result["copy"])
    spread = "no difference beyond the spread of the repeats" if c.outcome == "even" else "a loss"
    if grid.predicts_gain and c.outcome == "faster":
        return (
            text + "Splitting paid, as the model predicts: more programs kept more multiprocessors"
            " reading at once."
        )
    if grid.predicts_gain:
        return (
            text
            + f"The model expected a gain; the run measured {spread}. The likely reason: at this"
            " context each split holds few tiles, so launching and merging the splits cost as"
            " much as the parallelism saved, or fewer programs already kept the memory system"
            " busy."
        )
    if c.outcome == "faster":
        if gpu:
            return (
                text + "The model expected no gain, since the unsplit grid already fills every"
                " multiprocessor; splitting paid anyway. More programs per multiprocessor hide"
                " memory latency, which the model does not count."
            )
        return (
            text
            + "The model expected no gain, yet the split kernel was faster beyond the spread of the"
            " repeats. The interpreter's cost per program and per tile is not a GPU's, and a"
            " shared CPU drifts: a gain here is not parallel hardware at work."
        )
    if gpu:
        return (
            text
            + "As the model predicts, splitting gained nothing: the unsplit grid already kept every"
            " multiprocessor busy."
        )
    return (
        text
        + "As the model predicts, splitting gained nothing here: it adds merge work and program"
        " overhead and no parallelism under the interpreter. The GPU is where splits pay, by"
        " occupying multiprocessors a batch-1 grid leaves idle."
    )


def graph_splits_reading(
    fixed, context: int, per_step: int, width_tokens: int, where: str, empty: int
) -> str:
    """The split count a captured CUDA graph fixes (``fixed``: the ``SplitGrid`` for the table
    width) against the one a step at ``context`` tokens would choose (``per_step``), and the empty
    splits that leaves.
    """
    instance("where", where, str)
    text = (
        f"On {where}, at batch {fixed.batch} with {fixed.kv_heads} KV heads and block tables"
        f" {width_tokens:,} tokens wide, the captured graph runs **{fixed.splits} splits** at every"
        f" context. A step over sequences of {context:,} tokens, choosing for itself, would take"
        f" {per_step}. "
    )
    if empty:
        return (
            text
            + f"In the graph {empty} of the {fixed.splits} splits of such a sequence hold no token:"
            " each of those programs loads the length, skips its loop, stores output 0 and"
            " log-sum-exp $-\\infty$, and the merge weighs it by 0. That is the price of one"
            " graph for every context length."
        )
    return (
        text + "Here the fixed count leaves no split empty: the graph costs this sequence nothing."
    )


def recorded_reading(runs, folder: str) -> str:
    """What the book's records (``kvlab.lab.paged_kernel.recorded_runs``) hold for the paged
    kernel."""
    instance("folder", folder, str)
    instance("runs", runs, (list, tuple), "a list")
    for i, run in enumerate(runs):
        record(f"runs[{i}]", run, "kvlab.lab.paged_kernel.RecordedRun", "device", "gpu", "rows")
    if not runs:
        return (
            f"No record of this section was found in `{folder}` (a copy of this notebook without"
            " the book's data has none): only this machine's own figures can be read here."
        )
    gpu = [r for r in runs if r.gpu]
    if not gpu:
        described = "; ".join(
            f"{r.device}, {r.date}: its paged-attention rows time the {r.path or 'unnamed'}"
            " path, at "
            + ", ".join(
                f"{v:.0%} ({n.removeprefix('paged / copy bandwidth ')})"
                for n, v, _, _ in r.rows
                if n.startswith("paged / copy bandwidth")
            )
            + " of its copy bandwidth"
            for r in runs
        )
        return (
            f"The book's records (`{folder}`) hold {len(runs)} run{'s' * (len(runs) != 1)} of this"
            f" section, none on a GPU ({described}). So no GPU measurement of the Triton kernel is"
            " recorded yet: the kernel's bandwidth on a GPU is not known to this book."
            " `scripts/gpu_check.sh` on a CUDA machine writes such a record, and this paragraph"
            " then becomes its table."
        )
    kernel_rows = (
        "paged attention",
        "paged / copy bandwidth",
        "permuted / identity",
        "num_splits=1 / split-K",
        "split-K paged attention",
    )
    lines = []
    for r in gpu:
        lines += [
            f"Recorded on **{r.device}**, {r.date} ({r.path or 'unnamed'} path):",
            "",
            "| measurement | value |",
            "|---|---:|",
        ]
        lines += [
            f"| {n} | {v:.4g} {u} |" for n, v, u, _ in r.rows if n.startswith(kernel_rows)
        ] + [""]
    return "\n".join(lines)
