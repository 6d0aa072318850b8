"""Hybrid attention and SSM state (section 9.6): the recurrence, the selective scan, chunked prefill.

An attention layer keeps a key and a value for every retained token; a state-space layer keeps a
fixed-size state per sequence and folds each new token into it. This module has:

- ``DiagonalRecurrence``: the seed's fixed-coefficient recurrence, generalised to n state elements,
  each with its own decay, input gain and output weight; ``step(state, x)`` is one token.
- ``affine_scan``: the states of h_t = a_t * h_{t-1} + b_t in three orders: ``sequential`` (one
  step per token: the decode path), ``parallel`` (a log-depth Hillis-Steele scan over the affine
  maps h -> a h + b: the prefill path) and ``chunked`` (each chunk scanned in parallel, its final
  state seeding the next: chunked prefill); also ``blelloch`` (work-efficient) and ``two-level``
  (all chunks at once, then the carries), with ``scan_depth`` and ``scan_work`` counting each.
- ``selective_scan``: Mamba's selective SSM on that scan, with the argument shapes of the reference
  ``selective_scan_ref`` of state-spaces/mamba; ``ssm_step`` is one decode token of it.
- ``mamba_mixer`` and ``mamba_forward``: a Hugging Face ``MambaForCausalLM`` run on kvlab's scan,
  with its state (convolution window and SSM state) held by kvlab.
- Cache arithmetic: KV bytes of an attention layer against the fixed state of an SSM layer, and
  the cache of a hybrid with k attention layers out of L; ``cache_nbytes`` measures a real cache,
  ``tiny_hybrid`` builds a real hybrid (a random-weight Jamba).
- ``linear_recall_error``: what a fixed linear state cannot do, exactly (least squares), against
  ``attention_recall``, a hand-built attention lookup.
- ``decode_step_times``: one decode step of attention and Mamba models after a given context;
  ``bench_rows`` for ``python -m kvlab bench``.

The SSM models come from ``kvlab.tiny_model("mamba")`` (``kvlab.theory.shapes.SSMShape``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab._checks import integer, positive
from kvlab.versions import cache_kwargs, returned_cache

METHODS = ("sequential", "parallel", "chunked")
# Two more orders, for the scan-order comparison of section 9.6: Blelloch's work-efficient scan and
# the two-level scan that scans every chunk at once and then propagates the carries.
SCAN_ORDERS = METHODS + ("blelloch", "two-level")
CHUNKED_ORDERS = ("chunked", "two-level")
DEFAULT_CHUNK_SIZE = 64


# --- the seed's recurrence, generalised -----------------------------------------------------------

@dataclass(frozen=True)
class DiagonalRecurrence:
    """h_{t,i} = decay_i * h_{t-1,i} + gain_i * x_t, and y_t = sum_i readout_i * h_{t,i} (section 9.6).

    A linear time-invariant SSM with a diagonal state matrix and a scalar input and output. The
    state has ``len(decay)`` elements whatever the number of tokens folded into it.
    """

    decay: tuple[float, ...]
    gain: tuple[float, ...]
    readout: tuple[float, ...]

    def __post_init__(self):
        n = len(self.decay)
        if n < 1:
            raise ValueError("decay must have at least one element (the state size)")
        for name in ("gain", "readout"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have {n} elements, one per state element (len(decay)), "
                                 f"got {len(getattr(self, name))}")
        for name in ("decay", "gain", "readout"):
            for v in getattr(self, name):
                if not math.isfinite(v):
                    raise ValueError(f"{name} must hold finite numbers, got {v!r}")

    @property
    def state_size(self) -> int:
        return len(self.decay)

    def initial_state(self) -> tuple[float, ...]:
        return (0.0,) * self.state_size

    def step(self, state, x: float) -> tuple[tuple[float, ...], float]:
        """Fold one token's feature ``x`` into ``state``; returns ``(new_state, y)``.

        The old state is read once and replaced: nothing about earlier tokens is kept besides it.
        """
        if len(state) != self.state_size:
            raise ValueError(f"state must have {self.state_size} elements, got {len(state)}")
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise TypeError(f"x must be a number, got {type(x).__name__}") from None
        if not math.isfinite(x):
            raise ValueError(f"x must be a finite number, got {x!r}")
        new = tuple(a * h + b * x for a, h, b in zip(self.decay, state, self.gain))
        return new, sum(c * h for c, h in zip(self.readout, new))

    def run(self, xs, state=None) -> tuple[list[tuple[float, ...]], list[float]]:
        """``step`` over the features ``xs``; returns every state and every output."""
        state = self.initial_state() if state is None else tuple(state)
        states, ys = [], []
        for x in xs:
            state, y = self.step(state, x)
            states.append(state)
            ys.append(y)
        return states, ys

    def input_map(self, length: int):
        """The fp64 matrix M with h_T = M x for T = ``length`` inputs from a zero state:
        M[i, t] = gain_i * decay_i ** (T - 1 - t). Its rank bounds what the state can recall."""
        import torch

        integer("length", length, 1)
        ages = torch.arange(length - 1, -1, -1, dtype=torch.float64)
        decay = torch.tensor(self.decay, dtype=torch.float64)[:, None]
        return torch.tensor(self.gain, dtype=torch.float64)[:, None] * decay ** ages


# The worked example of section 9.6: h_t = (0.5 h_{t-1,1} + x_t, 0.25 h_{t-1,2} + 2 x_t), y_t = h_t1 + h_t2.
SEED_RECURRENCE = DiagonalRecurrence(decay=(0.5, 0.25), gain=(1.0, 2.0), readout=(1.0, 1.0))
SEED_INPUTS = (2.0, 1.0)
SEED_STATES = ((2.0, 4.0), (2.0, 3.0))  # h1, h2 as the seed gives them
SEED_OUTPUTS = (6.0, 5.0)  # y1, y2


# --- the scan over affine maps ----------------------------------------------------------------------

def _check_method(method, chunk_size, allowed=SCAN_ORDERS):
    if method not in allowed:
        raise ValueError(f"method must be one of {allowed}, got {method!r}")
    if chunk_size is not None:
        if method not in CHUNKED_ORDERS:
            raise ValueError(f"chunk_size applies to method in {CHUNKED_ORDERS} only, got chunk_size={chunk_size!r} "
                             f"with method={method!r}")
        integer("chunk_size", chunk_size, 1)
    return DEFAULT_CHUNK_SIZE if (method in CHUNKED_ORDERS and chunk_size is None) else chunk_size


def _sequential(a, b, h):
    states = []
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        states.append(h)
    return states


def _parallel(a, b, h):
    """Hillis-Steele inclusive scan: after the round with offset d, position t holds the composition
    of the maps t-2d+1..t. Composing (a1, b1) then (a2, b2) gives (a2 a1, a2 b1 + b2)."""
    import torch

    offset = 1
    while offset < a.shape[0]:
        b = torch.cat([b[:offset], a[offset:] * b[:-offset] + b[offset:]])
        a = torch.cat([a[:offset], a[offset:] * a[:-offset]])
        offset *= 2
    return a * h + b  # apply each prefix map to the initial state


def _compose(first, then):
    """The map 'first, then then': (a1, b1) then (a2, b2) is (a2 a1, a2 b1 + b2)."""
    (a1, b1), (a2, b2) = first, then
    return a2 * a1, a2 * b1 + b2


def _blelloch(a, b, h):
    """Blelloch's work-efficient scan: an up-sweep builds a tree of partial compositions, a
    down-sweep turns it into exclusive prefixes; each sweep takes log2 n rounds and about n
    compositions (n = length padded to a power of two with identity maps)."""
    import torch

    length = a.shape[0]
    n = 1 << max(0, math.ceil(math.log2(length)))
    pad = (n - length,) + tuple(a.shape[1:])
    a = torch.cat([a, torch.ones(pad, dtype=a.dtype, device=a.device)])
    b = torch.cat([b, torch.zeros(pad, dtype=b.dtype, device=b.device)])
    own = (a[:length], b[:length])
    a, b = a.clone(), b.clone()
    half = 1
    while half < n:  # up-sweep: node i covers the 2*half maps ending at i
        right = torch.arange(2 * half - 1, n, 2 * half, device=a.device)
        a[right], b[right] = _compose((a[right - half], b[right - half]), (a[right], b[right]))
        half *= 2
    a[n - 1], b[n - 1] = 1, 0  # identity: nothing precedes the first map
    half = n // 2
    while half >= 1:  # down-sweep: left child gets the parent's prefix, right child prefix + left subtree
        right = torch.arange(2 * half - 1, n, 2 * half, device=a.device)
        left = right - half
        subtree = (a[left].clone(), b[left].clone())
        a[left], b[left] = a[right], b[right]
        a[right], b[right] = _compose((a[right], b[right]), subtree)
        half //= 2
    a, b = _compose((a[:length], b[:length]), own)  # exclusive prefix, then the position's own map
    return a * h + b


def _two_level(a, b, h, chunk_size):
    """Every chunk scanned at once (Hillis-Steele inside each), then the carries propagated from
    chunk to chunk (one step per chunk), then each position's in-chunk prefix applied to its carry."""
    import torch

    length = a.shape[0]
    chunks = -(-length // chunk_size)
    pad = (chunks * chunk_size - length,) + tuple(a.shape[1:])
    a = torch.cat([a, torch.ones(pad, dtype=a.dtype, device=a.device)])
    b = torch.cat([b, torch.zeros(pad, dtype=b.dtype, device=b.device)])
    shape = (chunks, chunk_size) + tuple(a.shape[1:])
    a, b = a.reshape(shape).transpose(0, 1), b.reshape(shape).transpose(0, 1)  # [c, chunks, ...]
    offset = 1
    while offset < chunk_size:  # level one: all chunks together
        b = torch.cat([b[:offset], a[offset:] * b[:-offset] + b[offset:]])
        a = torch.cat([a[:offset], a[offset:] * a[:-offset]])
        offset *= 2
    carries = [h]
    for j in range(chunks - 1):  # level two: the state entering each chunk
        carries.append(a[-1, j] * carries[-1] + b[-1, j])
    carry = torch.stack(carries)  # [chunks, ...]
    states = a * carry + b  # [c, chunks, ...]
    return states.transpose(0, 1).reshape((chunks * chunk_size,) + tuple(a.shape[2:]))[:length]


def affine_scan(a, b, initial=None, method: str = "sequential", chunk_size: int | None = None):
    """Every state of h_t = a_t * h_{t-1} + b_t, time along dim 0 (section 9.6).

    ``a`` and ``b`` are tensors of one shape ``[length, ...]``; ``initial`` (default zeros) has the
    shape ``a.shape[1:]``. Returns the states ``[length, ...]``. ``sequential`` takes ``length``
    dependent steps; ``parallel`` takes ceil(log2 length) rounds of elementwise work over the whole
    sequence (O(length log length) work); ``chunked`` scans ``chunk_size`` tokens at a time in
    parallel and passes each chunk's final state to the next (the last chunk may be shorter).
    ``blelloch`` is the work-efficient scan (about 2 log2 length rounds, O(length) work);
    ``two-level`` scans all chunks at once, then carries the state across chunks (about
    log2 chunk_size + length / chunk_size rounds). ``scan_depth`` and ``scan_work`` count each.
    """
    import torch

    chunk_size = _check_method(method, chunk_size)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("a and b must be torch.Tensors")
    if a.dim() < 1 or a.shape != b.shape:
        raise ValueError(f"a and b must share one shape [length, ...], got {tuple(a.shape)} and {tuple(b.shape)}")
    if not a.dtype.is_floating_point or a.dtype != b.dtype or (initial is not None and initial.dtype != a.dtype):
        raise TypeError(f"a, b (and initial) must share one floating dtype, got {a.dtype}, {b.dtype}"
                        + (f", {initial.dtype}" if initial is not None else ""))
    h = torch.zeros_like(b[0]) if initial is None and a.shape[0] else initial
    if initial is not None and tuple(initial.shape) != tuple(a.shape[1:]):
        raise ValueError(f"initial must have shape {tuple(a.shape[1:])}, got {tuple(initial.shape)}")
    if a.shape[0] == 0:
        return b.clone()
    if method == "sequential":
        return torch.stack(_sequential(a, b, h))
    if method == "parallel":
        return _parallel(a, b, h)
    if method == "blelloch":
        return _blelloch(a, b, h)
    if method == "two-level":
        return _two_level(a, b, h, chunk_size)
    chunks = []
    for start in range(0, a.shape[0], chunk_size):
        states = _parallel(a[start:start + chunk_size], b[start:start + chunk_size], h)
        chunks.append(states)
        h = states[-1]
    return torch.cat(chunks)


def _hillis_steele_work(n: int) -> int:
    """Compositions of a Hillis-Steele scan of n maps, plus n applications to the initial state."""
    return sum(n - 2**r for r in range(math.ceil(math.log2(n)))) + n if n > 1 else 1


def scan_work(length: int, method: str, chunk_size: int | None = None) -> int:
    """Affine-map operations (compositions plus applications) per state element that a scan of
    ``length`` tokens performs, as kvlab implements each order (section 9.6):

    - ``sequential``: ``length`` applications;
    - ``parallel`` (Hillis-Steele): sum over rounds of (length - offset) compositions, plus
      ``length`` applications: about length log2 length;
    - ``chunked``: that per chunk of ``chunk_size``: about length log2 c;
    - ``blelloch``: n - 1 compositions up and n - 1 down (n = length rounded up to a power of two),
      then each position's own map and an application: about 2n + 2 length, O(length);
    - ``two-level``: the Hillis-Steele work of every chunk, plus one application per chunk carry.
    """
    integer("length", length, 1)
    chunk_size = _check_method(method, chunk_size)
    if method == "sequential" or length == 1:
        return length
    if method == "parallel":
        return _hillis_steele_work(length)
    if method == "blelloch":
        n = 1 << math.ceil(math.log2(length))
        return 2 * (n - 1) + 2 * length
    full, rest = divmod(length, chunk_size)
    work = full * _hillis_steele_work(chunk_size) + (_hillis_steele_work(rest) if rest else 0)
    return work + (-(-length // chunk_size) - 1 if method == "two-level" else 0)


def scan_depth(length: int, method: str, chunk_size: int | None = None) -> int:
    """Dependent rounds a scan of ``length`` tokens takes (section 9.6): ``length`` sequential
    steps; ceil(log2 length) Hillis-Steele rounds; 2 ceil(log2 length) for Blelloch's up- and
    down-sweep; per chunk of c tokens ceil(log2 c) rounds plus one hand-over when the chunks run one
    after another (``chunked``: about (length / c) log2 c); ceil(log2 c) rounds for all chunks at
    once plus one carry step per chunk after the first (``two-level``: about log2 c + length / c).
    The final application of each prefix to the initial state is one more elementwise round in
    every parallel order and is not counted.
    """
    integer("length", length, 1)
    chunk_size = _check_method(method, chunk_size)
    if method == "sequential":
        return length
    if method == "parallel":
        return math.ceil(math.log2(length))
    if method == "blelloch":
        return 2 * math.ceil(math.log2(length))
    if method == "two-level":
        return math.ceil(math.log2(min(chunk_size, length))) + -(-length // chunk_size) - 1
    full, rest = divmod(length, chunk_size)
    rounds = full * (math.ceil(math.log2(chunk_size)) + 1)
    return rounds + (math.ceil(math.log2(rest)) + 1 if rest else 0)


# --- the selective SSM (Mamba) ------------------------------------------------------------------

_LAYOUT = {
    "u": "[batch, dim, length]", "delta": "[batch, dim, length]", "z": "[batch, dim, length]",
    "A": "[dim, state]", "B": "[batch, state, length]", "C": "[batch, state, length]",
    "D": "[dim]", "delta_bias": "[dim]", "initial_state": "[batch, dim, state]",
    "state": "[batch, dim, state]", "u_t": "[batch, dim]", "delta_t": "[batch, dim]", "z_t": "[batch, dim]",
    "B_t": "[batch, state]", "C_t": "[batch, state]",
}


def _check_tensors(**tensors):
    """Each tensor must be a floating torch.Tensor of the shape its layout names ({name: tuple})."""
    import torch

    sizes = {}
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor {_LAYOUT[name]}, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        axes = _LAYOUT[name].strip("[]").split(", ")
        if t.dim() != len(axes):
            raise ValueError(f"{name} must have {len(axes)} dimensions {_LAYOUT[name]}, got shape {tuple(t.shape)}")
        for axis, size in zip(axes, t.shape):
            size = int(size)
            if sizes.setdefault(axis, (size, name))[0] != size:
                raise ValueError(f"{name} has {axis}={size} but {sizes[axis][1]} has {axis}={sizes[axis][0]} "
                                 f"({name} is {_LAYOUT[name]})")
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return {axis: size for axis, (size, _) in sizes.items()}


def _compute_dtype(u):
    import torch

    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _step_size(delta, delta_bias, delta_softplus, dtype, bias_shape):
    import torch.nn.functional as F

    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype).reshape(bias_shape)
    return F.softplus(delta) if delta_softplus else delta


def _gate(y, u, D, z, dtype, d_shape):
    import torch.nn.functional as F

    if D is not None:
        y = y + u.to(dtype) * D.to(dtype).reshape(d_shape)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                   return_last_state: bool = False, method: str = "sequential", chunk_size: int | None = None,
                   initial_state=None):
    """Mamba's selective SSM over a whole sequence (section 9.6), in one of the ``SCAN_ORDERS``.

    Shapes as ``selective_scan_ref`` of state-spaces/mamba: ``u``, ``delta``, ``z`` ``[batch, dim,
    length]``; ``A`` ``[dim, state]``; ``B``, ``C`` ``[batch, state, length]``; ``D``, ``delta_bias``
    ``[dim]``; ``initial_state`` ``[batch, dim, state]`` (default zeros). Per channel d and token t,
    with dt = softplus(delta + delta_bias) (or without softplus / bias as asked):

        h_t = exp(dt * A[d]) * h_{t-1} + dt * B_t * u_t,    y_t = <C_t, h_t> + D[d] u_t,
        out_t = y_t * silu(z_t).

    ``method``: ``sequential`` (a step per token), ``parallel`` (log depth), ``chunked``
    (``chunk_size`` tokens at a time, default 64), ``blelloch`` or ``two-level`` (see ``affine_scan``). Arithmetic in fp32 (fp64 for fp64 ``u``); the
    output has ``u``'s dtype. Returns ``out`` ``[batch, dim, length]``, or ``(out, last_state)``
    with ``return_last_state`` (the state after the last token, fp32/fp64, ``[batch, dim, state]``).
    """
    import torch

    _check_method(method, chunk_size)
    size = _check_tensors(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                          initial_state=initial_state)
    dtype = _compute_dtype(u)
    dt = _step_size(delta, delta_bias, delta_softplus, dtype, (-1, 1))  # [b, d, L]
    decay = torch.exp(dt[..., None] * A.to(dtype)[:, None, :])  # [b, d, L, n]
    inputs = (dt * u.to(dtype))[..., None] * B.to(dtype).transpose(1, 2)[:, None]  # [b, d, L, n]
    h0 = None if initial_state is None else initial_state.to(dtype)
    states = affine_scan(decay.permute(2, 0, 1, 3), inputs.permute(2, 0, 1, 3), h0, method, chunk_size)
    y = torch.einsum("lbdn,bnl->bdl", states, C.to(dtype))
    out = _gate(y, u, D, z, dtype, (-1, 1)).to(u.dtype)
    if not return_last_state:
        return out
    if size["length"] == 0:
        last = h0 if h0 is not None else torch.zeros(size["batch"], size["dim"], size["state"], dtype=dtype,
                                                     device=u.device)
        return out, last
    return out, states[-1]


def ssm_step(state, u_t, delta_t, A, B_t, C_t, D=None, z_t=None, delta_bias=None, delta_softplus: bool = False):
    """One decode token of the selective SSM (section 9.6): read the state, update it, emit y_t.

    ``state`` ``[batch, dim, state]``; ``u_t``, ``delta_t``, ``z_t`` ``[batch, dim]``; ``A``
    ``[dim, state]``; ``B_t``, ``C_t`` ``[batch, state]``; ``D``, ``delta_bias`` ``[dim]``. Returns
    ``(y_t, new_state)``: ``y_t`` ``[batch, dim]`` in ``u_t``'s dtype, ``new_state`` in the compute
    dtype (fp32, or fp64 for fp64 ``u_t``). ``state`` is not modified: the caller keeps the new one in
    its place (the in-place Triton version is ``kvlab.kernels.selective_state_update``).
    """
    import torch

    _check_tensors(state=state, u_t=u_t, delta_t=delta_t, A=A, B_t=B_t, C_t=C_t, D=D, z_t=z_t,
                   delta_bias=delta_bias)
    dtype = _compute_dtype(u_t)
    dt = _step_size(delta_t, delta_bias, delta_softplus, dtype, (-1,))  # [b, d]
    new_state = torch.exp(dt[..., None] * A.to(dtype)) * state.to(dtype) \
        + (dt * u_t.to(dtype))[..., None] * B_t.to(dtype)[:, None, :]
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
    import torch
    import torch.nn.functional as F

    k = weight.shape[-1]
    full = torch.cat([window, x], dim=-1)
    out = F.conv1d(full[..., 1:], weight, bias, groups=x.shape[1])  # k-1 earlier inputs per output
    return out[..., -x.shape[-1]:], full[..., -k:]


def mamba_mixer(mixer, hidden_states, state: MambaLayerState | None = None, method: str = "parallel",
                chunk_size: int | None = None):
    """A Hugging Face ``MambaMixer``'s forward pass computed with kvlab's scan (section 9.6).

    ``hidden_states`` ``[batch, length, hidden]``. With ``state=None`` the sequence starts from
    zeros. A single token with a state goes through ``ssm_step`` (the decode path); anything else
    through ``selective_scan`` with ``method``. Returns ``(output, new_state)``.
    """
    import torch
    import torch.nn.functional as F

    batch, length, _ = hidden_states.shape
    d, n, k = mixer.intermediate_size, mixer.ssm_state_size, mixer.conv_kernel_size
    x, gate = mixer.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)
    if state is None:
        state = MambaLayerState(conv=x.new_zeros(batch, d, k), ssm=x.new_zeros(batch, d, n, dtype=torch.float32))
    x, window = _causal_conv(x, mixer.conv1d.weight, mixer.conv1d.bias, state.conv.to(x.dtype))
    x = F.silu(x)
    dt, B, C = torch.split(mixer.x_proj(x.transpose(1, 2)), [mixer.time_step_rank, n, n], dim=-1)
    delta = (dt @ mixer.dt_proj.weight.T).transpose(1, 2)  # the bias goes in as delta_bias
    A = -torch.exp(mixer.A_log.float())
    common = dict(D=mixer.D.float(), delta_bias=mixer.dt_proj.bias.float(), delta_softplus=True)
    if length == 1:
        y, ssm = ssm_step(state.ssm, x[..., 0], delta[..., 0], A, B[:, 0], C[:, 0], z_t=gate[..., 0], **common)
        y = y[..., None]
    else:
        y, ssm = selective_scan(x, delta, A, B.transpose(1, 2), C.transpose(1, 2), z=gate, return_last_state=True,
                                method=method, chunk_size=chunk_size, initial_state=state.ssm, **common)
    return mixer.out_proj(y.transpose(1, 2).to(hidden_states.dtype)), MambaLayerState(window, ssm)


def mamba_forward(model, input_ids, states: list[MambaLayerState] | None = None, method: str = "parallel",
                  chunk_size: int | None = None):
    """``MambaForCausalLM``'s forward pass with every mixer on kvlab's scan (section 9.6).

    Returns ``(logits, states)``; pass ``states`` back with the next tokens to continue the sequence
    (prefill, then one token per call is decode). The states are kvlab's, not a transformers cache.
    """
    import torch

    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int32, torch.int64) \
            or input_ids.dim() != 2:
        raise TypeError(f"input_ids must be an int64 tensor [batch, tokens], "
                        f"got {getattr(input_ids, 'dtype', input_ids)!r}")
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
            out, state = mamba_mixer(block.mixer, block.norm(hidden.to(block.norm.weight.dtype)), state,
                                     method, chunk_size)
            hidden = residual + out
            new_states.append(state)
        logits = model.lm_head(backbone.norm_f(hidden).to(model.lm_head.weight.dtype)).float()
    return logits, new_states


# --- cache arithmetic: attention records against a fixed state ---------------------------------

def _check_positive(name, value):
    positive(name, value)


def attention_kv_bytes(context: int, kv_width: int, bytes_per_element: float = 2) -> float:
    """Bytes one attention layer keeps for one sequence: a key and a value of ``kv_width`` elements
    (KV heads x head dim) per retained token: 2 * context * kv_width * bytes (section 9.6)."""
    integer("context", context, 0)
    integer("kv_width", kv_width, 1)
    _check_positive("bytes_per_element", bytes_per_element)
    return 2 * context * kv_width * bytes_per_element


def breakeven_context(kv_bytes_per_token: float, state_bytes: float) -> float:
    """The context at which one attention layer's KV bytes equal one SSM layer's fixed state."""
    _check_positive("kv_bytes_per_token", kv_bytes_per_token)
    _check_positive("state_bytes", state_bytes)
    return state_bytes / kv_bytes_per_token


def hybrid_cache_bytes(context: int, layers: int, attention_layers: int, kv_bytes_per_token: float,
                       state_bytes: float, batch: int = 1) -> float:
    """Cache bytes of a hybrid with ``attention_layers`` attention layers out of ``layers`` (section 9.6).

    ``kv_bytes_per_token`` and ``state_bytes`` are per layer and per sequence:
    batch * (k * context * kv_bytes_per_token + (L - k) * state_bytes). k = L is a transformer,
    k = 0 a pure SSM; at long context the hybrid costs about k / L of the transformer.
    """
    integer("context", context, 0)
    integer("layers", layers, 1)
    integer("attention_layers", attention_layers, 0)
    integer("batch", batch, 1)
    if attention_layers > layers:
        raise ValueError(f"attention_layers must be in [0, layers={layers}], got {attention_layers}")
    _check_positive("kv_bytes_per_token", kv_bytes_per_token)
    _check_positive("state_bytes", state_bytes)
    return batch * (attention_layers * context * kv_bytes_per_token + (layers - attention_layers) * state_bytes)


def cache_nbytes(cache) -> int:
    """Bytes a transformers cache actually holds: the sum of its tensors' ``nbytes`` (section 9.6).

    Counts each layer's ``keys`` and ``values`` (attention) and ``conv_states`` and
    ``recurrent_states`` (Mamba and other linear-attention layers)."""
    import torch

    total = 0
    for layer in cache.layers:
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        tensors += layer_states(layer, "conv_states") + layer_states(layer, "recurrent_states")
        total += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))
    return total


def layer_states(layer, name: str) -> list:
    """A linear-attention cache layer's ``conv_states`` or ``recurrent_states`` as a list of tensors:
    transformers 5.14 and later keep a dict of them per layer, 5.5 to 5.13 one tensor."""
    states = getattr(layer, name, None)
    if states is None:
        return []
    return [t for t in states.values() if t is not None] if isinstance(states, dict) else [states]


def layer_kinds(cache) -> list[str]:
    """``"attention"`` or ``"ssm"`` for each layer of a transformers cache."""
    return ["ssm" if hasattr(layer, "recurrent_states") else "attention" for layer in cache.layers]


def tiny_hybrid(layers: int = 4, attention_layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int | None = None, state_size: int = 16, expand: int = 2, vocab: int = 512, seed: int = 0, dtype=None, device=None):
    """A random-weight Jamba (Mamba layers with every (L/k)-th layer attention), built from a config.

    ``attention_layers`` k of ``layers`` L must divide L: layers L/k - 1, 2L/k - 1, ... are
    attention (multi-head unless ``kv_heads``), the rest Mamba layers of ``expand * hidden`` channels
    and a ``state_size`` state; the MLPs are dense (one expert). Section 9.6: a real hybrid cache.
    k = 0 is refused: transformers' Jamba cannot run with a cache holding no attention layer (its
    ``get_seq_length`` raises); a pure SSM is ``tiny_model("mamba")``.
    """
    import torch
    import transformers

    from kvlab.lab.hardware import device as default_device

    integer("layers", layers, 1)
    integer("attention_layers", attention_layers, 1)
    if attention_layers > layers or layers % attention_layers:
        raise ValueError(f"attention_layers must be a divisor of layers={layers}, got {attention_layers}")
    period = layers // attention_layers
    config = transformers.JambaConfig(
        hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab, num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads, intermediate_size=2 * hidden, num_experts=1, num_experts_per_tok=1,
        attn_layer_period=period, attn_layer_offset=period - 1, mamba_d_state=state_size, mamba_expand=expand,
        mamba_dt_rank=max(1, -(-hidden // 16)), mamba_d_conv=4, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    dev = torch.device(device) if device is not None else default_device()
    torch.manual_seed(seed)
    with torch.device(dev):
        model = transformers.JambaForCausalLM(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# --- what a fixed state cannot do ---------------------------------------------------------------

def linear_recall_errors(recurrence: DiagonalRecurrence, length: int):
    """Best-case error of reading each token back out of the state after ``length`` tokens (9.6).

    The inputs are i.i.d. with unit variance and the readout is the best linear one (least
    squares), so entry p is the fraction of x_p's variance that no linear readout of h_T recovers:
    1 - ||P e_p||^2, with P the projection onto the row space of ``input_map(length)``. Their mean
    is exactly 1 - rank(M) / T, so at least 1 - n / T for any decays and gains. Returns an fp64
    tensor ``[length]``; position 0 is the oldest token.
    """
    import torch

    integer("length", length, 1)
    m = recurrence.input_map(length)
    # Orthonormal basis of M's row space (SVD, dropping directions fp64 cannot resolve).
    _, s, vh = torch.linalg.svd(m, full_matrices=False)
    basis = vh[s > s.max() * length * torch.finfo(torch.float64).eps] if s.max() > 0 else vh[:0]
    return (1.0 - (basis ** 2).sum(0)).clamp(0.0, 1.0)


def linear_recall_error(recurrence: DiagonalRecurrence, length: int, position: int | None = None) -> float:
    """``linear_recall_errors`` at one ``position``, or their mean over all positions with ``None``."""
    if position is not None:
        integer("position", position, 0)
        integer("length", length, 1)
        if position >= length:
            raise ValueError(f"position must be in [0, length={length}), got {position}")
    errors = linear_recall_errors(recurrence, length)
    return float(errors.mean() if position is None else errors[position])


def spread_recurrence(state_size: int, fastest: float = 0.5, slowest: float = 0.99) -> DiagonalRecurrence:
    """A recurrence with ``state_size`` decays spread geometrically between ``fastest`` and ``slowest``
    (unit gains and readout): a fair fixed state for the recall probe of section 9.6."""
    integer("state_size", state_size, 1)
    for name, value in (("fastest", fastest), ("slowest", slowest)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number in (0, 1), got {type(value).__name__} {value!r}")
    if not 0 < fastest <= slowest < 1:
        raise ValueError(f"need 0 < fastest <= slowest < 1, got fastest={fastest}, slowest={slowest}")
    if state_size == 1:
        decays = (slowest,)
    else:
        ratio = (math.log(slowest) / math.log(fastest)) ** (1 / (state_size - 1))
        decays = tuple(math.exp(math.log(fastest) * ratio ** i) for i in range(state_size))
    return DiagonalRecurrence(decays, (1.0,) * state_size, (1.0,) * state_size)


def attention_recall(values, position: int | None = None, sharpness: float = 50.0):
    """A hand-built attention lookup: one-hot position keys, the query of ``position`` scaled by
    ``sharpness``; returns softmax(q K^T) V for ``values`` ``[..., length]`` (section 9.6).

    ``position=None`` asks for every position at once and returns ``[..., length]``."""
    import torch

    if not isinstance(values, torch.Tensor) or not values.dtype.is_floating_point or values.dim() < 1:
        raise TypeError(f"values must be a floating torch.Tensor [..., length], got {type(values).__name__}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("values holds NaN or infinite numbers")
    _check_positive("sharpness", sharpness)
    length = values.shape[-1]
    if position is not None:
        integer("position", position, 0)
        if position >= length:
            raise ValueError(f"position must be in [0, length={length}), got {position}")
    keys = torch.eye(length, dtype=values.dtype, device=values.device)
    queries = keys if position is None else keys[position:position + 1]
    out = values @ torch.softmax(sharpness * queries @ keys.T, dim=-1).T
    return out if position is None else out[..., 0]


# --- timing (section 9.6) ------------------------------------------------------------------------

def _filled_cache(model, context: int):
    """A cache as if ``context`` tokens had gone in: attention layers get ``context`` random keys and
    values (time like real ones); a Mamba model's state has one shape for any context, so a short
    real prefill fills it."""
    import torch
    from transformers import DynamicCache

    if model.config.model_type == "mamba":
        ids = torch.randint(0, model.config.vocab_size, (1, min(context, 8)), device=model.device)
        with torch.no_grad():
            return returned_cache(model(ids, use_cache=True))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    shape = (1, cfg.num_key_value_heads, context, head_dim)
    for layer in range(cfg.num_hidden_layers):
        cache.update(torch.randn(shape, dtype=model.dtype, device=model.device),
                     torch.randn(shape, dtype=model.dtype, device=model.device), layer)
    return cache


def decode_step_times(models: dict, contexts, warmup: int = 2, reps: int = 7) -> dict:
    """Time one decode token of each Hugging Face model after each context (section 9.6).

    ``models`` maps a name to a model: attention models get a ``DynamicCache`` filled with
    ``context`` random keys and values (growing by one token per timed call, as in ``cached_decode``);
    a ``MambaForCausalLM`` its fixed state. All (model, context) pairs are timed interleaved, one
    step each per round, so that a shared machine's drift hits them alike. Returns
    ``{name: [Timing per context]}``. kvlab.decode's loops pass the whole attention mask at every
    step, which ``MambaForCausalLM`` mis-broadcasts, hence this loop.
    """
    from kvlab.lab.timing import measure

    if not isinstance(models, dict) or not models:
        raise TypeError(f"models must be a non-empty dict {{name: model}}, got {type(models).__name__}")
    for context in contexts:
        integer("context", context, 1)
    integer("warmup", warmup, 0)
    integer("reps", reps, 1)
    steps = {}
    for name, model in models.items():
        for context in contexts:
            steps[name, context] = _decode_step(model, context)
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {key: [] for key in steps}
    for _ in range(reps):
        for key, step in steps.items():
            times[key].append(measure(step, warmup=0, reps=1, device=models[key[0]].device).median)
    return {name: [_timing(times[name, c]) for c in contexts] for name in models}


def _timing(times):
    import statistics

    from kvlab.lab.timing import Timing

    return Timing(statistics.median(times), min(times), max(times), tuple(times))


def _decode_step(model, context: int):
    import torch

    cache = _filled_cache(model, context)
    token = torch.randint(0, model.config.vocab_size, (1, 1), device=model.device)
    position = torch.tensor([[context]], device=model.device)
    extra = {} if model.config.model_type == "mamba" else {"position_ids": position}

    def step():
        with torch.no_grad():
            model(token, **cache_kwargs(model, cache), use_cache=True, **extra)

    return step


def scan_inputs(batch: int, dim: int, state: int, length: int, seed: int = 0, device=None, dtype=None):
    """Random selective-scan inputs of the Mamba shapes, with Mamba-like A < 0 and small positive steps."""
    import torch

    for name, value in (("batch", batch), ("dim", dim), ("state", state), ("length", length)):
        integer(name, value, 1)
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    A = -torch.exp(torch.randn(dim, state, generator=g)).to(device=device, dtype=torch.float32)
    delta = (torch.rand(batch, dim, length, generator=g) * 0.2 + 0.01).to(device=device, dtype=dtype)  # dt > 0
    return dict(u=rand(batch, dim, length), delta=delta, A=A,
                B=rand(batch, state, length), C=rand(batch, state, length))


def bench_rows() -> list:
    """Section 9.6: scan orders at prefill, and decode step time of Mamba against Llama.

    CPU: a 1024-token scan over 256 channels with a 16-element state; the CPU-size models at
    contexts 256 and 4096. GPU: a 8192-token scan over 1536 channels; Mamba-1.4B against
    Llama-3.2-1B at 4096 and 32768. Methods run interleaved in one process; ratios are of medians.
    """
    import statistics

    import torch

    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import on_gpu
    from kvlab.lab.models import tiny_model
    from kvlab.lab.timing import measure

    gpu = on_gpu()
    length, dim = (8192, 1536) if gpu else (1024, 256)
    x = scan_inputs(1, dim, 16, length, device="cuda" if gpu else "cpu")
    runs = {"sequential": [], "parallel": [], "chunked": []}
    for _ in range(3):
        for method in runs:
            runs[method].append(measure(lambda: selective_scan(**x, method=method), warmup=1, reps=3).median)
    t = {m: statistics.median(v) for m, v in runs.items()}
    where = f"batch 1, dim {dim}, state 16, length {length}, chunk {DEFAULT_CHUNK_SIZE}"
    rows = [Row(f"scan {m}", t[m] * 1e3, "ms", where) for m in runs]
    rows += [Row("sequential / parallel", t["sequential"] / t["parallel"], "x", "prefill scan, same run"),
             Row("sequential / chunked", t["sequential"] / t["chunked"], "x", "prefill scan, same run")]
    size = dict(size="real") if gpu else {}
    mamba = tiny_model("mamba", shape="mamba-1.4b" if gpu else None, **size)
    llama = tiny_model("llama", max_positions=65536, **size)
    contexts = (4096, 32768) if gpu else (256, 4096)
    timed = decode_step_times({"mamba": mamba, "llama": llama}, contexts, warmup=2, reps=7)
    for i, context in enumerate(contexts):
        steps = {name: timed[name][i].median for name in timed}
        note = f"{mamba.shape.name} vs {llama.shape.name}, batch 1, context {context}"
        rows += [Row(f"mamba step @ {context}", steps["mamba"] * 1e3, "ms", note),
                 Row(f"llama step @ {context}", steps["llama"] * 1e3, "ms", note),
                 Row(f"llama / mamba step @ {context}", steps["llama"] / steps["mamba"], "x", "same run")]
    return rows
