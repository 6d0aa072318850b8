"""Notebook 07, hybrid attention and SSM state (section 9.6): what scans cost and what state weighs.

- ``scan_work`` and ``scan_depth``: the affine-map operations and the dependent rounds of a scan of
  h_t = a_t h_{t-1} + b_t over s tokens in each order ``kvlab.cache.scan.affine_scan`` implements:
  sequential (the decode path), Hillis-Steele parallel (Hillis and Steele 1986), chunked, Blelloch's
  work-efficient scan (Blelloch 1990) and the two-level scan;
- ``scan_time``, ``usable_fit``, ``fastest_order`` and ``parallel_break_even``: the scan cost model
  of section 9.6, t = tau * rounds + gamma * compositions * E, and the round cost at which the
  parallel scan starts to beat the sequential one;
- ``attention_step_slope``, ``SLOPE_TOLERANCE`` and ``is_flat``: how much an attention decode step
  grows per token of context, and when a fixed state's step counts as not growing;
- ``recall_bound``, ``at_recall_bound``, ``sampled_agrees`` and ``lookup_exact``: what a fixed state
  of n numbers can give back of s tokens, how close a sampled estimate must land, and when a lookup
  is exact;
- ``attention_kv_bytes``, ``breakeven_context`` and ``hybrid_cache_bytes``: an attention layer's
  cache grows with the context, an SSM layer's state does not (Gu and Dao 2023), and a hybrid with
  k attention layers out of L (Lieber et al. 2024) costs about k / L of a transformer's cache.

Pure Python; the scans themselves are in ``kvlab.cache.scan``.
"""

from __future__ import annotations

import math

from kvlab._checks import integer, nonnegative, one_of, positive, real

METHODS = ("sequential", "parallel", "chunked")
# Two more orders, for the scan-order comparison of section 9.6: Blelloch's work-efficient scan and
# the two-level scan that scans every chunk at once and then propagates the carries.
SCAN_ORDERS = METHODS + ("blelloch", "two-level")
CHUNKED_ORDERS = ("chunked", "two-level")
DEFAULT_CHUNK_SIZE = 64


# --- the orders and their cost
# -----------------------------------------------------------------------


def scan_chunk_size(method, chunk_size, allowed=SCAN_ORDERS):
    """The chunk size a scan of ``method`` uses: ``chunk_size``, or ``DEFAULT_CHUNK_SIZE`` for a
    chunked order given None; None for the unchunked orders. Refuses an unknown method, and a chunk
    size given to an order that does not chunk."""
    one_of("method", method, allowed)
    if chunk_size is not None:
        if method not in CHUNKED_ORDERS:
            raise ValueError(
                f"chunk_size applies to method in {CHUNKED_ORDERS} only, got"
                f" chunk_size={chunk_size!r} with method={method!r}"
            )
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


# --- the cost model: rounds and compositions
# --------------------------------------------------------


def scan_time(
    length: int,
    method: str,
    chunk_size: int | None,
    round_s: float,
    element_s: float,
    elements: int,
) -> float:
    """Predicted seconds of a scan (section 9.6): t = tau * rounds + gamma * compositions * E.

    ``round_s`` (tau) is the fixed cost of one dependent round (Python and kernel dispatch),
    ``element_s`` (gamma) the cost of one composition of one state element, ``elements`` (E) the
    state elements scanned (batch x channels x state size); rounds and compositions per element are
    ``scan_depth`` and ``scan_work``.
    """
    positive("round_s", round_s)
    positive("element_s", element_s)
    integer("elements", elements, 1)
    return (
        round_s * scan_depth(length, method, chunk_size)
        + element_s * scan_work(length, method, chunk_size) * elements
    )


def usable_fit(round_s: float, element_s: float) -> bool:
    """Whether a least-squares fit of ``scan_time`` to measured points told its two terms apart:
    both costs came out positive. A zero or negative one means the points could not separate
    them."""
    return real("round_s", round_s) > 0 and real("element_s", element_s) > 0


def fastest_order(
    length: int,
    round_s: float,
    element_s: float,
    elements: int,
    chunk_size: int | None = None,
    methods=METHODS,
) -> str:
    """The order of ``methods`` that ``scan_time`` predicts to be fastest at ``length`` tokens
    (``chunk_size`` applies to the chunked orders only)."""

    def predicted(method):
        c = chunk_size if method in CHUNKED_ORDERS else None
        return scan_time(length, method, c, round_s, element_s, elements)

    return min(methods, key=predicted)


def parallel_break_even(length: int) -> float:
    """The round cost, in units of one sequential round's elementwise work (tau / (gamma E)), above
    which ``scan_time`` predicts the parallel scan to beat the sequential one (section 9.6).

    Equal times, tau s + gamma E s = tau D + gamma E W, give tau / (gamma E) = (W - s) / (s - D),
    with the parallel scan's D = ceil(log2 s) rounds and W = ``scan_work`` compositions per element:
    about (s log2 s - s) / (s - log2 s), nearly log2 s - 1 for long prompts (0 for one token, where
    both orders do the same single step).
    """
    integer("length", length, 1)
    rounds = scan_depth(length, "parallel")  # ceil(log2 s) < s for every s >= 1
    return (scan_work(length, "parallel") - scan_work(length, "sequential")) / (length - rounds)


def attention_step_slope(kv_bytes_per_token: float, bandwidth: float, passes: int = 3) -> float:
    """Seconds an attention decode step grows per token of context: ``passes`` passes over each
    cached token's ``kv_bytes_per_token`` at ``bandwidth`` bytes/s (section 9.6). transformers'
    ``DynamicCache`` makes three: attention reads the history once, and ``torch.cat`` reads and
    writes it again to append a token. A fixed SSM state grows by nothing."""
    positive("kv_bytes_per_token", kv_bytes_per_token)
    positive("bandwidth", bandwidth)
    integer("passes", passes, 1)
    return passes * kv_bytes_per_token / bandwidth


def cache_step_slope(
    kv_bytes_per_token: float, read_bytes_per_s: float, copy_bytes_per_s: float
) -> float:
    """Seconds an attention decode step on transformers' ``DynamicCache`` grows per token of
    context, each pass at the ceiling of its traffic: attention reads each cached token's
    ``kv_bytes_per_token`` once at the read bandwidth, and ``torch.cat`` reads and writes it again
    at the copy rate (``copy_bytes_per_s`` counts bytes read plus written): k / R + 2k / C."""
    k = positive("kv_bytes_per_token", kv_bytes_per_token)
    return k / positive("read_bytes_per_s", read_bytes_per_s) + 2 * k / positive(
        "copy_bytes_per_s", copy_bytes_per_s
    )


# A measured slope within this factor of attention_step_slope's follows the three-pass model.
SLOPE_TOLERANCE = 2.0
# A fixed state's step counts as flat while its slope stays under this share of the attention slope
# that attention_step_slope predicts for the same context: the rest is a shared machine's noise.
FLAT_SHARE = 0.2


def is_flat(slope: float, attention_slope: float) -> bool:
    """Whether a step's measured ``slope`` (seconds per token of context) is flat next to an
    attention step's predicted ``attention_slope``: |slope| <= ``FLAT_SHARE`` * attention_slope."""
    real("slope", slope)
    positive("attention_slope", attention_slope)
    return abs(slope) <= FLAT_SHARE * attention_slope


# --- what a fixed state can recall
# -------------------------------------------------------------------

# A mean recall error this close to 1 - n/s is the bound (the state uses all n of its numbers); fp64
# rank decisions are far finer than this.
RANK_TOLERANCE = 1e-6
# An attention lookup whose error stays under this recovers every position, up to rounding: the
# hand- built head's softmax puts a weight of about (s - 1) e^-50 on the wrong positions.
LOOKUP_TOLERANCE = 1e-6


def recall_bound(state_size: int, context: int) -> float:
    """The least mean recall error a linear state of ``state_size`` numbers can have after
    ``context`` tokens of independent unit-variance inputs: max(0, 1 - n / s) (section 9.6)."""
    integer("state_size", state_size, 1)
    integer("context", context, 1)
    return max(0.0, 1 - state_size / context)


def at_recall_bound(mean_error: float, state_size: int, context: int) -> bool:
    """Whether ``mean_error`` (the exact mean over positions,
    ``kvlab.lab.recall.linear_recall_error``) equals ``recall_bound`` to within ``RANK_TOLERANCE``:
    the state's input map has full rank n."""
    return abs(real("mean_error", mean_error) - recall_bound(state_size, context)) <= RANK_TOLERANCE


def sampling_tolerance(samples: int, state_size: int) -> float:
    """How far a recall error estimated from ``samples`` random sequences may land from the exact
    one.

    Each position's error is a mean of ``samples`` squared residuals, whose relative standard error
    is sqrt(2 / samples) for Gaussian inputs; three of those, plus the state_size / samples by which
    a readout fitted on the same samples flatters itself, bound the gap.
    """
    integer("samples", samples, 1)
    integer("state_size", state_size, 1)
    return 3 * math.sqrt(2 / samples) + state_size / samples


def sampled_agrees(sampled: float, exact: float, samples: int, state_size: int) -> bool:
    """Whether a recall error fitted on ``samples`` sequences lands within ``sampling_tolerance`` of
    the exact one."""
    return abs(nonnegative("sampled", sampled) - nonnegative("exact", exact)) <= sampling_tolerance(
        samples, state_size
    )


def lookup_exact(max_error: float) -> bool:
    """Whether an attention lookup's largest recall error is rounding only
    (``LOOKUP_TOLERANCE``)."""
    return real("max_error", max_error) <= LOOKUP_TOLERANCE


# --- cache bytes: attention records against a fixed state
# -----------------------------------------------


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


def hybrid_cache_bytes(
    context: int,
    layers: int,
    attention_layers: int,
    kv_bytes_per_token: float,
    state_bytes: float,
    batch: int = 1,
) -> float:
    """Cache bytes of a hybrid with ``attention_layers`` attention layers out of ``layers`` (section
    9.6).

    ``kv_bytes_per_token`` and ``state_bytes`` are per layer and per sequence:
    batch * (k * context * kv_bytes_per_token + (L - k) * state_bytes). k = L is a transformer,
    k = 0 a pure SSM; at long context the hybrid costs about k / L of the transformer.
    """
    integer("context", context, 0)
    integer("layers", layers, 1)
    integer("attention_layers", attention_layers, 0)
    integer("batch", batch, 1)
    if attention_layers > layers:
        raise ValueError(
            f"attention_layers must be in [0, layers={layers}], got {attention_layers}"
        )
    positive("kv_bytes_per_token", kv_bytes_per_token)
    positive("state_bytes", state_bytes)
    return batch * (
        attention_layers * context * kv_bytes_per_token + (layers - attention_layers) * state_bytes
    )
