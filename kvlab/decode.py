"""Notebooks 01 and 02, the decode loop and cache reuse (sections 9.1 and 9.2): three decode loops.

- ``naive_decode`` reruns the model over the whole growing sequence for every new token.
- ``cached_decode`` runs the prompt once (prefill), keeps each layer's keys and values in a cache,
  and then feeds one token per step.
- ``static_decode`` does the same on a cache preallocated for the whole request, with fixed shapes
  and addresses; on a GPU it compiles the step and replays it as a CUDA graph.

All three take ``(model, input_ids, max_new_tokens, attention_mask=None)``, decode greedily for
exactly ``max_new_tokens`` steps (no stop token), and return only the generated ids ``[batch,
max_new_tokens]``. Left-padded batches work: positions come from the mask, as ``model.generate``
computes them.

Each loop is written as a generator of per-step tokens; ``decode_steps`` hands that generator out
(validated), so ``kvlab.lab.decode_timing.profile_decode`` times the very code that produces the
tokens. The loops follow the Decode and KV Cache chapter, 2026, sections 9.1 and 9.2, on Hugging
Face models and caches (Wolf et al. 2020); the work each does, in closed form, is
``kvlab.theory.work``; CUDA-graph replay is the PyTorch CUDA Graphs documentation's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from kvlab._checks import causal_lm, flag, integer, one_of, require_memory
from kvlab.versions import cache_kwargs, last_logits_only, returned_cache, takes

METHODS = ("naive", "cached", "static")


# --- input checks and the plumbing shared by the loops ------------------------------------------


def _validate(input_ids, max_new_tokens, attention_mask):
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}"
        )
    if (
        input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or input_ids.dtype == torch.bool
    ):
        raise TypeError(
            f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}"
        )
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids must have shape [batch, prompt_length >= 1], got {list(input_ids.shape)}"
        )
    integer("max_new_tokens", max_new_tokens, 0)
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}"
        )
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {list(input_ids.shape)}, "
            f"got {list(attention_mask.shape)}"
        )
    if attention_mask.is_complex() or not bool(
        ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[:3].tolist()
        raise ValueError(
            f"attention_mask must hold only 0 (padding) and 1 (token), got values such as {odd}"
        )
    mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError("attention_mask must be left-padded: each row is zeros, then ones")
    if not bool(mask[:, -1].all()):
        raise ValueError("attention_mask: every sequence needs at least one token (a 1 in its row)")
    return mask


def _positions(mask):
    """Each token's position in its own sequence, ignoring left padding (as ``generate`` computes
    it)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _greedy(logits):
    return logits[:, -1].argmax(dim=-1, keepdim=True)


def _empty(input_ids):
    return torch.empty((input_ids.shape[0], 0), dtype=input_ids.dtype, device=input_ids.device)


# --- the three loops, as generators of [batch, 1] tokens ----------------------------------------


@torch.inference_mode()
def _naive_steps(model, input_ids, max_new_tokens, mask):
    ids, last = input_ids, last_logits_only(model)
    for _ in range(max_new_tokens):
        logits = model(
            ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False, **last
        ).logits
        token = _greedy(logits)
        yield token
        ids = torch.cat([ids, token], dim=1)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)


@torch.inference_mode()
def _cached_steps(model, input_ids, max_new_tokens, mask, cache=None):
    position = _positions(mask)
    # ``cache``: a transformers Cache to fill instead of the model's default (section 9.7's
    # windowed, sink and quantized caches); None lets the model create its own DynamicCache.
    given = {} if cache is None else cache_kwargs(model, cache)
    out = model(
        input_ids,
        attention_mask=mask,
        position_ids=position,
        use_cache=True,
        **given,
        **last_logits_only(model),
    )
    kw = cache_kwargs(model, returned_cache(out))
    token = _greedy(out.logits)
    yield token
    position = position[:, -1:]
    for _ in range(max_new_tokens - 1):
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        position = position + 1
        out = model(token, attention_mask=mask, position_ids=position, use_cache=True, **kw)
        token = _greedy(out.logits)
        yield token


# The optimized step is compiled whole: a graph break would split it into pieces that CUDA graphs
# cannot replay as one, and a recompilation per step (a cache length read as a Python int, say)
# would make the "optimized" loop slower than the cached one. tests/test_decode.py holds the step to
# one graph and no recompilation over 20 steps for every architecture in
# kvlab.lab.models.ARCHITECTURES.
COMPILE_OPTIONS = dict(mode="reduce-overhead", fullgraph=True)


class StaticStep:
    """One decode step on a preallocated cache, with every input at a fixed shape and address.

    With ``compile`` the step is compiled with ``mode="reduce-overhead"``: torch.compile fuses what
    it can and, on a GPU, replays the whole step as one CUDA graph, so the CPU launches one graph
    instead of hundreds of kernels. The first call pays for compilation (and, later, graph capture);
    every later call skips the compiled code's guards, since nothing they check can change (below).
    """

    def __init__(self, model, inputs: dict, compile: bool):
        flag("compile", compile)
        self.model, self.inputs = model, inputs
        # torch.compile keeps what it compiled with the code of ``_forward``, not with this object:
        # a later request with the same shapes on the same model reuses it and compiles nothing.
        self.compiled = torch.compile(self._forward, **COMPILE_OPTIONS) if compile else None
        self.calls = 0

    def _forward(self, token, position, mask):
        logits = self.model(
            token, attention_mask=mask, position_ids=position, use_cache=True, **self.inputs
        ).logits
        return _greedy(logits)

    def step(self, token, position, mask):
        """The next greedy token ``[batch, 1]`` after ``token``, written into the cache in place."""
        if self.compiled is None:
            return self._forward(token, position, mask)
        self.calls += 1
        if self.calls == 1:
            return self.compiled(token, position, mask)
        # Before running compiled code, torch.compile checks its guards (shapes, dtypes, the
        # modules' attributes) on every call: a validation per step. Every input here keeps its
        # shape, dtype and address, and the first call compiled for exactly them, so that check can
        # be skipped.
        with _without_guards():
            return self.compiled(token, position, mask)


def _without_guards():
    """torch.compile's stance that runs only the guards telling compiled variants apart (a plain
    context on a torch without it)."""
    if not _can_skip_guards():
        return contextlib.nullcontext()
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


@functools.cache
def _can_skip_guards() -> bool:
    return "skip_guard_eval_unsafe" in inspect.signature(torch.compiler.set_stance).parameters


def new_static_cache(model, max_len: int):
    """transformers' ``StaticCache`` for ``model`` with ``max_len`` slots per layer, allocated up
    front."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


@torch.inference_mode()
def _require_cache_memory(model, batch: int, tokens: int) -> None:
    """A preallocated cache of ``tokens`` per sequence must fit in free memory (refused by
    arithmetic)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=model.dtype).element_size()
    require_memory(
        f"a static cache of {batch} x {tokens} tokens",
        2 * config.num_hidden_layers * batch * tokens * heads * head_dim * element,
        model.device,
    )


@torch.inference_mode()
def _static_steps(model, input_ids, max_new_tokens, mask, compile=None):
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    if compile is None:
        compile = input_ids.device.type == "cuda"
    cache = new_static_cache(model, total)
    # The mask covers the whole cache from the start; a slot becomes visible when its token is
    # written.
    full_mask = torch.zeros((batch, total), dtype=mask.dtype, device=mask.device)
    full_mask[:, :prompt] = mask
    position = _positions(mask)
    # What transformers' own generate passes with a static cache: the cache, and ``cache_position``
    # (the slots written) to a model whose forward still declares it; the StaticCache of the
    # supported releases otherwise keeps the write position itself, in a tensor, so the step never
    # recompiles.
    slots = torch.arange(prompt, device=input_ids.device)
    with_slots = takes(model, "cache_position")
    prefill = dict(cache_kwargs(model, cache), **({"cache_position": slots} if with_slots else {}))
    out = model(
        input_ids,
        attention_mask=full_mask,
        position_ids=position,
        use_cache=True,
        **prefill,
        **last_logits_only(model),
    )
    token = _greedy(out.logits)
    yield token
    slot = slots[-1:].clone()  # updated in place: the compiled step sees one address throughout
    step = StaticStep(
        model,
        dict(cache_kwargs(model, cache), **({"cache_position": slot} if with_slots else {})),
        compile,
    )
    position = position[:, -1:].clone()
    # The hot loop: three in-place updates of fixed tensors and one call of the step; everything was
    # validated, allocated and (when compiling) traced before it.
    for i in range(max_new_tokens - 1):
        full_mask[:, prompt + i] = 1
        position += 1
        slot += 1
        token = step.step(
            token, position, full_mask
        ).clone()  # a CUDA graph reuses its output buffer
        yield token


_STEPS = {"naive": _naive_steps, "cached": _cached_steps, "static": _static_steps}


def _check_model_inputs(model, input_ids, cache=None, max_new_tokens=0) -> None:
    """Token ids the model has embeddings for (a GPU would hit a device-side assert otherwise), and
    a cache that starts empty (the loop prefills it with this prompt)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if (
        vocab is not None
        and input_ids.numel()
        and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab)
    ):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab)].flatten()[:3].tolist()
        raise ValueError(
            f"input_ids must be token ids in [0, {vocab}) (the model's vocab_size), got {bad}"
        )
    learned = getattr(
        getattr(model, "transformer", None), "wpe", None
    )  # GPT-2's absolute position table
    if (
        isinstance(learned, torch.nn.Embedding)
        and input_ids.shape[1] + max_new_tokens > learned.num_embeddings
    ):
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) must be <= "
            f"{learned.num_embeddings}, the positions this model has embeddings for"
        )
    if cache is not None:
        from transformers.cache_utils import Cache

        if not isinstance(cache, Cache):
            raise TypeError(
                "cache must be a transformers Cache (e.g. kvlab.cache.window.SinkCache), got "
                f"{type(cache).__name__}"
            )
        layers, wanted = (
            getattr(cache, "layers", None),
            getattr(model.config, "num_hidden_layers", None),
        )
        if layers and wanted is not None and len(layers) != wanted:
            raise ValueError(
                f"cache has {len(layers)} layers but the model has {wanted}: build the cache for "
                "this model"
            )
        if cache.get_seq_length() != 0:
            raise ValueError(
                "cache must be empty (a fresh one per call), but it holds "
                f"{cache.get_seq_length()} tokens"
            )


def decode_steps(method, model, input_ids, max_new_tokens, attention_mask=None, **options):
    """The loop ``method`` (one of ``METHODS``) as a generator of ``[batch, 1]`` tokens, one per
    step.

    Everything is validated here, before the generator exists; the first token comes out of prefill,
    each later one out of one decode step. Options (``cache=`` for ``cached``, ``compile=`` for
    ``static``) pass through. ``kvlab.lab.decode_timing.profile_decode`` times each step of it.
    """
    one_of("method", method, METHODS)
    causal_lm("model", model)
    if options.get("compile") is not None:
        flag("compile", options["compile"])
    mask = _validate(input_ids, max_new_tokens, attention_mask)
    _check_model_inputs(model, input_ids, options.get("cache"), max_new_tokens)
    compile = options.get("compile")
    if compile is not None and not isinstance(compile, bool):
        raise TypeError(
            f"compile must be True, False or None (compile on a GPU only), got {compile!r}"
        )
    if method == "static":
        _require_cache_memory(model, input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
    if max_new_tokens == 0:
        return iter(())
    return _STEPS[method](model, input_ids, max_new_tokens, mask, **options)


def _run(method, model, input_ids, max_new_tokens, attention_mask, **options):
    tokens = list(decode_steps(method, model, input_ids, max_new_tokens, attention_mask, **options))
    return torch.cat(tokens, dim=1) if tokens else _empty(input_ids)


def naive_decode(model, input_ids, max_new_tokens, attention_mask=None):
    """Greedy decode that reruns the model over the full sequence for every token (section 9.2).

    Processes ``kvlab.theory.work.positions_processed(P, G)`` token positions. Returns
    ``[batch, max_new_tokens]``.
    """
    return _run("naive", model, input_ids, max_new_tokens, attention_mask)


def cached_decode(model, input_ids, max_new_tokens, attention_mask=None, cache=None):
    """Greedy decode with a KV cache: prefill once, then one token per step (sections 9.1 and 9.2).

    By default the model's own cache class (transformers' ``DynamicCache``) grows by one position
    per layer per step. ``cache`` passes a fresh transformers ``Cache`` to fill instead (section
    9.7: the windowed, sink, quantized and latent caches of ``kvlab.cache``). Returns ``[batch,
    max_new_tokens]``.
    """
    return _run("cached", model, input_ids, max_new_tokens, attention_mask, cache=cache)


def static_decode(model, input_ids, max_new_tokens, attention_mask=None, compile=None):
    """Greedy decode on a cache preallocated for prompt plus output (the optimized loop of 9.2).

    transformers' ``StaticCache`` holds ``P + max_new_tokens`` slots per layer from the start, so no
    step allocates, and every step sees inputs of the same shape at the same address. ``compile``
    (default: on a GPU only) wraps the step in ``torch.compile(mode="reduce-overhead")``, which
    captures it as a CUDA graph. Returns ``[batch, max_new_tokens]``.
    """
    return _run("static", model, input_ids, max_new_tokens, attention_mask, compile=compile)
