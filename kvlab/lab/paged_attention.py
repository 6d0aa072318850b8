"""Notebooks 05 and 05b: what paging and preemption cost, measured (Kwon et al. 2023).

- :func:`measure_preemption_cost` times recompute against swap of one sequence on a real model,
  interleaved; :func:`measure_host_copy` times swap's transfer as many small copies against one.
- :func:`compare_attention` times paged decode attention (the Triton kernel on a GPU, the gather
  path on a CPU) against torch's SDPA on the same keys and values laid out contiguously.
- :func:`bench_rows` gives the section's rows of ``python -m kvlab bench``, the admission
  simulator's (:mod:`kvlab.lab.paging`) included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab import kernels
from kvlab._checks import integer, one_of
from kvlab.lab.timing import measure, merge_timings
from kvlab.serving.attention import ATTENTION_PATHS
from kvlab.serving.paged_decode import cache_for, prefill


@dataclass(frozen=True)
class PreemptionCost:
    """Measured cost of taking one sequence's blocks away and giving them back (notebook 05).

    ``recompute``: drop the blocks, then prefill the ``tokens`` again with the real model into
    fresh blocks. ``swap``: copy the blocks to host memory (pinned on a GPU) and back.
    Both are :class:`kvlab.lab.timing.Timing` of the whole round trip.
    """

    tokens: int
    blocks: int
    swap_bytes: int  # bytes copied to the host and back (both directions)
    recompute: object
    swap: object


def measure_preemption_cost(model, num_tokens: int, block_size: int = 16, warmup: int = 1, reps: int = 3,
                            seed: int = 0) -> PreemptionCost:
    """Time recompute and swap of one ``num_tokens``-token sequence on ``model``, interleaved (notebook 05).

    On a CPU the prefill runs the gather path (the Triton interpreter would time Python, not memory);
    on a GPU the kernels.
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
        cache.resume(seq)
        prefill(model, cache, seq, attention=attention)

    def swap():
        cache.preempt(seq, "swap")
        cache.resume(seq)

    timings = {"recompute": [], "swap": []}
    for _ in range(reps):  # interleaved, so that drift on a shared machine hits both alike
        timings["recompute"].append(measure(recompute, warmup=warmup, reps=1, device=model.device))
        timings["swap"].append(measure(swap, warmup=warmup, reps=1, device=model.device))
    merged = {k: merge_timings(v) for k, v in timings.items()}
    return PreemptionCost(num_tokens, blocks, 2 * blocks * cache.bytes_per_block, merged["recompute"], merged["swap"])


# --------------------------------------------------------------------------- swap's transfer

@dataclass(frozen=True)
class HostCopy:
    """Moving ``blocks`` blocks of ``block_bytes`` each from the device to host memory, timed one
    copy per block (``per_block``) and as one copy of the same bytes (``one_copy``)."""

    block_bytes: int
    blocks: int
    per_block: object  # Timing
    one_copy: object  # Timing

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


def copy_block_by_block(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> None:
    """One copy per row: the way a swap that copies block by block moves a cache."""
    for i in range(src.shape[0]):
        dst[i].copy_(src[i], non_blocking=non_blocking)


def measure_host_copy(total_bytes: int, block_bytes, device=None, warmup: int = 1, reps: int = 5) -> list[HostCopy]:
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
    sizes = [block_bytes] if isinstance(block_bytes, int) and not isinstance(block_bytes, bool) else list(block_bytes)
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
        per_block = measure(lambda: copy_block_by_block(rows_src, rows_dst, pin), warmup=warmup, reps=reps, device=dev)
        one = measure(lambda: rows_dst.copy_(rows_src, non_blocking=pin), warmup=warmup, reps=reps, device=dev)
        results.append(HostCopy(b, blocks, per_block, one))
    return results


@dataclass(frozen=True)
class AttentionTiming:
    """One decode step of attention over ``batch`` sequences of ``context`` tokens (notebooks 05, 05b)."""

    paged: object  # Timing of the paged path
    contiguous: object  # Timing of torch SDPA over a contiguous [batch, kv_heads, context, head_dim] cache
    kv_bytes: int  # K and V bytes one step must read
    path: str  # "kernel" or "reference"

    @property
    def paged_bytes_per_s(self) -> float:
        return self.kv_bytes / self.paged.median

    @property
    def contiguous_bytes_per_s(self) -> float:
        return self.kv_bytes / self.contiguous.median


def compare_attention(batch: int, context: int, block_size: int = 16, num_q_heads: int = 8, num_kv_heads: int = 2,
                      head_dim: int = 64, dtype=None, path: str | None = None, identity_table: bool = False,
                      num_splits: int | None = None, warmup: int = 2, reps: int = 5,
                      seed: int = 0) -> AttentionTiming:
    """Paged decode attention against torch SDPA on a contiguous cache, same data, interleaved (notebook 05).

    ``path`` defaults to the Triton kernel on a GPU and, on a CPU (where the interpreter's speed says
    nothing about the kernel), to ``"gather"``, the vectorised PyTorch paged path;
    ``"reference"`` is the per-sequence plain-PyTorch reference of ``kvlab.kernels``. The paged
    cache's blocks are a random permutation of the pool, or in order with ``identity_table``.
    The kernel path validates its inputs once and times the launches alone; ``num_splits`` is
    passed to it (None: its automatic choice).
    """
    from kvlab.devices import device_and_dtype, on_gpu

    path = one_of("path", path or ("kernel" if on_gpu() else "gather"), ATTENTION_PATHS)
    for name, value in (("batch", batch), ("context", context), ("block_size", block_size),
                        ("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("reps", reps)):
        integer(name, value, 1)
    integer("warmup", warmup, 0)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    dev, dtype = device_and_dtype(None, dtype)
    generator = torch.Generator().manual_seed(seed)
    per_seq = -(-context // block_size)
    order = torch.arange(batch * per_seq) if identity_table else torch.randperm(batch * per_seq, generator=generator)
    table = order.reshape(batch, per_seq).to(dev, torch.int32)
    pool_shape = (batch * per_seq, block_size, num_kv_heads, head_dim)
    k_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    v_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    # The same keys and values, laid out contiguously per sequence for SDPA.
    k_flat = k_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    v_flat = v_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    q = torch.randn(batch, num_q_heads, head_dim, generator=generator).to(dev, dtype)
    if path == "kernel":
        paged = kernels.paged_decode_launcher(q, k_pool, v_pool, table, lens, num_splits=num_splits)
    else:
        attend = kernels.paged_decode_attention_gather if path == "gather" else kernels.paged_decode_attention_ref

        def paged():
            return attend(q, k_pool, v_pool, table, lens)

    def contiguous():
        return F.scaled_dot_product_attention(q[:, :, None], k_flat, v_flat, enable_gqa=True)

    with torch.inference_mode():
        torch.testing.assert_close(paged().float(), contiguous()[:, :, 0].float(), atol=2e-2, rtol=2e-2)
        runs = {"paged": [], "contiguous": []}
        for _ in range(reps):
            runs["paged"].append(measure(paged, warmup=warmup if not runs["paged"] else 0, reps=1))
            runs["contiguous"].append(measure(contiguous, warmup=warmup if not runs["contiguous"] else 0, reps=1))
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return AttentionTiming(merge_timings(runs["paged"]), merge_timings(runs["contiguous"]), kv_bytes, path)


def bench_rows():
    """Paged vs contiguous decode attention, swap's transfer, and the admission simulator (notebook 05)."""
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate
    from kvlab.devices import on_gpu
    from kvlab.lab.paging import make_trace, simulate

    gpu = on_gpu()
    rows = []
    heads = (32, 8, 128) if gpu else (8, 2, 64)
    shape = dict(zip(("num_q_heads", "num_kv_heads", "head_dim"), heads))
    cases = [(32, 4096), (32, 16384), (1, 32768)] if gpu else [(4, 512), (4, 2048)]
    copy = calibrate().copy_bytes_per_s
    for batch, context in cases:
        t = compare_attention(batch, context, 16, reps=10 if gpu else 5, **shape)
        where = f"batch {batch}, context {context}, block 16"
        rows += [
            Row(f"paged attention b{batch} s{context}", t.paged_bytes_per_s / 1e9, "GB/s", f"{where}, {t.path} path"),
            Row(f"paged / copy bandwidth b{batch} s{context}", t.paged_bytes_per_s / copy, "fraction",
                "K+V bytes read once / calibrated copy bandwidth"),
            Row(f"SDPA contiguous b{batch} s{context}", t.contiguous_bytes_per_s / 1e9, "GB/s", f"{where}, contiguous cache"),
            Row(f"paged / SDPA time b{batch} s{context}", t.paged.median / t.contiguous.median, "x",
                "ratio of medians, same run"),
        ]
    if gpu:  # the kernel against itself: block-table indirection, and what split-K buys at batch 1
        permuted = compare_attention(32, 16384, 16, reps=10, **shape)
        ordered = compare_attention(32, 16384, 16, reps=10, identity_table=True, **shape)
        split = compare_attention(1, 32768, 16, reps=10, **shape)
        one = compare_attention(1, 32768, 16, reps=10, num_splits=1, **shape)
        rows += [
            Row("permuted / identity table time b32 s16384", permuted.paged.median / ordered.paged.median, "x",
                "same kernel; blocks in random order vs in order"),
            Row("num_splits=1 / split-K time b1 s32768", one.paged.median / split.paged.median, "x",
                "same kernel; automatic num_splits vs one split"),
        ]
    # swap's transfer: one copy per 16-token block of one layer's K (Llama-3-8B: 16 x 8 x 128 x 2 bytes)
    # against one copy of the same bytes; on a GPU device-to-pinned-host over PCIe
    total = (256 << 20) if gpu else (32 << 20)
    for r in measure_host_copy(total, [16 * 8 * 128 * 2, 1 << 20], reps=5):
        rows.append(Row(f"host copy in {r.block_bytes // 1024} KiB blocks / one copy", r.efficiency, "fraction",
                        f"{r.blocks} copies of {r.block_bytes:,} B against one of {r.total_bytes:,} B, same run"))
    trace = make_trace(200, "lognormal", mean_prompt=64, mean_output=128, max_len=512, seed=0)
    for policy in ("reserve-max", "reserve-estimate", "paged"):
        result = simulate(trace, policy, budget_tokens=8192, block_size=16, max_len=512)
        note = "200 lognormal requests, 8192-token budget, block 16"
        rows += [
            Row(f"{policy}: KV memory wasted", 100 * result.waste_fraction, "%", note),
            Row(f"{policy}: mean running batch", result.mean_batch, "requests", note),
            Row(f"{policy}: steps to finish the trace", result.steps, "steps", note),
        ]
    return rows
