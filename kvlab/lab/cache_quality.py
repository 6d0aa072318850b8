"""Notebook 08, long-context variants (section 9.7): what each smaller cache costs in quality, and
in time.

- where quantization error enters attention: ``attention_error`` (through the scores, through the
  values, or both; KV Cache articles, 2026), on keys with outlier channels like those KIVI and
  KVQuant report (``outlier_keys``; Liu et al. 2024, Hooper et al. 2024), and
  ``rerotation_scores``, what rotating an already-rotated cached key again does to the scores;
- on a real model: ``sink_share`` (how much attention each head puts on the first token, against
  ``uniform_share``; Xiao et al. 2024), ``cached_keys_values``, ``channel_rms`` and ``over_median``
  (the outlier channels of a real cache), ``quantized_cache_quality`` (perplexity through a
  quantized cache, per chunk so that differences come with their spread), ``fewer_entries`` (pooled
  GQA and a low-rank latent on the model's own projections: bytes per token, perplexity, KL);
- ``bench_rows``: decode step time with the full, windowed and quantized caches, and the streaming
  perplexities of ``kvlab.lab.streams``, for ``python -m kvlab bench``.
"""

from __future__ import annotations

import math
import statistics

import torch
from transformers import DynamicCache

from kvlab._checks import causal_lm, instance, integer, positive, require_memory, token_ids
from kvlab.cache.fp8 import FP8KVCache
from kvlab.cache.hf_cache import layer_nbytes
from kvlab.cache.latent import LatentKVCache, gqa_from_mha, kv_bases
from kvlab.cache.quantized import QuantizedKVCache
from kvlab.cache.rope import rotate
from kvlab.cache.window import SlidingWindowCache
from kvlab.devices import on_gpu
from kvlab.lab.bench import Row
from kvlab.lab.decode_timing import profile_decode
from kvlab.lab.models import tiny_model
from kvlab.lab.pretrained import pretrained_model
from kvlab.lab.streams import kl_divergence, streaming_sweep
from kvlab.lab.trained import heldout_ids
from kvlab.theory.cache_sizes import BITS
from kvlab.theory.long_context import uniform_share  # noqa: F401  (the baseline of sink_share, re-exported)
from kvlab.theory.shapes import ModelShape
from kvlab.versions import cache_kwargs


def attention_error(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor
) -> dict:
    """Relative error of attention outputs when only keys, only values, or both are approximated.

    ``q [..., m, d]``, ``k, v [..., n, d]``; fp64 softmax(q k^T / sqrt(d)) v. Key error enters
    through the scores (it reshapes the weights); value error through the weighted sum. The KV Cache
    articles' contract: quantization error enters attention through both. Returns ``{"scores",
    "values", "both"}`` as
    ||o_hat - o|| / ||o||, plus ``"score_rmse"``, the RMS error of the scores themselves.
    """
    _check_attention_inputs(q=q, k=k, v=v, k_hat=k_hat, v_hat=v_hat)

    def attend(kk, vv):
        s = q.double() @ kk.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
        return s, torch.softmax(s, dim=-1) @ vv.double()

    s, o = attend(k, v)
    if not bool(o.norm() > 0):
        raise ValueError(
            "v must not give an all-zero attention output (all-zero values): the relative error "
            "||o_hat - o|| / ||o|| is undefined there"
        )
    s_hat, o_k = attend(k_hat, v)
    _, o_v = attend(k, v_hat)
    _, o_kv = attend(k_hat, v_hat)
    rel = lambda a: float((a - o).norm() / o.norm())  # noqa: E731
    return {
        "scores": rel(o_k),
        "values": rel(o_v),
        "both": rel(o_kv),
        "score_rmse": float((s_hat - s).pow(2).mean().sqrt()),
    }


def _check_attention_inputs(**tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.dim() < 2:
            raise TypeError(
                f"{name} must be a floating-point torch.Tensor [..., tokens, dim], got "
                f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
            )
    q, k, v, k_hat, v_hat = tensors.values()
    if (
        k_hat.shape != k.shape
        or v_hat.shape != v.shape
        or k.shape[:-1] != v.shape[:-1]
        or q.shape[:-2] != k.shape[:-2]
        or q.shape[-1] != k.shape[-1]
    ):
        raise ValueError(
            "q [..., m, d], k and k_hat [..., n, d], v and v_hat [..., n, d_v] must agree, got q"
            f" {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, k_hat"
            f" {tuple(k_hat.shape)}, v_hat {tuple(v_hat.shape)}"
        )


def outlier_keys(
    tokens: int,
    head_dim: int,
    outlier_channels: int = 4,
    outlier_scale: float = 20.0,
    seed: int = 0,
    dtype=torch.float32,
) -> torch.Tensor:
    """Keys ``[tokens, head_dim]`` with a few channels ``outlier_scale`` times larger than the rest,
    and a per-channel offset, like the key outliers KIVI and KVQuant report (KV Cache Memory Wall,
    2026, 2.3).
    """
    integer("tokens", tokens, 1)
    integer("head_dim", head_dim, 1)
    integer("outlier_channels", outlier_channels, 0, head_dim + 1)
    positive("outlier_scale", outlier_scale)
    integer("seed", seed, 0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    require_memory(
        f"outlier keys of {tokens:,} x {head_dim:,}", 16 * tokens * head_dim, "cpu"
    )  # fp64 and a copy
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, head_dim, generator=g, dtype=torch.float64)
    channels = torch.randperm(head_dim, generator=g)[:outlier_channels]
    k[:, channels] = k[:, channels] * outlier_scale + outlier_scale * torch.randn(
        outlier_channels, generator=g, dtype=torch.float64
    )
    return k.to(dtype)


def rerotation_scores(
    q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, query_position: int, key_positions
) -> dict:
    """What rotating an already-rotated cached key again does to attention scores (KV Cache
    articles, 2026).

    ``q [d]`` and ``k [n, d]`` are un-rotated projections. Returns the scores q_t . k_p of correct
    decoding (keys rotated once, at their positions p), the scores when the cache applies the
    current position t to keys that already carry R_p (keys at p + t), and when it rotates them by p
    again (keys at 2p), all scaled by 1/sqrt(d), fp64.
    """
    integer("query_position", query_position, 0)
    q64, k64 = q.double(), k.double()
    pos = torch.as_tensor(key_positions, dtype=torch.float64)
    qr = rotate(q64[None], [query_position], inv_freq)[0]
    cached = rotate(k64, pos, inv_freq)
    scale = q.shape[-1] ** -0.5
    return {
        "correct": cached @ qr * scale,
        "plus current position": (
            rotate(cached, torch.full_like(pos, query_position), inv_freq) @ qr * scale
        ),
        "twice its own position": rotate(cached, pos, inv_freq) @ qr * scale,
    }


def sink_share(model, tokens: torch.Tensor, first: int = 1, skip: int = 16) -> torch.Tensor:
    """``[layers, heads]``: the mean share of attention each head puts on the first ``first``
    tokens.

    One forward pass over ``tokens [n]`` (eager attention); averaged over the queries at positions
    ``skip`` to n - 1, where uniform attention would give ``uniform_share(n, first, skip)``. A head
    far above that is an attention sink (StreamingLLM), section 9.7.
    """
    integer("first", first, 1)
    integer("skip", skip, 0)
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}"
        )
    token_ids("tokens", tokens.reshape(-1), causal_lm("model", model).config.vocab_size)
    ids = tokens.reshape(1, -1).to(model.device)
    if not ids.shape[1] > max(first, skip):
        raise ValueError(
            f"tokens must be longer than first ({first}) and skip ({skip}), got {ids.shape[1]}"
        )
    with torch.inference_mode():
        out = model(ids, use_cache=False, output_attentions=True)
    if not out.attentions or out.attentions[0] is None:
        raise ValueError("the model returned no attention weights: use attn_implementation='eager'")
    weights = torch.stack([a[0].float() for a in out.attentions])  # [layers, heads, queries, keys]
    return weights[:, :, skip:, :first].sum(-1).mean(-1).cpu()


def cached_keys_values(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys (rotated, as cached) and values of one forward pass over ``tokens [n]``:
    two ``[layers, kv_heads, n, head_dim]`` tensors. What a KV cache would hold, section 9.7."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"tokens must be an integer torch.Tensor of token ids, got {type(tokens).__name__}"
        )
    token_ids("tokens", tokens.reshape(-1), causal_lm("model", model).config.vocab_size)
    cache = DynamicCache()
    with torch.inference_mode():
        model(tokens.reshape(1, -1).to(model.device), use_cache=True, **cache_kwargs(model, cache))
    keys = torch.stack([layer.keys[0] for layer in cache.layers]).float().cpu()
    values = torch.stack([layer.values[0] for layer in cache.layers]).float().cpu()
    return keys, values


def channel_rms(x: torch.Tensor) -> torch.Tensor:
    """``[..., head_dim]``: RMS of each channel over the tokens of ``x [..., tokens, head_dim]``."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise TypeError(f"x must be a torch.Tensor [..., tokens, head_dim], got {type(x).__name__}")
    return x.float().pow(2).mean(-2).sqrt()


def over_median(rms: torch.Tensor) -> torch.Tensor:
    """Each channel's RMS over its head's median channel (``rms [..., head_dim]``): outlier channels
    stand out as ratios far above 1 (``kvlab.theory.long_context.outlier_count``)."""
    instance("rms", rms, torch.Tensor)
    return rms / rms.median(-1, keepdim=True).values


@torch.inference_mode()
def quantized_cache_quality(
    model,
    chunks: torch.Tensor,
    bits: int | str | None,
    group_size: int = 32,
    key_groups: str = "channel",
    residual: int = 0,
) -> dict:
    """Perplexity of ``chunks [batch, n]`` when every cached key and value is quantized, section
    9.7.

    Each chunk is one prefill through ``QuantizedKVCache(bits, group_size, residual, key_groups)``
    so attention reads the quantized keys and values of every complete group (the last partial group
    of ``group_size`` tokens stays exact, as KIVI's residual does); ``residual`` keeps each chunk's
    newest tokens exact too, as KIVI runs it (0: the worst case). ``bits=None`` is the
    full-precision cache, ``bits="fp8"`` the FP8 (E4M3) cache engines ship (``FP8KVCache``, one
    scale per layer, no groups). Returns ``{"ppl", "nll", "logits", "nbytes", "full_bytes"}``:
    ``nll [batch]`` is each chunk's mean next-token loss (so that a difference can be given with its
    spread over chunks), ``nbytes`` what the cache holds and ``full_bytes`` what the same tokens
    take unquantized.
    """
    if bits is not None and bits != "fp8" and (isinstance(bits, bool) or bits not in BITS):
        raise ValueError(
            f"bits must be None (full precision), 'fp8' or one of {BITS}, got {bits!r}"
        )
    ids = chunks.to(model.device)
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"chunks must be [batch, n] with n >= 2, got shape {tuple(ids.shape)}")
    if bits is None:
        cache = DynamicCache()
    elif bits == "fp8":
        cache = FP8KVCache()
    else:
        cache = QuantizedKVCache(bits, group_size, residual=residual, key_groups=key_groups)

    logits = model(ids, use_cache=True, **cache_kwargs(model, cache)).logits[:, :-1].float()
    per_token = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), ids[:, 1:], reduction="none"
    )
    shape = ModelShape.from_config(model.config)
    full = ids.numel() * shape.kv_bytes_per_token(next(model.parameters()).element_size())
    nbytes = sum(layer_nbytes(layer) for layer in cache.layers)
    return {
        "ppl": float(per_token.mean().exp()),
        "nll": per_token.mean(1).cpu(),
        "logits": logits.cpu(),
        "nbytes": nbytes,
        "full_bytes": int(full),
    }


@torch.inference_mode()
def fewer_entries(model, tokens: torch.Tensor, ranks, kv_heads=(1,)) -> list[dict]:
    """Section 9.7's caches with fewer entries per token on ``model``'s own projections, each scored
    on ``tokens [n]`` against the full cache: GQA by mean-pooling the KV heads down to each of
    ``kv_heads`` (Ainslie et al. 2023, without uptraining) and an MLA-style latent of each rank in
    ``ranks`` (``LatentKVCache``; DeepSeek-AI 2024, without training the latent).

    Returns one dict per cache, the full cache first: ``name``, ``bytes_per_token`` (keys and values
    of every layer, in the model's dtype), ``ppl``, ``kl`` (mean KL of the next-token distribution
    from the full cache's, nats, in fp64 and clipped at 0) and ``nll [n - 1]`` (the loss at every
    position).
    """
    ids = tokens.reshape(1, -1).to(model.device)
    if ids.shape[1] < 2:
        raise ValueError(f"tokens must hold at least 2 tokens, got {ids.shape[1]}")
    shape = ModelShape.from_config(model.config)
    element = next(model.parameters()).element_size()
    targets = ids[0, 1:, None]

    def scored(name, nbytes, logits):
        lp = torch.log_softmax(logits[0, :-1].double(), -1)
        nll = -lp.gather(1, targets)[:, 0]
        return {
            "name": name,
            "bytes_per_token": nbytes,
            "ppl": float(nll.double().mean().exp()),
            "kl": max(0.0, float(kl_divergence(ref, lp).mean())),
            "nll": nll.float().cpu(),
        }  # KL >= 0: clip rounding

    full_logits = model(ids).logits
    ref = torch.log_softmax(full_logits[0, :-1].double(), -1)
    rows = [scored("full cache", shape.kv_bytes_per_token(element), full_logits)]
    for heads in kv_heads:
        pooled = gqa_from_mha(model, heads)
        per_token = 2 * shape.layers * heads * shape.head_dim * element
        rows.append(
            scored(
                f"GQA, {heads} KV head{'s' if heads > 1 else ''} (pooled)",
                per_token,
                pooled(ids).logits,
            )
        )
        del pooled
    bases = kv_bases(model)
    for rank in ranks:
        cache = LatentKVCache(model, rank, bases=bases)
        logits = model(ids, use_cache=True, **cache_kwargs(model, cache)).logits
        rows.append(scored(f"latent, rank {rank}", cache.nbytes / ids.shape[1], logits))
    return rows


def bench_rows(reps: int = 2) -> list:
    """Decode step time at long context for full, windowed and quantized caches (section 9.7), then
    the streaming perplexities of the pretrained model (``streaming_rows``).

    One prompt of P tokens, then G decode steps per cache, the caches interleaved ``reps`` times;
    rows give the median step time and the ratios to the full cache, measured in the same run.
    CPU: the tiny Llama at P = 512. GPU: the Llama-3.2-1B shape (random weights, bf16) at
    P = 32,768, window 4,096, KIVI 4-bit.
    """
    integer("reps", reps)
    gpu = on_gpu()
    model = tiny_model("llama", size="real", max_positions=40_000) if gpu else tiny_model("llama")
    P, G, W = (32_768, 32, 4096) if gpu else (512, 12, 128)
    prompt = torch.randint(0, model.config.vocab_size, (1, P), device=model.device)
    makers = {
        "full": lambda: None,
        f"window {W}": lambda: SlidingWindowCache(W),
        "KIVI 4-bit": lambda: QuantizedKVCache(bits=4, group_size=32, residual=128),
        "KIVI 2-bit": lambda: QuantizedKVCache(bits=2, group_size=32, residual=128),
    }
    profile_decode(model, prompt[:, :64], 4, method="cached")  # warm-up
    steps: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(reps):
        for name, make in makers.items():
            p = profile_decode(model, prompt, G, method="cached", cache=make())
            steps[name].extend(p.step_times[2:])
    median = {name: statistics.median(ts) for name, ts in steps.items()}
    where = f"{model.shape.name}, {str(model.dtype).removeprefix('torch.')}, P={P:,}, batch 1"
    rows = [Row(f"decode step, {name} cache", median[name] * 1e3, "ms", where) for name in makers]
    rows += [
        Row(
            f"{name} / full step time",
            median[name] / median["full"],
            "x",
            "ratio of medians, same run",
        )
        for name in makers
        if name != "full"
    ]
    return rows + streaming_rows()


def streaming_rows() -> list:
    """Bench rows for section 9.7: perplexity of the held-out King James text through the full
    cache, the window alone, 4 sinks plus the window and the recomputed window, on
    SmolLM2-135M-Instruct (Q4_1-dequantized). CPU: 512 tokens, a 64-token cache. GPU: 2,048 tokens,
    a 256-token cache."""
    n, budget = (2048, 256) if on_gpu() else (512, 64)
    try:
        model, tokenizer = pretrained_model(attn_implementation="eager")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        return [Row("streaming perplexity", float("nan"), "", f"not run: {e}")]
    tokens = heldout_ids(tokenizer)[0, :n]
    sweep = streaming_sweep(model, tokens, budget, sinks=(0, 4), recompute_stride=16)
    where = f"SmolLM2-135M-Instruct (Q4_1), {n:,} KJV tokens, cache {budget}, t >= {budget}"
    at = sweep.recompute_positions
    rows = [
        Row("perplexity, full cache", sweep.perplexity(sweep.full), "", where),
        Row("perplexity, window alone", sweep.perplexity(sweep.bounded[0, "cache"]), "", where),
        Row("perplexity, 4 sinks + window", sweep.perplexity(sweep.bounded[4, "cache"]), "", where),
        Row(
            "perplexity, 4 sinks + window, original positions",
            sweep.perplexity(sweep.bounded[4, "original"]),
            "",
            where,
        ),
        Row(
            "perplexity, recomputed window",
            float(sweep.recompute.double().mean().exp()),
            "",
            f"every 16th position t >= {budget}",
        ),
        Row(
            "perplexity, 4 sinks + window, same positions",
            sweep.perplexity(sweep.bounded[4, "cache"], at),
            "",
            f"every 16th position t >= {budget}",
        ),
    ]
    return rows
