"""Notebook 07, hybrid attention and SSM state (section 9.6): the scan over affine maps.

A state-space layer's recurrence h_t = a_t * h_{t-1} + b_t is a chain of affine maps h -> a h + b,
and composing two maps gives another: (a1, b1) then (a2, b2) is (a2 a1, a2 b1 + b2). Because that
composition is associative, the states of a whole prompt can be computed in any bracketing:

- ``sequential``: one dependent step per token, the decode path;
- ``parallel``: the Hillis-Steele inclusive scan (Hillis and Steele 1986), ceil(log2 s) rounds of
  elementwise work over the whole sequence, the prefill path;
- ``chunked``: each chunk scanned in parallel, its final state seeding the next (chunked prefill);
- ``blelloch``: the work-efficient up-sweep and down-sweep (Blelloch 1990);
- ``two-level``: all chunks at once, then the carries from chunk to chunk.

``kvlab.theory.ssm`` counts the work and depth of each; ``kvlab.cache.mamba`` runs Mamba's
selective SSM on this scan.
"""

from __future__ import annotations

import math

import torch

from kvlab.theory.ssm import scan_chunk_size


def _sequential(a, b, h):
    states = []
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        states.append(h)
    return states


def _parallel(a, b, h):
    """Hillis-Steele inclusive scan: after the round with offset d, position t holds the composition
    of the maps t-2d+1..t. Composing (a1, b1) then (a2, b2) gives (a2 a1, a2 b1 + b2)."""
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
    while (
        half >= 1
    ):  # down-sweep: left child gets the parent's prefix, right child prefix + left subtree
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
    chunk to chunk (one step per chunk), then each position's in-chunk prefix applied to its carry.
    """
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
    chunk_size = scan_chunk_size(method, chunk_size)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("a and b must be torch.Tensors")
    if a.dim() < 1 or a.shape != b.shape:
        raise ValueError(
            f"a and b must share one shape [length, ...], got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if (
        not a.dtype.is_floating_point
        or a.dtype != b.dtype
        or (initial is not None and initial.dtype != a.dtype)
    ):
        raise TypeError(
            f"a, b (and initial) must share one floating dtype, got {a.dtype}, {b.dtype}"
            + (f", {initial.dtype}" if initial is not None else "")
        )
    h = torch.zeros_like(b[0]) if initial is None and a.shape[0] else initial
    if initial is not None and tuple(initial.shape) != tuple(a.shape[1:]):
        raise ValueError(
            f"initial must have shape {tuple(a.shape[1:])}, got {tuple(initial.shape)}"
        )
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
        states = _parallel(a[start : start + chunk_size], b[start : start + chunk_size], h)
        chunks.append(states)
        h = states[-1]
    return torch.cat(chunks)
