"""Notebooks 01 and 02, the decode loop and cache reuse (sections 9.1 and 9.2): three decode loops.

- ``naive_decode`` reruns the model over the whole growing sequence for every new token.
- ``cached_decode`` runs the prompt once (prefill), keeps each layer's keys and values in a cache,
  and then feeds one token per step.
- ``static_decode`` does the same on a cache preallocated for the whole request, with fixed shapes
  and addresses; on a GPU it compiles the step and replays it as a CUDA graph.

All three take ``(model, input_ids, max_new_tokens, attention_mask=None)``, decode greedily for
exactly ``max_new_tokens`` steps (no stop token), and return only the generated ids ``[batch,
max_new_tokens]``. Left-padded batches work: positions come from the mask, as ``model.generate``
computes them. Each loop is a generator of per-step tokens that trusts its inputs; ``decode_steps``
checks them once and hands the generator out, so ``kvlab.lab.decode_timing.profile_decode`` times
the very code that produces the tokens.

Sources: the Decode and KV Cache chapter, 2026, sections 9.1 and 9.2, on Hugging Face models and
caches (Wolf et al. 2020). The work of each loop, in closed form, is ``kvlab.theory.work``.
"""

from __future__ import annotations

import inspect

import torch

from kvlab import _checks as check
from kvlab.theory.shapes import ModelShape
from kvlab.versions import cache_kwargs, last_logits_only, returned_cache, takes

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
    position = _positions(mask)  # ``cache``: None lets the model make its own DynamicCache
    given = dict({} if cache is None else cache_kwargs(model, cache), **last_logits_only(model))
    out = model(input_ids, attention_mask=mask, position_ids=position, use_cache=True, **given)
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


@torch.inference_mode()
def _static_steps(model, input_ids, max_new_tokens, mask, compile=None):
    batch, prompt = input_ids.shape
    cache = new_static_cache(model, prompt + max_new_tokens)
    # The mask spans the whole cache; a slot becomes visible when its token is written.
    full = torch.zeros((batch, prompt + max_new_tokens), dtype=mask.dtype, device=mask.device)
    full[:, :prompt] = mask
    position = _positions(mask)
    slots = torch.arange(prompt, device=input_ids.device)
    prefill = dict(_static_inputs(model, cache, slots), **last_logits_only(model))
    out = model(input_ids, attention_mask=full, position_ids=position, use_cache=True, **prefill)
    token = _greedy(out.logits)
    yield token
    slot = slots[-1:].clone()  # updated in place: the compiled step sees one address throughout
    compile = input_ids.device.type == "cuda" if compile is None else compile
    step = StaticStep(model, _static_inputs(model, cache, slot), compile)
    position = position[:, -1:].clone()
    # The hot loop: three in-place updates and one step; all checked and allocated before it.
    for i in range(max_new_tokens - 1):
        full[:, prompt + i] = 1
        position += 1
        slot += 1
        token = step.advance(token, position, full).clone()  # a CUDA graph reuses its output buffer
        yield token


def _positions(mask):
    """Each token's position in its own sequence, left padding skipped (as ``generate`` does)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _greedy(logits):
    return logits[:, -1].argmax(dim=-1, keepdim=True)


def _static_inputs(model, cache, slots) -> dict:
    """What generate passes with a static cache: the cache, and ``cache_position`` (the slots
    written) where the forward declares it (else the cache keeps it, so no step recompiles)."""
    with_slots = {"cache_position": slots} if takes(model, "cache_position") else {}
    return dict(cache_kwargs(model, cache), **with_slots)


def new_static_cache(model, max_len: int):
    """transformers' ``StaticCache`` for ``model``: ``max_len`` slots per layer, allocated now."""
    from transformers import StaticCache

    return StaticCache(max_cache_len=check.static_cache(model, max_len), config=model.config)


# --- the optimized step --------------------------------------------------------------------------

# Compiled whole: a graph break would split the step into pieces that CUDA graphs cannot replay as
# one, and a recompilation per step (a cache length read as a Python int, say) would make the
# "optimized" loop slower than the cached one. tests/test_decode.py holds the step to one graph and
# no recompilation over 20 steps for every architecture in kvlab.lab.models.ARCHITECTURES.
COMPILE_OPTIONS = dict(mode="reduce-overhead", fullgraph=True)


class StaticStep:
    """One decode step on a preallocated cache, with every input at a fixed shape and address.

    With ``compile`` it is compiled with ``mode="reduce-overhead"``: torch.compile fuses what it can
    and, on a GPU, replays the step as one CUDA graph (one launch, not hundreds of kernels). The
    first call pays for compilation and capture; later calls skip the guards, which cannot change.
    """

    def __init__(self, model, inputs: dict, compile: bool):
        check.flag("compile", compile), check.static_model("model", model)
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
        return self.advance(*check.static_step(self.inputs, self.model, token, position, mask))

    def advance(self, token, position, mask):
        """``step`` on inputs checked once by the caller: the loop's fixed tensors."""
        if self.compiled is None:
            return self._forward(token, position, mask)
        self.calls += 1  # the first call compiles and guards; later ones skip the unchanging guards
        if self.calls == 1 or not _SKIPS_GUARDS:
            return self.compiled(token, position, mask)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return self.compiled(token, position, mask)


_SKIPS_GUARDS = "skip_guard_eval_unsafe" in inspect.signature(torch.compiler.set_stance).parameters


# --- the doors: every argument checked once, then the loop ----------------------------------------

METHODS = ("naive", "cached", "static")
_STEPS = {"naive": _naive_steps, "cached": _cached_steps, "static": _static_steps}


def decode_steps(method, model, input_ids, max_new_tokens, attention_mask=None, **options):
    """The loop ``method`` (one of ``METHODS``) as a generator of ``[batch, 1]`` tokens, checked
    before the generator exists; options (``cache=`` for ``cached``, ``compile=`` for ``static``)
    pass through. The first token comes out of prefill, each later one out of one decode step."""
    args = (model, input_ids, max_new_tokens)
    mask = check.decode_call(method, METHODS, ModelShape, *args, attention_mask, **options)
    return _STEPS[method](*args, mask, **options) if max_new_tokens else iter(())


def _run(method, model, input_ids, max_new_tokens, attention_mask, **options):
    tokens = list(decode_steps(method, model, input_ids, max_new_tokens, attention_mask, **options))
    return torch.cat(tokens, dim=1) if tokens else input_ids[:, :0].clone()


def naive_decode(model, input_ids, max_new_tokens, attention_mask=None):
    """Greedy decode that reruns the model over the full sequence for every token (section 9.2):
    ``kvlab.theory.work.positions_processed(P, G)`` token positions."""
    return _run("naive", model, input_ids, max_new_tokens, attention_mask)


def cached_decode(model, input_ids, max_new_tokens, attention_mask=None, cache=None):
    """Greedy decode with a KV cache: prefill once, then one token per step (sections 9.1 and 9.2),
    in transformers' ``DynamicCache``, or in ``cache``, a fresh transformers ``Cache`` (section 9.7:
    the windowed, sink, quantized and latent caches of ``kvlab.cache``)."""
    return _run("cached", model, input_ids, max_new_tokens, attention_mask, cache=cache)


def static_decode(model, input_ids, max_new_tokens, attention_mask=None, compile=None):
    """Greedy decode on a ``StaticCache`` of prompt plus output slots, allocated once, every step's
    inputs of one shape at one address (the optimized loop of 9.2). ``compile`` (default: on a GPU
    only) compiles the step into one CUDA graph (``StaticStep``)."""
    return _run("static", model, input_ids, max_new_tokens, attention_mask, compile=compile)
