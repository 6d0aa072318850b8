"""Every notebook: the machine under the measurement, its device, calibration and stamp.

The roofline of section 9.3 divides bytes by a bandwidth and FLOPs by a rate; ``calibrate``
measures both on this machine, and ``calibrated_device`` turns them into an ``Accelerator`` that
``kvlab.theory`` accepts in place of a datasheet's (``kvlab.theory.specs``). Each figure in the book
names, with ``stamp``, the device and versions it was measured on. On a CPU every time depends on
how many threads torch's operators use: ``cpu_threads`` sets them for a measurement and puts them
back, and ``calibrate`` measures once per thread count.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import platform
import subprocess
from dataclasses import dataclass

from kvlab._checks import integer, positive
from kvlab.devices import device_and_dtype
from kvlab.lab.timing import measure
from kvlab.theory.specs import Accelerator


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU: {_cpu_model()} ({os.cpu_count()} logical cores)"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str:
    # Read the installed metadata rather than importing: importing triton here would fix its
    # interpreter mode before kvlab.kernels can choose it.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def stamp() -> dict:
    """Device, driver and library versions and today's date: what every measurement carries."""
    import torch

    driver = "none"
    if torch.cuda.is_available():
        driver = f"CUDA {torch.version.cuda}"
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if out.returncode == 0:
                driver = f"driver {out.stdout.strip().splitlines()[0]}, CUDA {torch.version.cuda}"
        except (OSError, subprocess.SubprocessError):
            pass
    return {
        "device": device_name(),
        "threads": torch.get_num_threads(),
        "driver": driver,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def stamp_line(s: dict | None = None) -> str:
    """One line for a figure's corner: device · torch · transformers · date (and CPU threads);
    ``s`` is a ``stamp()`` (default: this machine's, now)."""
    if s is None:
        s = stamp()
    missing = [
        k
        for k in ("device", "torch", "transformers", "date")
        if not isinstance(s, dict) or k not in s
    ]
    if missing:
        raise ValueError(
            f"s must be a stamp() dict with device, torch, transformers and date, got {s!r:.80} "
            f"(missing {missing})"
        )
    threads = (
        f" · {s['threads']} thread{'s' * (s['threads'] != 1)}"
        if "CPU" in s["device"] and "threads" in s
        else ""
    )
    return (
        f"{s['device']}{threads} · torch {s['torch']} · transformers {s['transformers']} ·"
        f" {s['date']}"
    )


@dataclass(frozen=True)
class Calibration:
    """This machine's measured ceilings: copy bandwidth (bytes read plus written per second) and
    matmul rate."""

    copy_bytes_per_s: float
    matmul_flops: float
    matmul_dtype: str
    device: str

    @property
    def ridge_point(self) -> float:
        return self.matmul_flops / self.copy_bytes_per_s


@contextlib.contextmanager
def cpu_threads(threads: int | None):
    """Run the block with torch's intra-op threads set to ``threads`` (``torch.set_num_threads``),
    and put the caller's count back afterwards, also on an exception. ``None`` changes nothing.

    A CPU measurement whose verdict compares times (which batch is best, which loop is faster)
    depends on the count: two threads on a loaded 2-core machine can make a larger batch slower than
    one thread does. Measuring under a fixed count gives the same answer whoever launched the
    process (``make`` sets ``OMP_NUM_THREADS=1``; a notebook kernel may not).
    """
    import torch

    if threads is None:
        yield
        return
    integer("threads", threads, 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def calibrate() -> Calibration:
    """Measure copy bandwidth and matmul rate once per process and CPU thread count
    (``cpu_threads``).

    GPU: a 1 GiB device-to-device copy and an 8192-cube GEMM in bf16 (fp16 without bf16 units). CPU:
    a 256 MiB memory copy and a 2048-cube fp32 GEMM. Both sizes are far beyond the last-level cache,
    so the copy measures DRAM.
    """
    import torch

    return _calibrate(torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _calibrate(threads: int) -> Calibration:
    import torch

    dev, half = device_and_dtype()
    gpu = dev.type == "cuda"
    nbytes = (1 << 30) if gpu else (256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    copy_s = measure(lambda: dst.copy_(src), warmup=3, reps=10 if gpu else 5).median
    n, dtype = (8192, half) if gpu else (2048, torch.float32)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    mm_s = measure(lambda: a @ b, warmup=3, reps=10 if gpu else 5).median
    return Calibration(
        copy_bytes_per_s=2 * nbytes / copy_s,
        matmul_flops=2 * n**3 / mm_s,
        matmul_dtype=str(dtype).removeprefix("torch."),
        device=device_name(),
    )


def memory_bytes(device=None) -> int:
    """Memory of kvlab's device: a GPU's total memory, or the machine's physical RAM."""
    import torch

    dev = device_and_dtype(device)[0]
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def calibrated_device(
    calibration: Calibration | None = None, memory: float | None = None
) -> Accelerator:
    """This machine as an ``Accelerator`` for ``kvlab.theory.roofline``: the calibrated copy
    bandwidth as its bytes/s, the calibrated matmul rate as its FLOP/s (in the calibration's dtype,
    which on a CPU is fp32), and ``memory`` bytes (default: ``memory_bytes()``).
    """
    if calibration is not None and not isinstance(calibration, Calibration):
        raise TypeError(
            "calibration must be a Calibration (kvlab.calibrate()) or None, got"
            f" {type(calibration).__name__}"
        )
    c = calibration or calibrate()
    memory = memory_bytes() if memory is None else positive("memory", memory)
    return Accelerator(
        name=f"{c.device} (calibrated)",
        hbm_bytes=float(memory),
        hbm_bytes_per_s=c.copy_bytes_per_s,
        bf16_flops=c.matmul_flops,
        dies=1,
        die_bytes_per_s=c.copy_bytes_per_s,
        fabric_bytes_per_s=None,
        source=f"measured by kvlab.calibrate(): copy bandwidth and {c.matmul_dtype} matmul rate",
    )
