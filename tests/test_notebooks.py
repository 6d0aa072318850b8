"""Every notebook executes top to bottom in a fresh kernel on this machine, and the book builds from
the executed notebooks with warnings as errors; the built pages are then read in headless Chromium.

The notebooks run once: each executed copy goes into a scratch copy of the book, and the build test
builds that copy with execution switched off. Execution times are reported, never asserted; a
notebook that runs past its time limit fails naming the cell (``tests/nbrun.py``).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # a GPU image may lack the Jupyter stack
pytest.importorskip("nbclient")
yaml = pytest.importorskip("yaml")

import nbrun  # noqa: E402
from browser import ROLES, chromium, console_errors, requested_urls, toc_pages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A scratch copy of the book's sources, and a cache of executed notebooks."""
    dst = tmp_path_factory.mktemp("book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, dst / name)
    for name in ("book", "notebooks"):
        shutil.copytree(ROOT / name, dst / name)
    return {"root": dst, "executed": {}, "runs": {}}


def _execute(book, path: Path):
    """Static execution (KVLAB_STATIC=1), once per notebook; raises CellExecutionError with the cell
    and its traceback on any error, nbrun.NotebookStalled naming the cell past the time limit."""
    if path.name not in book["executed"]:
        run = nbrun.run(path, static=True)  # without conftest's TRITON_INTERPRET (tests/nbrun.py)
        nbformat.write(run.nb, book["root"] / "notebooks" / path.name)
        book["executed"][path.name] = run.nb
        book["runs"][path.name] = run
    return book["executed"][path.name]


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean_and_executes(book, path, record_property):
    committed = nbformat.read(path, as_version=4)
    dirty = [
        i
        for i, c in enumerate(committed.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: commit notebooks without outputs (cells {dirty})"
    nb = _execute(book, path)
    run = book["runs"][path.name]
    record_property("notebook_seconds", run.seconds)  # reported by conftest
    record_property("missed_wakeups", run.missed_by_channel)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors


def _build(book):
    """Build the scratch book from the executed notebooks once; returns the html folder."""
    if "html" in book:
        return book["html"]
    for path in NOTEBOOKS:
        _execute(book, path)
    root = book["root"]
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"  # executed above; build from those outputs
    (root / "_config.yml").write_text(yaml.safe_dump(config))
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run(
        [str(jupyter_book), "build", str(root), "-W", "--keep-going"],
        capture_output=True,
        text=True,
        env={**os.environ, "KVLAB_STATIC": "1"},
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    book["html"] = root / "_build" / "html"
    return book["html"]


@pytest.mark.notebook
def test_book_builds_with_warnings_as_errors(book):
    html = _build(book)
    wheels = list(
        (html / "notebooks").glob("kvlab-*.whl")
    )  # the book carries kvlab (book/_ext/kvlab_install.py)
    assert len(wheels) == 1
    for path in NOTEBOOKS:
        page = (html / "notebooks" / f"{path.stem}.html").read_text()
        assert f'href="{wheels[0].name}" download' in page, (
            f"{path.name}: no link to the kvlab wheel"
        )
        assert "data:image/png;base64," in page, f"{path.name}: no figure on the built page"
        assert "kvlab-explorer" in page, f"{path.name}: no slider on the built page"
        assert page.count("const THEBE_JS_URL") <= 1, f"{path.name}: a script is declared twice"
    # MathJax ships with the book (sphinx-mathjax-offline), so formulas render offline.
    assert "mathjax/tex-chtml.js" in (html / "notebooks" / "01_decode_loop.html").read_text()
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()


# -- the built pages in a real browser -----------------------------------------------------------

# Runs in each page after load: what a reader would see that the book should never show.
# Both scripts call done() exactly once: a MathJax promise that rejects or never settles, or a check
# that throws, is reported as a finding instead of leaving WebDriver waiting for a script timeout.
_SETTLE = r"""
const settle = (promise, ms) => Promise.race([
  promise.then(() => "typeset", (e) => "MathJax failed: " + e),
  new Promise((r) => setTimeout(() => r("MathJax still running after " + ms / 1000 + " s"), ms)),
]);
"""

_PAGE_CHECKS = (
    _SETTLE
    + r"""
const done = arguments[arguments.length - 1];
const roleNames = arguments[0];
// On a loaded machine the script can start before the page has finished loading (document.body
// still null, MathJax not yet run): wait for the load event first, then for MathJax's first typeset.
const loaded = document.readyState === "complete" ? Promise.resolve()
  : new Promise((r) => window.addEventListener("load", r, {once: true}));
const typeset = () => (window.MathJax && MathJax.startup && MathJax.startup.promise) || Promise.resolve();
settle(loaded.then(typeset), 45000).then((mathjax) => { try {
  const text = document.body.innerText;
  const visible = (e) => e.offsetParent !== null;
  done({
    mathjax: mathjax,
    roles: roleNames.filter((r) => text.includes(r)),
    pipeTables: [...document.querySelectorAll("article p")]
      .map((p) => p.textContent).filter((t) => /\|\s*:?-{3,}:?\s*\|/.test(t)).map((t) => t.slice(0, 80)),
    strayValues: [...document.querySelectorAll(".cell_output .output.text_plain")]
      .map((e) => e.textContent.trim()).filter((t) => t.length < 60),
    explorerErrors: [...document.querySelectorAll(".kvlab-error")].filter(visible).map((e) => e.textContent),
    rawMath: [...document.querySelectorAll(".math")].filter((e) => !e.querySelector("mjx-container")
      && e.tagName !== "MJX-CONTAINER").length,
    images: [...document.querySelectorAll(".cell_output img, .kvlab-explorer img, article figure img")]
      .filter(visible).map((i) => {
        const r = i.getBoundingClientRect();
        const column = (i.closest("article") || document.body).getBoundingClientRect();
        return {alt: i.alt, width: Math.round(r.width),
                fits: r.left >= column.left - 1 && r.right <= column.right + 1,
                column: Math.round(column.width)};
      }),
    pageWidth: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
  });
} catch (e) { done({scriptError: String(e)}); } });
"""
)

# Moves every static slider to its last position and back; returns what went wrong.
_SLIDER_CHECKS = (
    _SETTLE
    + r"""
const done = arguments[arguments.length - 1];
try {
const problems = [];
const moves = [];
for (const root of document.querySelectorAll(".kvlab-explorer")) {
  const img = root.querySelector("img"), err = root.querySelector(".kvlab-error");
  const reading = root.querySelector(".kvlab-reading");
  for (const input of root.querySelectorAll("input[type=range]")) {
    const first = input.value;
    input.value = input.max; input.dispatchEvent(new Event("input"));
    moves.push(1);
    if (err.style.display !== "none") problems.push(root.id + ": " + err.textContent);
    else if (!img.src.startsWith("data:image/png")) problems.push(root.id + ": no image after moving a slider");
    if (reading && !reading.textContent.trim()) problems.push(root.id + ": empty reading after moving a slider");
    input.value = first; input.dispatchEvent(new Event("input"));
  }
}
const ready = (window.MathJax && MathJax.typesetPromise && MathJax.startup)
  ? MathJax.startup.promise.then(() => MathJax.typesetPromise()) : Promise.resolve();
settle(ready, 45000).then((mathjax) => {
  if (mathjax !== "typeset") problems.push(mathjax);
  for (const r of document.querySelectorAll(".kvlab-reading")) {
    if (/\\\(|\$/.test(r.innerText)) problems.push("math left untypeset in a reading: " + r.innerText.slice(0, 80));
  }
  done({problems: problems, moves: moves.length});
});
} catch (e) { done({problems: ["slider check failed: " + e], moves: 0}); }
"""
)


def _looks_like_a_path(alt: str) -> bool:
    return (
        not alt.strip()
        or alt.endswith((".png", ".jpg", ".svg"))
        or "_images/" in alt
        or alt.startswith("../")
    )


def _remote(urls):
    return [u for u in urls if not u.startswith(("file:", "data:", "blob:", "about:", "chrome"))]


@pytest.mark.notebook
@pytest.mark.parametrize("width", [1280, 390], ids=["desktop", "phone-390px"])
def test_static_pages_in_chromium(book, width, tmp_path):
    """Every page of the table of contents, loaded from disk in headless Chromium: no raw role text,
    no console error, no remote request, no raw pipe table, no stray value output, no explorer
    error, every slider swaps its figure and reading, and every figure fits its column (at 390 px too)."""
    html = _build(book)
    driver = chromium(width=width, height=900)
    from selenium.webdriver.support.ui import WebDriverWait

    report = {}
    try:
        driver.set_script_timeout(180)
        for page in toc_pages(book["root"]):
            url = (html / f"{page}.html").as_uri()
            driver.get(url)
            WebDriverWait(driver, 120).until(
                lambda d: (
                    d.current_url == url
                    and d.execute_script("return document.readyState") == "complete"
                )
            )
            found = driver.execute_async_script(_PAGE_CHECKS, list(ROLES))
            if width == 1280:
                found["sliders"] = driver.execute_async_script(_SLIDER_CHECKS)
            found["remote"] = _remote(requested_urls(driver))
            found["console"] = console_errors(driver)
            driver.save_screenshot(str(tmp_path / f"{page.replace('/', '_')}_{width}.png"))
            report[page] = found
    finally:
        driver.quit()
    problems = []
    for page, f in report.items():
        if "scriptError" in f:
            problems.append(f"{page}: the page check failed: {f['scriptError']}")
            continue
        for key in ("roles", "pipeTables", "strayValues", "explorerErrors", "remote", "console"):
            if f[key]:
                problems.append(f"{page}: {key}: {f[key]}")
        if f["rawMath"]:
            problems.append(
                f"{page}: {f['rawMath']} math elements not typeset by MathJax ({f['mathjax']})"
            )
        if "sliders" in f and f["sliders"]["problems"]:
            problems.append(f"{page}: sliders: {f['sliders']['problems']}")
        problems += [
            f"{page}: a figure's alt text is a file path: {i['alt']}"
            for i in f["images"]
            if _looks_like_a_path(i["alt"])
        ]
        if width <= 400:
            if f["pageWidth"] > f["viewport"] + 2:
                problems.append(
                    f"{page}: the page scrolls sideways at {width} px ({f['pageWidth']} px wide)"
                )
        problems += [
            f"{page}: a figure {i['width']} px wide does not fit its {i['column']} px column at"
            f" {width} px ({i['alt']})"
            for i in f["images"]
            if not i["fits"]
        ]
    print(f"screenshots: {tmp_path}")
    assert not problems, "\n".join(problems)


# -- what a reader meets on each built page ------------------------------------------------------

LONGEST_VISIBLE_CODE = 25  # lines; book/_ext/cell_visibility.py folds longer cells
MOST_WORDS = 3_500  # a page read in about 15 minutes
# The pages that met MOST_WORDS with a margin when the count was introduced (measured on the built
# book of issue 32's branch): they must keep meeting it. The others are reported (each page's count is
# printed) until their prose is shortened and they join here. Then: 02 3,453 words; 05b 3,593; 03
# 3,852; 04 4,020; 11 4,025; 09 4,119; 07 4,124; 12 4,394; 05 4,515; 06 4,680; 08 4,841; 10 6,645.
WITHIN_WORDS = {
    "book/intro",
    "book/architecture",
    "book/gpu",
    "book/measurements",
    "book/models",
    "book/glossary",
    "book/references",
    "notebooks/01_decode_loop",
}


@pytest.mark.notebook
def test_no_visible_code_cell_is_longer_than_the_limit(book):
    import pages

    html = _build(book)
    long = {}
    for page in toc_pages(book["root"]):
        lines = pages.visible_code_lines((html / f"{page}.html").read_text(encoding="utf-8"))
        if any(n > LONGEST_VISIBLE_CODE for n in lines):
            long[page] = [n for n in lines if n > LONGEST_VISIBLE_CODE]
    assert not long, f"code cells longer than {LONGEST_VISIBLE_CODE} lines in view: {long}"


@pytest.mark.notebook
def test_rendered_words_per_page(book):
    import pages

    html = _build(book)
    words = {
        page: pages.rendered_words((html / f"{page}.html").read_text(encoding="utf-8"))
        for page in toc_pages(book["root"])
    }
    for page, n in words.items():
        print(f"{n:6d} words  {page}")
    over = {p: words[p] for p in WITHIN_WORDS & words.keys() if words[p] > MOST_WORDS}
    assert not over, f"pages past {MOST_WORDS} words: {over}"
