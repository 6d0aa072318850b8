"""Starting p worker processes that talk through ``torch.distributed`` (notebook 12, "Decode across
devices"): gloo on CPUs, NCCL on GPUs, one process per rank.

:class:`Workers` starts the ranks from Python with ``torch.multiprocessing`` (the way a notebook
does), keeps them for several calls (a process that imports torch and transformers takes seconds to
start), and runs a function on every rank: ``workers.run(fn, *args)`` returns what
``fn(rank, world_size, *args)`` returned on each. :func:`run` is the one-call form. Under
``torchrun`` the processes already exist and :func:`init_from_env` joins the group from the
variables torchrun sets.

Everything is checked before a process starts (world size, backend against the device, a function
the workers can import). When one rank fails, every rank is stopped and the error names the rank
that failed first, with its traceback; a call that outlives its ``timeout`` stops them too. Every
worker process has exited when a failed call raises or when the workers are closed.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvlab._checks import integer, one_of, positive

BACKENDS = ("gloo", "nccl")
MAX_WORLD = 64  # one machine's processes; far beyond what a notebook should start
POLL_S = 0.05


class WorkerError(RuntimeError):
    """A worker process failed; ``rank`` says which, and the message ends with its traceback."""

    def __init__(self, rank: int, detail: str):
        rank = integer("rank", rank, 0)
        super().__init__(f"rank {rank} failed:\n{detail}")
        self.rank = rank


def default_backend(device: str = "cpu") -> str:
    """NCCL for CUDA devices, gloo for the CPU."""
    one_of("device", str(device).split(":")[0], ("cpu", "cuda"))
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def check_launch(
    world_size: int, backend: str | None = None, device: str = "cpu"
) -> tuple[int, str, str]:
    """``(world_size, backend, device)`` after checking that this machine can run them.

    NCCL needs one CUDA device per rank; gloo runs anywhere. Raises ValueError naming the argument.
    """
    world_size = integer("world_size", world_size, 1, MAX_WORLD + 1)
    one_of("device", device, ("cpu", "cuda"))
    backend = default_backend(device) if backend is None else one_of("backend", backend, BACKENDS)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available here; use device='cpu'")
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device != "cuda" or not dist.is_nccl_available() or gpus < world_size:
            raise ValueError(
                "backend='nccl' needs device='cuda' and one CUDA device per rank: world_size="
                f"{world_size}, device={device!r}, {gpus} CUDA device(s) here; use backend='gloo'"
            )
    elif not dist.is_gloo_available():
        raise ValueError("backend='gloo' is not built into this torch; install a torch with gloo")
    return world_size, backend, device


def check_rank(name: str, rank, world_size: int) -> int:
    """``rank`` as an int in [0, world_size)."""
    return integer(name, rank, 0, world_size)


def _check_importable(fn) -> None:
    """Spawned workers import ``fn`` by name: a lambda or a function defined in a notebook cannot
    be."""
    if not callable(fn):
        raise TypeError(f"fn must be a function (rank, world_size, *args), got {type(fn).__name__}")
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or "<" in name:
        raise ValueError(
            f"fn must be a module-level function a new process can import, got {name or fn!r} "
            f"from module {module!r}; define it in a .py module"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Workers:
    """``world_size`` processes in one ``torch.distributed`` group, kept for several calls.

    >>> with Workers(2) as workers:                      # doctest: +SKIP
    ...     workers.run(some_module.fn, 42)              # fn(rank, 2, 42) on ranks 0 and 1
    """

    def __init__(self, world_size: int = 2, backend: str | None = None, device: str = "cpu"):
        self.world_size, self.backend, self.device = check_launch(world_size, backend, device)
        context = mp.get_context("spawn")
        self._tasks = [context.SimpleQueue() for _ in range(self.world_size)]
        self._results = context.SimpleQueue()
        self._processes = mp.start_processes(
            _serve,
            args=(self.world_size, self.backend, _free_port(), self._tasks, self._results),
            nprocs=self.world_size,
            join=False,
            start_method="spawn",
        )
        self.closed = False

    def run(self, fn, *args, timeout: float = 300.0) -> list:
        """``fn(rank, world_size, *args)`` on every rank; their return values in rank order."""
        if self.closed:
            raise RuntimeError(
                "these workers are closed (after close() or a failed call); start new Workers"
            )
        _check_importable(fn)
        timeout = positive("timeout", timeout)
        task = pickle.dumps((fn, args))
        for tasks in self._tasks:
            tasks.put(task)
        return self._collect(fn.__qualname__, time.monotonic() + timeout)

    def _collect(self, name: str, deadline: float) -> list:
        returned = {}
        try:
            while len(returned) < self.world_size:
                _drain(self._results, returned)
                if any(isinstance(v, _Failed) for v in returned.values()):
                    raise _first_failure(returned, None, self._silent(returned))
                self._processes.join(timeout=POLL_S, grace_period=1.0)  # raises if a rank died
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{name} did not finish on all {self.world_size} ranks within the "
                        "timeout; every rank was stopped"
                    )
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            _drain(self._results, returned)
            silent = self._silent(returned)  # before stopping: who left on its own
            self._stop()
            _drain(self._results, returned)
            raise _first_failure(returned, e, silent) from None
        except WorkerError:
            self._stop()
            raise
        except BaseException:
            silent = self._silent(returned)
            self._stop()
            _drain(self._results, returned)
            if any(isinstance(v, _Failed) for v in returned.values()):
                raise _first_failure(returned, None, silent) from None
            raise
        return [returned[rank] for rank in range(self.world_size)]

    def _silent(self, returned: dict) -> dict[int, int]:
        """``{rank: exit code}`` of the ranks whose process has exited without a result or a
        traceback (killed, crashed, ``os._exit``)."""
        return {
            rank: p.exitcode
            for rank, p in enumerate(self._processes.processes)
            if p.exitcode is not None and rank not in returned
        }

    def _stop(self) -> None:
        self.closed = True
        _stop(self._processes.processes)

    def close(self) -> None:
        """Let every rank leave the group and exit (stopped by force after a few seconds)."""
        if not self.closed:
            for tasks in self._tasks:
                tasks.put(None)
            for process in self._processes.processes:
                process.join(10)
        self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run(
    fn,
    world_size: int,
    *args,
    backend: str | None = None,
    device: str = "cpu",
    timeout: float = 300.0,
):
    """``fn(rank, world_size, *args)`` on ``world_size`` fresh ranks (:class:`Workers` for one
    call)."""
    _check_importable(fn)
    with Workers(world_size, backend, device) as workers:
        return workers.run(fn, *args, timeout=timeout)


def world_of(
    workers: Workers | None, world_size: int, backend: str | None = None, device: str = "cpu"
) -> int:
    """The world size a call will run on: that of ``workers`` when given, else ``world_size``,
    checked against ``backend`` and ``device`` (before anything starts)."""
    if workers is None:
        return check_launch(world_size, backend, device)[0]
    if not isinstance(workers, Workers):
        raise TypeError(
            f"workers must be a kvlab.parallel.launch.Workers or None, got {type(workers).__name__}"
        )
    return workers.world_size


def call(
    workers: Workers | None,
    fn,
    *args,
    world_size: int = 2,
    backend: str | None = None,
    device: str = "cpu",
    timeout: float = 300.0,
) -> list:
    """``fn`` on ``workers`` if given (their world size wins), else on fresh ones of
    ``world_size``."""
    world_of(workers, world_size, backend, device)
    if workers is None:
        return run(fn, world_size, *args, backend=backend, device=device, timeout=timeout)
    return workers.run(fn, *args, timeout=timeout)


class _Failed:
    """What a failing rank reports before it exits: its traceback and when it failed."""

    def __init__(self, traceback_text: str):
        self.traceback, self.when = traceback_text, time.time()


def _first_failure(returned: dict, error, silent: dict) -> WorkerError:
    """The rank that failed first: the others usually fail only because it left (a closed
    socket). A rank whose process exited without a word (``silent``: rank to exit code) failed
    before any rank that was still alive to write its traceback."""
    failed = sorted(
        (f.when, rank, f.traceback) for rank, f in returned.items() if isinstance(f, _Failed)
    )
    if silent:
        rank = min(silent)
        others = "".join(f"\n(then rank {r} failed too:)\n{text}" for _, r, text in failed)
        return WorkerError(
            rank,
            f"its process exited with code {silent[rank]} and left no Python traceback (killed,"
            f" crashed or os._exit) while the other ranks were still running{others}",
        )
    if not failed:
        return WorkerError(
            error.error_index, f"{error} (it left no Python traceback: killed, or it crashed)"
        )
    _, rank, text = failed[0]
    later = [str(r) for _, r, _ in failed[1:]]
    return WorkerError(
        rank, text + (f"\n(then rank(s) {', '.join(later)} failed too)" if later else "")
    )


def _drain(results, returned: dict) -> None:
    while not results.empty():
        try:
            rank, value = results.get()
        except (EOFError, queue.Empty):
            return
        returned[rank] = pickle.loads(value)


def _stop(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def _serve(rank: int, world_size: int, backend: str, port: int, tasks, results) -> None:
    """One rank: join the group (with the variables torchrun would set), then run tasks until told
    to stop. A task that raises reports its traceback and ends the process."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # The ranks share the machine's cores: without OMP_NUM_THREADS, each takes its share.
    torch.set_num_threads(
        int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // world_size)
    )
    try:
        init_from_env(backend)
        while (task := tasks[rank].get()) is not None:
            fn, args = pickle.loads(task)
            # Plain pickle: tensors travel by value (torch's queue would share memory that dies with
            # this process).
            results.put((rank, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, pickle.dumps(_Failed(traceback.format_exc()))))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_from_env(backend: str | None = None, timeout_s: float = 120.0) -> tuple[int, int]:
    """Join the process group described by ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` (what torchrun and :class:`Workers` set); returns ``(rank, world_size)``.
    Under NCCL each rank takes the GPU of its ``LOCAL_RANK``."""
    rank, world = _rank_from_env()
    backend = backend or default_backend("cuda" if torch.cuda.is_available() else "cpu")
    one_of("backend", backend, BACKENDS), positive("timeout_s", timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
    return rank, world


def _rank_from_env() -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` from the environment, each there and a whole number in range."""
    values = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ValueError(
                f"init_from_env needs the environment variable {name}, which is not set: start the"
                " ranks with torchrun or kvlab.parallel.launch.Workers"
            )
        values[name] = os.environ[name]
    numbers = {}
    for name in ("RANK", "WORLD_SIZE"):
        if not values[name].isdigit():
            raise ValueError(
                f"environment variable {name} must be a whole number, got {values[name]!r}"
            )
        numbers[name] = int(values[name])
    world = integer("WORLD_SIZE", numbers["WORLD_SIZE"], 1, MAX_WORLD + 1)
    return integer("RANK", numbers["RANK"], 0, world), world


def rank_device() -> torch.device:
    """The device this rank's tensors live on: its CUDA device under NCCL, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
