"""Notebooks 05 and 11: the request type of kvlab's serving stack, and the engine's event log."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import NamedTuple

from kvlab.serving import _checks


class Chunk(NamedTuple):
    """``token_ids`` at positions ``start, start + 1, ...`` of the cache's sequence ``seq_id``; the
    greedy token is wanted after each of the last ``num_outputs`` (a speculative step's check)."""

    seq_id: int
    start: int
    token_ids: list[int]
    num_outputs: int = 1


@dataclass(eq=False)  # a request is itself: compared by identity
class Request:
    """``waiting`` -> ``running`` (prefill, maybe chunked, then decode) -> ``finished``, maybe via
    ``waiting`` or ``swapped`` (preempted); or ``rejected``. Greedy, up to ``max_new_tokens`` or a
    ``stop`` token (kept). ``token_ids``, the prompt then the output, is the one home of its tokens:
    the cache reads them, keeping none. Checked here, unless ``checked`` (by the engine's door)."""

    id: int
    token_ids: list[int]
    max_new_tokens: int
    arrival: float = 0.0
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
    checked: InitVar[bool] = False
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self, checked: bool):
        if not checked:
            _checks.request(self)  # copies token_ids: the request owns its list
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def prompt(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def stopped(self) -> bool:
        return self.num_tokens > self.num_prompt_tokens and self.token_ids[-1] in self.stop

    @property
    def done(self) -> bool:
        return self.stopped or self.num_tokens - self.num_prompt_tokens >= self.max_new_tokens

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
