"""Every notebook: the machine under the measurement, its device, calibration and stamp.

The roofline of section 9.3 divides bytes by a bandwidth and FLOPs by a rate, and each must be the
ceiling of the traffic it divides: a read stream (a decode step's weights) by the read bandwidth, a
copy by the copy rate, a skinny product by the matmul rate at its shape. The probes
(``read_probe``, ``write_probe``, ``copy_probe``, ``matmul_probe``) are calls that run at one
ceiling each; a page times them beside its measurement (``kvlab.lab.timing.interleaved``) so that
load changes both, and ``Probe.ceiling`` turns a timing into a rate with its spread.
``calibrate`` measures all four once per process, and ``calibrated_device`` turns them into an
``Accelerator`` that ``kvlab.theory`` accepts in place of a datasheet's (``kvlab.theory.specs``),
its bandwidth the read bandwidth. Each figure in the book names, with ``stamp``, the device and
versions it was measured on. On a CPU every time depends on how many threads torch's operators
use: ``cpu_threads`` sets them for a measurement and puts them back, and ``calibrate`` measures once
per thread count.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from kvlab._checks import integer, positive
from kvlab.devices import device_and_dtype
from kvlab.lab.timing import Timing, measure
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
    """This machine's measured ceilings, each from the fastest of its repeats: the copy rate (bytes
    read plus written per second), the matmul rate of a large square product, and (from
    ``calibrate``) the read bandwidth of a read-only stream and the write rate of a fill, with
    each one's spread (``Timing.spread_above_min``). A ``Calibration`` built by hand may leave the
    read and write rates out: the read stream then falls back to the copy rate."""

    copy_bytes_per_s: float
    matmul_flops: float
    matmul_dtype: str
    device: str
    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    read_spread: float = 0.0
    write_spread: float = 0.0
    copy_spread: float = 0.0
    matmul_spread: float = 0.0

    @property
    def stream_bytes_per_s(self) -> float:
        """The rate of a read stream (a decode step's weights, a cache read): the read bandwidth,
        or the copy rate where none was measured."""
        return self.read_bytes_per_s or self.copy_bytes_per_s

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte read at which the matmul rate and the read stream take equal time."""
        return self.matmul_flops / self.stream_bytes_per_s


@dataclass(frozen=True)
class Ceiling:
    """One measured ceiling: ``rate`` per second (bytes or FLOPs, ``unit``) from the fastest repeat
    and ``spread``, how far a typical repeat sat above the fastest (``Timing.spread_above_min``)."""

    name: str
    rate: float
    spread: float
    unit: str


@dataclass(frozen=True)
class Probe:
    """A call that runs at one ceiling, and what it moves or computes per call (``amount`` in the
    unit's numerator). Time ``run`` beside the measurement it serves (``timing.interleaved``), then
    ``ceiling(timing)`` gives the rate."""

    name: str
    run: Callable[[], object]
    amount: float
    unit: str

    def ceiling(self, timing: Timing) -> Ceiling:
        return Ceiling(self.name, self.amount / timing.min, timing.spread_above_min, self.unit)


PROBE_FLOPS = 2**28  # a matmul probe's work per call: milliseconds on a CPU


def stream_bytes() -> int:
    """The buffer a bandwidth probe streams: 1 GiB on a GPU, 256 MiB on a CPU, far beyond either's
    last-level cache."""
    dev, _ = device_and_dtype()
    return (1 << 30) if dev.type == "cuda" else (256 << 20)


def _buffer(nbytes: int):
    import torch

    dev, _ = device_and_dtype()
    return torch.ones(nbytes // 4, dtype=torch.float32, device=dev)  # pages written first


def read_probe(nbytes: int | None = None) -> Probe:
    """A read-only stream: the sum of an fp32 buffer of ``nbytes`` (default ``stream_bytes()``)
    whose pages were written first, so no first-touch fault is timed."""
    nbytes = stream_bytes() if nbytes is None else integer("nbytes", nbytes, 1 << 20)
    buf = _buffer(nbytes)
    return Probe("read", buf.sum, float(nbytes), "B/s")


def write_probe(nbytes: int | None = None) -> Probe:
    """A write-only stream: filling an fp32 buffer of ``nbytes`` (default ``stream_bytes()``)."""
    nbytes = stream_bytes() if nbytes is None else integer("nbytes", nbytes, 1 << 20)
    buf = _buffer(nbytes)
    return Probe("write", lambda: buf.fill_(2.0), float(nbytes), "B/s")


def copy_probe(nbytes: int | None = None) -> Probe:
    """A copy of ``nbytes`` (default ``stream_bytes()``) into a second buffer: its amount counts the
    bytes read plus the bytes written."""
    nbytes = stream_bytes() if nbytes is None else integer("nbytes", nbytes, 1 << 20)
    src, dst = _buffer(nbytes), _buffer(nbytes)
    return Probe("copy", lambda: dst.copy_(src), 2.0 * nbytes, "B/s")


def matmul_probe(n: int, k: int = 1024, m: int = 1024, dtype=None) -> Probe:
    """The product of an ``[n, k]`` activation and a ``[k, m]`` weight in ``dtype`` (default
    kvlab's: fp32 on a CPU), repeated back to back for about ``PROBE_FLOPS`` per call, its amount
    ``2 n k m`` FLOPs per product. The default weight (4 MiB in fp32) sits in a CPU's last-level
    cache, so the probe times the arithmetic at a decode shape without the weight's stream from
    memory: the compute ceiling of the roofline at batch ``n``. The repeats amortise the first
    product's reload of the weight after a stream probe timed beside it has evicted it."""
    import torch

    n, k, m = integer("n", n), integer("k", k), integer("m", m)
    dev, dt = device_and_dtype(None, dtype)
    x = torch.randn(n, k, device=dev, dtype=dt)
    w = torch.randn(k, m, device=dev, dtype=dt)
    flops = 2.0 * n * k * m
    times = max(1, round(PROBE_FLOPS / flops))

    def products():
        for _ in range(times):
            x @ w

    return Probe(f"matmul n={n}", products, flops * times, "FLOP/s")


def measure_ceiling(probe: Probe, reps: int = 7, warmup: int = 2) -> Ceiling:
    """``probe`` timed on its own (``warmup`` untimed calls, ``reps`` timed): its ceiling."""
    if not isinstance(probe, Probe):
        raise TypeError(f"probe must be a kvlab.lab.hardware.Probe, got {type(probe).__name__}")
    return probe.ceiling(measure(probe.run, warmup=warmup, reps=reps))


def read_bandwidth(reps: int = 7) -> Ceiling:
    """This machine's read bandwidth in bytes/s (``read_probe``)."""
    return measure_ceiling(read_probe(), reps)


def write_bandwidth(reps: int = 7) -> Ceiling:
    """This machine's write rate in bytes/s (``write_probe``)."""
    return measure_ceiling(write_probe(), reps)


def copy_bandwidth(reps: int = 7) -> Ceiling:
    """This machine's copy rate in bytes read plus written per second (``copy_probe``)."""
    return measure_ceiling(copy_probe(), reps)


def matmul_rate(n: int, k: int = 1024, m: int = 1024, reps: int = 7) -> Ceiling:
    """This machine's FLOP/s for an ``[n, k] x [k, m]`` product (``matmul_probe``)."""
    return measure_ceiling(matmul_probe(n, k, m), reps)


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
    """Measure the read, write and copy rates and the matmul rate once per process and CPU thread
    count (``cpu_threads``), each the fastest of several repeats with its spread.

    GPU: 1 GiB streams and an 8192-cube GEMM in bf16 (fp16 without bf16 units). CPU: 256 MiB
    streams and a 2048-cube fp32 GEMM. The streams are far beyond the last-level cache, so they
    measure DRAM. A page that compares a measurement with a ceiling times the ceiling's probe beside
    it (``read_probe`` and ``timing.interleaved``); this is the machine's summary, printed by
    ``kvlab.env()``.
    """
    import torch

    return _calibrate(torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _calibrate(threads: int) -> Calibration:
    import torch

    dev, half = device_and_dtype()
    gpu = dev.type == "cuda"
    reps = 10 if gpu else 5
    read, write, copy = (measure_ceiling(p(), reps) for p in (read_probe, write_probe, copy_probe))
    n, dtype = (8192, half) if gpu else (2048, torch.float32)
    mm = measure_ceiling(matmul_probe(n, n, n, dtype), reps)
    return Calibration(
        copy_bytes_per_s=copy.rate,
        matmul_flops=mm.rate,
        matmul_dtype=str(dtype).removeprefix("torch."),
        device=device_name(),
        read_bytes_per_s=read.rate,
        write_bytes_per_s=write.rate,
        read_spread=read.spread,
        write_spread=write.spread,
        copy_spread=copy.spread,
        matmul_spread=mm.spread,
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
    """This machine as an ``Accelerator`` for ``kvlab.theory.roofline``: the calibrated read
    bandwidth as its bytes/s (a decode step's weights and cache are read streams), the calibrated
    matmul rate as its FLOP/s (in the calibration's dtype,
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
        hbm_bytes_per_s=c.stream_bytes_per_s,
        bf16_flops=c.matmul_flops,
        dies=1,
        die_bytes_per_s=c.stream_bytes_per_s,
        fabric_bytes_per_s=None,
        source=f"measured by kvlab.calibrate(): read bandwidth and {c.matmul_dtype} matmul rate",
    )
