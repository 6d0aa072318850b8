"""A notebook downloaded from the book installs kvlab in a fresh environment (see "Running on a
GPU"): its first cell, run in a new venv without kvlab, says in one sentence how to get it, then
installs it from the wheel `make book` puts beside the notebook pages. The venv sees this
environment's torch and transformers (a plain path, so this checkout's kvlab stays invisible), so
nothing is downloaded."""

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _first_cell(name: str = "01_decode_loop.ipynb") -> str:
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory):
    where = tmp_path_factory.mktemp("fresh")
    venv.create(where / "venv", with_pip=True)
    python = where / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # A plain path line: the packages there are seen, the .pth files (kvlab's editable install) are not.
    Path(purelib, "zz_this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run_cell(python, cwd, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVLAB_SOURCE")}
    code = _first_cell() + "\nprint('kvlab from', kvlab.__file__)\n"
    return subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **env}, timeout=600)


def test_first_cell_installs_kvlab_from_a_wheel_beside_the_notebook(fresh_python, tmp_path):
    assert 'REPOSITORY = ""' in _first_cell()  # set only in the built book, from _config.yml
    missing = _run_cell(fresh_python, tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "kvlab is not installed: put the kvlab wheel linked on this notebook's page beside the notebook, "
        "or set KVLAB_SOURCE to a wheel, a checkout or a pip URL, and run this cell again.")

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from kvlab_install import build_wheel  # what the book build puts beside the notebook pages
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    build_wheel(tmp_path)
    assert len(list(tmp_path.glob("kvlab-*.whl"))) == 1
    done = _run_cell(fresh_python, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "device:" in done.stdout and "copy:" in done.stdout  # kvlab.env() printed
    installed_at = done.stdout.split("kvlab from ")[-1].strip()
    assert str(fresh_python.parents[1]) in installed_at and str(ROOT) not in installed_at


def test_every_notebook_starts_with_the_same_install(tmp_path):
    heads = {p.name: _first_cell(p.name).split("kvlab.versions.meet_floors()")[0]
             for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert len(set(heads.values())) == 1, sorted(heads)
    assert "github.com/kvlab-book" not in next(iter(heads.values()))  # no placeholder address


def test_meet_floors_upgrades_and_asks_for_a_restart(monkeypatch):
    from kvlab import versions

    commands = []
    monkeypatch.setattr(versions, "installed", lambda name: {"transformers": "5.2.0", "torch": "2.13.0"}[name])
    with pytest.raises(SystemExit, match=r"Upgraded transformers>=5\.5\.0 for kvlab: restart the kernel"):
        versions.meet_floors(run=lambda cmd, check: commands.append(cmd))
    assert commands[0][-2:] == ["--upgrade", "transformers>=5.5.0"]  # torch is left alone
    monkeypatch.setattr(versions, "installed", lambda name: "99.0")
    versions.meet_floors(run=lambda cmd, check: pytest.fail("nothing to upgrade"))
