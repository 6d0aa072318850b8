"""The book's two addresses, each one setting. Its links work in the built book and in a downloaded
notebook (book/_ext/book_links.py, scripts/book_links.py): none would break now, and with a book
address (``html.baseurl``) set the rewrite makes them absolute and the build makes them relative
again. The repository's address (``repository.url``) gives gpu.md's clone command and the Colab
button, or the page says where it goes."""

import json
import posixpath
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import book_links  # noqa: E402

sys.path.remove(str(ROOT / "book" / "_ext"))
BASE = "https://books.example.invalid/kvlab"  # a stand-in: the real address is a person's decision


def test_no_link_in_the_notebooks_or_readings_would_break():
    assert book_links.problems() == [], "fix these links (python scripts/book_links.py --check)"


def test_the_address_is_one_setting_and_not_invented():
    config = (ROOT / "_config.yml").read_text()
    assert "baseurl:" in config and "book_links: book/_ext" in config
    assert book_links.book_url() == "" or book_links.book_url().startswith("https://")


def _copy_of_the_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    shutil.copytree(ROOT / "kvlab" / "show", root / "kvlab" / "show")
    shutil.copytree(
        ROOT / "book", root / "book", ignore=shutil.ignore_patterns("data", "_static", "_ext")
    )
    shutil.copy(ROOT / "_config.yml", root)
    return root


def _targets(root: Path) -> set[str]:
    return {
        m["target"]
        for path, _, texts in book_links.sources(root)
        for text in texts
        for m in book_links.pattern(path).finditer(text)
    }


def test_with_an_address_every_link_becomes_absolute_and_the_build_makes_it_relative_again(
    tmp_path,
):
    root = _copy_of_the_tree(tmp_path)
    before = _targets(root)
    assert (
        book_links.rewrite(root, base="") == [] and _targets(root) == before
    )  # no address: nothing changes
    assert book_links.problems(
        root, base=BASE
    )  # relative links would break in a downloaded notebook
    changed = book_links.rewrite(root, base=BASE)
    assert "kvlab/show/readings/decode_loop.py" in changed and "notebooks/03_gemv.ipynb" in changed
    assert book_links.problems(root, base=BASE) == []
    after = _targets(root)
    assert not any(book_links.is_relative(t) for t in after)
    assert (
        f"{BASE}/book/glossary.html#sdpa" in after
        and f"{BASE}/notebooks/10_memory_wall.html" in after
    )
    assert book_links.rewrite(root, base=BASE) == []  # a second run changes nothing
    json.loads((root / "notebooks" / "03_gemv.ipynb").read_text())  # still a notebook
    # In the built book each one is relative again and lands on a page that exists.
    pages = {
        str(p.relative_to(root).with_suffix(""))
        for p in root.rglob("*")
        if p.suffix in book_links.PAGES
    }
    for target in sorted(t for t in after if t.startswith(BASE)):
        body, unknown = book_links.relative_hrefs(
            f'<a href="{target}">x</a>', "notebooks/01_decode_loop", BASE, pages
        )
        assert unknown == [], target
        href = body.split('"')[1].partition("#")[0]
        assert (
            posixpath.normpath(posixpath.join("notebooks", href)).removesuffix(".html") in pages
        ), (target, body)


def _notebook(root: Path, markdown: str) -> None:
    (root / "notebooks").mkdir(parents=True)
    nb = {
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": markdown}],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "notebooks" / "01_x.ipynb").write_text(json.dumps(nb))
    (root / "book").mkdir()
    (root / "book" / "glossary.md").write_text(
        "# Glossary\n\n## SDPA\n\n(kv-cache)=\n## The KV cache\n"
    )
    (root / "_config.yml").write_text("html:\n  baseurl: ''\n")


def test_a_link_that_would_break_is_named(tmp_path):
    _notebook(
        tmp_path,
        "[a](../book/glossary.md#sdpa) [b](../book/glossary.md#kv-cache) [c](02_gone.ipynb) "
        "[d](../book/glossary.md#nothing) [e](https://example.org/x) "
        f"[f]({BASE}/notebooks/02_gone.html)",
    )
    found = book_links.problems(tmp_path, base="")
    assert {p.split(": ", 1)[1] for p in found} == {
        "02_gone.ipynb names notebooks/02_gone.ipynb, which does not exist",
        "../book/glossary.md#nothing names an anchor book/glossary.md does not have",
    }
    with_base = " ".join(book_links.problems(tmp_path, base=BASE))
    assert f"{BASE}/notebooks/02_gone.html names no page" in with_base
    assert (
        "../book/glossary.md#sdpa is relative, so it breaks in a downloaded notebook" in with_base
    )


def test_a_reading_module_counts_only_links_to_pages(tmp_path):
    module = tmp_path / "kvlab" / "show" / "readings" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text('LINK = "[The memory wall](10_memory_wall.ipynb)"\nvalue = table[key](arg)\n')
    _notebook(tmp_path, "no links")
    (tmp_path / "notebooks" / "10_memory_wall.ipynb").write_text(json.dumps({"cells": []}))
    assert book_links.rewrite(tmp_path, base=BASE) == ["kvlab/show/readings/x.py"]
    assert (
        module.read_text() == f'LINK = "[The memory wall]({BASE}/notebooks/10_memory_wall.html)"\n'
        "value = table[key](arg)\n"
    )


def test_the_build_turns_absolute_links_relative_and_warns_on_a_missing_page(tmp_path):
    pytest.importorskip("myst_parser")
    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    (src / "book").mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        f"extensions = ['myst_parser', 'book_links']\nhtml_baseurl = {BASE + '/'!r}\n"
        "myst_heading_anchors = 2\n"
    )
    (src / "index.md").write_text("# Home\n\n```{toctree}\nnotebooks/a\nbook/glossary\n```\n")
    (src / "notebooks" / "a.md").write_text(
        f"# A\n\n[SDPA]({BASE}/book/glossary.html#sdpa), "
        f"[gone]({BASE}/notebooks/gone.html) and <{BASE}/>\n"
    )
    (src / "book" / "glossary.md").write_text(
        "# Glossary\n\n## SDPA\n\nScaled dot-product attention.\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "html" / "notebooks" / "a.html").read_text()
    body = page.split("<body")[1]
    assert 'href="../book/glossary.html#sdpa"' in body and f'href="{BASE}/book/' not in body
    assert 'href="../index.html"' in body  # the book's address itself: its home page
    assert f'href="{BASE}/notebooks/gone.html"' in body  # left as written, and named below
    assert f"links {BASE}/notebooks/gone.html, which is no page of this book" in out.stderr


def test_running_on_a_gpu_says_what_a_downloaded_notebooks_links_do():
    assert book_links.LINKS_MARK in (ROOT / "book" / "gpu.md").read_text()
    assert "no published address yet (`html.baseurl`" in book_links.downloaded_links("")
    assert f"lead to this book at <{BASE}/>" in book_links.downloaded_links(BASE)


def test_the_repository_setting_gives_the_clone_command_or_says_where_the_address_goes():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import kvlab_install
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    assert kvlab_install.CLONE_MARK in (ROOT / "book" / "gpu.md").read_text()
    assert (
        "git clone https://git.example.invalid/kvlab kvlab-book"
        in kvlab_install.clone_instructions("https://git.example.invalid/kvlab")
    )
    empty = kvlab_install.clone_instructions("")
    assert (
        "git clone" not in empty
        and "`repository.url` in `_config.yml`" in empty
        and "wheel route" in empty
    )

    class Config:
        html_theme_options = {}

    kvlab_install._launch_buttons_when_published(None, Config)
    assert "launch_buttons" not in Config.html_theme_options  # no address: no Colab button
    Config.html_theme_options = {"repository_url": "https://git.example.invalid/kvlab"}
    kvlab_install._launch_buttons_when_published(None, Config)
    assert (
        Config.html_theme_options["launch_buttons"]["colab_url"]
        == "https://colab.research.google.com"
    )
