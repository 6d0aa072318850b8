"""The book's source folder is the repository root, so Sphinx reads every folder in it that the
configuration does not exclude: `make test` leaves venvs and wheel folders there whose Markdown
files (huggingface_hub's card templates, for one) broke `make book` run after it. Every folder that
.gitignore names, that is, everything `make` and the tests leave behind, must be excluded."""

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
matching = pytest.importorskip("sphinx.util.matching")  # a GPU image may lack the book's stack

ROOT = Path(__file__).resolve().parents[1]


def _ignored_folders() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [
        line.strip("/").replace("*", "kvlab")
        for line in lines
        if line.endswith("/") and not line.startswith("#")
    ]


def test_every_ignored_folder_is_excluded_from_the_book(tmp_path):
    folders = _ignored_folders()
    assert (
        ".venv-device" in folders and ".whl-floor-guard" in folders
    )  # the ones that broke the build
    for name in folders:
        (tmp_path / name / "templates").mkdir(parents=True)
        (tmp_path / name / "templates" / "card.md").write_text("---\n{{ card_data }}\n---\n")
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.md").write_text("# A page\n")
    excluded = yaml.safe_load((ROOT / "_config.yml").read_text())["exclude_patterns"]
    found = set(matching.get_matching_files(tmp_path, exclude_patterns=excluded))
    assert found == {"book/intro.md"}, f"the book would read: {sorted(found - {'book/intro.md'})}"
