"""Every Triton kernel compiles ahead of time for sm_75 (T4), sm_80 (A100) and sm_90 (H100), in fp16
and bf16, at the sizes the notebooks and ``bench`` use, with its shared memory within each target's
per-block limit; where it is not, the wrapper refuses before any launch (notebooks 05b and 07).

No GPU is needed: ``triton.compile`` targets a GPU it does not see. The compiles run in one
subprocess with the interpreter off (this process runs the kernels under TRITON_INTERPRET=1).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvlab.kernels import _validation, paged_attention, shared_memory, targets
from kvlab.kernels.paged_attention import SUPPORTED_HEAD_DIMS

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float16", "bfloat16")


def _configs():
    configs = []
    for capability in shared_memory.TARGETS:
        for dtype in DTYPES:
            at = dict(dtype=dtype, capability=capability)
            # head dims 16-128 are what the notebooks and bench use; 256 is the largest the wrapper
            # takes
            configs += [
                dict(at, kernel="attend_split", head_dim=d, group=4) for d in SUPPORTED_HEAD_DIMS
            ]
            configs += [
                dict(at, kernel="attend_split", head_dim=128, group=g) for g in (1, 8)
            ]  # GQA groups
            configs += [
                dict(at, kernel="merge_splits", head_dim=d, num_splits=s)
                for d in (64, 128, 256)
                for s in (1, 64)
            ]
            configs += [dict(at, kernel="store_kv", head_dim=d) for d in (64, 128, 256)]
            configs.append(dict(at, kernel="ssm_update", state=16))
            configs += [
                dict(at, kernel="paged_prefill", head_dim=d, group=g)
                for d, g in ((64, 3), (128, 8), (256, 4))
            ]
    return configs


@pytest.fixture(scope="module")
def compiled():
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "kvlab.kernels.targets", json.dumps(_configs())],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_for_every_target(compiled):
    assert len(compiled) == len(_configs())
    seen = {(c["kernel"], c["dtype"], c["capability"]) for c in compiled}
    assert seen == {
        (k, d, c)
        for k in ("attend_split", "merge_splits", "store_kv", "ssm_update", "paged_prefill")
        for d in ("fp16", "bf16")
        for c in shared_memory.TARGETS
    }


def test_shared_memory_fits_each_target_except_where_the_wrapper_refuses(compiled):
    too_big = []
    for c in compiled:
        limit = shared_memory.shared_memory_limit(c["capability"])
        sizes = {k: v for k, v in c.items() if k not in ("kernel", "dtype", "capability", "shared")}
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
        config = targets.config(c["kernel"], dtype, **sizes)
        if c["shared"] <= limit:
            shared_memory.check_fits(config, c["capability"], c["shared"], limit)  # no error
        else:
            too_big.append((c["kernel"], c["capability"], c["dtype"], c["head_dim"]))
            with pytest.raises(
                ValueError,
                match=rf"needs {c['shared']} bytes of shared memory .* sm_{c['capability']}",
            ):
                shared_memory.check_fits(config, c["capability"], c["shared"], limit)
    # Every configuration the notebooks and bench use (head_dim <= 128) runs on every target.
    assert all(head_dim == 256 for *_, head_dim in too_big), too_big
    assert all(capability == 75 for _, capability, *_ in too_big), too_big


def test_the_limits_are_the_documented_ones():
    assert shared_memory.shared_memory_limit(75) == 64 * 1024
    assert shared_memory.shared_memory_limit(80) == 163 * 1024
    assert shared_memory.shared_memory_limit(90) == 227 * 1024
    assert shared_memory.shared_memory_limit(89) == 99 * 1024
    with pytest.raises(ValueError, match="capability"):
        shared_memory.shared_memory_limit(61)


def test_wrapper_refuses_a_config_the_gpu_cannot_hold_before_launch(monkeypatch):
    """On a (simulated) T4, the paged kernel at head_dim 256 in fp16 is refused by the wrapper."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: type("P", (), {"shared_memory_per_block_optin": 64 * 1024})(),
    )
    monkeypatch.setattr(
        shared_memory,
        "compiled_shared_memory",
        lambda config, capability: 320 * config.sizes["head_dim"],
    )  # what sm_75 needs, as the compiles above measure
    with pytest.raises(ValueError, match=r"head_dim=256.*sm_75 allows 65536"):
        shared_memory.require_fits(
            targets.config("attend_split", torch.float16, group=4, head_dim=256), "cuda"
        )
    shared_memory.require_fits(
        targets.config("attend_split", torch.float16, group=4, head_dim=128), "cuda"
    )


def test_the_wrapper_asks_before_it_launches(monkeypatch):
    asked = []

    def refuse(config, device):
        asked.append((config.name, config.dtype, config.sizes))
        raise ValueError("refused")

    monkeypatch.setattr(_validation, "require_fits", refuse)
    monkeypatch.setattr(paged_attention, "paged_decode", lambda *a: pytest.fail("launched"))
    q, cache = torch.randn(1, 8, 64), torch.randn(4, 16, 2, 64)
    with pytest.raises(ValueError, match="refused"):
        paged_attention.paged_decode_attention(
            q,
            cache,
            cache,
            torch.zeros(1, 4, dtype=torch.int32),
            torch.tensor([20], dtype=torch.int32),
        )
    assert asked == [("attend_split", torch.float32, dict(head_dim=64, group=4))]


def test_kernel_modules_do_not_import_the_catalog():
    """The catalog (this file's subprocess) imports every kernel module; none imports it back."""
    import ast

    from kvlab.kernels import store

    for module in (paged_attention, store, shared_memory):
        tree = ast.parse(open(module.__file__).read())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "kvlab.kernels.targets" not in imported, module.__name__
