"""Notebook 07, hybrid attention and SSM state (section 9.6): its readings."""

from __future__ import annotations

from kvlab.show.format import si
from kvlab.show.readings import ratio_text, within


def scan_reading(length: int, dim: int, state_size: int, chunk_size: int, t_seq: float, t_par: float,
                 t_chunk: float, tau: float, gamma: float) -> str:
    """Under the scan explorer: the three orders at the longest prompt, and the fitted costs.

    ``tau`` is the fitted cost of one round, ``gamma`` of one composition of one state element; a
    sequential round composes ``dim * state_size`` elements (batch 1).
    """
    elements = dim * state_size
    per_round_work = gamma * elements
    par, chunk = t_seq / t_par, t_seq / t_chunk
    text = [f"At {length:,} tokens ($d = {dim}$, $n = {state_size}$, $c = {chunk_size}$) the sequential scan "
            f"took **{si(t_seq, 's')}**, the parallel scan **{si(t_par, 's')}** and the chunked scan "
            f"**{si(t_chunk, 's')}**: the parallel scan was {_faster(par)} and the chunked scan "
            f"{_faster(chunk)} than the sequential one."]
    if tau <= 0 or gamma <= 0:
        text.append(f"The fit gave a round cost of {si(tau, 's')} and {si(gamma, 's')} per composition; a "
                    "value at or below zero means the two terms could not be told apart at these sizes, "
                    "so read the measured points, not the curves.")
        return " ".join(text)
    text.append(f"The fit gives a round cost $\\tau$ of {si(tau, 's')} and {si(gamma, 's')} per composition "
                f"of one state element, so the elementwise work of one sequential round over "
                f"$E = {elements:,}$ elements is {si(per_round_work, 's')}.")
    if tau < per_round_work:
        text.append("A round is cheap next to the elementwise work of the state, so the parallel scan's "
                    "extra $\\log_2 s$ factor of work should cost more than its short depth saves.")
        if par < 1:
            text.append("That is what happened: the sequential scan won.")
        else:
            text.append("Yet the parallel scan won here, so the fitted model does not explain the points "
                        "well at this setting: compare the curves with the markers.")
    else:
        text.append(f"A round costs {ratio_text(tau, per_round_work)} the elementwise work it does, so on "
                    "this machine the fixed cost per round (Python and kernel dispatch) dominates and the "
                    "parallel scan's $\\lceil\\log_2 s\\rceil$ rounds should beat $s$ sequential ones.")
        if par > 1:
            text.append("That is what happened: the parallel scan won.")
        else:
            text.append("Yet the sequential scan won here, so the fitted model does not explain the points "
                        "well at this setting: compare the curves with the markers.")
    return " ".join(text)


def _faster(ratio: float) -> str:
    return f"{ratio:.2f} times faster" if ratio >= 1 else f"{1 / ratio:.2f} times slower"


def step_reading(llama: str, mamba: str, s0: int, s1: int, llama_t: tuple, mamba_t: tuple,
                 slope_llama: float, slope_mamba: float, slope_pred: float) -> str:
    """Decode step time against context: the attention slope against its prediction, and Mamba's."""
    text = [f"From {s0:,} to {s1:,} tokens of context, the {llama} step went from {si(llama_t[0], 's')} to "
            f"**{si(llama_t[1], 's')}**, a fitted slope of {si(slope_llama, 's')} per token of context "
            f"against {si(slope_pred, 's')} predicted ({ratio_text(slope_llama, slope_pred)} the "
            f"prediction). The {mamba} step went from {si(mamba_t[0], 's')} to **{si(mamba_t[1], 's')}**, "
            f"a slope of {si(slope_mamba, 's')} per token."]
    if abs(slope_mamba) < 0.2 * abs(slope_llama):
        text.append("Its state has the same size at every context, so what slope remains is the noise of "
                    "a shared machine: the error bars span the fastest and slowest of the repeats.")
    else:
        text.append("Its state has the same size at every context, so its slope should be near zero; here "
                    "it is not small next to the attention slope, which means the noise of a shared "
                    "machine was as large as the attention growth in this run. Rerun the cell.")
    if within(slope_llama, slope_pred, 2):
        text.append("The attention slope is within a factor of two of three passes over the cache at copy "
                    "bandwidth.")
    elif slope_llama > slope_pred:
        text.append("The attention slope exceeds the prediction: the step costs more per cached byte than "
                    "three passes at copy bandwidth. A likely cause on a CPU, not verified here: each "
                    "`torch.cat` allocates a fresh buffer for the whole cache, and the operating system "
                    "zeroes freshly mapped pages on first touch, work that a copy-bandwidth figure does not "
                    "include. A cache preallocated once "
                    "([Recompute, cache reuse, optimized decode](02_cache_reuse.ipynb)) avoids both the "
                    "copy and the allocation.")
    else:
        text.append("The attention slope is below the prediction: part of the cache stayed in the CPU's "
                    "caches between steps, which read faster than the calibrated streaming bandwidth.")
    return " ".join(text)


def recall_reading(state_size: int, context: int, mean_exact: float, mean_sampled: float, samples: int,
                   first: float, last: float, attention_max: float) -> str:
    """Under the recall explorer: the fixed state's loss against the bound, and attention's."""
    bound = max(0.0, 1 - state_size / context)
    text = [f"With a state of {state_size} numbers and {context} tokens, the best linear readout loses a "
            f"fraction **{mean_exact:.3f}** of a token's value on average"]
    if abs(mean_exact - bound) < 1e-6:
        text[0] += r", exactly $1 - n/s$"
    else:
        text[0] += (f", more than the bound $1 - n/s = {bound:.3f}$: the decays make $M$ numerically "
                    "rank-deficient, so the state holds fewer independent numbers than its size")
    text[0] += f"; fitted on {samples:,} random sequences it loses {mean_sampled:.3f}."
    if abs(mean_sampled - mean_exact) < 0.05:
        text.append("The fit on samples lands on the exact value.")
    else:
        text.append("The fit on samples is off the exact value by more than sampling noise should allow; "
                    "more samples bring it closer.")
    text.append(f"The newest token is lost only up to {last:.3f}, the oldest up to {first:.3f}.")
    if attention_max < 1e-6:
        text.append(f"The attention lookup recovers every position, with an error of at most "
                    f"{attention_max:.1e}, because it keeps all of them.")
    else:
        text.append(f"The attention lookup lost up to {attention_max:.1e} of a position, more than rounding: "
                    "its query is not sharp enough for this many positions.")
    return " ".join(text)
