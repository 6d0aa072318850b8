"""Every notebook executes top to bottom in a fresh kernel on this machine, and the book builds from
the executed notebooks with warnings as errors.

The notebooks run once: each executed copy goes into a scratch copy of the book, and the last test
builds that copy with execution switched off. Execution times are reported, never asserted.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A scratch copy of the book's sources, and a cache of executed notebooks."""
    dst = tmp_path_factory.mktemp("book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, dst / name)
    for name in ("book", "notebooks"):
        shutil.copytree(ROOT / name, dst / name)
    return {"root": dst, "executed": {}, "seconds": {}}


def _execute(book, path: Path):
    if path.name not in book["executed"]:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
        book["seconds"][path.name] = time.perf_counter() - start
        nbformat.write(nb, book["root"] / "notebooks" / path.name)
        book["executed"][path.name] = nb
    return book["executed"][path.name]


@pytest.fixture(autouse=True)
def static_book_env(monkeypatch):
    # The kernel inherits this process's environment (and conftest's TRITON_INTERPRET on a CPU).
    monkeypatch.setenv("KVLAB_STATIC", "1")


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean_and_executes(book, path, record_property):
    committed = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(committed.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: commit notebooks without outputs (cells {dirty})"
    nb = _execute(book, path)
    record_property("notebook_seconds", book["seconds"][path.name])  # reported by conftest
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.notebook
def test_book_builds_with_warnings_as_errors(book):
    for path in NOTEBOOKS:
        _execute(book, path)
    root = book["root"]
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"  # executed above; build from those outputs
    (root / "_config.yml").write_text(yaml.safe_dump(config))
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run([str(jupyter_book), "build", str(root), "-W", "--keep-going"],
                            capture_output=True, text=True, env={**os.environ, "KVLAB_STATIC": "1"})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    html = root / "_build" / "html"
    wheels = list((html / "notebooks").glob("kvlab-*.whl"))  # the book carries kvlab (book/_ext/kvlab_install.py)
    assert len(wheels) == 1
    for path in NOTEBOOKS:
        page = (html / "notebooks" / f"{path.stem}.html").read_text()
        assert f'href="{wheels[0].name}" download' in page, f"{path.name}: no link to the kvlab wheel"
        assert "data:image/png;base64," in page, f"{path.name}: no figure on the built page"
        assert "kvlab-explorer" in page, f"{path.name}: no slider on the built page"
        assert page.count("const THEBE_JS_URL") <= 1, f"{path.name}: a script is declared twice"
    # MathJax ships with the book (sphinx-mathjax-offline), so formulas render offline.
    assert "mathjax/tex-chtml.js" in (html / "notebooks" / "01_decode_loop.html").read_text()
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()
