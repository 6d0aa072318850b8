"""Notebooks 05, 06 and 11: the serving stack's compound argument checks, and the engine's
invariants.

Each check is called once, at a public entry point of :mod:`kvlab.serving`, and is built from
:mod:`kvlab._checks`' vocabulary; what the entry point calls after its checks trusts its inputs.
"""

from __future__ import annotations

import torch

from kvlab import kernels
from kvlab._checks import (
    causal_lm,
    flag,
    function,
    integer,
    integers,
    one_of,
    real,
    require_memory,
    token_ids,
)
from kvlab.cache.blocks import PREEMPTION_MODES, OutOfBlocksError
from kvlab.cache.paged import PagedKVCache
from kvlab.kernels.configs import paged_prefill_config
from kvlab.kernels.paged_prefill import paged_prefill_kernel
from kvlab.kernels.shared_memory import require_fits

ATTENTION_PATHS = ("kernel", "gather", "reference")  # kvlab.serving.attention's three paths
SUPPORTED_MODELS = ("llama", "qwen2", "mistral")
REBUILD = "build the cache with kvlab.serving.paged_decode.cache_for(model, ...)"


def request(r) -> None:
    """A :class:`~kvlab.serving.request.Request` built by hand."""
    integer("id", r.id, 0)
    r.token_ids = token_ids("token_ids", r.token_ids)
    integer("max_new_tokens", r.max_new_tokens, 1)  # a request that generates nothing never ends
    if not isinstance(r.stop, frozenset):
        raise TypeError(f"stop must be a frozenset of token ids, got {type(r.stop).__name__}")
    token_ids("stop", sorted(r.stop, key=repr), empty=True)
    real("arrival", r.arrival)


def scheduler(preemption, max_batch, max_batched_tokens, watermark_blocks, log, speculate):
    """The scheduler's limits, checked: (max_batch, max_batched_tokens, watermark_blocks, log)."""
    one_of("preemption", preemption, PREEMPTION_MODES)
    integer("speculate", speculate, 0)
    return (
        integer("max_batch", max_batch),
        integer("max_batched_tokens", max_batched_tokens),
        integer("watermark_blocks", watermark_blocks, 0),
        function("log", log) if log is not None else lambda r, kind, detail=None: None,
    )


def runner(model, cache, attention: str, cuda_graphs, max_batch, geometry) -> int:
    """``ModelRunner``'s arguments, and that the prefill kernel's program fits this GPU's shared
    memory (a no-op on a CPU); returns ``max_batch``."""
    one_of("attention", attention, ATTENTION_PATHS)
    cache_fits(model, cache, attention, geometry)
    flag("cuda_graphs", cuda_graphs)
    max_batch = integer("max_batch", max_batch)
    prefill_kernel_fits(model, cache.head_dim, cache.block_size, attention)
    return max_batch


def prefill_kernel_fits(model, head_dim: int, block_size: int, attention: str) -> None:
    """The prefill kernel's program fits the shared memory of ``model``'s GPU (a no-op on a CPU,
    and for the other attention paths)."""
    if attention == "kernel":
        group = model.config.num_attention_heads // model.config.num_key_value_heads
        config = paged_prefill_config(
            paged_prefill_kernel, model.dtype, group, head_dim, block_size
        )
        require_fits(config, model.device)


def supported_model(name: str, model):
    """A Hugging Face causal LM of an architecture the engine serves."""
    kind = getattr(causal_lm(name, model).config, "model_type", type(model).__name__)
    if kind not in SUPPORTED_MODELS:
        raise ValueError(
            f"{name} must be one of the architectures {SUPPORTED_MODELS} (rotary positions,"
            f" grouped KV heads), got {kind!r}"
        )
    return model


def window(config) -> int | None:
    """The model's attention window (None: it attends to the whole context)."""
    window = getattr(config, "sliding_window", None)
    on = window is not None and getattr(config, "use_sliding_window", True) is not False
    return int(window) if on else None


def engine(
    model, num_blocks, block_size, max_batch, max_batched_tokens, prefix_caching, preemption,
    kv_budget_bytes, attention, cuda_graphs, watermark, eos_token_id, debug,
):  # fmt: skip
    """``Engine``'s arguments; returns (block_size, max_batch, max_batched_tokens, attention,
    cuda_graphs, watermark, eos ids), the defaults resolved: the kernels and CUDA graphs on a GPU,
    vectorised PyTorch on a CPU, where the kernels run in Triton's interpreter."""
    on_cuda = supported_model("model", model).device.type == "cuda"
    block_size = integer("block_size", block_size)
    max_batch = integer("max_batch", max_batch)
    max_batched_tokens = integer("max_batched_tokens", max_batched_tokens, low=max_batch)
    one_of("preemption", preemption, PREEMPTION_MODES)
    flag("prefix_caching", prefix_caching)
    flag("debug", debug)
    cuda_graphs = on_cuda if cuda_graphs is None else flag("cuda_graphs", cuda_graphs)
    attention = ("kernel" if on_cuda else "gather") if attention is None else attention
    one_of("attention", attention, ATTENTION_PATHS)
    watermark = real("watermark", watermark, 0, 1, high_open=True)
    if num_blocks is not None and kv_budget_bytes is not None:
        raise ValueError(
            f"pass num_blocks ({num_blocks!r}) or kv_budget_bytes ({kv_budget_bytes!r}), not"
            " both: either one sizes the pool"
        )
    config = model.config  # the head dim as kvlab.serving.runner.model_geometry reads it
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kernel_limits(block_size, head_dim, attention)
    prefill_kernel_fits(model, head_dim, block_size, attention)
    if num_blocks is not None:
        integer("num_blocks", num_blocks)
    eos = eos_ids("eos_token_id", eos_token_id, model)
    return block_size, max_batch, max_batched_tokens, attention, cuda_graphs, watermark, eos


def kv_budget(kv_budget_bytes: int, per_block: int, device) -> int:
    integer("kv_budget_bytes", kv_budget_bytes)
    require_memory(f"kv_budget_bytes={kv_budget_bytes:,}", kv_budget_bytes, device)
    if kv_budget_bytes < per_block:
        raise ValueError(
            f"kv_budget_bytes ({kv_budget_bytes:,}) must hold at least one block ({per_block:,}"
            " bytes)"
        )
    return kv_budget_bytes


def stop_ids(name: str, ids, vocab: int) -> frozenset:
    """Stop token ids: None (none), one id, or a list of ids, each in ``[0, vocab)``."""
    if ids is None:
        return frozenset()
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple, set, frozenset)):
        return frozenset([integer(name, ids, low=0, high=vocab)])
    return frozenset(integer(f"{name}[{i}]", t, low=0, high=vocab) for i, t in enumerate(ids))


def eos_ids(name: str, ids, model) -> frozenset:
    """``stop_ids``; ``"auto"``: the ids ``generate`` stops at (the model's generation config)."""
    if isinstance(ids, str) and ids == "auto":
        ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return stop_ids(name, ids, model.config.vocab_size)


def prompt(name: str, prompt, engine) -> list[int]:
    """Token ids the engine's model knows, in one tensor row or a list, that fit its pool."""
    if not isinstance(prompt, (list, tuple, torch.Tensor)):  # a set or a generator has no order
        raise TypeError(f"{name} must be a list of token ids, got {type(prompt).__name__}")
    prompt = token_ids(name, prompt, engine.vocab_size, empty=True)
    if not prompt:
        raise ValueError(f"{name} is empty: a request needs at least one prompt token")
    blocks = -(-len(prompt) // engine.block_size)
    if blocks > engine.num_blocks:
        raise ValueError(
            f"{name} has {len(prompt)} tokens: {blocks} blocks"
            f" ({blocks * engine.bytes_per_block:,} bytes) but the pool holds {engine.num_blocks}"
            f" blocks ({engine.pool_bytes:,} bytes) in all"
        )
    if engine.window is not None and len(prompt) > engine.window:
        raise ValueError(
            f"{name} has {len(prompt)} tokens, more than the model's attention window "
            f"({engine.window}); this engine attends to the whole context"
        )
    return prompt


def add_request(engine, prompt_, max_new_tokens, stop):
    """``Engine.add_request``'s arguments, converted."""
    prompt_ = prompt("prompt", prompt_, engine)
    max_new_tokens = integer("max_new_tokens", max_new_tokens)
    return prompt_, max_new_tokens, stop_ids("stop", stop, engine.vocab_size)


def engine_generate(engine, prompts, max_new_tokens, stop):
    """``Engine.generate``'s arguments: the prompts, one count per prompt, the stop ids."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a non-empty list of token-id lists")
    prompts = [prompt(f"prompts[{i}]", p, engine) for i, p in enumerate(prompts)]
    counts_ = counts(max_new_tokens, len(prompts))
    return prompts, counts_, stop_ids("stop", stop, engine.vocab_size)


def progress(engine, idle_steps: int) -> None:
    """A scheduler that made no progress for three steps with work left (never a normal state)."""
    if idle_steps > 2 and engine.has_work():
        s = engine.scheduler
        raise RuntimeError(
            f"the scheduler made no progress for {idle_steps} steps: "
            f"{len(s.waiting)} waiting, {len(s.running)} running, "
            f"{len(s.swapped)} swapped, {engine.cache.num_free} blocks free"
        )


def counts(max_new_tokens, n: int) -> list[int]:
    """``max_new_tokens``, an int or one per prompt, as one count per prompt."""
    if not isinstance(max_new_tokens, (list, tuple)):
        return [integer("max_new_tokens", max_new_tokens)] * n
    if len(max_new_tokens) != n:
        raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prompts")
    return integers("max_new_tokens", max_new_tokens)


def never_fits(engine, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """Why a request can never run on ``engine`` (None: it can): its stored tokens (all but the
    last new one) exceed the model's attention window or the whole pool."""
    longest = prompt_tokens + max_new_tokens - 1
    blocks = -(-longest // engine.block_size)
    if engine.window is not None and longest > engine.window:
        return f"its {longest} tokens exceed the model's attention window ({engine.window})"
    if blocks > engine.num_blocks:
        return (
            f"it needs {blocks} blocks ({blocks * engine.bytes_per_block:,} bytes: "
            f"{prompt_tokens} prompt + {max_new_tokens - 1} generated tokens stored) "
            f"but the pool has {engine.num_blocks} blocks ({engine.pool_bytes:,} bytes)"
        )
    return None


def engine_requests(requests, engine) -> list:
    """Some of ``engine``'s requests, each once (None: all)."""
    if requests is None:
        return list(engine.requests.values())
    if isinstance(requests, (str, bytes)) or not hasattr(requests, "__iter__"):
        raise TypeError(
            f"requests must be a list of this engine's Requests, got {type(requests).__name__}"
        )
    requests, made = list(requests), {id(r) for r in engine.requests.values()}
    for i, r in enumerate(requests):
        if id(r) not in made:
            raise ValueError(
                f"requests[{i}] must be a Request this engine made (add_request), got {r!r}"
            )
    if len({id(r) for r in requests}) != len(requests):
        raise ValueError(
            f"requests must name each request once, got ids {[r.id for r in requests]}"
        )
    return requests


def kernel_limits(block_size: int, head_dim: int, attention: str) -> None:
    """The Triton kernels' limits, for the paths that use them (the reference checks as the kernel
    does)."""
    block_size, head_dim = integer("block_size", block_size), integer("head_dim", head_dim)
    if attention == "gather":
        return
    if block_size & (block_size - 1):
        raise ValueError(
            f"block_size must be a power of two for attention={attention!r}, got {block_size}; "
            "use attention='gather' for other sizes"
        )
    if head_dim not in kernels.SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"the model's head_dim {head_dim} must be one of {kernels.SUPPORTED_HEAD_DIMS} "
            f"for attention={attention!r}; use attention='gather'"
        )


def cache_fits(model, cache, attention: str, geometry) -> None:
    """``cache`` holds what ``model`` writes (``geometry``: its layers, KV heads and head dim), on
    its device, within the kernels' limits; checked before any layer writes."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(
            f"cache must be a kvlab.cache.paged.PagedKVCache, got {type(cache).__name__}"
        )
    names = ("num_layers", "num_kv_heads", "head_dim", "dtype")
    for name, expected in zip(names, (*geometry, model.dtype)):
        if getattr(cache, name) != expected:
            raise ValueError(
                f"cache.{name} is {getattr(cache, name)} but the model needs {expected}; {REBUILD}"
            )
    kernel_limits(cache.block_size, geometry[2], attention)
    model_device = torch.device(model.device)
    if (cache.device.type, cache.device.index or 0) != (model_device.type, model_device.index or 0):
        raise ValueError(
            f"cache.device is {cache.device} but the model is on {model_device}; {REBUILD}"
        )


def build_step(cache, chunks_, path: str, group: int):
    """``build_step``'s arguments."""
    one_of("path", path, ATTENTION_PATHS)
    integer("group", group, 1)
    chunks(cache, chunks_)


def step_chunks(cache, chunks_, vocab_size: int) -> None:
    """``ModelRunner.run``'s chunks, their token ids known to the model (a token past the
    vocabulary is a device-side assert on a GPU)."""
    chunks(cache, chunks_)
    ids = [t for chunk in chunks_ for t in chunk[2]]
    token_ids("the step's token ids", ids, vocab_size)


def no_step(name: str, step) -> ValueError:
    """The error of ``paged_attention`` called without ``kvlab_step=``."""
    return ValueError(
        f"attention {name!r} needs the kvlab_step= keyword (a StepMetadata), got "
        f"{step!r}; run the model through kvlab.serving.attention.paged_forward"
    )


def heads(step, query, layer: int) -> None:
    """The step was built for the model's query heads per KV head."""
    kv_heads = step.k_pools[layer].shape[2]
    if query.shape[1] != step.group * kv_heads:
        raise ValueError(
            f"the step was built for {step.group} query head(s) per KV head but the model has "
            f"{query.shape[1]} query and {kv_heads} KV heads; pass group= to build_step"
        )


def chunks(cache, chunks_) -> None:
    """Everything the kernels will trust about a step's chunks: live resident sequences, each once,
    committed slots, one-token chunks first."""
    if isinstance(chunks_, (str, bytes)) or not hasattr(chunks_, "__iter__"):
        raise TypeError(
            "chunks must be a list of (seq_id, start, token_ids) chunks, got"
            f" {type(chunks_).__name__}"
        )
    seen, longer = set(), False
    for i, chunk in enumerate(chunks_):
        if not isinstance(chunk, (tuple, list)) or len(chunk) not in (3, 4):
            raise TypeError(
                f"chunks[{i}] must be a (seq_id, start, token_ids) chunk, got {chunk!r}"
            )
        seq_id, start, ids = chunk[:3]
        integer(f"chunks[{i}].num_outputs", (*chunk, 1)[3], 1, max(len(ids), 1) + 1)
        cache.require_in_step(seq_id)  # a live, resident sequence whose layers agree
        start, count = integer(f"chunks[{i}].start", start, 0), len(ids)
        committed = cache.num_computed(seq_id)
        if not 1 <= count <= committed - start:
            raise ValueError(
                f"sequence {seq_id} has {committed - start} committed token(s) from position "
                f"{start} (slots reserved and committed for this step); got a chunk of {count}"
            )
        if seq_id in seen:
            raise ValueError(f"sequence {seq_id} appears twice in one step")
        if count == 1 and longer:
            raise ValueError(
                "one-token chunks must come before longer ones (the decode rows are packed first)"
            )
        seen.add(seq_id)
        longer = longer or count > 1
    if not seen:
        raise ValueError("chunks must name at least one (seq_id, start, token_ids) chunk")


def engine_ready(engine) -> None:
    """What a step relies on: the model still fits the cache (its dtype or device may have changed
    since the engine was built), and every request's sequence is where the scheduler left it."""
    runner, cache, s = engine.runner, engine.cache, engine.scheduler
    cache_fits(engine.model, cache, runner.attention, runner.geometry)
    live = set(cache.sequences())
    recompute = [r for r in s.waiting if r.seq is not None]
    for state, requests in (("resident", s.running), ("swap", s.swapped), ("recompute", recompute)):
        for r in requests:
            if r.seq not in live or cache.state(r.seq) != state:
                raise RuntimeError(
                    f"request {r.id} is {r.state} but its cache sequence {r.seq} is "
                    f"{cache.state(r.seq) if r.seq in live else 'gone'}: a request's "
                    "sequence must change only through the engine (free, preempt and resume "
                    "it by stepping)"
                )


def engine_invariants(engine) -> None:
    """The cache's invariants and each live request's place in it."""
    engine.cache.check()
    live = [r for r in engine.requests.values() if r.seq is not None]
    queued = [*engine.scheduler.waiting, *engine.scheduler.running, *engine.scheduler.swapped]
    _require(len(queued) == len({id(r) for r in queued}), "a request sits in two queues")
    _require(
        {r.seq for r in live} == set(engine.cache.sequences()),
        "the cache's sequences are not the live requests'",
    )
    for r in live:
        held, state = engine.cache.num_tokens(r.seq), engine.cache.state(r.seq)
        _require(
            r.num_tokens - 1 <= held <= r.num_tokens,
            f"request {r.id} holds slots for {held} of its {r.num_tokens} tokens",
        )
        _require(
            (state == "swap") == (r.state == "swapped"),
            f"request {r.id} is {r.state} but its sequence is {state}",
        )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"engine invariant broken: {message}")


# --------------------------------------------------------------------------- the plain loops


def blocks_free(cache, needed: int, what: str | None = None, free: int | None = None) -> None:
    """``needed`` blocks of ``cache`` free (or of ``free``), else :class:`OutOfBlocksError` with
    the bytes."""
    free = cache.num_free if free is None else free
    if needed > free:
        raise OutOfBlocksError(needed, free, cache.num_blocks, cache.bytes_per_block, what)


def prefill(model, cache, seq_id: int, ids, max_tokens):
    """``prefill``'s arguments: (the sequence's tokens, max_tokens), the tokens all known to the
    model, at least as many as it holds slots for, one at least uncomputed."""
    tokens = token_ids("token_ids", ids, model.config.vocab_size)
    cache.require_in_step(seq_id)
    start, held = cache.num_computed(seq_id), cache.num_tokens(seq_id)
    if len(tokens) < held:
        raise ValueError(
            f"token_ids must hold sequence {seq_id}'s {held} tokens (then any new ones), got"
            f" {len(tokens)}"
        )
    if len(tokens) == start:
        raise ValueError(
            f"sequence {seq_id} has no token left to compute; pass token_ids with a new token"
        )
    max_tokens = None if max_tokens is None else integer("max_tokens", max_tokens)
    blocks_free(cache, cache.blocks_to_append(seq_id, len(tokens) - held))
    return tokens, max_tokens


def decode_step(model, cache, seq_ids, ids):
    """``decode_step``'s arguments, converted: each sequence's tokens, one past those computed."""
    seq_ids = integers("seq_ids", seq_ids, 0)
    if not isinstance(ids, (list, tuple)) or len(ids) != len(seq_ids):
        raise ValueError(
            f"token_ids must hold one token list per sequence of seq_ids ({len(seq_ids)}), got"
            f" {ids!r:.80}"
        )
    vocab = model.config.vocab_size
    ids = [token_ids(f"token_ids[{i}]", t, vocab) for i, t in enumerate(ids)]
    decoding(cache, seq_ids, ids)
    return seq_ids, ids


def generate(model, cache, tokens, max_new_tokens, salt, attention, stop, geometry):
    """``paged_decode.generate``'s arguments, converted, and the free blocks it needs: admitting
    the prompt, then the blocks its new tokens grow into (the last is never stored)."""
    one_of("attention", attention, ATTENTION_PATHS)
    cache_fits(model, cache, attention, geometry)
    prefill_kernel_fits(model, cache.head_dim, cache.block_size, attention)
    max_new_tokens = integer("max_new_tokens", max_new_tokens)
    tokens = token_ids("token_ids", tokens, model.config.vocab_size)
    stop = stop_tokens(stop, model.config.vocab_size)
    stored, bs = len(tokens) + max_new_tokens - 1, cache.block_size
    needed = (
        cache.blocks_to_admit(tokens, salt, checked=True) + -(-stored // bs) - -(-len(tokens) // bs)
    )
    what = f"a {len(tokens)}-token prompt and {max_new_tokens} new tokens"
    blocks_free(cache, needed, what)
    return tokens, max_new_tokens, stop


def paged_generate(model, prompts, max_new_tokens, block_size, max_batch, num_blocks):
    """``paged_generate``'s arguments: (prompts, max_new_tokens, block_size, max_batch)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a non-empty list of token-id lists (or 1-D tensors)")
    vocab = causal_lm("model", model).config.vocab_size
    prompts = [token_ids(f"prompts[{i}]", p, vocab) for i, p in enumerate(prompts)]
    max_new_tokens = integer("max_new_tokens", max_new_tokens)
    block_size, max_batch = integer("block_size", block_size), integer("max_batch", max_batch)
    if num_blocks is not None:
        integer("num_blocks", num_blocks)
    return prompts, max_new_tokens, block_size, max_batch


def decoding(cache, seq_ids: list[int], token_ids: list[list[int]]) -> None:
    """Distinct sequences, each fully computed and handed its tokens and one more, with room."""
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"seq_ids must be distinct, got {seq_ids}")
    for seq_id, tokens in zip(seq_ids, token_ids):
        cache.require_in_step(seq_id)
        if cache.num_computed(seq_id) != cache.num_tokens(seq_id):
            raise ValueError(
                f"sequence {seq_id} has reserved tokens not computed yet; prefill it first"
            )
        if len(tokens) != cache.num_tokens(seq_id) + 1:
            raise ValueError(
                f"token_ids of sequence {seq_id} must hold its {cache.num_tokens(seq_id)} tokens"
                f" and the one to feed, got {len(tokens)}"
            )
    blocks_free(cache, sum(cache.blocks_to_append(s) for s in seq_ids))


def stop_tokens(stop, vocab: int) -> set[int]:
    """None, one token id, or a list of them."""
    return (
        set()
        if stop is None
        else set(token_ids("stop", [stop] if isinstance(stop, int) else stop, vocab))
    )
