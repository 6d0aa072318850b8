"""Without CUDA, importing ``kvlab.kernels`` switches the Triton interpreter on before it imports
the kernels, unless ``TRITON_INTERPRET`` is set; ``import kvlab`` alone switches nothing (notebooks
05, 05b, 07). Each case runs in a fresh interpreter process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = """
import torch
q = torch.randn(1, 4, 16); k = torch.randn(2, 4, 2, 16)
print(kernels.paged_decode_attention(q, k, k, torch.tensor([[0, 1]], dtype=torch.int32),
                                     torch.tensor([5], dtype=torch.int32)).shape)
"""


def _run(code: str, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | extra
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="without CUDA only: the interpreter's switch"
)


def test_importing_kvlab_switches_nothing_and_its_kernels_package_switches_the_interpreter():
    run = _run(
        "import os, sys, kvlab\n"
        "print(os.environ.get('TRITON_INTERPRET'), 'triton' in sys.modules)\n"
        "from kvlab import kernels\n"
        "print(os.environ.get('TRITON_INTERPRET'), kernels.use_interpreter())\n" + LAUNCH
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[:4] == ["None", "False", "1", "True"]
    assert "torch.Size([1, 4, 16])" in run.stdout


def test_use_interpreter_first_then_the_kernels_run_on_a_cpu():
    run = _run(
        "import triton, transformers\nfrom kvlab import kernels\nassert kernels.use_interpreter()\n"
        + LAUNCH
    )
    assert run.returncode == 0, (
        run.stderr
    )  # triton imported before: its modules reload with the switch on
    assert "torch.Size([1, 4, 16])" in run.stdout


def test_a_kernel_imported_without_the_interpreter_refuses_a_cpu_tensor_by_name():
    run = _run("from kvlab import kernels\n" + LAUNCH, TRITON_INTERPRET="0")
    assert run.returncode != 0
    assert (
        "paged_decode_attention got tensors on cpu" in run.stderr
        and "use_interpreter()" in run.stderr
    )
    late = _run("from kvlab import kernels\nkernels.use_interpreter()", TRITON_INTERPRET="0")
    assert late.returncode != 0 and "must run before the kernels are imported" in late.stderr
