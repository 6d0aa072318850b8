"""kvlab.versions: the declared floors agree everywhere, the model builders warn once below them
(the import does not: a notebook's first cell says one thing, see tests/test_install.py), and every
cache argument goes under the name the model's own forward declares."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tomllib
import torch

import kvlab
from kvlab import versions

ROOT = Path(__file__).resolve().parents[1]


def _lower_bound(requirements: list[str], name: str) -> str:
    for line in requirements:
        m = re.match(rf"^{name}\s*(?:>=|==)\s*([0-9][^,;\s]*)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{name} has no lower bound")


def _same(a: str, b: str) -> bool:
    from packaging.version import Version

    return Version(a) == Version(b)


def test_floors_are_declared_the_same_everywhere():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    floor_pins = (ROOT / "requirements-floor.txt").read_text().splitlines()
    for name, floor in versions.FLOORS.items():
        assert _same(_lower_bound(project, name), floor), f"pyproject.toml {name}"
        assert _same(_lower_bound(requirements, name), floor), f"requirements.txt {name}"
    assert _same(_lower_bound(floor_pins, "transformers"), versions.FLOORS["transformers"])
    # torch is tested at the lowest build this project's CI installs cheaply (see
    # requirements-floor.txt)
    from packaging.version import Version

    assert Version(_lower_bound(floor_pins, "torch")) >= Version(versions.FLOORS["torch"])


def test_below_floor_warns_once_with_the_upgrade_command(monkeypatch):
    monkeypatch.setattr(
        versions, "installed", lambda name: {"transformers": "4.57.1", "torch": "2.13.0+cpu"}[name]
    )
    monkeypatch.setattr(versions, "_warned", False)
    assert versions.below_floor() == {"transformers": "4.57.1"}
    with pytest.warns(
        UserWarning, match=r"transformers 4\.57\.1 .*pip install -U 'transformers>=5\.5\.0'"
    ):
        versions.warn_if_below_floor()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.warn_if_below_floor()  # once per process
    monkeypatch.setattr(versions, "_warned", False)
    monkeypatch.setattr(versions, "installed", lambda name: "99.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.warn_if_below_floor()


def test_import_kvlab_is_silent_at_the_installed_versions():
    code = "import warnings; warnings.simplefilter('error'); import kvlab"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_require_transformers_names_the_version_it_needs(monkeypatch):
    monkeypatch.setattr(versions, "installed", lambda name: "5.5.0")
    versions.require_transformers("5.5", "this")
    with pytest.raises(
        RuntimeError, match=r"feature X needs transformers >= 5\.99; this runtime has 5\.5\.0"
    ):
        versions.require_transformers("5.99", "feature X")


class _Out:
    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.mark.parametrize("name", versions.CACHE_ARGUMENTS)
def test_cache_goes_under_the_name_forward_declares(name):
    namespace = {}
    exec(f"def forward(input_ids, {name}=None, use_cache=False, **kwargs): pass", namespace)
    model = type("Model", (), {})()
    model.forward = namespace["forward"]  # the other names would vanish into **kwargs
    cache = object()
    assert versions.cache_kwargs(model, cache) == {name: cache}
    assert versions.returned_cache(_Out(**{name: cache})) is cache


def test_a_forward_without_a_cache_argument_is_refused():
    model = type("M", (), {"forward": lambda self, input_ids, **kwargs: None})()
    with pytest.raises(TypeError, match="cache"):
        versions.cache_kwargs(model, object())
    with pytest.raises(ValueError, match="use_cache=True"):
        versions.returned_cache(_Out(logits=None))


def test_a_real_model_fills_the_cache_it_is_given():
    from transformers import DynamicCache

    model = kvlab.tiny_model("llama")
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(
            torch.tensor([[1, 2, 3]]), use_cache=True, **versions.cache_kwargs(model, cache)
        )
    assert cache.get_seq_length() == 3  # a name the forward ignored would leave it empty
    assert versions.returned_cache(out) is cache


def test_no_call_site_reads_a_returned_cache_by_one_release_name():
    """``out.cache`` exists only in recent transformers; ``returned_cache(out)`` in every
    release."""
    pattern = re.compile(r"\)\.(cache|past_key_values|cache_params)\b")
    sources = list((ROOT / "kvlab").rglob("*.py")) + list((ROOT / "notebooks").glob("*.ipynb"))
    offenders = [
        f"{p.name}: {m.group(0)}" for p in sources for m in pattern.finditer(p.read_text())
    ]
    assert not offenders


def test_no_call_site_names_the_cache_argument_itself():
    """A cache goes to a model only through ``cache_kwargs`` (never a private helper or a fixed
    name)."""
    pattern = re.compile(r"_cache_kw\b|\bcache_params=|past_key_values=|\*\*\{\"cache\"")
    sources = list((ROOT / "kvlab").rglob("*.py")) + list((ROOT / "notebooks").glob("*.ipynb"))
    offenders = [
        f"{p.name}: {m.group(0)}"
        for p in sources
        if p.name != "versions.py"
        for m in pattern.finditer(p.read_text())
    ]
    assert not offenders
