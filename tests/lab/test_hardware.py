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
