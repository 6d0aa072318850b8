"""Notebook 08, long-context variants (section 9.7): next-token loss and attention mass on a long
stream.

What a bounded cache costs shows on a token stream longer than the cache: ``stream_eval`` feeds
the tokens one at a time through a model with a given cache (``kvlab.cache.window``) and records
each next token's log-probabilities and, with eager attention, the attention mass the newest
query puts on the first and the most recent tokens. ``masked_stream_eval`` gives the same numbers
in one forward pass, with the cache's visibility written as a mask (``eviction_mask``), much faster
on a CPU; tests hold the two to each other. ``recompute_stream_eval`` is StreamingLLM's quality
baseline (Xiao et al. 2024), a window recomputed from scratch for every token, and
``kl_divergence`` compares two runs position by position.

``streaming_sweep`` is StreamingLLM's experiment at one cache budget (the full cache, 0 to 8 sinks
beside the window, both position conventions, the recomputed window); ``compare`` gives the loss
difference of two caches with its spread over blocks of positions
(``kvlab.lab.cache_quality.streaming_rows`` turns a sweep into bench rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.models.llama.modeling_llama import repeat_kv

from kvlab._checks import (
    causal_lm,
    flag,
    integer,
    one_of,
    real,
    require_memory,
    restoring,
    token_ids,
)
from kvlab.cache.rope import rotary_of, rotate
from kvlab.cache.window import ROPE_MODES
from kvlab.theory.long_context import block_means, paired_spread
from kvlab.versions import cache_kwargs


@dataclass(frozen=True)
class StreamResult:
    """Per-step results of feeding a token stream one token at a time (section 9.7)."""

    nll: torch.Tensor  # [steps] negative log-likelihood of the next token
    logprobs: torch.Tensor  # [steps, vocab] next-token log-probabilities
    mass_first: (
        torch.Tensor | None
    )  # [steps] attention mass on the first tokens (positions < first)
    mass_recent: torch.Tensor | None  # [steps] attention mass on the most recent tokens
    stored: int  # tokens held per layer at the end


@torch.inference_mode()
def stream_eval(
    model,
    tokens: torch.Tensor,
    cache=None,
    first: int = 4,
    recent: int = 64,
    attention: bool = False,
) -> StreamResult:
    """Feed ``tokens [n]`` one at a time through ``model`` with ``cache`` (None: a full cache).

    Step t predicts token t + 1 from everything the cache lets it see. With ``attention=True`` (the
    model must use eager attention) it also records, averaged over layers and heads, how much
    attention mass the newest query puts on the first ``first`` tokens of the stream and on the
    ``recent`` newest ones (absolute positions).
    """
    if (
        not isinstance(tokens, torch.Tensor)
        or tokens.dtype.is_floating_point
        or tokens.dtype == torch.bool
    ):
        raise TypeError(
            f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}"
        )
    token_ids("tokens", tokens.reshape(-1), causal_lm("model", model).config.vocab_size)
    integer("first", first, 0)
    integer("recent", recent, 0)
    flag("attention", attention)
    cache = DynamicCache() if cache is None else cache
    ids = tokens.reshape(1, -1).to(model.device)
    n = ids.shape[1]
    if n < 2:
        raise ValueError(f"tokens must hold at least 2 tokens (one prediction), got {n}")
    logprobs, mass_first, mass_recent = [], [], []
    for t in range(n - 1):
        out = model(
            ids[:, t : t + 1],
            position_ids=torch.tensor([[t]], device=model.device),
            **cache_kwargs(model, cache),
            use_cache=True,
            output_attentions=attention,
        )
        logprobs.append(torch.log_softmax(out.logits[0, -1].float(), -1))
        if attention:
            weights = torch.stack(
                [a[0, :, -1].float() for a in out.attentions]
            )  # [layers, heads, kv]
            pos = _retained_positions(cache, weights.shape[-1], t)
            mass = weights.mean((0, 1))
            mass_first.append(float(mass[pos < first].sum()))
            mass_recent.append(float(mass[pos > t - recent].sum()))
    logprobs = torch.stack(logprobs)
    nll = -logprobs.gather(1, ids[0, 1:, None].to(logprobs.device))[:, 0]
    as_tensor = lambda xs: torch.tensor(xs) if attention else None  # noqa: E731
    stored = cache.stored_tokens if hasattr(cache, "stored_tokens") else cache.get_seq_length()
    return StreamResult(
        nll.cpu(), logprobs.cpu(), as_tensor(mass_first), as_tensor(mass_recent), stored
    )


def _retained_positions(cache, kv_length: int, t: int) -> torch.Tensor:
    layer = cache.layers[0]
    if getattr(layer, "positions", None) is not None:
        return layer.positions[0].cpu()
    return torch.arange(t - kv_length + 1, t + 1)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row of two ``[steps, vocab]`` log-probability tensors, in nats."""
    for name, t in (("reference", reference), ("other", other)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating torch.Tensor of log-probabilities, got"
                f" {type(t).__name__}"
            )
    if reference.shape != other.shape or reference.dim() < 1:
        raise ValueError(
            f"reference and other must share one shape [steps, vocab], got {tuple(reference.shape)}"
            f" and {tuple(other.shape)}"
        )
    for name, t in (("reference", reference), ("other", other)):
        total = torch.logsumexp(
            t.double(), -1
        )  # 0 for log-probabilities; probabilities give log(sum e^p) > 0
        if not bool((total.abs() < 1e-3).all()):
            raise ValueError(
                f"{name} must hold log-probabilities (log_softmax of logits; each row's logsumexp"
                f" is 0), got rows whose logsumexp is up to {float(total.abs().max()):.3g}"
            )
    return (reference.exp() * (reference - other)).sum(-1)


def eviction_mask(n: int, num_sink: int = 0, window: int | None = None) -> torch.Tensor:
    """``[n, n]`` boolean mask of what a token-by-token stream through ``SinkCache(num_sink,
    window)`` (``rope="original"``) lets each query see: itself, the first ``num_sink`` tokens and
    the ``window`` newest (all earlier tokens when ``window`` is None). Section 9.7."""
    integer("n", n, 0)
    integer("num_sink", num_sink, 0)
    if window is not None:
        integer("window", window, 1)
    require_memory(
        f"an eviction mask of {n:,} x {n:,} tokens", 3 * n * n, "cpu"
    )  # the mask and two temporaries
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (j < num_sink) | (i - j < window)
    return allowed


def _in_cache_attention(num_sink: int, window: int, inv_freq: torch.Tensor):
    """Eager attention in which the sink keys sit at their slots of ``SinkCache(num_sink, window,
    rope="cache")``: for the query at t, sink i is min(t, S + W - 1) - i positions back, not t - i.

    Every other key is at its true distance, as in the cache. RoPE scores depend only on the
    difference of positions, so rotating the query back by max(0, t - S - W + 1) and scoring it
    against the sinks as stored gives the same scores as moving the sinks.
    """

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        keys = repeat_kv(key, module.num_key_value_groups)
        values = repeat_kv(value, module.num_key_value_groups)
        scores = query @ keys.transpose(2, 3) * scaling
        if num_sink:
            n = query.shape[-2]
            shift = (torch.arange(n, device=query.device) - (num_sink + window - 1)).clamp(min=0)
            back = rotate(query, -shift, inv_freq, 1.0)
            scores[..., :num_sink] = back @ keys[..., :num_sink, :].transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return (weights @ values).transpose(1, 2).contiguous(), weights

    return attention


@torch.inference_mode()
def masked_stream_eval(
    model,
    tokens: torch.Tensor,
    num_sink: int = 0,
    window: int | None = None,
    first: int = 4,
    recent: int = 64,
    rope: str = "original",
    attention: bool = True,
) -> StreamResult:
    """``stream_eval`` in one forward pass: the same attention as streaming the tokens one at a time
    through ``SinkCache(num_sink, window, rope=rope)``, expressed as an explicit mask.

    The model must use eager attention when ``attention=True`` (the attention mass is read from its
    weights); ``attention=False`` records only the losses (``mass_*`` are None). ``rope="cache"``
    (StreamingLLM's positions inside the cache) swaps in an attention function that scores the sinks
    at their in-cache distance for the length of the call. Much faster than stepping on a CPU;
    tests check both conventions against the cache itself.
    """
    if (
        not isinstance(tokens, torch.Tensor)
        or tokens.dtype.is_floating_point
        or tokens.dtype == torch.bool
    ):
        raise TypeError(
            f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}"
        )
    token_ids("tokens", tokens.reshape(-1), causal_lm("model", model).config.vocab_size)
    integer("num_sink", num_sink, 0)
    if window is not None:
        integer("window", window, 1)  # window 0 would leave a query nothing to attend to
    integer("first", first, 0)
    integer("recent", recent, 0)
    one_of("rope", rope, ROPE_MODES)
    ids = tokens.reshape(1, -1).to(model.device)
    n = ids.shape[1]
    if n < 2:
        raise ValueError(f"tokens must hold at least 2 tokens (one prediction), got {n}")
    allowed = eviction_mask(n, num_sink, window).to(model.device)
    mask = torch.zeros(n, n, dtype=model.dtype, device=model.device)
    mask = mask.masked_fill(~allowed, torch.finfo(model.dtype).min)[None, None]
    if rope == "cache" and window is not None:
        AttentionInterface.register(
            "kvlab_in_cache", _in_cache_attention(num_sink, window, rotary_of(model)[0])
        )
        with restoring(model, attn_implementation="kvlab_in_cache"):
            out = model(ids, attention_mask=mask, use_cache=False, output_attentions=attention)
    else:
        out = model(ids, attention_mask=mask, use_cache=False, output_attentions=attention)
    logprobs = torch.log_softmax(out.logits[0, :-1].float(), -1)
    nll = -logprobs.gather(1, ids[0, 1:, None])[:, 0]
    stored = n - 1 if window is None else min(n - 1, num_sink + window)
    if not attention:
        return StreamResult(nll.cpu(), logprobs.cpu(), None, None, stored)
    weights = sum(a[0].float().mean(0) for a in out.attentions)[:-1] / len(
        out.attentions
    )  # [n-1 queries, n keys]
    t = torch.arange(n - 1, device=weights.device)[:, None]
    j = torch.arange(n, device=weights.device)[None, :]
    mass_first = (weights * (j < first)).sum(-1)
    mass_recent = (weights * (j > t - recent)).sum(-1)
    return StreamResult(nll.cpu(), logprobs.cpu(), mass_first.cpu(), mass_recent.cpu(), stored)


@torch.inference_mode()
def recompute_stream_eval(
    model,
    tokens: torch.Tensor,
    window: int,
    start: int | None = None,
    stride: int = 1,
    batch: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding window with recomputation: token t + 1 predicted from the ``window`` newest tokens,
    run from scratch at positions 0..window-1 (no cache carried between steps), section 9.7.

    StreamingLLM's quality baseline: exact attention over the window, at window-squared work per
    token. Evaluated at positions t = start, start + stride, ... (``start`` defaults to window - 1,
    the first full window). Returns ``(positions [m], nll [m])``.
    """
    integer("window", window, 1)
    integer("stride", stride, 1)
    integer("batch", batch, 1)
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}"
        )
    token_ids("tokens", tokens.reshape(-1), causal_lm("model", model).config.vocab_size)
    ids = tokens.reshape(-1).to(model.device)
    start = window - 1 if start is None else start
    integer("start", start, window - 1, len(ids) - 1)
    positions = torch.arange(start, len(ids) - 1, stride)
    nll = []
    for chunk in positions.split(batch):
        x = torch.stack([ids[t - window + 1 : t + 1] for t in chunk])
        logits = model(x, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        nll.append(torch.nn.functional.cross_entropy(logits, ids[chunk + 1], reduction="none"))
    return positions, torch.cat(nll).cpu()


@dataclass(frozen=True)
class StreamingSweep:
    """StreamingLLM's experiment on one text (Xiao et al. 2024, section 9.7): the loss of every next
    token through a full cache and through bounded caches of ``budget`` tokens, sinks plus window.

    ``bounded[(sinks, rope)]`` is the ``[n - 1]`` loss with ``sinks`` first tokens kept beside a
    window of ``budget - sinks`` (``sinks = 0``: the window alone), keys at their positions inside
    the cache (``rope="cache"``, StreamingLLM's) or at their original ones. ``recompute`` is the
    sliding window with recomputation over ``budget`` tokens, at ``recompute_positions``. Position
    t predicts token t + 1; nothing is evicted before t = ``budget``, so every comparison is made
    over positions t >= ``budget`` (``after_fill``).
    """

    budget: int
    full: torch.Tensor
    bounded: dict
    recompute_positions: torch.Tensor
    recompute: torch.Tensor

    @property
    def after_fill(self) -> slice:
        return slice(self.budget, None)

    def perplexity(self, nll: torch.Tensor, positions=None) -> float:
        """exp of the mean loss over ``positions`` (default: every position t >= budget)."""
        picked = nll[self.after_fill] if positions is None else nll[positions]
        return float(picked.double().mean().exp())


def streaming_sweep(
    model,
    tokens: torch.Tensor,
    budget: int,
    sinks=(0, 1, 2, 4, 8),
    both_conventions_at: int = 4,
    recompute_stride: int = 16,
) -> StreamingSweep:
    """Run StreamingLLM's comparison on ``tokens [n]`` at a fixed cache of ``budget`` tokens
    (section 9.7): the full cache; ``s`` sinks plus a window of ``budget - s`` for each ``s`` in
    ``sinks``, keys at positions inside the cache; the same at ``both_conventions_at`` sinks with
    keys at their original positions; and the sliding window of ``budget`` tokens recomputed from
    scratch every ``recompute_stride`` positions. One masked forward pass per cache
    (``masked_stream_eval``, equal to streaming through ``SinkCache`` token by token).
    """
    integer("budget", budget, 2)
    sinks = tuple(sinks)
    for s in sinks + (both_conventions_at,):
        integer("sinks", s, 0, budget)
    integer("recompute_stride", recompute_stride, 1)
    n = tokens.numel()
    if n < budget + 2:
        raise ValueError(
            f"tokens must be longer than budget + 1 = {budget + 1} (something must be evicted),"
            f" got {n}"
        )
    run = lambda s, w, rope: masked_stream_eval(model, tokens, s, w, rope=rope, attention=False).nll  # noqa: E731
    full = run(0, None, "original")
    bounded = {(s, "cache"): run(s, budget - s, "cache") for s in sinks}
    bounded[both_conventions_at, "original"] = run(
        both_conventions_at, budget - both_conventions_at, "original"
    )
    positions, recompute = recompute_stream_eval(
        model, tokens, budget, start=budget, stride=recompute_stride
    )
    return StreamingSweep(budget, full, bounded, positions, recompute)


def compare(a: torch.Tensor, b: torch.Tensor, block: int):
    """The loss of ``b`` minus that of ``a`` (nats per token) over the same positions, as a
    ``kvlab.theory.long_context.Spread`` over blocks of ``block`` positions."""
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must cover the same positions, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return paired_spread(block_means(a.tolist(), block), block_means(b.tolist(), block))


@dataclass(frozen=True)
class NeedleProbe:
    """One needle-in-a-haystack probe (section 9.7): how well the model completes a fact stated
    once, ``distance`` tokens before the question, with the full cache and with an evicting one."""

    depth: float  # where the needle sits in the haystack, 0 (start) to 1 (end)
    distance: int  # tokens from the needle's first token to the question's last
    in_cache: bool  # whether the evicting cache still holds the whole needle when the answer starts
    full_nll: float  # the answer's summed negative log-likelihood, full cache (nats)
    evicting_nll: float  # the same with sinks plus a window


def needle_probe(
    model,
    haystack: torch.Tensor,
    needle: torch.Tensor,
    question: torch.Tensor,
    answer: torch.Tensor,
    depth: float,
    num_sink: int,
    window: int,
) -> NeedleProbe:
    """Put ``needle`` (token ids of a sentence stating a fact) at ``depth`` of ``haystack``, follow
    with ``question`` and ``answer`` (the fact's completion), and score the answer's tokens with the
    full cache and with ``num_sink`` sinks plus a ``window`` (``masked_stream_eval``, StreamingLLM's
    positions inside the cache). What eviction forgets, a full cache recalls by copying.
    """
    parts = {"haystack": haystack, "needle": needle, "question": question, "answer": answer}
    for name, ids in parts.items():
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a 1-D integer torch.Tensor of token ids, got {ids!r:.60}"
            )
    depth = real("depth", depth, 0, 1)
    integer("num_sink", num_sink, 0)
    integer("window", window, 1)
    at = round(depth * len(haystack))
    ids = torch.cat([haystack[:at], needle, haystack[at:], question, answer])
    k = len(answer)
    full = masked_stream_eval(model, ids, attention=False).nll[-k:]
    evicting = masked_stream_eval(model, ids, num_sink, window, rope="cache", attention=False).nll[
        -k:
    ]
    first_answer_step = len(ids) - k - 1  # the step that predicts the answer's first token
    return NeedleProbe(
        depth=float(depth),
        distance=first_answer_step - at,
        in_cache=at >= first_answer_step - window + 1 or at + len(needle) <= num_sink,
        full_nll=float(full.sum()),
        evicting_nll=float(evicting.sum()),
    )
