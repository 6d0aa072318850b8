"""Every notebook: every measurement the book quotes, as one table (``python -m kvlab bench`` and
``record``).

Each benchmark returns rows of ``(name, value, unit, note)``: a function registered here with
``@benchmark``, or a section module's own ``bench_rows()`` listed in ``SECTION_BENCHMARKS``. Methods
that are compared run interleaved in one process and are reported as ratios, because a shared
machine drifts between runs; absolute times are meaningful only from a quiet GPU.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kvlab._checks import instance, items

BENCHMARKS: dict[str, Callable[[], list]] = {}


@dataclass(frozen=True)
class Row:
    name: str
    value: float
    unit: str
    note: str = ""


def benchmark(name: str):
    """Register a benchmark under ``name`` (the book section it serves)."""

    instance("name", name, str, "a str (the book section)")

    def register(fn):
        BENCHMARKS[name] = fn
        return fn

    return register


# The sections whose module keeps its own ``bench_rows()``: book section -> kvlab module.
SECTION_BENCHMARKS = {
    "9.1 decode on a pretrained model": "kvlab.lab.decode_timing",
    "9.2 decode loops": "kvlab.lab.decode_peers",
    "9.3 GEMV and the ridge": "kvlab.lab.gemv",
    "9.4 KV layouts": "kvlab.lab.layout_timing",
    "9.5 paged attention and admission": "kvlab.lab.paged_attention",
    "prefix caching": "kvlab.lab.prefix",
    "9.6 SSM state and scans": "kvlab.lab.ssm_timing",
    "9.7 long-context caches": "kvlab.lab.cache_quality",
    "9.8 decode diagnosis": "kvlab.lab.diagnose",
    "11 continuous batching engine": "kvlab.lab.engine",
    "12 decode across devices": "kvlab.lab.parallel",
    "13 speculative decoding": "kvlab.lab.speculative",
}


def _module_rows(module: str, function: str = "bench_rows") -> list[Row]:
    return getattr(importlib.import_module(module), function)()


for _title, _module in SECTION_BENCHMARKS.items():
    BENCHMARKS[_title] = functools.partial(_module_rows, _module)


# ``bench --quick``: under a minute on the 2-core CPU that builds the book (timed there one by one,
# one thread, under load, 2026-12-01): the decode loops at 32 new tokens, once, uncompiled, and the
# sections that take seconds. The full table takes minutes there, most of them in the decode loops
# and the engine.
QUICK = {
    "9.2 decode loops": functools.partial(_module_rows, "kvlab.lab.decode_peers", "quick_rows")
}
QUICK_SECTIONS = ("9.5 paged attention and admission", "prefix caching", "9.8 decode diagnosis")


def run(names=None, quick: bool = False) -> dict[str, list[Row]]:
    """Run the named benchmarks (all by default, or the ``QUICK`` ones) and return their rows. A
    section that needs Triton where it is not installed gets one row saying so instead."""
    chosen = {**QUICK, **{n: BENCHMARKS[n] for n in QUICK_SECTIONS}} if quick else BENCHMARKS
    names = list(chosen) if names is None else names
    unknown = [n for n in names if n not in chosen]
    if unknown:
        raise ValueError(
            f"unknown benchmark(s) {unknown}; known{' with --quick' * quick}: {list(chosen)}"
        )
    results = {}
    for name in names:
        try:
            results[name] = chosen[name]()
        except ModuleNotFoundError as e:
            if e.name != "triton":
                raise
            results[name] = [Row("skipped", float("nan"), "", str(e))]
    return results


def table(results: dict[str, list[Row]]) -> str:
    """A plain-text table, one block per benchmark."""
    instance("results", results, dict, "a dict of benchmark name -> rows")
    lines = []
    for name, rows in results.items():
        lines.append(f"## {name}")
        width = max(len(r.name) for r in rows)
        for r in rows:
            lines.append(f"  {r.name:<{width}}  {r.value:>12.4g} {r.unit:<10} {r.note}")
    return "\n".join(lines)


def to_json(results: dict[str, list[Row]]) -> dict:
    instance("results", results, dict, "a dict of benchmark name -> rows")
    from kvlab.lab.hardware import calibrate, stamp

    return {
        "stamp": stamp(),
        "calibration": asdict(calibrate()),
        "results": {name: [asdict(r) for r in rows] for name, rows in results.items()},
    }


def _column(record: dict) -> str:
    s = record["stamp"]
    return f"{s['device']}, {s['date']}"


# A benchmark section's name in a record (``"9.5 paged attention and admission"``, the numbering the
# records were written with) -> the book chapter it serves.
CHAPTER_OF_SECTION = {
    "9.1": "1",
    "9.2": "2",
    "9.3": "3",
    "9.4": "4",
    "9.5": "5",
    "prefix": "6",
    "9.6": "7",
    "9.7": "8",
    "9.8": "9",
    "11": "11",
    "12": "12",
}


def chapter_heading(section: str) -> str:
    """``"9.5 paged attention and admission"`` -> ``"Chapter 5: paged attention and admission"``."""
    instance("section", section, str)
    first, _, rest = section.partition(" ")
    if first not in CHAPTER_OF_SECTION:
        return section
    numbered = first[0].isdigit()  # "prefix caching" names its section without a number
    return f"Chapter {CHAPTER_OF_SECTION[first]}: {rest if numbered else section}"


def records_markdown(records: list[dict]) -> str:
    """The recorded runs (``python -m kvlab record`` files) as Markdown, for the book's page of
    recorded measurements: one table of stamps, then one table per chapter with one column per
    run, so a GPU's figures stand beside the CPU's, and what each row measures (its note). Rows
    missing from a run show a dash."""
    records = items("records", records, dict, what="record dicts")
    if not records:
        return "No run has been recorded yet."
    records = sorted(records, key=lambda r: ("CPU" in r["stamp"]["device"], r["stamp"]["date"]))
    lines = []
    if all("CPU" in r["stamp"]["device"] for r in records):
        lines += [
            "No GPU run has been recorded yet: the sessions that built this edition had no GPU, so"
            " each table below has the CPU's column only. Read a row as what this CPU does; the"
            " chapters say where a GPU's constants change the picture.",
            "",
        ]
    keys = ("device", "driver", "torch", "triton", "transformers", "date")
    lines += [
        "| run | " + " | ".join(keys) + " | copy bandwidth | matmul |",
        "|---|" + "---|" * len(keys) + "---:|---:|",
    ]
    for i, r in enumerate(records, 1):
        c = r["calibration"]
        lines.append(
            f"| {i} | "
            + " | ".join(str(r["stamp"].get(k, "")) for k in keys)
            + f" | {c['copy_bytes_per_s'] / 1e9:.4g} GB/s | {c['matmul_flops'] / 1e12:.4g} TFLOP/s"
            f" {c['matmul_dtype']} |"
        )
    sections = list(dict.fromkeys(name for r in records for name in r["results"]))
    for section in sections:
        names = list(
            dict.fromkeys(row["name"] for r in records for row in r["results"].get(section, []))
        )
        found = [{row["name"]: row for row in r["results"].get(section, [])} for r in records]
        lines += [
            "",
            f"**{chapter_heading(section)}**",
            "",
            "| benchmark | "
            + " | ".join(f"run {i}" for i in range(1, len(records) + 1))
            + " | unit | what it measures |",
            "|---|" + "---:|" * len(records) + "---|---|",
        ]
        for name in names:
            unit = next(f[name]["unit"] for f in found if name in f)
            note = next(
                (f[name].get("note") for f in found if name in f and f[name].get("note")), ""
            )
            cells = [f"{f[name]['value']:.4g}" if name in f else "–" for f in found]
            note = note.replace("|", "\\|")
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {unit} | {note} |")
    return "\n".join(lines)


def load_records(folder) -> list[dict]:
    """Every ``*.json`` record in ``folder`` (``book/data/measurements``), in name order; none
    where the folder does not exist (a notebook downloaded without the book's records)."""
    from pathlib import Path

    if Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"folder must be a folder of records (*.json), got {folder!r}")
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
