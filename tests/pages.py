"""What a reader of a built page meets, read from its HTML: the code cells left in view and the
words of the page (prose, readings and output text; code folded behind a toggle or removed is not
counted). Used by tests/test_notebooks.py on the built book, and runnable on any build:

    python tests/pages.py _build/html      # each page's words and longest visible code cell
"""

from __future__ import annotations

import sys
from pathlib import Path

from bs4 import BeautifulSoup

NOT_READ = ("script", "style", "details", "noscript", "template")  # details: folded by the reader


def _article(html: str):
    soup = BeautifulSoup(html, "html.parser")
    return soup.select_one("article") or soup.body or soup


def visible_code_lines(html: str) -> list[int]:
    """The length in lines of each code cell whose code a reader sees without opening a toggle."""
    out = []
    for cell in _article(html).select("div.cell_input"):
        if cell.find_parent("details") is None:
            pre = cell.find("pre")
            out.append(len(pre.get_text().rstrip("\n").splitlines()) if pre else 0)
    return out


def rendered_words(html: str, count_tables: bool = True) -> int:
    """The page's words as a reader meets them: everything in the article but folded content,
    scripts and the headings' link symbols; with count_tables=False, the words inside <table>
    elements are left out too (for a page whose tables are reference data, not prose)."""
    article = _article(html)
    for tag in article.find_all(NOT_READ if count_tables else (*NOT_READ, "table")):
        tag.decompose()
    for link in article.select("a.headerlink"):
        link.decompose()
    return len(article.get_text(" ").split())


def main(argv=None) -> int:
    html = Path((argv or sys.argv[1:] or ["_build/html"])[0])
    for path in sorted(html.rglob("*.html")):
        if "_static" in path.parts or path.name in ("genindex.html", "search.html"):
            continue
        text = path.read_text(encoding="utf-8")
        code = visible_code_lines(text)
        print(
            f"{rendered_words(text):6d} words ({rendered_words(text, count_tables=False):6d}"
            f" without tables)  longest visible code {max(code, default=0):3d}"
            f" lines  {path.relative_to(html)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
