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

# Why a name is owed no row: one reason per kind of name, then the names of that kind.
RECORD = (
    "a record a measurement or a model returns (fields and derived properties, no __post_init__):"
    " the function that fills it checks the arguments"
)
NO_ARGUMENT = "takes no argument, so there is nothing to refuse"
EXEMPT = {
    **dict.fromkeys(
        [
            "kvlab.theory.agreement.Comparison",
            "kvlab.theory.agreement.FactorComparison",
            "kvlab.theory.cache_sizes.GQARow",
            "kvlab.theory.cache_sizes.Design",
            "kvlab.theory.long_context.Spread",
            "kvlab.theory.matmul.RooflineFit",
            "kvlab.theory.memory_wall.Footprint",
            "kvlab.theory.memory_wall.Recommendation",
            "kvlab.theory.parallel.SplitStep",
            "kvlab.theory.parallel.Crossing",
            "kvlab.theory.parallel.Handoff",
            "kvlab.theory.parallel.LinkRow",
            "kvlab.theory.preemption.RecomputeOrSwap",
            "kvlab.theory.prefill_attention.PrefillWork",
            "kvlab.theory.prefill_attention.AttentionFloor",
            "kvlab.theory.prefix.TTFTSaving",
            "kvlab.theory.roofline.StepBytes",
            "kvlab.theory.roofline.StepFlops",
            "kvlab.theory.roofline.Admission",
            "kvlab.theory.roofline.FloorRow",
            "kvlab.theory.roofline.AdmittedRate",
            "kvlab.theory.serving.WorkRatio",
            "kvlab.theory.verdict.BatchPoint",
            "kvlab.theory.work.StepWork",
            "kvlab.parallel.disaggregated.Handoff",
            "kvlab.parallel.tensor.ParallelDecode",
            "kvlab.lab.batch_tpot.Beside",
            "kvlab.lab.batch_tpot.TpotPoint",
            "kvlab.lab.bench.Row",
            "kvlab.lab.decode_peers.Ratio",
            "kvlab.lab.decode_peers.PeerComparison",
            "kvlab.lab.decode_timing.DecodeProfile",
            "kvlab.lab.decode_timing.CompileBreakEven",
            "kvlab.lab.decode_timing.CompilePayoff",
            "kvlab.lab.diagnose.Step",
            "kvlab.lab.diagnose.Diagnosis",
            "kvlab.lab.engine.PaddedRun",
            "kvlab.lab.engine.Speedup",
            "kvlab.lab.engine.ServingComparison",
            "kvlab.lab.engine.CurvePoint",
            "kvlab.lab.gemv.GemvPoint",
            "kvlab.lab.gemv.GemvSweep",
            "kvlab.lab.gemv.ModuleTime",
            "kvlab.lab.gemv.StepProfile",
            "kvlab.lab.hardware.Ceiling",
            "kvlab.lab.hardware.Probe",
            "kvlab.lab.history.HistorySweep",
            "kvlab.lab.layout_timing.ReadMeasurement",
            "kvlab.lab.layout_timing.AppendMeasurement",
            "kvlab.lab.paged_attention.AttentionTiming",
            "kvlab.lab.paged_attention.SplitTiming",
            "kvlab.lab.paged_kernel.SplitGrid",
            "kvlab.lab.paged_kernel.RecordedRun",
            "kvlab.lab.paging.SimResult",
            "kvlab.lab.parallel.MeasuredLink",
            "kvlab.lab.parallel.CollectiveSweep",
            "kvlab.lab.parallel.StepComparison",
            "kvlab.lab.preemption.PreemptionCost",
            "kvlab.lab.preemption.CachedRecompute",
            "kvlab.lab.preemption.HostCopy",
            "kvlab.lab.prefix.ChatRequest",
            "kvlab.lab.prefix.ReplayResult",
            "kvlab.lab.prefix.TTFTPoint",
            "kvlab.lab.prefix.DecodeAfterPrefix",
            "kvlab.lab.prefix.PrefillAttentionCost",
            "kvlab.lab.prefix_reuse.PrefixReuse",
            "kvlab.lab.skinny.SkinnyPoint",
            "kvlab.lab.speculative.Race",
            "kvlab.lab.step_trace.StepTrace",
            "kvlab.lab.streams.StreamResult",
            "kvlab.lab.streams.StreamingSweep",
            "kvlab.lab.streams.NeedleProbe",
            "kvlab.lab.timing.Comparison",
        ],
        RECORD,
    ),
    **dict.fromkeys(
        [
            "kvlab.parallel.launch.rank_device",
            "kvlab.parallel.tensor.quiet_progress",
            "kvlab.lab.cache_quality.streaming_rows",
            "kvlab.lab.diagnose.bench_rows",
            "kvlab.lab.engine.bench_rows",
            "kvlab.lab.hardware.device_name",
            "kvlab.lab.hardware.stamp",
            "kvlab.lab.hardware.stream_bytes",
            "kvlab.lab.layout_timing.last_level_cache_bytes",
            "kvlab.lab.paged_attention.bench_rows",
            "kvlab.lab.prefix.bench_rows",
            "kvlab.lab.pretrained.gguf_path",
            "kvlab.lab.pretrained.cache_root",
            "kvlab.lab.ssm_timing.quiet_mamba_fallback",
            "kvlab.lab.ssm_timing.bench_rows",
            "kvlab.lab.trained.trained_tokenizer",
            "kvlab.lab.trained.heldout_text",
            "kvlab.lab.trained.metrics",
        ],
        NO_ARGUMENT,
    ),
    "kvlab.lab.pretrained.WeightsMissing": "an exception kvlab raises, not a function to call",
    "kvlab.show.notebook.sizes": "returns one of its two arguments as given, whatever they are",
    "kvlab.theory.verdict.classify": "the decision decide makes once its door has checked the"
    " arguments, public so that chapter 9 can print it whole; decide's rows cover it",
}

# Names still owed a row: none since the readings and worked solutions that issue 33 left for a later
# round got their doors. A name may be written here for a while, never silently left out; the list
# only shrinks: the test fails when a name here gains a row (remove it) and when a name not here
# lacks one.
OWED = []


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
    missing = sorted(
        n
        for n, v in names.items()
        if n not in EXEMPT and n not in OWED and not _is_covered(v, covered)
    )
    assert not missing, f"{len(missing)} public names with no row of bad calls: " + ", ".join(
        missing
    )


def test_names_owed_a_row_are_still_owed_one():
    names, covered = public_names(), covered_objects()
    paid = [n for n in OWED if n in names and _is_covered(names[n], covered)]
    assert not paid, "these names have a row now; remove them from OWED: " + ", ".join(paid)


def test_every_exemption_and_debt_names_a_public_name():
    names = public_names()
    assert not [n for n in [*EXEMPT, *OWED] if n not in names]
    assert not set(EXEMPT) & set(OWED)
