"""Notebooks 05 and 11: the one request type of kvlab's serving stack, and the engine's event log.

A :class:`Request` is a prompt, the tokens generated for it so far, where it is in its life, and
its timings; its K and V live in the paged cache under ``seq``, the cache's sequence id, from its
first admission to its end. The scheduler moves it between the queues; an :class:`Event` records
each move, and a :class:`Chunk` is what one step feeds one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvlab.serving import _checks


class Chunk(NamedTuple):
    """What one step feeds one sequence: ``token_ids`` at positions ``start, start + 1, ...``,
    whose slots the cache's sequence ``seq_id`` holds (notebooks 05, 11)."""

    seq_id: int
    start: int
    token_ids: list[int]


@dataclass(eq=False)  # a request is itself: compared by identity
class Request:
    """One request's life: ``waiting`` -> ``running`` (prefill, maybe in chunks, then decode) ->
    ``finished``, possibly preempted back to ``waiting`` (recompute) or to ``swapped`` on the way;
    or ``rejected``.

    ``prompt`` and ``output`` are token ids; decoding is greedy and stops after ``max_new_tokens``,
    or at the first generated token in ``stop`` (kept in ``output``, as ``generate`` keeps it);
    ``finish_reason`` says which: ``"stop"`` or ``"length"``. The K and V of ``tokens`` live in the
    cache under ``seq``: all of them but the newest output token, which the next decode step feeds.
    Built by hand (notebook 05's simulator), its arguments are checked.
    """

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
    stop: frozenset = frozenset()  # token ids that end the request once generated
    finish_reason: str | None = None  # "stop" or "length", once finished

    def __post_init__(self):
        _checks.request(self)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def stopped(self) -> bool:
        """Its newest generated token is a stop token."""
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
        if self.finish_time is None or len(self.output) < 2:
            return None
        return (self.finish_time - self.first_token_time) / (len(self.output) - 1)


@dataclass(frozen=True)
class Event:
    """One line of the log: at ``step``, request ``request`` did ``kind`` (arrive, reject, admit,
    prefill, decode, preempt, resume, finish; ``detail``: tokens or a mode)."""

    step: int
    request: int
    kind: str
    detail: object = None
