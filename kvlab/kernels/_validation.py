"""Notebooks 05b and 07: argument checks shared by kvlab's Triton kernels (paged attention, after
Kwon et al. 2023, and the SSM step, after Gu and Dao 2023).

Every check runs in Python before a launch and raises a ``TypeError`` (wrong kind
or dtype) or ``ValueError`` (wrong shape, range or device) that names the argument
and what it may be. A Triton kernel that reads through a bad index does not fail
cleanly: it reads or writes someone else's memory, so nothing bad gets that far.
"""

from __future__ import annotations

import math
import os

import torch

from kvlab._checks import integer
from kvlab.kernels.configs import MAX_SPLITS, TILE_TOKENS, attend_split_config, paged_prefill_config
from kvlab.kernels.shared_memory import require_fits

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def require_tensor(name: str, value) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def require_rank(name: str, tensor: torch.Tensor, layout: str) -> None:
    """``layout`` is the expected shape in words, e.g. ``"[batch, num_q_heads, head_dim]"``."""
    rank = layout.count(",") + 1
    if tensor.dim() != rank:
        raise ValueError(
            f"{name} must have {rank} dimensions {layout}, got shape {tuple(tensor.shape)}"
        )


def require_dtype(name: str, tensor: torch.Tensor, allowed) -> None:
    if tensor.dtype not in allowed:
        raise TypeError(f"{name} must have dtype in ({_names(allowed)}), got {tensor.dtype}")


def require_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(
                f"{name} is on {device} but {first_name} is on {first}; all inputs must share one"
                " device"
            )
    return first


def require_kernel_device(
    device: torch.device, kernel=None, call: str = "the Triton kernel"
) -> None:
    """Triton runs on CUDA tensors, or on CPU tensors under its interpreter. The interpreter must
    have been on when ``kernel`` was decorated (``kvlab.kernels.use_interpreter()`` before the
    import): ``triton.jit`` decides then, once, whether a kernel is compiled or interpreted."""
    if device.type == "cuda":
        return
    interpreting = (
        os.environ.get("TRITON_INTERPRET") == "1"
        if kernel is None
        else type(kernel).__name__ == "InterpretedFunction"
    )
    if device.type == "cpu" and interpreting:
        return
    raise ValueError(
        f"{call} got tensors on {device}; it needs CUDA tensors, or CPU tensors under Triton's"
        " interpreter, which must be switched on before kvlab's kernels are imported: call"
        " kvlab.kernels.use_interpreter() first thing (or start Python with TRITON_INTERPRET=1),"
        " or use the *_ref function"
    )


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def interpreted() -> bool:
    """Triton runs under its CPU interpreter (no CUDA device, TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def require_computable_dtype(name: str, tensor: torch.Tensor) -> None:
    """The interpreter computes ``tl.dot`` on bf16 operands wrongly (values off by orders of
    magnitude, no error), so a kernel that multiplies in the storage dtype refuses bf16 there."""
    if tensor.dtype == torch.bfloat16 and tensor.device.type == "cpu" and interpreted():
        raise TypeError(
            f"{name} is bfloat16, which the Triton interpreter (CPU) cannot compute with; "
            "use float16 or float32 on a CPU, or run on a CUDA GPU"
        )


def require_no_overlap(name: str, tensor: torch.Tensor) -> None:
    """A tensor the kernel writes must not have two elements at one address (an ``expand``-ed view):
    the writes would race and both rows would see each other's update."""
    dims = sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n > 1)
    extent = 1  # elements spanned by the dimensions with smaller strides
    for stride, size in dims:
        if stride < extent:
            raise ValueError(
                f"{name} has overlapping elements (shape {tuple(tensor.shape)}, strides "
                f"{tensor.stride()}), e.g. an expanded view; pass a tensor that owns each "
                "element once (.clone() or .contiguous())"
            )
        extent = stride * (size - 1) + extent
    return None


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    span = (
        sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1 if tensor.numel() else 0
    )
    start = tensor.data_ptr()
    return start, start + span * tensor.element_size()


def require_disjoint(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """A tensor a kernel writes must not share memory with another it reads or writes."""
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if a.device == b.device and a0 < b1 and b0 < a1:
        raise ValueError(
            f"{name_a} and {name_b} share memory and the kernel writes at least one of them; "
            "pass separate tensors"
        )


def require_block_table(
    block_table: torch.Tensor, lens: torch.Tensor, block_size: int, num_blocks: int
) -> None:
    """Every block-table entry a sequence of ``lens`` tokens uses names a block in [0,
    num_blocks)."""
    max_blocks = block_table.shape[1]
    table = block_table.to("cpu", torch.int64)
    blocks_used = (lens + block_size - 1) // block_size
    in_use = torch.arange(max_blocks)[None, :] < blocks_used[:, None]
    bad = in_use & ((table < 0) | (table >= num_blocks))
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_table[{row}, {col}] = {int(table[row, col])} is outside [0, {num_blocks}) "
            f"(num_blocks); sequence {row} uses its first {int(blocks_used[row])} entries"
        )


def resolve_scale(scale, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) for None, else a finite float > 0."""
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float > 0 or None, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite float > 0, got {scale}")
    return float(scale)


# ------------------------------------------------------------------ the door checks of the kernels

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_GRID_Z = 65535
CACHE = "[num_blocks, block_size, num_kv_heads, head_dim]"


def _tensors(**named) -> None:
    """The shared preamble: each ``name=(tensor, layout)`` is a tensor of ``layout``'s rank."""
    for name, (value, _) in named.items():
        require_tensor(name, value)
    for name, (value, layout) in named.items():
        require_rank(name, value, layout)


def _one_float_dtype(floats, **tensors) -> None:
    """The tensors named in ``floats`` are float; all of ``tensors`` share one dtype."""
    for name in floats:
        require_dtype(name, tensors[name], FLOAT_DTYPES)
    if len({t.dtype for t in tensors.values()}) > 1:
        names = list(tensors)
        raise TypeError(
            f"{', '.join(names[:-1])} and {names[-1]} must share one dtype, got "
            + ", ".join(str(t.dtype) for t in tensors.values())
        )


def _check_cache_shapes(q, k_cache, v_cache, kernel_limits: bool = True) -> None:
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have equal shapes, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    _, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f"q head_dim ({head_dim}) must equal k_cache head_dim ({cache_head_dim})")
    if kernel_limits and head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads"
            f" ({num_kv_heads})"
        )
    if kernel_limits and not is_power_of_two(block_size):
        raise ValueError(
            f"block_size (k_cache.shape[1]) must be a power of two >= 1, got {block_size}"
        )


def _require_lens(name: str, lens, low, capacity: int, why: str) -> None:
    """Each ``lens[b]`` in ``[low[b], capacity]`` (``low`` a tensor or a number)."""
    bad = (lens < low) | (lens > capacity)
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        floor = int(low[b]) if isinstance(low, torch.Tensor) else low
        raise ValueError(f"{name}[{b}] = {int(lens[b])} is outside [{floor}, {capacity}] ({why})")


def _device_and_fit(tensor, kernel, call: str, config) -> None:
    """The kernel runs where ``tensor`` is, in its dtype, and its program fits the GPU (a GPU whose
    blocks cannot hold one program's tiles, such as head_dim 256 in fp16 on a T4, is refused)."""
    require_kernel_device(tensor.device, kernel, call)
    require_computable_dtype("q", tensor)
    require_fits(config, tensor.device)


def check_decode_args(
    q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, kernel_limits=True
) -> float:
    """Every argument of a paged decode attention, the kernel's or a PyTorch twin's; returns the
    softmax scale. ``kernel_limits``: also the kernel's own limits (head_dim, power-of-two block
    size), which the gather path does not share."""
    _tensors(
        q=(q, "[batch, num_q_heads, head_dim]"),
        k_cache=(k_cache, CACHE),
        v_cache=(v_cache, CACHE),
        block_table=(block_table, "[batch, max_blocks]"),
        seq_lens=(seq_lens, "[batch]"),
    )
    _check_cache_shapes(q, k_cache, v_cache, kernel_limits)
    if min(k_cache.shape[:2]) < 1 or q.shape[2] < 1:
        raise ValueError(
            "k_cache must have num_blocks, block_size and head_dim >= 1, "
            f"got shape {tuple(k_cache.shape)}"
        )
    if block_table.shape[0] != q.shape[0] or seq_lens.shape[0] != q.shape[0]:
        raise ValueError(
            f"block_table rows ({block_table.shape[0]}) and seq_lens length ({seq_lens.shape[0]}) "
            f"must both equal the batch size of q ({q.shape[0]})"
        )
    _one_float_dtype(("q", "k_cache"), q=q, k_cache=k_cache, v_cache=v_cache)
    require_dtype("block_table", block_table, (torch.int32,))
    require_dtype("seq_lens", seq_lens, (torch.int32,))
    require_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens
    )
    _check_tokens(block_table, seq_lens.to("cpu", torch.int64), 1, k_cache, "")
    if num_splits is not None:
        _check_num_splits(num_splits, seq_lens)
    return resolve_scale(scale, q.shape[-1])


def _check_tokens(block_table, lens, low, k_cache, after: str) -> None:
    """Lengths ``lens`` in ``[low, max_blocks * block_size]``; every block they use in range."""
    num_blocks, block_size = k_cache.shape[:2]
    max_blocks = block_table.shape[1]
    name = "context_lens" if after else "seq_lens"
    why = f"{after}max_blocks {max_blocks} * block_size {block_size}"
    _require_lens(name, lens, low, max_blocks * block_size, why)
    require_block_table(block_table, lens, block_size, num_blocks)


def _check_num_splits(num_splits: int, seq_lens) -> None:
    """At most ``MAX_SPLITS``, or one split per tile of the longest sequence when that is more:
    further splits are empty and only cost launches (minutes under the interpreter)."""
    integer("num_splits", num_splits)
    if num_splits > MAX_GRID_Z:
        raise ValueError(
            f"num_splits must be in [1, {MAX_GRID_Z}] (a CUDA grid dimension), got {num_splits}"
        )
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    limit = max(MAX_SPLITS, -(-longest // TILE_TOKENS))
    if num_splits > limit:
        raise ValueError(
            f"num_splits must be in [1, {limit}] (max({MAX_SPLITS}, tiles of {TILE_TOKENS} tokens"
            f" in the longest sequence, {longest} tokens)), got {num_splits}"
        )


def check_decode(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, kernel, call):
    """:func:`check_decode_args`, and the device, dtype and GPU that ``kernel`` will run on."""
    scale = check_decode_args(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits)
    group, block_size = q.shape[1] // k_cache.shape[2], k_cache.shape[1]
    config = attend_split_config(kernel, q.dtype, group, q.shape[-1], block_size)
    _device_and_fit(q, kernel, call, config)
    return scale


def check_merge(partial_out, partial_lse, dtype, kernel) -> None:
    """The two outputs of decode stage 1, as ``merge_splits`` reads them."""
    _tensors(
        partial_out=(partial_out, "[batch, num_q_heads, num_splits, head_dim]"),
        partial_lse=(partial_lse, "[batch, num_q_heads, num_splits]"),
    )
    require_dtype("partial_out", partial_out, (torch.float32,))
    require_dtype("partial_lse", partial_lse, (torch.float32,))
    if partial_out.shape[:3] != partial_lse.shape or partial_lse.shape[2] < 1:
        raise ValueError(
            "partial_out must be [batch, num_q_heads, num_splits >= 1, head_dim] and partial_lse "
            f"[batch, num_q_heads, num_splits], got {tuple(partial_out.shape)} and "
            f"{tuple(partial_lse.shape)}"
        )
    if partial_out.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"partial_out head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {partial_out.shape[3]}"
        )
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    if not (partial_out.is_contiguous() and partial_lse.is_contiguous()):
        raise ValueError(
            "partial_out and partial_lse must be contiguous (the kernel indexes them as flat rows)"
        )
    require_same_device(partial_out=partial_out, partial_lse=partial_lse)
    require_kernel_device(partial_out.device, kernel, "merge_splits")


def check_prefill_args(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale):
    """Every argument of a paged prefill attention; returns the softmax scale."""
    _tensors(
        q=(q, "[num_tokens, num_q_heads, head_dim]"),
        k_cache=(k_cache, CACHE),
        v_cache=(v_cache, CACHE),
        block_table=(block_table, "[batch, max_blocks]"),
        cu_query_lens=(cu_query_lens, "[batch + 1]"),
        context_lens=(context_lens, "[batch]"),
    )
    _check_cache_shapes(q, k_cache, v_cache)
    if k_cache.shape[0] < 1:
        raise ValueError(f"k_cache must have num_blocks >= 1, got shape {tuple(k_cache.shape)}")
    batch = context_lens.shape[0]
    if block_table.shape[0] != batch or cu_query_lens.shape[0] != batch + 1:
        raise ValueError(
            f"block_table rows ({block_table.shape[0]}) must equal the batch size of context_lens "
            f"({batch}), and cu_query_lens must have batch + 1 = {batch + 1} entries, got "
            f"{cu_query_lens.shape[0]}"
        )
    _one_float_dtype(("q",), q=q, k_cache=k_cache, v_cache=v_cache)
    for name, value in (("block_table", block_table), ("cu_query_lens", cu_query_lens)):
        require_dtype(name, value, (torch.int32,))
    require_dtype("context_lens", context_lens, (torch.int32,))
    require_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table,
        cu_query_lens=cu_query_lens,
        context_lens=context_lens,
    )
    query_lens = _check_query_lens(cu_query_lens, q.shape[0])
    lens = context_lens.to("cpu", torch.int64)
    _check_tokens(block_table, lens, query_lens, k_cache, "its new tokens in cu_query_lens, ")
    return resolve_scale(scale, q.shape[-1])


def _check_query_lens(cu_query_lens, num_tokens: int) -> torch.Tensor:
    """cu_query_lens goes from 0 to num_tokens without decreasing; returns each sequence's new
    tokens."""
    cu = cu_query_lens.to("cpu", torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != num_tokens:
        raise ValueError(
            f"cu_query_lens must start at 0 and end at num_tokens (q.shape[0] = {num_tokens}), "
            f"got {int(cu[0])} ... {int(cu[-1])}"
        )
    query_lens = cu[1:] - cu[:-1]
    if (query_lens < 0).any():
        b = int((query_lens < 0).nonzero()[0, 0])
        raise ValueError(
            f"cu_query_lens must not decrease, got cu_query_lens[{b}] = {int(cu[b])} > "
            f"cu_query_lens[{b + 1}] = {int(cu[b + 1])}"
        )
    return query_lens


def check_prefill(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale, kernel):
    """:func:`check_prefill_args`, and the device, dtype and GPU that ``kernel`` will run on."""
    scale = check_prefill_args(q, k_cache, v_cache, block_table, cu_query_lens, context_lens, scale)
    group, block_size = q.shape[1] // k_cache.shape[2], k_cache.shape[1]
    config = paged_prefill_config(kernel, q.dtype, group, q.shape[-1], block_size)
    _device_and_fit(q, None, "the Triton kernel", config)
    return scale


def check_store(k, v, k_cache, v_cache, slot_mapping, kernel=None) -> None:
    """Every argument of ``store_kv`` and its reference; with ``kernel``, the device it runs on."""
    _tensors(
        k=(k, "[num_tokens, num_kv_heads, head_dim]"),
        v=(v, "[num_tokens, num_kv_heads, head_dim]"),
        k_cache=(k_cache, CACHE),
        v_cache=(v_cache, CACHE),
        slot_mapping=(slot_mapping, "[num_tokens]"),
    )
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have equal shapes, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have equal shapes, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k's [num_kv_heads, head_dim] {tuple(k.shape[1:])} must match k_cache's "
            f"{tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(
            f"slot_mapping length ({slot_mapping.shape[0]}) must equal num_tokens ({k.shape[0]})"
        )
    _one_float_dtype(("k_cache",), k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    require_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    require_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    _check_store_memory(k, v, k_cache, v_cache)
    _check_slots(slot_mapping, num_slots=k_cache.shape[0] * k_cache.shape[1])
    if kernel is not None:
        require_kernel_device(k.device, kernel, "store_kv")


def _check_store_memory(k, v, k_cache, v_cache) -> None:
    require_no_overlap("k_cache", k_cache)  # written in place
    require_no_overlap("v_cache", v_cache)
    require_disjoint("k_cache", k_cache, "v_cache", v_cache)
    for name, t in (("k", k), ("v", v)):  # a token read from the pool being written would race
        require_disjoint(name, t, "k_cache", k_cache)
        require_disjoint(name, t, "v_cache", v_cache)


def _check_slots(slot_mapping, num_slots: int) -> None:
    """Slots in [-1, num_slots), and no slot written twice (the writes would race)."""
    slots = slot_mapping.to("cpu", torch.int64)
    bad = (slots < -1) | (slots >= num_slots)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"slot_mapping[{i}] = {int(slots[i])} is outside [-1, {num_slots}) "
            "(-1 skips a token; num_blocks * block_size slots exist)"
        )
    stored = slots[slots >= 0]
    unique, counts = stored.unique(return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"slot_mapping writes slot {int(unique[counts > 1][0])} more than once")


def check_plan(query_lens, context_lens, group) -> None:
    """The host lists ``plan_query_tiles`` reads: one whole number each, per sequence."""
    integer("group", group)
    if len(query_lens) != len(context_lens):
        raise ValueError(
            f"query_lens and context_lens must have one entry per sequence, got {len(query_lens)} "
            f"and {len(context_lens)}"
        )
    for b, (n, c) in enumerate(zip(query_lens, context_lens)):
        integer(f"context_lens[{b}]", c, integer(f"query_lens[{b}]", n, 0))


def check_merge_partials(outs, lses) -> None:
    """The parts ``merge_partials`` merges, ``[num_parts, ..., head_dim]`` and ``[num_parts, ...]``:
    float tensors of one leading shape."""
    require_tensor("outs", outs)
    require_tensor("lses", lses)
    if outs.dim() < 2 or outs.shape[:-1] != lses.shape or outs.shape[0] < 1:
        raise ValueError(
            "outs must be [num_parts >= 1, ..., head_dim] and lses [num_parts, ...] with the same "
            f"leading shape, got {tuple(outs.shape)} and {tuple(lses.shape)}"
        )
    require_dtype("outs", outs, FLOAT_DTYPES + (torch.float64,))
    require_dtype("lses", lses, FLOAT_DTYPES + (torch.float64,))
