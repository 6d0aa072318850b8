"""Links between the book's pages that work in the built book and in a notebook downloaded alone.

A notebook's Markdown cells and the readings kvlab writes into it (``kvlab/show/``) link other
pages: ``[The memory wall](10_memory_wall.ipynb)``, ``[SDPA](../book/glossary.md#sdpa)``. Relative
links work in the built book (Sphinx resolves them and fails the build on a broken one) and in a
clone of the repository, but not in a notebook downloaded alone, where no ``../book/`` is beside it.
Absolute links to the published book work everywhere, once its address is known.

So the address is one setting next to the repository's: ``html.baseurl`` in ``_config.yml``
(Sphinx's ``html_baseurl``), empty until a person decides where the book is published. While it is
empty the sources keep relative links: the book and a clone work, a downloaded notebook's links to
other pages do not, and nothing pretends otherwise. Once it is set, ``python scripts/book_links.py``
rewrites each relative link in the sources into the absolute address of its page
(``10_memory_wall.ipynb`` -> ``BASE/notebooks/10_memory_wall.html``), and at build time this
extension turns every link to ``BASE`` in a page back into a relative one, so the built book stays
self-contained (it works before it is published, and from a local copy), and warns (an error under
``-W``) on a link to a page the book does not have. ``tests/test_book_links.py`` fails on any link
that would break.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\((?P<target>[^()\s]+)\)")  # a Markdown link's target: [text](target)
# In Python source only a link to a page counts (``table[key](arg)`` is code, not a link).
PY_LINK = re.compile(r"\]\((?P<target>[^()\s\"']+?\.(?:ipynb|md|html)(?:#[^()\s\"']*)?)\)")
PAGES = (".ipynb", ".md")  # the suffixes of the book's pages; each is built into NAME.html


def book_url(root: Path = ROOT) -> str:
    """``html.baseurl`` from ``_config.yml``, without a trailing slash ("" while no address is
    set)."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text())
    return ((config.get("html") or {}).get("baseurl") or "").strip().rstrip("/")


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith(("#", "/"))


def page_of(target: str, folder: str) -> tuple[str, str]:
    """``(repository path, "#anchor" or "")`` of a relative link written in ``folder`` (readings are
    rendered in ``notebooks/``)."""
    path, _, anchor = target.partition("#")
    return posixpath.normpath(posixpath.join(folder, path)), f"#{anchor}" if anchor else ""


def absolute(target: str, folder: str, base: str) -> str:
    """The published address of a relative link: its page built into ``.html`` under ``base``."""
    path, anchor = page_of(target, folder)
    stem, suffix = posixpath.splitext(path)
    return f"{base}/{stem}.html{anchor}" if suffix in PAGES else f"{base}/{path}{anchor}"


def relative_hrefs(body: str, pagename: str, base: str, pages) -> tuple[str, list[str]]:
    """``body`` (a built page's HTML) with each ``href`` to ``base`` made relative to ``pagename``,
    and the addresses that name no page in ``pages`` (the book's docnames; those are left as
    written).
    """
    unknown = []
    pattern = re.compile(r'href="' + re.escape(base) + r'/(?P<path>[^"#]*?)(?P<anchor>#[^"]*)?"')

    def local(m):
        path = m["path"]
        if path.endswith(".html") and path.removesuffix(".html") not in pages:
            unknown.append(f"{base}/{path}")
            return m[0]
        # The book's address itself is its home page (index.html, which Jupyter Book writes at the
        # root).
        relative = posixpath.relpath(path or "index.html", posixpath.dirname(pagename) or ".")
        return f'href="{relative}{m["anchor"] or ""}"'

    return (pattern.sub(local, body) if base else body), unknown


def _relative_links(app, pagename, templatename, context, doctree):
    base = (app.config.html_baseurl or "").strip().rstrip("/")
    if not base or "body" not in context:
        return
    context["body"], unknown = relative_hrefs(context["body"], pagename, base, app.env.all_docs)
    if unknown:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "%s links %s, which is no page of this book (html.baseurl is %s)",
            pagename,
            ", ".join(unknown),
            base,
        )


GPU_PAGE = "book/gpu"
LINKS_MARK = "<!-- kvlab: links -->"


def downloaded_links(base: str) -> str:
    """What the page "Running on a GPU" says about a downloaded notebook's links, from
    ``html.baseurl``."""
    if base:
        return (
            "Links in a downloaded notebook, and in the readings it writes, lead to this book at"
            f" <{base}/>."
        )
    return (
        "Links in a downloaded notebook to other pages of this book work only where those pages lie"
        " beside it (a clone of the repository): this edition names no published address yet"
        " (`html.baseurl` in `_config.yml`, which `python scripts/book_links.py` writes into the"
        " links once set). Open the linked pages here in the book."
    )


def _write_downloaded_links(app, docname, source):
    if docname == GPU_PAGE:
        source[0] = source[0].replace(
            LINKS_MARK, downloaded_links((app.config.html_baseurl or "").strip().rstrip("/"))
        )


def setup(app):
    app.connect("source-read", _write_downloaded_links)
    app.connect("html-page-context", _relative_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---- the sources' links (scripts/book_links.py and the test) -----------------------------------


def sources(root: Path = ROOT):
    """``(path, folder its links are relative to, texts)``: every notebook's Markdown cells, and the
    modules that write readings into notebooks (``kvlab/show/``: their links are read from
    ``notebooks/``, where the readings appear)."""
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield (
            path,
            "notebooks",
            ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"],
        )
    for path in sorted((root / "kvlab" / "show").rglob("*.py")):
        yield path, "notebooks", [path.read_text()]


def pattern(path: Path) -> re.Pattern:
    return PY_LINK if path.suffix == ".py" else LINK


def slug(heading: str) -> str:
    """A heading's anchor as MyST writes it (``myst_heading_anchors``)."""
    text = re.sub(r"[`*$]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a page has: its headings' slugs and its explicit ``(label)=`` targets."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    found = {slug(m[1]) for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M)}
    return found | set(re.findall(r"^\(([\w-]+)\)=", text, re.M))


def problems(root: Path = ROOT, base: str | None = None) -> list[str]:
    """Every link in the sources that would break: a relative one to a missing page or anchor
    (broken in the book too), and, when the book's address is set, a relative one left (broken in a
    downloaded notebook) or an absolute one to ``base`` that names no file of the repository."""
    base = book_url(root) if base is None else base
    out = []
    for path, folder, texts in sources(root):
        where = path.relative_to(root)
        for target in {m["target"] for text in texts for m in pattern(path).finditer(text)}:
            if base and target.startswith(base + "/"):
                page = target[len(base) + 1 :].partition("#")[0]
                stem = page.removesuffix(".html")
                if not any((root / f"{stem}{s}").exists() for s in (*PAGES, "")):
                    out.append(f"{where}: {target} names no page of the book")
                continue
            if not is_relative(target):
                continue
            page, anchor = page_of(target, folder)
            if not (root / page).is_file():
                out.append(f"{where}: {target} names {page}, which does not exist")
            elif anchor and anchor[1:] not in anchors(root / page):
                out.append(f"{where}: {target} names an anchor {page} does not have")
            elif base:
                out.append(
                    f"{where}: {target} is relative, so it breaks in a downloaded notebook: "
                    "run python scripts/book_links.py"
                )
    return sorted(out)


def rewrite(root: Path = ROOT, base: str | None = None) -> list[str]:
    """Rewrite the sources' relative links into the book's absolute addresses; returns the files
    changed. Without an address (``html.baseurl`` empty) it changes nothing."""
    base = book_url(root) if base is None else base
    if not base:
        return []
    changed = []

    def fix(folder):
        def one(m):
            target = m["target"]
            return f"]({absolute(target, folder, base)})" if is_relative(target) else m[0]

        return one

    for path, folder, _ in sources(root):
        old = path.read_text()
        if path.suffix == ".ipynb":
            nb, edited = json.loads(old), False
            for cell in nb["cells"]:
                source = "".join(cell["source"])
                if cell["cell_type"] == "markdown" and LINK.sub(fix(folder), source) != source:
                    cell["source"], edited = (
                        LINK.sub(fix(folder), source).splitlines(keepends=True),
                        True,
                    )
            text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n" if edited else old
        else:
            text = PY_LINK.sub(fix(folder), old)
        if text != old:
            path.write_text(text)
            changed.append(str(path.relative_to(root)))
    return changed
