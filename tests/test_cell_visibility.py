"""The book's rule for which code a page shows (book/_ext/cell_visibility.py), on small notebooks:
each side of each length limit, the setup cell, and tags a cell already carries."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))

import cell_visibility as cv  # noqa: E402


def _code(n: int, line: str = "x = 1", tags=None) -> dict:
    cell = {"cell_type": "code", "source": "\n".join([line] * n), "metadata": {}}
    if tags:
        cell["metadata"]["tags"] = tags
    return cell


def _tags(nb: dict) -> list[list[str]]:
    return [c.get("metadata", {}).get("tags", []) for c in cv.apply(nb)["cells"]]


def test_the_setup_cell_shows_no_code_and_folds_the_environment():
    setup = _code(3, "print(kvlab.env())")
    nb = {"cells": [{"cell_type": "markdown", "source": "# Title"}, setup, _code(3)]}
    assert _tags(nb) == [[], ["remove-input", "hide-output"], []]


def test_a_setup_cell_that_prints_no_environment_keeps_its_output():
    assert _tags({"cells": [_code(3)]}) == [["remove-input"]]


def test_code_longer_than_the_limit_is_folded_and_at_the_limit_is_shown():
    nb = {"cells": [_code(1), _code(cv.LONGEST_SHOWN), _code(cv.LONGEST_SHOWN + 1)]}
    assert _tags(nb)[1:] == [[], ["hide-input"]]


def test_plotting_code_is_folded_from_a_shorter_length():
    plot = "ax.plot(x, y)"
    nb = {
        "cells": [_code(1), _code(cv.LONGEST_PLOTTING, plot), _code(cv.LONGEST_PLOTTING + 1, plot)]
    }
    assert _tags(nb)[1:] == [[], ["hide-input"]]


def test_a_cell_tagged_by_hand_keeps_its_tags():
    nb = {
        "cells": [
            _code(1),
            _code(40, tags=["remove-input"]),
            _code(40, tags=["show-input"]),
            _code(40, tags=["margin"]),
        ]
    }
    assert _tags(nb)[1:] == [["remove-input"], ["show-input"], ["margin", "hide-input"]]
