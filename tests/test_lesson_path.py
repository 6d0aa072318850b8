"""The book's promise about the lesson path (how many modules, how many lines, which) is what
scripts/lesson_path.py writes from the tree: book/intro.md and book/architecture.md hold its blocks,
and the path is stated once, as LESSON_PATH. Standard library only."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import lesson_path  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize("page", sorted(set(lesson_path.PAGES.values())))
def test_the_book_says_what_the_tree_holds(page):
    text = (ROOT / page).read_text()
    assert lesson_path.render(text, lesson_path.blocks(), page) == text, (
        f"{page} differs from the lesson path in the tree: run {lesson_path.COMMAND}"
    )


def test_the_intro_makes_no_promise_outside_its_block():
    text = lesson_path.BLOCK.sub("", (ROOT / "book" / "intro.md").read_text())
    assert "afternoon" not in text and " lines" not in text


def _tree(tmp_path, *modules):
    for module in modules:
        path = tmp_path / "kvlab" / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Notebook 05: what {module} teaches. More."""\n\nX = 1\n')
    return tmp_path


def test_new_serving_modules_join_the_path_and_missing_files_are_skipped(tmp_path):
    root = _tree(
        tmp_path,
        "decode.py",
        "serving/__init__.py",
        "serving/_private.py",
        "serving/zeta.py",
        "serving/engine.py",
        "serving/alpha.py",
        "serving/request.py",
        "kernels/store.py",
    )
    assert lesson_path.groups(root) == [
        ("the decode loops", ["decode.py"]),
        (
            "the serving stack",
            ["serving/request.py", "serving/engine.py", "serving/alpha.py", "serving/zeta.py"],
        ),
        ("the paged kernels and their entry points", ["kernels/store.py"]),
    ]
    sentence = lesson_path.lesson_path_block(root)
    assert "the 6 modules" in sentence and "is 18 lines of Python" in sentence
    assert "`serving/zeta.py`" in sentence and "_private" not in sentence
    table = lesson_path.reading_order_block(root)
    assert "| 1 | `kvlab/decode.py` | three greedy decode loops" in table  # ONE_LINERS
    assert "| 4 | `kvlab/serving/alpha.py` | what serving/alpha.py teaches. | 3 |" in table
    assert table.endswith("| | **6 modules** | | **18** |\n")


def test_a_page_that_lost_its_block_is_refused():
    with pytest.raises(SystemExit, match="book/intro.md has the blocks"):
        lesson_path.render("no blocks here\n", lesson_path.blocks(), "book/intro.md")


def test_check_names_the_command_that_rewrites_the_blocks(tmp_path, monkeypatch, capsys):
    for page in set(lesson_path.PAGES.values()):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        stale = lesson_path.BLOCK.sub(r"\1stale\n\4", (ROOT / page).read_text())
        (tmp_path / page).write_text(stale)
    monkeypatch.setattr(lesson_path, "ROOT", tmp_path)
    assert lesson_path.main(["check"]) == 1
    assert "run make lesson-path (python scripts/lesson_path.py)" in capsys.readouterr().out
