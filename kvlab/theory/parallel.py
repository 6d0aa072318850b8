"""Notebook 12, decode across devices: the communication each way of splitting decode adds to a
step, beside the single-device step floor of ``kvlab.theory.roofline``.

Pure Python: importable without torch.

Three ways to put p devices to work on decode, and what each sends per step:

- **Tensor parallelism** (Shoeybi et al. 2019). Every layer's attention heads, and with them its
  KV heads, are split across the devices, so each keeps n_kv / p heads of the cache; the MLP is
  split by columns (gate and up projections) and then by rows (down projection). The output
  projection and the down projection each leave a partial sum on every device, added by one
  all-reduce of the activations, b h w_a bytes: two calls per layer, 2L per step. Each device
  reads 1/p of the layer weights and of the cache.
- **Context parallelism for decode.** One sequence's cached tokens are split by position. Each
  device attends the new query over its share and returns, per query head, a partial output and
  its log-sum-exp; gathering them (one all-gather of b n_q (d_h + 1) numbers per device per layer)
  and merging them as the split-K kernel does gives exact attention. Every device still reads every
  weight, so only the cache reads shrink.
- **Disaggregated prefill and decode** (Zhong et al. 2024). One worker prefills, another decodes;
  the prompt's cache, s K bytes, crosses the link once per request (the KV Cache Memory Wall,
  2026, section 5.3).

Collectives are costed as rings (Patarasuk and Yuan 2009): an all-reduce of an n-byte message sends
(and receives) 2 (p - 1) / p n bytes per device, an all-gather of m-byte parts (p - 1) m. In a ring
each device sends to one neighbour while it receives from the other, so those bytes move at a
link's one-way rate (``kvlab.theory.specs.LINKS``). Each call also pays a fixed latency alpha,
which no datasheet gives: it is an argument here, and ``kvlab.lab.parallel`` measures it.

Units are SI, as in ``kvlab.theory.roofline``; w_a is the bytes of one activation element.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import flag, integer, one_of, positive, real
from kvlab.theory import roofline
from kvlab.theory.shapes import ModelShape
from kvlab.theory.specs import LINKS, Link, accelerator
from kvlab.theory.specs import link as link_by_key

COLLECTIVES = ("all_reduce", "all_gather")


# --------------------------------------------------------------------------- arguments


def _shape(shape) -> ModelShape:
    if not isinstance(shape, ModelShape):
        raise TypeError(
            "shape must be a ModelShape (see kvlab.theory.shapes.SHAPES), got"
            f" {type(shape).__name__}"
        )
    return shape


def _link(value) -> Link:
    if isinstance(value, Link):
        return value
    if isinstance(value, str):
        return link_by_key(value)
    raise TypeError(f"link must be a Link or one of {', '.join(LINKS)}, got {type(value).__name__}")


def tensor_parallel_heads(
    shape: ModelShape, world: int, argument: str = "world"
) -> tuple[int, int]:
    """(query heads, KV heads) each of ``world`` devices holds under tensor parallelism.

    Refuses a world size that does not divide the KV heads (and so the query heads, a multiple of
    them) or the MLP width, where the shape has one: a device cannot hold a fraction of a head.
    (Engines that run more devices than KV heads copy KV heads instead; kvlab does not.)
    ``argument`` is the caller's name for the world size, used in the error.
    """
    shape, world = _shape(shape), integer(argument, world)
    for what, count in (("KV heads", shape.kv_heads), ("MLP width", shape.intermediate)):
        if count is not None and count % world:
            raise ValueError(
                f"{argument}={world} must divide the {what} of {shape.name} ({count}); "
                f"allowed world sizes: {_divisors(shape)}"
            )
    return shape.q_heads // world, shape.kv_heads // world


def _divisors(shape: ModelShape) -> list[int]:
    counts = [c for c in (shape.kv_heads, shape.intermediate) if c is not None]
    return [p for p in range(1, shape.kv_heads + 1) if all(c % p == 0 for c in counts)]


# --------------------------------------------------------------------------- collectives


def collective_bytes(kind: str, nbytes: float, world: int) -> float:
    """Bytes each device sends (and receives) in one ring collective over ``world`` devices.

    ``"all_reduce"``: ``nbytes`` is the message every device holds; 2 (p - 1) / p of it.
    ``"all_gather"``: ``nbytes`` is each device's part; (p - 1) parts.
    """
    one_of("kind", kind, COLLECTIVES)
    nbytes, world = positive("nbytes", nbytes), integer("world", world)
    if kind == "all_reduce":
        return 2 * (world - 1) / world * nbytes
    return (world - 1) * nbytes


def ring_steps(kind: str, world: int) -> int:
    """Messages each device sends one after another in a ring collective: 2 (p - 1) for an
    all-reduce (a reduce-scatter, then an all-gather), p - 1 for an all-gather. A point-to-point
    latency alpha therefore costs a call about ``ring_steps * alpha``."""
    one_of("kind", kind, COLLECTIVES)
    world = integer("world", world)
    return (2 if kind == "all_reduce" else 1) * (world - 1)


def collective_time(kind: str, nbytes: float, world: int, link, latency: float = 0.0) -> float:
    """Seconds of one ring collective: alpha + bytes per device / one-way link rate (0 on one
    device)."""
    sent = collective_bytes(kind, nbytes, world)
    if world == 1:
        return 0.0
    return real("latency", latency, 0) + sent / _link(link).bytes_per_s_each_way


# --------------------------------------------------------------------------- one split step


@dataclass(frozen=True)
class SplitStep:
    """One decode step on ``world`` devices against the same step on one.

    ``one_device`` is the roofline floor on one device; ``compute`` the floor of one device's share
    of the split step; ``communication`` the time of its ``calls`` collectives, which move
    ``bytes_per_device`` in all. The split pays when ``total`` < ``one_device``.
    """

    mechanism: str
    world: int
    batch: int
    context: int
    one_device: float
    compute: float
    calls: int
    bytes_per_device: float
    communication: float

    @property
    def total(self) -> float:
        return self.compute + self.communication

    @property
    def saved(self) -> float:
        """What the split takes off one device's step before communication."""
        return self.one_device - self.compute

    @property
    def speedup(self) -> float:
        return self.one_device / self.total

    @property
    def pays(self) -> bool:
        return self.total < self.one_device


def _floor(hw, nbytes: float, flops: float, placement: str) -> float:
    """max(bytes / beta_eff, FLOPs / peak): the roofline floor of given work (KV Cache Memory Wall,
    2026, appendix C.4)."""
    peak = accelerator(hw).bf16_flops
    return max(nbytes / roofline.effective_bandwidth(hw, placement), flops / peak)


def tied_embeddings(shape: ModelShape) -> bool:
    """Whether the shape's embedding and output head are one table: its parameter count is within a
    quarter of a table of the count of its matrices with one vocabulary table (Llama-3.2-1B,
    Qwen2.5-0.5B, SmolLM2: tied; Llama-3-8B and -70B, whose seeds' counts are rounded: not). False
    for shapes ``counted_params`` cannot count."""
    shape = _shape(shape)
    try:
        untied = shape.counted_params()
    except ValueError:
        return False
    table = shape.vocab * shape.hidden
    return abs(shape.params - (untied - table)) < table / 4


def embedding_saving(shape: ModelShape, batch: int, w_p: float = 2) -> float:
    """Bytes the roofline's P w counts that a decode step does not read: an untied embedding table
    is looked up, ``batch`` rows of it, not read whole, so V h w_p - b h w_p; a tied one is the
    output head, read whole for the logits: 0."""
    shape, batch = _shape(shape), integer("batch", batch)
    if tied_embeddings(shape):
        return 0.0
    return (shape.vocab - batch) * shape.hidden * positive("w_p", w_p)


def vocabulary_bytes(shape: ModelShape, batch: int, w_p: float = 2) -> float:
    """Bytes of the vocabulary tables every device of an unsharded split reads whole in a step:
    the output head, V h w_p, and, for an untied embedding, the ``batch`` rows it looks up."""
    shape, batch = _shape(shape), integer("batch", batch)
    rows = 0 if tied_embeddings(shape) else batch
    return (shape.vocab + rows) * shape.hidden * positive("w_p", w_p)


def tensor_parallel_step(
    shape: ModelShape,
    hw,
    batch: int,
    context: int,
    world: int,
    link,
    latency: float = 0.0,
    w_p: float = 2,
    w_kv: float = 2,
    w_a: float = 2,
    vocab_sharded: bool = False,
    placement: str = "striped",
) -> SplitStep:
    """A decode step under tensor parallelism on ``world`` devices joined by ``link``.

    Each device reads 1/p of the layer weights and of every sequence's cache and does 1/p of their
    FLOPs. An untied embedding is looked up (b rows), not read whole (``embedding_saving``, on one
    device too); the output head is read whole by every device unless ``vocab_sharded``
    (transformers 5.24's plan splits them by vocabulary: one more all-reduce after the embedding
    and an all-gather of the logits, b V / p w_a bytes per device). Communication: 2L all-reduces
    of b h w_a bytes, each with ``latency``.
    """
    shape, vocab_sharded = _shape(shape), flag("vocab_sharded", vocab_sharded)
    tensor_parallel_heads(shape, world)
    batch = integer("batch", batch)
    work = roofline.step_bytes(shape, batch, context, w_p, w_kv)
    flops = roofline.step_flops(shape, batch, context)
    moved = work.total - embedding_saving(shape, batch, w_p)  # the embedding is looked up
    one = _floor(hw, moved, flops.total, placement)
    whole = 0.0 if vocab_sharded else vocabulary_bytes(shape, batch, w_p)
    head_flops = 0.0 if vocab_sharded else 2 * batch * shape.vocab * shape.hidden
    share = _floor(
        hw,
        (moved - whole) / world + whole,
        (flops.total - head_flops) / world + head_flops,
        placement,
    )
    message = batch * shape.hidden * positive("w_a", w_a)
    calls = 2 * shape.layers
    sent = calls * collective_bytes("all_reduce", message, world)
    comm = calls * collective_time("all_reduce", message, world, link, latency)
    if vocab_sharded:
        logits = batch * shape.vocab / world * w_a
        calls += 2
        sent += collective_bytes("all_reduce", message, world) + collective_bytes(
            "all_gather", logits, world
        )
        comm += collective_time("all_reduce", message, world, link, latency) + collective_time(
            "all_gather", logits, world, link, latency
        )
    return SplitStep("tensor parallel", world, batch, context, one, share, calls, sent, comm)


def context_parallel_step(
    shape: ModelShape,
    hw,
    batch: int,
    context: int,
    world: int,
    link,
    latency: float = 0.0,
    w_p: float = 2,
    w_kv: float = 2,
    w_a: float = 4,
    placement: str = "striped",
) -> SplitStep:
    """A decode step with each sequence's cache split by position over ``world`` devices.

    Each device reads every weight and 1/p of the cache (an uneven split is paced by the largest
    share, not modelled here). Per layer one all-gather of each device's partial output and
    log-sum-exp, b n_q (d_h + 1) numbers of ``w_a`` bytes (fp32 by default: the merge is done in
    fp32 so that the split is exact to rounding).
    """
    shape, world = _shape(shape), integer("world", world)
    batch = integer("batch", batch)
    one = roofline.step_time_floor(shape, hw, batch, context, w_p, w_kv, placement)
    work = roofline.step_bytes(shape, batch, context, w_p, w_kv)
    flops = roofline.step_flops(shape, batch, context)
    share = _floor(
        hw, work.weights + work.kv / world, flops.weights + flops.attention / world, placement
    )
    part = batch * shape.q_heads * (shape.head_dim + 1) * positive("w_a", w_a)
    calls = shape.layers
    sent = calls * collective_bytes("all_gather", part, world)
    comm = calls * collective_time("all_gather", part, world, link, latency)
    return SplitStep("context parallel", world, batch, context, one, share, calls, sent, comm)


# --------------------------------------------------------------------------- where a split stops
# paying


@dataclass(frozen=True)
class Crossing:
    """Where a split starts or stops paying along one axis (batch or context).

    ``at`` is the first value at which ``pays`` differs from its value at ``low``, or None when
    it never does up to ``high``; ``pays_at_low`` says which way it goes.
    """

    axis: str
    at: int | None
    pays_at_low: bool
    low: int
    high: int


def tensor_parallel_crossing(
    shape: ModelShape,
    hw,
    context: int,
    world: int,
    link,
    latency: float = 0.0,
    max_batch: int = 1024,
    **options,
) -> Crossing:
    """The batch at which tensor parallelism's communication overtakes what the split saves (or
    falls below it), scanning batches 1 to ``max_batch`` at one ``context``. ``options`` as
    :func:`tensor_parallel_step`.
    """
    max_batch = integer("max_batch", max_batch)
    at_one = tensor_parallel_step(shape, hw, 1, context, world, link, latency, **options).pays
    for batch in range(2, max_batch + 1):
        if (
            tensor_parallel_step(shape, hw, batch, context, world, link, latency, **options).pays
            != at_one
        ):
            return Crossing("batch", batch, at_one, 1, max_batch)
    return Crossing("batch", None, at_one, 1, max_batch)


def context_parallel_crossing(
    shape: ModelShape,
    hw,
    batch: int,
    world: int,
    link,
    latency: float = 0.0,
    max_context: int = 10**8,
    **options,
) -> Crossing:
    """The shortest context at which splitting the cache by position pays, at one ``batch``.

    What the split saves grows with the context and its communication does not, so there is at
    most one crossing; it is found by bisection over 1 to ``max_context`` tokens. A sliding window
    can stop the saving from ever reaching the communication (``at`` is then None).
    """
    max_context = integer("max_context", max_context, 2)

    def pays(s):
        return context_parallel_step(shape, hw, batch, s, world, link, latency, **options).pays

    if pays(1) or not pays(max_context):
        return Crossing("context", None, pays(1), 1, max_context)
    low, high = 1, max_context  # pays(low) is False, pays(high) True
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if pays(mid) else (mid, high)
    return Crossing("context", high, False, 1, max_context)


# --------------------------------------------------------------------------- prefill on one worker,
# decode on another


def kv_transfer_bytes(
    shape: ModelShape, tokens: int, w_kv: float = 2, block_size: int | None = None
) -> float:
    """Bytes of one prompt's cache sent from a prefill worker to a decode worker: s K, or, sent as
    whole paged blocks of ``block_size`` tokens, ceil(s / B) B K (the last block's empty slots
    travel too). A sliding-window shape sends only the window it retains.
    """
    kept = roofline.retained_tokens(_shape(shape), integer("tokens", tokens))
    if block_size is not None:
        block_size = integer("block_size", block_size)
        kept = -(-kept // block_size) * block_size
    return kept * roofline.kv_bytes_per_token(shape, w_kv)


@dataclass(frozen=True)
class Handoff:
    """A prompt's cache moved from the prefill worker to the decode worker, against recomputing it.

    ``prefill`` is the time to compute the cache (``roofline.prefill_time``); the move pays while
    ``transfer`` is shorter, i.e. while the link is faster than ``break_even_bytes_per_s``.
    """

    tokens: int
    nbytes: float
    link: str
    transfer: float
    prefill: float

    @property
    def break_even_bytes_per_s(self) -> float:
        return self.nbytes / self.prefill

    @property
    def pays(self) -> bool:
        return self.transfer < self.prefill


def handoff(
    shape: ModelShape,
    hw,
    tokens: int,
    link,
    latency: float = 0.0,
    w_kv: float = 2,
    block_size: int | None = None,
    codec: float = 1.0,
    mfu: float = 0.7,
) -> Handoff:
    """Disaggregated prefill: the transfer of ``tokens`` tokens of cache over ``link`` (one call
    with ``latency``, bytes divided by a transport ``codec``) beside recomputing them on ``hw``
    at model FLOP utilization ``mfu`` (KV Cache Memory Wall, 2026, section 5.3 and appendix B.5)."""
    chosen = _link(link)
    nbytes = kv_transfer_bytes(shape, tokens, w_kv, block_size)
    transfer = real("latency", latency, 0) + roofline.transfer_time(
        nbytes, chosen.bytes_per_s_each_way, codec
    )
    prefill = roofline.prefill_time(shape, hw, tokens, mfu)
    return Handoff(tokens, nbytes, chosen.name, transfer, prefill)


# --------------------------------------------------------------------------- the published shapes
# on two links


@dataclass(frozen=True)
class LinkRow:
    """One shape on one link: the single-device floor, the two splits and the handoff."""

    shape: str
    link: str
    tensor: SplitStep
    context: SplitStep
    handoff: Handoff


def link_table(
    shapes,
    hw,
    batch: int,
    context: int,
    world: int,
    links=("nvlink4", "pcie5-x16"),
    latency: float = 0.0,
) -> list[LinkRow]:
    """For each shape (``ModelShape``s) and each link: tensor- and context-parallel steps at
    (``batch``, ``context``) on ``world`` devices, and the handoff of one ``context``-token prompt.
    Shapes that tensor parallelism cannot split over ``world`` devices are skipped; a ``world``
    that splits none of them is refused."""
    world, rows = integer("world", world), []
    for shape in shapes:
        try:
            tensor_parallel_heads(shape, world)
        except ValueError:
            continue
        for key in links:
            rows.append(
                LinkRow(
                    shape.name,
                    _link(key).name,
                    tensor_parallel_step(shape, hw, batch, context, world, key, latency),
                    context_parallel_step(shape, hw, batch, context, world, key, latency),
                    handoff(shape, hw, context, key, latency),
                )
            )
    if not rows:
        raise ValueError(f"world must split the heads of at least one of the shapes, got {world}")
    return rows
