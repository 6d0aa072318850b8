"""Every notebook that runs a model: the library versions kvlab supports, and the one place that
speaks to transformers' cache API (Wolf et al. 2020).

Serves every section that runs a model (9.1 to 9.7). transformers has renamed the cache argument of
``forward`` twice during 5.x: ``past_key_values`` (to 5.15), ``cache`` (later releases, which still
accept the old name), and Mamba's ``cache_params``; the returned cache moved with it. A name that a
``forward`` does not declare falls into its ``**kwargs`` and is silently ignored, so the cache never
fills and nothing fails. Every call site in kvlab therefore passes and reads its cache through
:func:`cache_kwargs` and :func:`returned_cache`, which look at the model's own signature.

The floors are the lowest releases the test suite runs on (``make test`` runs it a second time in
``.venv-floor``, built from ``requirements-floor.txt``). transformers 5.5 is the first release in
which every model kvlab runs (Llama, Mamba, Jamba) keeps its state in the one layered ``Cache``,
whose layers take the query length (not a position tensor) in ``get_mask_sizes``, and in which no
model takes ``cache_position``. Below it kvlab would be half compatibility code; from it, a few
small differences remain and are handled where they occur (cache layers also answer
``get_max_cache_shape``, the name before 5.13, and the static step's check reads either; SSM states
are a tensor before 5.14, a dict after; ``crop_cache`` below covers layers that cannot crop).
torch's floor is transformers' own (2.6); kvlab uses nothing newer.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from importlib.metadata import PackageNotFoundError, version

from kvlab._checks import integer

FLOORS = {"transformers": "5.5.0", "torch": "2.6.0"}
CACHE_ARGUMENTS = ("cache", "past_key_values", "cache_params")  # newest name first


def _parse(text: str):
    from packaging.version import Version

    return Version(text.split("+")[0])


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a pip name such as ``"torch"``), or None."""
    _text("distribution", distribution)
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def below_floor() -> dict[str, str]:
    """``{distribution: installed version}`` for each supported library installed below its
    floor."""
    low = {}
    for name, floor in FLOORS.items():
        have = installed(name)
        if have is not None and _parse(have) < _parse(floor):
            low[name] = have
    return low


def upgrade_command(low: dict[str, str]) -> str:
    """The pip command that lifts each library of ``low`` (``{name: installed version}``) to its
    floor."""
    if not isinstance(low, dict) or not low or not set(low) <= set(FLOORS):
        raise ValueError(
            f"low must be a non-empty dict whose keys are among {tuple(FLOORS)} (what below_floor "
            f"returns), got {low!r}"
        )
    return "pip install -U " + " ".join(f"'{name}>={FLOORS[name]}'" for name in low)


def triton_fix() -> str:
    """The one command that installs Triton here, or why there is none (its wheels are Linux
    x86_64)."""
    import platform
    import sys

    if sys.platform == "linux" and platform.machine() == "x86_64":
        return "pip install triton"
    return (
        f"none for {sys.platform} on {platform.machine()}: Triton publishes wheels for Linux on"
        " x86_64 only; run the kernels' notebooks there (Colab, a Linux box)"
    )


def triton_missing() -> str:
    return (
        "kvlab's Triton kernels need the package triton, which is not installed; fix:"
        f" {triton_fix()}"
    )


def missing() -> list[tuple[str, str]]:
    """``(what, the one command that fixes it)`` for each library kvlab needs that is missing or
    below its floor (``python -m kvlab env`` and ``kvlab.env()`` print them)."""
    found = [
        (
            f"{name} {have} is below kvlab's floor {FLOORS[name]}",
            f"{upgrade_command({name: have})}, then restart",
        )
        for name, have in below_floor().items()
    ]
    if importlib.util.find_spec("triton") is None:  # found without importing it (see kvlab.kernels)
        found.append(
            (
                "triton, for kvlab's kernels (paged attention, the engine, the SSM scan)",
                triton_fix(),
            )
        )
    return found


_warned = False


def warn_if_below_floor() -> None:
    """One warning per process, with the command that fixes it, when transformers or torch is too
    old for kvlab. kvlab's model builders call it (importing kvlab does not, so a notebook's first
    cell, which calls :func:`meet_floors` instead, says one thing)."""
    global _warned
    low = below_floor()
    if low and not _warned:
        _warned = True
        have = ", ".join(f"{name} {v} (kvlab needs >= {FLOORS[name]})" for name, v in low.items())
        warnings.warn(f"{have}; run `{upgrade_command(low)}` and restart the kernel", stacklevel=3)


class NotebookStop(Exception):
    """Stops a notebook's run-all with one message. Jupyter and Colab show the message alone, with
    no traceback (IPython asks an exception for ``_render_traceback_``); elsewhere it is a plain
    error.
    """

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


# Libraries whose loaded module a running kernel keeps after pip replaces them: distribution ->
# module.
RELOAD_SENSITIVE = {
    "torch": "torch",
    "transformers": "transformers",
    "triton": "triton",
    "tokenizers": "tokenizers",
    "huggingface-hub": "huggingface_hub",
    "safetensors": "safetensors",
    "numpy": "numpy",
}
RESTART = (
    "restart the kernel (on Colab: Runtime, Restart session) and run the notebook again from"
    " the top"
)


def replaced_while_loaded(modules=None) -> dict[str, tuple[str, str]]:
    """``{distribution: (loaded version, installed version)}`` for each library this process
    imported whose installed version has changed since (pip upgraded it underneath the running
    kernel)."""
    import sys

    modules = sys.modules if modules is None else modules
    stale = {}
    for distribution, module_name in RELOAD_SENSITIVE.items():
        loaded = getattr(modules.get(module_name), "__version__", None)
        have = installed(distribution)
        if loaded is not None and have is not None and str(loaded) != have:
            stale[distribution] = (str(loaded), have)
    return stale


def meet_floors(run=None) -> None:
    """What a notebook's first cell calls. Below a floor, pip-upgrades that library (transformers,
    and torch only if it too is below its floor), quietly, then stops the run with one sentence
    asking for a restart, since the running kernel may hold the old one. A kernel that already
    imported a library which pip has replaced since (installing kvlab upgraded it) is asked to
    restart too. At or above the floors, with nothing stale, it does nothing. ``run`` stands in for
    ``subprocess.run`` in tests.
    """
    import importlib
    import subprocess
    import sys

    low = below_floor()
    if low:
        specs = [f"{name}>={FLOORS[name]}" for name in low]
        done = (run or subprocess.run)(
            [sys.executable, "-m", "pip", "install", "--quiet", "--upgrade", *specs],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise NotebookStop(
                f"kvlab needs {' and '.join(specs)}, and `pip install --upgrade {' '.join(specs)}` "
                f"failed here:\n{(done.stderr or done.stdout or '').strip()[-1500:]}"
            )
        importlib.invalidate_caches()
        still = below_floor()
        if still:
            raise NotebookStop(
                f"pip upgraded {' and '.join(specs)}, but this Python still finds "
                + ", ".join(f"{n} {v}" for n, v in still.items())
                + f" first on its path ({sys.executable}): remove that copy, then {RESTART}."
            )
        raise NotebookStop(
            "kvlab upgraded "
            + " and ".join(f"{n} {v} to {installed(n)}" for n, v in low.items())
            + f": {RESTART}."
        )
    stale = replaced_while_loaded()
    if stale:
        raise NotebookStop(
            "This kernel still runs "
            + " and ".join(f"{n} {old} ({new} is installed now)" for n, (old, new) in stale.items())
            + f": {RESTART}."
        )


def require_transformers(minimum: str, feature: str) -> None:
    """Raise a clear error when ``feature`` needs a newer transformers than the one installed."""
    _text("minimum", minimum)
    _text("feature", feature)
    have = installed("transformers") or "0"
    if _parse(have) < _parse(minimum):
        raise RuntimeError(
            f"{feature} needs transformers >= {minimum}; this runtime has {have} "
            f"(pip install -U 'transformers>={minimum}')"
        )


def _forward_parameters(model):
    if not callable(getattr(model, "forward", None)):
        raise TypeError(
            "model must be a model with a forward method (a transformers model), got"
            f" {type(model).__name__}"
        )
    return inspect.signature(model.forward).parameters


def _text(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str, got {type(value).__name__} {value!r}")
    return value


def cache_argument(model) -> str:
    """The name under which ``model.forward`` takes its cache in this transformers release."""
    params = _forward_parameters(model)
    for name in CACHE_ARGUMENTS:
        if name in params:
            return name
    raise TypeError(
        f"{type(model).__name__}.forward takes none of {CACHE_ARGUMENTS}: kvlab cannot pass it a"
        " cache"
    )


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(..., **cache_kwargs(model, cache))``: never ``cache=``
    directly."""
    return {cache_argument(model): cache}


def returned_cache(output):
    """The cache a forward pass returned (``output.cache``, ``.past_key_values`` or
    ``.cache_params``)."""
    if not any(hasattr(output, name) for name in ("logits", *CACHE_ARGUMENTS)):
        raise TypeError(
            "output must be what a model's forward returned (a ModelOutput), got"
            f" {type(output).__name__}"
        )
    for name in CACHE_ARGUMENTS:
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    raise ValueError("output holds no cache: call the model with use_cache=True")


def drop_newest(cache, tokens: int = 1) -> None:
    """Forget a static cache's newest ``tokens`` so that the next step overwrites them (a repeatable
    step). Static layers learned ``crop`` after 5.5; before, their write position is a tensor."""
    if not hasattr(cache, "layers") or not hasattr(cache, "get_seq_length"):
        raise TypeError(
            f"cache must be a transformers Cache (e.g. a StaticCache), got {type(cache).__name__}"
        )
    integer("tokens", tokens, 1, cache.get_seq_length() + 1)  # no more than it holds
    if all(hasattr(layer, "crop") for layer in cache.layers):
        cache.crop(-tokens)
        return
    for layer in cache.layers:
        layer.cumulative_length.sub_(tokens)


def takes(model, argument: str) -> bool:
    """Whether ``model.forward`` declares ``argument`` (``logits_to_keep``, ``cache_position``,
    ...)."""
    return _text("argument", argument) in _forward_parameters(model)


def last_logits_only(model) -> dict:
    """``{"logits_to_keep": 1}`` where ``model.forward`` takes it, else ``{}``: a greedy pick needs
    the last position's logits only, and a long prompt's full [batch, P, vocab] logits would cost
    more memory than its KV cache."""
    return {"logits_to_keep": 1} if takes(model, "logits_to_keep") else {}


def crop_cache(cache, tokens_to_remove: int) -> None:
    """Drop the last ``tokens_to_remove`` positions from every layer of ``cache`` (speculative
    decoding's roll-back). ``Cache.crop`` took the length to keep until 5.x and takes only a
    negative count now; a negative count means "remove this many" in both."""
    if not tokens_to_remove:
        return
    layers = getattr(cache, "layers", [])
    if all(hasattr(layer, "crop") and getattr(layer, "is_initialized", True) for layer in layers):
        cache.crop(-tokens_to_remove)
        return
    for (
        layer
    ) in layers:  # before 5.x a layer an early exit never wrote cannot crop, nor a static one
        if not layer.is_initialized:
            continue
        if hasattr(layer, "crop"):
            layer.crop(-tokens_to_remove)
        else:  # a static layer: move its write position back; the next update overwrites the rest
            layer.cumulative_length.sub_(tokens_to_remove)
