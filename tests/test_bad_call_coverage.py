"""Every notebook: the tables of bad calls cover every public name of kvlab.theory, kvlab.parallel,
kvlab.lab and kvlab.show (issue 33). A table is a module-level dict or list in a test file whose
name starts with ``BAD`` (or the handoff checks' ``DISAGREE`` and ``LIES``); a row covers a name when
the row's call spells it (``decode_step.near_floor(...)``, ``Engine(...)``, ``paging.simulate``).
A name that takes no argument worth refusing is listed, once, in ``EXEMPT`` with the reason."""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

from kvlab import kernels

kernels.use_interpreter()

PACKAGES = ("kvlab.theory", "kvlab.parallel", "kvlab.lab", "kvlab.show")
TESTS = Path(__file__).parent
TABLE = re.compile(r"^(BAD\w*|DISAGREE|LIES)$")

# "module.name": why no row of bad calls is owed
EXEMPT = {}


def public_modules():
    for package in PACKAGES:
        root = importlib.import_module(package)
        yield package
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            parts = info.name.split(".")
            if not any(p.startswith("_") for p in parts):
                yield info.name


def public_names() -> dict[str, object]:
    """``{"module.name": object}`` for each function and class a module defines and exports."""
    names = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        exported = getattr(module, "__all__", None)
        for name in exported if exported is not None else list(vars(module)):
            value = getattr(module, name)
            if name.startswith("_") or not (inspect.isfunction(value) or inspect.isclass(value)):
                continue
            if value.__module__ == module_name:
                names[f"{module_name}.{name}"] = value
    return names


def _imports(tree: ast.Module) -> dict[str, str]:
    """The names a test file imports, each with the dotted path it stands for."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = (
                    alias.asname and alias.name or (alias.name.split(".")[0])
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner and f"{inner}.{node.attr}"
    return None


def _resolve(path: str):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                value = getattr(value, part)
        except AttributeError:
            return None
        return value
    return None


def _tables(tree: ast.Module):
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and TABLE.match(t.id) for t in targets):
            yield node.value


def _raises_blocks(tree: ast.Module):
    """``with pytest.raises(Error, match=...)`` blocks: a row written as a test of its own."""
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and _dotted(call.func) == "pytest.raises"
                    and any(k.arg == "match" for k in call.keywords)
                ):
                    yield ast.Module(body=node.body, type_ignores=[])


def covered_objects() -> set[int]:
    """The ids of the objects that some row of some table spells."""
    covered = set()
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        imports = _imports(tree)
        for table in [*_tables(tree), *_raises_blocks(tree)]:
            for node in ast.walk(table):
                dotted = _dotted(node)
                if not dotted or dotted.split(".")[0] not in imports:
                    continue
                root, _, rest = dotted.partition(".")
                value = _resolve(imports[root] + (f".{rest}" if rest else ""))
                if value is not None:
                    covered.add(id(value))
                    covered.add(id(getattr(value, "__func__", value)))
    return covered


def _is_covered(value, covered: set[int]) -> bool:
    if id(value) in covered:
        return True
    if inspect.isclass(value):
        return any(id(member) in covered for member in vars(value).values())
    return False


def test_every_public_name_has_a_row_of_bad_calls_or_a_reason():
    names, covered = public_names(), covered_objects()
    missing = sorted(n for n, v in names.items() if n not in EXEMPT and not _is_covered(v, covered))
    assert not missing, f"{len(missing)} public names with no row of bad calls: " + ", ".join(
        missing
    )


def test_every_exemption_names_a_public_name():
    names = public_names()
    assert not [n for n in EXEMPT if n not in names]
