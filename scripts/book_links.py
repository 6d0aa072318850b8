"""The links of the notebooks and readings, made to work in a downloaded notebook too.

The book's published address is ``html.baseurl`` in ``_config.yml`` (empty until a person decides
it). Once it is set, this rewrites every relative link in the notebooks' Markdown cells and in the
readings (``kvlab/show/``) into the absolute address of its page; the book build turns them back
into relative ones (``book/_ext/book_links.py``, which explains the choice). Run it after a merge:

    python scripts/book_links.py           # rewrite (nothing to do while html.baseurl is empty)
    python scripts/book_links.py --check   # list the links that would break (exit 1)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
import book_links  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="list the links that would break; change nothing"
    )
    args = parser.parse_args(argv)
    base = book_links.book_url()
    if not args.check:
        for name in book_links.rewrite(base=base):
            print(f"made the links of {name} absolute")
        if not base:
            print(
                "html.baseurl in _config.yml is empty: the links stay relative. They work in the"
                " built book and in a clone; in a notebook downloaded alone, links to other pages"
                " do not until the address is set."
            )
    bad = book_links.problems(base=base)
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
