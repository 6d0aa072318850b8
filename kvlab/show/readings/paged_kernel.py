"""Readings of the paged decode kernel page (notebook ``05b_paged_kernel``, section 9.5)."""

from __future__ import annotations


def source_block(source: str) -> str:
    """A kernel's source as a Markdown code block: the page shows the package's own code."""
    return f"```python\n{source.rstrip()}\n```"


def padding_reading(rows: dict[int, int]) -> str:
    """How many of the ``tl.dot`` rows a GQA group fills, for each group size (``{group: padded rows}``)."""
    cells = "\n".join(f"| {g} | {p} | {g / p:.0%} |" for g, p in sorted(rows.items()))
    return ("| query heads per KV head | rows given to `tl.dot` | rows doing useful work |\n|---:|---:|---:|\n"
            f"{cells}")


def programs_reading(batch: int, kv_heads: int, multiprocessors: int, splits: int, where: str) -> str:
    """Programs of an unsplit grid against the multiprocessors that could run them, and the split chosen."""
    programs = batch * kv_heads
    text = (f"On {where}, with {multiprocessors} multiprocessors, a decode step at batch {batch} with {kv_heads} KV "
            f"heads launches {programs} program{'s' * (programs != 1)} without splitting. ")
    if programs < multiprocessors:
        return text + (f"That leaves {multiprocessors - programs} multiprocessors idle while one program walks the "
                       f"whole context, so `choose_num_splits` cuts each sequence into {splits} parts: "
                       f"{programs * splits} programs.")
    return text + (f"That already covers every multiprocessor, so `choose_num_splits` adds little: {splits} "
                   f"part{'s' * (splits != 1)} per sequence.")


def fp64_reading(errors: dict, tolerance: float, dtype: str, lengths) -> str:
    """The kernel against attention computed in fp64 from the definition, on random block tables."""
    worst_case, worst = max(errors.items(), key=lambda kv: kv[1])
    rows = "\n".join(f"| {g} | {s} | {e:.1e} |" for (g, s), e in sorted(errors.items()))
    table = f"| GQA group | splits | largest difference from fp64 |\n|---:|---:|---:|\n{rows}\n\n"
    where = f"sequence lengths {', '.join(map(str, lengths))}, randomly permuted block tables"
    if worst <= tolerance:
        return table + (f"In every run ({where}) the kernel in {dtype} stays within the {tolerance:.0e} that "
                        f"{dtype} arithmetic allows; the largest difference is **{worst:.1e}** (group "
                        f"{worst_case[0]}, {worst_case[1]} splits). Splits beyond a short sequence's tiles are "
                        "empty, and they change nothing.")
    return table + (f"The kernel in {dtype} differs from fp64 attention by up to **{worst:.1e}** (group "
                    f"{worst_case[0]}, {worst_case[1]} splits; {where}), more than the {tolerance:.0e} that "
                    f"{dtype} rounding explains: that is a bug in the kernel or its wrapper, not rounding.")


def split_reading(result: dict, num_splits: int, context: int) -> str:
    """Under the split-K explorer: the split kernel against one split, and (on a GPU) the bandwidth."""
    split, one = result["split"].paged.median, result["one"].paged.median
    ratio = one / split
    if num_splits == 1:
        text = (f"At context {context:,}, batch 1, the kernel with one split took {split * 1e3:.3g} ms: the "
                "baseline the other slider positions are compared with, each in its own run. ")
    else:
        text = (f"At context {context:,}, batch 1, the kernel with {num_splits} splits took {split * 1e3:.3g} ms "
                f"and with one split {one * 1e3:.3g} ms ({ratio:.2f} times as fast, same run). ")
    if not result["gpu"]:
        if num_splits == 1:
            return text + "Under the CPU interpreter the programs run one after another."
        if ratio > 1.05:
            return text + ("Under the CPU interpreter the programs run one after another, so splitting was not "
                           "expected to help. A gain this size is within what a shared CPU's noise gives between "
                           "two runs, or comes from the interpreter handling shorter loops faster; it is not "
                           "parallel hardware at work.")
        return text + ("Under the CPU interpreter the programs run one after another, so splitting adds merge "
                       "work and program overhead and no parallelism: the GPU is where splits pay, by "
                       "occupying multiprocessors a batch-1 grid leaves idle.")
    fraction = result["split"].paged_bytes_per_s / result["copy"]
    text += (f"It read the {result['split'].kv_bytes / 1e6:.3g} MB of keys and values at "
             f"{result['split'].paged_bytes_per_s / 1e9:.3g} GB/s, **{fraction:.0%}** of this GPU's calibrated copy "
             "bandwidth. ")
    if num_splits == 1:
        return text + "Move the slider to more splits to see how many multiprocessors one program leaves idle."
    if ratio > 1.05:
        return text + "Splitting paid: more programs kept more multiprocessors reading at once."
    return text + ("Splitting did not pay here: at this context one split's programs already kept the memory "
                   "system busy, or the merge and launch cost as much as the extra parallelism saved.")
