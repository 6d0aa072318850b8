"""The book carries kvlab with it, so a notebook downloaded from a page can install it (see "Running
on a GPU").

At the start of an HTML build the kvlab wheel is built from this repository into the folder of the
notebook pages, and every notebook page links to it: a reader who downloads the notebook and the
wheel into one folder has what the notebook's first cell installs. At the end of the build, when
``repository.url`` is set in ``_config.yml``, the downloadable notebooks carry it in their first
cell (``REPOSITORY = ...``), which installs from it when no wheel is beside the notebook.
"""

import html
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOTEBOOK_DIR = "notebooks"
COLAB = "https://colab.research.google.com"


def _project_root() -> Path:
    import kvlab

    root = Path(kvlab.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise RuntimeError(f"kvlab is not imported from a checkout ({root}): cannot build its wheel")
    return root


def build_wheel(out: Path) -> Path:
    """Build the kvlab wheel into ``out`` from a scratch copy of the package (so that two builds at
    once never share a ``build/`` folder), offline, with the setuptools already installed."""
    root = _project_root()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("kvlab-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(root / name, scratch)
        shutil.copytree(root / "kvlab", Path(scratch) / "kvlab", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(out), scratch], check=True)
    return next(out.glob("kvlab-*.whl"))


def _build_wheel(app):
    if app.builder.format != "html":
        return
    app.kvlab_wheel = build_wheel(Path(app.outdir) / NOTEBOOK_DIR).name


def _link_the_wheel(app, pagename, templatename, context, doctree):
    wheel = getattr(app, "kvlab_wheel", None)
    if not wheel or not pagename.startswith(NOTEBOOK_DIR + "/") or "body" not in context:
        return
    name = html.escape(wheel)
    note = (f'<p class="kvlab-install">To run this page on your own machine or a GPU runtime, download the '
            f'notebook (the download button at the top) and <a href="{name}" download>{name}</a> into one '
            "folder: the notebook's first cell installs kvlab from the wheel.</p>\n")
    body = context["body"]
    at = body.find("</h1>")  # under the page's title
    context["body"] = body[:at + 5] + "\n" + note + body[at + 5:] if at >= 0 else note + body


def _write_repository(app, exception):
    url = (app.config.html_theme_options or {}).get("repository_url", "")
    if exception is not None or app.builder.format != "html" or not url:
        return
    for path in (Path(app.outdir) / "_sources" / NOTEBOOK_DIR).glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(cell["source"]).replace('REPOSITORY = ""', f"REPOSITORY = {json.dumps(url)}", 1)
                cell["source"] = source.splitlines(keepends=True)
                break
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _launch_buttons_when_published(app, config):
    """A Colab button on notebook pages, only when the repository is set (it links into it)."""
    options = config.html_theme_options
    if options.get("repository_url"):
        buttons = options.setdefault("launch_buttons", {})
        buttons["colab_url"] = buttons.get("colab_url") or COLAB  # Jupyter Book's default is ""


def setup(app):
    app.connect("config-inited", _launch_buttons_when_published)
    app.connect("builder-inited", _build_wheel)
    app.connect("html-page-context", _link_the_wheel)
    app.connect("build-finished", _write_repository)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
