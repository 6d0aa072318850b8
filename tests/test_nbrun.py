"""tests/nbrun.py, the notebook runner every notebook test uses: a notebook that runs past its time
limit fails at once naming the cell, with the kernel's and the client's stacks."""

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

import nbrun  # noqa: E402


def test_a_stalled_cell_fails_fast_and_names_itself(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(600)  # the stall"),
    ]
    path = tmp_path / "stall.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(nbrun.NotebookStalled) as stalled:
        nbrun.run(path, static=True, limit_s=20)
    text = str(stalled.value)
    assert (
        "stall.ipynb: cell 2 ran" in text and "limit of 20 s" in text and "time.sleep(600)" in text
    )
    assert "ZMQ_EVENTS" in text
    assert (
        "kernel stacks" in text and "in <module>" in text
    )  # the kernel's main thread, inside the cell
    assert "client stacks" in text


def test_outputs_and_times_come_back(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\nprint(os.environ.get('KVLAB_STATIC'))")]
    path = tmp_path / "ok.ipynb"
    nbformat.write(nb, path)
    static, live = nbrun.run(path, static=True), nbrun.run(path, static=False)
    assert static.nb.cells[0].outputs[0]["text"].strip() == "1"
    assert live.nb.cells[0].outputs[0]["text"].strip() == "None"
    assert static.nb.cells[0].execution_count == 1  # the runner's own start-up code is not a cell
    assert set(static.cell_seconds) == {0} and static.seconds > 0 and static.missed_wakeups >= 0
