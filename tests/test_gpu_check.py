"""scripts/gpu_check.sh fits the lent GPU machine: its step limits add up to the 8 minutes the check
may take there. ``make test-gpu-dry`` (part of ``make test``) runs the script itself, every step but
the GPU-only record, in a venv made to look like that image, which also proves that the suite
collects without the Jupyter stack, a browser or the GGUF loader."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_step_limits_fit_eight_minutes():
    limits = {}
    for label, gpu, _dry in re.findall(r"^\s*step (\S+) (\d+) (\d+) ", SCRIPT.read_text(), re.M):
        limits[label] = max(limits.get(label, 0), int(gpu))
    assert {
        "wheels",
        "env",
        "tests",
        "record",
        "diagnose",
        "static-notebooks",
        "live-notebook",
    } <= set(limits)
    assert sum(limits.values()) <= 480, limits
