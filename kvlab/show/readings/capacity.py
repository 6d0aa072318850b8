"""Notebooks 03 and 10, GEMV-like decode (section 9.3) and the memory wall: readings on memory capacity.

The marketed figures the sources compute with (Decode and KV Cache chapter, 2026; KV Cache Memory
Wall, 2026), against the memory a device really exposes and a model's unrounded parameter count.
"""

from __future__ import annotations

import dataclasses

from kvlab.theory.specs import exposed_memory, spec
from kvlab.theory.shapes import SHAPES
from kvlab.theory.roofline import free_beside_weights, max_batch, ridge_batch

GIB = 2**30


def _real(shape):
    return dataclasses.replace(shape, params=shape.counted_params())


def largest_batch_reading(context: int = 2048) -> str:
    """Notebook 03: the largest admitted batch of the 8B model on an H100, seed's constants against real ones."""
    seed8 = dataclasses.replace(SHAPES["llama-3-8b"], params=8e9)
    h100, real_h100 = spec("h100-sxm"), exposed_memory("h100-sxm")
    seed_batch = max_batch(seed8, h100, context)
    real_batch = max_batch(_real(SHAPES["llama-3-8b"]), real_h100, context)
    text = (f"The seed reads \"80 GB\" as {h100.hbm_bytes / 1e9:.0f}e9 bytes, and this page keeps that to "
            f"reproduce its table. The marketed figure is binary-ish: an H100 80 GB exposes "
            f"{real_h100.hbm_bytes / GIB:.1f} GiB, {real_h100.hbm_bytes / 1e9:.1f}e9 bytes. With that memory and "
            f"the 8B model's unrounded {SHAPES['llama-3-8b'].counted_params() / 1e9:.2f}e9 parameters, the "
            f"largest batch of {context:,}-token sequences is **{real_batch}** instead of {seed_batch}.")
    b_ridge = round(ridge_batch(h100))
    if real_batch < b_ridge:
        text += (f" More room, the same conclusion: the ridge batch of {b_ridge} still does not fit.")
    else:
        text += (f" That reaches the ridge batch of {b_ridge}: with the real capacity, the weight products could "
                 "just reach the ridge before capacity binds.")
    return text + (" (A serving engine also keeps memory for activations and its own workspace, which pulls "
                   "the figure back down.)")


def h200_margin_reading(context_cap_seed: float) -> str:
    """Notebook 10: the H200 margin beside Llama-3-70B's weights, rounded and real."""
    l70 = SHAPES["llama-3-70b"]
    seed_margin = free_beside_weights(l70, "h200")
    real = _real(l70)
    real_h200 = exposed_memory("h200")
    real_margin = free_beside_weights(real, real_h200)
    real_cap = real_margin / real.kv_bytes_per_token(2)
    h200 = spec("h200")
    return (f"With the seed's constants, {h200.hbm_bytes / 1e9:.0f}e9 bytes of HBM less {l70.params * 2 / 1e9:.0f}e9 bytes of weights "
            f"leave **{seed_margin / 1e9:.0f} GB**, room for {context_cap_seed:,.0f} tokens of cache. Both inputs "
            f"are rounded. An H200 sold as {h200.hbm_bytes / 1e9:.0f} GB exposes {real_h200.hbm_bytes / GIB:.1f} GiB, "
            f"{real_h200.hbm_bytes / 1e9:.1f}e9 bytes, and Llama-3-70B's matrices hold "
            f"{real.params / 1e9:.2f}e9 parameters ({real.params * 2 / 1e9:.1f}e9 bytes in bf16). The real margin is "
            f"**{real_margin / 1e9:.1f} GB**, room for about {real_cap:,.0f} tokens: still a thin margin for a "
            f"128k context, but not the {seed_margin / 1e9:.0f} GB the rounding makes of it.")


def kivi_residual_reading(tokens: int, residual: int, group_size: int, bits: int, elements_per_token: int,
                          element_bytes: float, meta_bytes: int, held: float, long_tokens: int = 131_072) -> str:
    """Notebook 08: why a short KIVI cache saves far less than its bit width suggests."""
    from kvlab.theory.cache_sizes import kivi_nbytes, quantized_nbytes

    quantized = max(0, (tokens - residual) // group_size * group_size)
    full_bytes = tokens * elements_per_token * element_bytes
    per_token = quantized_nbytes(elements_per_token, bits, group_size, meta_bytes)
    codes_ratio = elements_per_token * element_bytes / per_token
    long_ratio = long_tokens * elements_per_token * element_bytes / kivi_nbytes(
        long_tokens, elements_per_token, bits, group_size, residual, element_bytes, meta_bytes)
    return (f"Why only {full_bytes / held:.1f} times? Of the {tokens} tokens held, {quantized} are quantized and "
            f"**{tokens - quantized} stay in full precision**: the residual window of {residual}, plus "
            f"{tokens - quantized - residual} newer ones that do not yet fill a whole group of {group_size}. A "
            f"quantized token costs 1/{codes_ratio:.1f} of a full one ({bits}-bit codes plus a scale and a zero "
            f"point per group), so the full-precision tokens hold most of the bytes. The residual stays "
            f"{residual} tokens however long the stream, so the saving grows toward {codes_ratio:.1f} times: "
            f"at {long_tokens:,} tokens it would be {long_ratio:.1f} times.")


def nvlink_reading(cache_bytes: float, codec: float, seed_seconds: float, recompute_seconds: float,
                   pcie_seconds: float) -> str:
    """Notebook 10: a one-way KV fetch over NVLink gets half the quoted (bidirectional) figure."""
    from kvlab.theory.specs import LINKS
    from kvlab.show.format import si
    from kvlab.theory.roofline import transfer_time

    nvlink, pcie = LINKS["nvlink4"], LINKS["pcie5-x16"]
    one_way = transfer_time(cache_bytes, nvlink.bytes_per_s_each_way, codec=codec)
    return (f"One correction to the seed's arithmetic. NVIDIA quotes NVLink as the total of both directions, "
            f"{nvlink.bytes_per_s_both_ways / 1e9:,.0f} GB/s on an H100; a fetch moves the cache one way, at "
            f"{nvlink.bytes_per_s_each_way / 1e9:,.0f} GB/s. PCIe's {pcie.bytes_per_s_each_way / 1e9:.0f} GB/s is "
            f"already per direction. So the codec-compressed fetch over NVLink takes **{si(one_way, 's')}**, "
            f"{one_way / seed_seconds:.0f} times the seed's {si(seed_seconds, 's')}, and the fetch path is "
            f"{recompute_seconds / pcie_seconds:.0f}x to {recompute_seconds / one_way:,.0f}x faster than recompute "
            f"rather than {recompute_seconds / seed_seconds:,.0f}x at the top. The conclusion stands: tier for "
            "reuse, never for reads within a step.")


def placement_reading(gain_b200: float, gain_mi300x: float) -> str:
    """Notebook 10: the seed's placement gains assume a control that default memory modes do not expose."""
    return (f"The striped-against-pinned gains ({gain_b200:.0f}x on a B200, {gain_mi300x:.0f}x on an MI300X) "
            "are the seed's model, not a choice a block manager can make today. In their default modes "
            "both packages interleave physical addresses across all their HBM stacks: every allocation is "
            "already striped, and an engine cannot ask for a page on one die. A B200 appears to software as "
            "one device with one address space. An MI300X exposes locality only when partitioned: its NPS4 "
            "memory mode with CPX compute partitions makes each quarter of the memory local to its own "
            "chiplets, and each partition is then a separate device with its share of the bandwidth, so "
            "the 'pinned' rate becomes the whole device's rate rather than a penalty a scheduler avoids. "
            "The model still says what interleaving is worth, and what a placement API, if one appeared, "
            "would have to preserve.")


def rule3_reading(shape_name: str, device_name: str, context: int, speedup_c4: float, bf16, int4) -> str:
    """Notebook 10: the scope of design rule 3, in numbers."""
    from kvlab.show.format import si

    text = (f"Rule 3 is about step time at a fixed batch: below $s^*$ a 4-bit cache would shorten a step of "
            f"one sequence only {speedup_c4:.2f}x. It does not make compression useless in the weight-bound "
            f"regime. Where capacity limits the batch, compression changes the batch: at {context:,} tokens, "
            f"{shape_name} on the {device_name} admits **{bf16.batch} sequence{'s' * (bf16.batch != 1)} in bf16** "
            f"and **{int4.batch} with a 4-bit cache**.")
    if bf16.batch and int4.batch:
        text += (f" Their steps read about the same bytes, so the step floor stays near {si(bf16.step_time, 's')} "
                 f"({si(int4.step_time, 's')} with 4-bit KV) while tokens/s rises from {bf16.tokens_per_s:,.0f} to "
                 f"{int4.tokens_per_s:,.0f}, **{int4.tokens_per_s / bf16.tokens_per_s:.1f} times**.")
    return text + (" The rule's scope, then: below $s^*$, do not compress the cache to make a step faster; do "
                   "compress it when capacity, not bandwidth, caps the batch.")


def margins_table(shapes=("llama-3-8b", "mistral-7b", "llama-2-13b", "llama-3-70b"), w_p: float = 2) -> str:
    """Notebook 10: memory left beside bf16 weights, the seed's decimal constants against the memory
    the driver reports and the unrounded parameter counts, on every device whose exposed memory is known."""
    from kvlab.theory.specs import SPECS

    devices = [k for k, a in SPECS.items() if a.hbm_bytes_exposed is not None]
    head = "| model (bf16) | " + " | ".join(f"{SPECS[d].name}, seed's {SPECS[d].hbm_bytes / 1e9:.0f}e9 B | "
                                            f"as exposed, {SPECS[d].hbm_bytes_exposed / GIB:.1f} GiB" for d in devices) + " |"
    rule = "|---|" + "---:|" * (2 * len(devices))

    def cell(margin):
        return f"{margin / 1e9:,.1f} GB" if margin > 0 else "does not fit"

    rows = []
    for key in shapes:
        seed_shape, real = SHAPES[key], _real(SHAPES[key])
        cells = [f"{cell(free_beside_weights(seed_shape, d, w_p))} | {cell(free_beside_weights(real, exposed_memory(d), w_p))}"
                 for d in devices]
        rows.append(f"| {seed_shape.name} | " + " | ".join(cells) + " |")
    return ("Memory left beside the weights, with the seeds' rounded constants and with the memory each "
            "device exposes and the models' parameters counted from their shapes:\n\n"
            + "\n".join([head, rule, *rows]))
