"""Notebook 08, long-context variants (section 9.7): the small model trained by the project and
shipped with the book, the contrast to a pretrained model in the quality measurements.

Random weights (``kvlab.tiny_model``) time exactly like trained ones but have no perplexity to lose,
no attention sinks and no outlier channels. This module loads a small Llama trained by
``scripts/train_tiny.py`` on the King James Bible (public domain, from Debian's ``bible-kjv-text``)
and ships in the repository, so it needs no network: ``trained_tokenizer()``, ``trained_model()``,
``heldout_text()`` (books the model never saw) and ``heldout_perplexity()``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvlab._checks import causal_lm, integer, one_of

DATA_DIR = Path(__file__).parents[1] / "data" / "tiny_kjv"


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the trained model ships inside the kvlab package"
            " (kvlab/data/tiny_kjv); rebuild it with `python scripts/train_tiny.py`."
        )
    return path


def trained_tokenizer():
    """The byte-level BPE tokenizer trained on the corpus, as a ``transformers`` fast tokenizer.

    Loaded from the package's own files (no hub). ``tokenizer(text)`` prepends the ``<s>`` token, as
    a Llama tokenizer does; pass ``add_special_tokens=False`` for the bare pieces.
    """
    import transformers

    _require(DATA_DIR / "tokenizer.json")
    return transformers.AutoTokenizer.from_pretrained(str(DATA_DIR), local_files_only=True)


def trained_model(dtype=None, device=None, attn_implementation: str = "eager"):
    """``(model, tokenizer)``: the small trained Llama of this book (GQA, RoPE), in eval mode.

    Loaded from the repository with ``local_files_only`` (works with the network unavailable).
    ``attn_implementation="eager"`` by default so that ``output_attentions=True`` returns the
    attention weights (section 9.7's sink measurement); pass ``"sdpa"`` for speed. The model card is
    ``kvlab/data/tiny_kjv/README.md``; ``model.shape`` is its ``ModelShape``.
    """
    import torch
    import transformers

    from kvlab.devices import device_and_dtype
    from kvlab.theory.shapes import ModelShape

    _require(DATA_DIR / "model.safetensors")
    one_of("attn_implementation", attn_implementation, ("eager", "sdpa"))
    dev, _ = device_and_dtype(device, dtype)
    dtype = torch.float32 if dtype is None else dtype
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(DATA_DIR), local_files_only=True, dtype=dtype, attn_implementation=attn_implementation
    ).to(dev)
    model.eval()
    model.shape = ModelShape.from_config(model.config, name="tiny-kjv")
    tokenizer = trained_tokenizer()
    model.tokenizer = tokenizer
    return model, tokenizer


def heldout_text() -> str:
    """The held-out slice of the corpus (whole books left out of training), as plain text."""
    return _require(DATA_DIR / "heldout.txt").read_text(encoding="utf-8")


def metrics() -> dict:
    """The figures ``scripts/train_tiny.py`` measured and wrote into the model card
    (``metrics.json``)."""
    return json.loads(_require(DATA_DIR / "metrics.json").read_text())


def heldout_ids(tokenizer=None, text: str | None = None):
    """The held-out text as one ``[1, n]`` id tensor, without the ``<s>`` token."""
    import torch

    tokenizer = tokenizer or trained_tokenizer()
    if text is not None and not isinstance(text, str):
        raise TypeError(
            f"text must be a str (or None for the held-out books), got {type(text).__name__}"
        )
    text = heldout_text() if text is None else text
    if not text.strip():
        raise ValueError("text must hold some text to tokenize, got an empty or blank str")
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], dtype=torch.long)


def heldout_perplexity(
    model,
    tokenizer=None,
    context: int | None = None,
    max_tokens: int | None = None,
    text: str | None = None,
) -> float:
    """Perplexity on the held-out text, in chunks of ``context`` tokens that each start with
    ``<s>``.

    ``context`` defaults to the model's training context (``config.max_position_embeddings``), so
    each chunk is scored the way the model was trained. ``max_tokens`` truncates the text first.
    This is the figure the model card states.
    """
    import torch

    causal_lm("model", model)
    positions = model.config.max_position_embeddings
    context = positions if context is None else integer("context", context, 2, positions + 1)
    if max_tokens is not None:
        integer("max_tokens", max_tokens, 1)
    tokenizer = tokenizer or trained_tokenizer()
    ids = heldout_ids(tokenizer, text)[0]
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) == 0:
        raise ValueError("text must hold at least one token to score")
    bos = tokenizer.bos_token_id
    nll, count = 0.0, 0
    dev = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(ids), context - 1):
            chunk = ids[start : start + context - 1]
            x = torch.cat([torch.tensor([bos]), chunk]).unsqueeze(0).to(dev)
            logits = model(x).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += len(chunk)
    return math.exp(nll / count)
