"""Notebook 07, hybrid attention and SSM state (section 9.6): the decode-step update of a selective
SSM in Triton (Gu and Dao 2023), beside its plain-PyTorch reference.

Every decode token of every Mamba layer reads the sequence's state ``[dim, state]``, decays it,
adds the token's input, writes it back in place and reduces it against ``C_t`` for the output. The
state is the same size at token 10 and at token 100,000: the step's traffic does not grow with
context, unlike an attention step that rereads the KV cache.

One program handles ``BLOCK_DIM`` channels of one sequence and the whole (padded) state of each.
Arithmetic is fp32 whatever the storage dtype, as in the mamba_ssm kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvlab._checks import flag, named_shapes
from kvlab.kernels._validation import require_disjoint, require_kernel_device, require_no_overlap
from kvlab.kernels.shared_memory import DTYPES, KernelConfig, signature

STATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_DIM = 16
# The shapes of one decode step's arguments (kvlab.cache.mamba.ssm_step's, named as here).
LAYOUT = {
    "state": "[batch, dim, state]",
    "u": "[batch, dim]",
    "delta": "[batch, dim]",
    "z": "[batch, dim]",
    "A": "[dim, state]",
    "B": "[batch, state]",
    "C": "[batch, state]",
    "D": "[dim]",
    "delta_bias": "[dim]",
}


@triton.jit
def _selective_state_update_kernel(
    state_ptr,
    u_ptr,
    delta_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    bias_ptr,
    out_ptr,
    dim,
    nstate,
    stride_sb,
    stride_sd,
    stride_sn,
    stride_ub,
    stride_ud,
    stride_db,
    stride_dd,
    stride_ad,
    stride_an,
    stride_bb,
    stride_bn,
    stride_cb,
    stride_cn,
    stride_zb,
    stride_zd,
    stride_ob,
    stride_od,
    stride_D,
    stride_bias,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    STATE_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    n = tl.arange(0, STATE_PAD)
    ch_ok = ch < dim
    tile_ok = ch_ok[:, None] & (n[None, :] < nstate)

    u = tl.load(u_ptr + b * stride_ub + ch * stride_ud, mask=ch_ok, other=0.0).to(tl.float32)
    dt = tl.load(delta_ptr + b * stride_db + ch * stride_dd, mask=ch_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + ch * stride_bias, mask=ch_ok, other=0.0).to(tl.float32)
    if SOFTPLUS:
        # softplus(x) = log(1 + e^x); above 20 it equals x to fp32 precision (and e^x would overflow
        # later)
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    A = tl.load(
        A_ptr + ch[:, None] * stride_ad + n[None, :] * stride_an, mask=tile_ok, other=0.0
    ).to(tl.float32)
    B = tl.load(B_ptr + b * stride_bb + n * stride_bn, mask=n < nstate, other=0.0).to(tl.float32)
    C = tl.load(C_ptr + b * stride_cb + n * stride_cn, mask=n < nstate, other=0.0).to(tl.float32)
    s_ptrs = state_ptr + b * stride_sb + ch[:, None] * stride_sd + n[None, :] * stride_sn
    h = tl.load(s_ptrs, mask=tile_ok, other=0.0).to(tl.float32)

    h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * B[None, :]
    tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=tile_ok)

    y = tl.sum(h * C[None, :], axis=1)
    if HAS_D:
        y += u * tl.load(D_ptr + ch * stride_D, mask=ch_ok, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + b * stride_zb + ch * stride_zd, mask=ch_ok, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(out_ptr + b * stride_ob + ch * stride_od, y.to(out_ptr.dtype.element_ty), mask=ch_ok)


def ssm_update_config(dtype: torch.dtype, state: int) -> KernelConfig:
    """The state-update kernel at one state size, as :func:`selective_state_update` launches it with
    every optional input present (for the ahead-of-time compiles of ``kvlab.kernels.targets``)."""
    kernel = _selective_state_update_kernel
    pointers = {p: DTYPES[dtype] for p in kernel.arg_names if p.endswith("_ptr")}
    pointers.update(A_ptr="fp32", D_ptr="fp32", bias_ptr="fp32")
    constants = dict(
        HAS_D=True,
        HAS_Z=True,
        HAS_BIAS=True,
        SOFTPLUS=True,
        BLOCK_DIM=BLOCK_DIM,
        STATE_PAD=max(triton.next_power_of_2(state), 2),
    )
    return KernelConfig(
        "ssm_update", dtype, kernel, signature(kernel, pointers), constants, sizes=dict(state=state)
    )


def _check_inputs(state, u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> None:
    """Shapes, dtypes and devices of a decode-step update (section 9.6)."""
    named_shapes(
        LAYOUT,
        state=state,
        u=u,
        delta=delta,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        delta_bias=delta_bias,
        optional=("D", "z", "delta_bias"),
    )
    flag("delta_softplus", delta_softplus)
    if state.dtype not in STATE_DTYPES:
        raise TypeError(f"state must have dtype float16, bfloat16 or float32, got {state.dtype}")
    require_no_overlap("state", state)  # written in place: two batch rows sharing memory would race
    for name, t in (
        ("u", u),
        ("delta", delta),
        ("A", A),
        ("B", B),
        ("C", C),
        ("D", D),
        ("z", z),
        ("delta_bias", delta_bias),
    ):
        if t is not None:
            require_disjoint("state", state, name, t)  # an input read while state is written


def selective_state_update(
    state, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False
):
    """One decode token of a selective SSM in Triton, updating ``state`` in place (section 9.6).

    Args (as ``kvlab.cache.mamba.ssm_step``): ``state`` ``[batch, dim, state]`` (fp32, fp16 or bf16,
    written in place); ``u``, ``delta``, ``z`` ``[batch, dim]``; ``A`` ``[dim, state]``; ``B``,
    ``C`` ``[batch, state]``; ``D``, ``delta_bias`` ``[dim]``. Returns ``y`` ``[batch, dim]`` in
    ``u``'s dtype.
    """
    _check_inputs(state, u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    require_kernel_device(state.device)
    batch, dim, nstate = state.shape
    out = torch.empty_like(u)
    if batch == 0 or dim == 0:
        return out
    dummy = u  # stands in for absent optional tensors; the kernel never reads it (constexpr flags)
    z_strides = z.stride() if z is not None else (0, 0)
    grid = (batch, triton.cdiv(dim, BLOCK_DIM))
    _selective_state_update_kernel[grid](
        state,
        u,
        delta,
        A,
        B,
        C,
        D if D is not None else dummy,
        z if z is not None else dummy,
        delta_bias if delta_bias is not None else dummy,
        out,
        dim,
        nstate,
        *state.stride(),
        *u.stride(),
        *delta.stride(),
        *A.stride(),
        *B.stride(),
        *C.stride(),
        *z_strides,
        *out.stride(),
        D.stride(0) if D is not None else 0,
        delta_bias.stride(0) if delta_bias is not None else 0,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None,
        SOFTPLUS=bool(delta_softplus),
        BLOCK_DIM=BLOCK_DIM,
        STATE_PAD=max(triton.next_power_of_2(nstate), 2),
    )
    return out


def selective_state_update_ref(
    state, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False
):
    """Plain-PyTorch :func:`selective_state_update`: same signature, same in-place state (section
    9.6).

    In fp32 (fp64 for fp64 ``u``): h = exp(dt A) h + dt u B, y = <C, h> + D u, times silu(z), with
    dt = softplus(delta + delta_bias) when ``delta_softplus``.
    """
    _check_inputs(state, u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    work = torch.float64 if u.dtype == torch.float64 else torch.float32
    dt = delta.to(work) if delta_bias is None else delta.to(work) + delta_bias.to(work)
    if delta_softplus:
        dt = torch.nn.functional.softplus(dt)
    h = (
        torch.exp(dt[..., None] * A.to(work)) * state.to(work)
        + (dt * u.to(work))[..., None] * B.to(work)[:, None, :]
    )
    y = (h * C.to(work)[:, None, :]).sum(-1)
    if D is not None:
        y = y + u.to(work) * D.to(work)
    if z is not None:
        y = y * torch.nn.functional.silu(z.to(work))
    state.copy_(h.to(state.dtype))
    return y.to(u.dtype)
