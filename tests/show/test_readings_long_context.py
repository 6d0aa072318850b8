"""kvlab.show.readings.long_context: page 08's readings, each fed both outcomes of the rule that
decides it (kvlab.theory.long_context), with inputs computed by that rule on both sides of its
boundary."""

import re
import statistics
from types import SimpleNamespace

from kvlab.show.readings import long_context as r
from kvlab.theory import long_context as lc
from kvlab.theory.cache_sizes import ROUNDING_TOLERANCE, rounding_rms

NOISE = [0.3, -0.1, 0.2, -0.4, 0.0, 0.1, -0.2, 0.1]


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    assert not re.search(r"\d\.\d{5,}", text), text  # no raw float reaches the reader
    return text


def spread(scale: float) -> lc.Spread:
    """A Spread whose mean is ``scale`` times its own half width: resolved beyond +-1, not
    within."""
    base = [2.0] * len(NOISE)
    centred = [d - statistics.fmean(NOISE) for d in NOISE]
    half = lc.paired_spread(base, [2.0 + d for d in centred]).half_width
    sp = lc.paired_spread(base, [2.0 + d + scale * half for d in centred])
    assert sp.resolved is (abs(scale) > 1)
    return sp


RESOLVED_UP, RESOLVED_DOWN, NOISY = spread(1.1), spread(-1.1), spread(0.9)


def test_model_and_check_readings_quote_what_they_are_given():
    shape = SimpleNamespace(layers=30, q_heads=9, kv_heads=3, head_dim=64)
    text = no_roles(
        r.model_reading("SmolLM2-135M-Instruct", 134_515_008, shape, 8192, 5_000, "float32")
    )
    assert (
        "134.5 M parameters" in text
        and "Q4_1" in text
        and "8,192" in text
        and "5,000 tokens" in text
    )
    assert "agree" not in r.check_reading(2, 16, 48, 3e-6, 18) and "18 tokens" in r.check_reading(
        2, 16, 48, 3e-6, 18
    )


def test_sink_reading_takes_the_rule_on_both_sides():
    uniform = 0.02
    at = lc.sink_threshold(uniform)
    sinks = [[1.1 * at, 0.9 * at], [0.5 * at, 1.5 * at]]
    none = [[0.9 * at, 0.5 * at], [0.1 * at, 0.2 * at]]
    both = no_roles(r.sink_reading(sinks, sinks, uniform, 256))
    assert "**2 of the model's 4 heads are sinks**" in both and "first *position*" in both
    assert "layers 0–1" in both and "30%" in both
    assert "has none" in no_roles(r.sink_reading(sinks, none, uniform, 256))
    absent = no_roles(r.sink_reading(none, none, uniform, 256))
    assert "No head is a sink here" in absent and "this run did not" in absent
    assert "first position draws attention" in r.sink_reading(none, sinks, uniform, 256)


def stream_spreads(window_full, window_sinks, sinks_full, recompute_sinks):
    return {
        "window - full": window_full,
        "window - sinks": window_sinks,
        "sinks - full": sinks_full,
        "recompute - sinks": recompute_sinks,
    }


def test_stream_reading_both_outcomes():
    ppl = {
        "full": 20.0,
        "window": 60.0,
        "sinks": 22.0,
        "recompute": 23.0,
        "sinks at recompute": 22.5,
    }
    usual = no_roles(
        r.stream_reading(
            4, 64, 512, ppl, stream_spreads(RESOLVED_UP, RESOLVED_UP, NOISY, NOISY), 16
        )
    )
    assert "the collapse StreamingLLM reports" in usual and "buys back" in usual
    assert "**20.0** with the full cache (511 tokens" in usual and "{" not in usual  # no raw field
    assert "within the noise of the full cache" in usual and "as StreamingLLM found" in usual
    odd = no_roles(
        r.stream_reading(
            4, 64, 512, ppl, stream_spreads(NOISY, NOISY, RESOLVED_UP, RESOLVED_DOWN), 16
        )
    )
    assert (
        "StreamingLLM expects the window alone to collapse" in odd
        and "expected to buy that back" in odd
    )
    assert "what the evicted middle" in odd and "recomputation is better" in odd
    better = r.stream_reading(4, 64, 512, ppl, stream_spreads(NOISY, NOISY, NOISY, RESOLVED_UP), 16)
    assert "the sinks are better" in better
    alone = no_roles(r.stream_reading(0, 64, 512, ppl, {"window - full": RESOLVED_UP}, 16))
    assert "Move the slider" in alone and "sinks plus" not in alone


def test_sink_count_reading_both_outcomes():
    ppl = {0: 60.0, 1: 22.0, 4: 22.1}
    context = 8192
    inside, beyond = int(0.9 * context), int(1.1 * context)  # either side of lc.unseen_distances
    four_better = no_roles(r.sink_count_reading(64, ppl, RESOLVED_DOWN, NOISY, inside, context, 4))
    assert (
        "Four sinks beat one" in four_better
        and f"as expected while the {inside}-token stream" in four_better
    )
    four_worse = r.sink_count_reading(64, ppl, RESOLVED_UP, RESOLVED_UP, inside, context, 4)
    assert (
        "Four sinks are worse than one" in four_worse
        and "although no distance here exceeds" in four_worse
    )
    same = r.sink_count_reading(64, ppl, NOISY, RESOLVED_UP, beyond, context, 4)
    assert "cannot tell one from four" in same and "only the in-cache positions" in same
    assert "sinks' large distances did not matter" in r.sink_count_reading(
        64, ppl, NOISY, NOISY, beyond, context, 4
    )


def test_channel_reading_takes_the_outlier_rule():
    f = lc.OUTLIER_FACTOR
    keys, values = [1.1 * f, 1.0, 1.0], [0.9 * f, 1.0, 1.0]
    yes = no_roles(r.channel_reading([1.1 * f], [0.9 * f], keys, values))
    assert "The keys have outlier channels" in yes and "1 of 3 key channels and 0 of 3" in yes
    no = no_roles(r.channel_reading([1.1 * f], [1.1 * f], keys, keys))
    assert "no more outlier channels than the values" in no


def test_kivi_layout_reading_takes_the_spread():
    ppl = {(4, "channel"): 20.1, (4, "token"): 20.3, (2, "channel"): 30.0, (2, "token"): 45.0}
    text = no_roles(r.kivi_layout_reading(ppl, 20.0, {4: NOISY, 2: RESOLVED_UP}, 8, 64, 32))
    assert "**KIVI's choice, measured**" in text and "**within the spread**" in text
    assert text.index("At 4 bits") < text.index("At 2 bits")
    assert "KIVI predicts the opposite" in r.kivi_layout_reading(
        ppl, 20.0, {2: RESOLVED_DOWN}, 8, 64, 32
    )


def test_fewer_reading_table_and_both_outcomes():
    rows = [
        dict(name="full cache", bytes_per_token=23040, ppl=20.0, kl=0.0),
        dict(name="GQA, 1 KV head (pooled)", bytes_per_token=7680, ppl=900.0, kl=3.1),
        dict(name="latent, rank 128", bytes_per_token=7680, ppl=300.0, kl=2.0),
        dict(name="latent, rank 384", bytes_per_token=23040, ppl=20.0, kl=2e-7),
    ]
    names = ("GQA, 1 KV head (pooled)", "latent, rank 128")
    better = no_roles(r.fewer_reading(rows, RESOLVED_DOWN, *names))
    assert (
        "the latent cache is better" in better
        and "| latent, rank 384 | 23,040 | 20.0 | 2e-07 |" in better
    )
    assert "rank 384: KL 2.0e-07" in better
    assert "the pooled GQA cache is better" in r.fewer_reading(rows, RESOLVED_UP, *names)
    assert "within the noise" in r.fewer_reading(rows, NOISY, *names)


def test_spread_text_shows_a_narrow_interval_with_more_decimals():
    narrow = lc.Spread(mean=-0.0004, half_width=0.012, n=13, smallest=-0.02, largest=0.02)
    assert r.spread_text(
        narrow, "blocks"
    ) == "-0.000 nats per token (95% interval -0.012 to +0.012 over 13 blocks)".replace(
        "-0.000", "±0.000"
    )
    assert r.spread_text(RESOLVED_UP, "windows").startswith(f"+{RESOLVED_UP.mean:.2f} nats")


def test_rerotation_and_kivi_readings_quote_their_numbers():
    text = no_roles(r.rerotation_reading(95, 0, 1.234, 0.56, 0.12))
    assert "1.23 standard deviations" in text and "0.56" in text and "(0.12 when" in text
    k = no_roles(r.kivi_reading(2, 32, 1.8, 0.0012, 0.98))
    assert "1.8 times" in k and "0.0012 nats" in k and "98%" in k


def test_quant_reading_takes_the_rounding_model_on_both_sides():
    cases = [(b, layout) for b in (2, 4) for layout in ("per-channel keys", "per-token keys")]
    steps = {c: 0.4 for c in cases} | {
        (2, "per-token keys"): 0.5
    }  # per-token groups span the outliers
    inside = {c: (1 + 0.9 * ROUNDING_TOLERANCE) * rounding_rms(steps[c]) for c in cases}
    outside = inside | {(2, "per-token keys"): (1 + 1.1 * ROUNDING_TOLERANCE) * rounding_rms(0.5)}
    good = no_roles(r.quant_reading(2, 32, 0.1, 0.3, 0.1, 0.3, 0.2, inside, steps, 6.4))
    assert (
        "only the outlier channels pay" in good
        and "matches every measured RMS error within 25%" in good
    )
    assert "6.4 times fewer bytes than FP16 keys, not 8 times" in good
    odd = no_roles(r.quant_reading(2, 16, 0.3, 0.1, 0.3, 0.1, 0.2, outside, steps, 4.0))
    assert "misses 1 of the 4 measured errors" in odd and "2-bit, per-token keys" in odd


def test_quant_reading_orders_the_layouts_by_the_rounding_model():
    """The order the rounding model predicts from the two steps, on both sides of equal steps,
    against the measured order: agreeing either way, and contradicted."""
    cases = [(b, layout) for b in (2, 4) for layout in ("per-channel keys", "per-token keys")]
    base = {c: 0.4 for c in cases}
    finer_pc = base | {(2, "per-channel keys"): 0.9 * 0.4, (2, "per-token keys"): 1.1 * 0.4}
    finer_pt = base | {(2, "per-channel keys"): 1.1 * 0.4, (2, "per-token keys"): 0.9 * 0.4}
    measured = {c: rounding_rms(v) for c, v in finer_pc.items()}
    pc, pt = (
        rounding_rms(finer_pc[2, "per-channel keys"]),
        rounding_rms(finer_pc[2, "per-token keys"]),
    )
    agree = no_roles(r.quant_reading(2, 32, pc, pt, 0.1, 0.3, 0.2, measured, finer_pc, 6.4))
    assert (
        "Per-channel keys are finer, as the uniform-rounding model" in agree
        and "only the outlier channels pay" in agree
    )
    small = no_roles(r.quant_reading(2, 4, pt, pc, 0.3, 0.1, 0.2, measured, finer_pt, 6.4))
    assert "Per-token keys are finer here, as" in small and "rarely spans an outlier" in small
    against = no_roles(r.quant_reading(2, 32, pc, pt, 0.1, 0.3, 0.2, measured, finer_pt, 6.4))
    assert (
        "opposite of the order" in against
        and f"{rounding_rms(1.1 * 0.4):.3f} per-channel" in against
    )


def test_fp8_reading_gives_bytes_and_a_verdict_on_each_side_of_the_spread():
    from kvlab.show.readings.long_context import fp8_reading
    from kvlab.theory.long_context import paired_spread

    held = {"full": 4000, "fp8": 1000, "int4": 560}
    clear = paired_spread([1.0, 1.1, 0.9, 1.0], [1.2, 1.31, 1.1, 1.21])  # +0.2 every window
    noisy = paired_spread([1.0, 1.1, 0.9, 1.0], [1.3, 0.9, 1.0, 0.95])
    text = fp8_reading(38.8, 39.1, clear, held, 39.8)
    assert "4.0 times less than the full cache" in text and "1.8 times less again" in text
    assert "larger than the spread" in text and 'kv_cache_dtype="fp8"' in text
    assert "**within the spread**" in fp8_reading(38.8, 38.9, noisy, held, 39.8)


def test_needle_reading_names_what_eviction_forgot_and_what_it_kept():
    from kvlab.lab.streams import NeedleProbe
    from kvlab.show.readings.long_context import needle_reading

    probes = [NeedleProbe(0.5, 149, False, 0.76, 15.91), NeedleProbe(0.9, 47, True, 0.94, 0.99)]
    text = needle_reading(probes, 4, 60, " 4817")
    assert "probability 0.47, 0.39" in text  # exp(-0.76), exp(-0.94)
    assert "the needle 149 tokens back has left the cache" in text and "15.2 nats lost" in text
    assert "(47 tokens back) the evicting cache scores 0.37" in text
    assert "left the cache" not in needle_reading(probes[1:], 4, 60, " 4817")


def test_kivi_residual_quality_reading_compares_with_the_worst_case():
    from kvlab.show.readings.long_context import kivi_residual_quality_reading

    text = kivi_residual_quality_reading(
        2, 32, 64, {"ppl": 45.0, "nbytes": 3000}, {"ppl": 92.2, "nbytes": 1000}
    )
    assert "a residual of 32 of each window's 64 tokens" in text
    assert "scores 45.0, against 92.2 with no residual" in text and "3.0 times the bytes" in text
