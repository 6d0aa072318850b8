"""``python -m kvlab``: env on a CPU, and the bench table's plumbing (no benchmark is timed
here)."""

import json
import subprocess
import sys

import pytest

from kvlab.lab import bench


def test_env_prints_device_versions_and_bandwidth():
    out = subprocess.run(
        [sys.executable, "-m", "kvlab", "env"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    for word in ("device", "torch", "triton", "transformers", "copy", "GB/s", "matmul"):
        assert word in out.stdout


def test_every_section_module_has_bench_rows():
    import importlib

    for title, module in bench.SECTION_BENCHMARKS.items():
        assert callable(importlib.import_module(module).bench_rows), title
        assert title in bench.BENCHMARKS


def test_unknown_benchmark_is_named():
    with pytest.raises(ValueError, match="unknown benchmark.*'9.9 nothing'.*known"):
        bench.run(["9.9 nothing"])


def test_table_and_json_carry_every_row(monkeypatch):
    rows = [bench.Row("cached decode", 103.8, "tokens/s", "P=128"), bench.Row("ratio", 9.57, "x")]
    monkeypatch.setitem(bench.BENCHMARKS, "fake", lambda: rows)
    results = bench.run(["fake"])
    text = bench.table(results)
    assert "## fake" in text and "cached decode" in text and "103.8" in text
    record = json.loads(json.dumps(bench.to_json(results)))
    assert record["results"]["fake"][0]["value"] == 103.8
    assert {"device", "torch", "date"} <= set(record["stamp"])
    assert record["calibration"]["copy_bytes_per_s"] > 0


def test_without_triton_a_kernel_says_so_once_with_the_fix():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import kvlab\n"  # importing kvlab needs no Triton; importing its kernels says what is missing
        "try:\n    from kvlab import kernels\nexcept ModuleNotFoundError as e:\n    print(e.name, '|', e)\n"
        "print(kvlab.env())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name, message = out.stdout.splitlines()[0].split(" | ")
    assert name == "triton" and "kvlab's Triton kernels need the package triton" in message
    assert "fix: pip install triton" in message  # Linux x86_64, where Triton publishes wheels
    assert (
        "missing: triton, for kvlab's kernels" in out.stdout
        and "fix: pip install triton" in out.stdout
    )


def test_env_names_each_missing_piece_with_its_command(monkeypatch):
    import kvlab
    from kvlab import versions

    real = versions.installed
    monkeypatch.setattr(
        versions, "installed", lambda name: "4.57.6" if name == "transformers" else real(name)
    )
    found = dict(kvlab.missing())
    assert (
        found["transformers 4.57.6 is below kvlab's floor 5.5.0"]
        == "pip install -U 'transformers>=5.5.0', then restart"
    )
    assert not any(what.startswith("triton") for what in found)  # installed here


def test_a_section_that_needs_triton_is_skipped_where_it_is_missing(monkeypatch):
    def needs_triton():
        raise ModuleNotFoundError(
            "kvlab's Triton kernels need the package triton, which is not installed; fix: x",
            name="triton",
        )

    monkeypatch.setitem(bench.BENCHMARKS, "fake", needs_triton)
    (row,) = bench.run(["fake"])["fake"]
    assert row.name == "skipped" and "need the package triton" in row.note
    monkeypatch.setitem(bench.BENCHMARKS, "other", lambda: __import__("no_such_module_anywhere"))
    with pytest.raises(ModuleNotFoundError):
        bench.run(["other"])


def test_quick_bench_is_the_small_decode_loops_and_the_fast_sections():
    assert (
        list(bench.QUICK) == ["9.2 decode loops"]
        and bench.QUICK["9.2 decode loops"].args[-1] == "quick_rows"
    )
    assert set(bench.QUICK_SECTIONS) < set(bench.BENCHMARKS)
    with pytest.raises(ValueError, match="known with --quick"):
        bench.run(["9.6 SSM state and scans"], quick=True)


def test_commands_refuse_below_the_floor_with_the_command(monkeypatch, capsys):
    from kvlab import __main__ as cli
    from kvlab import versions

    monkeypatch.setattr(versions, "below_floor", lambda: {"transformers": "4.57.6"})
    assert cli.main(["bench", "--quick"]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip() == "this Python has transformers 4.57.6 (kvlab needs >= 5.5.0): run "
        "`pip install -U 'transformers>=5.5.0'`"
    )
