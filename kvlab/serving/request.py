"""Notebooks 05 and 11: the request type of kvlab's serving stack, and the engine's event log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvlab.serving import _checks


class Chunk(NamedTuple):
    """``token_ids`` at positions ``start, start + 1, ...`` of the cache's sequence ``seq_id``."""

    seq_id: int
    start: int
    token_ids: list[int]


@dataclass(eq=False)  # a request is itself: compared by identity
class Request:
    """``waiting`` -> ``running`` (prefill, maybe chunked, then decode) -> ``finished``, maybe via
    ``waiting`` or ``swapped`` (preempted); or ``rejected``. Greedy, up to ``max_new_tokens`` or a
    ``stop`` token (kept); the cache holds the K and V of all its ``tokens`` but the newest."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    state: str = "waiting"
    seq: int | None = None  # the cache's sequence id, from the first admission on
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    admitted_tokens: int = 0  # tokens handed to the cache over all admissions
    cached_tokens: int = 0  # of which the prefix cache already held
    error: str | None = None
    stop: frozenset = frozenset()
    finish_reason: str | None = None

    def __post_init__(self):
        _checks.request(self)  # built by hand in notebook 05's simulator

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def tokens_at(self, start: int, count: int) -> list[int]:
        """``tokens[start:start + count]``, sliced from prompt and output without joining them."""
        n, end = len(self.prompt), start + count
        return self.prompt[start:end] + self.output[max(start - n, 0) : max(end - n, 0)]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def stopped(self) -> bool:
        return bool(self.output) and self.output[-1] in self.stop

    @property
    def done(self) -> bool:
        return self.stopped or len(self.output) >= self.max_new_tokens

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds."""
        if self.finish_time is not None and len(self.output) > 1:
            return (self.finish_time - self.first_token_time) / (len(self.output) - 1)


@dataclass(frozen=True)
class Event:
    """At ``step``, request ``request`` did ``kind`` (arrive, reject, admit, prefill, decode,
    preempt, resume, finish; ``detail``: tokens or a mode)."""

    step: int
    request: int
    kind: str
    detail: object = None
