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
