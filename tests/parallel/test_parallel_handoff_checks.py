"""The disaggregated handoff on two gloo ranks: what the ranks must agree on is refused in the parent
before a process starts; a header that lies is refused on arrival; a rank that exits after sending
the header is named as the one that failed first (never the rank that saw its socket close)."""

import os
import time

import pytest
import torch
import torch.distributed as dist

import kvlab
from kvlab.cache.paged import PagedKVCache
from kvlab.parallel import _checks, launch
from kvlab.parallel.context import context_parallel_decode_attention, split_positions
from kvlab.parallel.disaggregated import disaggregated_generate, receive_prompt_cache

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)
REFUSED_WITHIN_S = 5.0
FAILURE_LIMIT_S = 120  # a loaded 2-core machine; a hang would run to the 300 s timeout


def _model(**extra):
    return kvlab.tiny_model("llama", **{**SMALL, **extra})


def _cache(block_size=16):
    return PagedKVCache(1, 4, block_size, 2, 16, dtype=torch.float32, device="cpu")


def send_a_header_then(rank, world_size, header, table, then):
    """Rank 0 sends ``header`` and ``table`` as the prefill rank would; ``then`` says what it does
    next ("exit": leave without a word; "wait": stay). Rank 1 receives as the decode rank does."""
    if rank == 1:
        return receive_prompt_cache(_cache(), 0, vocab=512)
    dist.barrier()
    dist.send(torch.tensor(header, dtype=torch.long), dst=1)
    if then == "exit":
        os._exit(3)
    dist.send(torch.tensor(table, dtype=torch.int32), dst=1)
    dist.recv(torch.empty(1), src=1)  # never sent: rank 0 waits until it is stopped


def _header(length=20, blocks=2, **layout):
    cache = _cache()
    header = dict(zip(_checks.HEADER, _checks.header_for(cache, length, 7, blocks)))
    header.update(layout)
    return [header[name] for name in _checks.HEADER]


# name: (a call the parent must refuse, error, a pattern naming the argument)
DISAGREE = {
    "block sizes 16 and 8": (
        lambda m: disaggregated_generate(m, [1, 2, 3], 2, block_size=16, decode_block_size=8),
        ValueError,
        "decode_block_size must equal block_size",
    ),
    "dtypes fp32 and fp16": (
        lambda m: disaggregated_generate(m, [1, 2, 3], 2, decode_model=_model().half()),
        ValueError,
        "decode_model must have the dtype",
    ),
    "KV head counts 2 and 4": (
        lambda m: disaggregated_generate(m, [1, 2, 3], 2, decode_model=_model(kv_heads=4)),
        ValueError,
        "decode_model must have the kv_heads",
    ),
    "a block size the reference path refuses": (
        lambda m: disaggregated_generate(m, [1, 2, 3], 2, block_size=3),
        ValueError,
        "block_size must be a power of two",
    ),
}


@pytest.mark.parametrize("case", DISAGREE)
def test_ranks_that_would_disagree_are_refused_before_spawning(case, monkeypatch):
    started = []
    monkeypatch.setattr(
        launch.mp, "start_processes", lambda *a, **k: started.append(a) or pytest.fail("started")
    )
    model = _model()
    call, error, pattern = DISAGREE[case]
    start = time.monotonic()
    with pytest.raises(error, match=pattern):
        call(model)
    assert time.monotonic() - start < REFUSED_WITHIN_S and started == []


LIES = {
    "more blocks than its length fills": (_header(blocks=3), [0, 1, 2], "blocks is 3"),
    "another block size": (_header(block_size=8), [0, 1], "block_size is 8"),
    "another dtype": (_header(dtype=1), [0, 1], "dtype is torch.float16"),
    "a short table": (_header(), [0], "received block table"),
}


@pytest.mark.parametrize("case", LIES)
def test_a_lying_header_is_refused_on_arrival(case):
    header, table, pattern = LIES[case]
    start = time.monotonic()
    with pytest.raises(launch.WorkerError, match=pattern) as failure:
        launch.run(send_a_header_then, 2, header, table, "wait", timeout=FAILURE_LIMIT_S)
    assert failure.value.rank == 1 and "ValueError" in str(failure.value)
    assert time.monotonic() - start < FAILURE_LIMIT_S


def test_a_rank_that_exits_after_the_header_is_named_first():
    with pytest.raises(launch.WorkerError, match="exited with code 3") as failure:
        launch.run(send_a_header_then, 2, _header(), [0, 1], "exit", timeout=FAILURE_LIMIT_S)
    assert failure.value.rank == 0
    assert str(failure.value).startswith("rank 0 failed")


BAD = {
    "cuts not a list": (lambda: split_positions(10, 2, cuts=5), TypeError, "cuts"),
    "scale nan": (
        lambda: context_parallel_decode_attention(
            torch.randn(1, 4, 8), *torch.randn(2, 1, 2, 5, 8), scale=float("nan")
        ),
        ValueError,
        "scale",
    ),
    "scale a string": (
        lambda: context_parallel_decode_attention(
            torch.randn(1, 4, 8), *torch.randn(2, 1, 2, 5, 8), scale="0.25"
        ),
        TypeError,
        "scale",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_before_any_process_starts(case, monkeypatch):
    monkeypatch.setattr(launch.mp, "start_processes", lambda *a, **k: pytest.fail("started"))
    call, error, pattern = BAD[case]
    with pytest.raises(error, match=pattern):
        call()


def test_init_from_env_without_rank_names_the_variable(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="environment variable RANK"):
        launch.init_from_env("gloo")
