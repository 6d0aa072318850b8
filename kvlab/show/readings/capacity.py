"""Notebooks 03 and 10, GEMV-like decode (section 9.3) and the memory wall: readings on memory
capacity.

The marketed figures the sources compute with (Decode and KV Cache chapter, 2026; KV Cache Memory
Wall, 2026), against the memory a device really exposes and a model's unrounded parameter count.
"""

from __future__ import annotations

import dataclasses

from kvlab._checks import instance, integer, positive, real
from kvlab.show.format import si
from kvlab.theory.memory_wall import ridge_admitted
from kvlab.theory.roofline import free_beside_weights, max_batch, ridge_batch, transfer_time
from kvlab.theory.shapes import SHAPES
from kvlab.theory.specs import LINKS, exposed_memory, spec

GIB = 2**30


def _real(shape):
    return dataclasses.replace(shape, params=shape.counted_params())


def largest_batch_reading(context: int = 2048) -> str:
    """Notebook 03: the largest admitted batch of the 8B model on an H100, seed's constants against
    real ones."""
    context = integer("context", context, 0)
    seed8 = dataclasses.replace(SHAPES["llama-3-8b"], params=8e9)
    h100, real_h100 = spec("h100-sxm"), exposed_memory("h100-sxm")
    seed_batch = max_batch(seed8, h100, context)
    real_batch = max_batch(_real(SHAPES["llama-3-8b"]), real_h100, context)
    text = (
        f'The seed reads "80 GB" as {h100.hbm_bytes / 1e9:.0f}e9 bytes, and this page keeps'
        " that to "
        f"reproduce its table. The marketed figure is binary-ish: an H100 80 GB exposes "
        f"{real_h100.hbm_bytes / GIB:.1f} GiB, {real_h100.hbm_bytes / 1e9:.1f}e9 bytes. With that"
        " memory and "
        f"the 8B model's unrounded {SHAPES['llama-3-8b'].counted_params() / 1e9:.2f}e9 parameters,"
        " the "
        f"largest batch of {context:,}-token sequences is **{real_batch}** instead of {seed_batch}."
    )
    b_ridge = round(ridge_batch(h100))
    if not ridge_admitted(_real(SHAPES["llama-3-8b"]), real_h100, context):
        text += f" More room, the same conclusion: the ridge batch of {b_ridge} still does not fit."
    else:
        text += (
            f" That reaches the ridge batch of {b_ridge}: with the real capacity, the weight"
            " products could just reach the ridge before capacity binds."
        )
    return (
        text
        + " (A serving engine also keeps memory for activations and its own workspace, which pulls "
        "the figure back down.)"
    )


def h200_margin_reading(context_cap_seed: float) -> str:
    """Notebook 10: the H200 margin beside Llama-3-70B's weights, rounded and real."""
    context_cap_seed = positive("context_cap_seed", context_cap_seed)
    l70 = SHAPES["llama-3-70b"]
    seed_margin = free_beside_weights(l70, "h200")
    real = _real(l70)
    real_h200 = exposed_memory("h200")
    real_margin = free_beside_weights(real, real_h200)
    real_cap = real_margin / real.kv_bytes_per_token(2)
    h200 = spec("h200")
    return (
        f"With the seed's constants, {h200.hbm_bytes / 1e9:.0f}e9 bytes of HBM less"
        f" {l70.params * 2 / 1e9:.0f}e9 bytes of weights leave **{seed_margin / 1e9:.0f} GB**, room"
        f" for {context_cap_seed:,.0f} tokens of cache. Both inputs are rounded. An H200 sold as"
        f" {h200.hbm_bytes / 1e9:.0f} GB exposes {real_h200.hbm_bytes / GIB:.1f} GiB,"
        f" {real_h200.hbm_bytes / 1e9:.1f}e9 bytes, and Llama-3-70B's matrices hold"
        f" {real.params / 1e9:.2f}e9 parameters ({real.params * 2 / 1e9:.1f}e9 bytes in bf16). The"
        f" real margin is **{real_margin / 1e9:.1f} GB**, room for about {real_cap:,.0f} tokens:"
        f" still a thin margin for a 128k context, but not the {seed_margin / 1e9:.0f} GB the"
        " rounding makes of it. "
        + engine_fraction_reading(real.params * 2, real_h200.hbm_bytes, h200.name)
    )


# vLLM's default share of device memory for weights, activations and KV cache
# (``gpu_memory_utilization``); SGLang's ``mem_fraction_static`` plays the same part.
ENGINE_MEMORY_FRACTION = 0.9


def engine_fraction_reading(
    weight_bytes: float, device_bytes: float, device: str, fraction: float = ENGINE_MEMORY_FRACTION
) -> str:
    """Whether the weights fit in the share of the device a serving engine uses, and what is left
    there for the cache."""
    weight_bytes = real("weight_bytes", weight_bytes)
    device_bytes = real("device_bytes", device_bytes)
    fraction = real("fraction", fraction)
    usable = fraction * device_bytes
    left = usable - weight_bytes
    head = (
        f"A serving engine does not hand the whole device to the model: at vLLM's default memory"
        f" fraction of {fraction:g} it uses {usable / 1e9:.1f}e9 of the {device}'s bytes"
    )
    if left <= 0:
        return (
            f"{head}, {-left / 1e9:.1f}e9 fewer than the weights need, so the model does not fit"
            " one device there at all: a deployment shards it, quantizes its weights or raises"
            " the fraction and gives up headroom for activations."
        )
    return f"{head}, which leaves {left / 1e9:.1f}e9 bytes beside the weights for the cache."


def kivi_residual_reading(
    tokens: int,
    residual: int,
    group_size: int,
    bits: int,
    elements_per_token: int,
    element_bytes: float,
    meta_bytes: int,
    held: float,
    long_tokens: int = 131_072,
) -> str:
    """Notebook 08: why a short KIVI cache saves far less than its bit width suggests."""
    element_bytes = real("element_bytes", element_bytes)
    held = real("held", held)
    from kvlab.theory.cache_sizes import kivi_nbytes, quantized_nbytes

    quantized = max(0, (tokens - residual) // group_size * group_size)
    full_bytes = tokens * elements_per_token * element_bytes
    per_token = quantized_nbytes(elements_per_token, bits, group_size, meta_bytes)
    codes_ratio = elements_per_token * element_bytes / per_token
    long_ratio = (
        long_tokens
        * elements_per_token
        * element_bytes
        / kivi_nbytes(
            long_tokens, elements_per_token, bits, group_size, residual, element_bytes, meta_bytes
        )
    )
    return (
        f"Why only {full_bytes / held:.1f} times? Of the {tokens} tokens held, {quantized} are"
        f" quantized and **{tokens - quantized} stay in full precision**: the residual window of"
        f" {residual} and {tokens - quantized - residual} newer ones short of a whole group of"
        f" {group_size}. A quantized token costs 1/{codes_ratio:.1f} of a full one, so as the"
        f" stream grows the saving tends to {codes_ratio:.1f} times ({long_ratio:.1f} at"
        f" {long_tokens:,} tokens)."
    )


def w4_links(cache_bytes: float, codec: float = 4) -> dict:
    """Notebook 10, W4: seconds to move one session's cache over the host and peer links, by link,
    each at its one-way rate from ``kvlab.theory.specs.LINKS`` (a fetch moves the cache one way)."""
    cache_bytes = positive("cache_bytes", cache_bytes)
    pcie, nvlink = LINKS["pcie5-x16"], LINKS["nvlink4"]
    return {
        f"PCIe Gen5 x16, {pcie.bytes_per_s_each_way / 1e9:.0f} GB/s one way": transfer_time(
            cache_bytes, pcie.bytes_per_s_each_way
        ),
        f"PCIe Gen5 x16 + {codec:g}x codec": transfer_time(
            cache_bytes, pcie.bytes_per_s_each_way, codec=codec
        ),
        f"NVLink 4, {nvlink.bytes_per_s_each_way / 1e9:.0f} GB/s one way, + {codec:g}x codec": (
            transfer_time(cache_bytes, nvlink.bytes_per_s_each_way, codec=codec)
        ),
    }


def seed_nvlink_seconds(cache_bytes: float, codec: float = 4) -> float:
    """The seed's W4 NVLink fetch: the cache over NVLink's quoted total of both directions (900
    GB/s)."""
    cache_bytes = positive("cache_bytes", cache_bytes)
    return transfer_time(cache_bytes, LINKS["nvlink4"].bytes_per_s_both_ways, codec=codec)


def nvlink_reading(cache_bytes: float, codec: float, recompute_seconds: float) -> str:
    """Notebook 10: a one-way KV fetch over NVLink gets half the quoted (bidirectional) figure, and
    the range of W4's speedups over recompute that follows."""
    cache_bytes = real("cache_bytes", cache_bytes)
    codec = real("codec", codec)
    recompute_seconds = real("recompute_seconds", recompute_seconds)
    nvlink, pcie = LINKS["nvlink4"], LINKS["pcie5-x16"]
    fetch = list(w4_links(cache_bytes, codec).values())
    seed = seed_nvlink_seconds(cache_bytes, codec)
    slow, fast = recompute_seconds / max(fetch), recompute_seconds / min(fetch)
    return (
        "One correction to the seed's arithmetic, applied in the table above. NVIDIA's H100"
        " datasheet quotes both links as the total of the two directions, NVLink at"
        f" {nvlink.bytes_per_s_both_ways / 1e9:,.0f} GB/s and PCIe Gen5 at"
        f" {pcie.bytes_per_s_both_ways / 1e9:,.0f} GB/s; a fetch moves the cache one way, at"
        f" {nvlink.bytes_per_s_each_way / 1e9:,.0f} and {pcie.bytes_per_s_each_way / 1e9:.0f} GB/s."
        " The seed takes PCIe's one-way rate but NVLink's total. So the codec-compressed fetch"
        f" over NVLink takes **{si(min(fetch), 's')}**, {min(fetch) / seed:.0f} times the seed's"
        f" {si(seed, 's')}, and fetching is **{slow:.0f}x to {fast:,.0f}x** faster than the"
        f" {si(recompute_seconds, 's')} recompute, rather than the seed's"
        f" {recompute_seconds / seed:,.0f}x at the top. Tiering changes neither the bytes a step"
        " reads nor what fits; it turns a recompute of tens of seconds into a fetch of well under"
        " one. The conclusion stands: tier for reuse, never for reads within a step."
    )


def seed_corrections_reading(
    fixed_points: dict,
    ai_small: float,
    ai_floor: float,
    ai_ceiling: float,
    b_dagger_70b: float,
    sigma: float,
    capacity_factor: float,
    capacity_rounded: float,
    h100_recompute: float,
    b200_recompute: float,
    cache_bytes: float,
    gib: float,
) -> str:
    """Notebook 10: the five derived statements of the memory-wall paper that its own constants do
    not support, each with the figure the constants give (computed in the cell before this reading).

    ``fixed_points`` maps a model name to (g, b-dagger); ``ai_small`` is AI(128k, 1);
    ``capacity_factor`` 8 x 2 x sigma with sigma exact, ``capacity_rounded`` with sigma rounded to
    2.91; the recompute times are Llama-3-70B's prefill of 128k tokens on an H100 and a B200;
    ``gib`` the 128k cache in GiB.
    """
    instance("fixed_points", fixed_points, dict)
    links = w4_links(cache_bytes)
    slowest, fastest = max(links.values()), min(links.values())
    seed = seed_nvlink_seconds(cache_bytes)
    groups = ", ".join(f"$g = {g:g}$" for g, _ in fixed_points.values())
    parts = [f"{name}'s {b:g}" for name, (g, b) in fixed_points.items()]
    points = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return "\n".join(
        [
            (
                '1. **$b^\\dagger = 8$ "for the GQA models".** $b^\\dagger = g\\,w_p / w_{kv}$'
                " depends on the group factor, and the three Llama-3 models of Table 1 have three:"
                f" {groups}. The figure 8 is right for Llama-3-70B only; the fixed points are"
                f" {points}."
            ),
            (
                f'2. **"The intensity of any decode configuration" between {ai_floor:.1f} and'
                f" {ai_ceiling:.1f} at 128k.** True for $b \\ge b^\\dagger = {b_dagger_70b:g}$."
                f" Below the fixed point the intensity is lower: {ai_small:.2f} FLOP per byte at"
                " batch one. The conclusion that no batch makes decode compute bound stands, a"
                " fortiori."
            ),
            (
                '3. **"Approaches 46×" in capacity.** $8 \\times 2 \\times \\sigma$ with $\\sigma'
                " = 8 \\times 128\\text{k} / (96\\text{k} + 8 \\times 32\\text{k}) ="
                f" {sigma:.3f}$ is {capacity_factor:.1f} ({capacity_rounded:.1f} with $\\sigma$"
                f" rounded to 2.91). Rounded to two figures that is {capacity_factor:.0f}; the seed"
                " truncates to 46."
            ),
            f'4. **87× to 4,900×.** Appendix B.5 divides "the 56.9 s recompute" by the W4 fetch'
            f" times and calls the result "
            f"the range of section 4.5. But {h100_recompute:.1f} s is the H100 recompute. W4 runs"
            " on a B200, whose recompute "
            f"is {b200_recompute:.1f} s (section 4.5 itself), and section 4.5's range, "
            f"{b200_recompute / slowest:.0f}× to {b200_recompute / seed:,.0f}×, is the one to"
            " quote, up to the NVLink "
            "correction above: at NVLink's one-way rate it is"
            f" **{b200_recompute / slowest:.0f}× to "
            f"{b200_recompute / fastest:,.0f}×**.",
            (
                f"5. **39.0 GiB.** ${f'{cache_bytes:,.0f}'.replace(',', '{,}')} / 2^{{30}} ="
                f" {gib:.2f}$, which is {gib:.1f} GiB to three significant figures, the precision"
                " the seed says it rounds to (appendix C.2)."
            ),
        ]
    )


def placement_reading(gain_b200: float, gain_mi300x: float) -> str:
    """Notebook 10: the seed's placement gains assume a control that default memory modes do not
    expose."""
    gain_b200 = real("gain_b200", gain_b200)
    gain_mi300x = real("gain_mi300x", gain_mi300x)
    return (
        f"The striped-against-pinned gains ({gain_b200:.0f}x on a B200, {gain_mi300x:.0f}x on an"
        " MI300X) are the seed's model, not a choice a block manager can make today. In their"
        " default modes both packages interleave physical addresses across all their HBM stacks:"
        " every allocation is already striped, and an engine cannot ask for a page on one die. A"
        " B200 appears to software as one device with one address space. An MI300X exposes"
        " locality only when partitioned: its NPS4 memory mode with CPX compute partitions makes"
        " each quarter of the memory local to its own chiplets, and each partition is then a"
        " separate device with its share of the bandwidth, so the 'pinned' rate becomes the whole"
        " device's rate rather than a penalty a scheduler avoids. The model still says what"
        " interleaving is worth, and what a placement API, if one appeared, would have to"
        " preserve."
    )


def rule3_reading(
    shape_name: str, device_name: str, context: int, speedup_c4: float, bf16, int4
) -> str:
    """Notebook 10: the scope of design rule 3, in numbers."""
    speedup_c4 = real("speedup_c4", speedup_c4)
    text = (
        "Rule 3 is about step time at a fixed batch: below $s^*$ a 4-bit cache would shorten a"
        f" step of one sequence only {speedup_c4:.2f}x. It does not make compression useless in the"
        " weight-bound regime. Where capacity limits the batch, compression changes the batch: at"
        f" {context:,} tokens, {shape_name} on the {device_name} admits **{bf16.batch}"
        f" sequence{'s' * (bf16.batch != 1)} in bf16** and **{int4.batch} with a 4-bit cache**."
    )
    if bf16.batch and int4.batch:
        text += (
            " Their steps read about the same bytes, so the step floor stays near"
            f" {si(bf16.step_time, 's')} ({si(int4.step_time, 's')} with 4-bit KV) while tokens/s"
            f" rises from {bf16.tokens_per_s:,.0f} to {int4.tokens_per_s:,.0f},"
            f" **{int4.tokens_per_s / bf16.tokens_per_s:.1f} times**."
        )
    return (
        text + " The rule's scope, then: below $s^*$, do not compress the cache to make a step"
        " faster; do "
        "compress it when capacity, not bandwidth, caps the batch."
    )


def margins_table(
    shapes=("llama-3-8b", "mistral-7b", "llama-2-13b", "llama-3-70b"), w_p: float = 2
) -> str:
    """Notebook 10: memory left beside bf16 weights, the seed's decimal constants against the memory
    the driver reports and the unrounded parameter counts, on every device whose exposed memory is
    known.
    """
    w_p = positive("w_p", w_p)
    from kvlab.theory.specs import SPECS

    devices = [k for k, a in SPECS.items() if a.hbm_bytes_exposed is not None]
    head = (
        "| model (bf16) | "
        + " | ".join(
            f"{SPECS[d].name}, seed's {SPECS[d].hbm_bytes / 1e9:.0f}e9 B | "
            f"as exposed, {SPECS[d].hbm_bytes_exposed / GIB:.1f} GiB"
            for d in devices
        )
        + " |"
    )
    rule = "|---|" + "---:|" * (2 * len(devices))

    def cell(margin):
        return f"{margin / 1e9:,.1f} GB" if margin > 0 else "does not fit"

    rows = []
    for key in shapes:
        seed_shape, real = SHAPES[key], _real(SHAPES[key])
        cells = [
            f"{cell(free_beside_weights(seed_shape, d, w_p))} |"
            f" {cell(free_beside_weights(real, exposed_memory(d), w_p))}"
            for d in devices
        ]
        rows.append(f"| {seed_shape.name} | " + " | ".join(cells) + " |")
    return (
        "Memory left beside the weights, with the seeds' rounded constants and with the memory each"
        " device exposes and the models' parameters counted from their shapes:\n\n"
        + "\n".join([head, rule, *rows])
    )
