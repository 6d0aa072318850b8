"""Notebook 05, PagedAttention (section 9.5): what preemption costs, measured (Kwon et al. 2023).

- :func:`measure_preemption_cost` times recompute, swap-out and swap-in of one sequence on a real
  model, one repeat of each in turn; :func:`measure_host_copy` times swap's transfer as many small
  copies against one.
- :func:`measure_cached_recompute` counts what a recompute preemption recomputes once prefix caching
  keeps the request's own blocks, on kvlab's engine (:func:`recompute_workload` makes it preempt).
- :func:`cached_recompute_rows`: its rows of ``python -m kvlab bench``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from kvlab._checks import flag, instance, integer
from kvlab.lab.timing import Timing, measure, merge_timings
from kvlab.serving.engine import Engine
from kvlab.serving.paged_decode import cache_for, prefill


def _timing(times) -> Timing:
    ordered = sorted(times)
    return Timing(statistics.median(ordered), ordered[0], ordered[-1], tuple(times))


@dataclass(frozen=True)
class PreemptionCost:
    """Measured cost of taking one sequence's blocks away and giving them back (notebook 05).

    ``recompute``: drop the blocks, then prefill the ``tokens`` again with the real model into
    fresh blocks. ``swap_out``: copy the blocks to host memory (pinned on a GPU) and free them;
    ``swap_in``: take blocks again and copy the K and V back. Each is a
    :class:`kvlab.lab.timing.Timing`; ``swap`` is the round trip, repeat by repeat. The request
    waits for the swap-in; the swap-out can overlap other work (see
    :func:`kvlab.theory.preemption.preemption_per_token`), though kvlab's waits for its copies.
    """

    tokens: int
    blocks: int
    swap_bytes: int  # bytes copied to the host and back (both directions)
    recompute: Timing
    swap_out: Timing
    swap_in: Timing

    @property
    def swap(self) -> Timing:
        return _timing([o + i for o, i in zip(self.swap_out.times, self.swap_in.times)])

    @property
    def bytes_each_way(self) -> int:
        return self.swap_bytes // 2


def measure_preemption_cost(
    model, num_tokens: int, block_size: int = 16, warmup: int = 1, reps: int = 3, seed: int = 0
) -> PreemptionCost:
    """Time recompute, swap-out and swap-in of one ``num_tokens``-token sequence on ``model``, one
    repeat of each in turn (notebook 05). On a CPU the prefill runs the gather path (the Triton
    interpreter would time Python, not memory); on a GPU the kernels. Prefix caching is off: a
    recompute prefills every token.
    """
    from kvlab.devices import on_gpu

    integer("num_tokens", num_tokens, 2)
    integer("block_size", block_size, 1)
    integer("reps", reps, 1)
    integer("warmup", warmup, 0)
    attention = "kernel" if on_gpu() else "gather"
    blocks = -(-num_tokens // block_size)
    cache = cache_for(model, blocks, block_size)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=generator).tolist()
    seq = cache.new_sequence()
    prefill(model, cache, seq, tokens, attention)

    def recompute():
        cache.preempt(seq, "recompute")
        cache.resume(seq, tokens)
        prefill(model, cache, seq, tokens, attention)

    steps = {
        "recompute": recompute,
        "swap_out": lambda: cache.preempt(seq, "swap"),
        "swap_in": lambda: cache.resume(seq, tokens),
    }
    for _ in range(warmup):
        for step in steps.values():
            step()
    timings = {name: [] for name in steps}
    for _ in range(
        reps
    ):  # one repeat of each in turn, so that drift on a shared machine hits all alike
        for name, step in steps.items():
            timings[name].append(measure(step, warmup=0, reps=1, device=model.device))
    merged = {k: merge_timings(v) for k, v in timings.items()}
    return PreemptionCost(num_tokens, blocks, 2 * blocks * cache.bytes_per_block, **merged)


# --------------------------------------------------------------------------- recompute with prefix
# caching


@dataclass(frozen=True)
class CachedRecompute:
    """Recompute preemption on the same requests with prefix caching off and on (notebook 05).

    From the run with caching on: ``held``, per preemption, the tokens whose K and V the request
    held (all dropped); ``served``, per readmission, the leading tokens its cached blocks gave back,
    which are not recomputed. ``prefill_tokens``: tokens the engine prefilled in all (prompts and
    recomputes), ``{False: off, True: on}``. ``same_tokens``: both runs generated the same tokens.
    """

    block_size: int
    prompt_tokens: int
    held: tuple
    served: tuple
    prefill_tokens: dict
    same_tokens: bool

    @property
    def dropped(self) -> int:
        return sum(self.held)

    @property
    def from_cache(self) -> int:
        return sum(self.served)

    @property
    def recomputed(self) -> int:
        return self.dropped - self.from_cache

    @property
    def full_block_tokens(self) -> int:
        """The most the cache could give back: the held tokens in full blocks (a partly filled last
        block is never hashed)."""
        return sum(h // self.block_size * self.block_size for h in self.held)

    @property
    def partial_block_tokens(self) -> int:
        return self.dropped - self.full_block_tokens

    @property
    def evicted_tokens(self) -> int:
        """Held tokens in full blocks that the pool handed to other requests before the
        readmission."""
        return self.full_block_tokens - self.from_cache


def measure_cached_recompute(
    model,
    prompts,
    max_new_tokens,
    num_blocks: int,
    block_size: int = 16,
    attention: str | None = None,
) -> CachedRecompute:
    """Run ``prompts`` (``max_new_tokens``: an int, or one per prompt) through kvlab's engine in a
    pool of ``num_blocks`` blocks, preempting by recompute, with prefix caching off and then on, and
    count what the preemptions dropped and what the cache gave back at each readmission (notebook
    05).

    The counts are read from the cache at the scheduler's ``log`` calls: at a preemption, before the
    blocks go, the request's computed tokens; at a readmission, after the prefix match, the tokens
    its cached blocks serve. The engine itself is unchanged.
    """
    integer("num_blocks", num_blocks, 1)
    integer("block_size", block_size, 1)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a non-empty list of token-id lists")
    runs = {}
    for caching in (False, True):
        engine = Engine(
            model,
            num_blocks,
            block_size,
            max_batch=len(prompts),
            max_batched_tokens=max(len(prompts), sum(len(p) for p in prompts)),
            prefix_caching=caching,
            preemption="recompute",
            attention=attention,
            cuda_graphs=False,
            watermark=0.0,
        )
        counts = SimpleNamespace(held=[], served=[])
        engine.scheduler.log = _counting(engine, counts, engine.scheduler.log)
        tokens = engine.generate(list(prompts), max_new_tokens)
        runs[caching] = (tokens, counts, engine.stats.prefill_tokens)
    on = runs[True][1]
    return CachedRecompute(
        block_size,
        sum(len(p) for p in prompts),
        tuple(on.held),
        tuple(on.served),
        {c: runs[c][2] for c in runs},
        runs[False][0] == runs[True][0],
    )


def _counting(engine, counts, log):
    """``log`` that first records the request's computed tokens at each preemption and
    readmission."""

    def record(request, kind, detail=None):
        if kind == "preempt" and detail == "recompute":
            counts.held.append(engine.cache.num_computed(request.seq))
        elif kind == "resume" and detail == "recompute":
            counts.served.append(
                engine.cache.num_computed(request.seq)
            )  # resume counted the hits as computed
        log(request, kind, detail)

    return record


# --------------------------------------------------------------------------- swap's transfer


@dataclass(frozen=True)
class HostCopy:
    """Moving ``blocks`` blocks of ``block_bytes`` each from the device to host memory, timed one
    copy per block (``per_block``) and as one copy of the same bytes (``one_copy``).

    The fixed-cost model of a copy: ``t = t0 + b / beta``, with beta the one-copy rate. Each block's
    copy then spends ``transfer_s`` = b / beta moving bytes and ``fixed_cost_s`` = t0 on everything
    else (a launch, a driver call, here a Python call); the fixed cost dominates when t0 > b / beta,
    which is when the block-by-block rate falls under half the one-copy rate.
    """

    block_bytes: int
    blocks: int
    per_block: Timing
    one_copy: Timing

    @property
    def total_bytes(self) -> int:
        return self.block_bytes * self.blocks

    @property
    def bytes_per_s(self) -> float:
        """Rate of the block-by-block copy."""
        return self.total_bytes / self.per_block.median

    @property
    def one_copy_bytes_per_s(self) -> float:
        return self.total_bytes / self.one_copy.median

    @property
    def efficiency(self) -> float:
        """Block-by-block rate as a fraction of the one-copy rate."""
        return self.one_copy.median / self.per_block.median

    @property
    def transfer_s(self) -> float:
        """Seconds one block's bytes take at the one-copy rate."""
        return self.block_bytes / self.one_copy_bytes_per_s

    @property
    def fixed_cost_s(self) -> float:
        """Seconds per block-by-block copy beyond its transfer (negative when small copies ran
        faster)."""
        return self.per_block.median / self.blocks - self.transfer_s

    @property
    def fixed_cost_dominates(self) -> bool:
        return self.fixed_cost_s > self.transfer_s


def copy_block_by_block(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> None:
    """One copy per row: the way a swap that copies block by block moves a cache."""
    instance("src", src, torch.Tensor), instance("dst", dst, torch.Tensor)
    for i in range(src.shape[0]):
        dst[i].copy_(src[i], non_blocking=non_blocking)


def measure_host_copy(
    total_bytes: int, block_bytes, device=None, warmup: int = 1, reps: int = 5
) -> list[HostCopy]:
    """Time a swap-out's transfer against block size (notebook 05): ``total_bytes`` of device
    memory copied to host memory as one copy per block of each size in ``block_bytes``, and as one
    copy. On a GPU the host buffer is pinned and the copies cross PCIe; on a CPU "host" and
    "device" are the same DRAM, and the per-copy cost is dispatch. The PagedAttention paper
    measured swap losing to recompute at small block sizes for this reason: many small transfers
    use the link poorly. (``PagedKVCache`` gathers a sequence's blocks on the device and moves them
    in one copy per layer stack, which avoids it.)

    Each block size copies the largest whole number of its blocks that fits in ``total_bytes``.
    Returns one ``HostCopy`` per block size, in the order given.
    """
    from kvlab.devices import device as default_device

    total_bytes = integer("total_bytes", total_bytes, 4)
    sizes = (
        [block_bytes]
        if isinstance(block_bytes, int) and not isinstance(block_bytes, bool)
        else list(block_bytes)
    )
    if not sizes:
        raise ValueError("block_bytes must name at least one block size")
    for b in sizes:
        integer("block_bytes", b, 4, total_bytes + 1)
        if b % 4:
            raise ValueError(f"block_bytes must be a multiple of 4 (fp32 elements), got {b}")
    dev = torch.device(device) if device is not None else default_device()
    pin = dev.type == "cuda"
    src = torch.empty(total_bytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty(total_bytes // 4, dtype=torch.float32, pin_memory=pin)
    results = []
    for b in sizes:
        blocks = total_bytes // b
        rows_src = src[: blocks * b // 4].view(blocks, b // 4)
        rows_dst = dst[: blocks * b // 4].view(blocks, b // 4)
        per_block = measure(
            lambda: copy_block_by_block(rows_src, rows_dst, pin),
            warmup=warmup,
            reps=reps,
            device=dev,
        )
        one = measure(
            lambda: rows_dst.copy_(rows_src, non_blocking=pin), warmup=warmup, reps=reps, device=dev
        )
        results.append(HostCopy(b, blocks, per_block, one))
    return results


def cached_recompute_rows(gpu: bool) -> list:
    """Recompute preemption with prefix caching on: how much of what it dropped came back from the
    cache."""
    flag("gpu", gpu)
    from kvlab.lab.bench import Row
    from kvlab.lab.models import tiny_model

    model = (
        tiny_model("llama", size="real")
        if gpu
        else tiny_model(
            "llama", layers=2, hidden=256, q_heads=4, kv_heads=2, intermediate=768, vocab=4096
        )
    )
    prompts, new_tokens, blocks = recompute_workload(model.config.vocab_size, gpu)
    r = measure_cached_recompute(model, prompts, new_tokens, blocks, block_size=16)
    note = (
        f"{len(prompts)} requests, {blocks} blocks of 16, {model.shape.name}, recompute preemption"
    )
    return [
        Row(
            "recompute: dropped tokens served from the prefix cache",
            100 * r.from_cache / max(1, r.dropped),
            "%",
            note,
        ),
        Row(
            "recompute: tokens prefilled, caching on / off",
            r.prefill_tokens[True] / r.prefill_tokens[False],
            "x",
            note + ", same requests",
        ),
    ]


def recompute_workload(vocab: int, gpu: bool, seed: int = 0) -> tuple[list, list, int]:
    """``(prompts, max_new_tokens, num_blocks)`` that make kvlab's engine preempt by recompute
    (notebook 05): ten random prompts of 30 to 60 tokens, each generating 8 to 80 tokens (eight
    times as many of both on a GPU), all queued at once, in a pool of 16-token blocks with a third
    of the blocks the requests would hold together at their longest."""
    vocab, gpu = integer("vocab", vocab), flag("gpu", gpu)
    scale = 8 if gpu else 1
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(30 * scale, 60 * scale + 1, (10,), generator=generator).tolist()
    outputs = torch.randint(8 * scale, 80 * scale + 1, (10,), generator=generator).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]
    needed = sum(-(-(p + g - 1) // 16) for p, g in zip(lengths, outputs))
    longest = max(-(-(p + g - 1) // 16) for p, g in zip(lengths, outputs))
    return prompts, outputs, max(longest, -(-needed // 3))
