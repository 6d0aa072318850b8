"""Readings of notebook 12, "Decode across devices": the calibrated link, collectives against the
ring model, the split step against one process's, where each split pays, the KV handoff, the
recorded GPU runs, and the worked solutions of the page's exercises.

Each function takes the numbers the notebook computed or measured and returns Markdown; where the
sentence depends on the outcome, both outcomes are written.
"""

from __future__ import annotations

from kvlab._checks import flag, instance, real, unmeasured
from kvlab.show.format import si
from kvlab.show.readings import ratio_text
from kvlab.show.readings.exercises import solution
from kvlab.show.readings.verdicts import sweep_summary
from kvlab.theory.agreement import AGREES, CANNOT_TELL, DISAGREES, compare


def binary_bytes(n: int) -> str:
    """A message size as the powers of two it is chosen as: ``"4 KiB"``, ``"1 MiB"``, ``"512
    B"``."""
    n = real("n", n, 0)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _heads(n: int) -> str:
    return f"{n} KV head" + ("" if n == 1 else "s")


def tensor_parallel_reading(
    version: str,
    world_size: int,
    tokens: int,
    kv_heads_per_rank: int,
    kv_heads: int,
    cache_bytes_per_rank: int,
    vocab_sharded: bool,
) -> str:
    """What the tensor-parallel check showed, and what this transformers release's plan splits."""
    instance("version", version, str)
    flag("vocab_sharded", vocab_sharded)
    plan = (
        "its plan splits the embedding and the output head by vocabulary too (an all-reduce after"
        " the embedding and an all-gather of the logits each step)"
        if vocab_sharded
        else "its plan keeps the embedding and the output head whole on every rank"
    )
    return (
        f"With transformers {version}, the {world_size} ranks generated the same {tokens} tokens as"
        f" `generate` in one process. Each rank's cache held **{kv_heads_per_rank} of the"
        f" {kv_heads} KV heads**, {si(cache_bytes_per_rank, 'B')} per rank for this batch,"
        f" 1/{kv_heads // kv_heads_per_rank} of one device's cache; {plan}."
    )


def handoff_tables_reading(tokens: int, prefill_table: list, decode_table: list) -> str:
    """The two ranks' block tables for the handed-off sequence."""

    instance("prefill_table", prefill_table, (list, tuple), "a list")
    instance("decode_table", decode_table, (list, tuple), "a list")

    def shown(table):
        return str(table[:6])[:-1] + (", ...]" if len(table) > 6 else "]")

    head = (
        f"Rank 1 continued from the received blocks and generated the same {tokens} tokens as"
        f" `generate`. The sequence's block table on rank 0 was {shown(prefill_table)}"
        f" ({len(prefill_table)} blocks); on rank 1 it is {shown(decode_table)}"
        f" ({len(decode_table)} blocks). The ids name blocks of each rank's own pool, so they"
        " need not match; what crosses the link is the blocks' contents, in table order. "
    )
    grown = len(decode_table) - len(prefill_table)
    if grown > 0:
        return head + (
            f"Rank 1's table is {grown} block{'s' * (grown != 1)} longer: decoding crossed a block"
            " boundary."
        )
    return (
        head + "The tables are as long: the generated tokens still fit in the prompt's last block."
    )


def link_reading(
    backend: str, bytes_per_s: float, latency_s: float, sizes, nvlink_bytes_per_s: float
) -> str:
    """What the ping-pong calibration found, and how far it is from NVLink."""
    if missing := unmeasured(bytes_per_s=bytes_per_s, latency_s=latency_s):
        return missing
    return (
        f"Between two processes on this machine, {backend} moved a message one way at"
        f" **{si(bytes_per_s, 'B/s')}** after a latency of **{si(latency_s, 's')}** (the line $t ="
        f" \\alpha + n/\\beta$ fitted to one-way times of {len(sizes)} sizes from"
        f" {binary_bytes(min(sizes))} to {binary_bytes(max(sizes))}). NVLink 4 is specified at"
        f" {si(nvlink_bytes_per_s, 'B/s')} each way, {ratio_text(nvlink_bytes_per_s, bytes_per_s)}"
        " this rate, with latencies of a few microseconds. So what this page measures is the"
        " mechanism: which messages decode sends, how many and how large, and how their cost"
        " follows size and latency. It does not measure NVLink, and its absolute times say nothing"
        " about a GPU server's."
    )


def collective_reading(kind: str, sizes, measured, predicted, spreads) -> str:
    """How the measured collective compares with the ring model over the calibrated link, size by
    size (``kvlab.theory.agreement.compare`` with each size's ``spreads``), summarised over the
    sweep."""
    instance("kind", kind, str)
    name = kind.replace("_", "-")
    checks = [compare(m, p, s) for m, p, s in zip(measured, predicted, spreads)]
    labels = [binary_bytes(n) for n in sizes]
    head = (
        f"Each {name} took from {si(min(measured), 's')} to {si(max(measured), 's')} over messages"
        f" of {labels[0]} to {labels[-1]}, against the ring model with the calibrated link. "
        + sweep_summary(labels, checks, "the model")
        + " "
    )
    if all(c.outcome == AGREES for c in checks):
        return head + (
            "The latency term sets the small messages and the bytes term the large ones, as the"
            " model says."
        )
    if any(c.outcome == DISAGREES and c.side == "above" for c in checks):
        return head + (
            "Where it is slower, the term the model misses is the arithmetic of the collective on"
            " a shared machine: both processes share the cores that copy and add the bytes, so a"
            " ring's two directions do not each get the one-way rate a ping-pong measured, and"
            f" gloo may pick its own algorithm for the {name} rather than a plain ring."
        )
    if any(c.outcome == DISAGREES for c in checks):
        return head + (
            "Where it is faster, the model overstates a term: the ping-pong's latency, paid once"
            " per ring step in the model, is partly overlapped in a collective, or gloo's own"
            " algorithm takes fewer steps than a plain ring."
        )
    return head + (
        "Where the run cannot tell, the calls' own scatter is as wide as the gap: a shared"
        " machine's neighbours slow some calls and not others."
    )


def step_reading(
    one_process_s: float,
    split_s: float,
    predicted_s: float,
    world_size: int,
    calls: int,
    message_bytes: int,
    all_reduce_s: float,
    weight_bytes: float,
    spread: float,
) -> str:
    """The measured split step against one process's step and against the model's expectation,
    one process's step / p plus the all-reduces timed on the ranks right after the step,
    decided by ``kvlab.theory.agreement.compare`` with the rounds' ``spread``."""
    if missing := unmeasured(
        one_process_s=one_process_s, split_s=split_s, all_reduce_s=all_reduce_s
    ):
        return missing
    communication = predicted_s - one_process_s / world_size
    head = (
        f"One decode step took **{si(one_process_s, 's')}** in one process and"
        f" **{si(split_s, 's')}** split over {world_size} ranks, each of which reads"
        f" {si(weight_bytes / world_size, 'B')} of the {si(weight_bytes, 'B')} of weights and sends"
        f" {calls} all-reduces of {si(message_bytes, 'B')} (timed on the ranks right after the"
        f" step at {si(all_reduce_s, 's')} each). "
    )
    if split_s < one_process_s:
        head += f"The split paid: {ratio_text(one_process_s, split_s)} faster. "
    else:
        head += f"The split did not pay: {ratio_text(split_s, one_process_s)} the time. "
    c = compare(split_s, predicted_s, spread)
    head += (
        f"The model, one process's step / {world_size} plus those all-reduces"
        f" ({si(communication, 's')}), predicts {si(predicted_s, 's')}; the measurement is"
        f" {c.describe()} (spread {c.spread:.0%}). "
    )
    if c.outcome == AGREES:
        return head + "Halving the work and adding the talk is all the split step does here."
    work = split_s - communication  # what each rank spent outside the all-reduces
    missed = (
        f"Without its all-reduces the split step took {si(work, 's')}, against the"
        f" {si(one_process_s / world_size, 's')} the model gives each rank's half of the work: "
    )
    if c.side == "above":
        missed += (
            "the term it misses is the work that does not divide. The model's /"
            f" {world_size} assumes {world_size} devices, each with its own compute and memory"
            " bus; here the ranks are processes sharing this CPU's two cores and its memory bus,"
            " and every rank still runs each layer's Python, framework calls and norms in full."
        )
    else:
        missed += (
            "each rank's half ran faster than half of one process's step: a smaller share of the"
            " weights fits the CPU's caches better, which the model's / "
            f"{world_size} does not count."
        )
    if c.outcome == CANNOT_TELL:
        missed += " With this run's spread, the gap stays short of a clear miss."
    return head + missed


def _tp_sentence(link: str, crossing) -> str:
    if crossing.pays_at_low and crossing.at is None:
        return f"over {link}, tensor parallelism pays at every batch from 1 to {crossing.high}"
    if crossing.pays_at_low:
        return (
            f"over {link}, tensor parallelism pays at batch 1 but stops paying at batch"
            f" **{crossing.at}**, where each added sequence costs more all-reduce bytes than it"
            " saves in cache reads"
        )
    if crossing.at is None:
        return (
            f"over {link}, tensor parallelism never pays from batch 1 to {crossing.high}: the"
            " latencies of its calls exceed what the split saves"
        )
    return (
        f"over {link}, tensor parallelism does not pay at batch 1 (its calls' latencies exceed half"
        f" a small step) and starts paying at batch **{crossing.at}**"
    )


def _cp_sentence(link: str, crossing) -> str:
    if crossing.at is None:
        verdict = (
            "pays at every context"
            if crossing.pays_at_low
            else (
                f"never pays up to {crossing.high:,} tokens (the cache stops growing, or the"
                " gathers cost too much)"
            )
        )
        return f"over {link}, splitting the cache by position {verdict}"
    return (
        f"over {link}, splitting the cache by position pays from **{crossing.at:,} tokens** of"
        " context"
    )


def _fits(batch_one: int, batch_two: int, context: int, axis_max: int | None = None) -> str:
    drawn = [
        name
        for name, b in (("dotted", batch_one), ("dash-dotted", batch_two))
        if b and (axis_max is None or b <= axis_max)
    ]
    lines = f" (the {' and '.join(drawn)} line{'s' * (len(drawn) > 1)})" if drawn else ""
    if batch_one == 0:
        return (
            f"One H200 cannot hold this model beside any {context:,}-token sequence; two hold "
            f"{batch_two:,}{lines}, so here the split is needed before it is fast."
        )
    return (
        f"One H200 holds {batch_one:,} such sequences beside the weights and two hold"
        f" {batch_two:,}{lines}: past the first, one device is not an option at all."
    )


def crossing_reading(
    shape: str, context: int, latency_s: float, tp: dict, cp: dict, batch_one: int, batch_two: int
) -> str:
    """Where each split starts or stops paying, per link (``tp``/``cp``: link name -> Crossing), and
    how many sequences of ``context`` tokens one and two devices admit."""
    if missing := unmeasured(latency_s=latency_s):
        return missing
    tp_text = "; ".join(_tp_sentence(k, c) for k, c in tp.items())
    axis = max((c.high for c in tp.values()), default=None)  # the batch axis drawn
    cp_text = "; ".join(_cp_sentence(k, c) for k, c in cp.items())
    return (
        f"For {shape} at {context:,} tokens of context, with"
        f" {si(latency_s, 's') if latency_s else 'no'} latency per call: {tp_text}."
        f" {_fits(batch_one, batch_two, context, axis)} At batch 1: {cp_text}. Context parallelism"
        " reads every weight on every device, so it only pays where the cache reads dominate a"
        " step; its real use is capacity, a context whose cache no single device can hold."
    )


def handoff_reading(
    kv_bytes: int,
    formula_bytes: float,
    total_bytes: int,
    sends: list,
    predicted_s: float,
    tokens: int,
    block_size: int,
    nvlink_s: float,
    pcie_s: float,
) -> str:
    """The measured KV handoff against the KV size formula and the calibrated link; ``sends``: the
    send times of the same handoff repeated, the first first."""
    sends = instance("sends", sends, (list, tuple), "a list of send times")
    if missing := unmeasured(**{f"sends[{i}]": t for i, t in enumerate(sends)} or {"sends": sends}):
        return missing
    fastest, median = min(sends), sorted(sends)[len(sends) // 2]
    c = compare(fastest, predicted_s, median / fastest - 1)
    same = kv_bytes == formula_bytes
    sizes = (
        f"The prefill rank sent **{kv_bytes:,} bytes** of KV blocks for a {tokens}-token prompt in "
        f"{block_size}-token blocks, "
        + (
            "exactly $\\lceil s/B \\rceil B K$, the formula's whole blocks"
            if same
            else (
                f"where the formula $\\lceil s/B \\rceil B K$ gives {formula_bytes:,.0f}: the"
                " blocks sent are not the sequence's blocks"
            )
        )
        + f", plus {total_bytes - kv_bytes} bytes of header and block table. "
    )
    timing = (
        f"Over {len(sends)} handoffs the fastest send took {si(fastest, 's')} (the first"
        f" {si(sends[0], 's')}); the calibrated link predicts {si(predicted_s, 's')} for three"
        f" messages, and the fastest send is {c.describe()} (spread {c.spread:.0%}). "
    )
    return (
        sizes
        + timing
        + f"The same bytes would take {si(nvlink_s, 's')} over NVLink 4 and {si(pcie_s, 's')} "
        "over PCIe Gen5 x16 at their one-way rates."
    )


def recorded_reading(rows_by_device: dict) -> str:
    """The recorded GPU runs of this page's benchmark rows (``device -> [(name, value, unit)]``)."""
    instance("rows_by_device", rows_by_device, dict)
    if not rows_by_device:
        return (
            "No GPU run of this page has been recorded yet: `book/data/measurements/` holds no"
            " record with a GPU stamp and rows for it. `python -m kvlab record` on a machine with"
            " two or more GPUs adds one (NCCL over NVLink or PCIe), and this paragraph becomes its"
            " table."
        )
    lines = []
    for device, rows in rows_by_device.items():
        lines += [f"Recorded on **{device}**:", "", "| measurement | value |", "|---|---:|"]
        lines += [f"| {name} | {value:.4g} {unit} |" for name, value, unit in rows] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- exercises


def exercise_heads(
    shape: str, world: int, q_heads: int, kv_heads: int, per_rank: tuple, kv_per_token: float
) -> str:
    """Exercise 1: heads and cache per device at a larger world size."""
    kv_per_token = real("kv_per_token", kv_per_token)
    return solution(
        1,
        f"{shape} has {q_heads} query and {kv_heads} KV heads. Over {world} devices each holds"
        f" **{per_rank[0]} query heads and {_heads(per_rank[1])}**"
        " (`kvlab.theory.parallel.tensor_parallel_heads`), so each caches"
        f" {si(kv_per_token / world, 'B')} per token instead of {si(kv_per_token, 'B')}: 1/{world}"
        f" of the cache, and 1/{world} of the cache reads of a step. Beyond {kv_heads} devices"
        " there is no KV head left to give each device: kvlab refuses such a world size, and"
        " engines that allow it copy KV heads, so the cache per device stops shrinking.",
    )


def exercise_latency(
    shape: str, context: int, saved_s: float, bytes_s: float, calls: int, latency_s: float
) -> str:
    """Exercise 2: the latency per call at which tensor parallelism stops paying at batch 1."""
    saved_s = real("saved_s", saved_s)
    bytes_s = real("bytes_s", bytes_s)
    latency_s = real("latency_s", latency_s)
    return solution(
        2,
        f"At batch 1 and {context:,} tokens, splitting {shape} over 2 devices takes"
        f" {si(saved_s, 's')} off a step's reads, and its {calls} all-reduces move their bytes over"
        f" NVLink in {si(bytes_s, 's')} in all. The split stops paying once the latencies make up"
        f" the rest: $\\alpha^* = ({si(saved_s, 's')} - {si(bytes_s, 's')}) / {calls}$ ="
        f" **{si(latency_s, 's')}** per call. Small models hit it first: their step is short, but"
        " they still have two calls per layer.",
    )


def exercise_handoff(shape: str, tokens: int, nbytes: float, links: dict, prefill_s: float) -> str:
    """Exercise 3: the handoff of one long prompt over several links, against recomputing it."""
    nbytes = real("nbytes", nbytes)
    prefill_s = real("prefill_s", prefill_s)
    rows = "\n".join(
        f"| {name} | {si(t, 's')} | {prefill_s / t:,.0f} |" for name, t in links.items()
    )
    return solution(
        3,
        f"A {tokens:,}-token prompt of {shape} has a cache of {si(nbytes, 'B')}"
        " (`kvlab.theory.parallel.kv_transfer_bytes`). Recomputing it (`roofline.prefill_time`,"
        f" MFU 0.7) takes {si(prefill_s, 's')}. Moving it:\n\n| link | transfer | times faster than"
        f" recompute |\n|---|---:|---:|\n{rows}\n\nEvery link beats recomputing by a wide margin,"
        " which is why disaggregation pays; what it costs is time to first token, by the transfer,"
        " unless the transfer is pipelined layer by layer with the prefill.",
    )
