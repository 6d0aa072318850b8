"""Notebook 05b, the paged decode kernel (section 9.5): its grid model, and its records.

- :func:`split_grid`: stage 1's grid for a decode step against the multiprocessors that run it, the
  split count ``choose_num_splits`` picks, and what the grid model predicts splitting can gain.
- :func:`recorded_runs`: what ``book/data/measurements/`` holds for the kernel (section 9.5's rows
  of each ``python -m kvlab record`` file), so that the page says what is recorded, from the
  records.

The timings themselves are :func:`kvlab.lab.paged_attention.compare_splits`; the rounding that
explains its difference from fp64 attention is ``kvlab.theory.kernel_rounding``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab import kernels
from kvlab._checks import integer, items

SECTION = (  # this page's rows in ``python -m kvlab record`` files
    "9.5 paged attention and admission"
)


@dataclass(frozen=True)
class SplitGrid:
    """Stage 1's grid ``(batch, kv_heads, splits)`` against ``multiprocessors`` (notebook 05b).

    ``wanted`` and ``useful`` are the two limits ``choose_num_splits`` takes the smaller of: the
    splits that give every multiprocessor ``PROGRAMS_PER_SM`` programs, and the most that leave
    every split ``MIN_TILES_PER_SPLIT`` tiles of the context. The grid model of a step bound by
    memory: programs on different multiprocessors read at once, so splitting can speed a step up at
    most by the factor ``busy_gain`` by which it raises the number of busy multiprocessors,
    min(programs, SMs).
    """

    batch: int
    kv_heads: int
    context: int
    multiprocessors: int
    splits: int
    wanted: int
    useful: int

    @property
    def programs_unsplit(self) -> int:
        return self.batch * self.kv_heads

    @property
    def programs(self) -> int:
        return self.programs_unsplit * self.splits

    @property
    def idle_unsplit(self) -> int:
        """Multiprocessors the unsplit grid leaves without a program."""
        return max(0, self.multiprocessors - self.programs_unsplit)

    @property
    def busy_gain(self) -> float:
        """How many times as many multiprocessors the split grid keeps busy as the unsplit one."""
        return min(self.programs, self.multiprocessors) / min(
            self.programs_unsplit, self.multiprocessors
        )

    @property
    def predicts_gain(self) -> bool:
        return self.busy_gain > 1

    def empty_splits(self, seq_len: int) -> int:
        """Splits that hold no token of a sequence of ``seq_len`` tokens: split j takes tiles [j t,
        (j + 1) t), t = ceil(tiles / splits), as stage 1 does."""
        tiles = math.ceil(integer("seq_len", seq_len, 1) / kernels.paged_attention.TILE_TOKENS)
        per = math.ceil(tiles / self.splits)
        return self.splits - math.ceil(tiles / per)

    @property
    def bound(self) -> str:
        """What set ``splits``: ``"occupancy"`` (wanted), ``"tiles"`` (useful), ``"max_splits"``, or
        ``"given"``."""
        choice = min(self.wanted, self.useful, kernels.paged_attention.MAX_SPLITS)
        if self.splits != max(1, choice):
            return "given"
        if choice == self.wanted:
            return "occupancy"
        return "tiles" if choice == self.useful else "max_splits"


def split_grid(
    batch: int, kv_heads: int, context: int, multiprocessors: int, num_splits: int | None = None
) -> SplitGrid:
    """The grid of one decode step of ``batch`` sequences of ``context`` tokens with ``kv_heads`` KV
    heads, with ``num_splits`` splits (None: what ``kvlab.kernels.choose_num_splits`` picks). Under
    Triton's interpreter the programs run one after another: pass ``multiprocessors=1`` to model
    that."""
    pa = kernels.paged_attention
    for name, value in (
        ("batch", batch),
        ("kv_heads", kv_heads),
        ("context", context),
        ("multiprocessors", multiprocessors),
    ):
        integer(name, value, 1)
    splits = (
        kernels.choose_num_splits(batch, kv_heads, context, multiprocessors)
        if num_splits is None
        else integer("num_splits", num_splits, 1)
    )
    wanted = math.ceil(pa.PROGRAMS_PER_SM * multiprocessors / (batch * kv_heads))
    useful = math.ceil(context / (pa.TILE_TOKENS * pa.MIN_TILES_PER_SPLIT))
    return SplitGrid(batch, kv_heads, context, multiprocessors, splits, wanted, useful)


# --------------------------------------------------------------------------- the records


@dataclass(frozen=True)
class RecordedRun:
    """One ``python -m kvlab record`` file's rows for this section: ``rows`` are ``(name, value,
    unit, note)``; ``path`` is the attention path its paged rows timed (``"kernel"`` or
    ``"gather"``)."""

    device: str
    date: str
    gpu: bool
    path: str | None
    rows: tuple


def recorded_runs(records) -> list[RecordedRun]:
    """Section 9.5's rows of each record (``kvlab.lab.bench.load_records``), GPU runs first; records
    without the section are left out."""
    records = items("records", records, dict, what="record dicts")
    runs = []
    for record in records:
        rows = record.get("results", {}).get(SECTION)
        if not rows:
            continue
        stamp = record["stamp"]
        notes = [r.get("note", "") for r in rows if r["name"].startswith("paged attention")]
        path = next(
            (
                p
                for p in ("kernel", "gather", "reference")
                for n in notes
                if n.endswith(f"{p} path")
            ),
            None,
        )
        runs.append(
            RecordedRun(
                stamp["device"],
                stamp.get("date", ""),
                not stamp["device"].startswith("CPU"),
                path,
                tuple((r["name"], r["value"], r["unit"], r.get("note", "")) for r in rows),
            )
        )
    return sorted(runs, key=lambda r: (not r.gpu, r.date))
