"""Three decode loops over a Hugging Face causal LM, and the work each one does (sections 9.1 and 9.2).

- ``naive_decode`` reruns the model over the whole growing sequence for every new token.
- ``cached_decode`` runs the prompt once (prefill), keeps each layer's keys and values in a cache,
  and then feeds one token per step.
- ``static_decode`` does the same on a cache preallocated for the whole request, with fixed shapes
  and addresses; on a GPU it compiles the step and replays it as a CUDA graph.

All three take ``(model, input_ids, max_new_tokens, attention_mask=None)``, decode greedily for exactly
``max_new_tokens`` steps (no stop token), and return only the generated ids ``[batch, max_new_tokens]``.
Left-padded batches work: positions come from the mask, as ``model.generate`` computes them.

Each loop is written as a generator of per-step tokens, so ``profile_decode`` can time the very same
code that produces the tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvlab._checks import integer
from kvlab.versions import cache_kwargs, returned_cache, takes

METHODS = ("naive", "cached", "static")


# --- the work each loop does (section 9.1) -------------------------------------------------------

def _check_pg(P, G, cached=False):
    integer("P", P, 1)
    integer("G", G, 0)
    if not isinstance(cached, bool):
        raise TypeError(f"cached must be True or False, got {cached!r}")


def positions_processed(P: int, G: int, cached: bool = False) -> int:
    """Token positions the per-token layer work (projections, MLP) touches to generate G tokens.

    Without a cache the j-th pass reruns all P + j positions: sum_{j<G} (P + j) = G*P + G(G-1)/2.
    With a cache, prefill runs P positions and each of the G - 1 later steps runs one: P + G - 1.
    """
    _check_pg(P, G, cached)
    if G == 0:
        return 0
    return P + G - 1 if cached else G * P + G * (G - 1) // 2


def attention_work(P: int, G: int, cached: bool = False) -> int:
    """Query-key pairs dense full-prefix attention scores to generate G tokens (section 9.1).

    Without a cache each pass over n = P + j positions scores n * n pairs:
    sum_{j<G} (P + j)^2 = G P^2 + P G (G-1) + G (G-1)(2G-1)/6.
    With a cache, prefill scores P * P pairs and the j-th decode step P + j (its one query against
    the history including itself): P^2 + (G-1) P + G (G-1)/2.
    """
    _check_pg(P, G, cached)
    if G == 0:
        return 0
    if cached:
        return P * P + (G - 1) * P + G * (G - 1) // 2
    return G * P * P + P * G * (G - 1) + G * (G - 1) * (2 * G - 1) // 6


# --- input checks and the plumbing shared by the loops ------------------------------------------

def _validate(input_ids, max_new_tokens, attention_mask):
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [batch, prompt_length >= 1], got {list(input_ids.shape)}")
    integer("max_new_tokens", max_new_tokens, 0)
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {list(input_ids.shape)}, "
            f"got {list(attention_mask.shape)}"
        )
    if attention_mask.is_complex() or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[:3].tolist()
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), got values such as {odd}")
    mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError("attention_mask must be left-padded: each row is zeros, then ones")
    if not bool(mask[:, -1].all()):
        raise ValueError("attention_mask: every sequence needs at least one token (a 1 in its row)")
    return mask


def _positions(mask):
    """Each token's position in its own sequence, ignoring left padding (as ``generate`` computes it)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _last_logits_only(model) -> dict:
    """Ask for the last position's logits only: a greedy pick needs no more, and a long prompt's
    full [batch, P, vocab] logits would cost more memory than its KV cache."""
    return {"logits_to_keep": 1} if takes(model, "logits_to_keep") else {}


def _greedy(logits):
    return logits[:, -1].argmax(dim=-1, keepdim=True)


def _empty(input_ids):
    return torch.empty((input_ids.shape[0], 0), dtype=input_ids.dtype, device=input_ids.device)


# --- the three loops, as generators of [batch, 1] tokens ----------------------------------------

@torch.inference_mode()
def _naive_steps(model, input_ids, max_new_tokens, mask):
    ids, last = input_ids, _last_logits_only(model)
    for _ in range(max_new_tokens):
        logits = model(ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False, **last).logits
        token = _greedy(logits)
        yield token
        ids = torch.cat([ids, token], dim=1)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)


@torch.inference_mode()
def _cached_steps(model, input_ids, max_new_tokens, mask, cache=None):
    position = _positions(mask)
    # ``cache``: a transformers Cache to fill instead of the model's default (section 9.7's windowed,
    # sink and quantized caches); None lets the model create its own DynamicCache.
    given = {} if cache is None else cache_kwargs(model, cache)
    out = model(input_ids, attention_mask=mask, position_ids=position, use_cache=True, **given,
                **_last_logits_only(model))
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
# cannot replay as one, and a recompilation per step (a cache length read as a Python int, say) would
# make the "optimized" loop slower than the cached one. tests/test_decode.py holds the step to one
# graph and no recompilation over 20 steps for every architecture in kvlab.lab.models.ARCHITECTURES.
COMPILE_OPTIONS = dict(mode="reduce-overhead", fullgraph=True)


class _StaticStep:
    """One decode step on a preallocated cache, with every input at a fixed shape and address.

    On a GPU the step is compiled with ``mode="reduce-overhead"``: torch.compile fuses what it can and
    replays the whole step as one CUDA graph, so the CPU launches one graph instead of hundreds of
    kernels. The first calls pay for compilation and graph capture.
    """

    def __init__(self, model, inputs: dict, compile: bool):
        self.model, self.inputs = model, inputs
        self.step = torch.compile(self._forward, **COMPILE_OPTIONS) if compile else self._forward

    def _forward(self, token, position, mask):
        logits = self.model(token, attention_mask=mask, position_ids=position, use_cache=True, **self.inputs).logits
        return _greedy(logits)


def _static_cache(model, batch, max_len):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


@torch.inference_mode()
def _require_cache_memory(model, batch: int, tokens: int) -> None:
    """A preallocated cache of ``tokens`` per sequence must fit in free memory (refused by arithmetic)."""
    from kvlab._checks import require_memory

    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=model.dtype).element_size()
    require_memory(f"a static cache of {batch} x {tokens} tokens",
                   2 * config.num_hidden_layers * batch * tokens * heads * head_dim * element, model.device)


def _static_steps(model, input_ids, max_new_tokens, mask, compile=None):
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    if compile is None:
        compile = input_ids.device.type == "cuda"
    _require_cache_memory(model, batch, total)
    cache = _static_cache(model, batch, total)
    # The mask covers the whole cache from the start; a slot becomes visible when its token is written.
    full_mask = torch.zeros((batch, total), dtype=mask.dtype, device=mask.device)
    full_mask[:, :prompt] = mask
    position = _positions(mask)
    # What transformers' own generate passes with a static cache: the cache, and ``cache_position``
    # (the slots written) to a model whose forward still declares it; the StaticCache of the supported
    # releases otherwise keeps the write position itself, in a tensor, so the step never recompiles.
    slots = torch.arange(prompt, device=input_ids.device)
    with_slots = takes(model, "cache_position")
    prefill = dict(cache_kwargs(model, cache), **({"cache_position": slots} if with_slots else {}))
    out = model(input_ids, attention_mask=full_mask, position_ids=position, use_cache=True, **prefill,
                **_last_logits_only(model))
    token = _greedy(out.logits)
    yield token
    slot = slots[-1:].clone()  # updated in place: the compiled step sees one address throughout
    step = _StaticStep(model, dict(cache_kwargs(model, cache), **({"cache_position": slot} if with_slots else {})),
                       compile)
    position = position[:, -1:].clone()
    for i in range(max_new_tokens - 1):
        full_mask[:, prompt + i] = 1
        position += 1
        slot += 1
        token = step.step(token, position, full_mask).clone()
        yield token


_STEPS = {"naive": _naive_steps, "cached": _cached_steps, "static": _static_steps}


def _check_model_inputs(model, input_ids, cache=None, max_new_tokens=0) -> None:
    """Token ids the model has embeddings for (a GPU would hit a device-side assert otherwise), and a
    cache that starts empty (the loop prefills it with this prompt)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab)].flatten()[:3].tolist()
        raise ValueError(f"input_ids must be token ids in [0, {vocab}) (the model's vocab_size), got {bad}")
    learned = getattr(getattr(model, "transformer", None), "wpe", None)  # GPT-2's absolute position table
    if isinstance(learned, torch.nn.Embedding) and input_ids.shape[1] + max_new_tokens > learned.num_embeddings:
        raise ValueError(f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) must be <= "
                         f"{learned.num_embeddings}, the positions this model has embeddings for")
    if cache is not None:
        from transformers.cache_utils import Cache

        if not isinstance(cache, Cache):
            raise TypeError(f"cache must be a transformers Cache (e.g. kvlab.cache.longctx.SinkCache), got "
                            f"{type(cache).__name__}")
        layers, wanted = getattr(cache, "layers", None), getattr(model.config, "num_hidden_layers", None)
        if layers and wanted is not None and len(layers) != wanted:
            raise ValueError(f"cache has {len(layers)} layers but the model has {wanted}: build the cache for "
                             "this model")
        if cache.get_seq_length() != 0:
            raise ValueError(f"cache must be empty (a fresh one per call), but it holds "
                             f"{cache.get_seq_length()} tokens")


def _run(method, model, input_ids, max_new_tokens, attention_mask, **options):
    mask = _validate(input_ids, max_new_tokens, attention_mask)
    _check_model_inputs(model, input_ids, options.get("cache"), max_new_tokens)
    if max_new_tokens == 0:
        return _empty(input_ids)
    tokens = list(_STEPS[method](model, input_ids, max_new_tokens, mask, **options))
    return torch.cat(tokens, dim=1)


def naive_decode(model, input_ids, max_new_tokens, attention_mask=None):
    """Greedy decode that reruns the model over the full sequence for every token (section 9.2).

    Processes ``positions_processed(P, G)`` token positions. Returns ``[batch, max_new_tokens]``.
    """
    return _run("naive", model, input_ids, max_new_tokens, attention_mask)


def cached_decode(model, input_ids, max_new_tokens, attention_mask=None, cache=None):
    """Greedy decode with a KV cache: prefill once, then one token per step (sections 9.1 and 9.2).

    By default the model's own cache class (transformers' ``DynamicCache``) grows by one position per
    layer per step. ``cache`` passes a fresh transformers ``Cache`` to fill instead (section 9.7:
    ``kvlab.cache.longctx``'s windowed, sink, quantized and latent caches). Returns ``[batch, max_new_tokens]``.
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


# --- timing the loops (section 9.2) --------------------------------------------------------------

@dataclass(frozen=True)
class DecodeProfile:
    """Wall-clock anatomy of one decode: time to first token, then one time per later step."""

    method: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    ttft: float
    step_times: tuple[float, ...]
    tokens: torch.Tensor

    @property
    def total(self) -> float:
        return self.ttft + sum(self.step_times)

    @property
    def tpot(self) -> float:
        """Time per output token after the first (the mean decode step); nan with one token."""
        return sum(self.step_times) / len(self.step_times) if self.step_times else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the whole request, all sequences of the batch."""
        return self.batch * self.new_tokens / self.total if self.total > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second of the decode steps alone (prefill excluded)."""
        return self.batch / self.tpot if self.step_times else float("nan")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_decode(model, input_ids, max_new_tokens, method="cached", attention_mask=None, **options):
    """Run one decode with ``method`` in ``METHODS`` and time every step of it.

    The first interval (time to first token) covers prefill and the first greedy pick; each later
    interval one decode step. The device is synchronised at every step, as a streaming server must
    before it can send the token. Options (``compile=`` for ``static``) pass through.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    mask = _validate(input_ids, max_new_tokens, attention_mask)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1 for profile_decode, got {max_new_tokens}")
    _check_model_inputs(model, input_ids, options.get("cache"), max_new_tokens)
    steps = _STEPS[method](model, input_ids, max_new_tokens, mask, **options)
    times, tokens = [], []
    _sync(input_ids.device)
    start = time.perf_counter()
    for token in steps:
        _sync(input_ids.device)
        now = time.perf_counter()
        times.append(now - start)
        tokens.append(token)
        start = now
    return DecodeProfile(method, input_ids.shape[0], input_ids.shape[1], max_new_tokens,
                         times[0], tuple(times[1:]), torch.cat(tokens, dim=1))


# --- compilation: a one-time cost against a per-step gain (section 9.2) ----------------------------

def break_even_tokens(compile_seconds: float, step_gain: float) -> float:
    """Output tokens after which a one-time cost of ``compile_seconds`` is repaid by saving
    ``step_gain`` seconds per decode step: compile_seconds / step_gain (section 9.2); ``inf`` when
    the compiled step is not faster. Seconds of compilation against milliseconds per step give
    thousands of tokens, which is why engines compile once at start-up, not per request.
    """
    for name, value in (("compile_seconds", compile_seconds), ("step_gain", step_gain)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise TypeError(f"{name} must be a real number of seconds, got {value!r}")
    if compile_seconds < 0:
        raise ValueError(f"compile_seconds must be >= 0, got {compile_seconds!r}")
    return compile_seconds / step_gain if step_gain > 0 else float("inf")


@dataclass(frozen=True)
class CompileBreakEven:
    """What compilation cost and what it saves per step, from two profiles of one request (section 9.2)."""

    compile_seconds: float
    eager_step: float
    compiled_step: float

    @property
    def step_gain(self) -> float:
        return self.eager_step - self.compiled_step

    @property
    def tokens(self) -> float:
        return break_even_tokens(self.compile_seconds, self.step_gain)


def compile_break_even(eager: DecodeProfile, compiled: DecodeProfile, warm: int = 8) -> CompileBreakEven:
    """Compile cost and per-step gain measured from an eager and a compiled profile of one request.

    Steady steps are the medians after the first ``warm`` steps. The compile (and, on a GPU, graph
    capture) cost is the compiled run's extra time net of the gain its steady steps already made:
    (compiled total - eager total) + tokens x gain, so the break-even is exactly where the two runs'
    cumulative times, extrapolated at their steady steps, cross. It depends on ``warm`` only through
    the two medians.
    """
    import statistics

    warm = integer("warm", warm, 1)
    for name, p in (("eager", eager), ("compiled", compiled)):
        if not isinstance(p, DecodeProfile):
            raise TypeError(f"{name} must be a DecodeProfile (from profile_decode), got {type(p).__name__}")
        if len(p.step_times) <= warm:
            raise ValueError(f"{name} has {len(p.step_times)} decode steps; warm={warm} needs more than {warm}")
    if len(eager.step_times) != len(compiled.step_times):
        raise ValueError(f"eager and compiled must decode the same number of tokens, got "
                         f"{len(eager.step_times) + 1} and {len(compiled.step_times) + 1}")
    t_eager = statistics.median(eager.step_times[warm:])
    t_compiled = statistics.median(compiled.step_times[warm:])
    tokens = len(eager.step_times) + 1
    cost = (compiled.total - eager.total) + tokens * (t_eager - t_compiled)
    return CompileBreakEven(max(0.0, cost), t_eager, t_compiled)
