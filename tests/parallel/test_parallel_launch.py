"""Starting ranks: bad input is refused before any process starts, and when a rank fails every
process exits and the error names the rank, within a time limit (no hang)."""

import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

import kvlab
from kvlab.parallel import launch
from kvlab.parallel.context import context_parallel_decode_attention
from kvlab.parallel.disaggregated import disaggregated_generate
from kvlab.parallel.tensor import check_splittable, tensor_parallel_decode

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)
FAILURE_LIMIT_S = 60  # generous for a loaded 2-core machine; a hang would run to the 300 s timeout


def rank_one_fails_while_rank_zero_waits(rank, world_size):
    if rank == 1:
        raise RuntimeError("injected failure on rank 1")
    dist.recv(torch.empty(1), src=1)  # never sent: rank 0 would wait forever on its own


def tensor_parallel_rank_fails_mid_decode(rank, world_size, path):
    from kvlab.parallel.tensor import load_sharded

    model = load_sharded(path)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        model(ids)  # both ranks finish one sharded forward together
        if rank == 1:
            raise RuntimeError("injected failure mid-decode")
        model(ids)  # rank 0 blocks in the first all-reduce


def echo(rank, world_size, value):
    return rank, world_size, value


def _alive_children():
    return [p for p in multiprocessing.active_children() if p.is_alive()]


def test_one_call_returns_each_rank_result():
    assert launch.run(echo, 2, "x") == [(0, 2, "x"), (1, 2, "x")]


def test_a_failing_rank_stops_every_rank_with_a_clear_error():
    start = time.monotonic()
    with pytest.raises(
        launch.WorkerError, match="rank 1 failed:(.|\n)*injected failure on rank 1"
    ) as info:
        launch.run(rank_one_fails_while_rank_zero_waits, 2, timeout=120)
    assert info.value.rank == 1
    assert time.monotonic() - start < FAILURE_LIMIT_S
    assert _alive_children() == []


def test_a_rank_failing_inside_a_sharded_decode_stops_the_other(tmp_path):
    kvlab.tiny_model("llama", **SMALL).save_pretrained(tmp_path)
    workers = launch.Workers(2)
    start = time.monotonic()
    with pytest.raises(launch.WorkerError, match="injected failure mid-decode") as info:
        workers.run(tensor_parallel_rank_fails_mid_decode, str(tmp_path), timeout=240)
    assert info.value.rank == 1 and time.monotonic() - start < 240
    assert _alive_children() == []
    with pytest.raises(RuntimeError, match="closed"):
        workers.run(echo, 1)


def sleep_on_every_rank(rank, world_size, seconds):
    time.sleep(seconds)


def test_a_call_past_its_timeout_stops_every_rank():
    with pytest.raises(TimeoutError, match="timeout"):
        launch.run(sleep_on_every_rank, 2, 600.0, timeout=5.0)
    assert _alive_children() == []


def _model(arch="llama", **extra):
    return kvlab.tiny_model(arch, **{**SMALL, **extra})


BAD = {
    "world size not dividing the KV heads": (
        lambda: tensor_parallel_decode(
            _model(), torch.ones(1, 3, dtype=torch.long), 2, world_size=3
        ),
        ValueError,
        r"world_size=3 must divide the KV heads .*\(2\)",
    ),
    "a model kvlab cannot split": (
        lambda: tensor_parallel_decode(
            _model("gpt2", kv_heads=4), torch.ones(1, 3, dtype=torch.long), 2
        ),
        ValueError,
        "cannot split a GPT2LMHeadModel",
    ),
    "an SSM": (
        lambda: check_splittable(kvlab.tiny_model("mamba", layers=1, hidden=32, vocab=64), 2),
        ValueError,
        "cannot split a MambaForCausalLM",
    ),
    "nccl without GPUs": (
        lambda: tensor_parallel_decode(
            _model(), torch.ones(1, 3, dtype=torch.long), 2, backend="nccl"
        ),
        ValueError,
        "backend='nccl' needs device='cuda'",
    ),
    "an unknown backend": (
        lambda: launch.Workers(2, backend="mpi"),
        ValueError,
        "backend must be one of",
    ),
    "cuda without a GPU": (
        lambda: launch.check_launch(2, device="cuda"),
        ValueError,
        "no CUDA device",
    ),
    "world size 0": (lambda: launch.Workers(0), ValueError, "world_size"),
    "a prefill rank out of range": (
        lambda: disaggregated_generate(_model(), [1, 2], 2, prefill_rank=2),
        ValueError,
        r"prefill_rank must be an int in \[0, 2\), got 2",
    ),
    "a decode rank out of range": (
        lambda: disaggregated_generate(_model(), [1, 2], 2, decode_rank=-1),
        ValueError,
        r"decode_rank must be an int in \[0, 2\), got -1",
    ),
    "the same rank for both": (
        lambda: disaggregated_generate(_model(), [1, 2], 2, decode_rank=0),
        ValueError,
        "must differ",
    ),
    "one rank for a handoff": (
        lambda: disaggregated_generate(_model(), [1, 2], 2, world_size=1),
        ValueError,
        "world_size",
    ),
    "a token outside the vocabulary": (
        lambda: disaggregated_generate(_model(), [1, 512], 2),
        ValueError,
        r"prompt\[1\]",
    ),
    "an empty prompt": (lambda: disaggregated_generate(_model(), [], 2), ValueError, "prompt"),
    "tp ids not a tensor": (
        lambda: tensor_parallel_decode(_model(), [[1, 2]], 2),
        TypeError,
        "input_ids",
    ),
    "tp ids outside the vocabulary": (
        lambda: tensor_parallel_decode(_model(), torch.tensor([[1, 600]]), 2),
        ValueError,
        "input_ids",
    ),
    "tp no new tokens": (
        lambda: tensor_parallel_decode(_model(), torch.ones(1, 3, dtype=torch.long), 0),
        ValueError,
        "max_new_tokens",
    ),
    "uneven cuts": (
        lambda: context_parallel_decode_attention(
            torch.randn(1, 4, 8), *torch.randn(2, 1, 2, 5, 8), cuts=[4, 1], world_size=3
        ),
        ValueError,
        "cuts",
    ),
    "a cut past the end": (
        lambda: context_parallel_decode_attention(
            torch.randn(1, 4, 8), *torch.randn(2, 1, 2, 5, 8), cuts=[6]
        ),
        ValueError,
        r"cuts\[0\]",
    ),
    "query heads not a multiple": (
        lambda: context_parallel_decode_attention(
            torch.randn(1, 3, 8), *torch.randn(2, 1, 2, 5, 8)
        ),
        ValueError,
        "multiple of the KV heads",
    ),
    "a lambda": (lambda: launch.run(lambda r, w: r, 2), ValueError, "module-level function"),
    "workers of another kind": (
        lambda: tensor_parallel_decode(
            _model(), torch.ones(1, 3, dtype=torch.long), 2, workers="2"
        ),
        TypeError,
        "workers",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_before_any_process_starts(case, monkeypatch):
    started = []
    monkeypatch.setattr(
        launch.mp, "start_processes", lambda *a, **k: started.append(a) or pytest.fail("started")
    )
    call, error, pattern = BAD[case]
    with pytest.raises(error, match=pattern):
        call()
    assert started == []
