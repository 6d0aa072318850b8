"""Notebook 07, hybrid attention and SSM state (section 9.6): what scans cost and what state weighs.

- ``scan_work`` and ``scan_depth``: the affine-map operations and the dependent rounds of a scan of
  h_t = a_t h_{t-1} + b_t over s tokens in each order ``kvlab.cache.scan.affine_scan`` implements:
  sequential (the decode path), Hillis-Steele parallel (Hillis and Steele 1986), chunked, Blelloch's
  work-efficient scan (Blelloch 1990) and the two-level scan;
- ``attention_kv_bytes``, ``breakeven_context`` and ``hybrid_cache_bytes``: an attention layer's
  cache grows with the context, an SSM layer's state does not (Gu and Dao 2023), and a hybrid with
  k attention layers out of L (Lieber et al. 2024) costs about k / L of a transformer's cache.

Pure Python; the scans themselves are in ``kvlab.cache.scan``.
"""

from __future__ import annotations

import math

from kvlab._checks import integer, one_of, positive

METHODS = ("sequential", "parallel", "chunked")
# Two more orders, for the scan-order comparison of section 9.6: Blelloch's work-efficient scan and
# the two-level scan that scans every chunk at once and then propagates the carries.
SCAN_ORDERS = METHODS + ("blelloch", "two-level")
CHUNKED_ORDERS = ("chunked", "two-level")
DEFAULT_CHUNK_SIZE = 64


# --- the orders and their cost -----------------------------------------------------------------------

def scan_chunk_size(method, chunk_size, allowed=SCAN_ORDERS):
    """The chunk size a scan of ``method`` uses: ``chunk_size``, or ``DEFAULT_CHUNK_SIZE`` for a chunked
    order given None; None for the unchunked orders. Refuses an unknown method, and a chunk size
    given to an order that does not chunk."""
    one_of("method", method, allowed)
    if chunk_size is not None:
        if method not in CHUNKED_ORDERS:
            raise ValueError(f"chunk_size applies to method in {CHUNKED_ORDERS} only, got chunk_size={chunk_size!r} "
                             f"with method={method!r}")
        integer("chunk_size", chunk_size, 1)
    return DEFAULT_CHUNK_SIZE if (method in CHUNKED_ORDERS and chunk_size is None) else chunk_size


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
    chunk_size = scan_chunk_size(method, chunk_size)
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
    chunk_size = scan_chunk_size(method, chunk_size)
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


# --- cache bytes: attention records against a fixed state -----------------------------------------------

def attention_kv_bytes(context: int, kv_width: int, bytes_per_element: float = 2) -> float:
    """Bytes one attention layer keeps for one sequence: a key and a value of ``kv_width`` elements
    (KV heads x head dim) per retained token: 2 * context * kv_width * bytes (section 9.6)."""
    integer("context", context, 0)
    integer("kv_width", kv_width, 1)
    positive("bytes_per_element", bytes_per_element)
    return 2 * context * kv_width * bytes_per_element


def breakeven_context(kv_bytes_per_token: float, state_bytes: float) -> float:
    """The context at which one attention layer's KV bytes equal one SSM layer's fixed state."""
    positive("kv_bytes_per_token", kv_bytes_per_token)
    positive("state_bytes", state_bytes)
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
    positive("kv_bytes_per_token", kv_bytes_per_token)
    positive("state_bytes", state_bytes)
    return batch * (attention_layers * context * kv_bytes_per_token + (layers - attention_layers) * state_bytes)
