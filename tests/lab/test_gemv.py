"""kvlab.lab.gemv: the GEMV sweep and the decode-step profile of section 9.3 (shapes and units,
never timings)."""

import dataclasses
import math

import pytest
import torch

import kvlab
from kvlab.lab import gemv
from kvlab.lab.hardware import Calibration
from kvlab.theory.matmul import batch_at_intensity

SMALL = dict(layers=2, hidden=128, q_heads=4, kv_heads=2, intermediate=256, vocab=512)

CAL = Calibration(
    copy_bytes_per_s=20e9, matmul_flops=60e9, matmul_dtype="float32", device="test CPU"
)


@pytest.fixture(scope="module")
def small_sweep():
    return gemv.sweep(ns=[4, 1, 2, 2], K=64, N=96, dtype="float32", device="cpu", warmup=0, reps=2)


def test_sweep_shapes_and_units(small_sweep):
    s = small_sweep
    assert s.ns == [1, 2, 4] and (s.K, s.N, s.dtype) == (64, 96, "float32")
    assert isinstance(s.device, str) and s.device
    for p in s.points:
        assert (p.K, p.N, p.element_size) == (64, 96, 4)
        assert 0 < p.min_seconds <= p.seconds <= p.max_seconds
        assert p.flops == 2 * p.n * 64 * 96
        assert p.bytes == (64 * 96 + p.n * 64 + p.n * 96) * 4
        assert p.intensity == p.flops / p.bytes
        assert p.flops_per_s == p.flops / p.seconds and p.bytes_per_s == p.bytes / p.seconds
    assert s.at(2).n == 2
    with pytest.raises(KeyError, match="measured"):
        s.at(3)


def test_sweep_knee(small_sweep):
    s = small_sweep
    assert s.peak_flops_per_s == max(p.flops_per_s for p in s.points)
    fit = s.fit
    assert fit.points == len(s.points) and 0 <= fit.split <= len(s.points)
    if math.isfinite(s.knee_intensity):
        # the measured ridge in FLOP/B is the intensity formula at the knee (a real n)
        assert batch_at_intensity(s.knee_intensity, 64, 96, 4) == pytest.approx(s.knee_batch)
    else:
        assert math.isnan(s.knee_batch)


@pytest.mark.parametrize("bf16, half", [(True, "bfloat16"), (False, "float16")])
def test_default_sizes(monkeypatch, bf16, half):
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device=None: (8, 0) if bf16 else (7, 5)
    )
    cpu, gpu = gemv.default_sizes(gpu=False), gemv.default_sizes(gpu=True)
    assert cpu["ns"][0] == 1 and cpu["ns"][-1] == 512 and cpu["dtype"] == "float32"
    assert gpu["ns"][0] == 1 and gpu["ns"][-1] == 4096 and gpu["dtype"] == half
    assert (gpu["K"], gpu["N"]) == (8192, 8192)
    assert cpu["K"] * cpu["N"] * 4 > 64 * 2**20  # far beyond a last-level cache


@pytest.fixture(scope="module")
def small_model():
    return kvlab.tiny_model("llama", device="cpu", **SMALL)


def test_weight_read_bytes_counts_embedding_rows_only(small_model):
    m = small_model
    every = sum(p.numel() * p.element_size() for p in m.parameters())
    table = m.get_input_embeddings().weight
    row = table[0].numel() * table.element_size()
    assert gemv.weight_read_bytes(m, batch=1) == every - table.numel() * table.element_size() + row
    assert gemv.weight_read_bytes(m, batch=3) == gemv.weight_read_bytes(m, batch=1) + 2 * row


def test_weight_read_bytes_tied_table_is_read_whole():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 8)
            self.head = torch.nn.Linear(8, 100, bias=False)
            self.head.weight = self.embed.weight

    assert gemv.weight_read_bytes(Tied()) == 100 * 8 * 4


def test_random_cache_and_repeatable_step(small_model):
    cache = gemv.random_cache(small_model, batch=2, context=10)
    assert cache.get_seq_length() == 10
    step = gemv.RandomCacheStep(small_model, batch=2, context=10)
    for _ in range(3):
        step()
        assert step.cache.get_seq_length() == 10  # the appended token is dropped again


def test_step_time_is_a_timing(small_model):
    t = gemv.step_time(small_model, batch=2, context=16, warmup=0, reps=2)
    assert len(t.times) == 2 and 0 < t.min <= t.median <= t.max
    with pytest.raises(ValueError, match="batch"):
        gemv.step_time(small_model, batch=0)
    with pytest.raises(TypeError, match="context"):
        gemv.step_time(small_model, context=1.5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_profile_step_parts_add_up(arch):
    overrides = (
        dict(SMALL)
        if arch == "llama"
        else dict(layers=2, hidden=64, q_heads=4, intermediate=128, vocab=256)
    )
    m = kvlab.tiny_model(arch, device="cpu", **overrides)
    p = gemv.profile_step(m, batch=2, context=24, warmup=1, reps=2, calibration=CAL)
    # one row per weight matrix: q, k, v, o, gate, up, down per layer, plus the head (GPT-2's
    # Conv1D: 4 per layer)
    per_layer = 7 if arch == "llama" else 4
    assert len(p.modules) == per_layer * m.shape.layers + 1
    assert {r.part for r in p.modules} <= {
        "attention projections",
        "MLP",
        "output head",
        "other matrices",
    }
    assert sum(r.weight_bytes for r in p.modules) <= p.weight_bytes
    assert (p.batch, p.context, p.dtype) == (2, 24, "float32")
    assert p.kv_bytes == 2 * 24 * m.shape.kv_bytes_per_token(4)
    assert p.weight_bytes == gemv.weight_read_bytes(m, batch=2)
    assert p.matmul_seconds == pytest.approx(sum(r.seconds for r in p.modules))
    parts = p.by_part()
    assert sum(parts.values()) == pytest.approx(max(p.hooked_seconds, p.matmul_seconds))
    assert p.weight_read_seconds == p.weight_bytes / 20e9
    assert p.weight_read_fraction == p.weight_read_seconds / p.step_seconds
    assert p.floor_seconds == (p.weight_bytes + p.kv_bytes) / 20e9
    # the hooks are gone afterwards
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())


def test_bench_rows(small_sweep):
    rows = gemv.bench_rows(small_sweep, calibration=CAL)
    by = {r.name: r for r in rows}
    one = small_sweep.points[0]
    assert by["GEMV bandwidth, batch 1"].unit == "GB/s"
    assert by["GEMV bandwidth, batch 1"].value == one.bytes_per_s / 1e9
    assert by["GEMV / read bandwidth"].value == one.bytes_per_s / 20e9
    assert (
        by["ridge point, calibrated"].value == 3.0
        and by["ridge point, calibrated"].unit == "FLOP/B"
    )
    assert by["ridge batch, calibrated"].value == batch_at_intensity(3.0, 64, 96, 4)
    for name, value in (
        ("ridge batch, measured", small_sweep.knee_batch),
        ("ridge point, measured", small_sweep.knee_intensity),
    ):
        assert by[name].value == pytest.approx(value, nan_ok=True)
    assert all(isinstance(r.value, float) and r.note for r in rows)
    assert dataclasses.is_dataclass(rows[0])


def test_bench_rows_say_what_the_fit_found(small_sweep):
    """The measured ridge's note names a knee only where the fit has one: a sweep cut to two points
    cannot reach both regimes."""
    for s in (small_sweep, dataclasses.replace(small_sweep, points=small_sweep.points[:2])):
        note = {r.name: r for r in gemv.bench_rows(s, calibration=CAL)}[
            "ridge point, measured"
        ].note
        assert ("no knee" in note) == math.isnan(s.knee_intensity), note
        assert "nan" not in note


@pytest.mark.parametrize(
    "call, kind, words",
    [
        (lambda: gemv.sweep(ns=[0], K=8, N=8, device="cpu"), ValueError, "n must be an int >= 1"),
        (lambda: gemv.sweep(ns=[], K=8, N=8, device="cpu"), ValueError, "at least one n"),
        (lambda: gemv.sweep(ns=4, K=8, N=8, device="cpu"), TypeError, "ns must be a sequence"),
        (lambda: gemv.sweep(ns=[1], K=0, N=8, device="cpu"), ValueError, "K must be"),
        (lambda: gemv.sweep(ns=[1], K=8, N=8, dtype="float99", device="cpu"), ValueError, "dtype"),
        (
            lambda: gemv.sweep(ns=[1], K=8, N=8, dtype=torch.int32, device="cpu"),
            ValueError,
            "floating-point",
        ),
        (lambda: gemv.sweep(ns=[1], K=8, N=8, copies=0, device="cpu"), ValueError, "copies"),
    ],
)
def test_bad_input_names_the_argument(call, kind, words):
    with pytest.raises(kind) as info:
        call()
    assert words in str(info.value)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "gemv sweep beyond memory": (
        lambda: gemv.sweep(ns=[1], K=10**6, N=10**6, reps=1),
        MemoryError,
        "bytes but only",
    ),
    "gemv weight bytes of None": (lambda: gemv.weight_read_bytes(None), TypeError, "model must be"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
