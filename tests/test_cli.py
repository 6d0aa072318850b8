"""``python -m kvlab``: env on a CPU, and the bench table's plumbing (no benchmark is timed here)."""

import json
import subprocess
import sys

import pytest

from kvlab.lab import bench


def test_env_prints_device_versions_and_bandwidth():
    out = subprocess.run([sys.executable, "-m", "kvlab", "env"], capture_output=True, text=True, timeout=300)
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
