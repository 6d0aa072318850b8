"""The page of recorded measurements lists every committed ``python -m kvlab record`` file.

Each JSON file in ``book/data/measurements/`` becomes a column of the page's tables
(``kvlab.lab.bench.records_markdown``), so GPU runs stand beside the CPU run the book was built
with.
"""

from pathlib import Path

PAGE = "book/measurements"


def _append_records(app, docname, source):
    if docname != PAGE:
        return
    from kvlab.lab.bench import load_records, records_markdown

    folder = Path(app.srcdir) / "book" / "data" / "measurements"
    source[0] += "\n\n## The records\n\n" + records_markdown(load_records(folder)) + "\n"


def setup(app):
    app.connect("source-read", _append_records)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
