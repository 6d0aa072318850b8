"""Notebook 13, speculative decoding: guess a few tokens cheaply, check them in one forward pass.

A decode step reads every weight to produce one token (section 9.3). Verifying k guessed tokens
costs one forward pass over k + 1 positions, which reads the weights once, so every accepted guess
is a token for (almost) nothing. Greedy verification keeps exactly the model's own greedy output:
each step

1. asks a proposer for up to ``k`` tokens to follow the text so far;
2. runs the model once over the last accepted token and the proposals (its cache holds the rest);
3. keeps the longest prefix of the proposals that equals the model's own argmax at each position,
   and the model's argmax after that prefix (the "bonus" token, so a step always gains one);
4. rolls the cache back over the rejected proposals (``DynamicCache.crop``).

Two proposers, each a function ``propose(tokens, k) -> list[int]``:

- ``prompt_lookup`` finds the latest n-gram of the text so far earlier in that text and proposes
  what followed it there (Saxena 2023, as transformers' ``prompt_lookup_num_tokens`` does it). It
  costs no model call and pays where the output quotes its context: copying, editing, quoting.
- ``EarlyExit`` runs the first ``layers`` layers of the same model, then its final norm and head
  (Elhoushi et al. 2024, LayerSkip), with a cache of its own: no second model to ship, but each
  guess costs ``layers / L`` of a decode step.

``prompt_lookup`` is pure Python: the serving engine (``kvlab.serving``) proposes with it per
request. The expected gain, in closed form, is ``kvlab.theory.speculative`` (Leviathan et al.
2023); the loop is batch 1, on transformers' dynamic cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kvlab import _checks as check
from kvlab.decode import COMPILE_OPTIONS, new_static_cache
from kvlab.theory.shapes import ModelShape
from kvlab.versions import cache_kwargs, crop_cache, last_logits_only, returned_cache, takes

# --- the proposers: propose(tokens, k) -> up to k tokens -----------------------------------------


def prompt_lookup(tokens: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to ``k`` tokens proposed to follow ``tokens``: for n from ``max_ngram`` down to 1, the
    first earlier occurrence of the last n tokens that has a continuation, and up to ``k`` tokens of
    that continuation. ``[]`` when no n-gram recurs. Trusts its inputs (callers check them)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


class EarlyExit:
    """The first ``layers`` layers of ``model``, its final norm and its head, as a proposer.

    It keeps its own cache of the tokens it has seen: each call crops it back to where it agrees
    with ``tokens`` (its rejected guesses go), feeds the rest in one pass, then guesses one token at
    a time. Trusts its inputs: ``speculative_steps`` checks them.
    """

    def __init__(self, model, layers: int):
        self.model, self.layers = model, layers
        self.cache, self.seen = None, []  # the draft's cache, and the tokens it holds

    @torch.inference_mode()
    def __call__(self, tokens: list[int], k: int) -> list[int]:
        if not k:  # the request's last token: nothing to guess, and the cache stays as it is
            return []
        keep = _common_prefix(self.seen, tokens[:-1])  # the last token always runs: its logits
        if self.cache is not None:
            crop_cache(self.cache, len(self.seen) - keep)
        new, guesses = tokens[keep:], []
        with _first_layers(self.model, self.layers):
            for _ in range(k):
                token = self._next(new, position=keep)
                keep += len(new)
                guesses.append(token)
                new = [token]
        self.seen = tokens + guesses[:-1]
        return guesses

    def _next(self, new: list[int], position: int) -> int:
        ids = torch.tensor([new], device=self.model.device)
        positions = torch.arange(position, position + len(new), device=ids.device)[None]
        given = {} if self.cache is None else cache_kwargs(self.model, self.cache)
        out = self.model(
            ids, position_ids=positions, use_cache=True, **given, **last_logits_only(self.model)
        )
        self.cache = returned_cache(out)
        return int(out.logits[0, -1].argmax())


@contextmanager
def _first_layers(model, layers: int):
    """``model`` running only its first ``layers`` layers while inside (transformers' decoder loops
    over ``layers[: config.num_hidden_layers]``, as its own early-exit assistant relies on)."""
    config = model.config
    every = config.num_hidden_layers
    config.num_hidden_layers = layers
    try:
        yield
    finally:
        config.num_hidden_layers = every


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# --- the loop -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One forward pass of the model: ``proposed`` guesses checked, ``accepted`` of them kept, and
    the ``tokens`` it emitted (the accepted guesses and the model's own next token). Prefill is the
    first step, with nothing proposed."""

    proposed: int
    accepted: int
    tokens: list[int]


@torch.inference_mode()
def verify_steps(model, input_ids, max_new_tokens, propose, k) -> Iterator[Step]:
    """The loop: prefill, then propose, verify in one pass, keep, roll back, until
    ``max_new_tokens`` tokens are out. Trusts its inputs (``speculative_steps`` checks them)."""
    out = model(input_ids, use_cache=True, **last_logits_only(model))
    cache = returned_cache(out)
    tokens = input_ids[0].tolist() + [int(out.logits[0, -1].argmax())]
    yield Step(0, 0, tokens[-1:])
    while (left := len(input_ids[0]) + max_new_tokens - len(tokens)) > 0:
        guesses = propose(tokens, min(k, left - 1))  # a step emits at most len(guesses) + 1
        block = torch.tensor([tokens[-1:] + guesses], device=input_ids.device)
        start = len(tokens) - 1  # the last token is not in the cache yet
        positions = torch.arange(start, start + block.shape[1], device=block.device)[None]
        out = model(block, position_ids=positions, use_cache=True, **cache_kwargs(model, cache))
        greedy = out.logits[0].argmax(dim=-1).tolist()  # the model's token after each position
        accepted = _common_prefix(guesses, greedy)
        crop_cache(cache, len(guesses) - accepted)
        emitted = guesses[:accepted] + [greedy[accepted]]
        tokens += emitted
        yield Step(len(guesses), accepted, emitted)


@torch.inference_mode()
def static_verify_steps(model, input_ids, max_new_tokens, propose, k, compile) -> Iterator[Step]:
    """The same loop on a cache preallocated for prompt, output and ``k`` spare slots, with every
    verify pass of one shape: ``k + 1`` tokens, the guesses padded with the last token (their
    answers are never read). Rolling back moves the cache's write position back
    (``StaticCache.crop``); the next pass overwrites the rejected slots. Trusts its inputs."""
    prompt = input_ids.shape[1]
    cache = new_static_cache(model, prompt + max_new_tokens + k)
    mask = torch.zeros((1, prompt + max_new_tokens + k), dtype=torch.long, device=input_ids.device)
    mask[:, :prompt] = 1  # a slot becomes visible when its token is written
    block = torch.zeros((1, k + 1), dtype=torch.long, device=input_ids.device)
    slots = torch.arange(prompt, device=input_ids.device)
    verify = VerifyStep(model, cache, slots, compile)
    tokens = input_ids[0].tolist() + [int(verify.prefill(input_ids, mask, slots[None]))]
    yield Step(0, 0, tokens[-1:])
    positions = torch.zeros((1, k + 1), dtype=torch.long, device=input_ids.device)
    verify.slots = positions[0]  # updated in place: a compiled pass sees one address throughout
    while (left := prompt + max_new_tokens - len(tokens)) > 0:
        guesses = propose(tokens, min(k, left - 1))
        start = len(tokens) - 1
        block.copy_(torch.tensor([tokens[-1:] + guesses + tokens[-1:] * (k - len(guesses))]))
        positions.copy_(torch.arange(start, start + k + 1)[None])
        mask[:, start : start + k + 1] = 1
        greedy = verify.step(block, positions, mask).tolist()
        accepted = _common_prefix(guesses, greedy)
        crop_cache(cache, k - accepted)
        mask[:, start + accepted + 1 :] = 0
        emitted = guesses[:accepted] + [greedy[accepted]]
        tokens += emitted
        yield Step(len(guesses), accepted, emitted)


class VerifyStep:
    """One verify pass of fixed shape on a static cache: the model's argmax at every position of a
    ``[1, k + 1]`` block. With ``compile``, compiled once with ``COMPILE_OPTIONS`` (on a GPU, one
    CUDA graph), as ``kvlab.decode.StaticStep`` compiles a decode step."""

    def __init__(self, model, cache, slots, compile: bool):
        self.model, self.given, self.slots = model, cache_kwargs(model, cache), slots
        self.run = torch.compile(self._forward, **COMPILE_OPTIONS) if compile else self._forward

    def _inputs(self) -> dict:
        # ``cache_position`` (the slots written) for a model whose forward still declares it.
        slots = {"cache_position": self.slots} if takes(self.model, "cache_position") else {}
        return dict(self.given, **slots)

    def _forward(self, block, positions, mask):
        logits = self.model(
            block, attention_mask=mask, position_ids=positions, use_cache=True, **self._inputs()
        ).logits
        return logits[0].argmax(dim=-1)

    def prefill(self, input_ids, mask, positions):
        """The prompt's pass (uncompiled: its shape is the prompt's): the first greedy token."""
        last = last_logits_only(self.model)
        logits = self.model(
            input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **self._inputs(),
            **last,
        ).logits
        return logits[0, -1].argmax()

    def step(self, block, positions, mask):
        return self.run(block, positions, mask).clone()  # a CUDA graph reuses its output buffer


# --- the door: every argument checked once, then the loop -----------------------------------------

DRAFTS = ("prompt_lookup", "early_exit")
MAX_K = 64


def speculative_steps(
    model,
    input_ids,
    max_new_tokens,
    draft="prompt_lookup",
    k=4,
    layers=None,
    static=False,
    compile=None,
) -> Iterator[Step]:
    """The speculative loop as a generator of ``Step`` records, checked before it exists.

    ``draft``: one of ``DRAFTS``; ``k``: the most guesses per step (1 to ``MAX_K``); ``layers``: the
    early-exit proposer's depth (default: half the model's layers; only with ``"early_exit"``).
    ``static``: verify on a preallocated cache in passes of one shape (``static_verify_steps``);
    ``compile`` (default: on a GPU only; only with ``static``) compiles that pass.
    """
    args = (model, input_ids, max_new_tokens, draft, k, layers, static, compile)
    layers = check.speculative_call(*args, drafts=DRAFTS, max_k=MAX_K, shape=ModelShape)
    propose = prompt_lookup if layers is None else EarlyExit(model, layers)  # None: prompt lookup
    if not max_new_tokens:
        return iter(())
    if static:
        compile = input_ids.device.type == "cuda" if compile is None else compile
        return static_verify_steps(model, input_ids, max_new_tokens, propose, k, compile)
    return verify_steps(model, input_ids, max_new_tokens, propose, k)


def speculative_decode(
    model,
    input_ids,
    max_new_tokens,
    draft="prompt_lookup",
    k=4,
    layers=None,
    static=False,
    compile=None,
):
    """Greedy decode, ``k`` guesses verified per forward pass: exactly ``cached_decode``'s tokens
    (``[1, max_new_tokens]``), in fewer passes where the guesses are right. ``speculative_steps``
    gives each pass's counts; ``static`` and ``compile`` choose the static, compiled verify pass."""
    steps = speculative_steps(model, input_ids, max_new_tokens, draft, k, layers, static, compile)
    tokens = [token for step in steps for token in step.tokens]
    return torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)
