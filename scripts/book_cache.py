"""Keeps the book's cached notebook executions honest about the kvlab they were made with.

jupyter-cache (Jupyter Book's ``execute_notebooks: cache``) keys an execution by the notebook's code
cells alone, so after a change to kvlab (a reading's words, a model, a measurement) it would serve
the old outputs as if nothing had changed. Before `make book` reads the cache, and before
`make test` stores an execution in it, this script compares the digest of kvlab's source and
declared requirements stamped on the cache with kvlab's now: a cache stamped otherwise is emptied
(every notebook then runs again), and the cache is stamped with the digest of now.

    python scripts/book_cache.py [CACHE]

CACHE defaults to Jupyter Book's ``_build/.jupyter_cache``. Standard library only.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"
STAMP = "kvlab-source.sha256"
DECLARED = ("pyproject.toml", "requirements.txt")


def source_digest(root: Path = ROOT) -> str:
    """A digest of every file under ``kvlab/`` but bytecode, and of the declared requirements, in a
    fixed order: it changes exactly when what a notebook imports could."""
    files = [p for p in (root / "kvlab").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files += [root / name for name in DECLARED if (root / name).exists()]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def prepare(cache: Path, root: Path = ROOT) -> bool:
    """Make ``cache`` hold only executions of kvlab as it is now: empty it if its stamp records
    another kvlab (or none), then stamp it, before anything is stored in it or read from it. True
    when what it held was kept."""
    recorded = cache / STAMP
    digest = source_digest(root)
    kept = not cache.exists() or (recorded.exists() and recorded.read_text().strip() == digest)
    if not kept:
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    recorded.write_text(digest + "\n")
    return kept


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python scripts/book_cache.py [CACHE]", file=sys.stderr)
        return 2
    cache = Path(argv[0]) if argv else CACHE
    if not prepare(cache):
        print(f"kvlab changed since the cached executions in {cache}: every notebook runs again")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
