"""Every notebook: worked solutions of the exercises, one function per exercise that has numbers.

Each function takes what the notebook computed or measured and returns Markdown wrapped by
``solution``: an HTML ``<details>`` block, collapsed until the reader opens it, in the book and in
Jupyter alike. The exercise itself stays in the page as "predict, then measure"; the solution shows
the prediction worked with kvlab's formulas and says what a measurement should show and why it may
differ on this kind of machine.
"""

from __future__ import annotations

import math

from kvlab.show.format import sci, si
from kvlab.show.readings import ratio_text, within


def count(n: float) -> str:
    """An exact count with thousands separators below a million, else in scientific notation."""
    return f"{int(n):,}" if float(n).is_integer() and abs(n) < 1e6 else sci(n)

GLOSSARY = "../book/glossary.md"


def solution(number: int, body: str) -> str:
    """``body`` (Markdown) inside a collapsed ``<details>`` block titled "Solution to exercise N"."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"number must be an exercise number >= 1, got {number!r}")
    if not isinstance(body, str) or not body.strip():
        raise ValueError("body must be the solution's Markdown text")
    return f"<details>\n<summary>Solution to exercise {number}</summary>\n\n{body.strip()}\n\n</details>\n"


# -- 9.1 the decode loop ---------------------------------------------------------------------------


def decode_loop_gqa(kv_heads_now: int, kv_heads_new: int, slope_now: float, slope_new: float,
                    slope_measured: float) -> str:
    """Exercise 1 of 9.1: the slope 3k/beta with fewer KV heads."""
    factor = slope_now / slope_new
    return solution(1, (
        f"The slope is $3k/\\beta$ and $k = 2 L\\,n_{{kv}} d_h w$ is proportional to the KV heads, so going "
        f"from {kv_heads_now} to {kv_heads_new} KV heads divides it by **{factor:g}**: from "
        f"{si(slope_now, 's')} to **{si(slope_new, 's')}** per token of history. The query heads, and with "
        f"them the attention FLOPs, do not change. This run measured {si(slope_measured, 's')} per token with "
        f"{kv_heads_now} KV heads. Expect the measured fall to be somewhat less than {factor:g}x: a smaller "
        "cache fits the CPU's caches for longer, and the fixed per-step costs that a line fit absorbs do "
        "not shrink with it."))


def decode_loop_window(P: int, G: int, W: int, naive_pairs: int, cached_pairs: int, dense_naive: int,
                       dense_cached: int) -> str:
    """Exercise 2 of 9.1: work with a sliding window of W tokens."""
    return solution(2, (
        "A window changes what each query attends to, not which positions are processed: the positions "
        "formulas stay as they are. Under the page's dense convention a query scores every key it may "
        "see, at most $W$ of them, so a pass over $n$ tokens scores $n\\min(n, W)$ pairs and a decode step "
        "with $n$ tokens of history $\\min(n, W)$:\n\n"
        "$$\\text{naive: } \\sum_{j=0}^{G-1}(P+j)\\min(P+j,\\,W), \\qquad "
        "\\text{cached: } P\\min(P, W) + \\sum_{j=1}^{G-1}\\min(P+j,\\,W).$$\n\n"
        "When $P \\ge W$ both collapse: the naive loop does $W\\,(GP + G(G-1)/2)$ pairs, $W$ times its "
        "positions, and the cached loop $W(P + G - 1)$, constant per step. "
        f"At $P = {P}$, $G = {G}$ and $W = {W}$, counting gives **{count(naive_pairs)}** pairs naive and "
        f"**{count(cached_pairs)}** cached (against {count(dense_naive)} and {count(dense_cached)} without a "
        "window); the cell checks the closed form against a brute-force count. To check it yourself, "
        "replace `n` by `min(n, W)` where `counted` adds pairs."))


def decode_loop_static(P: int, G: int, static_first: float, static_last: float, cached_first: float,
                       cached_last: float) -> str:
    """Exercise 3 of 9.1: the static cache's per-step times are flat within a request."""
    flat = within(static_last, static_first, 1.3)
    text = ("The static cache is allocated for $P + G$ tokens and every step attends over all of those "
            "slots, masked, so every step reads the same bytes: the per-step time should be **flat** "
            "within a request, where the cached loop's steps grow with their history. Flat does not mean "
            "cheaper: from the first step the static loop pays for the longest history, and its mask on "
            f"top. In a run with $P = {P}$ and $G = {G}$ the static loop's first and last steps took "
            f"{si(static_first, 's')} and {si(static_last, 's')} (the cached loop's "
            f"{si(cached_first, 's')} and {si(cached_last, 's')}).")
    if flat:
        text += " The static steps are flat, as predicted."
    else:
        text += (f" The static steps changed by {ratio_text(static_last, static_first)} over the request, "
                 "more than the prediction allows: on a shared CPU another process, or the first steps "
                 "warming the CPU's caches, can move single steps this much; compare medians of several runs.")
    return solution(3, text)


# -- 9.2 recompute, cache reuse, optimized decode --------------------------------------------------


def cache_reuse_doubling(P: int, G: int, a: float, b: float, pos32: int, pos64: int, measured32: float,
                         measured64: float) -> str:
    """Exercise 1 of 9.2: the naive loop's total time when G doubles (from G to 2G)."""
    t32, t64 = G * a + b * pos32, 2 * G * a + b * pos64
    predicted, measured = t64 / t32, measured64 / measured32
    text = (f"The naive loop makes $G$ passes: $T(G) \\approx G\\,a + b\\cdot\\mathrm{{positions\\_processed}}(P, G)$. "
            f"At $P = {P}$ the positions are {pos32:,} for $G = {G}$ and {pos64:,} for $G = {2 * G}$, and the fitted "
            f"$a$ = {si(a, 's')} and $b$ = {si(b, 's')} per position give {si(t32, 's')} and {si(t64, 's')}: a "
            f"factor of **{predicted:.2f}**. It lies between 2 (the fixed cost $a$ alone doubles) and "
            f"{pos64 / pos32:.2f} (the positions alone). Measured: {si(measured32, 's')} and "
            f"{si(measured64, 's')}, a factor of **{measured:.2f}**.")
    if within(measured, predicted, 1.15):
        text += " The prediction holds."
    else:
        text += (f" That is {ratio_text(measured, predicted)} the predicted factor: the two-pass line is "
                 "fitted on one model and length range, and on a shared CPU a single run of each can move "
                 "by this much; rerun both, interleaved.")
    return solution(1, text)


def cache_reuse_warm(costs: dict, first_steps, steady: float) -> str:
    """Exercise 2 of 9.2: the compile-cost estimate against ``warm``, and the first compiled steps."""
    rows = "\n".join(f"| {w} | {si(c, 's')} |" for w, c in costs.items())
    spread = max(costs.values()) / min(costs.values()) if min(costs.values()) > 0 else math.inf
    first, second = first_steps[0], first_steps[1]
    text = ("The estimate the page uses, the compiled run's extra time net of its steady gain, depends on "
            "`warm` only through the two steady medians, so it barely moves:\n\n"
            f"| `warm` | compile cost |\n|---:|---:|\n{rows}\n\n"
            f"(a spread of {spread:.2f}x). Summing only the first `warm` compiled steps would not be stable: "
            "too small a `warm` misses compilation work that happens later, too large a one counts steady steps "
            f"as cost. The first compiled step took {si(first, 's')}: the call that traces the model and "
            f"generates its kernels. The second took {si(second, 's')}, {second / steady:,.0f} times a steady "
            f"step ({si(steady, 's')}).")
    if second > 100 * steady:
        text += (" That is a second compilation: `torch.compile` specialises on values it first sees and "
                 "recompiles once when one of them changes; on a GPU, `reduce-overhead` also records the CUDA "
                 "graph on an early call.")
    elif second > 2 * steady:
        text += (" No second compilation, but one-time work remains: buffers allocated and caches warmed on "
                 "first use. On a GPU, `reduce-overhead` records the CUDA graph on an early call, which shows "
                 "here as a slow second or third step.")
    else:
        text += " The second step is already steady: all the one-time work happened in the first call."
    return solution(2, text)


# -- 9.3 GEMV-like decode and the roofline ---------------------------------------------------------


def gemv_big_product(K: int, N: int, element_size: int, gemv_bytes_per_s: float, measured_s: float | None) -> str:
    """Exercise 1 of 9.3: the time of one 70B MLP matrix-vector product."""
    nbytes = K * N * element_size
    predicted = nbytes / gemv_bytes_per_s
    text = (f"At $n = 1$ the product is a weight read: {K:,} × {N:,} elements of {element_size} bytes are "
            f"{si(nbytes, 'B')}, and this machine's batch-1 product streamed at {si(gemv_bytes_per_s, 'B/s')}, "
            f"so it should take about **{si(predicted, 's')}**. The activation and output vectors add a "
            "negligible share.")
    if measured_s is None:
        return solution(1, text + " Measure it with the cell the exercise names.")
    text += f" Measured: **{si(measured_s, 's')}**, {ratio_text(measured_s, predicted)} the prediction."
    if within(measured_s, predicted, 1.5):
        text += " A matrix this large streams at the same rate as the sweep's: time is bytes."
    else:
        text += (" The gap means the rate changed between the two measurements: on a shared machine the "
                 "bandwidth left over moves from second to second, and a matrix of this size may also "
                 "run into memory pressure.")
    return solution(1, text)


def gemv_h200_batch(batch: int, step: float, rate: float, step32: float, rate32: float) -> str:
    """Exercise 2 of 9.3: the largest H200 batch of 8,192-token sequences for the 8B model."""
    return solution(2, (
        "Solve $P w_p + B\\,T\\,k \\le M$ for $B$: $B = \\lfloor (M - P w_p) / (T k) \\rfloor$ "
        f"(`rf.max_batch`). On the H200 that is **{batch} sequences**, with a step floor of "
        f"{si(step, 's')} and {rate:,.0f} tokens/s, against {si(step32, 's')} and {rate32:,.0f} tokens/s at 32 "
        f"sequences: {rate / rate32:.2f} times the tokens/s for {batch / 32:.1f} times the batch. Past 32 "
        "sequences of this length the cache already outweighs the weights, so each extra sequence adds "
        "nearly its own read time: batching stops paying once the step is KV-bound."))


def gemv_attention_ridge(ridge: float, needs: dict, max_g: int) -> str:
    """Exercise 3 of 9.3: what g and w_kv would bring attention to the H100's ridge."""
    rows = "\n".join(f"| {w:g} | {g:,.0f} |" for w, g in needs.items())
    return solution(3, (
        f"Attention does $2g/w_{{kv}}$ FLOP per cache byte, so reaching the ridge of {ridge:.0f} FLOP per byte "
        "needs $g = I^* w_{kv} / 2$:\n\n"
        f"| $w_{{kv}}$ (bytes) | $g$ needed |\n|---:|---:|\n{rows}\n\n"
        f"Llama-3-70B has {max_g} query heads, so even one KV head for all of them (multi-query attention, "
        f"$g = {max_g}$) falls short in bf16, and a 4-bit cache only just comes near. Attention over the "
        "cache stays bandwidth-bound; what helps is fewer bytes (the levers of the long-context section), "
        "not more arithmetic per byte."))


# -- 9.4 KV-cache layout ---------------------------------------------------------------------------


def kv_layout_batch(b_lo: int, b_hi: int, read_pred: tuple, read_meas: tuple, append_meas: tuple) -> str:
    """Exercise 1 of 9.4: read and append time when the batch grows."""
    pred, meas, app = read_pred[1] / read_pred[0], read_meas[1] / read_meas[0], append_meas[1] / append_meas[0]
    text = (f"The read moves $2BsHDw$ bytes, proportional to $B$: going from {b_lo} to {b_hi} sequences should "
            f"multiply its time by **{b_hi / b_lo:g}** (predicted {si(read_pred[0], 's')} and "
            f"{si(read_pred[1], 's')}). The `index` append writes $2BHDw$ bytes, a few kilobytes, so its time is "
            "the fixed cost of one operation and should barely move. Measured: the read went from "
            f"{si(read_meas[0], 's')} to {si(read_meas[1], 's')} (**{meas:.1f}x**), the append from "
            f"{si(append_meas[0], 's')} to {si(append_meas[1], 's')} ({app:.1f}x).")
    if within(meas, pred, 1.5):
        text += " The read scales with its bytes, as predicted."
    else:
        text += (f" The read scaled by {ratio_text(meas, pred)} the predicted factor: a small batch's cache "
                 "partly fits the CPU's last-level cache, so it reads faster than DRAM and the ratio grows; "
                 "on a busy machine contention can move either end.")
    return solution(1, text)


def kv_layout_block1(D: int, w: int, runs_1: dict, runs_16: dict, block: int, gather_1: float,
                     gather_16: float) -> str:
    """Exercise 2 of 9.4: one-token blocks."""
    text = (f"With one token per block, a block of `HND` holds one vector per head, so a head's contiguous run "
            f"is one head vector, $D w$ = **{si(D * w, 'B')}**, the same as `NHD`: the layouts differ only "
            f"inside a block, and a one-token block has no inside. kvlab's runs: `HND` "
            f"{si(runs_1['HND'], 'B')} at block 1 against {si(runs_16['HND'], 'B')} at block {block}; `NHD` "
            f"{si(runs_1['NHD'], 'B')} and {si(runs_16['NHD'], 'B')}. The gather copies the same bytes but "
            f"through {block} times as many table entries and pieces, so it should get slower. Measured on one "
            f"`NHD` read: {si(gather_1, 's')} at block 1 against {si(gather_16, 's')} at block {block} "
            f"({ratio_text(gather_1, gather_16)}).")
    if gather_1 > 1.1 * gather_16:
        text += " Slower, as predicted: per-block indexing costs more than the bytes."
    else:
        text += (" Not slower here: PyTorch's indexed copy handles one-token blocks as one gather over rows, so "
                 "on this machine the table's length costs little next to the bytes. A kernel that loops over "
                 "blocks would show the penalty.")
    return solution(2, text)


def kv_layout_cat(s: int, t_cat: float, t_read: float) -> str:
    """Exercise 3 of 9.4: torch.cat against the read it serves."""
    pred = 2 * (s + 1) / s
    meas = t_cat / t_read
    text = (f"The ratio of bytes is $2 \\cdot 2B(s+1)HDw \\,/\\, 2BsHDw = 2(s+1)/s$, **{pred:.3f}** at $s$ = {s:,}: "
            "growth by concatenation costs about twice the read it serves, because it reads and writes the "
            f"whole cache. Measured at the defaults: {si(t_cat, 's')} against {si(t_read, 's')}, "
            f"**{meas:.1f}x**.")
    if within(meas, pred, 1.5):
        text += " Close to the byte ratio."
    elif meas < pred:
        text += (f" That is {ratio_text(meas, pred)} the byte ratio: the read is slower per byte than a copy, "
                 "because its time includes attention's arithmetic (the scores, the softmax and the weighted "
                 "sum), which a byte count leaves out.")
    else:
        text += (f" That is {ratio_text(meas, pred)} the byte ratio: `torch.cat` also allocates a new tensor "
                 "every step, and on a CPU the allocator's fresh pages cost time on top of the bytes.")
    text += (" Preallocating removes the copy and gives every step the same addresses; the risk is the "
             "memory reserved for tokens that may never come, which is what paging recovers "
             "([PagedAttention](05_paged_attention.ipynb)).")
    return solution(3, text)


# -- 9.5 PagedAttention ----------------------------------------------------------------------------


def paged_block_size(block: int, mean_tokens: float, bound: float, formula: float, simulated: float,
                     simulated_16: float) -> str:
    """Exercise 1 of 9.5: the paged allocator's waste at a larger block size."""
    text = (f"A running request wastes at most $B - 1$ slots, the unused tail of its last block, and about "
            f"$(B-1)/2$ on average. With $B = {block}$ and requests holding {mean_tokens:.0f} tokens on average "
            f"over their lives, the bound is $(B-1)/(\\bar L + B - 1)$ = **{bound:.0%}**, and half a block "
            f"of waste per request gives about {(block - 1) / 2 / (mean_tokens + (block - 1) / 2):.0%}; the per-request "
            f"formula of the page, which follows every step of the trace, gives {formula:.0%}. The simulator "
            f"measured **{simulated:.0%}**, against {simulated_16:.0%} at block 16.")
    if simulated <= bound + 0.02:
        text += " It stays under the bound: the block size, not the allocator, sets paged waste."
    else:
        text += (" It is above the bound: requests preempted and waiting still hold nothing, but those "
                 "readmitted start with a partly filled block again, which the per-request bound ignores.")
    return solution(1, text)


def paged_fork_append(before: dict, after: dict, copied_from: int, copied_to: int) -> str:
    """Exercise 2 of 9.5: appending to B instead of its fork B'."""
    return solution(2, (
        f"After the fork, B and B' share every block, including B's partly filled last block "
        f"({copied_from}). Whichever of the two writes first gets the copy: appending to **B** copies that "
        f"block into a free one ({copied_to}) and points **B's** table at it, and B' keeps the original. "
        f"B's table goes from {before['B']} to {after['B']}; B' stays {after[chr(66) + chr(39)]}. The 5 tokens "
        "fill the copied block's empty slots first and take a new block only for what does not fit. "
        "Copy-on-write does not care which sharer writes; it protects the one that did not."))


def paged_swap_steps(steps: dict, preemptions: dict, recomputed: int) -> str:
    """Exercise 3 of 9.5: the simulator's steps to finish a trace with swap instead of recompute."""
    same = steps["swap"] == steps["recompute"]
    text = (f"The simulator counts decode steps, one token per running request per step, and charges no step "
            f"for a prefill. Recompute re-prefills a preempted request ({recomputed:,} tokens here) at no "
            f"cost in steps, and swap copies blocks at no cost in steps either, so the prediction is **the "
            f"same number of steps**, or nearly: the two may readmit requests in a different order. Measured: "
            f"{steps['recompute']:,} steps with recompute ({preemptions['recompute']} preemptions), "
            f"{steps['swap']:,} with swap ({preemptions['swap']}).")
    if same:
        text += " The same, as predicted."
    else:
        text += (f" They differ by {abs(steps['swap'] - steps['recompute']):,} steps: a swapped request comes back "
                 "first and keeps its blocks' worth of tokens, which changes which requests run together. "
                 "The time difference, prefill against copies, is what the measurement above shows.")
    return solution(3, text)


# -- 9.6 hybrid attention and SSM state ------------------------------------------------------------


def ssm_breakeven(name: str, d_inner: int, conv: int, state: int, state_bytes: float, hidden: int,
                  kv_bytes: float, tokens: float) -> str:
    """Exercise 1 of 9.6: when an attention layer outgrows a Mamba layer."""
    return solution(1, (
        f"One {name} layer keeps a convolution window and an SSM state: $d_\\text{{inner}}(k_\\text{{conv}} + n)$ = "
        f"{d_inner:,} × ({conv} + {state}) numbers, {si(state_bytes, 'B')} in bf16, whatever the length. An "
        f"attention layer of the same width ({hidden:,}, multi-head) stores a key and a value of {hidden:,} "
        f"numbers per token, {si(kv_bytes, 'B')}. `ssm.breakeven_context` divides the two: the attention "
        f"layer is larger after **{tokens:,.0f} tokens**, well inside any real prompt. Grouped-query "
        "attention moves the crossover out in proportion to the group size, not beyond a few hundred tokens."))


def ssm_narrow_scan(dim_before: int, dim_after: int, winner_before: str, winner_after: str, times: dict) -> str:
    """Exercise 2 of 9.6: a narrower scan makes the per-round cost matter more."""
    rows = "\n".join(f"| {m} | {si(t, 's')} |" for m, t in times.items())
    text = (f"The cost model is $\\tau\\cdot\\text{{rounds}} + \\gamma\\cdot\\text{{compositions}}\\cdot E$ with "
            f"$E$ = batch × d × n. Going from d = {dim_before} to d = {dim_after} divides $E$, and with it the "
            "work term, by "
            f"{dim_before // dim_after}, while the rounds cost the same: the **round term** gains weight, and "
            "the orders with few rounds (parallel, then chunked) should gain on the sequential scan. At the "
            f"longest prompt, with d = {dim_after}:\n\n| order | time |\n|---|---:|\n{rows}\n\n")
    if winner_after != "sequential":
        text += (f"The {winner_after} scan won (at d = {dim_before} the {winner_before} scan did): fewer rounds "
                 "now matter more than the extra compositions.")
    else:
        text += ("The sequential scan still won: on this CPU a round of PyTorch ops costs little more than the "
                 "Python loop's step, so even at this width the parallel orders' extra work is not repaid.")
    return solution(2, text)


def ssm_hybrid_fraction(layers: int, attention_layers: int, fractions: dict) -> str:
    """Exercise 3 of 9.6: the share of an all-attention cache a 1-in-8 hybrid keeps."""
    parts = ", ".join(f"**{f:.1%}** at {s:,} tokens" for s, f in fractions.items())
    return solution(3, (
        "The hybrid keeps $k$ attention caches and $L - k$ fixed states: "
        "$\\frac{k\\,s\\,K + (L-k)\\,M_\\text{state}}{L\\,s\\,K}$, which falls toward $k/L$ as $s$ grows. With "
        f"$k/L$ = {attention_layers}/{layers} and this page's layer widths, that is {parts}. At short context "
        "the fixed states dominate, so the hybrid saves little; at long context it keeps about one part in "
        f"{layers // attention_layers}."))


def ssm_full_rank(n: int, s: int, error_full: float, rank_full: int, s_eq: int, rank_equal: int,
                  error_equal: float) -> str:
    """Exercise 4 of 9.6: a state as large as the sequence, and a state with equal decays."""
    text = (f"With $n = s$ the input map is square and, for distinct decays, invertible in exact arithmetic: "
            f"every token can be read back, so the prediction is $1 - n/s$ = **0**. Computed at $n = s = {n}$: "
            f"**{error_full:.2g}**, with a numerical rank of {rank_full}.")
    if error_full < 1e-6:
        text += " Zero up to rounding, as predicted."
    else:
        text += (f" Not zero: {n} decays packed between 0.5 and 0.99 make the map's rows (powers of each "
                 "decay) nearly parallel, so its smallest singular values fall below what fp64 resolves next "
                 "to its largest, and only its numerical rank is usable: invertible on paper, not in floating "
                 "point. A fixed state of many elements needs well-separated timescales to use them all.")
    text += (f" With all decays equal, every state element is the same weighted sum of the inputs, up to its "
             f"gain: the map has rank **{rank_equal}**, the state holds one number's worth of information, and "
             f"the error is $1 - 1/s$ = **{error_equal:.4f}** at $s = {s_eq}$. Distinct decays are what let a "
             "fixed state keep several timescales.")
    return solution(4, text)


# -- 9.7 long-context attention variants -----------------------------------------------------------


def long_context_onset(S: int, W: int, onset_sinks: int, onset_window: int) -> str:
    """Exercise 1 of 9.7: where eviction first changes the output."""
    budget = S + W
    predicted = budget + 1
    text = (f"The cache holds $S + W$ = {budget} tokens. A position $t$ here counts the tokens seen, so up to "
            f"$t$ = {budget} (the plot's dashed line) nothing has been evicted, and the first prediction that "
            f"can differ is at **$t$ = {predicted}**, the first that needs an evicted token. A plain window of "
            f"$W$ = {budget} holds the same budget and evicts at the same moment, so its onset is the same; what "
            "differs after that is which tokens are gone (the very first ones, or those just past the sinks). "
            f"Measured: the first non-zero KL is at $t$ = {onset_sinks} with $S$ = {S}, $W$ = {W}, and at "
            f"$t$ = {onset_window} with $S$ = 0, $W$ = {budget}.")
    if onset_sinks == onset_window == predicted:
        text += " Both as predicted."
    else:
        text += (" Not where predicted: a KL below the detection threshold (10^-6 nats) at the first evicting "
                 "step would move the onset later, when the evicted token carried almost no attention.")
    return solution(1, text)


def long_context_outliers(flat: dict, aligned: dict) -> str:
    """Exercise 2 of 9.7: the key layouts without outliers, and with queries aligned to them."""
    winner_flat = min(flat, key=lambda k: flat[k]["rms"])
    winner_aligned = min(aligned, key=aligned.get)
    text = ("Without outliers every channel has the same scale, so a per-channel group's range is set by "
            "ordinary values, as is a per-token group's: **neither layout has an advantage**, and both RMS "
            f"errors should be close. Measured at 2 bits: per-channel {flat['per-channel keys']['rms']:.3f}, "
            f"per-token {flat['per-token keys']['rms']:.3f} ({winner_flat} slightly ahead). With the outliers "
            "back and queries that read mostly the outlier channels, the error that matters is the one on "
            "those channels. Per-channel groups give each outlier channel its own coarse scale; per-token "
            "groups store each token's minimum and maximum, usually the outlier elements, exactly, so the "
            "prediction is that **per-token keys win through the scores**. Measured relative error of the "
            f"attention output: per-channel {aligned['per-channel keys']:.3f}, per-token "
            f"{aligned['per-token keys']:.3f}.")
    if winner_aligned == "per-token keys":
        text += " Per-token wins, as predicted: which layout is better depends on what the queries read."
    else:
        text += (" Per-channel still wins: at this group size the per-token groups' coarse steps on the many "
                 "ordinary channels outweigh the exact outliers, even for these queries.")
    return solution(2, text)


def long_context_kivi_bytes(bits: int, residual: int, predicted: float, measured: float, full: float) -> str:
    """Exercise 3 of 9.7: the bytes a 4-bit KIVI cache holds with no residual."""
    text = (f"With residual 0 every whole group of tokens is quantized as soon as it fills: `kvlab.theory.cache_sizes.kivi_nbytes` "
            f"(packed {bits}-bit codes, plus an FP32 scale and zero point per group, plus the tokens of an "
            f"unfinished group at full precision) gives **{si(predicted, 'B')}**, against {si(full, 'B')} "
            f"for the FP32 cache, {full / predicted:.1f} times fewer. The bar measured {si(measured, 'B')}.")
    if predicted == measured:
        text += " Exactly the prediction."
    else:
        text += (f" {ratio_text(measured, predicted)} the prediction: check the group size and metadata width "
                 "the cache was built with.")
    return solution(3, text)


def long_context_conventions(gap_no_sinks: float, gap_sinks: float) -> str:
    """Exercise 4 of 9.7: the two position conventions with and without sinks."""
    text = ("RoPE makes a score depend only on the distance between query and key. A window without sinks is "
            "one contiguous run of tokens, so renumbering it from zero (positions in cache) keeps every distance: "
            "the two conventions should give **the same outputs**, up to rounding. Measured, the largest log-prob "
            f"difference is {gap_no_sinks:.2g} without sinks, against {gap_sinks:.2g} with 4 sinks. With sinks "
            "the conventions differ only in how far away the sinks seem: at their original positions they drift "
            "ever further from the query, beyond any distance seen in training once the stream outgrows the "
            "training context; renumbered, they stay just before the window. So the convention matters "
            "**with sinks**, and for a model trained at short context positions-in-cache is the safe one "
            "(StreamingLLM's choice).")
    if gap_no_sinks > 1e-3:
        text += (" Here the two conventions also differed without sinks, more than rounding: check that both "
                 "caches evict at the same step.")
    return solution(4, text)


# -- the memory wall -------------------------------------------------------------------------------


def wall_fixed_point(b_dagger: float, kv_floor: float, rows: dict, contexts: list) -> str:
    """Exercise 1 of the memory wall: intensity rising or falling with context around b-dagger."""
    table = "\n".join(f"| {b} | " + " | ".join(f"{ai:.2f}" for ai in ais) + " |" for b, ais in rows.items())
    head = "| batch | " + " | ".join(f"s = {s:,}" for s in contexts) + " |\n|---:|" + "---:|" * len(contexts)
    return solution(1, (
        f"$b^\\dagger = g\\,w_p/w_{{kv}}$ = **{b_dagger:g}** for Llama-3-8B in bf16. Below it the cache's "
        f"intensity, $2g/w_{{kv}}$ = {kv_floor:g} FLOP per byte, exceeds the weights' ($2b/w_p$), so more context "
        "adds higher-intensity bytes and AI rises toward that limit; above it AI falls toward the same limit. "
        f"`rf.arithmetic_intensity` in FLOP per byte:\n\n{head}\n{table}\n\n"
        f"Below $b^\\dagger$ intensity rises with context, above it it falls, and at $b^\\dagger$ it does not move."))


def wall_288(ratio: float, s_star8: float, s_needed: float, s_cap_bf16: float, s_cap_2bit: float,
             speedup: float) -> str:
    """Exercise 2 of the memory wall: a 288 GB device."""
    exists = ratio > 1
    text = (f"$s_\\text{{cap}}/s^* = (M - P w_p)/(P w_p)$ = **{ratio:.3f}**: "
            + ("above 1, so a one-device KV-bound regime now exists, if only a sliver of one (between $s^*$ "
               "and about {:.0f}% beyond it). ".format((ratio - 1) * 100) if exists else
               "not above 1, so there is still no one-device KV-bound regime. ")
            + "For 4x from a 2-bit cache ($c = 8$), solve $S = c(s + s^*)/(s + c s^*) = 4$: "
            "$8(s + s^*) = 4s + 32 s^*$, so $s = 6 s^*(b)$. At batch 8, "
            f"$s^*(8)$ = {s_star8:,.0f} tokens, so **{s_needed:,.0f} tokens** (check: $S$ = {speedup:.2f}). In "
            f"bf16, 8 such sequences would not fit ($s_\\text{{cap}}(8)$ = {s_cap_bf16:,.0f}); with the 2-bit "
            f"cache they do up to {s_cap_2bit:,.0f} tokens, so the compression is what makes the point reachable.")
    return solution(2, text)


def wall_joint(s1: dict, s32: dict) -> str:
    """Exercise 3 of the memory wall: two halvings are one factor of 4, not two factors of S(2)."""
    return solution(3, (
        "Two methods that each halve KV bytes make a joint byte factor $c = 4$; the speedup is $S(4)$, not "
        "$S(2)^2$, because the weights' bytes are paid once whatever the cache's factor. At 128k for "
        f"Llama-3-70B: batch 1 gives $S(2)$ = {s1['half']:.2f}, $S(2)^2$ = {s1['half'] ** 2:.2f}, and "
        f"**$S(4)$ = {s1['joint']:.2f}**; batch 32 gives $S(2)$ = {s32['half']:.2f}, $S(2)^2$ = "
        f"{s32['half'] ** 2:.2f}, and **$S(4)$ = {s32['joint']:.2f}**. Multiplying the separate speedups "
        f"overstates the joint one at both batches ({s1['half'] ** 2 / s1['joint']:.2f}x too high at batch 1, "
        f"{s32['half'] ** 2 / s32['joint']:.2f}x at batch 32). The batch matters more than the stacking: the "
        f"same $c = 4$ is worth {s32['joint'] / s1['joint']:.1f} times as much speedup at batch 32, which is "
        "KV-bound, as at batch 1, which is weight-bound."))


# -- prefix caching --------------------------------------------------------------------------------


def prefix_whole_blocks(prompt: int, block: int, served: int) -> str:
    """Exercise 1 of prefix caching: a prompt of whole blocks sent twice."""
    blocks = prompt // block
    text = (f"{prompt} tokens in blocks of {block} are {blocks} full blocks, all cached after the first request. "
            "But at least one prompt token must be computed, because its logits give the first output token, "
            f"so the second request can reuse at most {blocks - 1} blocks: it computes **{prompt - (blocks - 1) * block} "
            f"tokens**, the whole last block, not one. `BlockManager.lookup` serves {served}.")
    if served == (blocks - 1) * block:
        text += " As predicted."
    else:
        text += " That is not the predicted count: check that the first request was admitted into this cache."
    return solution(1, text)


def prefix_system_prompts(block: int, blocks: int, hit: dict) -> str:
    """Exercise 2 of prefix caching: more system prompts in the same memory."""
    loss = {p: hit[p, 1] - hit[p, 8] for p in ("lru", "reserve")}
    worse = max(loss, key=loss.get)
    text = (f"With one system prompt every user shares it; with eight, each is shared by fewer users and all "
            f"eight compete for {blocks} blocks of {block} tokens. LRU keeps what was used last, so it tends "
            "to hold the prompts of the active users; reserve keeps whatever it cached first and cannot make "
            "room, so it should lose more once the first prompts are not the popular ones. Measured hit "
            f"rates, one system prompt against eight: LRU {hit['lru', 1]:.0%} to {hit['lru', 8]:.0%}, reserve "
            f"{hit['reserve', 1]:.0%} to {hit['reserve', 8]:.0%}; **{worse}** lost more.")
    if worse == "lru":
        text += (" Here LRU lost more: with many prompts and little memory, the blocks it evicts are soon needed "
                 "again, while reserve's fixed set still serves the users whose prompts it happened to keep.")
    text += (" With a salt per user, no block is shared between users at all, not even the system prompt: what "
             "is left is each user's own earlier turns, which the next turn resends, so the hit rate falls to "
             "the share of a prompt that is that user's history.")
    return solution(2, text)


def prefix_ninety(prompt: int, block: int, cached: int, predicted: float, measured: float, cold: float) -> str:
    """Exercise 3 of prefix caching: time to first token at a 90% hit rate."""
    text = (f"A 90% hit on a {prompt}-token prompt is rounded down to whole blocks of {block}: {cached} cached "
            f"tokens. The line (prefill FLOPs of the {prompt - cached} new tokens over the calibrated matmul "
            f"rate) predicts **{si(predicted, 's')}**. `measure_ttft` measured **{si(measured, 's')}** "
            f"(against {si(cold, 's')} with nothing cached).")
    if within(measured, predicted, 1.5):
        text += " Close to the line."
    elif measured > predicted:
        text += (f" {ratio_text(measured, predicted)} the line: the fixed cost of a forward pass (dispatch, "
                 "the head, the cache bookkeeping) does not shrink with the hit rate, and at a high hit rate it "
                 "is most of what is left.")
    else:
        text += " Below the line: the calibrated rate understates what this small prefill reached."
    return solution(3, text)


# -- beyond one request: the engine ----------------------------------------------------------------


def engine_half_pool(capacity: float, max_batch: int, mean_batch: float, preemptions: int) -> str:
    """Exercise 1 of the engine: half the pool."""
    text = (f"The pool holds about {capacity:.1f} requests of this trace's mean size once halved (the capacity "
            "line of the right panel moves left by half). A larger `max_batch` cannot run more than that: the "
            f"running batch should stop growing near {capacity:.1f}, and requests that grow past their share "
            f"get preempted. Measured at `max_batch` {max_batch} with half the pool: a mean running batch of "
            f"{mean_batch:.1f} and {preemptions} preemption{'s' * (preemptions != 1)}.")
    if mean_batch <= capacity * 1.2:
        text += " The batch stops at the pool, as predicted."
    else:
        text += (" The batch ran above the mean capacity: short requests take less than the mean share, so "
                 "more of them fit at once than the average suggests.")
    return solution(1, text)


def long_context_trained(max_share: float, uniform: float, loss_s1: float, loss_s4: float, window: int,
                         gap_small: float, gap_large: float, windows: tuple) -> str:
    """Exercise 5 of 9.7: sinks and window size on the trained model."""
    sinks = max_share > 5 * uniform
    text = (f"The sink measurement is the guide. The largest share of attention on the first token was "
            f"{max_share:.2f}, against {uniform:.3f} for uniform attention: "
            + ("the model has a sink head, and the sink is the first token itself. Keeping one sink keeps it, "
               "so three more should change the loss little. " if sinks else
               "no head sinks its attention, so keeping the first tokens should not matter, one or four. ")
            + f"Measured after the window fills (W = {window}): {loss_s1:.3f} nats with one sink, {loss_s4:.3f} "
            f"with four, a change of {loss_s4 - loss_s1:+.3f}.")
    text += (f" For the second question: past the training context the full cache meets distances it never "
             f"saw, the window does not. The gap between their mean losses after the fill was "
             f"{gap_small:+.3f} nats at W = {windows[0]} and {gap_large:+.3f} at W = {windows[1]}: ")
    if abs(gap_large) < abs(gap_small):
        text += "closer with the larger window, which keeps more of the context the full cache also sees."
    else:
        text += ("not closer: the larger window's extra tokens lie at distances the model handles well, and "
                 "the full cache's loss past the training context is set by the distances beyond it.")
    return solution(5, text)


# -- 9.8 a worked path through a slow decode step --------------------------------------------------


def diagnosis_batch(fraction_1: float, predicted_batch: int, batch: int, step_1: float, step_b: float,
                    fraction_b: float, verdict_1: str, verdict_b: str) -> str:
    """Exercise 1 of 9.8: the batch at which the chatbot's step would reach the copy bandwidth."""
    text = (f"A batch of $b$ sequences reads the weights once, so if the step time stayed the same, the "
            f"useful bytes per second, and with them the bandwidth fraction, would grow about $b$ times (the "
            f"cache each sequence adds is small for a chatbot). At batch 1 the chatbot's step reached "
            f"{fraction_1:.1%} of the copy bandwidth, so the prediction is $b \\approx 1 / {fraction_1:.3g}$, "
            f"about **{predicted_batch:,}** sequences.")
    if batch < predicted_batch:
        text += f" The cell diagnoses batch {batch}, as far as this page's time allows, and scales from there."
    grew = step_b / step_1
    text += (f" Measured: one step took {si(step_1, 's')} at batch 1 ({verdict_1}) and {si(step_b, 's')} at "
             f"batch {batch} ({verdict_b}), {grew:.2f} times as long, at {fraction_b:.1%} of the copy bandwidth.")
    if grew <= 1.5:
        text += (" The step stayed nearly flat, as the prediction assumes: what the batch-1 step paid for "
                 "(dispatch, reading the weights) is shared by every sequence, so batching is almost free here "
                 "until the per-sequence work catches up.")
    else:
        text += (f" The step did not stay flat: it grew {grew:.2f} times for {batch} times the sequences, so the "
                 "bandwidth fraction grew less than the batch. Something else grew with the batch: each "
                 "sequence's attention, activations and cache copies, and on a CPU the matrix products "
                 "themselves, whose time grows with the rows they multiply well before the copy bandwidth "
                 "binds. The prediction is an upper bound on what batching buys.")
    return solution(1, text)


def diagnosis_gqa(kv_heads_before: int, kv_heads_after: int, context: int, share_before: float,
                  share_after: float, measured_share: float, verdict_before: str, verdict_after: str) -> str:
    """Exercise 2 of 9.8: the retrieval step's KV share with grouped-query attention."""
    text = (f"`kvlab.theory.roofline.step_bytes` gives the weights $P w$ and the cache $b\\,s\\,K$, with "
            f"$K = 2 L n_{{kv}} d_h w$ proportional to the KV heads. Going from {kv_heads_before} to "
            f"{kv_heads_after} KV heads divides the cache by {kv_heads_before / kv_heads_after:g} (the key and value "
            f"projections shrink too, a little of the weights). At {context:,} cached tokens the KV share of "
            f"the step's bytes falls from {share_before:.1%} to a predicted **{share_after:.1%}**; the diagnosis "
            f"counts {measured_share:.1%}, cache writes included. The share is arithmetic; what the "
            f"measurement adds is the verdict: **{verdict_before}** before, **{verdict_after}** after.")
    if verdict_before == "kv" and verdict_after != "kv":
        text += (" The cache no longer limits the step: the lever worked, and the next limit is the one the "
                 "new verdict names. Run the path again from there.")
    elif verdict_after == "kv":
        text += (" The cache still dominates the bytes the step moves, so the verdict stays: a smaller cache "
                 "shortens the step but a longer context would bring it back; KV quantization or a window "
                 "cut it further.")
    else:
        text += (" The verdict did not rest on the cache before either: on this machine the step's time goes "
                 "to what the verdict names, and shrinking the cache changes its bytes, not its limit.")
    return solution(2, text)


def diagnosis_naive_ridge(ridge: float, element_size: int, closed_form: float, crossing: int, context: int,
                          intensity: float, verdict: str) -> str:
    """Exercise 3 of 9.8: the context above which a naive step passes the ridge point."""
    text = (f"A naive step reruns all $n = s + 1$ positions but reads the weights once: $2Pn$ FLOPs of "
            f"products over $P w$ bytes, plus attention FLOPs that grow as $n^2$. Its intensity is about "
            f"$2n / w$ FLOP per byte, so it passes this machine's ridge point of {ridge:.3g} FLOP/byte near "
            f"$n \\approx \\text{{ridge}} \\cdot w / 2$, about {closed_form:,.0f} positions (with $w$ = "
            f"{element_size} bytes). Counting the attention FLOPs too with `kvlab.theory.work.step_work`, the first such context "
            f"is **{crossing:,}** tokens. The page's naive step ran at {context:,} cached tokens, an intensity "
            f"of {intensity:.3g} FLOP/byte, ")
    past = intensity > ridge
    text += ("past the ridge point: " if past else "below the ridge point: ")
    if (verdict == "compute") == past:
        text += f"and its verdict, **{verdict}**, agrees with the arithmetic."
    elif past:
        text += (f"yet its verdict is **{verdict}**, not compute. The ridge point compares ceilings; the verdict "
                 "first asks whether the operators were busy at all, and on a CPU a step of a small model can "
                 "lose most of its time to dispatch, or reach neither ceiling, before the arithmetic matters.")
    else:
        text += (f"yet its verdict is **{verdict}**. The FLOP fraction came out above the bandwidth fraction "
                 "although the intensity is below the ridge point: the calibrated ceilings are single "
                 "measurements, and a step that reaches a small share of both can tip either way.")
    return solution(3, text)


# -- 9.5 the paged kernel -------------------------------------------------------------------------


def paged_kernel_rows(q_heads: int, kv_heads: int, rows: int) -> str:
    """Exercise 1 of the paged kernel: the useful share of ``tl.dot`` rows for a GQA group."""
    group = q_heads // kv_heads
    text = (f"One program serves one KV head and its group of $G = {q_heads} / {kv_heads} = {group}$ query "
            f"heads. `tl.dot` needs at least 16 rows, so the kernel pads the group to {rows} rows "
            f"(`_group_rows({group})`): **{group / rows:.0%}** of the rows it multiplies are useful. ")
    if group >= rows:
        text += ("The group fills the tile, so nothing is wasted; the key and value tiles are still read "
                 "once for the whole group, which is the point of grouped-query attention.")
    else:
        text += ("The padded rows cost tensor-core arithmetic, not memory traffic: the key and value tiles "
                 "are read once for the group either way, and decode is bound by that read, so the waste "
                 "hardly shows in the step time.")
    return solution(1, text)


def paged_kernel_splits(multiprocessors: int, kv_heads: int, context: int, wanted: int, useful: int,
                        chosen: int, tile_tokens: int, min_tiles: int) -> str:
    """Exercise 2 of the paged kernel: how many splits ``choose_num_splits`` picks at batch 1."""
    text = (f"At batch 1 there are only {kv_heads} programs without splitting (one per KV head), for "
            f"{multiprocessors} multiprocessors. To give every multiprocessor two programs the kernel would "
            f"want $\\lceil 2 \\cdot {multiprocessors} / {kv_heads} \\rceil = {wanted}$ splits. But each split "
            f"should keep at least {min_tiles} tiles of {tile_tokens} tokens, so that its fixed cost (loading "
            f"the query, writing a partial result and its log-sum-exp) is spread over enough keys: "
            f"$\\lceil {context} / ({tile_tokens} \\cdot {min_tiles}) \\rceil = {useful}$ splits at most. "
            f"`choose_num_splits` takes the smaller, **{chosen}**")
    if chosen < wanted:
        text += (f", so at context {context:,} the grid has {chosen * kv_heads} programs and leaves part of the "
                 "machine idle: the sequence is too short to split further usefully.")
    else:
        text += (f", which fills the machine with {chosen * kv_heads} programs: the sequence is long enough "
                 "for every split to keep its minimum of tiles.")
    return solution(2, text)


def paged_kernel_empty_split(max_difference: float, lse_difference: float) -> str:
    """Exercise 3 of the paged kernel: a split with ``lse = -inf`` and a NaN output in the merge."""
    text = ("Prediction: an empty split has weight $e^{-\\infty - m} = 0$, so the merge should equal the merge "
            "of the other splits alone, whatever the empty split's output holds. A plain weighted sum would "
            "not: $0 \\cdot \\text{NaN}$ is NaN. ")
    if max_difference == 0 and lse_difference == 0:
        text += ("Measured: the output and the log-sum-exp are exactly those of the other splits "
                 "(difference 0), because `merge_partials` masks the outputs of zero-weight splits before "
                 "the sum. This is what makes empty splits harmless: a split that lies past a short sequence's "
                 "end need not produce a meaningful output.")
    else:
        text += (f"Measured: the merge differs from the merge of the other splits by {max_difference:.3g} in "
                 f"the output and {lse_difference:.3g} in the log-sum-exp. That would be a bug: an empty split "
                 "must not change the result.")
    return solution(3, text)
