import os

import kvlab.kernels

# Without a GPU, Triton kernels run under its interpreter: switched on before any kernel is imported.
kvlab.kernels.use_interpreter()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_terminal_summary(terminalreporter):
    """Report how long each notebook took to execute (a figure for the README, never an assertion)."""
    rows = [(r.nodeid.split("[")[-1].rstrip("]"), dict(r.user_properties)["notebook_seconds"])
            for r in terminalreporter.stats.get("passed", [])
            if r.when == "call" and "notebook_seconds" in dict(r.user_properties)]
    if rows:
        terminalreporter.write_sep("-", "notebook execution times (this machine)")
        for name, seconds in sorted(rows):
            terminalreporter.write_line(f"{name}: {seconds:.0f} s")
