"""Every notebook: a smoke run of scripts/fuzz_bad_input.py, the broad sweep of bad calls (issue 33),
on the names of kvlab.show (the readings, worked solutions, figures and widgets): every call must
be refused clearly, none may return or leave state changed. The whole sweep is too slow for the
suite; the tables of bad calls beside each module's tests hold the rest."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_sweep_refuses_every_bad_call_to_kvlab_show_clearly(tmp_path):
    out = tmp_path / "fuzz.json"
    run = subprocess.run(
        [sys.executable, "scripts/fuzz_bad_input.py", "--only", "show.", "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    counts, details = result["counts"], result["details"]
    assert not result["baseline_failures"], result["baseline_failures"]
    assert counts["calls"] > 300 and counts["clear"] == counts["calls"], details
    for outcome in ("unclear", "silent", "changed", "altered"):
        assert counts.get(outcome, 0) == 0, [d for d in details if d["outcome"] == outcome]
