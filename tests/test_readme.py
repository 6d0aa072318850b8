"""The README's figures come from the last recorded run, not from memory: every figure sits in a
block that scripts/first_hour.py writes from the newest records in book/data/, and the README on
disk is what it writes."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import first_hour  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))


def test_the_readme_is_what_the_records_write():
    text = (ROOT / "README.md").read_text()
    assert first_hour.render(text, first_hour.blocks()) == text, (
        "run `make readme` (scripts/first_hour.py readme)"
    )


def test_no_figure_outside_the_generated_blocks():
    """Times, test counts and bench figures live only in the blocks (a typed one would go stale)."""
    text = first_hour.BLOCK.sub("", (ROOT / "README.md").read_text())
    for pattern in (
        r"\d+ min \d+ s",
        r"\d[\d,]* (tests|passed)",
        r"tokens/s",
        r"\d+(\.\d+)? GB on disk",
    ):
        import re

        assert not re.search(pattern, text), pattern


def test_the_run_record_names_its_commit_and_every_step():
    run = first_hour.newest(ROOT / "book" / "data" / "runs", "first-hour-*.json")
    if (
        run is None
    ):  # a tree before its first `make first-hour`: the README says so (the test above)
        assert "No fresh-clone run has been recorded yet" in (ROOT / "README.md").read_text()
        return
    assert len(run["commit"]) == 40
    assert set(run["steps"]) == {
        "venv",
        "other environments",
        "make test",
        "make book",
        "bench",
        "bench --quick",
    }
    main = run["steps"]["make test"]["pytest"][0]
    assert main["counts"]["passed"] > 0 and not main["counts"].get("failed")


def _run(notebooks: int) -> dict:
    names = {f"{i:02d}_x static": 20 + i for i in range(notebooks)}
    return {
        "date": "2026-12-02",
        "commit": "a" * 40,
        "machine": {
            "cpu": "AMD EPYC",
            "cores": 2,
            "load_average": [7.5, 7.0, 6.9],
            "python": "3.11.7",
        },
        "steps": {
            "venv": {"seconds": 335, "disk_bytes": 2.6e9},
            "other environments": {"seconds": 610},
            "make test": {
                "seconds": 1100,
                "notebooks": names,
                "pytest": [
                    {"counts": {"passed": 1180, "skipped": 7}, "seconds": 700.0},
                    {"counts": {"passed": 1100, "skipped": 9}, "seconds": 300.0},
                ],
            },
            "make book": {"seconds": 229},
            "bench": {"seconds": 250},
            "bench --quick": {"seconds": 41},
        },
    }


def test_the_setup_block_quotes_the_record_and_says_when_notebooks_changed(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for i in range(3):
        (tmp_path / "notebooks" / f"{i:02d}_x.ipynb").write_text("{}")
    block = " ".join(
        first_hour.setup_block(_run(3), tmp_path).split()
    )  # as Markdown reads it, unwrapped
    for figure in (
        "5 min 35 s, 2.6 GB on disk",
        "10 min 10 s",
        "18 min 20 s",
        "1,180 passed, 7 skipped in 11 min 40 s",
        "the 3 notebooks executed in 20 to 22 s each",
        "1,100 passed, 9 skipped in 5 min 0 s",
        "`make book` then: 3 min 49 s",
        "bench`: 4 min 10 s",
        "`bench --quick`: 41 s",
        "load average 7.5",
        "commit `aaaaaaaaaa`",
    ):
        assert figure in block, figure
    assert "now holds" not in block
    assert "No fresh-clone run" in first_hour.setup_block(None, tmp_path)
    assert first_hour.setup_block(None, tmp_path).startswith("`notebooks/` holds 3 notebooks.")
    assert "That run executed 2 notebooks; `notebooks/` now holds 3" in " ".join(
        first_hour.setup_block(_run(2), tmp_path).split()
    )


def test_the_setup_block_gives_make_tests_phases_when_the_record_has_them(tmp_path):
    (tmp_path / "notebooks").mkdir()
    run = _run(0)
    old = " ".join(first_hour.setup_block(run, tmp_path).split())
    assert "by phase" not in old and "notebook execution is cached" in old
    run["steps"]["make test"]["phases"] = {"lint": 4, "main": 480, "floor": 300, "dry run": 95}
    block = " ".join(first_hour.setup_block(run, tmp_path).split())
    assert (
        "by phase, as it prints them at the end: lint 4 s, the main run 8 min 0 s, the floor run"
        " 5 min 0 s, the GPU check's dry run 1 min 35 s." in block
    )
    assert "`make book` then: 3 min 49 s (it executes nothing" in block


def test_phase_times_are_read_from_make_test_output():
    output = (
        "---- make test: wall time per phase ----\nmake test phase lint: 4 s (0 min 4 s)\n"
        "make test phase main: 480 s (8 min 0 s)\nmake test phase dry run: 95 s (1 min 35 s)\n"
        "make test phases in all: 579 s (9 min 39 s)\n"
    )
    assert first_hour._phases(output) == {"lint": 4, "main": 480, "dry run": 95}


def test_pytest_summaries_are_read_from_make_test_output():
    output = (
        "..........\n1180 passed, 7 skipped, 3 warnings in 612.34s (0:10:12)\n01_decode_loop"
        " static: 41 s\n==== 1100 passed, 9 skipped in 300.10s (0:05:00) ====\n1168 tests collected"
        " in 23.1s\n"
    )
    runs = first_hour._pytest_summaries(output)
    assert [r["counts"] for r in runs] == [
        {"passed": 1180, "skipped": 7, "warnings": 3},
        {"passed": 1100, "skipped": 9},
    ]
    assert [r["seconds"] for r in runs] == [612.34, 300.10]
    assert first_hour.NOTEBOOK_TIME.search(output).group("name") == "01_decode_loop"


def test_the_table_and_its_reading_come_from_the_bench_record():
    record = first_hour.newest(
        ROOT / "book" / "data" / "measurements", "cpu-*.json", "9.2 decode loops"
    )
    rows = {r["name"]: r["value"] for r in record["results"]["9.2 decode loops"]}
    table = first_hour.table_block(record)
    assert record["stamp"]["date"] in table and f"{rows['cached']:.4g}" in table
    reading = " ".join(first_hour.reading_block(record).split())
    assert (
        f"{rows['cached / naive']:.3g} times" in reading
        and f"{rows['static / cached']:.3g} times" in reading
    )
    assert f"{rows['static, compiled / generate, static cache + compile']:.3g} times" in reading
    assert f"{1 / rows['floor / static step']:.3g} times as long" in reading


@pytest.mark.parametrize(
    "seconds, text", [(41, "41 s"), (60, "1 min 0 s"), (95.4, "1 min 35 s"), (3600, "60 min 0 s")]
)
def test_durations_read_as_minutes_and_seconds(seconds, text):
    assert first_hour.duration(seconds) == text


def test_a_readme_block_the_generator_does_not_know_is_refused():
    with pytest.raises(SystemExit, match="do not match"):
        first_hour.render("<!-- first-hour: nothing -->\n<!-- /first-hour -->", {"setup": ""})
    assert json.loads(json.dumps(first_hour._machine()))["cores"] >= 1


def test_make_tests_phases_print_the_times_first_hour_reads():
    """scripts/phases.sh (`make test`) runs its phases in order, stops at the first that fails with
    its exit status, and prints each phase's wall time in the lines first_hour.py reads."""
    import subprocess

    script = str(ROOT / "scripts" / "phases.sh")
    done = subprocess.run(
        ["bash", script, "lint=true", "main=echo main ran", "floor=exit 3", "dry run=echo never"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3
    assert "main ran" in done.stdout and "never" not in done.stdout
    assert first_hour._phases(done.stdout) == {"lint": 0, "main": 0, "floor": 0}
    assert "phase floor failed (exit 3)" in done.stdout
    done = subprocess.run(["bash", script, "main=true"], capture_output=True, text=True)
    assert done.returncode == 0 and first_hour._phases(done.stdout) == {"main": 0}
