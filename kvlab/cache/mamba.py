"""Notebook 07, hybrid attention and SSM state (section 9.6): Mamba's selective SSM, prefill and
decode.

Mamba (Gu and Dao 2023) lets the recurrence of ``kvlab.cache.recurrence`` depend on the token: per
channel d and token t, with a step size dt = softplus(delta + delta_bias),

    h_t = exp(dt * A[d]) * h_{t-1} + dt * B_t * u_t,    y_t = <C_t, h_t> + D[d] u_t,

gated by silu(z_t). ``selective_scan`` runs a whole prompt through it on the scans of
``kvlab.cache.scan`` (prefill), ``ssm_step`` one token (decode: read the state, update it, emit
y_t). Argument shapes follow ``selective_scan_ref`` of state-spaces/mamba. ``mamba_mixer`` and
``mamba_forward`` run a Hugging Face ``MambaForCausalLM`` (Wolf et al. 2020) on them, with the
state each layer keeps between calls (``MambaLayerState``: its convolution window and its SSM
state) held here: its size does not depend on how many tokens went in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab._checks import flag, named_shapes
from kvlab.cache.scan import affine_scan
from kvlab.theory.ssm import scan_chunk_size

LAYOUT = {
    "u": "[batch, dim, length]",
    "delta": "[batch, dim, length]",
    "z": "[batch, dim, length]",
    "A": "[dim, state]",
    "B": "[batch, state, length]",
    "C": "[batch, state, length]",
    "D": "[dim]",
    "delta_bias": "[dim]",
    "initial_state": "[batch, dim, state]",
    "state": "[batch, dim, state]",
    "u_t": "[batch, dim]",
    "delta_t": "[batch, dim]",
    "z_t": "[batch, dim]",
    "B_t": "[batch, state]",
    "C_t": "[batch, state]",
}


def _compute_dtype(u):
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _step_size(delta, delta_bias, delta_softplus, dtype, bias_shape):
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype).reshape(bias_shape)
    return F.softplus(delta) if delta_softplus else delta


def _gate(y, u, D, z, dtype, d_shape):
    if D is not None:
        y = y + u.to(dtype) * D.to(dtype).reshape(d_shape)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y


def selective_scan(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    method: str = "sequential",
    chunk_size: int | None = None,
    initial_state=None,
):
    """Mamba's selective SSM over a whole sequence (section 9.6), in one of the ``SCAN_ORDERS``.

    Shapes as ``selective_scan_ref`` of state-spaces/mamba: ``u``, ``delta``, ``z`` ``[batch, dim,
    length]``; ``A`` ``[dim, state]``; ``B``, ``C`` ``[batch, state, length]``; ``D``,
    ``delta_bias`` ``[dim]``; ``initial_state`` ``[batch, dim, state]`` (default zeros). Per channel
    d and token t, with dt = softplus(delta + delta_bias) (or without softplus / bias as asked):

        h_t = exp(dt * A[d]) * h_{t-1} + dt * B_t * u_t,    y_t = <C_t, h_t> + D[d] u_t,
        out_t = y_t * silu(z_t).

    ``method``: ``sequential`` (a step per token), ``parallel`` (log depth), ``chunked``
    (``chunk_size`` tokens at a time, default 64), ``blelloch`` or ``two-level`` (see
    ``affine_scan``). Arithmetic in fp32 (fp64 for fp64 ``u``); the output has ``u``'s dtype.
    Returns ``out`` ``[batch, dim, length]``, or ``(out, last_state)`` with ``return_last_state``
    (the state after the last token, fp32/fp64, ``[batch, dim, state]``).
    """
    scan_chunk_size(method, chunk_size)
    flag("delta_softplus", delta_softplus)
    flag("return_last_state", return_last_state)
    size = named_shapes(
        LAYOUT,
        u=u,
        delta=delta,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        delta_bias=delta_bias,
        initial_state=initial_state,
        optional=("D", "z", "delta_bias", "initial_state"),
    )
    dtype = _compute_dtype(u)
    dt = _step_size(delta, delta_bias, delta_softplus, dtype, (-1, 1))  # [b, d, L]
    decay = torch.exp(dt[..., None] * A.to(dtype)[:, None, :])  # [b, d, L, n]
    inputs = (dt * u.to(dtype))[..., None] * B.to(dtype).transpose(1, 2)[:, None]  # [b, d, L, n]
    h0 = None if initial_state is None else initial_state.to(dtype)
    states = affine_scan(
        decay.permute(2, 0, 1, 3), inputs.permute(2, 0, 1, 3), h0, method, chunk_size
    )
    y = torch.einsum("lbdn,bnl->bdl", states, C.to(dtype))
    out = _gate(y, u, D, z, dtype, (-1, 1)).to(u.dtype)
    if not return_last_state:
        return out
    if size["length"] == 0:
        last = (
            h0
            if h0 is not None
            else torch.zeros(
                size["batch"], size["dim"], size["state"], dtype=dtype, device=u.device
            )
        )
        return out, last
    return out, states[-1]


def ssm_step(
    state,
    u_t,
    delta_t,
    A,
    B_t,
    C_t,
    D=None,
    z_t=None,
    delta_bias=None,
    delta_softplus: bool = False,
):
    """One decode token of the selective SSM (section 9.6): read the state, update it, emit y_t.

    ``state`` ``[batch, dim, state]``; ``u_t``, ``delta_t``, ``z_t`` ``[batch, dim]``; ``A`` ``[dim,
    state]``; ``B_t``, ``C_t`` ``[batch, state]``; ``D``, ``delta_bias`` ``[dim]``. Returns ``(y_t,
    new_state)``: ``y_t`` ``[batch, dim]`` in ``u_t``'s dtype, ``new_state`` in the compute dtype
    (fp32, or fp64 for fp64 ``u_t``). ``state`` is not modified: the caller keeps the new one in its
    place (the in-place Triton version is ``kvlab.kernels.selective_state_update``).
    """
    flag("delta_softplus", delta_softplus)
    named_shapes(
        LAYOUT,
        state=state,
        u_t=u_t,
        delta_t=delta_t,
        A=A,
        B_t=B_t,
        C_t=C_t,
        D=D,
        z_t=z_t,
        delta_bias=delta_bias,
        optional=("D", "z_t", "delta_bias"),
    )
    dtype = _compute_dtype(u_t)
    dt = _step_size(delta_t, delta_bias, delta_softplus, dtype, (-1,))  # [b, d]
    new_state = (
        torch.exp(dt[..., None] * A.to(dtype)) * state.to(dtype)
        + (dt * u_t.to(dtype))[..., None] * B_t.to(dtype)[:, None, :]
    )
    y = (new_state * C_t.to(dtype)[:, None, :]).sum(-1)
    return _gate(y, u_t, D, z_t, dtype, (-1,)).to(u_t.dtype), new_state


# --- a Hugging Face Mamba on kvlab's scan -------------------------------------------------------


@dataclass
class MambaLayerState:
    """What one Mamba layer keeps per sequence between calls (section 9.6): the last ``conv_kernel``
    inputs of its causal convolution ``[batch, d_inner, conv_kernel]`` and its SSM state
    ``[batch, d_inner, state]``. Its size does not depend on how many tokens went in."""

    conv: object
    ssm: object

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def _causal_conv(x, weight, bias, window):
    """Depthwise causal convolution of ``x`` [b, d, L] with the ``window`` of earlier inputs
    [b, d, k] (zeros at the start); returns the L outputs and the new window."""
    k = weight.shape[-1]
    full = torch.cat([window, x], dim=-1)
    out = F.conv1d(full[..., 1:], weight, bias, groups=x.shape[1])  # k-1 earlier inputs per output
    return out[..., -x.shape[-1] :], full[..., -k:]


def mamba_mixer(
    mixer,
    hidden_states,
    state: MambaLayerState | None = None,
    method: str = "parallel",
    chunk_size: int | None = None,
):
    """A Hugging Face ``MambaMixer``'s forward pass computed with kvlab's scan (section 9.6).

    ``hidden_states`` ``[batch, length, hidden]``. With ``state=None`` the sequence starts from
    zeros. A single token with a state goes through ``ssm_step`` (the decode path); anything else
    through ``selective_scan`` with ``method``. Returns ``(output, new_state)``.
    """
    batch, length, _ = hidden_states.shape
    d, n, k = mixer.intermediate_size, mixer.ssm_state_size, mixer.conv_kernel_size
    x, gate = mixer.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)
    if state is None:
        state = MambaLayerState(
            conv=x.new_zeros(batch, d, k), ssm=x.new_zeros(batch, d, n, dtype=torch.float32)
        )
    x, window = _causal_conv(x, mixer.conv1d.weight, mixer.conv1d.bias, state.conv.to(x.dtype))
    x = F.silu(x)
    dt, B, C = torch.split(mixer.x_proj(x.transpose(1, 2)), [mixer.time_step_rank, n, n], dim=-1)
    delta = (dt @ mixer.dt_proj.weight.T).transpose(1, 2)  # the bias goes in as delta_bias
    A = -torch.exp(mixer.A_log.float())
    common = dict(D=mixer.D.float(), delta_bias=mixer.dt_proj.bias.float(), delta_softplus=True)
    if length == 1:
        y, ssm = ssm_step(
            state.ssm, x[..., 0], delta[..., 0], A, B[:, 0], C[:, 0], z_t=gate[..., 0], **common
        )
        y = y[..., None]
    else:
        y, ssm = selective_scan(
            x,
            delta,
            A,
            B.transpose(1, 2),
            C.transpose(1, 2),
            z=gate,
            return_last_state=True,
            method=method,
            chunk_size=chunk_size,
            initial_state=state.ssm,
            **common,
        )
    return mixer.out_proj(y.transpose(1, 2).to(hidden_states.dtype)), MambaLayerState(window, ssm)


def mamba_forward(
    model,
    input_ids,
    states: list[MambaLayerState] | None = None,
    method: str = "parallel",
    chunk_size: int | None = None,
):
    """``MambaForCausalLM``'s forward pass with every mixer on kvlab's scan (section 9.6).

    Returns ``(logits, states)``; pass ``states`` back with the next tokens to continue the sequence
    (prefill, then one token per call is decode). The states are kvlab's, not a transformers cache.
    """
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dtype not in (torch.int32, torch.int64)
        or input_ids.dim() != 2
    ):
        raise TypeError(
            "input_ids must be an int64 tensor [batch, tokens], "
            f"got {getattr(input_ids, 'dtype', input_ids)!r}"
        )
    vocab = model.config.vocab_size
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise ValueError(f"input_ids must be token ids in [0, {vocab}) (the model's vocab_size)")
    backbone = model.backbone
    hidden = backbone.embeddings(input_ids)
    states = states or [None] * len(backbone.layers)
    new_states = []
    with torch.no_grad():
        for block, state in zip(backbone.layers, states):
            residual = hidden.float() if block.residual_in_fp32 else hidden
            out, state = mamba_mixer(
                block.mixer,
                block.norm(hidden.to(block.norm.weight.dtype)),
                state,
                method,
                chunk_size,
            )
            hidden = residual + out
            new_states.append(state)
        logits = model.lm_head(backbone.norm_f(hidden).to(model.lm_head.weight.dtype)).float()
    return logits, new_states
