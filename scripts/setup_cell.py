"""Every notebook: the head of its first code cell, written from one place.

The head installs kvlab where it is missing and meets kvlab's version floors; it is the same in
every notebook and carries the book's repository address, ``repository.url`` in ``_config.yml`` (the
one setting; empty until a person decides where the book is published). A notebook opened from the
repository (the Colab button) or downloaded from the book then installs kvlab from there when no
wheel is beside it. Each notebook's own setup (imports, ``print(kvlab.env())``) follows the head.

    python scripts/setup_cell.py           # writes the head into every notebook
    python scripts/setup_cell.py --check   # lists the notebooks whose head differs (exit 1)

``tests/test_install.py`` checks that every notebook starts with this head, and runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
END = "kvlab.versions.meet_floors()"  # the head ends with this call (and its comment)

HEAD = """# Setup: where kvlab is missing (a fresh GPU runtime), install it from KVLAB_SOURCE (a wheel, a
# checkout or a pip URL), else from a kvlab wheel beside this notebook (linked on the book's page),
# else from the book's repository; then meet its version floors. See "Running on a GPU".
REPOSITORY = {repository}  # repository.url in _config.yml, written here by scripts/setup_cell.py
import glob, importlib.util, os, subprocess, sys


class SetupStopped(Exception):  # stops a run-all with its message alone: IPython shows no traceback
    def _render_traceback_(self):
        return [str(self)]


if importlib.util.find_spec("kvlab") is None:
    wheels = sorted(glob.glob("kvlab-*.whl"))
    source = os.environ.get("KVLAB_SOURCE") or (wheels[-1] if wheels else "") or (REPOSITORY and f"git+{{REPOSITORY}}")
    if not source:
        raise SetupStopped("kvlab is not installed: put the kvlab wheel linked on this notebook's page beside the "
                           "notebook, or set KVLAB_SOURCE to a wheel, a checkout or a pip URL, and run this cell again.")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", source], capture_output=True, text=True)
    if pip.returncode:
        raise SetupStopped(f"pip could not install kvlab from {{source}}:\\n{{pip.stderr.strip()[-2000:]}}")
import kvlab.versions

kvlab.versions.meet_floors()  # below them: upgrades what it must, then asks for a restart
"""


def repository_url(root: Path = ROOT) -> str:
    """``repository.url`` from ``_config.yml`` ("" while no address is set)."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text())
    return ((config.get("repository") or {}).get("url") or "").strip()


def head(repository: str | None = None) -> str:
    return HEAD.format(
        repository=json.dumps(repository_url() if repository is None else repository)
    )


def first_code_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


def with_head(source: str, new_head: str) -> str:
    """``source`` (a first cell) with everything up to the end of its ``meet_floors()`` line
    replaced."""
    at = source.find(END)
    if at < 0:
        raise ValueError(f"the first code cell has no {END} line to end its setup head")
    rest = source[source.find("\n", at) + 1 :] if "\n" in source[at:] else ""
    return new_head + rest


def notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb"))


def stale(root: Path = ROOT) -> list[str]:
    """The notebooks whose first cell does not start with ``head()``."""
    expected = head(repository_url(root))
    out = []
    for path in notebooks(root):
        source = "".join(first_code_cell(json.loads(path.read_text()))["source"])
        if not source.startswith(expected):
            out.append(path.name)
    return out


def write(root: Path = ROOT) -> list[str]:
    expected = head(repository_url(root))
    changed = []
    for path in notebooks(root):
        nb = json.loads(path.read_text())
        cell = first_code_cell(nb)
        source = with_head("".join(cell["source"]), expected)
        if source != "".join(cell["source"]):
            cell["source"] = source.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path.name)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="list the notebooks whose head differs; change nothing"
    )
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for name in bad:
            print(f"{name}: first cell differs from scripts/setup_cell.py (run it without --check)")
        return 1 if bad else 0
    for name in write():
        print(f"wrote the setup head of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
