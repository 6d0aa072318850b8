"""Which code a page shows: one rule, applied when the book is built, instead of tags by hand.

A notebook page opens with its idea, not its plumbing. While the HTML book is built, every notebook's
cells get Jupyter Book's tags by this rule (the notebooks themselves are not changed, so a reader of
the notebook still sees and runs every line):

- the first code cell (the setup: kvlab's install head, imports, ``print(kvlab.env())``) shows no
  code, and the environment it prints is folded behind a toggle;
- a code cell longer than ``LONGEST_SHOWN`` lines is folded behind a toggle (``hide-input``);
- a plotting or explorer cell (it draws with matplotlib or ``kvlab.show``, or builds an explorer)
  longer than ``LONGEST_PLOTTING`` lines is folded too: its figure says what is plotted.

A cell that already carries a visibility tag keeps it, and the tag ``show-input`` keeps a cell's code
in view whatever its length. ``tests/test_book_config.py`` tests the rule; ``tests/test_notebooks.py``
checks the built pages: no visible code cell longer than ``LONGEST_SHOWN`` lines.
"""

import json
import re

LONGEST_SHOWN = 25
LONGEST_PLOTTING = 12
VISIBILITY_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell", "show-input"}
PLOTTING = re.compile(r"\bplt\.|\bplots\.|\bexplore\(|\.explore\(|\bfig\b|\bax\.|\baxes\b")


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def lines(cell: dict) -> int:
    return len(_text(cell).splitlines())


def tags_to_add(cell: dict, first_code: bool) -> list[str]:
    """The tags the rule adds to one code cell (none to a cell already tagged for visibility)."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    if tags & VISIBILITY_TAGS:
        return []
    if first_code:
        return ["remove-input"] + (["hide-output"] if "kvlab.env()" in _text(cell) else [])
    n = lines(cell)
    if n > LONGEST_SHOWN or (n > LONGEST_PLOTTING and PLOTTING.search(_text(cell))):
        return ["hide-input"]
    return []


def apply(nb: dict) -> dict:
    """``nb`` (a notebook as JSON) with the rule's tags added to its code cells, in place."""
    first = True
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        added = tags_to_add(cell, first)
        first = False
        if added:
            metadata = cell.setdefault("metadata", {})
            metadata["tags"] = list(metadata.get("tags", [])) + added
    return nb


def _tag_cells(app, docname, source):
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    source[0] = json.dumps(apply(json.loads(source[0])), ensure_ascii=False)


def setup(app):
    app.connect("source-read", _tag_cells)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
