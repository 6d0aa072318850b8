"""Execute one notebook with nbclient so that it never hangs: every wait for the kernel has a limit,
and a notebook that runs out of time fails at once, naming the cell and saying where both sides
were.

Used by ``tests/test_notebooks.py``, ``tests/test_notebooks_live.py`` and ``scripts/gpu_check.sh``
(``python tests/nbrun.py NOTEBOOK --out FOLDER``).

Why the replies are read in one-second slices. nbclient waits for a cell's ``execute_reply`` with
one long poll of the shell socket (zmq.asyncio). A live ``kvlab.explore`` cell draws into an
ipywidgets Output, and nbclient's stand-in for that widget sends a ``comm_msg`` on the same shell
socket for every output while the poll is waiting. Now and then (3 of 19 live runs of notebooks 05
to 10 on the loaded 2-core machine, issue 23) the reply then sits unread in the socket: the kernel
is idle, having sent it; the client's event loop sleeps in epoll; ``getsockopt(ZMQ_EVENTS)`` on the
client's shell socket reads POLLIN|POLLOUT, with the poll still registered; and the reply is read
the moment the poll's timer fires, so the cell "takes" exactly its timeout (nbclient issue 312).
That is a lost wake-up of the client's socket, not a reply the kernel lost. Polling in short slices
bounds what one lost wake-up costs to a slice; the channels count them (``missed_wakeups``): 9 in
the 120 live executions of issue 23's ten acceptance runs, each otherwise a stall of the old 900 s.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty

import nbformat
import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from traitlets import Type

POLL_SLICE_S = 1.0
# Per-notebook limits (override: KVLAB_NOTEBOOK_LIMIT_S), from the executions measured on the loaded
# 2-core machine (2026-12-01, issue 23): static 17 to 77 s (10_memory_wall the slowest; 94 s for 01
# in the GPU check's dry run beside the floor suite), live 9 to 99 s (02_cache_reuse at the floor).
# About four times the slowest, so load does not trip them, and a stall fails in 7 minutes instead
# of the 15 per cell that nbclient's timeout allowed before.
STATIC_LIMIT_S = 420
LIVE_LIMIT_S = 420


class SlicedChannel(AsyncZMQSocketChannel):
    """A channel whose ``get_msg`` polls in slices of ``POLL_SLICE_S``, so a missed wake-up of the
    socket costs one slice; ``missed_wakeups`` counts messages found only when a slice ran out."""

    missed_wakeups = 0

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            wait = max(0.0, min(POLL_SLICE_S, left))
            start = time.monotonic()
            if await self.socket.poll(int(wait * 1000)):
                if wait > 0 and time.monotonic() - start >= wait:
                    self.missed_wakeups += 1  # ready, yet seen only when the slice's timer fired
                frames = await self.socket.recv_multipart()
                _, frames = self.session.feed_identities(frames)
                return self.session.deserialize(frames)
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedKernelClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedChannel)
    iopub_channel_class = Type(SlicedChannel)


class NotebookStalled(AssertionError):
    """A notebook ran past its time limit; the message names the cell and holds both sides'
    stacks."""


@dataclass
class Run:
    nb: nbformat.NotebookNode
    seconds: float
    missed_wakeups: int  # shell and iopub together
    cell_seconds: dict = field(default_factory=dict)  # code cell index -> seconds
    missed_by_channel: dict = field(default_factory=dict)  # {"shell": n, "iopub": n}


class _Client(NotebookClient):
    """nbclient with sliced polls, one time limit for the whole notebook, and a stall report."""

    def __init__(self, nb, *, limit_s: float, stacks_file: str, **kw):
        super().__init__(nb, timeout_func=self._time_left, **kw)
        self.deadline = time.monotonic() + limit_s
        self.limit_s = limit_s
        self.stacks_file = stacks_file
        self.missed = {"shell": 0, "iopub": 0}
        self.cell_seconds: dict[int, float] = {}

    def _time_left(self, cell) -> int:
        return max(1, int(self.deadline - time.monotonic()))

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        km.client_factory = SlicedKernelClient
        return km

    def _count_missed(self) -> None:
        if self.kc is not None:
            self.missed = {
                name: getattr(self.kc, f"{name}_channel").missed_wakeups
                for name in ("shell", "iopub")
            }

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        start = time.monotonic()
        try:
            return await super().async_execute_cell(
                cell, cell_index, execution_count, store_history
            )
        except (CellTimeoutError, DeadKernelError) as e:
            raise NotebookStalled(await self._report(cell, cell_index, start, e)) from None
        finally:
            self._count_missed()
            if cell.cell_type == "code":
                self.cell_seconds[cell_index] = round(time.monotonic() - start, 2)

    async def _report(self, cell, index, start, error) -> str:
        """Where the cell stalled: the cell, the time, the client's socket state, both sides'
        stacks."""
        what = (
            "the kernel died"
            if isinstance(error, DeadKernelError)
            else f"the notebook's limit of {self.limit_s:.0f} s ran out"
        )
        lines = [
            (
                f"{self.resources['metadata'].get('name', 'notebook')}: cell {index} ran "
                f"{time.monotonic() - start:.0f} s and {what} ({type(error).__name__})."
            ),
            "cell source:",
            cell.source[:600],
        ]
        if self.kc is not None:
            events = self.kc.shell_channel.socket.get(zmq.EVENTS)
            lines.append(
                f"client shell socket ZMQ_EVENTS={events} (1: a reply waits unread); "
                f"missed wake-ups so far: {self.kc.shell_channel.missed_wakeups}"
            )
        try:
            await self.km.signal_kernel(
                signal.SIGUSR1
            )  # faulthandler in the kernel writes its stacks
            await asyncio.sleep(1)
            lines += [
                "kernel stacks (the thread that runs cells first):",
                Path(self.stacks_file).read_text()[:8000],
            ]
        except Exception as e:  # a dead kernel has no stacks to give
            lines.append(f"kernel stacks unavailable: {type(e).__name__}: {e}")
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            lines += ["client stacks:", f.read()[:4000]]
        return "\n".join(lines)


def run(
    path: Path,
    *,
    static: bool,
    limit_s: float | None = None,
    env: dict | None = None,
    after: str | None = None,
) -> Run:
    """Execute the notebook at ``path`` in a fresh kernel (static: ``KVLAB_STATIC=1``; live: unset)
    within ``limit_s`` seconds in all, then ``after`` (code, if given) as one more cell in the same
    kernel. Raises nbclient's CellExecutionError on a cell's error and NotebookStalled when the time
    runs out; returns the notebook with its outputs and the times."""
    path = Path(path)
    limit_s = limit_s or float(
        os.environ.get("KVLAB_NOTEBOOK_LIMIT_S", STATIC_LIMIT_S if static else LIVE_LIMIT_S)
    )
    env = dict(os.environ if env is None else env)
    env.pop("KVLAB_STATIC", None)
    # A notebook switches Triton's interpreter on itself (kvlab.kernels.use_interpreter), as `make
    # book` and a reader's CPU kernel need: the test suite's own switch must not hide one that
    # forgets to.
    env.pop("TRITON_INTERPRET", None)
    if static:
        env["KVLAB_STATIC"] = "1"
    nb = nbformat.read(path, as_version=4)
    if after:
        nb.cells.append(nbformat.v4.new_code_cell(after))
    with tempfile.NamedTemporaryFile("w+", suffix=".stacks", delete=False) as f:
        stacks = f.name
    # Binds no name in the notebook's namespace; SIGUSR1 then makes the kernel write every stack.
    register = (
        "__import__('faulthandler').register(__import__('signal').SIGUSR1, "
        f"file=open({stacks!r}, 'w'), all_threads=True)"
    )
    client = _Client(
        nb,
        limit_s=limit_s,
        stacks_file=stacks,
        kernel_name="python3",
        extra_arguments=[f"--IPKernelApp.exec_lines={register}"],
        resources={"metadata": {"path": str(path.parent), "name": path.name}},
    )
    start = time.monotonic()
    try:
        client.execute(env=env)
    finally:
        os.unlink(stacks)
    return Run(
        nb,
        time.monotonic() - start,
        sum(client.missed.values()),
        client.cell_seconds,
        client.missed,
    )


def main(argv=None) -> int:
    """Command line for scripts/gpu_check.sh: execute one notebook; write it, executed, and a JSON
    record of its times (or its error) under --out."""
    p = argparse.ArgumentParser(
        description="Execute one notebook with a time limit (tests/nbrun.py)."
    )
    p.add_argument("notebook", type=Path)
    p.add_argument(
        "--out", type=Path, required=True, help="folder for the executed notebook and its record"
    )
    p.add_argument("--live", action="store_true", help="live mode (no KVLAB_STATIC)")
    p.add_argument("--limit", type=float, default=None, help="seconds for the whole notebook")
    p.add_argument(
        "--after-file",
        type=Path,
        default=None,
        help="a Python file run as one more cell in the same kernel after the last cell",
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"notebook": args.notebook.stem, "mode": "live" if args.live else "static"}
    try:
        after = args.after_file.read_text() if args.after_file else None
        result = run(args.notebook, static=not args.live, limit_s=args.limit, after=after)
        nbformat.write(result.nb, args.out / args.notebook.name)
        record.update(
            ok=True,
            seconds=round(result.seconds, 1),
            missed_wakeups=result.missed_by_channel,
            cell_seconds=result.cell_seconds,
        )
        return 0
    except Exception as e:
        record.update(ok=False, error=f"{type(e).__name__}: {e}"[:20000])
        print(record["error"], file=sys.stderr)
        return 1
    finally:
        (args.out / f"{args.notebook.stem}.json").write_text(json.dumps(record, indent=1))
        print(json.dumps({k: v for k, v in record.items() if k not in ("cell_seconds", "error")}))


if __name__ == "__main__":
    sys.exit(main())
