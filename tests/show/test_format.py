"""kvlab.show.format, and the readings' helpers: how the book writes a number, without
matplotlib."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.show.format import sci, si, sig
from kvlab.show.readings import ratio_text, within


def test_helpers():
    assert within(1.0, 1.2, 1.25) and not within(1.0, 2.0, 1.25) and not within(0.0, 1.0, 2)
    assert ratio_text(2.1, 1.0) == "2.1 times" and ratio_text(45.0, 1.0) == "45 times"
    assert ratio_text(1.0, 1.0) == "1.0 times" and ratio_text(3.0, 1.0) == "3.0 times"
    assert (
        sci(3.13e8) == r"$3.13 \times 10^{8}$" and sci(655_000) == "655,000" and sci(12.5) == "12.5"
    )


def test_si_prefixes():
    assert (
        si(3.35e12, "B/s") == "3.35 TB/s"
        and si(0.0051, "s") == "5.1 ms"
        and si(2.5e-6, "s") == "2.5 µs"
    )
    assert (
        si(999.96e9, "B/s") == "1 TB/s" and si(5400.0, "s") == "5,400 s" and si(0.0, "B") == "0 B"
    )
    assert sig(3.14159) == "3.14"


def reading_modules() -> list[str]:
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "kvlab" / "show" / "readings").rglob("*.py"))
    return [
        ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__") for f in files
    ]


def imported_inside(module: str) -> set[str]:
    """The kvlab modules ``module`` imports anywhere, in its functions too, but under ``if
    TYPE_CHECKING:``: what calling its functions may import."""
    path = Path(__file__).resolve().parents[2].joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    checking = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvlab"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("kvlab"))
    return names


def test_readings_import_no_torch_and_no_plotting():
    """No reading pulls in torch or matplotlib, on import or when its functions run: every module a
    reading imports, inside its functions too, is imported in one fresh process, and neither library
    is loaded. Their models live in kvlab.theory (and ``compare_timings`` beside ``Timing`` in
    kvlab.lab.timing).
    """
    modules = reading_modules()
    every = sorted(set(modules).union(*(imported_inside(m) for m in modules)))
    assert len(modules) > 10 and "kvlab.theory.decode_step" in every
    code = (
        "import importlib, sys, kvlab.show.format; [importlib.import_module(m) for m in"
        f" {every!r}]; assert 'torch' not in sys.modules, [m for m in sys.modules if"
        " m.startswith('kvlab')]; assert 'matplotlib' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_si_refuses_bad_digits():
    import pytest

    for digits, error in [(0, ValueError), (True, TypeError), (2.0, TypeError)]:
        with pytest.raises(error, match="digits must be an int"):
            si(1.0, "B", digits)


def test_markdown_table_aligns_numbers_right_and_escapes_pipes():
    from kvlab.show.format import markdown_table

    text = markdown_table(["layout", "GB/s"], [["a|b", 1.23456], ["NHD", 12]])
    assert text.splitlines() == [
        "| layout | GB/s |",
        "|:---|---:|",
        "| a\\|b | 1.23 |",
        "| NHD | 12 |",
    ]
    assert markdown_table(["x", "y"], [], align="rl").splitlines()[1] == "|---:|:---|"


@pytest.mark.parametrize(
    "header, rows, align, error, words",
    [
        ("ab", [], None, TypeError, "header must be a list"),
        ([], [], None, ValueError, "header must name at least one column"),
        (["a"], [1], None, TypeError, "rows[0] must be a list"),
        (["a"], [[1, 2]], None, ValueError, "rows[0] must have one cell per column"),
        (["a", "b"], [], "l", ValueError, "align must be a str of one letter per column"),
        (["a", "b"], [], "lx", ValueError, "align[1] must be one of"),
    ],
)
def test_markdown_table_refuses_a_table_it_cannot_draw(header, rows, align, error, words):
    from kvlab.show.format import markdown_table

    with pytest.raises(error, match=re.escape(words)):
        markdown_table(header, rows, align)
