"""kvlab.lab.hardware: the device, the calibration, the stamp, and the calibrated Accelerator."""

import pytest
import torch

import kvlab
from kvlab.lab.hardware import (
    Calibration,
    calibrate,
    calibrated_device,
    memory_bytes,
    stamp,
    stamp_line,
)
from kvlab.theory import roofline as rf
from kvlab.theory.specs import Accelerator


def test_stamp_names_device_and_versions():
    s = stamp()
    assert {"device", "driver", "torch", "triton", "transformers", "date"} <= set(s)
    assert s["torch"] == torch.__version__
    assert s["device"] in stamp_line(s)


@pytest.mark.parametrize(
    "capability, want",
    [
        ((7, 0), torch.float16),
        ((7, 5), torch.float16),
        ((8, 0), torch.bfloat16),
        ((9, 0), torch.bfloat16),
    ],
)
def test_gpu_dtype_is_bf16_only_with_bf16_units(monkeypatch, capability, want):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # a GPU that exists, as device() requires
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert kvlab.devices.device_and_dtype("cuda") == (
        torch.device("cuda"),
        want,
    )  # V100, T4, A100, H100
    assert (
        kvlab.devices.device_and_dtype("cuda", torch.float32)[1] == torch.float32
    )  # asked for: kept
    assert kvlab.devices.device_and_dtype("cpu")[1] == torch.float32


def test_calibrate_measures_positive_ceilings():
    c = calibrate()
    assert c.copy_bytes_per_s > 1e8 and c.matmul_flops > 1e8
    assert calibrate() is c  # once per process


CAL = Calibration(
    copy_bytes_per_s=20e9, matmul_flops=60e9, matmul_dtype="float32", device="test CPU"
)


def test_calibrate_measures_read_write_copy_and_matmul_with_spreads():
    c = calibrate()
    for rate in (c.read_bytes_per_s, c.write_bytes_per_s, c.copy_bytes_per_s, c.matmul_flops):
        assert rate > 1e8
    for spread in (c.read_spread, c.write_spread, c.copy_spread, c.matmul_spread):
        assert spread >= 0
    assert c.stream_bytes_per_s == c.read_bytes_per_s
    assert c.ridge_point == c.matmul_flops / c.read_bytes_per_s
    assert "read" in kvlab.env() and "write" in kvlab.env()


def test_probes_count_what_they_move_and_compute():
    from kvlab.lab.hardware import (
        PROBE_FLOPS,
        copy_probe,
        matmul_probe,
        measure_ceiling,
        read_probe,
        write_probe,
    )
    from kvlab.lab.timing import interleaved

    nbytes = 4 << 20
    probes = [read_probe(nbytes), write_probe(nbytes), copy_probe(nbytes), matmul_probe(3, 64, 32)]
    assert [p.amount for p in probes[:3]] == [nbytes, nbytes, 2 * nbytes]
    mm = probes[3]
    assert mm.amount == pytest.approx(2 * 3 * 64 * 32 * round(PROBE_FLOPS / (2 * 3 * 64 * 32)))
    assert mm.unit == "FLOP/s" and probes[0].unit == "B/s"
    timings = interleaved({p.name: p.run for p in probes}, reps=2, device="cpu")
    for p in probes:
        c = p.ceiling(timings[p.name])
        assert c.rate == p.amount / timings[p.name].min and c.spread >= 0
    assert measure_ceiling(probes[0], reps=2).rate > 0


def test_probes_refuse_bad_sizes():
    from kvlab.lab.hardware import matmul_probe, measure_ceiling, read_probe

    with pytest.raises(ValueError, match="nbytes must be an int >= 1048576"):
        read_probe(1024)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        matmul_probe(0)
    with pytest.raises(TypeError, match="k must be an int"):
        matmul_probe(1, k=64.0)
    with pytest.raises(TypeError, match="probe must be a kvlab.lab.hardware.Probe"):
        measure_ceiling(lambda: None)


def test_calibrated_device_uses_the_read_bandwidth_when_measured():
    cal = Calibration(
        copy_bytes_per_s=20e9,
        matmul_flops=60e9,
        matmul_dtype="float32",
        device="test CPU",
        read_bytes_per_s=30e9,
    )
    hw = calibrated_device(cal, memory=32e9)
    assert hw.hbm_bytes_per_s == 30e9 and cal.ridge_point == 2.0


def test_calibrated_device_feeds_the_roofline():
    hw = calibrated_device(CAL, memory=32e9)
    assert isinstance(hw, Accelerator)
    assert (hw.hbm_bytes, hw.hbm_bytes_per_s, hw.bf16_flops, hw.dies) == (32e9, 20e9, 60e9, 1)
    assert rf.ridge_point(hw) == 3.0
    shape = kvlab.SHAPES["llama-3.2-1b"]
    assert rf.step_time_floor(shape, hw, 1, 1000) == rf.step_bytes(shape, 1, 1000).total / 20e9
    assert memory_bytes("cpu") > 0


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "gemv negative memory": (
        lambda: calibrated_device(
            kvlab.lab.hardware.Calibration.__new__(kvlab.lab.hardware.Calibration), memory=-1
        ),
        ValueError,
        "memory must be a finite number > 0",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_cpu_threads_sets_and_restores_and_calibrates_per_count():
    import torch

    from kvlab.lab.hardware import cpu_threads

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with cpu_threads(1):
            assert torch.get_num_threads() == 1
            one = calibrate()
            assert calibrate() is one  # once per thread count
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before  # restored on the exception
    with cpu_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        with cpu_threads(0):
            pass
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: stamp_line({}),
            ValueError,
            "s must be a stamp",
        ),  # not this machine's stamp in its place
        (
            lambda: kvlab.devices.device_and_dtype("cpu", "fp16"),
            TypeError,
            "dtype must be a torch.dtype",
        ),
        (lambda: kvlab.devices.device_and_dtype("cpu", torch.int8), TypeError, "floating-point"),
        (lambda: kvlab.devices.device_and_dtype("meta"), ValueError, "device must hold data"),
        (lambda: kvlab.devices.device_and_dtype(3), TypeError, "device must be a torch.device"),
    ],
)
def test_bad_devices_and_stamps_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_gpu_that_is_not_there_is_refused_by_name():
    """Not torch's "Torch not compiled with CUDA enabled": the argument and what this machine
    has."""
    with pytest.raises(
        ValueError, match=r"device 'cuda:7' is not available on this machine \(\d+ CUDA device"
    ):
        kvlab.devices.device_and_dtype("cuda:7")
