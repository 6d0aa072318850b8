"""Every notebook: a newcomer's first hour, measured from a fresh clone, and the README written from
it.

    python scripts/first_hour.py measure   # a fresh clone of HEAD: times its set-up, `make test`,
                                           # `make book` and the bench; writes
                                           book/data/runs/first-hour-DATE.json
    python scripts/first_hour.py readme    # rewrites the README's generated blocks from the records
    python scripts/first_hour.py check     # exit 1 if the README differs from what `readme` would
    write

``make first-hour`` runs the first two (about half an hour on the 2-core CPU that builds the book),
``make readme`` the second. The README's figures are never typed: each ``<!-- first-hour: NAME -->``
... ``<!-- /first-hour -->`` block is written here, from the newest run record in
``book/data/runs/``
(times, test counts, notebook times) and the newest CPU bench record in ``book/data/measurements/``
(the measured table), and ``tests/test_readme.py`` fails when the README and the records disagree.
Standard library only (and kvlab's own table format), so it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "book" / "data" / "runs"
MEASUREMENTS = ROOT / "book" / "data" / "measurements"
BLOCK = re.compile(
    r"(<!-- first-hour: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /first-hour -->)", re.S
)
# One pytest summary line, as `pytest -q` ends: "1180 passed, 7 skipped, 2 warnings in 612.3s
# (0:10:12)".
SUMMARY = re.compile(r"^=*\s*(?P<line>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s", re.M)
NOTEBOOK_TIME = re.compile(r"^(?P<name>\w+) (?P<mode>static|live): (?P<seconds>\d+) s", re.M)
# The wall time of each phase, as `make test` ends (scripts/phases.sh): "make test phase main: 512 s".
PHASE_TIME = re.compile(r"^make test phase (?P<name>[\w ]+): (?P<seconds>\d+) s", re.M)
# What the README calls each phase.
PHASE_NAMES = {
    "lint": "lint",
    "main": "the main run",
    "floor": "the floor run",
    "dry run": "the GPU check's dry run",
}


# ---- measure ------------------------------------------------------------------------------------


def _timed(command: str, cwd: Path, log, env: dict) -> tuple[float, str]:
    """Run ``command`` in bash, append its output to ``log``, return (seconds, output); fail
    loudly."""
    log.write(f"\n$ {command}\n")
    log.flush()
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log.write(done.stdout + done.stderr + f"\n[{seconds:.0f} s, exit {done.returncode}]\n")
    log.flush()
    if done.returncode:
        raise SystemExit(
            f"`{command}` failed after {seconds:.0f} s (exit {done.returncode}); see {log.name}"
        )
    return seconds, done.stdout + done.stderr


def _pytest_summaries(output: str) -> list[dict]:
    """Each pytest run's counts (``{"passed": 1180, "skipped": 7, ...}``) and seconds, in order."""
    runs = []
    for m in SUMMARY.finditer(output):
        counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", m.group("line"))}
        runs.append(
            {"counts": counts, "seconds": float(m.group("seconds")), "line": m.group(0).strip("= ")}
        )
    return runs


def _phases(output: str) -> dict[str, int]:
    """Each phase of `make test` and its wall time in seconds, in order."""
    return {m["name"]: int(m["seconds"]) for m in PHASE_TIME.finditer(output)}


def _machine() -> dict:
    cpu = "unknown CPU"
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "python": sys.version.split()[0],
    }


def _disk_bytes(path: Path) -> int:
    out = subprocess.run(
        ["du", "-sb", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def measure(out_dir: Path = RUNS) -> Path:
    """Clone HEAD into a scratch folder and time what a newcomer does there, in order."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="kvlab-first-hour-"))
    clone = scratch / "kvlab-book"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KVLAB_STATIC")
    }
    env.update(PIP_NO_CACHE_DIR="1", OMP_NUM_THREADS="1")
    record = {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": _machine(),
        "steps": {},
    }
    log_path = scratch / "first-hour.log"
    with open(log_path, "w") as log:
        subprocess.run(
            ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True
        )
        steps = record["steps"]
        steps["venv"] = {
            "seconds": _timed("make .venv/.ready", clone, log, env)[0],
            "disk_bytes": _disk_bytes(clone / ".venv"),
        }
        steps["other environments"] = {
            "seconds": _timed(
                "make .venv-floor/.ready .venv-device/.ready .whl-floor-guard/.ready",
                clone,
                log,
                env,
            )[0]
        }
        seconds, output = _timed("make test", clone, log, env)
        steps["make test"] = {
            "seconds": seconds,
            "pytest": _pytest_summaries(output),
            "notebooks": {
                f"{m['name']} {m['mode']}": int(m["seconds"])
                for m in NOTEBOOK_TIME.finditer(output)
            },
            "phases": _phases(output),
        }
        steps["make book"] = {"seconds": _timed("make book", clone, log, env)[0]}
        steps["bench"] = {"seconds": _timed(".venv/bin/python -m kvlab bench", clone, log, env)[0]}
        steps["bench --quick"] = {
            "seconds": _timed(".venv/bin/python -m kvlab bench --quick", clone, log, env)[0]
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"first-hour-{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    return path


# ---- the README's blocks ----------------------------------------------------------------------


def newest(folder: Path, pattern: str, section: str | None = None) -> dict | None:
    """The newest record matching ``pattern`` (names carry the date), or None; with ``section``,
    the newest that holds that bench section (a record of one section, ``python -m kvlab record
    --only``, leaves the README's table on the last full run)."""
    records = [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]
    if section is not None:
        records = [r for r in records if section in r.get("results", {})]
    return records[-1] if records else None


def duration(seconds: float) -> str:
    """``95`` -> "1 min 35 s"; under a minute, "41 s"."""
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _counts(run: dict) -> str:
    c = run["counts"]
    parts = [
        f"{c[k]:,} {k}" for k in ("passed", "skipped", "failed", "xfailed", "errors") if c.get(k)
    ]
    return ", ".join(parts)


def _notebook_count(root: Path) -> int:
    return len(list((root / "notebooks").glob("*.ipynb")))


def setup_block(run: dict | None, root: Path = ROOT) -> str:
    if run is None:
        count = len(list((root / "notebooks").glob("*.ipynb")))
        return (
            f"`notebooks/` holds {count} notebooks. No fresh-clone run has been recorded yet: `make"
            " first-hour` measures one (the set-up, `make test` with its test counts, the book,"
            " the bench) and writes its figures here.\n"
        )
    s, m = run["steps"], run["machine"]
    load = m["load_average"][0]
    test = s["make test"]
    main, floor = (test["pytest"] + [None, None])[
        :2
    ]  # the main run, then the floor's (then the GPU dry run's)
    static = sorted(v for k, v in test["notebooks"].items() if k.endswith("static"))
    phases = test.get("phases") or {}  # recorded since `make test` prints them (issue 35)
    lines = [
        (
            f"Measured from a fresh clone of commit `{run['commit'][:10]}` on {run['date']}, on the"
            f" machine that builds this book ({m['cpu']}, {m['cores']} logical cores, shared: load"
            f" average {load:g} at the start), with pip's cache disabled and `OMP_NUM_THREADS=1`"
            f" (`make first-hour` measures it again; `book/data/runs/first-hour-{run['date']}.json`"
            " holds every figure):"
        ),
        "",
        (
            f"- `.venv`: {duration(s['venv']['seconds'])}, {s['venv']['disk_bytes'] / 1e9:.1f} GB"
            " on disk. PyTorch's CPU wheel came from that machine's local wheel directory;"
            " elsewhere pip takes PyTorch from PyPI, whose Linux wheel is the CUDA build of"
            " several GB, so the first set-up there takes longer and more disk."
        ),
        (
            "- `.venv-floor`, `.venv-device` and the floor guard's wheels, which `make test`"
            f" builds next: {duration(s['other environments']['seconds'])}."
        ),
        f"- `make test` after that: {duration(test['seconds'])}."
        + (f" The main run: {_counts(main)} in {duration(main['seconds'])}" if main else "")
        + (
            f", the {len(static)} notebooks executed in {static[0]} to {static[-1]} s each"
            if static
            else ""
        )
        + (", and the book built from them" if main else "")
        + (
            f"; at the floor versions: {_counts(floor)} in {duration(floor['seconds'])}"
            if floor
            else ""
        )
        + "; then the GPU check's dry run."
        + (
            " Its wall time by phase, as it prints them at the end: "
            + ", ".join(
                f"{PHASE_NAMES.get(name, name)} {duration(seconds)}"
                for name, seconds in phases.items()
            )
            + "."
            if phases
            else ""
        ),
        (
            f"- `make book` then: {duration(s['make book']['seconds'])} ("
            + (
                "it executes nothing: `make test` executed every notebook into the book's"
                " jupyter-cache and built the book from it; after a change to a notebook's code"
                " the book executes that notebook again, and only that one)."
                if phases
                else "notebook execution is cached, so a rebuild without notebook changes takes"
                " seconds)."
            )
        ),
        (
            f"- `python -m kvlab bench`: {duration(s['bench']['seconds'])}; `bench --quick`: "
            f"{duration(s['bench --quick']['seconds'])}."
        ),
    ]
    if len(static) != _notebook_count(root):
        lines += [
            "",
            (
                f"(That run executed {len(static)} notebooks; `notebooks/` now holds"
                f" {_notebook_count(root)}: `make first-hour` measures again.)"
            ),
        ]
    return (
        "\n".join(_wrap(line, "  " * line.startswith("- ")) if line else "" for line in lines)
        + "\n"
    )


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(
        text, 100, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def _stamp_line(s: dict) -> str:
    threads = (
        f" · {s['threads']} thread{'s' * (s['threads'] != 1)}"
        if "CPU" in s["device"] and "threads" in s
        else ""
    )
    return (
        f"{s['device']}{threads} · torch {s['torch']} · transformers {s['transformers']} ·"
        f" {s['date']}"
    )


def _rows(record: dict, section: str) -> dict:
    return {r["name"]: r for r in record["results"][section]}


def table_block(record: dict) -> str:
    """The decode loops of the newest CPU bench record, as `python -m kvlab bench` printed them."""
    section = "9.2 decode loops"
    rows = list(_rows(record, section).values())
    width = max(len(r["name"]) for r in rows)
    lines = ["```text", _stamp_line(record["stamp"]), f"## {section}"]
    lines += [
        f"  {r['name']:<{width}}  {r['value']:>12.4g} {r['unit']:<10} {r['note']}" for r in rows
    ]
    return "\n".join(lines + ["```"]) + "\n"


def reading_block(record: dict) -> str:
    """What that table says, in words, from its own rows (no number typed here)."""
    r = {name: row["value"] for name, row in _rows(record, "9.2 decode loops").items()}
    over_peer = "static, compiled / generate, static cache + compile"
    return (
        _wrap(
            f"In that run the cached loop made {r['cached / naive']:.3g} times the naive loop's"
            f" tokens per second and {r['cached / generate, dynamic cache']:.3g} times those of"
            " transformers' `generate` with its dynamic cache; the uncompiled static loop"
            f" {r['static / cached']:.3g} times the cached one's (1 would be the same speed: a"
            " preallocated cache alone does not remove the per-step Python dispatch). Compiled,"
            f" the static loop made {r['static, compiled / cached']:.3g} times the cached loop's"
            f" tokens per second and {r[over_peer]:.3g} times those of `generate` with a static"
            " cache and `torch.compile`, the fastest batch-1 path transformers documents; its"
            f" compilation took {r['static, compiled: compile']:.3g} s, repaid against the"
            f" uncompiled loop after {r['static, compiled: break-even']:,.0f} tokens. The"
            " weight-read floor is the time to read the model's weights once at the measured copy"
            f" bandwidth: a compiled step took {1 / r['floor / static step']:.3g} times as long. A"
            " GPU run of the same command (the Llama-3.2-1B shape, bf16, the compiled step"
            " replayed as a CUDA graph, with transformers' compiled path beside it) goes into"
            " `book/data/measurements/` when one is recorded; the tables of `book/measurements.md`"
            " show every recorded run."
        )
        + "\n"
    )


def blocks(root: Path = ROOT) -> dict[str, str]:
    run = newest(root / "book" / "data" / "runs", "first-hour-*.json")
    cpu = newest(root / "book" / "data" / "measurements", "cpu-*.json", "9.2 decode loops")
    if cpu is None:
        none = "No CPU run of `python -m kvlab record` is in `book/data/measurements/` yet.\n"
        return {"setup": setup_block(run, root), "table": none, "reading": ""}
    return {
        "setup": setup_block(run, root),
        "table": table_block(cpu),
        "reading": reading_block(cpu),
    }


def render(text: str, filled: dict[str, str]) -> str:
    names = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = set(names) - set(filled)
    if unknown or set(filled) - set(names):
        raise SystemExit(
            f"README blocks {sorted(names)} do not match the generator's {sorted(filled)}"
        )
    return BLOCK.sub(lambda m: m.group(1) + filled[m.group("name")] + m.group(4), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("measure", "readme", "check"))
    args = parser.parse_args(argv)
    readme = ROOT / "README.md"
    if args.action == "measure":
        print(f"wrote {measure().relative_to(ROOT)}")
        return 0
    text = readme.read_text()
    new = render(text, blocks())
    if args.action == "check":
        if new != text:
            print(
                "README.md differs from its records: run `python scripts/first_hour.py readme`"
                " (make readme)"
            )
            return 1
        return 0
    readme.write_text(new)
    print("wrote README.md" if new != text else "README.md is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
