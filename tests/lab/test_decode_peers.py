"""kvlab's decode loops beside transformers' generate (kvlab.lab.decode_peers): tokens checked
before any time, ratios of interleaved medians, the targets' verdicts and the bench's GPU branch on
a CPU.
"""

import pytest
import torch

import kvlab
from kvlab.lab import decode_peers as peers
from kvlab.theory.peers import GENERATE, GENERATE_COMPILED, TARGETS
from kvlab.theory.work import break_even_tokens


@pytest.fixture(scope="module")
def model():
    return kvlab.tiny_model("llama", layers=2)


def _ids(model, n=10):
    return torch.randint(
        0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(1)
    )


def test_compare_times_every_contender_after_its_tokens_match(model):
    result = peers.compare(
        model, _ids(model), 5, reps=2, include=(GENERATE, "naive", "cached", "static")
    )
    assert result.names == [GENERATE, "naive", "cached", "static"]
    assert all(len(result.seconds[n]) == 2 and min(result.seconds[n]) > 0 for n in result.names)
    r = result.speedup("cached", "naive")
    assert r.low <= r.high  # the range of one round's ratios
    assert result.tokens_per_s("cached") == pytest.approx(5 / result.median("cached"))


def test_compare_refuses_to_time_a_contender_with_other_tokens(model, monkeypatch):
    monkeypatch.setattr(
        peers, "cached_decode", lambda *a, **k: kvlab.cached_decode(*a, **k) * 0 + 1
    )
    with pytest.raises(RuntimeError, match="cached decoded other tokens .* no time is reported"):
        peers.compare(model, _ids(model), 4, reps=1, include=(GENERATE, "cached"))


def test_compare_rejects_unknown_contenders(model):
    with pytest.raises(ValueError, match="include must name contenders"):
        peers.compare(model, _ids(model), 2, include=("vllm",))


def _result(first: dict, seconds: dict) -> peers.PeerComparison:
    return peers.PeerComparison("m", "float32", "cpu", 1, 8, 16, seconds, seconds, first)


def test_break_even_follows_the_model_on_both_sides():
    """The compile cost, solved from the model for a break-even of 100 tokens, then requests of 0.9x
    and 1.1x that many tokens: the compiled contender is behind on the first, ahead on the
    second."""
    eager, compiled = 0.16, 0.08  # per request of 16 tokens: 5 ms saved per token
    gain = (eager - compiled) / 16
    cost = 100 * gain
    result = _result(
        {"static, compiled": compiled + cost, "static": eager},
        {"static, compiled": (compiled,), "static": (eager,)},
    )
    assert result.break_even("static, compiled", "static") == pytest.approx(
        break_even_tokens(cost, gain)
    )
    for tokens, repaid in ((90, False), (110, True)):
        assert (cost + tokens * (compiled / 16) < tokens * (eager / 16)) == repaid
        assert (tokens >= result.break_even("static, compiled", "static")) == repaid


@pytest.mark.parametrize("factor, met", [(0.9, False), (1.1, True)])
def test_ratio_rows_report_the_target_on_both_sides(factor, met):
    target = TARGETS["static, compiled", GENERATE_COMPILED]
    base = 0.1
    result = _result(
        {}, {"static, compiled": (base / (target * factor),), GENERATE_COMPILED: (base,)}
    )
    rows = {r.name: r for r in peers.ratio_rows(result)}
    row = rows[f"static, compiled / {GENERATE_COMPILED}"]
    assert row.value == pytest.approx(target * factor)
    assert ("target >= 1: met" in row.note) == met and ("missed" in row.note) == (not met)


def test_bench_rows_gpu_branch_on_a_cpu_model(model):
    """The GPU branch's rows (the floor fraction with its target) on a small CPU model and sizes."""
    rows = peers.bench_rows(
        gpu=True, reps=1, model=model, prompt_tokens=8, new_tokens=12, naive_new_tokens=4
    )
    names = [r.name for r in rows]
    for name in (
        GENERATE,
        GENERATE_COMPILED,
        "cached",
        "static",
        "static, compiled",
        "naive",
        "floor / static step",
        f"static, compiled / {GENERATE_COMPILED}",
    ):
        assert name in names, name
    floor = next(r for r in rows if r.name == "floor / static step")
    assert floor.value > 0 and f"target >= {peers.GPU_FLOOR_TARGET:g}" in floor.note


def test_quick_rows_are_uncompiled_and_checked(monkeypatch):
    compiled = []
    monkeypatch.setattr(peers, "compiled_peer", lambda model: compiled.append(model))
    rows = peers.quick_rows(new_tokens=4)
    names = [r.name for r in rows]
    assert GENERATE in names and "cached" in names and "static" in names
    assert not compiled and all(r.value > 0 for r in rows)
