"""Notebook 13, speculative decoding on the real model: the two tasks, the counted acceptance, the
measured step times and speed-ups, and the bench's rows against transformers' own.

- ``task_ids``: SmolLM2-135M-Instruct's chat prompt for a task that quotes its context (copy a
  passage of the held-out KJV text) and one that does not (open chat).
- ``replay``: the steps the speculative loop takes with prompt lookup, counted on the greedy output
  alone (the loop's output is exactly greedy, so its proposals and acceptances follow from it): any
  k, no model call.
- ``verify_times``: t(s), one forward pass over s positions on the prompt's cache, interleaved.
- ``race``: whole requests, interleaved, tokens checked equal to plain greedy first.
- ``bench_rows``: ``python -m kvlab bench``'s speculative section.

Sources: Leviathan et al. 2023, Saxena 2023, Elhoushi et al. 2024; transformers' ``generate``
(``prompt_lookup_num_tokens``, ``assistant_early_exit``; Wolf et al. 2020).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch

from kvlab._checks import integer, one_of, token_ids
from kvlab.decode import cached_decode
from kvlab.lab.bench import Row
from kvlab.speculative import prompt_lookup, speculative_decode
from kvlab.theory.speculative import acceptance_rate, empty_fraction, request_speedup, speedup
from kvlab.versions import cache_kwargs, crop_cache, returned_cache

TASKS = ("quote", "chat")
QUOTE_CHARS = 400  # a passage of the held-out text: about 100 tokens to copy
CHAT = "What makes a good morning routine? Answer in a few sentences."


def task_ids(tokenizer, task: str):
    """``[1, n]`` chat prompt ids for ``task``: ``"quote"`` asks to copy a passage of the held-out
    KJV text word for word; ``"chat"`` asks an open question whose answer quotes nothing."""
    from kvlab.lab.pretrained import chat_ids
    from kvlab.lab.trained import heldout_text

    if one_of("task", task, TASKS) == "quote":
        passage = heldout_text()[:QUOTE_CHARS]
        return chat_ids(tokenizer, "Copy this passage exactly, word for word:\n\n" + passage)
    return chat_ids(tokenizer, CHAT)


def replay(prompt: list[int], output: list[int], k: int, propose=prompt_lookup) -> list[tuple]:
    """``(proposed, accepted)`` for each verify step the speculative loop takes to emit ``output``
    (the model's greedy tokens after ``prompt``) with ``propose`` and ``k`` guesses: counted, not
    run. Prefill (the first token) is not a verify step and is left out."""
    prompt, output = token_ids("prompt", prompt), token_ids("output", output, empty=True)
    integer("k", k)
    tokens, steps, i = list(prompt) + output[:1], [], 1
    while i < len(output):
        guesses = propose(tokens, min(k, len(output) - i - 1))
        accepted = 0
        while accepted < len(guesses) and guesses[accepted] == output[i + accepted]:
            accepted += 1
        steps.append((len(guesses), accepted))
        tokens += output[i : i + accepted + 1]
        i += accepted + 1
    return steps


@torch.inference_mode()
def verify_times(model, input_ids, sizes=range(1, 10), reps: int = 3) -> dict[int, float]:
    """``{s: seconds}``: the median time of one forward pass over ``s`` positions after the prompt
    ``input_ids`` (its cache filled once, each pass cropped off again), the sizes interleaved; at
    ``0``, the prefill's time (once)."""
    began = time.perf_counter()
    out = model(input_ids, use_cache=True, logits_to_keep=1)
    times = {0: [time.perf_counter() - began]}  # s = 0: the prefill
    cache, start = returned_cache(out), input_ids.shape[1]
    times.update((s, []) for s in sizes)
    for _ in range(integer("reps", reps)):
        for s in sizes:
            block = input_ids[:, -s:]
            positions = torch.arange(start, start + s)[None]
            began = time.perf_counter()
            model(block, position_ids=positions, use_cache=True, **cache_kwargs(model, cache))
            times[s].append(time.perf_counter() - began)
            crop_cache(cache, s)
    return {s: statistics.median(t) for s, t in times.items()}


@dataclass(frozen=True)
class Race:
    """Interleaved whole-request seconds of each contender (the first decodes plain greedy, the
    reference, whose ``tokens`` every contender's equal), one entry per round. The first round
    checks the tokens and runs each contender cold (first calls allocate and warm caches): it counts
    only when no other round follows."""

    seconds: dict
    tokens: list

    def timed(self, name: str) -> list[float]:
        """``name``'s seconds in the rounds that count: all but the first, if there are others."""
        return self.seconds[name][1:] or self.seconds[name]

    def speedup(self, name: str, over: str) -> tuple[float, float, float]:
        """``(median, lowest, highest)``: ``over``'s time over ``name``'s, the ratio of medians and
        the extremes of one round's ratio, over the rounds that count."""
        mine, theirs = self.timed(name), self.timed(over)
        rounds = [b / a for a, b in zip(mine, theirs)]
        whole = statistics.median(theirs) / statistics.median(mine)
        return whole, min(rounds), max(rounds)


def race(runs: dict, rounds: int = 2) -> Race:
    """Run each of ``runs`` (name -> function returning ``[1, G]`` tokens) once in the given order,
    timed, checking its tokens against the first's (a ``RuntimeError`` names one that differs), then
    ``rounds`` more timed rounds, the order rotated by one each round."""
    names, seconds, reference = list(runs), {name: [] for name in runs}, None
    for r in range(integer("rounds", rounds, 0) + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            began = time.perf_counter()
            tokens = runs[name]()
            seconds[name].append(time.perf_counter() - began)
            reference = tokens if reference is None else reference
            if r == 0 and not torch.equal(tokens, reference):
                raise RuntimeError(f"{name} decoded other tokens than {names[0]}; no time is kept")
    return Race(seconds, reference[0].tolist())


def generate_run(model, input_ids, new_tokens: int, **options):
    """transformers' ``generate``, greedy, exactly ``new_tokens`` tokens (no stop token), with
    ``options`` (``prompt_lookup_num_tokens=``, ``assistant_early_exit=``)."""
    new_tokens = integer("new_tokens", new_tokens)
    config = copy.deepcopy(model.generation_config)
    config.update(
        max_new_tokens=new_tokens,
        min_new_tokens=None,
        do_sample=False,
        # an id past the vocabulary: never chosen, so exactly new_tokens tokens (None breaks
        # transformers 5.5's prompt lookup, which tests the candidates against the stop ids)
        eos_token_id=model.config.vocab_size,
        **options,
    )
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    mask, prompt = torch.ones_like(input_ids), input_ids.shape[1]

    def run():
        return model.generate(input_ids, attention_mask=mask, generation_config=config, **options)[
            :, prompt:
        ]

    return run


# --------------------------------------------------------------------------- bench rows

# 48 new tokens, each contender run three times (the cold checking round, then two rotated rounds
# that count): minutes on the 2-core CPU, most of them in generate's early-exit assistant.
BENCH_NEW, BENCH_K, BENCH_EARLY_K, BENCH_ROUNDS = 48, 8, 3, 2


def contenders(model, input_ids, new_tokens: int, k: int = BENCH_K, early_k: int = BENCH_EARLY_K):
    """The bench's runs, plain greedy first: kvlab's loops and transformers' ``generate``, plain,
    with prompt lookup (``k`` guesses) and with early exit (``early_k`` guesses from half the
    layers)."""
    new_tokens, k = integer("new_tokens", new_tokens), integer("k", k)
    early_k = integer("early_k", early_k)
    half = model.config.num_hidden_layers // 2
    args = (model, input_ids, new_tokens)
    return {
        "kvlab greedy": lambda: cached_decode(*args),
        "generate": generate_run(*args),
        "kvlab prompt lookup": lambda: speculative_decode(*args, k=k),
        "generate prompt lookup": generate_run(*args, prompt_lookup_num_tokens=k),
        "kvlab early exit": lambda: speculative_decode(*args, "early_exit", early_k, half),
        "generate early exit": generate_run(
            *args, assistant_early_exit=half, num_assistant_tokens=early_k
        ),
    }


def predicted_speedup(model, input_ids, output: list[int], k: int, times=None) -> float:
    """The theory's speed-up of a whole request, prompt lookup with ``k`` guesses over plain
    greedy: alpha and the empty fraction counted on the greedy ``output`` (``replay``), the prefill,
    t(1) and t(k + 1) measured (``verify_times``, or its ``times``)."""
    steps = replay(input_ids[0].tolist(), output, k)
    times = verify_times(model, input_ids, (1, k + 1)) if times is None else times
    alpha, empty = acceptance_rate(steps), empty_fraction(steps)
    per_step = speedup(alpha, k, times[1], times[k + 1], empty=empty)
    return request_speedup(per_step, times[0], times[1], len(output))


def bench_rows(model=None, new_tokens: int = BENCH_NEW, rounds: int = BENCH_ROUNDS) -> list[Row]:
    """Rows for ``python -m kvlab bench`` (notebook 13): per task, the speed-up of each speculative
    contender over its own plain greedy, kvlab's prompt lookup over transformers', and the theory's
    prediction from the counted alpha and the measured step times."""
    new_tokens, rounds = integer("new_tokens", new_tokens), integer("rounds", rounds)
    from kvlab.lab.pretrained import pretrained_model

    model = pretrained_model()[0] if model is None else model
    rows = []
    for task in TASKS:
        ids = task_ids(model.tokenizer, task)
        result = race(contenders(model, ids, new_tokens), rounds)
        where = f"{task}, P={ids.shape[1]}, G={new_tokens}, {rounds} interleaved rounds"
        for name, over in (
            ("kvlab prompt lookup", "kvlab greedy"),
            ("generate prompt lookup", "generate"),
            ("kvlab prompt lookup", "generate prompt lookup"),
            ("kvlab early exit", "kvlab greedy"),
            ("generate early exit", "generate"),
        ):
            median, low, high = result.speedup(name, over)
            note = f"{where}; one round {low:.2f}x to {high:.2f}x; tokens equal"
            rows.append(Row(f"{task}: {name} / {over}", median, "x", note))
        steps = replay(ids[0].tolist(), result.tokens, BENCH_K)
        predicted = predicted_speedup(model, ids, result.tokens, BENCH_K)
        note = f"alpha {acceptance_rate(steps):.2f}, empty {empty_fraction(steps):.2f}, k={BENCH_K}"
        rows.append(Row(f"{task}: prompt lookup, predicted", predicted, "x", note))
    return rows
