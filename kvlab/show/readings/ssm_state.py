"""Notebook 07, hybrid attention and SSM state (section 9.6): its readings.

Each decision calls the model in ``kvlab.theory.ssm``: the scan cost model (``scan_time``,
``fastest_order``, ``parallel_break_even``), the decode-step slope (``attention_step_slope``,
``is_flat``) and the recall bound (``recall_bound``, ``at_recall_bound``, ``sampled_agrees``,
``lookup_exact``).
"""

from __future__ import annotations

from kvlab._checks import instance, unmeasured
from kvlab.show.format import si
from kvlab.theory import ssm
from kvlab.theory.agreement import ABOVE, AGREES, CANNOT_TELL, DISAGREES, compare

COST_MODEL = (
    r"$t = \tau\cdot\text{rounds} + \gamma\cdot\text{compositions}\cdot E$ "
    "(`kvlab.theory.ssm.scan_time`)"
)


def _faster(ratio: float) -> str:
    return f"{ratio:.2f} times faster" if ratio >= 1 else f"{1 / ratio:.2f} times slower"


def scan_reading(
    length: int,
    dim: int,
    state_size: int,
    chunk_size: int,
    times: dict,
    tau: float,
    gamma: float,
    spread: float = 0.0,
) -> str:
    """Under the scan explorer: the three orders at the longest prompt against the fitted cost
    model.

    ``times`` maps each of ``ssm.METHODS`` to its measured seconds at ``length`` tokens; ``tau`` is
    the fitted cost of one round, ``gamma`` of one composition of one state element; a round
    composes E = ``dim * state_size`` elements (batch 1). ``spread`` is the relative scatter of
    the measured ratio (the two orders' spreads added); the ratio is judged by
    ``kvlab.theory.agreement.compare``.
    """
    if missing := unmeasured(tau=tau, gamma=gamma):
        return missing
    t_seq, t_par, t_chunk = (times[m] for m in ssm.METHODS)
    text = [
        f"At {length:,} tokens ($d = {dim}$, $n = {state_size}$, $c = {chunk_size}$) the sequential"
        f" scan took **{si(t_seq, 's')}**, the parallel scan **{si(t_par, 's')}** and the chunked"
        f" scan **{si(t_chunk, 's')}**: the parallel scan was {_faster(t_seq / t_par)} and the"
        f" chunked scan {_faster(t_seq / t_chunk)} than the sequential one."
    ]
    if not ssm.usable_fit(tau, gamma):
        text.append(
            f"Fitting the cost model {COST_MODEL} gave a round cost of {si(tau, 's')} and"
            f" {si(gamma, 's')} per composition; a value at or below zero means the two terms could"
            " not be told apart at these sizes, so read the measured points, not the curves."
        )
        return " ".join(text)
    elements = dim * state_size
    rounds, work = ssm.scan_depth(length, "parallel"), ssm.scan_work(length, "parallel")
    break_even = ssm.parallel_break_even(length)
    text.append(
        f"The cost model {COST_MODEL}, fitted to every point of the figure, gives a round cost"
        f" $\\tau$ = {si(tau, 's')} and $\\gamma$ = {si(gamma, 's')} per composition of one state"
        " element, so a sequential round's elementwise work is $\\gamma E$ ="
        f" {si(gamma * elements, 's')} ($E = {elements:,}$) and a round costs $\\tau / \\gamma E$ ="
        f" {tau / (gamma * elements):.3g} times that. The parallel scan takes {rounds} rounds"
        f" instead of {length:,}, but does {work:,} compositions per element instead of {length:,},"
        f" so it wins only when $\\tau / \\gamma E > (W - s)/(s - D)$ = {break_even:.3g}"
        " (`ssm.parallel_break_even`)."
    )
    predicted = {
        m: ssm.scan_time(length, m, chunk_size if m == "chunked" else None, tau, gamma, elements)
        for m in ("sequential", "parallel")
    }
    expected = ssm.fastest_order(length, tau, gamma, elements, methods=("sequential", "parallel"))
    won = min(("sequential", "parallel"), key=lambda m: times[m])
    c = compare(t_seq / t_par, predicted["sequential"] / predicted["parallel"], spread)
    text.append(
        f"With the fit's own values the model predicts {si(predicted['sequential'], 's')}"
        f" sequential and {si(predicted['parallel'], 's')} parallel, a ratio (sequential over"
        f" parallel) of {c.predicted:.2f} for a measured {c.measured:.2f} (spread {spread:.0%})."
    )
    if won == expected and c.outcome == CANNOT_TELL:
        text.append(
            f"It predicts the winner, the {expected} scan; whether it predicts the margin this run"
            f" cannot tell ({c.describe()})."
        )
    elif won == expected and c.agrees:
        text.append(
            f"The model explains the points: it predicts the {expected} scan to win, and by about"
            f" the margin measured ({c.describe()})."
        )
    elif won == expected:
        text.append(
            f"The model predicts the winner, the {expected} scan, but not the margin: the measured"
            f" ratio is {c.describe()}. One $\\tau$ and one $\\gamma$ for all three orders average"
            " over rounds that touch tensors of very different sizes."
        )
    else:
        text.append(
            f"The model predicted the {expected} scan to win and the {won} scan won, so the fit"
            " does not explain the points at this setting. Expected: the order with the smaller"
            f" {COST_MODEL}. The likely reason on this machine: a round's cost is not one constant,"
            " since the parallel scan's rounds each touch the whole sequence and the sequential"
            " scan's one token, so a single fitted $\\tau$ misprices one of them. Compare the"
            " curves with the markers."
        )
    return " ".join(text)


def step_reading(
    llama: str,
    mamba: str,
    s0: int,
    s1: int,
    llama_t: tuple,
    mamba_t: tuple,
    slope_llama: float,
    slope_mamba: float,
    kv_bytes_per_token: float,
    read_bytes_per_s: float,
    copy_bytes_per_s: float,
    slope_spread: float,
) -> str:
    """Decode step time against context: the attention slope, fitted over contexts ``s0`` to ``s1``,
    against ``ssm.cache_step_slope`` (one read pass at ``read_bytes_per_s``, the append's copy at
    ``copy_bytes_per_s``, both timed among the steps), decided by
    ``kvlab.theory.agreement.compare`` with ``slope_spread``; and Mamba's slope against flat."""
    if missing := unmeasured(
        slope_llama=slope_llama,
        slope_mamba=slope_mamba,
        read_bytes_per_s=read_bytes_per_s,
        copy_bytes_per_s=copy_bytes_per_s,
        slope_spread=slope_spread,
    ):
        return missing
    predicted = ssm.cache_step_slope(kv_bytes_per_token, read_bytes_per_s, copy_bytes_per_s)
    c = compare(slope_llama, predicted, slope_spread)
    text = [
        f"From {s0:,} to {s1:,} tokens of context, the {llama} step went from {si(llama_t[0], 's')}"
        f" to **{si(llama_t[1], 's')}**, a fitted slope of {si(slope_llama, 's')} per token of"
        " context. The model (`kvlab.theory.ssm.cache_step_slope`: $k/R + 2k/C$, one read of the"
        f" cache and the append's copy, with $k$ = {si(kv_bytes_per_token, 'B')} per token, the"
        f" read bandwidth $R$ = {si(read_bytes_per_s, 'B/s')} and the copy rate $C$ ="
        f" {si(copy_bytes_per_s, 'B/s')} of bytes read plus written, timed among the steps)"
        " predicts"
        f" {si(predicted, 's')}: the slope is {c.describe()} (its spread {slope_spread:.0%}). The"
        f" {mamba} step went from {si(mamba_t[0], 's')} to **{si(mamba_t[1], 's')}**, a slope of"
        f" {si(slope_mamba, 's')} per token."
    ]
    if ssm.is_flat(slope_mamba, predicted):
        text.append(
            "Its state has the same size at every context, so the model predicts no slope; what"
            f" remains is under {ssm.FLAT_SHARE:.0%} of the attention slope predicted"
            " (`ssm.is_flat`), the noise of a shared machine."
        )
    else:
        text.append(
            "Its state has the same size at every context, so the model predicts no slope; here it"
            f" is more than {ssm.FLAT_SHARE:.0%} of the attention slope predicted (`ssm.is_flat`):"
            " the noise of a shared machine was as large as the attention growth in this run."
        )
    if c.outcome == AGREES:
        text.append(
            "The attention slope is one read and one copy of the cache per step, at this machine's"
            " ceilings."
        )
    elif c.outcome == DISAGREES and c.side == ABOVE:
        text.append(
            "The attention slope exceeds the two passes: the step costs more per cached byte than"
            " reading the cache and copying it once. A likely cause on a CPU, not verified here:"
            " each `torch.cat` allocates a fresh buffer for the whole cache, and the operating"
            " system zeroes freshly mapped pages on first touch, a write pass the model does not"
            " count. A cache preallocated once ([Recompute, cache reuse, optimized"
            " decode](02_cache_reuse.ipynb)) avoids both the copy and the allocation."
        )
    elif c.outcome == DISAGREES:
        text.append(
            "The attention slope is below the two passes: part of the cache stayed in the CPU's "
            "caches between steps, which read faster than the streaming ceilings."
        )
    else:
        text.append(
            f"This run cannot tell: the slope sits {c.side} the two passes by more than its spread,"
            " not by enough to call the model wrong."
        )
    return " ".join(text)


def recall_reading(
    state_size: int,
    context: int,
    mean_exact: float,
    mean_sampled: float,
    samples: int,
    first: float,
    last: float,
    attention_max: float,
) -> str:
    """Under the recall explorer: the fixed state's loss against ``ssm.recall_bound``, and
    attention's."""
    if missing := unmeasured(
        mean_exact=mean_exact,
        mean_sampled=mean_sampled,
        first=first,
        last=last,
        attention_max=attention_max,
    ):
        return missing
    bound = ssm.recall_bound(state_size, context)
    text = [
        f"With a state of {state_size} numbers and {context} tokens, the best linear readout loses"
        f" a fraction **{mean_exact:.3f}** of a token's value on average"
    ]
    if ssm.at_recall_bound(mean_exact, state_size, context):
        text[0] += r", exactly the bound $1 - n/s$ (`kvlab.theory.ssm.recall_bound`)"
    else:
        text[0] += (
            f", more than the bound $1 - n/s = {bound:.3f}$ (`kvlab.theory.ssm.recall_bound`): the"
            " decays make $M$ numerically rank-deficient, so the state holds fewer independent"
            " numbers than its size"
        )
    tolerance = ssm.sampling_tolerance(samples, state_size)
    text[0] += f"; fitted on {samples:,} random sequences it loses {mean_sampled:.3f}."
    if ssm.sampled_agrees(mean_sampled, mean_exact, samples, state_size):
        text.append(
            f"The fit on samples lands on the exact value, within the {tolerance:.3f} that sampling"
            " allows (`ssm.sampling_tolerance`)."
        )
    else:
        text.append(
            f"The fit on samples is off the exact value by more than the {tolerance:.3f} that"
            " sampling should allow (`ssm.sampling_tolerance`); more samples bring it closer."
        )
    text.append(f"The newest token is lost only up to {last:.3f}, the oldest up to {first:.3f}.")
    if ssm.lookup_exact(attention_max):
        text.append(
            "The attention lookup recovers every position, with an error of at most "
            f"{attention_max:.1e}, because it keeps all of them."
        )
    else:
        text.append(
            f"The attention lookup lost up to {attention_max:.1e} of a position, more than rounding"
            f" ({ssm.LOOKUP_TOLERANCE:.0e}): its query is not sharp enough for this many positions."
        )
    return " ".join(text)


def memory_reading(measured: dict, predicted: dict, attention_layers: int, layers: int) -> str:
    """Under the cache-bytes explorer: the hybrid's measured cache against ``M(s)``
    (``ssm.hybrid_cache_bytes``) at each context; both dicts map context to bytes. Bytes are
    counted, not timed, so the verdict is exact: equal or not."""
    instance("measured", measured, dict)
    instance("predicted", predicted, dict)
    contexts = sorted(measured)
    short, long = contexts[0], contexts[-1]
    exact = all(measured[s] == predicted[s] for s in contexts)
    growth = (measured[long] - measured[short]) / (long - short)
    text = (
        f"With {attention_layers} attention layer{'s' if attention_layers > 1 else ''} of"
        f" {layers}, the hybrid's cache held {si(measured[short], 'B')} at {short:,} tokens and"
        f" **{si(measured[long], 'B')}** at {long:,}: it grows by {si(growth, 'B')} per token,"
        f" the keys and values of its {attention_layers} attention layer"
        f"{'s' if attention_layers > 1 else ''}, on top of the fixed state of the other"
        f" {layers - attention_layers}."
    )
    if exact:
        return text + " Every point is the formula's byte count exactly."
    wrong = [s for s in contexts if measured[s] != predicted[s]]
    return text + (
        f" At {', '.join(f'{s:,}' for s in wrong)} tokens the cache differs from the formula"
        f" ({', '.join(si(predicted[s], 'B') for s in wrong)} predicted): the cache class keeps"
        " something the shapes do not say."
    )
