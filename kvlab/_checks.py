"""Every notebook: the argument checks kvlab's modules share, and the one way a call changes a
caller's object for a while (CONTRIBUTING.md, "Errors").

A check takes the argument's name as the caller wrote it, and the value, and returns the value as
kvlab uses it (``integer("block_size", 16) == 16``). A wrong kind of thing raises a TypeError, a
wrong value a ValueError; the message names the argument, the value and what is allowed:

- ``integer`` and ``integers``: an int in a range (never a bool, never a float, not even 4.0), or a
  list of them;
- ``real`` and ``positive``: a finite real number in a range (never a bool, an infinity or NaN);
- ``reals``: a list of such numbers; ``same_length``: lists that pair up one to one;
- ``flag``: True or False (never ``"no"``, ``1`` or None);
- ``one_of``: one of a tuple of choices;
- ``token_ids``: token ids, ints in ``[0, vocab)``; ``token_id_tensor``: a ``[batch, length]``
  tensor of them; ``padding_mask``: the 0/1 attention mask of a left-padded batch;
- ``items``: a list of things of one kind (requests, events, measured points);
- ``record``: a record by its fields, where the caller cannot import its class (a reading imports
  no torch, so none of ``kvlab.lab``'s measurement records);
- ``function``: something to call;
- ``unmeasured``: what a reading says instead of a verdict when a measurement is missing;
- ``device`` and ``dtype``: a torch device this machine has, a floating torch dtype;
- ``causal_lm``: a Hugging Face causal language model;
- ``fresh_cache``: an empty transformers cache;
- ``require_memory``: a size this machine can hold, refused by arithmetic before allocating;
- ``named_shapes``: tensors whose dimensions agree with their layouts;
- ``decode_call``: every argument of ``kvlab.decode.decode_steps``; ``static_cache`` and
  ``static_step``: ``kvlab.decode.new_static_cache``'s and ``StaticStep.step``'s.

Checks run once, where a public call enters kvlab; what they return is passed on unchecked (a step
that runs thousands of times calls an unchecked twin with values checked once). ``restoring`` is the
context manager around every temporary change to a caller's object (a model's attention
implementation; a cache's state), which puts the object back if anything fails.

Plain Python: torch is imported only by the checks that need it.
"""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager


def _got(value) -> str:
    return f"{type(value).__name__} {value!r}"


def integer(name: str, value, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int in [low, high) (no upper bound when ``high`` is None).

    A bool, a float (4.0 included: an integer count is never a float in kvlab) or anything else
    that is not an integer is refused with a TypeError, a value out of range with a ValueError.
    """
    allowed = f">= {low}" if high is None else f"in [{low}, {high})"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int {allowed}, got {_got(value)}")
    if value < low or (high is not None and value >= high):
        raise ValueError(f"{name} must be an int {allowed}, got {value!r}")
    return int(value)


def integers(
    name: str, value, low: int = 1, high: int | None = None, *, empty: bool = False
) -> list[int]:
    """``value`` (a list or tuple) as a list of ints, each checked as ``integer(f"{name}[i]",
    ...)``; an empty list only if ``empty``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, range)):
        raise TypeError(f"{name} must be a list of ints, got {_got(value)}")
    if not value and not empty:
        raise ValueError(f"{name} must hold at least one int, got an empty {type(value).__name__}")
    return [integer(f"{name}[{i}]", v, low, high) for i, v in enumerate(value)]


def real(
    name: str,
    value,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float in the interval [low, high], either end open on request.

    A bool or a non-number is a TypeError; an infinity, NaN or a value outside the interval a
    ValueError.
    """
    if high == math.inf:
        allowed = "a finite number" + (
            "" if low == -math.inf else f" {'>' if low_open else '>='} {low:g}"
        )
    elif low == -math.inf:
        allowed = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        allowed = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be {'a number ' if allowed.startswith('in') else ''}{allowed}, got"
            f" {_got(value)}"
        )
    x = float(value)
    above = x > low if low_open else x >= low
    below = x < high if high_open else x <= high
    if not (math.isfinite(x) and above and below):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return x


def positive(name: str, value) -> float:
    """``value`` as a finite float > 0 (bytes, rates, widths, factors)."""
    return real(name, value, 0, low_open=True)


def nonnegative(name: str, value) -> float:
    """``value`` as a finite float >= 0 (seconds, bytes, fractions of a step)."""
    return real(name, value, 0)


def reals(
    name: str,
    value,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    empty: bool = False,
) -> list[float]:
    """``value`` (a list, tuple or 1-D array) as a list of floats, each checked as
    ``real(f"{name}[i]", ...)``; an empty list only if ``empty``."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a list of numbers, got {_got(value)}")
    if getattr(value, "ndim", 1) != 1:
        raise ValueError(f"{name} must be a flat list of numbers, got shape {value.shape}")
    if len(value) == 0 and not empty:
        raise ValueError(
            f"{name} must hold at least one number, got an empty {type(value).__name__}"
        )
    return [real(f"{name}[{i}]", v, low, high, low_open=low_open) for i, v in enumerate(value)]


def same_length(**lists) -> int:
    """The one length of ``lists`` (given by their argument names), which pair up one to one: lists
    of different lengths are refused, never zipped down to the shorter."""
    lengths = {name: len(v) for name, v in lists.items()}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(
            f"{' and '.join(lengths)} must have the same length (one entry each), got: {said}"
        )
    return next(iter(lengths.values()), 0)


def flag(name: str, value) -> bool:
    """``value`` if it is True or False; ``"no"``, ``1`` and None are refused (a string is always
    true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_got(value)}")
    return value


def one_of(name: str, value, allowed):
    """``value`` if it equals one of ``allowed`` (True is not 1 here, nor 4.0 the 4), else a
    ValueError listing them."""

    def same(a) -> bool:
        if isinstance(value, bool) != isinstance(a, bool) or (
            isinstance(value, float) and not isinstance(a, float)
        ):
            return False
        try:
            return bool(value == a)
        except (TypeError, RuntimeError, ValueError):  # e.g. a tensor compared with a number
            return False

    if not any(same(a) for a in allowed):
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def token_ids(name: str, value, vocab: int | None = None, *, empty: bool = False) -> list[int]:
    """``value`` (a list or tuple of ints, or a 1-D integer tensor or array) as a list of token ids,
    each in ``[0, vocab)`` (a model's ``vocab_size``; without one, ``[0, 2**63)``, what a hash
    holds).

    Text, a bare int, floats (1.0 included), bools and nested lists are refused; so is an empty
    sequence unless ``empty``.
    """
    high, shown = (2**63, "2**63") if vocab is None else (vocab, vocab)
    allowed = f"a list of token ids (ints in [0, {shown}))"
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{name} must be {allowed}, got a {type(value).__name__}; tokenize the text first"
        )
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # a torch tensor or a numpy array
        kind = str(value.dtype)  # "torch.int64", "int32", "torch.float32", "torch.bool" ...
        if value.ndim != 1 or "int" not in kind:
            raise TypeError(
                f"{name} must be {allowed} or a 1-D integer tensor, got a {kind} of shape "
                f"{tuple(value.shape)}"
            )
        value = value.tolist()
    try:
        ids = list(value)
    except TypeError:
        raise TypeError(f"{name} must be {allowed}, got {_got(value)}") from None
    if not ids and not empty:
        raise ValueError(
            f"{name} must hold at least one token id, got an empty {type(value).__name__}"
        )
    if all(type(t) is int and 0 <= t < high for t in ids):  # the common case, quickly
        return ids
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(
                f"{name}[{i}] must be a token id (an int in [0, {shown})), got {_got(t)}"
            )
        if not 0 <= t < high:
            where = f" (the model's vocab_size is {vocab})" if vocab is not None else ""
            raise ValueError(f"{name}[{i}] must be a token id in [0, {shown}){where}, got {t!r}")
    return [int(t) for t in ids]


def token_id_tensor(name: str, value, vocab: int | None = None):
    """``value`` if it is an integer tensor ``[batch, prompt_length >= 1]`` of token ids, each in
    ``[0, vocab)`` when ``vocab`` (a model's ``vocab_size``) is given: an id outside it would hit a
    device-side assert on a GPU."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {value.dtype}")
    if value.dim() != 2 or value.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape [batch, prompt_length >= 1], got {list(value.shape)}"
        )
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device, which holds no token ids")
    if vocab is not None and value.numel() and (int(value.min()) < 0 or int(value.max()) >= vocab):
        bad = value[(value < 0) | (value >= vocab)].flatten()[:3].tolist()
        raise ValueError(
            f"{name} must be token ids in [0, {vocab}) (the model's vocab_size), got {bad}"
        )
    return value


def padding_mask(name: str, value, ids, ids_name: str = "input_ids"):
    """``value`` as a long tensor on ``ids``' device: the attention mask of a left-padded batch
    (``ids``' shape; each row zeros for padding, then ones for tokens, at least one). None is a
    batch without padding, all ones."""
    import torch

    if value is None:
        return torch.ones_like(ids)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.shape != ids.shape:
        raise ValueError(
            f"{name} must have the shape of {ids_name} {list(ids.shape)}, got {list(value.shape)}"
        )
    if value.is_complex() or not bool(((value == 0) | (value == 1)).all()):
        odd = value[(value != 0) & (value != 1)].flatten()[:3].tolist()
        raise ValueError(
            f"{name} must hold only 0 (padding) and 1 (token), got values such as {odd}"
        )
    mask = value.to(device=ids.device, dtype=torch.long)
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError(f"{name} must be left-padded: each row is zeros, then ones")
    if not bool(mask[:, -1].all()):
        raise ValueError(f"{name}: every sequence needs at least one token (a 1 in its row)")
    return mask


def fresh_cache(name: str, value, layers: int | None = None):
    """``value`` if it is an empty transformers ``Cache`` (a fresh one per call), with ``layers``
    layers when both it and ``layers`` say how many."""
    from transformers.cache_utils import Cache

    if not isinstance(value, Cache):
        raise TypeError(
            f"{name} must be a transformers Cache (e.g. kvlab.cache.window.SinkCache), got "
            f"{type(value).__name__}"
        )
    built = getattr(value, "layers", None)
    if built and layers is not None and len(built) != layers:
        raise ValueError(
            f"{name} has {len(built)} layers but the model has {layers}: build the cache for this "
            "model"
        )
    if value.get_seq_length() != 0:
        raise ValueError(
            f"{name} must be empty (a fresh one per call), but it holds {value.get_seq_length()} "
            "tokens"
        )
    return value


def instance(name: str, value, kind, what: str | None = None):
    """``value`` if it is a ``kind`` (a class, or a tuple of classes): the record or object a
    function reads fields of, refused by name before an ``AttributeError`` deep inside."""
    if not isinstance(value, kind):
        what = what or "a " + " or ".join(
            k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,))
        )
        raise TypeError(f"{name} must be {what}, got {_got(value)}")
    return value


def record(name: str, value, kind: str, *fields: str):
    """``value`` if it has every one of ``fields``: a record of class ``kind`` (its dotted name),
    refused by name before an ``AttributeError`` deep inside.

    ``instance`` needs the class, which a reading cannot import: ``kvlab.lab``'s measurement records
    live beside torch, and a reading imports no torch. Any object with the fields passes (a test's
    ``SimpleNamespace`` too).
    """
    if not all(hasattr(value, f) for f in fields):
        raise TypeError(
            f"{name} must be a {kind} (a record with {', '.join(fields)}), got {_got(value)}"
        )
    return value


def items(name: str, value, kind: type, *, what: str | None = None, each: str | None = None):
    """``value`` (a list, tuple or any other iterable but text) as a list whose every element is a
    ``kind``.

    The messages say ``{name} must be a list of {what}`` and ``{name}[i] must be {each}``; ``what``
    defaults to ``kind``'s name, ``each`` to that name with its article ("an Event").
    """
    what = what or kind.__name__
    each = each or f"{'an' if kind.__name__[:1].lower() in 'aeiou' else 'a'} {kind.__name__}"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of {what}, got {type(value).__name__}")
    value = list(value)
    for i, v in enumerate(value):
        if not isinstance(v, kind):
            raise TypeError(f"{name}[{i}] must be {each}, got {type(v).__name__}")
    return value


def unmeasured(**measurements) -> str | None:
    """The sentence a reading gives instead of a verdict when a measurement it was handed is
    missing or no finite number (None, NaN, an infinity: a run that failed or was skipped); None
    when every one was measured. A model refuses such a value; the reading says so in words."""
    missing = [
        f"{name} (got {value!r})"
        for name, value in measurements.items()
        if isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
    ]
    if not missing:
        return None
    return (
        f"Not measured: {', '.join(missing)}. Without {'it' if len(missing) == 1 else 'them'} the"
        " model has nothing to be compared with, so no verdict is drawn; rerun the measurement."
    )


def function(name: str, value):
    """``value`` if it can be called."""
    if not callable(value):
        raise TypeError(f"{name} must be a function (something to call), got {_got(value)}")
    return value


def device(name: str, value):
    """``value`` as a ``torch.device`` this machine has: ``"cpu"``, or ``"cuda"``/``"cuda:i"`` for a
    GPU that is present (not the meta device, which holds no data)."""
    import torch

    allowed = "a torch.device or a name like 'cpu', 'cuda' or 'cuda:0'"
    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{name} must be {allowed}, got {_got(value)}")
    try:
        dev = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must be {allowed}, got {value!r}") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise ValueError(
                f"{name} {value!r} is not available on this machine ({count} CUDA device(s))"
            )
    elif dev.type != "cpu":
        raise ValueError(
            f"{name} must hold data on this machine ('cpu' or a CUDA device), got {value!r}"
        )
    return dev


def dtype(name: str, value):
    """``value`` if it is a floating-point ``torch.dtype`` (``torch.float16``, not ``"fp16"``)."""
    import torch

    if not isinstance(value, torch.dtype):
        raise TypeError(
            f"{name} must be a torch.dtype such as torch.float32 or torch.float16, got"
            f" {_got(value)}"
        )
    if not value.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {value}")
    return value


def causal_lm(name: str, value):
    """``value`` if it is a Hugging Face causal LM: a ``torch.nn.Module`` with a ``config``."""
    import torch

    if not isinstance(value, torch.nn.Module) or not hasattr(value, "config"):
        raise TypeError(
            f"{name} must be a Hugging Face causal LM (a transformers model such as "
            f"kvlab.tiny_model() returns), got {type(value).__name__}"
        )
    return value


def free_memory(device) -> int:
    """Bytes that can still be allocated on ``device``: CUDA's free memory plus what torch's caching
    allocator holds unused, or the host's MemAvailable (Linux), or its physical memory where that
    cannot be read."""
    import os

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ValueError(
                f"device {device} is not available on this machine ({count} CUDA device(s))"
            )
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(
            device
        )  # torch's own spare
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require_memory(what: str, needed: int, device) -> None:
    """Refuse, by arithmetic and before allocating, a request larger than ``device``'s free
    memory."""
    free = free_memory(device)
    if needed > free:
        raise MemoryError(
            f"{what} needs {needed:,} bytes but only {free:,} bytes are free on {device}"
        )


def named_shapes(layouts: dict, *, optional=(), **tensors) -> dict:
    """Each tensor must be a floating ``torch.Tensor`` whose dimensions are the axes its layout
    names (``layouts[name] == "[batch, dim, length]"``); axes of one name must have one size, and
    all tensors one device. ``None`` is skipped for the names in ``optional``. Returns ``{axis:
    size}``.
    """
    import torch

    sizes = {}
    for name, t in tensors.items():
        if t is None and name in optional:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor {layouts[name]}, got {type(t).__name__}"
            )
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        axes = layouts[name].strip("[]").split(", ")
        if t.dim() != len(axes):
            raise ValueError(
                f"{name} must have {len(axes)} dimensions {layouts[name]}, got shape"
                f" {tuple(t.shape)}"
            )
        for axis, size in zip(axes, t.shape):
            size = int(size)
            if sizes.setdefault(axis, (size, name))[0] != size:
                raise ValueError(
                    f"{name} has {axis}={size} but {sizes[axis][1]} has {axis}={sizes[axis][0]} "
                    f"({name} is {layouts[name]})"
                )
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return {axis: size for axis, (size, _) in sizes.items()}


# --------------------------------------------------------------------------- the one context
# manager


@contextmanager
def restoring(obj, *, attn_implementation: str | None = None):
    """Everything about ``obj`` as it was if the block raises; a switch made here undone when it
    ends.

    - A model (anything with ``set_attn_implementation``): ``attn_implementation`` switches its
      attention function for the block; on exit, however the block ends, the model has its own
      attention implementation and training flag again.
    - A stateful object with ``snapshot()`` and ``restore()`` (the block manager, the paged cache,
      the engine): if the block raises, ``restore(snapshot())`` puts back what it changed (under
      that object's own rollback rule, e.g. an evicted prefix hash stays evicted).

    This is the one way kvlab changes a caller's object for a while.
    """
    if hasattr(obj, "set_attn_implementation"):
        before, training = obj.config._attn_implementation, obj.training
        try:
            if attn_implementation is not None and attn_implementation != before:
                obj.set_attn_implementation(attn_implementation)
            yield obj
        finally:
            if obj.config._attn_implementation != before:
                obj.set_attn_implementation(before)
            if obj.training != training:
                obj.train(training)
        return
    if attn_implementation is not None:
        raise TypeError(
            f"attn_implementation switches a model's attention; {type(obj).__name__} is not a model"
        )
    snapshot = obj.snapshot()
    try:
        yield obj
    except BaseException:
        obj.restore(snapshot)
        raise


def decode_call(
    method,
    methods,
    shape,
    model,
    input_ids,
    max_new_tokens,
    attention_mask,
    cache=None,
    compile=None,
):
    """The mask ``kvlab.decode.decode_steps`` decodes with, once every argument is what its loops
    trust: ``method`` one of ``methods``, and for ``"static"`` a preallocated cache that fits
    (``shape``: ``kvlab.theory.shapes.ModelShape``, which sizes it)."""
    import torch

    one_of("method", method, methods)
    causal_lm("model", model) if method != "static" else static_model("model", model)
    if compile is not None:
        flag("compile", compile)
    token_id_tensor("input_ids", input_ids, getattr(model.config, "vocab_size", None))
    integer("max_new_tokens", max_new_tokens, 0)
    mask = padding_mask("attention_mask", attention_mask, input_ids)
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    learned = getattr(getattr(model, "transformer", None), "wpe", None)  # GPT-2's position table
    if isinstance(learned, torch.nn.Embedding) and total > learned.num_embeddings:
        raise ValueError(
            f"prompt ({prompt}) + max_new_tokens ({max_new_tokens}) must be <= "
            f"{learned.num_embeddings}, the positions this model has embeddings for"
        )
    if cache is not None:
        fresh_cache("cache", cache, getattr(model.config, "num_hidden_layers", None))
    if method == "static":  # the preallocated cache must fit, refused by arithmetic
        kv_bytes = shape.from_config(model.config).kv_bytes_per_token(model.dtype.itemsize)
        needed = int(batch * total * kv_bytes)
        require_memory(f"a static cache of {batch} x {total} tokens", needed, model.device)
    return mask


def speculative_call(
    model, input_ids, max_new_tokens, draft, k, layers, static, compile, *, drafts, max_k, shape
):
    """The early-exit proposer's depth (None for prompt lookup), once every argument of
    ``kvlab.speculative.speculative_steps`` is what its loops trust: ``draft`` one of ``drafts``,
    ``k`` in ``[1, max_k]``, the rest as ``decode_call`` checks a cached or static loop's."""
    flag("static", static)
    one_of("draft", draft, drafts)
    integer("k", k, 1, max_k + 1)
    integer("max_new_tokens", max_new_tokens, 0)
    if compile is not None and not static:
        raise ValueError(f"compile is for static=True only, got compile={compile!r}")
    # The static cache keeps k spare slots: the last pass may write k guesses past the output.
    method, room = ("static", k) if static else ("cached", 0)
    args = (model, input_ids, max_new_tokens + room, None, None, compile)
    decode_call(method, (method,), shape, *args)
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must hold one sequence (batch 1) for the speculative loop, got batch "
            f"{input_ids.shape[0]}: the serving engine (kvlab.serving) speculates per request"
        )
    if draft == "prompt_lookup":
        if layers is not None:
            raise ValueError(f"layers is for draft='early_exit' only, got layers={layers!r}")
        return None
    if not hasattr(getattr(model, "model", None), "layers"):
        raise ValueError(
            f"draft='early_exit' needs a decoder with model.model.layers (Llama, Qwen2, "
            f"Mistral), got {type(model).__name__}"
        )
    every = model.config.num_hidden_layers
    return integer("layers", every // 2 if layers is None else layers, 1, every)


def static_model(name: str, value):
    """``value`` if it is a causal LM with attention layers (what a ``StaticCache`` preallocates
    for) whose weights are on a device with data."""
    causal_lm(name, value)
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (it holds no weights): load it first")
    if not getattr(value.config, "num_attention_heads", None):
        raise ValueError(
            f"{name} ({type(value).__name__}) has no attention layers to preallocate a KV cache"
            " for (a state-space model keeps a fixed-size state): use the cached loop"
        )
    return value


def static_cache(model, max_len) -> int:
    """``max_len`` for a ``StaticCache`` of ``model``: at least one slot, and slots that fit this
    machine's memory (refused by arithmetic, before allocating)."""
    static_model("model", model)
    max_len = integer("max_len", max_len)
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize
    require_memory(f"a static cache of {max_len} slots", max_len * per_token, model.device)
    return max_len


def static_step(inputs: dict, model, token, position, mask):
    """``(token, position, mask)`` for one ``StaticStep.step`` once they fit its preallocated cache
    (the ``StaticCache`` among ``inputs``): a ``[batch, 1]`` token, its position and the slot it is
    written to inside the cache, and a 0/1 mask over every slot."""
    import torch
    from transformers import StaticCache

    cache = next((v for v in inputs.values() if isinstance(v, StaticCache)), None)
    if cache is None:
        raise TypeError("inputs must hold the preallocated cache (kvlab.decode.new_static_cache)")
    slots = int((getattr(cache, "get_max_length", None) or cache.get_max_cache_shape)())  # < 5.13
    token_id_tensor("token", token, getattr(model.config, "vocab_size", None))
    batch = token.shape[0]
    if token.shape[1] != 1:
        raise ValueError(f"token must have shape [batch, 1], got {list(token.shape)}")
    for what, value, shape in (("position", position, [batch, 1]), ("mask", mask, [batch, slots])):
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
            raise TypeError(f"{what} must be an integer torch.Tensor {shape}, got {_got(value)}")
        if list(value.shape) != shape:
            raise ValueError(
                f"{what} must have shape {shape} (the cache's {slots} slots), got"
                f" {list(value.shape)}"
            )
    slot = inputs.get("cache_position")
    written = int(slot.max()) if slot is not None else int(cache.get_seq_length())
    for what, value in (("position", int(position.max())), ("the slot written", written)):
        if not 0 <= value < slots:
            raise ValueError(f"{what} must be in [0, {slots}), the cache's slots, got {value}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0 (a slot not yet visible) and 1")
    return token, position, mask
