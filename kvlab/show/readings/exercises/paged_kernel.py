"""Notebook 05b, the paged decode kernel (section 9.5): worked solutions of the exercises that have numbers."""

from __future__ import annotations

from kvlab.show.readings.exercises.folded import solution


def paged_kernel_rows(q_heads: int, kv_heads: int, rows: int) -> str:
    """Exercise 1 of the paged kernel: the useful share of ``tl.dot`` rows for a GQA group."""
    group = q_heads // kv_heads
    text = (f"One program serves one KV head and its group of $G = {q_heads} / {kv_heads} = {group}$ query "
            f"heads. `tl.dot` needs at least 16 rows, so the kernel pads the group to {rows} rows "
            f"(`_group_rows({group})`): **{group / rows:.0%}** of the rows it multiplies are useful. ")
    if group >= rows:
        text += ("The group fills the tile, so nothing is wasted; the key and value tiles are still read "
                 "once for the whole group, which is the point of grouped-query attention.")
    else:
        text += ("The padded rows cost tensor-core arithmetic, not memory traffic: the key and value tiles "
                 "are read once for the group either way, and decode is bound by that read, so the waste "
                 "hardly shows in the step time.")
    return solution(1, text)


def paged_kernel_splits(multiprocessors: int, kv_heads: int, context: int, wanted: int, useful: int,
                        chosen: int, tile_tokens: int, min_tiles: int) -> str:
    """Exercise 2 of the paged kernel: how many splits ``choose_num_splits`` picks at batch 1."""
    text = (f"At batch 1 there are only {kv_heads} programs without splitting (one per KV head), for "
            f"{multiprocessors} multiprocessors. To give every multiprocessor two programs the kernel would "
            f"want $\\lceil 2 \\cdot {multiprocessors} / {kv_heads} \\rceil = {wanted}$ splits. But each split "
            f"should keep at least {min_tiles} tiles of {tile_tokens} tokens, so that its fixed cost (loading "
            f"the query, writing a partial result and its log-sum-exp) is spread over enough keys: "
            f"$\\lceil {context} / ({tile_tokens} \\cdot {min_tiles}) \\rceil = {useful}$ splits at most. "
            f"`choose_num_splits` takes the smaller, **{chosen}**")
    if chosen < wanted:
        text += (f", so at context {context:,} the grid has {chosen * kv_heads} programs and leaves part of the "
                 "machine idle: the sequence is too short to split further usefully.")
    else:
        text += (f", which fills the machine with {chosen * kv_heads} programs: the sequence is long enough "
                 "for every split to keep its minimum of tiles.")
    return solution(2, text)


def paged_kernel_empty_split(max_difference: float, lse_difference: float) -> str:
    """Exercise 3 of the paged kernel: a split with ``lse = -inf`` and a NaN output in the merge."""
    text = ("Prediction: an empty split has weight $e^{-\\infty - m} = 0$, so the merge should equal the merge "
            "of the other splits alone, whatever the empty split's output holds. A plain weighted sum would "
            "not: $0 \\cdot \\text{NaN}$ is NaN. ")
    if max_difference == 0 and lse_difference == 0:
        text += ("Measured: the output and the log-sum-exp are exactly those of the other splits "
                 "(difference 0), because `merge_partials` masks the outputs of zero-weight splits before "
                 "the sum. This is what makes empty splits harmless: a split that lies past a short sequence's "
                 "end need not produce a meaningful output.")
    else:
        text += (f"Measured: the merge differs from the merge of the other splits by {max_difference:.3g} in "
                 f"the output and {lse_difference:.3g} in the log-sum-exp. That would be a bug: an empty split "
                 "must not change the result.")
    return solution(3, text)
