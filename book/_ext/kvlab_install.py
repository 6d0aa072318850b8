"""The book carries kvlab with it, so a notebook downloaded from a page can install it (see "Running
on a GPU"), and names its repository from one setting, ``repository.url`` in ``_config.yml``.

At the start of an HTML build the kvlab wheel is built from this repository into the folder of the
notebook pages, and every notebook page links to it: a reader who downloads the notebook and the
wheel into one folder has what the notebook's first cell installs. The repository address is read
from the one setting by every consumer: the notebooks' first cells carry it (``REPOSITORY = ...``,
written by ``scripts/setup_cell.py`` and checked by the tests), the Colab button appears on notebook
pages only when it is set (it opens the notebook from the repository), and the page "Running on a
GPU" shows the clone command, or while the setting is empty says where the address goes and what
works without it.
"""

import html
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
        raise RuntimeError(
            f"kvlab is not imported from a checkout ({root}): cannot build its wheel"
        )
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
        shutil.copytree(
            root / "kvlab", Path(scratch) / "kvlab", ignore=shutil.ignore_patterns("__pycache__")
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(out),
                scratch,
            ],
            check=True,
        )
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
    note = (
        '<p class="kvlab-install">To run this page on your own machine or a GPU runtime, download'
        f' the notebook (the download button at the top) and <a href="{name}" download>{name}</a>'
        " into one folder: the notebook's first cell installs kvlab from the wheel.</p>\n"
    )
    body = context["body"]
    at = body.find("</h1>")  # under the page's title
    context["body"] = body[: at + 5] + "\n" + note + body[at + 5 :] if at >= 0 else note + body


GPU_PAGE = "book/gpu"
CLONE_MARK = "<!-- kvlab: clone -->"


def clone_instructions(url: str) -> str:
    """The "Any Linux CUDA machine" steps of the page "Running on a GPU", from
    ``repository.url``."""
    if url:
        return (
            f"```text\ngit clone {url} kvlab-book\ncd kvlab-book\nmake lab     # creates .venv from"
            " requirements.txt, then starts JupyterLab with working widgets\n```"
        )
    return (
        "This edition names no repository yet: its address goes in `repository.url` in"
        " `_config.yml`, the one setting that this page, the Colab button and the notebooks' first"
        " cells read (`python scripts/setup_cell.py` writes it into the notebooks). Until then"
        " there is no clone command to give, and no Colab button; the wheel route above works"
        " without it, and so does a copy of the sources you already have:\n\n```text\ncd kvlab-book"
        "   # the folder holding Makefile, _config.yml and notebooks/\nmake lab        # creates"
        " .venv from requirements.txt, then starts JupyterLab with working widgets\n```"
    )


def _repository(config) -> str:
    return ((config.html_theme_options or {}).get("repository_url") or "").strip()


def _write_clone_instructions(app, docname, source):
    if docname == GPU_PAGE:
        source[0] = source[0].replace(CLONE_MARK, clone_instructions(_repository(app.config)))


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
    app.connect("source-read", _write_clone_instructions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
