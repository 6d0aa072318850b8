"""Notebook 05: how much KV memory contiguous reservation and paged allocation waste on a request
trace.

:func:`simulate` runs a trace through kvlab's one :class:`~kvlab.serving.scheduler.Scheduler` (the
engine's policy, with no token budget and no watermark) over one of three memories, without a
model: each step, every scheduled chunk counts as computed and a request that completes gets a
token. The memories answer the block manager's calls (Kwon et al. 2023):

- ``paged``: a :class:`~kvlab.cache.block_manager.BlockManager` of ``budget // block_size`` blocks,
  taken one at a time as sequences grow;
- ``reserve-max`` and ``reserve-estimate``: :class:`ContiguousMemory`, one region of token slots per
  request placed first fit, of ``max_len`` slots or of ``prompt + estimate``. A region cannot grow:
  a request that outgrows its estimate is preempted (recompute) and readmitted reserving
  ``max_len``.

:func:`make_trace` draws the requests' lengths. The per-request formula the simulation is read
against, and the most paged allocation can waste, are in :mod:`kvlab.theory.paging`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvlab._checks import integer, items, one_of, real, require_memory
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.blocks import MAX_BLOCK_ID, PREEMPTION_MODES
from kvlab.serving.request import Request
from kvlab.serving.scheduler import Scheduler

DISTRIBUTIONS = ("uniform", "lognormal", "bimodal")
POLICIES = ("reserve-max", "reserve-estimate", "paged")
TABLE_ENTRY_BYTES = 4  # one int32 block id per block-table entry
REGION_BYTES = 8  # a contiguous region: int32 start and int32 length


def _draw(rng, distribution: str, mean: float, size: int):
    if distribution == "uniform":  # integers 1 .. 2 mean - 1: mean ``mean``
        return rng.integers(1, max(2, round(2 * mean)), size=size)
    if distribution == "lognormal":  # sigma 1, mu chosen so that the mean is ``mean``
        return np.rint(rng.lognormal(np.log(mean) - 0.5, 1.0, size=size))
    # bimodal: half short (0.25 mean), half long (1.75 mean), each times a uniform 0.5..1.5 jitter
    centre = np.where(rng.random(size) < 0.5, 0.25, 1.75) * mean
    return np.rint(centre * rng.uniform(0.5, 1.5, size=size))


def make_trace(
    n: int,
    distribution: str = "lognormal",
    mean_prompt: float = 64,
    mean_output: float = 128,
    max_len: int = 512,
    seed: int = 0,
) -> list[Request]:
    """``n`` requests with prompt and output lengths drawn from ``distribution`` (notebook 05).

    ``uniform``: integers in [1, 2 mean - 1]; ``lognormal``: sigma 1 (a long tail, as in chat
    traces); ``bimodal``: half at a quarter of the mean, half at 1.75 times it, each jittered by a
    uniform factor in [0.5, 1.5]. Lengths are then clipped so that ``1 <= prompt``, ``1 <= output``
    and ``prompt + output <= max_len`` (which moves the means slightly). The prompts' token ids are
    all 0: only lengths matter here.
    """
    one_of("distribution", distribution, DISTRIBUTIONS)
    n, max_len, seed = integer("n", n, 0), integer("max_len", max_len, 2), integer("seed", seed, 0)
    mean_prompt, mean_output = (
        real("mean_prompt", mean_prompt, 1),
        real("mean_output", mean_output, 1),
    )
    # A request is a Python object of some hundred bytes, and a list of its prompt's token ids.
    require_memory(
        f"a trace of {n:,} requests", int(n * (200 + 8 * min(mean_prompt, max_len))), "cpu"
    )
    rng = np.random.default_rng(seed)
    prompts = np.clip(_draw(rng, distribution, mean_prompt, n), 1, max_len - 1).astype(int)
    outputs = np.clip(_draw(rng, distribution, mean_output, n), 1, max_len - prompts).astype(int)
    return [Request(i, [0] * int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]


# --------------------------------------------------------------------------- contiguous regions


@dataclass
class _Region:
    start: int
    size: int
    num_tokens: int
    prompt: int
    num_computed: int = 0
    state: str = "resident"
    outgrown: bool = False


class ContiguousMemory:
    """One contiguous region of token slots per request, placed first fit in ``budget`` slots: the
    block manager's calls, with a "block" of one slot (notebook 05).

    ``estimate=None`` reserves ``max_len`` slots per request; else ``prompt + estimate`` (at most
    ``max_len``), and ``max_len`` for a request that outgrew its region. ``refused_free`` is set
    when an admission is refused although enough slots are free in total (holes too small).
    """

    block_size = 1

    def __init__(self, budget: int, max_len: int, estimate: int | None = None):
        budget, max_len = integer("budget", budget), integer("max_len", max_len)
        estimate = None if estimate is None else integer("estimate", estimate)
        self.num_blocks, self.max_len, self.estimate = budget, max_len, estimate
        self._seqs: dict[int, _Region] = {}
        self._next_id = 0
        self.refused_free = 0

    @property
    def num_free(self) -> int:
        return self.num_blocks - sum(r.size for r in self._seqs.values() if r.state == "resident")

    def region_size(self, seq_id: int) -> int:
        return self._region(seq_id).size

    def num_tokens(self, seq_id: int) -> int:
        return self._region(seq_id).num_tokens

    def num_computed(self, seq_id: int) -> int:
        return self._region(seq_id).num_computed

    def blocks_to_admit(self, token_ids, salt=None, checked=False) -> int:
        return self._slots_if_placed(self._size(len(token_ids), False))

    def admit(self, token_ids, salt=None, checked=False) -> tuple[int, int]:
        size = self._size(len(token_ids), False)
        seq_id, self._next_id = self._next_id, self._next_id + 1
        self._seqs[seq_id] = _Region(self._first_fit(size), size, len(token_ids), len(token_ids))
        return seq_id, 0

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """0 while the region has room; more than the whole memory once it is full: it cannot
        grow."""
        region = self._region(seq_id)
        return 0 if region.num_tokens + num_tokens <= region.size else self.num_blocks + 1

    def reserve(self, seq_id: int, num_tokens: int) -> None:
        self._region(seq_id).num_tokens += num_tokens

    def commit(self, seq_id: int, num_computed: int, token_ids=None, checked=False) -> None:
        self._region(seq_id).num_computed = num_computed

    def preempt(self, seq_id: int, mode: str) -> int:
        one_of(
            "mode", mode, ("recompute",)
        )  # a region's contents are not swapped in this simulation
        region = self._region(seq_id)
        held, region.num_computed, region.state = region.num_computed, 0, "recompute"
        region.outgrown = region.outgrown or region.num_tokens == region.size
        return held

    def blocks_to_resume(self, seq_id: int, token_ids, checked=False) -> int:
        region = self._region(seq_id)
        return self._slots_if_placed(self._size(0, region.outgrown, region.prompt))

    def resume(self, seq_id: int, token_ids, checked=False) -> int:
        region = self._region(seq_id)
        region.size = self._size(0, region.outgrown, region.prompt)
        region.start, region.state = self._first_fit(region.size), "resident"
        region.num_tokens = len(token_ids)
        return 0

    def free(self, seq_id: int) -> None:
        self._region(seq_id)
        del self._seqs[seq_id]

    def _region(self, seq_id) -> _Region:
        region = self._seqs.get(integer("seq_id", seq_id, 0))
        if region is None:
            raise ValueError(
                f"seq_id {seq_id!r} is not a live sequence; live: {sorted(self._seqs)}"
            )
        return region

    def _size(self, prompt: int, outgrown: bool, known_prompt: int | None = None) -> int:
        if self.estimate is None or outgrown:
            return self.max_len
        return min(
            self.max_len, (known_prompt if known_prompt is not None else prompt) + self.estimate
        )

    def _slots_if_placed(self, size: int) -> int:
        """``size`` if a hole that large exists now, else more than the memory (refused)."""
        if self._hole(size) is not None:
            return size
        if self.num_free >= size:
            self.refused_free = self.num_free
        return self.num_blocks + 1

    def _hole(self, size: int) -> int | None:
        """The lowest start of a free run of ``size`` slots (first fit), or None."""
        cursor = 0
        for region in sorted(
            (r for r in self._seqs.values() if r.state == "resident"), key=lambda r: r.start
        ):
            if region.start - cursor >= size:
                return cursor
            cursor = region.start + region.size
        return cursor if self.num_blocks - cursor >= size else None

    def _first_fit(self, size: int) -> int:
        start = self._hole(size)
        if start is None:
            raise MemoryError(f"no hole of {size} slots")  # the scheduler asked blocks_to_* first
        return start


# --------------------------------------------------------------------------- the simulation


@dataclass
class SimResult:
    """What one memory did with one trace (notebook 05). Token-steps sum a quantity over steps.

    ``used``: slots holding a token's K and V (a request holds its prompt and all but its newest
    output token). ``reserved``: reserved slots that a later token of the same request will fill
    (reservation waste). ``internal``: reserved slots no token will ever fill (internal
    fragmentation). ``final_block``: empty slots in paged requests' last blocks. ``external``: free
    slots while the queue's head was refused although that many were free in total (holes too
    small).
    """

    policy: str
    budget_tokens: int
    block_size: int
    max_batch: int
    steps: int = 0
    admitted: int = 0  # admissions, readmissions after recompute preemptions included
    completed: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0  # computed tokens dropped by recompute preemptions
    swapped_blocks: int = 0  # blocks copied to host (and later back) by swap preemptions
    used: int = 0
    reserved: int = 0
    internal: int = 0
    final_block: int = 0
    external: int = 0
    peak_batch: int = 0
    peak_metadata_bytes: int = 0
    batch_by_step: list = field(default_factory=list)
    completed_by_step: list = field(default_factory=list)  # cumulative

    @property
    def allocated(self) -> int:
        return self.used + self.reserved + self.internal + self.final_block

    @property
    def waste_fraction(self) -> float:
        """Share of allocated KV memory not holding a token, averaged over the run
        (time-weighted)."""
        return 1 - self.used / self.allocated if self.allocated else 0.0

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_by_step) / len(self.batch_by_step) if self.batch_by_step else 0.0

    @property
    def mean_tokens_held(self) -> float:
        """Tokens a running request held, averaged over every step of every running request."""
        request_steps = sum(self.batch_by_step)
        return self.used / request_steps if request_steps else 0.0


def _check_sim_args(
    trace, policy, budget_tokens, block_size, max_batch, max_len, preemption
) -> list:
    what = "kvlab.serving.request.Request"
    trace = items("trace", trace, Request, what=what, each=f"a {what}")
    one_of("policy", policy, POLICIES)
    one_of("preemption", preemption, PREEMPTION_MODES)
    for name, value in (
        ("budget_tokens", budget_tokens),
        ("block_size", block_size),
        ("max_batch", max_batch),
        ("max_len", max_len),
    ):
        integer(name, value, 1)
    longest = max((len(r.prompt) + r.max_new_tokens for r in trace), default=0)
    if longest > max_len:
        raise ValueError(
            f"max_len ({max_len}) must be >= the longest request in the trace ({longest} tokens)"
        )
    if policy == "paged" and budget_tokens // block_size > MAX_BLOCK_ID:
        raise ValueError(
            f"budget_tokens ({budget_tokens:,}) makes {budget_tokens // block_size:,} blocks of"
            f" {block_size}, more than the {MAX_BLOCK_ID:,} block ids an int32 block table holds"
        )
    need = max_len if policy != "paged" else -(-longest // block_size) * block_size
    if trace and need > budget_tokens:
        raise ValueError(
            f"budget_tokens ({budget_tokens}) cannot hold one request: {policy} needs {need} tokens"
            f" (max_len {max_len}, block_size {block_size})"
        )
    return trace


def simulate(
    trace,
    policy: str,
    budget_tokens: int,
    block_size: int = 16,
    max_batch: int = 256,
    max_len: int | None = None,
    estimate: int | None = None,
    preemption: str = "recompute",
) -> SimResult:
    """Run ``trace`` through one KV memory, one step at a time, with the engine's scheduler
    (notebook 05).

    Every request arrives at step 0 and waits first come, first served. A request admitted at step
    ``t`` is prefilled in that step (a prefill costs one step, like a decode) and generates one
    token per step from then on: with output ``G`` it finishes at step ``t + G - 1`` unless
    preempted. When a paged request needs a block and none is free, the newest running request is
    preempted by ``preemption`` (see :mod:`kvlab.serving.scheduler`). ``estimate``
    (``reserve-estimate``) defaults to the trace's mean output. The requests of ``trace`` are
    copied, not changed.
    """
    what = "kvlab.serving.request.Request"
    trace = items("trace", trace, Request, what=what, each=f"a {what}")
    longest = max((len(r.prompt) + r.max_new_tokens for r in trace), default=1)
    max_len = max_len if max_len is not None else longest
    trace = _check_sim_args(
        trace, policy, budget_tokens, block_size, max_batch, max_len, preemption
    )
    if estimate is None:
        estimate = max(1, round(sum(r.max_new_tokens for r in trace) / max(1, len(trace))))
    integer("estimate", estimate, 1)
    if policy == "paged":
        memory = BlockManager(budget_tokens // block_size, block_size)
    else:
        memory = ContiguousMemory(
            budget_tokens, max_len, estimate if policy == "reserve-estimate" else None
        )
    result = SimResult(policy, budget_tokens, block_size, max_batch)

    def count_admissions(request, kind, detail=None):
        result.admitted += kind == "admit" or (kind, detail) == ("resume", "recompute")

    scheduler = Scheduler(
        memory, max_batch, budget_tokens + max_batch, preemption, log=count_admissions
    )
    for r in trace:
        scheduler.add(Request(r.id, list(r.prompt), r.max_new_tokens))
    while scheduler.has_work():
        result.steps += 1
        plan = scheduler.schedule()
        _account(result, scheduler.running, memory, policy)
        result.completed += len(scheduler.update(plan, [0] * len(plan)))
        result.completed_by_step.append(result.completed)
    result.preemptions = scheduler.stats.preemptions
    result.recomputed_tokens, result.swapped_blocks = (
        scheduler.stats.recomputed_tokens,
        scheduler.stats.swapped_blocks,
    )
    return result


def _account(result: SimResult, running: list[Request], memory, policy: str) -> None:
    """This step's memory, summed into ``result`` (see its fields)."""
    widest = 0
    for request in running:
        held = memory.num_tokens(request.seq)
        result.used += held
        if policy == "paged":
            blocks = len(memory.block_table(request.seq))
            result.final_block += blocks * memory.block_size - held
            widest = max(widest, blocks)
        else:
            size, final = (
                memory.region_size(request.seq),
                len(request.prompt) + request.max_new_tokens - 1,
            )
            result.reserved += min(size, final) - held
            result.internal += max(0, size - final)
    if policy != "paged":
        result.external += memory.refused_free
        memory.refused_free = 0
    metadata = (
        TABLE_ENTRY_BYTES * len(running) * widest
        if policy == "paged"
        else REGION_BYTES * len(running)
    )
    result.peak_metadata_bytes = max(result.peak_metadata_bytes, metadata)
    result.peak_batch = max(result.peak_batch, len(running))
    result.batch_by_step.append(len(running))
