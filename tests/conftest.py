import os

import pytest

import kvlab.kernels

# Without a GPU, Triton kernels run under its interpreter: switched on before any kernel is
# imported.
kvlab.kernels.use_interpreter()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# The longest files first. Under `-n 2 --dist loadfile --no-loadscope-reorder` (make test) each file
# goes whole to one worker in this order, except the notebooks' executions (most of the run), which
# go one by one (pytest_xdist_make_scheduler, below) to whichever worker is free: both workers start
# on them, and the rest of test_notebooks.py (the book build and the browser tests) follows them.
# xdist's default order, largest file first, started them last and left one worker idle for minutes
# at the end. The live notebooks (only the floor run executes them) come third so that the main
# run's first worker queues a short file after the static notebooks, not the install test.
LONGEST_FIRST = (
    "test_notebooks.py",
    "test_install.py",
    "test_notebooks_live.py",
    "test_live_browser.py",
)
# Tests that each execute one notebook and share nothing with the rest of their file: each is a
# unit of work of its own for pytest-xdist.
ONE_NOTEBOOK_EACH = (
    "test_notebooks.py::test_notebook_is_committed_clean_and_executes[",
    "test_notebooks_live.py::test_notebook_live_mode_writes_clean_readings[",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, but each notebook's execution on its own, so that both workers execute
    notebooks (a test file otherwise goes whole to one worker)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksSplit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return NotebooksSplit(config, log)


def work_unit(nodeid: str) -> str:
    """The unit of work of a test for pytest-xdist: its file, or itself if it executes a notebook."""
    if any(f"/{test}" in nodeid or nodeid.startswith(test) for test in ONE_NOTEBOOK_EACH):
        return nodeid
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order


def pytest_terminal_summary(terminalreporter):
    """Report how long each notebook took to execute (a figure for the README, never an assertion),
    and the socket wake-ups the notebook runner had to recover (tests/nbrun.py)."""
    rows = []
    for r in terminalreporter.stats.get("passed", []):
        props = dict(r.user_properties)
        if r.when == "call" and "notebook_seconds" in props:
            mode = "live" if "live" in r.nodeid.split("::")[0] else "static"
            rows.append(
                (
                    r.nodeid.split("[")[-1].rstrip("]"),
                    mode,
                    props["notebook_seconds"],
                    props.get("missed_wakeups") or {},
                )
            )
    if rows:
        terminalreporter.write_sep("-", "notebook execution times (this machine)")
        for name, mode, seconds, missed in sorted(rows):
            counts = ", ".join(f"{channel} {n}" for channel, n in missed.items() if n)
            note = f" (missed socket wake-ups recovered: {counts})" if counts else ""
            terminalreporter.write_line(f"{name} {mode}: {seconds:.0f} s{note}")


def five_sides(predicted, spread=0.05):
    """The readings' tests: (disagrees below, cannot tell below, agrees, cannot tell above,
    disagrees above), 10% past each disagreement edge of ``agreement.edges``, the geometric middle
    of each cannot-tell band, and the prediction itself."""
    import math

    from kvlab.theory.agreement import edges

    lo_dis, lo_agree, hi_agree, hi_dis = edges(predicted, spread)
    return (
        0.9 * lo_dis,
        math.sqrt(lo_dis * lo_agree),
        predicted,
        math.sqrt(hi_agree * hi_dis),
        1.1 * hi_dis,
    )


@pytest.fixture
def five():
    """``five(predicted, spread=0.05)``: the five measurements of ``five_sides``."""
    return five_sides
