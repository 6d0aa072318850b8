"""Notebooks 05 and 11: continuous batching (Yu et al. 2022; on a paged cache, Kwon et al. 2023).

Every step the scheduler decides who runs and with how many tokens, on any *memory* with the block
manager's calls (the engine's paged cache, or notebook 05's bare block manager or contiguous
regions). kvlab's policy:

- **make room first**: while the decodes' next tokens need more blocks than are free, preempt the
  newest running request (as vLLM and nano-vllm do) by recompute (drop its blocks, prefill again
  later; its committed full blocks stay cached) or swap (copy its blocks to host memory); one whose
  next token cannot fit its memory at all (a full contiguous region) is preempted, by recompute;
- **swapped requests come back first**, oldest first, in a step that preempted nothing;
- **decodes next**: one token for every decoding request;
- **then prefill chunks**, first come first served, within ``max_batched_tokens`` tokens per step
  (chunked prefill): a long prompt runs over several steps while the others keep decoding;
- **admission last**, first come first served, in a step that preempted nothing with nothing
  swapped out, while ``max_batch`` and the free blocks allow, leaving ``watermark_blocks`` free
  unless nothing else runs (so a new request does not force a preemption at once).

**A chunk is committed when it is scheduled**, so a request admitted later in the same step reuses
the blocks it computes: a burst behind one system prompt computes it once (the block manager says
why that is safe, and what vLLM v1 and SGLang do).

**Speculation** (``speculate=k``; Saxena 2023, Leviathan et al. 2023): a decoding request feeds its
newest token and up to ``k`` tokens that prompt lookup proposes, within the step's token budget and
the blocks free; the step's one forward pass checks them all. The longest prefix the model's own
greedy tokens agree with is kept, and the model's next token after it; the rejected draft's slots
are given back. A draft is computed but never cached (``commit``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvlab.serving import _checks
from kvlab.serving.request import Chunk, Request
from kvlab.speculative import prompt_lookup


@dataclass
class Scheduled:
    """One chunk of a step: ``request``'s tokens ``start .. start + count - 1``, the last
    ``len(draft)`` of them proposed (a speculative decode), not yet the request's."""

    request: Request
    start: int
    count: int
    kind: str  # "decode" or "prefill"
    draft: list[int] = field(default_factory=list)

    @property
    def chunk(self) -> Chunk:
        ids = self.request.token_ids[self.start : self.start + self.count] + self.draft
        return Chunk(self.request.seq, self.start, ids, 1 + len(self.draft))

    @property
    def completes(self) -> bool:
        """Every token of the request is computed after it: its last logits give the next token."""
        return self.start + self.count - len(self.draft) == self.request.num_tokens


@dataclass
class SchedulerStats:
    """Preemptions since the scheduler was made, and what they cost (notebook 05)."""

    preemptions: int = 0
    recomputed_tokens: int = 0  # computed tokens dropped by recompute preemptions
    swapped_blocks: int = 0  # blocks copied to host memory (and later back) by swap preemptions
    readmitted_tokens: int = 0  # tokens of requests readmitted after a recompute preemption
    readmitted_cached: int = 0  # of which the prefix cache served
    proposed_tokens: int = 0  # draft tokens fed by speculative decodes
    accepted_tokens: int = 0  # of which the model agreed with


class Scheduler:
    """Who runs each step; ``log(request, kind, detail)`` records every move and chunk."""

    def __init__(
        self, memory, max_batch: int, max_batched_tokens: int, preemption: str = "recompute",
        watermark_blocks: int = 0, log=None, speculate: int = 0,
    ):  # fmt: skip
        limits = preemption, max_batch, max_batched_tokens, watermark_blocks, log, speculate
        limits = _checks.scheduler(*limits)
        self.max_batch, self.max_batched_tokens, self.watermark_blocks, self.log = limits
        self.memory, self.preemption, self.speculate = memory, preemption, speculate
        self.waiting, self.running, self.swapped = deque(), [], deque()  # of Requests
        self.stats = SchedulerStats()

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self, preempted: bool | None = None) -> list[Scheduled]:
        """This step's chunks, one-token chunks first (the attention packs decode rows first).
        ``preempted``: what the step's :meth:`make_room` returned; None runs it here."""
        if preempted is None:
            preempted = self.make_room()
        if not preempted:
            self._swap_in()
        plan = [self._decode(r) for r in self.running if self._decoding(r)]
        scheduled = {id(e.request) for e in plan}
        budget = self.max_batched_tokens - len(plan)
        for entry in plan if self.speculate else []:  # every decode's own slot is reserved first
            budget -= self._propose(entry, budget)
        for request in self.running:
            if budget and id(request) not in scheduled and self._uncomputed(request):
                plan.append(self._chunk(request, budget))
                budget -= plan[-1].count
        if not preempted and not self.swapped:
            self._admit(plan, budget)
        return sorted(plan, key=lambda e: e.count > 1)

    def update(self, plan: list[Scheduled], next_tokens: list[int], now: float = 0.0):
        """Append each completing chunk's tokens (the runner's tokens after each chunk's last
        ``num_outputs``); free and return the requests that are done."""
        finished, next_tokens = [], iter(next_tokens)
        for entry in plan:
            request = entry.request
            outputs = [next(next_tokens) for _ in range(1 + len(entry.draft))]
            self.log(request, entry.kind, entry.count)
            if not entry.completes:
                continue
            self._accept(entry, outputs)
            if request.first_token_time is None:
                request.first_token_time = now
            if request.done:
                self._finish(request, now)
                finished.append(request)
        return finished

    def make_room(self) -> bool:
        """Preempt until every decoding request's next token has a slot; True if anyone was."""
        preempted = False
        for request in [r for r in self.running if self._decoding(r)]:
            if self.memory.blocks_to_append(request.seq) > self.memory.num_blocks:
                self._preempt(request, "recompute")  # it cannot grow in place
                preempted = True
        while self.running and self._decode_blocks() > self.memory.num_free:
            self._preempt(self.running[-1], self.preemption)
            preempted = True
        return preempted

    def _decoding(self, request: Request) -> bool:
        """Every token but the newest is computed: this step feeds the newest."""
        seq, memory = request.seq, self.memory
        return memory.num_computed(seq) == memory.num_tokens(seq) == request.num_tokens - 1

    def _uncomputed(self, request: Request) -> int:
        return self.memory.num_tokens(request.seq) - self.memory.num_computed(request.seq)

    def _decode_blocks(self) -> int:
        return sum(self.memory.blocks_to_append(r.seq) for r in self.running if self._decoding(r))

    def _preempt(self, request: Request, mode: str) -> None:
        self.running.remove(request)
        request.preemptions += 1
        self.stats.preemptions += 1
        self.log(request, "preempt", mode)
        held = self.memory.preempt(request.seq, mode)  # the tokens whose K and V it held
        if mode == "swap":
            self.stats.swapped_blocks += -(-held // self.memory.block_size)
        else:
            self.stats.recomputed_tokens += held
        request.state = "swapped" if mode == "swap" else "waiting"
        (self.swapped if mode == "swap" else self.waiting).appendleft(request)

    def _swap_in(self) -> None:
        """Swapped requests back, oldest first, leaving the blocks this step's decodes take."""
        while self.swapped and len(self.running) < self.max_batch:
            request = self.swapped[0]
            held = request.token_ids[: self.memory.num_tokens(request.seq)]
            needed = self.memory.blocks_to_resume(request.seq, request.token_ids, checked=True)
            if not self._fits(needed + self._decode_blocks()):  # its blocks and this step's decodes
                return
            self.swapped.popleft()
            self.memory.resume(request.seq, held, checked=True)
            self._run(request, "resume", "swap")

    def _decode(self, request: Request) -> Scheduled:
        self.memory.reserve(request.seq, 1)  # the slot of the token fed this step
        return self._scheduled(request, 1, "decode")

    def _propose(self, entry: Scheduled, budget: int) -> int:
        """Add to a decode up to ``speculate`` proposed tokens, within the budget, the free blocks
        and the tokens left to generate, their slots reserved and committed; returns how many."""
        request, memory = entry.request, self.memory
        room = min(self.speculate, budget, request.max_new_tokens - len(request.output) - 1)
        draft = prompt_lookup(request.token_ids, room) if room > 0 else []
        while draft and not self._fits(memory.blocks_to_append(request.seq, len(draft))):
            draft.pop()
        if draft:
            memory.reserve(request.seq, len(draft))
            entry.draft, entry.count = draft, 1 + len(draft)
            memory.commit(request.seq, entry.start + entry.count, request.token_ids, checked=True)
            self.stats.proposed_tokens += len(draft)
        return len(draft)

    def _accept(self, entry: Scheduled, outputs: list[int]) -> None:
        """Append the model's tokens while the draft agrees (its longest matching prefix, then the
        token after it), up to a stop or ``max_new_tokens``; give back the rejected slots."""
        request, guesses = entry.request, entry.draft + [None]
        for token, guess in zip(outputs, guesses):
            request.token_ids.append(token)
            if request.done or token != guess:
                break
        if entry.draft:
            new = request.token_ids[entry.start + 1 :]
            self.stats.accepted_tokens += sum(t == g for t, g in zip(new, entry.draft))
        if entry.draft and not request.done:  # all but the newest are computed
            self.memory.truncate(request.seq, request.num_tokens - 1)

    def _chunk(self, request: Request, budget: int) -> Scheduled:
        return self._scheduled(request, min(self._uncomputed(request), budget), "prefill")

    def _scheduled(self, request: Request, count: int, kind: str) -> Scheduled:
        """``count`` tokens of ``request``, committed now (the module)."""
        start = self.memory.num_computed(request.seq)
        self.memory.commit(request.seq, start + count, request.token_ids, checked=True)
        return Scheduled(request, start, count, kind)

    def _admit(self, plan: list[Scheduled], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            request, tokens = self.waiting[0], self.waiting[0].token_ids
            if request.seq is None:
                if not self._fits(self.memory.blocks_to_admit(tokens, checked=True)):
                    return
                request.seq, cached = self.memory.admit(tokens, checked=True)
                self._run(request, "admit", cached)
            else:  # preempted by recompute: its prompt and generated tokens again
                if not self._fits(self.memory.blocks_to_resume(request.seq, tokens, checked=True)):
                    return
                cached = self.memory.resume(request.seq, tokens, checked=True)
                self.stats.readmitted_tokens += len(tokens)
                self.stats.readmitted_cached += cached
                self._run(request, "resume", "recompute")
            self.waiting.popleft()
            request.admitted_tokens += len(tokens)
            request.cached_tokens += cached
            plan.append(self._chunk(request, budget))
            budget -= plan[-1].count

    def _run(self, request: Request, kind: str, detail) -> None:
        request.state = "running"
        self.running.append(request)
        self.log(request, kind, detail)

    def _finish(self, request: Request, now: float) -> None:
        self.memory.free(request.seq)
        request.seq, request.state, request.finish_time = None, "finished", now
        request.finish_reason = "stop" if request.stopped else "length"
        self.running.remove(request)
        self.log(request, "finish", len(request.output))

    def _fits(self, blocks: int) -> bool:
        """Alone, a request may use the whole pool; else the watermark stays free."""
        return blocks <= self.memory.num_free - (self.watermark_blocks if self.running else 0)
