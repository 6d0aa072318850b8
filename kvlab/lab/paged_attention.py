"""Notebooks 05 and 05b: what reading a paged cache costs, measured (Kwon et al. 2023).

- :func:`compare_attention` times paged decode attention (the Triton kernel on a GPU, the gather
  path on a CPU) against torch's SDPA on the same keys and values laid out contiguously, beside
  ``kvlab.theory.paging.gather_overhead_s``, what the gather path's extra copy should cost;
  :func:`compare_splits` times the kernel with ``num_splits`` splits, with one, and SDPA, in one
  loop that alternates them.
- :func:`bench_rows` gives the section's rows of ``python -m kvlab bench``: these, preemption's
  (:mod:`kvlab.lab.preemption`) and the admission simulator's (:mod:`kvlab.lab.paging`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kvlab import kernels
from kvlab._checks import integer, named_shapes, one_of, token_ids
from kvlab.kernels.paged_attention_torch import gather_blocks
from kvlab.lab.timing import Timing, measure, merge_timings
from kvlab.serving.attention import ATTENTION_PATHS
from kvlab.theory.prefill_attention import PrefillWork, prefill_attention_work


@dataclass(frozen=True)
class AttentionTiming:
    """One decode step of attention over ``batch`` sequences of ``context`` tokens (notebooks 05,
    05b)."""

    paged: object  # Timing of the paged path
    # Timing of torch SDPA over a contiguous [batch, kv_heads, context, head_dim] cache
    contiguous: object
    kv_bytes: int  # K and V bytes one step must read
    path: str  # "kernel", "gather" or "reference"
    # On the gather path, timed in the same loop: the gather alone (``gather_blocks``), and a
    # plain copy of the pools' K and V (``kv_bytes`` read and written), the ceiling beside it.
    gather: object = None
    copy: object = None

    @property
    def paged_bytes_per_s(self) -> float:
        return self.kv_bytes / self.paged.median

    @property
    def contiguous_bytes_per_s(self) -> float:
        return self.kv_bytes / self.contiguous.median


def _paged_case(
    batch, context, block_size, num_q_heads, num_kv_heads, head_dim, dtype, identity_table, seed
):
    """Random q and a paged cache of ``batch`` sequences of ``context`` tokens, and the same keys
    and values laid out contiguously per sequence for SDPA."""
    from kvlab.devices import device_and_dtype

    for name, value in (
        ("batch", batch),
        ("context", context),
        ("block_size", block_size),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        integer(name, value, 1)
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    dev, dtype = device_and_dtype(None, dtype)
    generator = torch.Generator().manual_seed(seed)
    per_seq = -(-context // block_size)
    order = (
        torch.arange(batch * per_seq)
        if identity_table
        else torch.randperm(batch * per_seq, generator=generator)
    )
    table = order.reshape(batch, per_seq).to(dev, torch.int32)
    pool_shape = (batch * per_seq, block_size, num_kv_heads, head_dim)
    k_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    v_pool = torch.randn(pool_shape, generator=generator).to(dev, dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    k_flat = k_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    v_flat = v_pool[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    q = torch.randn(batch, num_q_heads, head_dim, generator=generator).to(dev, dtype)
    kv_bytes = (
        2 * batch * context * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    )
    return SimpleNamespace(
        q=q,
        k_pool=k_pool,
        v_pool=v_pool,
        table=table,
        lens=lens,
        kv_bytes=kv_bytes,
        contiguous=lambda: F.scaled_dot_product_attention(
            q[:, :, None], k_flat, v_flat, enable_gqa=True
        ),
    )


def paged_decode_launcher(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None):
    """Check once, then return a function that launches the decode kernel on these tensors
    (notebooks 05, 05b), for timing the kernel alone: the tensors' shapes and the validity of their
    block ids must not change between launches."""
    pa, args = kernels.paged_attention, (q, k_cache, v_cache, block_table, seq_lens)
    scale = kernels.check_decode(
        *args, scale, num_splits, pa.attend_split_kernel, "paged_decode_attention"
    )
    num_splits = num_splits or pa.splits_for(q, k_cache, pa.longest(seq_lens))
    return lambda: kernels.paged_decode(*args, scale, num_splits)


def paged_prefill_launcher(
    q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale=None
):
    """Check once and plan the tiles, then return a function that launches the prefill kernel
    (notebooks 06, 11), for timing the kernel alone: the tensors' shapes and contents must not
    change between launches."""
    args = (q, k_cache, v_cache, block_table, cu_query_lens, context_lens)
    scale = kernels.check_prefill(*args, scale, kernels.paged_prefill.paged_prefill_kernel)
    tiles = kernels.plan_step(q, k_cache, cu_query_lens, context_lens)
    return lambda: kernels.paged_extend(*args, scale, tiles)


def paged_prefill_work(q, k_cache, cu_query_lens, context_lens) -> PrefillWork:
    """FLOPs and bytes of one launch on these tensors (``kvlab.theory.prefill_attention``), with
    this kernel's query tile, so that a measured time gives fractions of the machine's ceilings. A
    launch the kernel would refuse is refused here too."""
    cu, lens = _launch_lens(q, k_cache, cu_query_lens, context_lens)
    group = q.shape[1] // k_cache.shape[2]
    return prefill_attention_work(
        [b - a for a, b in zip(cu, cu[1:])],
        lens,
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        q.element_size(),
        k_cache.shape[1],
        kernels.configs.query_tokens_per_tile(group),
    )


def _launch_lens(q, k_cache, cu_query_lens, context_lens) -> tuple[list[int], list[int]]:
    """``(cu_query_lens, context_lens)`` as lists once they describe a launch the prefill kernel
    accepts: shapes that agree, cumulative new tokens from 0 to ``q``'s tokens, each context at
    least its new tokens, a power-of-two block and a head dim the kernel supports."""
    layouts = {
        "q": "[tokens, q_heads, head_dim]",
        "k_cache": "[blocks, block_size, kv_heads, head_dim]",
    }
    sizes = named_shapes(layouts, q=q, k_cache=k_cache)
    if sizes["q_heads"] % sizes["kv_heads"]:
        raise ValueError(
            f"q's {sizes['q_heads']} heads must be a multiple of k_cache's {sizes['kv_heads']}"
        )
    block, dim = sizes["block_size"], sizes["head_dim"]
    if block & (block - 1) or dim not in kernels.SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"k_cache's block_size must be a power of two and its head_dim one of "
            f"{kernels.SUPPORTED_HEAD_DIMS} (the kernel's limits), got {block} and {dim}"
        )
    cu = token_ids("cu_query_lens", cu_query_lens)
    lens = token_ids("context_lens", context_lens)
    if cu[0] != 0 or cu[-1] != sizes["tokens"] or cu != sorted(cu):
        raise ValueError(
            f"cu_query_lens must rise from 0 to q's {sizes['tokens']} tokens, got {cu}"
        )
    new = [b - a for a, b in zip(cu, cu[1:])]
    if len(lens) != len(new) or any(n > c for n, c in zip(new, lens)):
        raise ValueError(
            f"context_lens must hold each sequence's new tokens and more ({new}), got {lens}"
        )
    return cu, lens


def _alternate(contenders: dict, warmup: int, reps: int) -> dict:
    """Time each of ``contenders`` (name -> function) once per round, ``reps`` rounds: one timing
    loop that alternates them, so that drift on a shared machine hits all alike."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    runs = {name: [] for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            runs[name].append(measure(fn, warmup=0, reps=1))
    return {name: merge_timings(parts) for name, parts in runs.items()}


def compare_attention(
    batch: int,
    context: int,
    block_size: int = 16,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    dtype=None,
    path: str | None = None,
    identity_table: bool = False,
    num_splits: int | None = None,
    warmup: int = 2,
    reps: int = 5,
    seed: int = 0,
) -> AttentionTiming:
    """Paged decode attention against torch SDPA on a contiguous cache, same data, interleaved
    (notebook 05).

    ``path`` defaults to the Triton kernel on a GPU and, on a CPU (where the interpreter's speed
    says nothing about the kernel), to ``"gather"``, the vectorised PyTorch paged path;
    ``"reference"`` is the per-sequence plain-PyTorch reference of ``kvlab.kernels``. The paged
    cache's blocks are a random permutation of the pool, or in order with ``identity_table``. The
    kernel path validates its inputs once and times the launches alone; ``num_splits`` is passed to
    it (None: its automatic choice).
    """
    from kvlab.devices import on_gpu

    path = one_of("path", path or ("kernel" if on_gpu() else "gather"), ATTENTION_PATHS)
    integer("reps", reps, 1)
    integer("warmup", warmup, 0)
    case = _paged_case(
        batch, context, block_size, num_q_heads, num_kv_heads, head_dim, dtype, identity_table, seed
    )
    args = (case.q, case.k_pool, case.v_pool, case.table, case.lens)
    if path == "kernel":
        paged = paged_decode_launcher(*args, num_splits=num_splits)
    else:
        attend = (
            kernels.paged_decode_attention_gather
            if path == "gather"
            else kernels.paged_decode_attention_ref
        )

        def paged():
            return attend(*args)

    contenders = {"paged": paged, "contiguous": case.contiguous}
    if path == "gather":
        contenders["gather"] = lambda: gather_blocks(*args[1:])
        contenders["copy"] = lambda: (case.k_pool.clone(), case.v_pool.clone())
    with torch.inference_mode():
        torch.testing.assert_close(
            paged().float(), case.contiguous()[:, :, 0].float(), atol=2e-2, rtol=2e-2
        )
        timed = _alternate(contenders, warmup, reps)
    return AttentionTiming(
        timed["paged"],
        timed["contiguous"],
        case.kv_bytes,
        path,
        timed.get("gather"),
        timed.get("copy"),
    )


@dataclass(frozen=True)
class SplitTiming:
    """The paged kernel at one decode step with ``num_splits`` splits (``split``), with one
    (``one``), and SDPA on the same keys and values laid out contiguously, timed in one alternating
    loop (notebook 05b).
    """

    num_splits: int
    split: Timing
    one: Timing
    contiguous: Timing
    kv_bytes: int

    @property
    def split_bytes_per_s(self) -> float:
        return self.kv_bytes / self.split.median


def compare_splits(
    batch: int,
    context: int,
    num_splits: int,
    block_size: int = 16,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    dtype=None,
    warmup: int = 1,
    reps: int = 5,
    seed: int = 0,
) -> SplitTiming:
    """The Triton kernel with ``num_splits`` splits against itself with one split and against SDPA,
    on the same data, in one timing loop that runs each once per round (notebook 05b). With
    ``num_splits=1`` there is one contender less: ``one`` is ``split``."""
    integer("num_splits", num_splits, 1)
    integer("reps", reps, 1)
    integer("warmup", warmup, 0)
    case = _paged_case(
        batch, context, block_size, num_q_heads, num_kv_heads, head_dim, dtype, False, seed
    )
    args = (case.q, case.k_pool, case.v_pool, case.table, case.lens)
    contenders = {"split": paged_decode_launcher(*args, num_splits=num_splits)}
    if num_splits != 1:
        contenders["one"] = paged_decode_launcher(*args, num_splits=1)
    contenders["contiguous"] = case.contiguous
    with torch.inference_mode():
        want = case.contiguous()[:, :, 0].float()
        for name in ("split", "one"):
            if name in contenders:
                torch.testing.assert_close(contenders[name]().float(), want, atol=2e-2, rtol=2e-2)
        timed = _alternate(contenders, warmup, reps)
    return SplitTiming(
        num_splits,
        timed["split"],
        timed.get("one", timed["split"]),
        timed["contiguous"],
        case.kv_bytes,
    )


def bench_rows():
    """Paged vs contiguous decode attention, swap's transfer, and the admission simulator (notebook
    05)."""
    from kvlab.devices import on_gpu
    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.paging import make_trace, simulate
    from kvlab.lab.preemption import cached_recompute_rows, measure_host_copy

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
            Row(
                f"paged attention b{batch} s{context}",
                t.paged_bytes_per_s / 1e9,
                "GB/s",
                f"{where}, {t.path} path",
            ),
            Row(
                f"paged / copy bandwidth b{batch} s{context}",
                t.paged_bytes_per_s / copy,
                "fraction",
                "K+V bytes read once / calibrated copy bandwidth",
            ),
            Row(
                f"SDPA contiguous b{batch} s{context}",
                t.contiguous_bytes_per_s / 1e9,
                "GB/s",
                f"{where}, contiguous cache",
            ),
            Row(
                f"paged / SDPA time b{batch} s{context}",
                t.paged.median / t.contiguous.median,
                "x",
                "ratio of medians, same run",
            ),
        ]
    if gpu:  # the kernel against itself: block-table indirection, and what split-K buys at batch 1
        permuted = compare_attention(32, 16384, 16, reps=10, **shape)
        ordered = compare_attention(32, 16384, 16, reps=10, identity_table=True, **shape)
        auto = kernels.choose_num_splits(
            1, heads[1], 32768, kernels.multiprocessor_count(torch.device("cuda"))
        )
        splits = compare_splits(1, 32768, auto, 16, reps=10, **shape)
        rows += [
            Row(
                "permuted / identity table time b32 s16384",
                permuted.paged.median / ordered.paged.median,
                "x",
                "same kernel; blocks in random order vs in order, two runs",
            ),
            Row(
                "num_splits=1 / split-K time b1 s32768",
                splits.one.median / splits.split.median,
                "x",
                f"same kernel; automatic num_splits ({auto}) vs one split, one alternating loop",
            ),
            Row(
                "split-K paged attention b1 s32768",
                splits.split_bytes_per_s / 1e9,
                "GB/s",
                f"{auto} splits, block 16, kernel path",
            ),
        ]
    # swap's transfer: one copy per 16-token block of one layer's K (Llama-3-8B: 16 x 8 x 128 x 2
    # bytes) against one copy of the same bytes; on a GPU device-to-pinned-host over PCIe
    total = (256 << 20) if gpu else (32 << 20)
    for r in measure_host_copy(total, [16 * 8 * 128 * 2, 1 << 20], reps=5):
        rows.append(
            Row(
                f"host copy in {r.block_bytes // 1024} KiB blocks / one copy",
                r.efficiency,
                "fraction",
                f"{r.blocks} copies of {r.block_bytes:,} B against one of {r.total_bytes:,} B,"
                " same run",
            )
        )
    rows += cached_recompute_rows(gpu)
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
