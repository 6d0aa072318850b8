"""Notebooks 01 and 02, the decode loop and cache reuse (sections 9.1 and 9.2): timing the loops.

``profile_decode`` runs one decode with a loop of ``kvlab.decode`` and times every step of the very
generator that produces its tokens: time to first token (prefill and the first greedy pick), then
one time per decode step, the device synchronised at each, as a streaming server must before it
can send the token. ``compile_break_even`` reads from an eager and a compiled profile of one request
what compilation cost and what it saves per step, and so after how many tokens it pays
(``kvlab.theory.work.break_even_tokens``; the Decode and KV Cache chapter, 2026, section 9.2).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch

from kvlab._checks import integer, one_of
from kvlab.decode import METHODS, decode_steps
from kvlab.theory.work import break_even_tokens


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


def profile_decode(
    model, input_ids, max_new_tokens, method="cached", attention_mask=None, **options
):
    """Run one decode with ``method`` in ``METHODS`` and time every step of it.

    The first interval (time to first token) covers prefill and the first greedy pick; each later
    interval one decode step. The device is synchronised at every step, as a streaming server must
    before it can send the token. Options (``compile=`` for ``static``) pass through.
    """
    one_of("method", method, METHODS)
    steps = decode_steps(method, model, input_ids, max_new_tokens, attention_mask, **options)
    if max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens must be an int >= 1 for profile_decode, got {max_new_tokens}"
        )
    times, tokens = [], []
    _sync(input_ids.device)
    start = time.perf_counter()
    for token in steps:
        _sync(input_ids.device)
        now = time.perf_counter()
        times.append(now - start)
        tokens.append(token)
        start = now
    return DecodeProfile(
        method,
        input_ids.shape[0],
        input_ids.shape[1],
        max_new_tokens,
        times[0],
        tuple(times[1:]),
        torch.cat(tokens, dim=1),
    )


@dataclass(frozen=True)
class CompileBreakEven:
    """What compilation cost and what it saves per step, from two profiles of one request (section
    9.2)."""

    compile_seconds: float
    eager_step: float
    compiled_step: float

    @property
    def step_gain(self) -> float:
        return self.eager_step - self.compiled_step

    @property
    def tokens(self) -> float:
        return break_even_tokens(self.compile_seconds, self.step_gain)


def compile_break_even(
    eager: DecodeProfile, compiled: DecodeProfile, warm: int = 8
) -> CompileBreakEven:
    """Compile cost and per-step gain measured from an eager and a compiled profile of one request.

    Steady steps are the medians after the first ``warm`` steps. The compile (and, on a GPU, graph
    capture) cost is the compiled run's extra time net of the gain its steady steps already made:
    (compiled total - eager total) + tokens x gain, so the break-even is exactly where the two runs'
    cumulative times, extrapolated at their steady steps, cross. It depends on ``warm`` only through
    the two medians.
    """
    warm = integer("warm", warm, 1)
    for name, p in (("eager", eager), ("compiled", compiled)):
        if not isinstance(p, DecodeProfile):
            raise TypeError(
                f"{name} must be a DecodeProfile (from profile_decode), got {type(p).__name__}"
            )
        if len(p.step_times) <= warm:
            raise ValueError(
                f"{name} has {len(p.step_times)} decode steps; warm={warm} needs more than {warm}"
            )
    if len(eager.step_times) != len(compiled.step_times):
        raise ValueError(
            "eager and compiled must decode the same number of tokens, got "
            f"{len(eager.step_times) + 1} and {len(compiled.step_times) + 1}"
        )
    t_eager = statistics.median(eager.step_times[warm:])
    t_compiled = statistics.median(compiled.step_times[warm:])
    tokens = len(eager.step_times) + 1
    cost = (compiled.total - eager.total) + tokens * (t_eager - t_compiled)
    return CompileBreakEven(max(0.0, cost), t_eager, t_compiled)


# --------------------------------------------------------------------------- bench rows

PRETRAINED_QUESTION = "Explain in a few sentences why the sky is blue."


def bench_rows(new_tokens: int = 32, reps: int = 3, calibration=None) -> list:
    """Rows for ``python -m kvlab bench`` (section 9.1 on real weights): the cached loop decoding a
    chat prompt on SmolLM2-135M-Instruct (``kvlab.pretrained_model``; Q4_1-rounded weights), its
    tokens checked against ``generate``'s first, then its tokens/s and its steady step against the
    time to read the step's weights once at the calibrated read bandwidth (chapter 3's floor)."""
    new_tokens, reps = integer("new_tokens", new_tokens), integer("reps", reps)
    from kvlab.lab.bench import Row
    from kvlab.lab.gemv import weight_read_bytes
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.pretrained import chat_ids, pretrained_model

    model, tokenizer = pretrained_model()
    ids = chat_ids(tokenizer, PRETRAINED_QUESTION, model.device)
    expected = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )[:, ids.shape[1] :]
    runs = [profile_decode(model, ids, new_tokens, method="cached") for _ in range(reps)]
    if not all(torch.equal(p.tokens, expected) for p in runs):
        raise RuntimeError(
            "cached_decode decoded other tokens than generate on SmolLM2-135M-Instruct; "
            "no time is reported"
        )
    steady = statistics.median(t for p in runs for t in p.step_times[4:])
    weight_bytes = weight_read_bytes(model)
    floor = weight_bytes / (calibration or calibrate()).stream_bytes_per_s
    where = (
        f"SmolLM2-135M-Instruct (Q4_1 rounded), {str(model.dtype).removeprefix('torch.')}, a "
        f"{ids.shape[1]}-token chat prompt, G={new_tokens}, batch 1"
    )
    return [
        Row(
            "cached decode",
            statistics.median(p.tokens_per_s for p in runs),
            "tokens/s",
            f"{where}; median of {reps}, tokens equal to generate's",
        ),
        Row(
            "cached step (steady)",
            steady * 1e3,
            "ms",
            f"median of steps 5..{new_tokens - 1} of every run",
        ),
        Row(
            "weight-read floor",
            floor * 1e3,
            "ms",
            f"{weight_bytes / 1e6:,.0f} MB / calibrated read bandwidth",
        ),
        Row(
            "floor / cached step",
            floor / steady,
            "fraction",
            "1.0 = reads its weights at the read bandwidth",
        ),
    ]


@dataclass(frozen=True)
class CompilePayoff:
    """Compiled against eager static steps of one request, measured one way (section 9.2):
    ``compile_seconds``, what the compiled loop's first ``warm`` steps took beyond as many steady
    compiled steps; ``eager`` and ``compiled``, their steady steps timed in interleaved rounds."""

    compile_seconds: float
    eager: object  # kvlab.lab.timing.Timing
    compiled: object
    eager_first: tuple[float, ...] = ()
    compiled_first: tuple[float, ...] = ()

    def cost_after(self, warm: int) -> float:
        """The compile cost estimated from the first ``warm`` steps of each loop (at most
        ``len(compiled_first)``): their extra time over as many steady steps, compiled less
        eager."""
        warm = integer("warm", warm, 1, len(self.compiled_first) + 1)
        extra = sum(self.compiled_first[:warm]) - warm * self.compiled.min
        return max(0.0, extra - (sum(self.eager_first[:warm]) - warm * self.eager.min))

    @property
    def step_gain(self) -> float:
        """Seconds the fastest compiled step saves over the fastest eager one."""
        return self.eager.min - self.compiled.min

    @property
    def spread(self) -> float:
        return self.eager.spread_above_min + self.compiled.spread_above_min

    @property
    def tokens(self) -> float:
        """Tokens after which compiling has paid for itself (``break_even_tokens``)."""
        return break_even_tokens(self.compile_seconds, self.step_gain)


def compile_payoff(model, input_ids, rounds: int = 12, warm: int = 4) -> CompilePayoff:
    """Prefill ``input_ids`` in an eager and a compiled static loop, time the first ``warm`` steps
    of each (the compiled loop compiles and, on a GPU, captures there), then time ``rounds`` steady
    steps of both, interleaved, so that the page's one comparison of compiled and eager steps sees
    both under the same load."""
    from kvlab.lab.timing import interleaved

    rounds, warm = integer("rounds", rounds, 2), integer("warm", warm, 1)
    length = 1 + warm + rounds + 1
    loops = {
        name: decode_steps("static", model, input_ids, length, compile=compiled)
        for name, compiled in (("eager", False), ("compiled", True))
    }
    first = {}
    for name, steps in loops.items():
        next(steps)  # prefill, untimed
        first[name] = []
        for _ in range(warm):
            _sync(input_ids.device)
            start = time.perf_counter()
            next(steps)
            _sync(input_ids.device)
            first[name].append(time.perf_counter() - start)
    t = interleaved(
        {name: (lambda s=steps: next(s)) for name, steps in loops.items()}, reps=rounds, warmup=0
    )
    for steps in loops.values():
        steps.close()
    payoff = CompilePayoff(
        0.0, t["eager"], t["compiled"], tuple(first["eager"]), tuple(first["compiled"])
    )
    return dataclasses.replace(payoff, compile_seconds=payoff.cost_after(warm))
