"""kvlab's architecture, checked over the whole package with ``ast`` (no kvlab module is imported,
except by the one subprocess that checks import side effects).

Every failure is a to-do list, one line per finding: ``path:line: rule: detail``. Run
``python tests/test_architecture.py`` for the whole report (``--fast`` skips the subprocess).

The rules, and why they are drawn where they are:

- **private-name**: no module takes another module's ``_name``: not by ``from kvlab.x import _y``,
  not by reading ``x._y`` (or ``getattr(x, "_y")``) where ``x`` is a kvlab module, relative or
  absolute imports alike. Dunder names (``__version__``) are not private.
- **private-module**: a module whose name starts with an underscore is private to the package that
  contains it: ``kvlab/kernels/_validation.py`` may be imported by ``kvlab.kernels`` and its
  modules only. By the same rule ``kvlab/_checks.py``, whose package is ``kvlab`` itself, is the
  vocabulary every module shares. (Its own ``_names`` are private all the same.)
- **import-cycle**: no cycle among kvlab modules, counting imports inside functions too. A deferred
  import still means that each module needs the other, so neither can be read, tested or moved
  first; deferring one is how a cycle hides, not how it ends. Only imports under
  ``if TYPE_CHECKING:`` (which never run) are left out. A package's ``__init__``, run implicitly
  before its submodules, is an edge only where a module imports it by name.
- **layering**: a module imports modules of its own layer or of lower ones, never of a higher one
  (inside functions too: a mechanism that imports the lab to measure itself is measurement code
  in a lesson module). The layers and their order are ``LAYERS`` in ``scripts/stack_diagram.py``,
  the one place that states them; the stack diagram is drawn from it. **unplaced**: every module
  belongs to a layer.
- **theory-pure**: ``kvlab.theory`` imports only the standard library, other theory modules and
  ``kvlab._checks``, and nothing it runs at import time imports more (no torch, no transformers:
  the formulas are evaluated where neither is installed).
- **readings-no-matplotlib**: no module of ``kvlab.show.readings`` imports matplotlib, directly or
  through any kvlab module it imports (a sentence needs no plotting library).
- **import-side-effect**: importing a module changes nothing outside it. Statically: no module-level
  statement (or module-level call of the module's own function) writes ``os.environ``,
  ``sys.path``, warnings filters, torch's global state, matplotlib's settings, random seeds, or
  registers with another library. At run time, in one fresh subprocess: each module is imported
  alone, in dependency order (its kvlab imports and the third-party packages it imports are loaded
  first, and its parent packages are stand-ins until their own turn), and the process state before
  and after is compared: environment, ``sys.path``, warnings filters, import hooks, logging,
  threads, atexit and signal handlers, random states, torch's defaults (dtype, device, threads,
  grad mode, determinism, matmul precision, backend flags), numpy's, matplotlib's rcParams and
  backend, transformers' attention and auto-class registries. ``TRITON_INTERPRET`` is unset there,
  so a module that switches the interpreter on by importing is seen doing it. One effect is allowed,
  by name, in ``ALLOWED_IMPORT_EFFECTS``: ``kvlab.kernels.interpreter``, which ``kvlab.kernels``
  imports before its kernel modules, switches Triton's interpreter on where
  there is no CUDA device, because ``triton.jit`` chooses between compiling and interpreting when
  its kernel modules are imported, so the switch must come first, in the one package that imports
  them.
- **docstring**: every module's docstring names, in its first line, the notebook it serves
  ("Notebook 05, PagedAttention (section 9.5): ...", "Notebooks 05, 06 and 11: ...", a stem such
  as ``05_paged_attention``) or says "every notebook"; a notebook it names must exist.
  **seed-citation**: no line of kvlab says "seed 00X": sources are cited by their shorthand in
  ``book/references.bib`` ("Kwon et al. 2023").
- **stale-figure**: ``book/architecture/`` (the stack diagram, its edge list and the notebook
  table of "How kvlab is built") matches the package and the notebooks as they are now.

Sizes are targets, not rules: modules over ~500 lines and functions over ~60 are reported as one
warning, never failed, and so are reads of another module's private attribute on an object (a
heuristic: ``x._y`` where ``_y`` is defined in some other kvlab module and not in this one).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import stack_diagram as sd  # noqa: E402

MODULE_LINES, FUNCTION_LINES = 500, 60


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    rule: str
    detail: str

    def __str__(self):
        return f"{self.path}:{self.line}: {self.rule}: {self.detail}"


@functools.lru_cache(maxsize=1)
def package() -> sd.Package:
    return sd.Package(ROOT)


def rel(pkg: sd.Package, module: str) -> str:
    return pkg.mods[module].relative_to(pkg.root).as_posix()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_module_owner(module: str) -> str | None:
    """The package that owns the first private component of ``module``'s path, or None."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if is_private(part):
            return ".".join(parts[:i])
    return None


def inside(module: str, package_name: str, pkg: sd.Package) -> bool:
    own = module if sd.is_package(module, pkg.mods) else module.rpartition(".")[0]
    return own == package_name or own.startswith(package_name + ".")


# -- private names and modules
# ----------------------------------------------------------------------


def _module_bindings(pkg: sd.Package, module: str) -> dict[str, str]:
    """Local names bound to kvlab modules anywhere in ``module`` (one namespace for the file)."""
    bound = {}
    for imp in pkg.imports:
        if imp.importer != module or imp.bound is None or not sd.is_internal(imp.module):
            continue
        if imp.name is None:
            if "." in imp.module and imp.bound == imp.module.partition(".")[0]:
                bound[imp.bound] = sd.PACKAGE  # ``import kvlab.x.y`` binds ``kvlab``
            elif imp.module in pkg.mods:
                bound[imp.bound] = imp.module
    return bound


def _chains(tree: ast.AST):
    """(node, [name, attr, ...]) for each outermost attribute chain rooted at a name."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
            if id(node) not in inner:
                chain = sd._attribute_chain(node)
                if chain:
                    yield node, chain


def private_findings(pkg: sd.Package) -> list[Finding]:
    found = []
    for imp in pkg.imports:
        if not sd.is_internal(imp.module):
            continue
        path = rel(pkg, imp.importer)
        owner = private_module_owner(imp.module)
        if owner is not None and not inside(imp.importer, owner, pkg):
            found.append(
                Finding(
                    path,
                    imp.line,
                    "private-module",
                    f"imports {imp.module}, private to {owner} (make it public, or move what is"
                    " shared to a public module)",
                )
            )
        if imp.name is not None and is_private(imp.name):
            found.append(
                Finding(path, imp.line, "private-name", f"imports {imp.name} from {imp.module}")
            )
    for module, tree in pkg.trees.items():
        bound = _module_bindings(pkg, module)
        path = rel(pkg, module)
        for node, chain in _chains(tree):
            if chain[0] not in bound:
                continue
            target = bound[chain[0]]
            for attr in chain[1:]:
                if f"{target}.{attr}" in pkg.mods:
                    target = f"{target}.{attr}"
                    owner = private_module_owner(target)
                    if owner is not None and not inside(module, owner, pkg):
                        found.append(
                            Finding(
                                path,
                                node.lineno,
                                "private-module",
                                f"reads {target}, private to {owner}",
                            )
                        )
                        break
                    continue
                if is_private(attr) and target != module:
                    found.append(
                        Finding(path, node.lineno, "private-name", f"reads {target}.{attr}")
                    )
                break
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in bound
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and is_private(node.args[1].value)
                and bound[node.args[0].id] != module
            ):
                found.append(
                    Finding(
                        path,
                        node.lineno,
                        "private-name",
                        f"reads {bound[node.args[0].id]}.{node.args[1].value} through getattr",
                    )
                )
    return sorted(set(found))


# -- cycles ---------------------------------------------------------------------------------------


def _graph(pkg: sd.Package, loading: bool = False) -> dict[str, set[str]]:
    """Importer -> imported. ``loading`` adds the imports as written (a package's ``__init__``
    runs even where a name it re-exports is followed to its module): what actually gets run."""
    graph = defaultdict(set)
    for a, b in list(pkg.edges) + (list(pkg.load_edges) if loading else []):
        graph[a].add(b)
    return graph


def strongly_connected(graph: dict[str, set[str]], nodes) -> list[list[str]]:
    """Tarjan's components (iterative), each sorted; only those with a cycle."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1 or node in graph.get(node, ()):
                        out.append(sorted(comp))
    return out


def _shortest_path(graph, start, goal, allowed) -> list[str]:
    paths, seen = [[start]], {start}
    while paths:
        nxt = []
        for p in paths:
            for child in sorted(graph.get(p[-1], ())):
                if child == goal:
                    return p + [child]
                if child in allowed and child not in seen:
                    seen.add(child)
                    nxt.append(p + [child])
        paths = nxt
    return []


def cycle_findings(pkg: sd.Package) -> list[Finding]:
    graph = _graph(pkg)
    first_line = {}
    for imp in pkg.imports:
        target = pkg.target(imp)
        if target is not None and not imp.type_only:
            first_line.setdefault((imp.importer, target), imp.line)
    found = []
    for comp in strongly_connected(graph, pkg.mods):
        members = set(comp)
        for a in comp:
            for b in sorted(graph[a] & members):
                back = _shortest_path(graph, b, a, members)
                kind = pkg.edges[(a, b)]
                found.append(
                    Finding(
                        rel(pkg, a),
                        first_line[(a, b)],
                        "import-cycle",
                        f"imports {b}"
                        f" ({'inside a function' if kind == 'deferred' else 'at module level'}),"
                        f" which imports it back: {' -> '.join(back)}",
                    )
                )
    return found


# -- layers ---------------------------------------------------------------------------------------


def _first_import_lines(pkg: sd.Package) -> dict[tuple[str, str], int]:
    lines = {}
    for imp in pkg.imports:
        target = pkg.target(imp)
        if target is not None and not imp.type_only:
            lines.setdefault((imp.importer, target), imp.line)
    return lines


def layer_findings(pkg: sd.Package) -> list[Finding]:
    found = []
    for module in pkg.mods:
        if sd.layer_of(module) is None:
            found.append(
                Finding(
                    rel(pkg, module),
                    1,
                    "unplaced",
                    f"{module} is in no layer: add it to LAYERS in scripts/stack_diagram.py, or"
                    " move it",
                )
            )
    lines = _first_import_lines(pkg)
    for (a, b), kind in sorted(pkg.edges.items()):
        la, lb = sd.layer_index(a), sd.layer_index(b)
        if la is None or lb is None or lb <= la:
            continue
        where = "inside a function" if kind == "deferred" else "at module level"
        found.append(
            Finding(
                rel(pkg, a),
                lines[(a, b)],
                "layering",
                f"{sd.LAYERS[la].name} imports {b} ({sd.LAYERS[lb].name}, a higher layer) {where}",
            )
        )
    return found


STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _module_level_closure(pkg: sd.Package, start: str) -> dict[str, list[str]]:
    """Every kvlab module that importing ``start`` runs, with the chain that gets there."""
    chains, todo = {start: [start]}, [start]
    while todo:
        m = todo.pop()
        for (a, b), kind in list(pkg.edges.items()) + list(pkg.load_edges.items()):
            if a == m and kind == "module" and b not in chains:
                chains[b] = chains[m] + [b]
                todo.append(b)
    return chains


def theory_findings(pkg: sd.Package) -> list[Finding]:
    found = []
    allowed = ("kvlab.theory", "kvlab._checks")
    theory = [m for m in pkg.mods if m == "kvlab.theory" or m.startswith("kvlab.theory.")]
    for imp in pkg.imports:
        if imp.importer not in theory or imp.type_only:
            continue
        top = imp.module.partition(".")[0]
        internal = pkg.target(imp)
        if sd.is_internal(imp.module):
            ok = internal is not None and any(
                internal == p or internal.startswith(p + ".") for p in allowed
            )
        else:
            ok = top in STDLIB
        if not ok:
            found.append(
                Finding(
                    rel(pkg, imp.importer),
                    imp.line,
                    "theory-pure",
                    f"imports {imp.module}: theory imports only the standard library, kvlab.theory"
                    " and kvlab._checks",
                )
            )
    for module in theory:
        for dep, chain in _module_level_closure(pkg, module).items():
            if dep in theory or dep == module:
                continue
            for imp in pkg.imports:
                if (
                    imp.importer == dep
                    and not imp.deferred
                    and not imp.type_only
                    and not sd.is_internal(imp.module)
                    and imp.module.partition(".")[0] not in STDLIB
                ):
                    found.append(
                        Finding(
                            rel(pkg, module),
                            1,
                            "theory-pure",
                            f"importing it imports {imp.module} through {' -> '.join(chain)} "
                            f"({rel(pkg, dep)}:{imp.line})",
                        )
                    )
    return sorted(set(found))


def readings_findings(pkg: sd.Package) -> list[Finding]:
    """No reading reaches matplotlib, through any import (inside functions too: the sentence runs
    it)."""
    graph = _graph(pkg, loading=True)
    readings = [
        m for m in pkg.mods if m == "kvlab.show.readings" or m.startswith("kvlab.show.readings.")
    ]
    plotting = defaultdict(list)
    for imp in pkg.imports:
        if imp.module.partition(".")[0] == "matplotlib" and not imp.type_only:
            plotting[imp.importer].append(imp)
    first = _first_import_lines(pkg)
    for imp in pkg.imports:
        target = sd.internal_target(imp, pkg.mods)
        if target is not None and not imp.type_only:
            first.setdefault((imp.importer, target), imp.line)
    found = []
    for module in readings:
        for imp in plotting.get(module, []):
            found.append(
                Finding(
                    rel(pkg, module), imp.line, "readings-no-matplotlib", f"imports {imp.module}"
                )
            )
        for b in sorted(graph[module]):
            if b in readings:
                continue  # reported where it happens
            chains, todo = {b: [b]}, [b]
            while todo:
                m = todo.pop()
                for c in sorted(graph[m]):
                    if c not in chains:
                        chains[c] = chains[m] + [c]
                        todo.append(c)
            hits = [m for m in chains if plotting.get(m)]
            if hits:
                m = min(hits, key=lambda h: (len(chains[h]), h))
                found.append(
                    Finding(
                        rel(pkg, module),
                        first[(module, b)],
                        "readings-no-matplotlib",
                        f"imports {b}, which reaches matplotlib: {' -> '.join(chains[m])} "
                        f"({rel(pkg, m)}:{plotting[m][0].line} imports {plotting[m][0].module})",
                    )
                )
    return found


# -- import side effects: statically --------------------------------------------------------------

WRITER_CALLS = (
    "os.putenv",
    "os.unsetenv",
    "warnings.filterwarnings",
    "warnings.simplefilter",
    "warnings.resetwarnings",
    "torch.set_default_dtype",
    "torch.set_default_device",
    "torch.set_default_tensor_type",
    "torch.set_num_threads",
    "torch.set_num_interop_threads",
    "torch.manual_seed",
    "torch.random.manual_seed",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.use_deterministic_algorithms",
    "torch.set_float32_matmul_precision",
    "torch.set_grad_enabled",
    "torch.set_printoptions",
    "torch.library.",
    "matplotlib.use",
    "matplotlib.rc",
    "matplotlib.style.use",
    "matplotlib.pyplot.style.use",
    "matplotlib.pyplot.rc",
    "matplotlib.rcParams.update",
    "matplotlib.pyplot.rcParams.update",
    "logging.basicConfig",
    "random.seed",
    "numpy.random.seed",
    "atexit.register",
    "signal.signal",
    "sys.setrecursionlimit",
    "transformers.logging.set_verbosity",
)
WRITER_METHODS = {  # methods that change the object they are called on
    "os.environ": {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"},
    "sys.path": {"insert", "append", "extend", "remove", "pop", "clear"},
    "sys.meta_path": {"insert", "append", "extend", "remove", "pop", "clear"},
}
WRITTEN_OBJECTS = (
    "os.environ",
    "sys.path",
    "sys.meta_path",
    "sys.excepthook",
    "sys.displayhook",
    "torch.backends.",
    "torch._dynamo.config.",
    "torch._inductor.config.",
    "matplotlib.rcParams",
    "matplotlib.pyplot.rcParams",
    "warnings.filters",
)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound by the module's imports -> the dotted thing they stand for."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.partition(".")[0]] = (
                    a.name if a.asname else a.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node, aliases) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Subscript):
        return _dotted(node.value, aliases)
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _writes(statements, aliases, local_writers) -> list[tuple[int, str]]:
    """(line, what) for each global write among ``statements`` (not descending into functions)."""
    found = []

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in getattr(node, "decorator_list", []):
                visit(d)
            return
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                name = (
                    _dotted(t, aliases) if isinstance(t, (ast.Attribute, ast.Subscript)) else None
                )
                if name and any(name == w or name.startswith(w) for w in WRITTEN_OBJECTS):
                    found.append((node.lineno, f"writes {name}"))
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if name:
                obj, _, method = name.rpartition(".")
                if any(name == w or (w.endswith(".") and name.startswith(w)) for w in WRITER_CALLS):
                    found.append((node.lineno, f"calls {name}"))
                elif method in WRITER_METHODS.get(obj, ()):
                    found.append((node.lineno, f"calls {name}"))
                elif (
                    method == "register"
                    and not sd.is_internal(name)
                    and "." in obj
                    and name.split(".")[0] in {a.split(".")[0] for a in aliases.values()}
                ):
                    found.append((node.lineno, f"registers with {obj}"))
            if isinstance(node.func, ast.Name) and node.func.id in local_writers:
                found.append(
                    (node.lineno, f"calls {node.func.id}(), which {local_writers[node.func.id]}")
                )
        for child in ast.iter_child_nodes(node):
            visit(child)

    for s in statements:
        visit(s)
    return found


# (path, what it does at import time) -> why it is allowed.
# Each as the source check and as the fresh-process probe describe it.
_WHY_THE_SWITCH = (
    "without CUDA, TRITON_INTERPRET=1 must be set before the kernel modules are decorated"
)
ALLOWED_IMPORT_EFFECTS = {
    (
        "kvlab/kernels/interpreter.py",
        "calls switch_on_import(), which calls use_interpreter(), which writes os.environ",
    ): _WHY_THE_SWITCH,
    ("kvlab/kernels/interpreter.py", "sets os.environ['TRITON_INTERPRET'] = '1'"): _WHY_THE_SWITCH,
}


def static_side_effect_findings(pkg: sd.Package) -> list[Finding]:
    found = []
    for module, tree in pkg.trees.items():
        aliases = _aliases(tree)
        functions = {
            n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        writers: dict[str, str] = {}
        changed = True
        while (
            changed
        ):  # a module function that writes, or calls one of the module's functions that does
            changed = False
            for name, fn in functions.items():
                if name in writers:
                    continue
                hits = _writes(fn.body, aliases, writers)
                if hits:
                    writers[name] = hits[0][1]
                    changed = True
        for line, what in _writes(tree.body, aliases, writers):
            if (rel(pkg, module), what) in ALLOWED_IMPORT_EFFECTS:
                continue
            found.append(
                Finding(rel(pkg, module), line, "import-side-effect", f"at import time: {what}")
            )
    return found


# -- import side effects: at run time, in one subprocess ------------------------------------------


def import_order(pkg: sd.Package) -> list[str]:
    """Modules in dependency order of their module-level imports (cycles broken by name)."""
    deps = defaultdict(set)
    for (a, b), kind in list(pkg.load_edges.items()) + list(pkg.edges.items()):
        if kind == "module":
            deps[a].add(b)
    order, done = [], set()

    def place(m, stack=()):
        if m in done or m in stack:
            return
        for d in sorted(deps[m]):
            place(d, stack + (m,))
        done.add(m)
        order.append(m)

    for m in sorted(pkg.mods):
        place(m)
    return order


def third_party_preloads(pkg: sd.Package) -> list[list]:
    seen, out = set(), []
    for imp in pkg.imports:
        if (
            sd.is_internal(imp.module)
            or imp.deferred
            or imp.type_only
            or imp.module.partition(".")[0] in STDLIB
        ):
            continue
        key = (imp.module, imp.name)
        if key not in seen:
            seen.add(key)
            out.append([imp.module, imp.name])
    return out


PROBE_TIMEOUT = 600


@functools.lru_cache(maxsize=1)
def probe_results() -> dict:
    return run_probe(package())


def run_probe(pkg: sd.Package) -> dict:
    plan = {
        "root": str(pkg.root),
        "order": import_order(pkg),
        "preload": third_party_preloads(pkg),
        "files": {m: str(p) for m, p in pkg.mods.items()},
        "packages": [m for m in pkg.mods if sd.is_package(m, pkg.mods)],
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(pkg.root), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--probe"],
        input=json.dumps(plan),
        capture_output=True,
        text=True,
        cwd=pkg.root,
        env=env,
        timeout=PROBE_TIMEOUT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"the import probe failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1])


def runtime_side_effect_findings(pkg: sd.Package) -> list[Finding]:
    results = probe_results() if pkg.root == ROOT else run_probe(pkg)
    found = []
    for module, changes in results["changed"].items():
        for change in changes:
            if (rel(pkg, module), change) in ALLOWED_IMPORT_EFFECTS:
                continue
            found.append(
                Finding(rel(pkg, module), 1, "import-side-effect", f"importing it {change}")
            )
    for module, error in results["failed"].items():
        found.append(
            Finding(
                rel(pkg, module),
                1,
                "import-side-effect",
                f"could not be imported alone in a fresh process: {error}",
            )
        )
    return found


def _probe() -> None:
    """The subprocess: import each module alone, in order, comparing the process state around it."""
    import importlib
    import importlib.util
    import types

    plan = json.loads(sys.stdin.read())
    for module, name in plan[
        "preload"
    ]:  # third-party packages: their own side effects are not kvlab's
        try:
            mod = importlib.import_module(module)
            if name and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")
            elif name:
                getattr(mod, name)
        except Exception:  # noqa: BLE001  (an optional package: the module's own import will say)
            pass
    for name in sorted(
        plan["packages"], key=len
    ):  # stand-ins, so a submodule imports without its parents
        stub = types.ModuleType(name)
        stub.__path__ = [str(Path(plan["files"][name]).parent)]
        stub.__kvlab_stub__ = True
        sys.modules[name] = stub
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, stub)
    changed, failed = {}, {}
    for module in plan["order"]:
        before = _state()
        try:
            if module in plan["packages"]:
                _load_package(module, plan["files"][module])
            else:
                importlib.import_module(module)
        except Exception as e:  # noqa: BLE001
            failed[module] = f"{type(e).__name__}: {e}"[:300]
            continue
        diff = _diff(before, _state())
        if diff:
            changed[module] = diff
    print(json.dumps({"changed": changed, "failed": failed}))


def _load_package(name: str, file: str) -> None:
    import importlib.util

    stub = sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=[str(Path(file).parent)]
    )
    module = importlib.util.module_from_spec(spec)
    for key, value in vars(stub).items():
        if isinstance(value, type(sys)) and key not in module.__dict__:
            setattr(module, key, value)  # submodules already loaded
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules[name] = stub
        raise


def _digest(value) -> str:
    import hashlib

    return hashlib.sha256(repr(value).encode()).hexdigest()[:12]


def _state() -> dict:
    """What an import must leave as it found it (only for libraries already loaded)."""
    import atexit
    import logging
    import random
    import signal
    import threading

    s: dict = {
        "os.environ": dict(os.environ),
        "sys.path": list(sys.path),
        "warnings filters": [repr(f) for f in warnings.filters],
        "sys.meta_path": [type(f).__qualname__ for f in sys.meta_path],
        "sys.path_hooks": [repr(h) for h in sys.path_hooks],
        "sys hooks": {
            "excepthook": repr(sys.excepthook),
            "displayhook": repr(sys.displayhook),
            "recursionlimit": sys.getrecursionlimit(),
        },
        "working directory": os.getcwd(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "atexit handlers": atexit._ncallbacks(),
        "signal handlers": {
            n: repr(signal.getsignal(getattr(signal, n))) for n in ("SIGINT", "SIGTERM")
        },
        "random state": _digest(random.getstate()),
        "logging": {
            name: [logger.level, [type(h).__name__ for h in logger.handlers]]
            for name, logger in [
                ("root", logging.getLogger()),
                *logging.Logger.manager.loggerDict.items(),
            ]
            if isinstance(logger, logging.Logger) and (logger.level or logger.handlers)
        },
    }
    s.update(_library_state())
    return s


def _library_state() -> dict:
    """The global state of torch, numpy, matplotlib and transformers, for those already loaded."""
    s: dict = {}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_default_dtype"):
        s["torch"] = {
            "default dtype": str(torch.get_default_dtype()),
            "default device": (
                str(torch.get_default_device()) if hasattr(torch, "get_default_device") else ""
            ),
            "threads": torch.get_num_threads(),
            "interop threads": torch.get_num_interop_threads(),
            "grad enabled": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "float32 matmul precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "random state": _digest(torch.random.get_rng_state().tolist()),
            "print options": repr(vars(torch._tensor_str.PRINT_OPTS)),
        }
        dynamo = sys.modules.get("torch._dynamo.config")
        if dynamo is not None and hasattr(dynamo, "get_config_copy"):
            s["torch._dynamo.config"] = {k: repr(v) for k, v in dynamo.get_config_copy().items()}
    np = sys.modules.get("numpy")
    if np is not None and hasattr(np, "random"):
        s["numpy"] = {
            "random state": _digest(np.random.get_state()[1].tolist()),
            "errors": np.geterr(),
            "print options": repr(np.get_printoptions()),
        }
    mpl = sys.modules.get("matplotlib")
    if mpl is not None and hasattr(mpl, "rcParams"):
        s["matplotlib rcParams"] = {
            k: repr(v) for k, v in dict.items(mpl.rcParams) if k != "backend"
        }
        s["matplotlib backend"] = repr(dict.get(mpl.rcParams, "backend"))
    registries = _transformers_registries()
    if registries:
        s["transformers registries"] = registries
    return s


def _transformers_registries() -> dict:
    masking = sys.modules.get("transformers.masking_utils")
    modeling = sys.modules.get("transformers.modeling_utils")
    auto = sys.modules.get("transformers.models.auto.configuration_auto")
    causal = sys.modules.get("transformers.models.auto.modeling_auto")
    registries = {}
    if modeling is not None and hasattr(modeling, "AttentionInterface"):
        registries["attention functions"] = sorted(
            getattr(modeling.AttentionInterface, "_global_mapping", {})
        )
        registries["ALL_ATTENTION_FUNCTIONS"] = sorted(
            getattr(modeling.ALL_ATTENTION_FUNCTIONS, "_local_mapping", {})
        )
    if masking is not None and hasattr(masking, "AttentionMaskInterface"):
        registries["attention masks"] = sorted(
            getattr(masking.AttentionMaskInterface, "_global_mapping", {})
        )
    if auto is not None and hasattr(auto, "CONFIG_MAPPING"):
        registries["AutoConfig"] = sorted(getattr(auto.CONFIG_MAPPING, "_extra_content", {}))
    if causal is not None and hasattr(causal, "MODEL_FOR_CAUSAL_LM_MAPPING"):
        registries["AutoModelForCausalLM"] = sorted(
            map(repr, getattr(causal.MODEL_FOR_CAUSAL_LM_MAPPING, "_extra_content", {}))
        )
    return registries


def _diff(before: dict, after: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(before) | set(after)):
        if key not in before:
            continue  # a library loaded only now: it has no earlier state to compare
        name = f"{prefix}{key}"
        a, b = before[key], after.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            added = [k for k in b if k not in a]
            gone = [k for k in a if k not in b]
            for k in added:
                out.append(f"sets {name}[{k!r}] = {b[k]!r}"[:200])
            for k in gone:
                out.append(f"removes {name}[{k!r}]")
            for k in a:
                if k in b and a[k] != b[k]:
                    if isinstance(a[k], (dict, list)) and isinstance(b[k], type(a[k])):
                        out += _diff({k: a[k]}, {k: b[k]}, f"{name}.")
                    else:
                        out.append(f"changes {name}[{k!r}]: {a[k]!r} -> {b[k]!r}"[:240])
        elif isinstance(a, list) and isinstance(b, list):
            added = [x for x in b if x not in a]
            gone = [x for x in a if x not in b]
            detail = "; ".join(
                filter(None, [f"adds {added}" if added else "", f"removes {gone}" if gone else ""])
            )
            out.append(f"changes {name}: {detail or 'reorders it'}"[:240])
        else:
            out.append(f"changes {name}: {a!r} -> {b!r}"[:240])
    return out


# -- docstrings and citations ---------------------------------------------------------------------


def notebook_numbers(root: Path) -> dict[str, str]:
    """``{"05b": "05b_paged_kernel", ...}`` from the notebooks folder."""
    return {p.stem.split("_")[0]: p.stem for p in sorted((root / "notebooks").glob("*.ipynb"))}


NUMBER = r"\d+[a-z]?"
NOTEBOOK_REF = re.compile(
    rf"\bnotebooks?\s+({NUMBER}(?:(?:\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|\s*[-–]\s*)"
    rf"{NUMBER}\b)*)",
    re.IGNORECASE,
)
STEM_REF = re.compile(r"\b(\d\d[a-z]?_[a-z0-9_]+)")
EVERY = re.compile(r"\b(every|each|all)\s+notebooks?\b", re.IGNORECASE)
SEED = re.compile(r"\bseeds?[\s_/#-]*0\d", re.IGNORECASE)


def docstring_findings(pkg: sd.Package) -> list[Finding]:
    numbers = notebook_numbers(pkg.root)
    stems = set(numbers.values())
    listing = ", ".join(numbers)
    found = []
    for module, tree in pkg.trees.items():
        path = rel(pkg, module)
        doc = ast.get_docstring(tree)
        if not doc or not doc.strip():
            found.append(
                Finding(
                    path,
                    1,
                    "docstring",
                    "no module docstring (start it with the notebook it serves)",
                )
            )
            continue
        first = doc.strip().splitlines()[0]
        refs = [n for m in NOTEBOOK_REF.finditer(first) for n in re.findall(NUMBER, m.group(1))]
        named = [s for s in STEM_REF.findall(first) if s in stems]
        wrong = [
            s for s in STEM_REF.findall(first) if s not in stems and s.split("_")[0] in numbers
        ]
        unknown = [n for n in refs if n not in numbers] + wrong
        if unknown:
            found.append(
                Finding(
                    path,
                    1,
                    "docstring",
                    f"names {', '.join(unknown)}, which is no notebook (notebooks: {listing})",
                )
            )
        elif not (refs or named or EVERY.search(first)):
            found.append(
                Finding(
                    path,
                    1,
                    "docstring",
                    f'the first line names no notebook: {first[:90]!r} (start e.g. "Notebook 05, '
                    'PagedAttention (section 9.5): ...", or "Every notebook: ...")',
                )
            )
    return found


def seed_findings(pkg: sd.Package) -> list[Finding]:
    found = []
    for module, path in pkg.mods.items():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in SEED.finditer(line):
                found.append(
                    Finding(
                        rel(pkg, module),
                        number,
                        "seed-citation",
                        f"says {line[m.start() : m.end() + 2].strip()!r}: cite the source by its "
                        "shorthand in book/references.bib",
                    )
                )
    return found


# -- the page's figure and table ------------------------------------------------------------------


def stale_findings() -> list[Finding]:
    out = ROOT / "book" / "architecture"
    fix = f"run `{sd.COMMAND}` (or `make diagram`) and commit book/architecture/"
    try:
        committed = json.loads((out / "stack.json").read_text())
    except (OSError, ValueError) as e:
        return [
            Finding("book/architecture/stack.json", 1, "stale-figure", f"unreadable ({e}): {fix}")
        ]
    now = sd.data(ROOT)
    found = []
    for key, what in (
        ("layers", "modules or layers"),
        ("edges", "import edges"),
        ("notebooks", "notebook table"),
    ):
        if committed.get(key) != now[key]:
            detail = what
            if key == "edges":
                old = {tuple(e) for e in committed.get(key, [])}
                new = {tuple(e) for e in now[key]}
                changes = [f"+{a}->{b} ({k})" for a, b, k in sorted(new - old)]
                changes += [f"-{a}->{b} ({k})" for a, b, k in sorted(old - new)]
                detail += (
                    f" ({len(changes)} changed:"
                    f" {', '.join(changes[:6])}{', ...' if len(changes) > 6 else ''})"
                )
            found.append(
                Finding(
                    "book/architecture/stack.json", 1, "stale-figure", f"{detail} changed: {fix}"
                )
            )
    md = out / "notebooks.md"
    if not md.exists() or md.read_text() != sd.notebooks_markdown(now):
        found.append(
            Finding(
                "book/architecture/notebooks.md",
                1,
                "stale-figure",
                f"the table is out of date: {fix}",
            )
        )
    if not (out / "stack.svg").exists():
        found.append(Finding("book/architecture/stack.svg", 1, "stale-figure", f"missing: {fix}"))
    return found


# -- sizes and other advice (reported, never failed) ----------------------------------------------


def size_report(pkg: sd.Package) -> list[str]:
    lines = []
    for module, path in pkg.mods.items():
        n = len(path.read_text().splitlines())
        if n > MODULE_LINES:
            lines.append(f"{rel(pkg, module)}: {n} lines (target ~{MODULE_LINES})")
        for node in ast.walk(pkg.trees[module]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    lines.append(
                        f"{rel(pkg, module)}:{node.lineno}: {node.name}: {length} lines "
                        f"(target ~{FUNCTION_LINES})"
                    )
    return lines


def _private_attributes_defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and is_private(
            node.name
        ):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and is_private(node.attr)
        ):
            names.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and is_private(t.id):
                    names.add(t.id)
    return names


def private_attribute_advice(pkg: sd.Package) -> list[str]:
    defined = {m: _private_attributes_defined(t) for m, t in pkg.trees.items()}
    owners = defaultdict(set)
    for m, names in defined.items():
        for n in names:
            owners[n].add(m)
    out = []
    for module, tree in pkg.trees.items():
        bound = _module_bindings(pkg, module)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id not in ("self", "cls")
                and node.value.id not in bound
                and node.attr not in defined[module]
                and owners.get(node.attr)
            ):
                where = ", ".join(sorted(owners[node.attr]))
                out.append(
                    f"{rel(pkg, module)}:{node.lineno}: {node.value.id}.{node.attr} "
                    f"(defined in {where})"
                )
    return sorted(set(out))


# -- the tests ------------------------------------------------------------------------------------


def _check(findings: list[Finding], what: str) -> None:
    if findings:
        pytest.fail(
            f"{len(findings)} {what}:\n" + "\n".join(map(str, sorted(findings))), pytrace=False
        )


def test_no_private_names_across_modules():
    _check(private_findings(package()), "imports or reads of another module's private name")


def test_no_import_cycles():
    _check(cycle_findings(package()), "imports inside an import cycle")


def test_layers_import_only_downwards():
    _check(layer_findings(package()), "imports of a higher layer")


def test_theory_is_pure_python():
    _check(theory_findings(package()), "imports that make kvlab.theory need more than Python")


def test_readings_do_not_import_matplotlib():
    _check(readings_findings(package()), "readings that reach matplotlib")


def test_no_import_side_effects_in_the_source():
    _check(
        static_side_effect_findings(package()), "module-level statements that change global state"
    )


def test_importing_a_module_changes_nothing_else():
    _check(runtime_side_effect_findings(package()), "import side effects seen in a fresh process")


def test_module_docstrings_name_their_notebook():
    _check(docstring_findings(package()), "module docstrings that do not start with their notebook")


def test_sources_cited_by_shorthand():
    _check(seed_findings(package()), "citations by seed number")


def test_stack_diagram_and_notebook_table_are_up_to_date():
    _check(stale_findings(), 'stale files of the page "How kvlab is built"')


def test_size_targets_are_reported():
    """Reported as a warning, never failed: sizes are targets."""
    pkg = package()
    report = size_report(pkg)
    advice = private_attribute_advice(pkg)
    if report:
        warnings.warn(
            f"{len(report)} modules or functions over their size target:\n" + "\n".join(report),
            stacklevel=1,
        )
    if advice:
        warnings.warn(
            f"{len(advice)} reads of another module's private attribute on an object (heuristic):\n"
            + "\n".join(advice),
            stacklevel=1,
        )


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each rule fires on a small package that breaks it, so that a clean report means something."""
    pkg_dir = tmp_path / "kvlab"
    files = {
        "__init__.py": '"""Every notebook: the names."""\n',
        "_checks.py": '"""Every notebook: checks."""\n',
        "versions.py": '"""Every notebook: versions."""\n',
        "theory/__init__.py": '"""Notebook 01: formulas."""\n',
        "theory/work.py": '"""Notebook 01: work."""\nimport torch\nfrom kvlab.cache import paged\n',
        "cache/__init__.py": '"""Notebook 01: caches."""\n',
        "cache/paged.py": (
            '"""Paged caches (seed 002)."""\nimport os\nfrom kvlab.cache.other import _hidden\n'
            'from kvlab.kernels import _validation\nos.environ["X"] = "1"\n'
        ),
        "cache/other.py": (
            '"""Notebook 07: other."""\nfrom kvlab.cache import paged\n_hidden = 1\n'
            "def f():\n    return paged._secret\n"
        ),
        "kernels/__init__.py": '"""Notebook 01: kernels."""\n',
        "kernels/_validation.py": '"""Notebook 01: checks."""\n',
        "show/__init__.py": '"""Notebook 01: show."""\n',
        "show/plots.py": '"""Notebook 01: plots."""\nimport matplotlib.pyplot as plt\n',
        "show/readings/__init__.py": (
            '"""Notebook 01: readings."""\nfrom kvlab.show.plots import plt\n'
        ),
        "weird.py": '"""Notebook 01: nowhere."""\n',
        "lab/__init__.py": '"""Notebook 01: lab."""\n',
        "lab/quiet.py": (
            '"""Notebook 01: hides its writes from the ast check."""\nimport sys\n'
            'getattr(sys.path, "append")("elsewhere")\n'
        ),
    }
    for name, text in files.items():
        (pkg_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg_dir / name).write_text(text)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_decode_loop.ipynb").write_text('{"cells": []}')
    pkg = sd.Package(tmp_path)
    rules = {
        f.rule
        for f in (
            private_findings(pkg)
            + cycle_findings(pkg)
            + layer_findings(pkg)
            + theory_findings(pkg)
            + readings_findings(pkg)
            + static_side_effect_findings(pkg)
            + docstring_findings(pkg)
            + seed_findings(pkg)
        )
    }
    details = [str(f) for f in private_findings(pkg) + docstring_findings(pkg)]
    assert rules == {
        "private-name",
        "private-module",
        "import-cycle",
        "layering",
        "unplaced",
        "theory-pure",
        "readings-no-matplotlib",
        "import-side-effect",
        "docstring",
        "seed-citation",
    }, rules
    assert any("reads kvlab.cache.paged._secret" in d for d in details), details
    assert any("07" in d and "no notebook" in d for d in details), details
    seen = [str(f) for f in runtime_side_effect_findings(pkg)]
    assert any(f.startswith("kvlab/lab/quiet.py:") and "sys.path" in f for f in seen), seen
    assert any(f.startswith("kvlab/cache/paged.py:") and "os.environ['X']" in f for f in seen), seen


# -- the report -----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        _probe()
        return 0
    pkg = package()
    sections = [
        ("private names", private_findings),
        ("import cycles", cycle_findings),
        ("layering", layer_findings),
        ("theory is pure Python", theory_findings),
        ("readings without matplotlib", readings_findings),
        ("import side effects (source)", static_side_effect_findings),
    ]
    if "--fast" not in argv:
        sections.append(("import side effects (fresh process)", runtime_side_effect_findings))
    sections += [("docstrings", docstring_findings), ("citations", seed_findings)]
    total = 0
    for title, fn in sections:
        findings = sorted(fn(pkg))
        total += len(findings)
        print(f"## {title}: {len(findings)}")
        for f in findings:
            print(f"  {f}")
    stale = stale_findings()
    total += len(stale)
    print(f"## stack diagram and notebook table: {len(stale)}")
    for f in stale:
        print(f"  {f}")
    for title, lines in (
        ("size targets (not failures)", size_report(pkg)),
        (
            "private attributes read on objects of other modules (heuristic, not failures)",
            private_attribute_advice(pkg),
        ),
    ):
        print(f"## {title}: {len(lines)}")
        for line in lines:
            print(f"  {line}")
    print(f"\n{total} findings")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
