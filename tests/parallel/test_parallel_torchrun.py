"""``torchrun -m kvlab.parallel``: the command-line way to start the ranks runs a mechanism end to
end."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mechanism, expected", [("tensor", "tokens equal generate: True")])
def test_torchrun_runs_a_mechanism_on_two_ranks(mechanism, expected):
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
    ]  # the `torchrun` command, in any venv
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*torchrun, "--nproc-per-node", "2", "-m", "kvlab.parallel", mechanism],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout


def test_an_unknown_mechanism_is_refused():
    result = subprocess.run(
        [sys.executable, "-m", "kvlab.parallel", "pipeline"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 2 and "invalid choice: 'pipeline'" in result.stderr
