"""Notebooks 05 and 11: the one request type of kvlab's serving stack, and the engine's event log.

A :class:`Request` is a prompt, the tokens generated for it so far, where it is in its life, and
its timings; its K and V live in the paged cache under ``seq``, the cache's sequence id, from its
first admission to its end. The scheduler moves it between the queues; an :class:`Event` records
each move, and :func:`timeline` reads a log back into each request's state step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvlab._checks import integer, real, token_ids

STATES = ("waiting", "running", "swapped", "finished", "rejected")


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
    or at the first generated token in ``stop`` (the engine's end-of-sequence ids and the request's
    own; the stop token is kept in ``output``, as ``generate`` keeps it). ``finish_reason`` then
    says which: ``"stop"`` or ``"length"``. The K and V of ``tokens`` live in the cache under
    ``seq``: all of them but the newest output token, which the next decode step feeds.
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
        integer("id", self.id, 0)
        self.prompt = token_ids("prompt", self.prompt)
        integer(
            "max_new_tokens", self.max_new_tokens, 1
        )  # a request that generates nothing would never finish
        if not isinstance(self.stop, frozenset):
            raise TypeError(
                f"stop must be a frozenset of token ids, got {type(self.stop).__name__}"
            )
        real("arrival", self.arrival)

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
    """One line of the log: at ``step``, request ``request`` did ``kind`` (``detail``: tokens or a
    mode)."""

    step: int
    request: int
    kind: str  # arrive, reject, admit, prefill, decode, preempt, resume, finish
    detail: object = None


def timeline(events, num_steps: int) -> dict[int, list[str | None]]:
    """Each request's state at steps ``1 .. num_steps``, read from an event log (notebook 11).

    A state is what the request did in that step (``prefill``, ``decode``) or, in a step that gave
    it no tokens, where it was: ``waiting`` (not yet admitted, or preempted by recompute),
    ``swapped``, ``stalled`` (admitted but given no tokens: the step's token budget ran out);
    ``None`` before it arrived and after it finished.
    """
    num_steps = integer("num_steps", num_steps, 0)
    if isinstance(events, (str, bytes)) or not hasattr(events, "__iter__"):
        raise TypeError(
            f"events must be a list of Event (an engine's .events), got {type(events).__name__}"
        )
    events = list(events)
    for i, event in enumerate(events):
        if not isinstance(event, Event):
            raise TypeError(f"events[{i}] must be an Event, got {type(event).__name__}")
    states: dict[int, list[str | None]] = {}
    carried: dict[int, str | None] = {}
    by_step: dict[int, list[Event]] = {}
    for event in events:
        by_step.setdefault(event.step, []).append(event)
    for step in range(0, num_steps + 1):
        worked = {}
        for event in by_step.get(step, []):
            states.setdefault(event.request, [None] * num_steps)
            if event.kind == "arrive":
                carried[event.request] = "waiting"
            elif event.kind in ("admit", "resume"):
                carried[event.request] = "stalled"
            elif event.kind == "preempt":
                carried[event.request] = "swapped" if event.detail == "swap" else "waiting"
            elif event.kind in ("prefill", "decode"):
                worked[event.request] = event.kind
            elif event.kind in ("finish", "reject"):
                worked.setdefault(event.request, carried.get(event.request))
                carried[event.request] = None
        if step == 0:
            continue
        for request, row in states.items():
            row[step - 1] = worked.get(request, carried.get(request))
    return states
