"""kvlab's layers, and the stack diagram and notebook table of the page "How kvlab is built",
drawn from the package's own imports.

``LAYERS`` below is the one statement of kvlab's layering: ``tests/test_architecture.py`` enforces
it and this script draws it. Everything else is read from the source with ``ast``, nothing is
imported: the modules are the ``.py`` files under ``kvlab/``, the edges are their import statements
(at module level or inside a function), and each notebook's modules are the kvlab names its code
cells import or reach through attributes (a name re-exported by a package is followed to the module
that defines it).

Run it after changing an import, a module or a notebook's imports::

    python scripts/stack_diagram.py      # or: make diagram

It rewrites ``book/architecture/stack.svg`` (the diagram), ``stack.json`` (the layers, modules,
import edges and notebook table it was drawn from, which the test compares with the package) and
``notebooks.md`` (the table, included by ``book/architecture.md``).
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kvlab"
OUT = ROOT / "book" / "architecture"
COMMAND = "python scripts/stack_diagram.py"


@dataclass(frozen=True)
class Layer:
    name: str
    purpose: str
    role: str  # "lesson" (a notebook shows it), "lab" (a notebook measures with it), or "support"
    packages: tuple[str, ...] = ()  # these packages and everything inside them
    modules: tuple[str, ...] = ()  # these modules exactly


# Lowest first. A module may import modules of its own layer and of the layers below it, never of a
# layer above. Each layer needs only what is under it: a formula needs no tensor, a kernel no cache,
# a cache no model loop, a loop no measurement, a measurement no figure.
LAYERS = (
    Layer(
        "base",
        "argument checks, the default device and dtype, and the one place that speaks to"
        " transformers' cache API",
        "support",
        modules=("kvlab._checks", "kvlab.devices", "kvlab.versions"),
    ),
    Layer(
        "theory",
        "formulas in pure Python: roofline, specifications, shapes, work",
        "lesson",
        packages=("kvlab.theory",),
    ),
    Layer(
        "kernels",
        "Triton kernels, each beside its PyTorch reference",
        "lesson",
        packages=("kvlab.kernels",),
    ),
    Layer(
        "cache",
        "what is cached and where: blocks, paged pools, layouts, long context, SSM state",
        "lesson",
        packages=("kvlab.cache",),
    ),
    Layer(
        "decode & serving",
        "the loops over a model: decode, speculation, scheduler, attention, runner, engine, across"
        " devices",
        "lesson",
        packages=("kvlab.serving", "kvlab.parallel"),
        modules=("kvlab.decode", "kvlab.speculative"),
    ),
    Layer(
        "lab",
        "the machine, models, timing and each notebook's measurements",
        "lab",
        packages=("kvlab.lab",),
    ),
    Layer("show", "presentation: readings, widgets, plots", "support", packages=("kvlab.show",)),
    Layer(
        "entry",
        "the top-level names and the command line",
        "support",
        modules=("kvlab", "kvlab.__main__", "kvlab.parallel.__main__"),
    ),
)


def layer_of(module: str) -> Layer | None:
    """The layer ``module`` belongs to, or None when ``LAYERS`` does not place it (a module named
    in a layer's ``modules`` is placed there even inside another layer's package)."""
    for layer in LAYERS:
        if module in layer.modules:
            return layer
    for layer in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in layer.packages):
            return layer
    return None


def layer_index(module: str) -> int | None:
    layer = layer_of(module)
    return None if layer is None else LAYERS.index(layer)


# -- the package as ast sees it -------------------------------------------------------------------


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def is_package(name: str, mods: dict[str, Path]) -> bool:
    return name in mods and mods[name].name == "__init__.py"


@dataclass(frozen=True)
class Import:
    """One imported module (and, for ``from m import n``, the name taken from it)."""

    importer: str
    line: int
    module: str  # absolute dotted name of the module whose code runs (kvlab or third-party)
    name: str | None  # ``n`` of ``from m import n`` when n is not itself a module; else None
    bound: str | None  # the local name the statement binds (None for a star import)
    deferred: bool  # inside a function body: runs when the function is called, not at import
    type_only: bool  # under ``if TYPE_CHECKING:``: never runs
    dynamic: bool = False  # ``importlib.import_module("...")`` with a constant name


def _package_of(module: str, mods: dict[str, Path]) -> str:
    return module if is_package(module, mods) else module.rpartition(".")[0]


def _absolute(importer: str, level: int, name: str | None, mods: dict[str, Path]) -> str:
    base = _package_of(importer, mods)
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return ".".join(p for p in (base, name) if p)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, importer: str, mods: dict[str, Path]):
        self.importer, self.mods = importer, mods
        self.found: list[Import] = []
        self.depth = 0  # function nesting
        self.type_only = 0

    def _add(self, node, module, name, bound, dynamic=False):
        self.found.append(
            Import(
                self.importer,
                node.lineno,
                module,
                name,
                bound,
                self.depth > 0,
                self.type_only > 0,
                dynamic,
            )
        )

    def visit_FunctionDef(self, node):
        for d in node.decorator_list + node.args.defaults + node.args.kw_defaults:
            if d is not None:
                self.visit(d)
        self.depth += 1
        for stmt in node.body:
            self.visit(stmt)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def visit_If(self, node):
        if _is_type_checking(node.test):
            self.type_only += 1
            for stmt in node.body:
                self.visit(stmt)
            self.type_only -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        for alias in node.names:
            self._add(node, alias.name, None, alias.asname or alias.name.partition(".")[0])

    def visit_ImportFrom(self, node):
        base = (
            _absolute(self.importer, node.level, node.module, self.mods)
            if node.level
            else node.module
        )
        for alias in node.names:
            if alias.name == "*":
                self._add(node, base, None, None)
            elif f"{base}.{alias.name}" in self.mods:
                self._add(node, f"{base}.{alias.name}", None, alias.asname or alias.name)
            else:
                self._add(node, base, alias.name, alias.asname or alias.name)

    def visit_Call(self, node):
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "import_module"
            and isinstance(f.value, ast.Name)
            and f.value.id == "importlib"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            self._add(node, node.args[0].value, None, None, dynamic=True)
        self.generic_visit(node)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imports(mods: dict[str, Path] | None = None) -> list[Import]:
    """Every import statement of every module of the package, in file order."""
    mods = modules() if mods is None else mods
    found = []
    for name, path in mods.items():
        visitor = _ImportVisitor(name, mods)
        visitor.visit(parse(path))
        found += visitor.found
    return found


def is_internal(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def internal_target(imp: Import, mods: dict[str, Path]) -> str | None:
    """The kvlab module an import runs, or None for a third-party one (or a missing kvlab
    module)."""
    if not is_internal(imp.module):
        return None
    name = imp.module
    while name and name not in mods:  # ``import kvlab.x.y`` of a name that is not a module
        name = name.rpartition(".")[0]
    return name or None


def edges(
    mods: dict[str, Path] | None = None, imps: list[Import] | None = None
) -> dict[tuple[str, str], str]:
    """(importer, imported) -> "module" when some import of it runs at import time, else "deferred".
    Type-only imports are left out; a module importing its own names is no edge."""
    mods = modules() if mods is None else mods
    imps = imports(mods) if imps is None else imps
    found: dict[tuple[str, str], str] = {}
    for imp in imps:
        target = internal_target(imp, mods)
        if target is None or imp.type_only or target == imp.importer:
            continue
        kind = "deferred" if imp.deferred else "module"
        key = (imp.importer, target)
        found[key] = "module" if "module" in (kind, found.get(key)) else "deferred"
    return found


# -- where a name comes from ----------------------------------------------------------------------


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, also under
    if/try)."""
    names: set[str] = set()

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(
                node.target, ast.Name
            ):
                names.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                walk(node.body)
                walk(getattr(node, "orelse", []))
                walk(getattr(node, "finalbody", []))
                for h in getattr(node, "handlers", []):
                    walk(h.body)

    walk(tree.body)
    return names


class Package:
    """The package's modules, imports and top-level names, parsed once."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.mods = modules(root)
        self.trees = {name: parse(path) for name, path in self.mods.items()}
        self.imports = imports(self.mods)
        self.defined = {name: top_level_names(tree) for name, tree in self.trees.items()}
        # What runs first when modules load: every import as written (a package's own __init__ too).
        self.load_edges = edges(self.mods, self.imports)
        self.edges = self._resolved_edges()

    def target(self, imp: Import) -> str | None:
        """The kvlab module an import depends on. ``from package import name``, where the package
        re-exports ``name`` from a module of its own layer (``kvlab.kernels`` and
        ``kernels/paged_attention.py``), depends on that module. A name the top-level ``kvlab``
        gathers from lower layers stays an import of ``kvlab`` itself, which a lower layer may not
        make."""
        target = internal_target(imp, self.mods)
        if target is None or imp.name is None or not is_package(target, self.mods):
            return target
        source = self.origin(target, imp.name)
        return source if layer_of(source) is layer_of(target) else target

    def _resolved_edges(self) -> dict[tuple[str, str], str]:
        found: dict[tuple[str, str], str] = {}
        for imp in self.imports:
            target = self.target(imp)
            if target is None or imp.type_only or target == imp.importer:
                continue
            key = (imp.importer, target)
            kind = "deferred" if imp.deferred else "module"
            found[key] = "module" if "module" in (kind, found.get(key)) else "deferred"
        return found

    def origin(self, module: str, name: str, seen: frozenset = frozenset()) -> str:
        """The module that defines ``module.name``: followed through re-exports (``from x import
        name`` in a package), then searched for among a package's submodules when the package makes
        it some other way (a lazy ``__getattr__``); ``module`` itself when nothing better is known.
        """
        if f"{module}.{name}" in self.mods:
            return f"{module}.{name}"
        if (module, name) in seen:
            return module
        seen = seen | {(module, name)}
        for imp in self.imports:
            if imp.importer == module and imp.bound == name and not imp.deferred:
                target = internal_target(imp, self.mods)
                if target is None:
                    return module
                return self.origin(target, imp.name, seen) if imp.name else target
        if name in self.defined.get(module, ()) or not is_package(module, self.mods):
            return module
        inside = [m for m in self.mods if m.startswith(module + ".") and name in self.defined[m]]
        return inside[0] if len(inside) == 1 else module


# -- the notebooks --------------------------------------------------------------------------------


def notebook_order(root: Path = ROOT) -> list[Path]:
    """The notebooks in the order of ``_toc.yml``, then any it does not list."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    listed: list[str] = []

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                listed.append(Path(entry["file"]).with_suffix("").as_posix())
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    paths = sorted((root / "notebooks").glob("*.ipynb"))
    rank = {
        p: listed.index(f"notebooks/{p.stem}") if f"notebooks/{p.stem}" in listed else len(listed)
        for p in paths
    }
    return sorted(paths, key=lambda p: (rank[p], p.name))


def _code_cells(notebook: dict) -> list[ast.Module]:
    trees = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        # IPython magics and shell escapes are not Python: keep the block structure, drop the line.
        lines = [
            (
                line[: len(line) - len(line.lstrip())] + "pass"
                if line.lstrip().startswith(("%", "!"))
                else line
            )
            for line in lines
        ]
        try:
            trees.append(ast.parse("\n".join(lines)))
        except SyntaxError:
            continue
    return trees


def notebook_modules(path: Path, pkg: Package) -> set[str]:
    """The kvlab modules whose names a notebook's code cells use."""
    notebook = json.loads(path.read_text())
    bound: dict[str, str] = {}  # local name -> kvlab module
    used: set[str] = set()
    trees = _code_cells(notebook)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if is_internal(alias.name):
                        used.add(alias.name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
                        else:
                            bound[alias.name.partition(".")[0]] = PACKAGE
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module
                and is_internal(node.module)
                and not node.level
            ):
                for alias in node.names:
                    source = pkg.origin(node.module, alias.name)
                    used.add(source)
                    if source == f"{node.module}.{alias.name}":
                        bound[alias.asname or alias.name] = source
    for tree in trees:
        inner = set()  # the ``a.b`` inside ``a.b.c``: only whole chains count
        for node in ast.walk(tree):  # parents come before their children
            if isinstance(node, ast.Attribute):
                inner.add(id(node.value))
            chain = None if id(node) in inner else _attribute_chain(node)
            if chain and chain[0] in bound:
                module = bound[chain[0]]
                for part in chain[1:]:
                    if f"{module}.{part}" in pkg.mods:
                        module = f"{module}.{part}"
                    else:
                        module = pkg.origin(module, part)
                        break
                used.add(module)
    return {m for m in used if m in pkg.mods}


def _attribute_chain(node) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"] for the outermost attribute of a chain of names."""
    if not isinstance(node, ast.Attribute):
        return None
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def notebook_title(path: Path) -> str:
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


# -- what the page shows --------------------------------------------------------------------------


def short(module: str) -> str:
    """``kvlab.cache.paged`` -> ``cache.paged``; the package itself stays ``kvlab``."""
    return module if module == PACKAGE else module[len(PACKAGE) + 1 :]


def data(root: Path = ROOT) -> dict:
    """Everything the diagram and the table are drawn from, as plain JSON-able values."""
    pkg = Package(root)
    layers = [
        {
            "name": layer.name,
            "purpose": layer.purpose,
            "role": layer.role,
            "modules": [m for m in pkg.mods if layer_of(m) is layer],
        }
        for layer in LAYERS
    ]
    unplaced = [m for m in pkg.mods if layer_of(m) is None]
    if unplaced:
        layers.append(
            {
                "name": "unplaced",
                "purpose": "modules LAYERS does not place",
                "role": "support",
                "modules": unplaced,
            }
        )
    table = []
    for path in notebook_order(root):
        used = notebook_modules(path, pkg)
        roles = {m: layer_of(m).role if layer_of(m) else None for m in used}
        table.append(
            {
                "notebook": path.stem,
                "title": notebook_title(path),
                "shows": sorted(m for m in used if roles[m] == "lesson"),
                "measures": sorted(m for m in used if roles[m] == "lab"),
            }
        )
    return {
        "generated_by": COMMAND,
        "layers": layers,
        "edges": [[a, b, kind] for (a, b), kind in sorted(pkg.edges.items())],
        "notebooks": table,
    }


def notebooks_markdown(d: dict) -> str:
    """The table of the page: each notebook, the modules it shows and the modules it measures
    with."""

    def cell(mods):
        return ", ".join(f"`{short(m)}`" for m in mods) or "none"

    lines = [
        f"<!-- generated by `{COMMAND}` from the notebooks' imports: do not edit -->",
        "",
        "| Notebook | Shows (lesson) | Measures with (lab) |",
        "|---|---|---|",
    ]
    for row in d["notebooks"]:
        lines.append(
            f"| {{doc}}`{row['title']} </notebooks/{row['notebook']}>` "
            f"| {cell(row['shows'])} | {cell(row['measures'])} |"
        )
    return "\n".join(lines) + "\n"


# -- the diagram ----------------------------------------------------------------------------------


def boxes(d: dict) -> tuple[list[list[str]], dict[str, str], dict[str, int]]:
    """The diagram's boxes, layer by layer: a module, or a whole subpackage below a layer's package
    (``show.readings``) as one box; module -> its box; box -> how many modules it holds. A
    package's ``__init__`` gets a box only when something imports it or it imports something."""
    touched = {m for a, b, _ in d["edges"] for m in (a, b)}
    rows, box_of, count = [], {}, defaultdict(int)
    for layer_data in d["layers"]:
        layer = next((x for x in LAYERS if x.name == layer_data["name"]), None)
        row = []
        for m in layer_data["modules"]:
            depth = next(
                (
                    len(p.split(".")) + 1
                    for p in (layer.packages if layer else ())
                    if m == p or m.startswith(p + ".")
                ),
                len(m.split(".")),
            )
            box = ".".join(m.split(".")[:depth])
            is_init = m == box and any(other.startswith(m + ".") for other in layer_data["modules"])
            if box == m and is_init and m not in touched:
                continue
            box_of[m] = box
            count[box] += 1
            if box not in row:
                row.append(box)
        rows.append(row)
    return rows, box_of, dict(count)


def _label(box: str, layer: Layer | None, count: int, d: dict) -> str:
    name = short(box)
    if layer is not None:
        for p in layer.packages:
            if box == p:
                return f"{short(p)}/__init__"
            if box.startswith(p + "."):
                name = box[len(p) + 1 :]
    is_package = any(m.startswith(box + ".") for lay in d["layers"] for m in lay["modules"])
    if is_package and layer is not None and box in layer.modules:
        return f"{name}/__init__"
    if is_package and layer is not None and box not in layer.packages:
        return f"{name}/ ({count})"
    return name


def _order(rows: list[list[str]], links: set[tuple[str, str]]) -> list[list[str]]:
    """Order each row's boxes by the mean position of the boxes they are linked to (a few sweeps of
    the barycentre heuristic), which keeps most arrows short and uncrossed."""
    rows = [sorted(r) for r in rows]
    neighbours = defaultdict(set)
    for a, b in links:
        neighbours[a].add(b)
        neighbours[b].add(a)
    for _ in range(6):
        pos = {box: (i + 0.5) / len(r) for r in rows for i, box in enumerate(r)}
        for k, r in enumerate(rows):
            own = set(r)

            def centre(box):
                xs = [pos[n] for n in neighbours[box] if n in pos and n not in own]
                return sum(xs) / len(xs) if xs else pos[box]

            rows[k] = sorted(r, key=lambda box: (round(centre(box), 6), box))
    return rows


# Sizes in inches: the figure is drawn at about the width of the book's text column, so that its
# labels stay legible without zooming.
PER_LINE, BOX_W, BOX_H, GAP_X, LINE_H, BAND_GAP, LABEL_W = 5, 1.12, 0.3, 0.1, 0.44, 0.3, 1.05
COLOURS = [
    "#5b6b7f",
    "#e08214",
    "#2ca02c",
    "#17a2b8",
    "#7b4fb0",
    "#8c564b",
    "#d45fa8",
    "#333333",
    "#999999",
]
UPWARD = "#d62728"


def _links(d: dict, box_of: dict[str, str]) -> dict[tuple[str, str], str]:
    """Import edges between boxes. Every layer may import base, and no import of base can break
    the rule, so those arrows are left out."""
    links: dict[tuple[str, str], str] = {}
    for a, b, kind in d["edges"]:
        if a in box_of and b in box_of and box_of[a] != box_of[b] and layer_of(b) is not LAYERS[0]:
            key = (box_of[a], box_of[b])
            links[key] = "module" if "module" in (kind, links.get(key)) else "deferred"
    return links


def _place(ordered: list[list[str]]):
    """Box centres and each layer's band (bottom, top); a row longer than PER_LINE wraps."""
    y, where, bands = 0.0, {}, []
    for row in ordered:
        lines = [row[i : i + PER_LINE] for i in range(0, len(row), PER_LINE)] or [[]]
        bottom = y
        for line in reversed(lines):
            x0 = LABEL_W + (PER_LINE - len(line)) * (BOX_W + GAP_X) / 2
            for i, box in enumerate(line):
                where[box] = (x0 + i * (BOX_W + GAP_X) + BOX_W / 2, y + LINE_H / 2)
            y += LINE_H
        bands.append((bottom, y))
        y += BAND_GAP
    return where, bands, y - BAND_GAP


def _arrow(ax, start_box, end_box, kind, up, colour):
    from matplotlib.patches import FancyArrowPatch

    (xa, ya), (xb, yb) = start_box, end_box
    same_line = abs(ya - yb) < 1e-6
    # Spread the ends along the boxes' edges, towards the other end, so arrows do not pile up.
    lean = max(-1.0, min(1.0, (xb - xa) / (3 * BOX_W))) * BOX_W * 0.42
    if same_line:
        start, end, rad = (xa + lean, ya + BOX_H / 2), (xb - lean, yb + BOX_H / 2), -0.3
    elif ya > yb:
        start, end, rad = (xa + lean, ya - BOX_H / 2), (xb - lean, yb + BOX_H / 2), 0.06
    else:
        start, end, rad = (xa + lean, ya + BOX_H / 2), (xb - lean, yb - BOX_H / 2), 0.06
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            connectionstyle=f"arc3,rad={rad}",
            arrowstyle="-|>",
            mutation_scale=6,
            lw=1.0 if up else 0.5,
            color=UPWARD if up else colour,
            alpha=0.95 if up else 0.45,
            linestyle="--" if kind == "deferred" else "-",
            zorder=3 if up else 1,
            shrinkA=0,
            shrinkB=0,
        )
    )


def _legend(ax, y):
    items = [
        [("-", "#777777", "import at module level"), ("--", "#777777", "import inside a function")],
        [
            ("-", UPWARD, "import of a higher layer (breaks the rule)"),
            (None, None, "imports of base: not drawn"),
        ],
    ]
    for row, entries in enumerate(items):
        x = 0.1
        for style, colour, text in entries:
            yy = y - row * 0.17
            if style:
                ax.plot([x, x + 0.35], [yy, yy], linestyle=style, color=colour, lw=1.1)
                x += 0.43
            ax.text(x, yy, text, fontsize=7, va="center", color="#333333")
            x += 2.9


def draw(d: dict, path: Path) -> None:
    """Layers as rows (lowest at the bottom), modules as boxes, imports as arrows from the importing
    box to the imported one: solid when the import runs at import time, dashed when a function
    runs it, red when it points up a layer (the rule the test enforces)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    rows, box_of, count = boxes(d)
    links = _links(d, box_of)
    ordered = _order(rows, set(links))
    where, bands, height = _place(ordered)
    width = LABEL_W + PER_LINE * (BOX_W + GAP_X) + 0.05
    legend_h = 0.45
    fig = plt.figure(figsize=(width, height + legend_h + 0.2))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(-legend_h, height + 0.2)
    ax.axis("off")
    layers = [next((x for x in LAYERS if x.name == row["name"]), None) for row in d["layers"]]
    for k, (bottom, top) in enumerate(bands):
        ax.add_patch(
            FancyBboxPatch(
                (0.03, bottom - 0.05),
                width - 0.06,
                top - bottom + 0.1,
                ec="none",
                boxstyle="round,pad=0,rounding_size=0.06",
                fc=("#f4f6fa", "#eaeef5")[k % 2],
            )
        )
        ax.text(
            0.1,
            (bottom + top) / 2,
            d["layers"][k]["name"].replace(" & ", " &\n"),
            fontsize=9,
            fontweight="bold",
            va="center",
            ha="left",
            color=COLOURS[k % len(COLOURS)],
            linespacing=1.0,
        )
    layer_number = {box: k for k, row in enumerate(ordered) for box in row}
    for (a, b), kind in sorted(links.items()):
        up = layer_number[b] > layer_number[a] and layers[layer_number[b]] is not None
        _arrow(ax, where[a], where[b], kind, up, COLOURS[layer_number[a] % len(COLOURS)])
    for k, row in enumerate(ordered):
        for box in row:
            x, y = where[box]
            ax.add_patch(
                FancyBboxPatch(
                    (x - BOX_W / 2, y - BOX_H / 2),
                    BOX_W,
                    BOX_H,
                    fc="white",
                    lw=0.9,
                    boxstyle="round,pad=0,rounding_size=0.05",
                    ec=COLOURS[k % len(COLOURS)],
                    zorder=2,
                )
            )
            ax.text(
                x,
                y,
                _label(box, layers[k], count[box], d),
                fontsize=7.5,
                ha="center",
                va="center",
                family="monospace",
                zorder=4,
            )
    _legend(ax, -0.15)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.hashsalt": "kvlab-stack", "svg.fonttype": "none"}):
        fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def _wrap(text: str, width: int) -> str:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join(out + [line])


def write(root: Path = ROOT) -> dict:
    """Regenerate the three files beside the page; returns the data they were drawn from."""
    d = data(root)
    out = root / "book" / "architecture"
    out.mkdir(parents=True, exist_ok=True)
    (out / "stack.json").write_text(json.dumps(d, indent=1) + "\n")
    (out / "notebooks.md").write_text(notebooks_markdown(d))
    draw(d, out / "stack.svg")
    return d


def main(argv: list[str]) -> int:
    d = write()
    n_modules = sum(len(layer["modules"]) for layer in d["layers"])
    print(
        f"{n_modules} modules, {len(d['edges'])} import edges, {len(d['notebooks'])} notebooks: "
        f"wrote {OUT.relative_to(ROOT)}/stack.svg, stack.json, notebooks.md"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
