"""Notebook 06: kvlab's prefix cache against the way a reader reuses a prefix in transformers.

- :func:`compare_prefix_reuse`: real prompts that share a prefix (a chat's system prompt), time to
  first token with kvlab's prefix cache (Kwon et al. 2023) against ``generate`` with a prefilled
  ``DynamicCache`` copied for each request, as transformers' documentation describes it (Wolf et al.
  2020), each against computing the whole prompt; first tokens checked equal before a time counts;
- :func:`reuse_rows`: those measurements as rows of ``python -m kvlab bench`` (section "prefix
  caching").
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch

from kvlab._checks import integer, items, restoring
from kvlab.serving.paged_decode import cache_for, prefill

KVLAB_COLD, KVLAB_CACHED = "kvlab, nothing cached", "kvlab, prefix cached"
HF_COLD, HF_REUSED = (
    "transformers generate, nothing cached",
    "transformers generate, prefix cache copied",
)
REUSE_CONTENDERS = (KVLAB_COLD, KVLAB_CACHED, HF_COLD, HF_REUSED)


def shared_prefix(prompts) -> int:
    """Leading tokens every prompt has in common."""
    prompts = items("prompts", prompts, list, what="token lists")
    first = prompts[0]
    return next(
        (i for i in range(len(first)) if any(len(p) <= i or p[i] != first[i] for p in prompts)),
        len(first),
    )


@dataclass(frozen=True)
class PrefixReuse:
    """Time to first token of prompts that share a ``shared``-token prefix (notebook 06):
    ``seconds[name]`` holds one sum over the prompts per round; ``cached[i]``, the tokens of prompt
    ``i`` kvlab's cache served (whole blocks of the prefix); ``same_first_tokens``, every
    contender's first token agreed.
    """

    prompt_tokens: list
    shared: int
    block_size: int
    cached: list
    seconds: dict
    same_first_tokens: bool
    first_tokens: list

    @property
    def hit_rate(self) -> float:
        return sum(self.cached) / sum(self.prompt_tokens)

    def mean_ttft(self, name: str) -> float:
        return statistics.median(self.seconds[name]) / len(self.prompt_tokens)

    def speedup(self, name: str, over: str) -> tuple[float, float, float]:
        """Median times' ratio ``over / name`` and the lowest and highest ratio of one round."""
        rounds = [b / a for a, b in zip(self.seconds[name], self.seconds[over])]
        return (
            statistics.median(self.seconds[over]) / statistics.median(self.seconds[name]),
            min(rounds),
            max(rounds),
        )


def _kvlab_first(model, cache, prompt, salt, attention: str, cached: list) -> int:
    """The first token of ``prompt`` from a paged cache, which serves what it holds; ``cached`` gets
    the hit."""
    seq, hit = cache.admit(prompt, salt)
    token = prefill(model, cache, seq, prompt, attention)
    cache.free(seq)
    cached.append(hit)
    return token


def _hf_first(model, prompt, prefix_cache) -> int:
    """The first token of ``prompt`` from ``generate``, starting from a copy of ``prefix_cache`` if
    given."""
    from kvlab.versions import cache_kwargs

    ids = torch.tensor([prompt], device=model.device)
    extra = {} if prefix_cache is None else cache_kwargs(model, copy.deepcopy(prefix_cache))
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=1,
            do_sample=False,
            pad_token_id=model.generation_config.pad_token_id or 0,
            **extra,
        )
    return int(out[0, -1])


def compare_prefix_reuse(
    model,
    prompts,
    block_size: int = 16,
    reps: int = 2,
    attention: str | None = None,
    contenders=REUSE_CONTENDERS,
) -> PrefixReuse:
    """Time to first token of each prompt, four ways, interleaved round by round (notebook 06).

    kvlab: a paged cache with prefix caching, where an earlier request left the shared prefix's
    blocks (each round under its own salt, so no prompt hits its own earlier round), against a cache
    that computes everything. transformers: ``generate`` with a ``DynamicCache`` prefilled with the
    shared prefix once per round and deep-copied for every request (the copy is timed: the reader
    pays it), against ``generate`` on the whole prompt. The first tokens must agree before a time
    counts.
    """
    from transformers import DynamicCache

    from kvlab.devices import on_gpu
    from kvlab.versions import cache_kwargs, returned_cache

    prompts = [list(p) for p in prompts]
    if len(prompts) < 2:
        raise ValueError(
            f"prompts must hold at least two prompts that share a prefix, got {len(prompts)}"
        )
    reps, block_size = integer("reps", reps), integer("block_size", block_size)
    shared = shared_prefix(prompts)
    if shared < block_size:
        raise ValueError(
            f"the prompts share {shared} leading tokens, less than one block of {block_size}"
        )
    attention = attention or ("kernel" if on_gpu() else "gather")
    blocks = sum(-(-len(p) // block_size) for p in prompts) + -(-shared // block_size) + 1
    warm = cache_for(model, (reps + 1) * blocks, block_size, prefix_caching=True)
    cold = cache_for(model, blocks, block_size)
    with restoring(model, attn_implementation="sdpa"):  # given back with its own attention
        seconds = {c: [] for c in contenders}
        firsts, cached = [], []
        for r in range(reps + 1):  # round 0 warms up and checks the first tokens; it is not timed
            seq, _ = warm.admit(
                prompts[0][:shared], salt=r
            )  # an earlier request leaves the prefix's blocks
            prefill(model, warm, seq, prompts[0][:shared], attention)
            warm.free(seq)
            with torch.inference_mode():
                prefix_ids = torch.tensor([prompts[0][:shared]], device=model.device)
                prefix_cache = returned_cache(
                    model(
                        prefix_ids,
                        use_cache=True,
                        **cache_kwargs(model, DynamicCache(config=model.config)),
                    )
                )
            runs = {
                KVLAB_COLD: lambda p: _kvlab_first(model, cold, p, None, attention, []),
                KVLAB_CACHED: lambda p: _kvlab_first(
                    model, warm, p, r, attention, cached if r == 0 else []
                ),
                HF_COLD: lambda p: _hf_first(model, p, None),
                HF_REUSED: lambda p: _hf_first(model, p, prefix_cache),
            }
            order = list(contenders[r % len(contenders) :]) + list(
                contenders[: r % len(contenders)]
            )
            tokens = {}
            for name in order:
                start = time.perf_counter()
                tokens[name] = [runs[name](p) for p in prompts]
                if r:
                    seconds[name].append(time.perf_counter() - start)
            if r == 0:
                firsts = tokens[order[0]]
                same = all(t == firsts for t in tokens.values())
    return PrefixReuse(
        [len(p) for p in prompts],
        shared,
        block_size,
        cached,
        {n: tuple(s) for n, s in seconds.items()},
        same,
        firsts,
    )


def reuse_rows(model, prompt: int, reps: int = 3, requests: int = 4) -> list:
    """kvlab's prefix cache against transformers' copied prefix cache: ``requests`` prompts of
    ``prompt`` random tokens whose first three quarters are one shared prefix."""
    from kvlab.lab.bench import Row

    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    head = torch.randint(0, vocab, (prompt * 3 // 4,), generator=generator).tolist()
    prompts = [
        head + torch.randint(0, vocab, (prompt - len(head),), generator=generator).tolist()
        for _ in range(requests)
    ]
    result = compare_prefix_reuse(model, prompts, block_size=16, reps=reps)
    rows = [
        Row(
            "prefix reuse: first tokens equal across kvlab and transformers",
            float(result.same_first_tokens),
            "bool",
            f"{requests} prompts of {prompt} tokens, {result.shared} shared",
        )
    ]
    if not result.same_first_tokens:
        return rows + [Row("prefix reuse: times not reported", 0.0, "-", "the first tokens differ")]
    for name, over in ((KVLAB_CACHED, HF_REUSED), (KVLAB_CACHED, KVLAB_COLD), (HF_REUSED, HF_COLD)):
        median, low, high = result.speedup(name, over)
        rows.append(
            Row(
                f"TTFT {over} / {name}",
                median,
                "x",
                f"ratio of medians of {reps} interleaved rounds; one round {low:.2f}x to"
                f" {high:.2f}x",
            )
        )
    return rows
