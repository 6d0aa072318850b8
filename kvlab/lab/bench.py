"""Every notebook: every measurement the book quotes, as one table (``python -m kvlab bench`` and ``record``).

Each benchmark returns rows of ``(name, value, unit, note)``: a function registered here with
``@benchmark``, or a section module's own ``bench_rows()`` listed in ``SECTION_BENCHMARKS``. Methods that are compared run interleaved in one process and are
reported as ratios, because a shared machine drifts between runs; absolute times are meaningful
only from a quiet GPU.
"""

from __future__ import annotations

import functools
import importlib
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

BENCHMARKS: dict[str, Callable[[], list]] = {}


@dataclass(frozen=True)
class Row:
    name: str
    value: float
    unit: str
    note: str = ""


def benchmark(name: str):
    """Register a benchmark under ``name`` (the book section it serves)."""
    def register(fn):
        BENCHMARKS[name] = fn
        return fn
    return register


@benchmark("9.2 decode loops")
def decode_loops(reps: int = 3, new_tokens: int = 128) -> list[Row]:
    """Naive, cached and static decode at P=128, G=``new_tokens``, batch 1, interleaved ``reps`` times.

    CPU: the tiny Llama (fp32). GPU: the Llama-3.2-1B shape with random weights in bf16, where the
    static loop is compiled and replayed as a CUDA graph; its steady-state step is compared with the
    weight-bandwidth floor (weight bytes / measured copy bandwidth).
    """
    import torch

    from kvlab.lab.decode_timing import profile_decode
    from kvlab.lab.hardware import calibrate
    from kvlab.devices import on_gpu
    from kvlab.lab.models import tiny_model

    gpu = on_gpu()
    model = tiny_model("llama", size="real") if gpu else tiny_model("llama")
    prompt = torch.randint(0, model.config.vocab_size, (1, 128), device=model.device)
    options = {"static": {"compile": gpu}}
    profile_decode(model, prompt, 4, method="cached")  # warm the allocator and kernels
    runs: dict[str, list] = {m: [] for m in ("naive", "cached", "static")}
    for _ in range(reps):
        for method in runs:
            runs[method].append(profile_decode(model, prompt, new_tokens, method=method, **options.get(method, {})))
    tps = {m: statistics.median(p.tokens_per_s for p in ps) for m, ps in runs.items()}
    where = f"{model.shape.name}, {str(model.dtype).removeprefix('torch.')}, P=128, G={new_tokens}, batch 1"
    rows = [Row(f"{m} decode", tps[m], "tokens/s", where) for m in runs]
    rows += [
        Row("cached / naive", tps["cached"] / tps["naive"], "x", "ratio of medians, same run"),
        Row("static / cached", tps["static"] / tps["cached"], "x", "ratio of medians, same run"),
    ]
    # Steady state of the static loop: the later steps, after compilation and graph capture.
    steady = statistics.median(t for p in runs["static"] for t in p.step_times[8:])
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor = weight_bytes / calibrate().copy_bytes_per_s
    rows += [
        Row("static step (steady)", steady * 1e3, "ms", f"median of steps 9..{new_tokens - 1}"),
        Row("weight-read floor", floor * 1e3, "ms", f"{weight_bytes / 1e6:.0f} MB / measured copy bandwidth"),
        Row("floor / static step", floor / steady, "fraction", "1.0 = reads weights at copy speed"),
    ]
    return rows


# The sections whose module keeps its own ``bench_rows()``: book section -> kvlab module.
SECTION_BENCHMARKS = {
    "9.3 GEMV and the ridge": "kvlab.lab.gemv",
    "9.4 KV layouts": "kvlab.lab.layout_timing",
    "9.5 paged attention and admission": "kvlab.lab.paged_attention",
    "prefix caching": "kvlab.lab.prefix",
    "9.6 SSM state and scans": "kvlab.lab.ssm_timing",
    "9.7 long-context caches": "kvlab.lab.cache_quality",
    "9.8 decode diagnosis": "kvlab.lab.diagnose",
    "11 continuous batching engine": "kvlab.lab.engine",
    "12 decode across devices": "kvlab.lab.parallel",
}


def _module_rows(module: str) -> list[Row]:
    return importlib.import_module(module).bench_rows()


for _title, _module in SECTION_BENCHMARKS.items():
    BENCHMARKS[_title] = functools.partial(_module_rows, _module)


# ``bench --quick``: under a minute on the 2-core CPU that builds the book (timed there one by one, one
# thread, under load, 2026-12-01): the decode loops at 32 new tokens, once, and the sections that take
# seconds. The full table takes minutes there, most of them in the decode loops and the engine.
QUICK = {"9.2 decode loops": functools.partial(decode_loops, reps=1, new_tokens=32)}
QUICK_SECTIONS = ("9.5 paged attention and admission", "prefix caching", "9.8 decode diagnosis")


def run(names=None, quick: bool = False) -> dict[str, list[Row]]:
    """Run the named benchmarks (all by default, or the ``QUICK`` ones) and return their rows. A
    section that needs Triton where it is not installed gets one row saying so instead."""
    chosen = {**QUICK, **{n: BENCHMARKS[n] for n in QUICK_SECTIONS}} if quick else BENCHMARKS
    names = list(chosen) if names is None else names
    unknown = [n for n in names if n not in chosen]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known{' with --quick' * quick}: {list(chosen)}")
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
    lines = []
    for name, rows in results.items():
        lines.append(f"## {name}")
        width = max(len(r.name) for r in rows)
        for r in rows:
            lines.append(f"  {r.name:<{width}}  {r.value:>12.4g} {r.unit:<10} {r.note}")
    return "\n".join(lines)


def to_json(results: dict[str, list[Row]]) -> dict:
    from kvlab.lab.hardware import calibrate, stamp

    return {
        "stamp": stamp(),
        "calibration": asdict(calibrate()),
        "results": {name: [asdict(r) for r in rows] for name, rows in results.items()},
    }


def _column(record: dict) -> str:
    s = record["stamp"]
    return f"{s['device']}, {s['date']}"


def records_markdown(records: list[dict]) -> str:
    """The recorded runs (``python -m kvlab record`` files) as Markdown, for the book's page of recorded
    measurements: one table of stamps, then one table per benchmark with one column per run, so a
    GPU's figures stand beside the CPU's. Rows missing from a run show a dash."""
    if not records:
        return "No run has been recorded yet."
    records = sorted(records, key=lambda r: ("CPU" in r["stamp"]["device"], r["stamp"]["date"]))
    keys = ("device", "driver", "torch", "triton", "transformers", "date")
    lines = ["| run | " + " | ".join(keys) + " | copy bandwidth | matmul |",
             "|---|" + "---|" * len(keys) + "---:|---:|"]
    for i, r in enumerate(records, 1):
        c = r["calibration"]
        lines.append(f"| {i} | " + " | ".join(str(r["stamp"].get(k, "")) for k in keys)
                     + f" | {c['copy_bytes_per_s'] / 1e9:.4g} GB/s | {c['matmul_flops'] / 1e12:.4g} TFLOP/s {c['matmul_dtype']} |")
    sections = list(dict.fromkeys(name for r in records for name in r["results"]))
    for section in sections:
        names = list(dict.fromkeys(row["name"] for r in records for row in r["results"].get(section, [])))
        found = [{row["name"]: row for row in r["results"].get(section, [])} for r in records]
        lines += ["", f"**{section}**", "",
                  "| benchmark | " + " | ".join(f"run {i}" for i in range(1, len(records) + 1)) + " | unit |",
                  "|---|" + "---:|" * len(records) + "---|"]
        for name in names:
            unit = next(f[name]["unit"] for f in found if name in f)
            cells = [f"{f[name]['value']:.4g}" if name in f else "–" for f in found]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {unit} |")
    if all("CPU" in r["stamp"]["device"] for r in records):
        lines += ["", "No GPU run has been recorded yet: the sessions that built this edition had no GPU."]
    return "\n".join(lines)


def load_records(folder) -> list[dict]:
    """Every ``*.json`` record in ``folder`` (``book/data/measurements``), in name order."""
    from pathlib import Path

    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
