"""The notebooks as a live reader meets them: executed outside the book build (live mode, no
``KVLAB_STATIC``), every paragraph they write and every Markdown cell reads cleanly without Sphinx.
A notebook that runs past its time limit fails naming the cell (``tests/nbrun.py``).

Markdown cells hold no myst role (``{glue:text}``, ``{cite:p}``, ``{doc}``, ``{ref}``); numbers
reach the prose as Markdown output of the cell that measured them (``kvlab.reading``). A separate
file from ``test_notebooks.py``: only the floor run executes these, each notebook a unit of work of
its own for pytest-xdist, split across the workers (tests/conftest.py).
"""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # a GPU image may lack the Jupyter stack
pytest.importorskip("nbclient")

import nbrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ROLE = re.compile(r"\{(glue|glue:text|glue:md|glue:any|cite|cite:p|cite:t|doc|ref|numref|eq)\}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_markdown_cells_have_no_myst_roles(path):
    nb = nbformat.read(path, as_version=4)
    found = [
        (i, m.group(0))
        for i, c in enumerate(nb.cells)
        if c.cell_type == "markdown"
        for m in ROLE.finditer(c.source)
    ]
    assert not found, f"{path.name}: myst roles in Markdown cells (cell, role): {found}"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_live_mode_writes_clean_readings(path, record_property):
    run = nbrun.run(path, static=False)
    record_property("notebook_seconds", run.seconds)  # reported by conftest
    record_property("missed_wakeups", run.missed_by_channel)
    nb = run.nb
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    readings = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert readings, f"{path.name}: no reading written by code"
    raw = [r[:120] for r in readings if ROLE.search(r)]
    assert not raw, f"{path.name}: raw role text in a reading: {raw}"
    stray = [
        o["data"]["text/plain"]
        for o in outputs
        if o.get("output_type") == "execute_result" and set(o["data"]) == {"text/plain"}
    ]
    assert not stray, f"{path.name}: a cell's last expression echoes a value: {stray}"
