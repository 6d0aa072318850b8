"""Notebooks 01, 02 and 09: the work a decode loop does, counted in closed form.

- ``positions_processed`` and ``attention_work``: the token positions and query-key pairs the
  naive and the cached loop of section 9.1 process to generate G tokens after a P-token prompt;
- ``pass_time`` and ``request_time``: the two-pass model of a request's time, t(n) = a + b n per
  pass (section 9.2), with the tolerances its readings use;
- ``break_even_tokens``: after how many tokens a one-time compilation is repaid by a cheaper step
  (section 9.2);
- ``step_work``: the bytes and FLOPs of one decode step of each loop that notebook 09 diagnoses
  (section 9.8), from the step model of ``kvlab.theory.roofline``.

The counts follow the Decode and KV Cache chapter, 2026 (sections 9.1, 9.2 and 9.8); the loops
themselves are ``kvlab.decode``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import flag, integer, nonnegative, one_of, real
from kvlab.theory import roofline

# The loops notebook 09 can trace: kvlab.decode's three, and the paged loop of notebook 05.
STEP_METHODS = ("naive", "cached", "static", "paged")


# --- section 9.1: positions and pairs -------------------------------------------------------------


def _check_pg(P, G, cached=False):
    integer("P", P, 1)
    integer("G", G, 0)
    flag("cached", cached)


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


# --- section 9.2: a request's time from the cost of one pass
# ---------------------------------------


def pass_time(tokens, a: float, b: float) -> float:
    """The two-pass line of section 9.2, t(n) = a + b n: one forward pass over n tokens without a
    cache, from a fixed cost a and a cost b per position (fitted through a one-token and a long
    pass).
    """
    a, b = nonnegative("a", a), nonnegative("b", b)
    if not hasattr(tokens, "shape"):  # a NumPy array of token counts passes as it is
        tokens = real("tokens", tokens, 0)
    return a + b * tokens


def request_time(P: int, G: int, a: float, b: float, cached: bool = False) -> float:
    """The two-pass model of a whole request: G a + b positions_processed(P, G, cached).

    Naive, G passes over P, P+1, ..., P+G-1 tokens; cached, t(P) + (G-1) t(1), which is the same sum
    with the cached loop's positions. Attention terms and the cache reads of 9.1 are left out.
    """
    a, b = nonnegative("a", a), nonnegative("b", b)
    return b * positions_processed(P, G, cached) + G * a


# --- section 9.2: compilation against its per-step gain
# --------------------------------------------


def break_even_tokens(compile_seconds: float, step_gain: float) -> float:
    """Output tokens after which a one-time cost of ``compile_seconds`` is repaid by saving
    ``step_gain`` seconds per decode step: compile_seconds / step_gain (section 9.2); ``inf`` when
    the compiled step is not faster. Seconds of compilation against milliseconds per step give
    thousands of tokens, which is why engines compile once at start-up, not per request.
    """
    compile_seconds, step_gain = (
        real("compile_seconds", compile_seconds, 0),
        real("step_gain", step_gain),
    )
    return compile_seconds / step_gain if step_gain > 0 else float("inf")


def compile_repaid(compile_seconds: float, step_gain: float, tokens: int) -> bool:
    """Whether a request of ``tokens`` output tokens repays the compile cost: ``tokens`` at least
    ``break_even_tokens(compile_seconds, step_gain)`` (section 9.2)."""
    return integer("tokens", tokens, 0) >= break_even_tokens(compile_seconds, step_gain)


# --- section 9.8: the bytes and FLOPs of one step
# --------------------------------------------------


@dataclass(frozen=True)
class StepWork:
    """Bytes one decode step must move and FLOPs it does, from :mod:`kvlab.theory.roofline` (section
    9.3)."""

    weights_read: float
    kv_read: float
    kv_written: float
    flops: float

    @property
    def total_bytes(self) -> float:
        return self.weights_read + self.kv_read + self.kv_written

    @property
    def kv_share(self) -> float:
        """Fraction of the step's bytes that are cache reads and writes."""
        return (self.kv_read + self.kv_written) / self.total_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved (section 9.3's arithmetic intensity)."""
        return self.flops / self.total_bytes


def check_method(method) -> str:
    """``method`` if it is one of ``STEP_METHODS``, else a ValueError listing them."""
    return one_of("method", method, STEP_METHODS)


def _window_sum(n: int, window: int | None) -> int:
    """sum_{i=1..n} min(i, window): keys the n positions of a full pass attend to."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def step_work(
    shape, batch: int, context: int, method: str = "cached", w_p: float = 2, w_kv: float = 2
) -> StepWork:
    """Bytes and FLOPs of one decode step of ``method`` with ``context`` tokens already cached.

    Cached, static and paged steps: weights read once (P w_p), the cache read once
    (``roofline.step_bytes(...).kv`` = b s K), one new token's keys and values written (b K), and
    ``roofline.step_flops(...)`` = b (2P + A s). A naive step keeps no cache: it reruns all n =
    context + 1 positions, reading the weights once and doing b (2P n + A sum_i min(i, W)) FLOPs.
    """
    check_method(method)
    batch, context = integer("batch", batch), integer("context", context)
    read = roofline.step_bytes(shape, batch, context, w_p, w_kv)
    if method == "naive":
        n = context + 1
        flops = roofline.step_flops(
            shape, batch, context
        ).weights * n + batch * roofline.attention_flops_per_token(shape) * _window_sum(
            n, shape.window
        )
        return StepWork(read.weights, 0.0, 0.0, float(flops))
    written = roofline.step_bytes(shape, batch, 1, w_p, w_kv).kv
    return StepWork(
        read.weights, read.kv, written, roofline.step_flops(shape, batch, context).total
    )
