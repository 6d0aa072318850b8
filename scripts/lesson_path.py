"""kvlab's lesson path, stated once, and the two places the book speaks of it, written from the tree.

The lesson path is the modules a reader follows from a decode loop to the paged kernel's
``tl.load``, in reading order: ``LESSON_PATH`` below. The book's promise about it (how many modules,
how many lines) is never typed: ``book/intro.md`` holds it in a ``<!-- lesson-path -->`` block, and
``book/architecture.md`` lists the modules in a ``<!-- reading-order -->`` block, each with its line
count and one line on what it teaches (the first sentence of its docstring, after the notebooks it
names, or ``ONE_LINERS``). Run it after changing a module of the path::

    python scripts/lesson_path.py          # or: make lesson-path (make readme runs it too)
    python scripts/lesson_path.py check    # exit 1 where a block differs from the tree

``tests/test_lesson_path.py`` fails while a block differs. Standard library only.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "make lesson-path (python scripts/lesson_path.py)"

# (what the group is, its modules under kvlab/ in reading order). A folder ("serving/") stands for
# its other public modules, sorted by name, so a new file joins the path at the end of its group; a
# module that does not exist is skipped.
LESSON_PATH = (
    ("the decode loops", ("decode.py", "speculative.py")),
    (
        "the block allocator, the block manager and the paged cache",
        ("cache/blocks.py", "cache/block_manager.py", "cache/paged.py"),
    ),
    (
        "the serving stack",
        (
            "serving/request.py",
            "serving/scheduler.py",
            "serving/attention.py",
            "serving/runner.py",
            "serving/engine.py",
            "serving/paged_decode.py",
            "serving/",
        ),
    ),
    (
        # Their PyTorch references (the *_ref functions of kernels/paged_attention_torch.py)
        # are the oracles the kernels are tested against, not a hop on the path.
        "the paged kernels and their entry points",
        (
            "kernels/__init__.py",
            "kernels/paged_attention.py",
            "kernels/paged_prefill.py",
            "kernels/paged_tile.py",
            "kernels/store.py",
        ),
    ),
)

# What a module teaches, where the first sentence of its docstring does not say it in one line.
ONE_LINERS = {
    "decode.py": "three greedy decode loops: naive, cached (a KV cache) and static (preallocated,"
    " compiled).",
    "serving/scheduler.py": "who runs each step and with how many tokens: continuous batching,"
    " chunked prefill, preemption.",
    "serving/attention.py": "the one attention function a stock Hugging Face model calls: store the"
    " step's K and V, then attend.",
    "serving/runner.py": "one forward pass per step over the step's chunks, greedy sampling; CUDA"
    " graphs for decode on a GPU.",
    "serving/engine.py": "the engine: add requests, step (schedule, run, update) all or nothing.",
    "kernels/paged_prefill.py": 'paged prefill ("extend") attention in Triton (chapter 5).',
    "kernels/paged_tile.py": "the two steps both paged kernels repeat per tile of keys: load it"
    " through the block table, fold it into the online softmax.",
}

BLOCK = re.compile(
    r"(<!-- (?P<name>lesson-path|reading-order) -->\n)(?P<body>.*?)(<!-- /(?P=name) -->)", re.S
)
PAGES = {"lesson-path": "book/intro.md", "reading-order": "book/architecture.md"}


def groups(root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """``LESSON_PATH`` as it stands in the tree at ``root``: each group's existing modules, paths
    relative to ``kvlab/``, a folder expanded to its public modules not already listed."""
    package, found = root / "kvlab", []
    for what, entries in LESSON_PATH:
        named = {e for e in entries if not e.endswith("/")}
        modules = []
        for entry in entries:
            if entry.endswith("/"):
                rest = sorted((package / entry).glob("*.py"))
                rest = [f"{entry}{p.name}" for p in rest if not p.name.startswith("_")]
                modules += [m for m in rest if m not in named]
            elif (package / entry).is_file():
                modules.append(entry)
        if modules:
            found.append((what, modules))
    return found


def lines(root: Path, module: str) -> int:
    return len((root / "kvlab" / module).read_text().splitlines())


def one_liner(root: Path, module: str) -> str:
    """What ``module`` teaches: ``ONE_LINERS``, else its docstring's first sentence without the
    notebooks it opens by naming ("Notebooks 05 and 11: ...")."""
    if module in ONE_LINERS:
        return ONE_LINERS[module]
    doc = ast.get_docstring(ast.parse((root / "kvlab" / module).read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    first = re.split(r"(?<!et al\.)(?<=\.)\s", first, maxsplit=1)[0].replace("``", "`")
    head, colon, rest = first.partition(": ")
    return rest if colon and head.lower().startswith("notebook") else first


def _code(module: str) -> str:
    return f"`{module}`"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def lesson_path_block(root: Path = ROOT) -> str:
    """The sentence of ``book/intro.md``: how many modules, how many lines, and which."""
    found = groups(root)
    modules = [m for _, ms in found for m in ms]
    total = sum(lines(root, m) for m in modules)
    parts = [f"{what} ({_join([_code(m) for m in ms])})" for what, ms in found]
    listed = parts[0] if len(parts) == 1 else "; ".join(parts[:-1]) + "; and " + parts[-1]
    text = (
        f"The lesson path through `kvlab`, the {len(modules)} modules a reader follows from a decode"
        f" loop to the kernel's `tl.load`, is {total:,} lines of Python: {listed}."
        " {doc}`architecture` lists them in reading order, each with what it teaches."
    )
    return _wrap(text)


def reading_order_block(root: Path = ROOT) -> str:
    """The table of ``book/architecture.md``: the lesson path in reading order."""
    rows = ["| | Module | What it teaches | Lines |", "|---|---|---|---:|"]
    n = total = 0
    for _, modules in groups(root):
        for module in modules:
            n, count = n + 1, lines(root, module)
            total += count
            teaches = one_liner(root, module).replace("|", "\\|")
            rows.append(f"| {n} | `kvlab/{module}` | {teaches} | {count:,} |")
    rows.append(f"| | **{n} modules** | | **{total:,}** |")
    return "\n".join(rows) + "\n"


def _wrap(text: str) -> str:
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False) + "\n"


def blocks(root: Path = ROOT) -> dict[str, str]:
    return {"lesson-path": lesson_path_block(root), "reading-order": reading_order_block(root)}


def render(text: str, filled: dict[str, str], page: str) -> str:
    """``text`` with each block's body replaced by ``filled``'s; a page without one of its blocks is
    an error (a block deleted by hand would otherwise go unchecked)."""
    names = {m.group("name") for m in BLOCK.finditer(text)}
    wanted = {name for name, p in PAGES.items() if p == page}
    if names != wanted:
        raise SystemExit(f"{page} has the blocks {sorted(names)}, not {sorted(wanted)}")
    return BLOCK.sub(lambda m: m.group(1) + filled[m.group("name")] + m.group(4), text)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["write"], ["check"]):
        print(__doc__.split("\n\n")[0] + "\nusage: lesson_path.py [write | check]")
        return 2
    filled, stale = blocks(), []
    for page in sorted(set(PAGES.values())):
        path = ROOT / page
        text = path.read_text()
        new = render(text, filled, page)
        if new != text:
            stale.append(page)
            if args != ["check"]:
                path.write_text(new)
    if args == ["check"]:
        for page in stale:
            print(f"{page} differs from the tree: run {COMMAND}")
        return 1 if stale else 0
    print("wrote " + ", ".join(stale) if stale else "the lesson path's blocks are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
