"""kvlab.theory.cache_sizes: Table 9.3 and its extensions, GQA's cache per grouping, and quantized
bytes."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab import SHAPES
from kvlab.theory.cache_sizes import (
    cache_bytes,
    design_table,
    gqa_cache_bytes,
    kivi_nbytes,
    quantized_nbytes,
    window_span,
)

GIB = 2**30


def test_table_9_3_exact():
    # Seed 000, Table 9.3: Llama 3 8B-like shape, 131,072 tokens, BF16 unless stated.
    rows = {d.name: d for d in design_table("llama-3-8b", 131_072, window=4096)}
    assert rows["Full multi-head attention"].bytes == 64 * GIB
    assert rows["Grouped-query attention"].bytes == 16 * GIB
    assert rows["Grouped-query attention, FP8 cache"].bytes == 8 * GIB
    assert rows["Grouped-query, 4,096-token window"].bytes == 0.5 * GIB
    assert rows["Grouped-query, 4,096-token window"].tokens_stored == 4096
    assert cache_bytes("llama-3-8b", 131_072, 2, kv_heads=32) == 2 * 131_072 * 32 * 32 * 128 * 2


def test_deepseek_v2_latent_bytes_per_token():
    # Seed 004, section 2.1: (512 + 64) x 60 layers x 2 bytes = 69,120 bytes per token.
    assert cache_bytes("deepseek-v2", 1) == 69_120
    assert cache_bytes("deepseek-v2", 1000) == 69_120_000


def test_mistral_window_span_and_rolling_cache():
    # Seed 000, 9.7: W = 4,096 over 32 layers spans "about 131,000" tokens; 8x less cache at 32k.
    assert window_span(4096, 32) == 131_072
    mistral = kvlab.SHAPES["mistral-7b"]
    full = cache_bytes(mistral, 32_768, window=32_768)
    assert full / cache_bytes(mistral, 32_768) == 8


def test_hybrid_and_mla_rows_add_up():
    rows = {d.name: d for d in design_table("llama-3-8b", 131_072, window=4096, global_layers=8)}
    per_layer_full = 16 * GIB / 32
    hybrid = next(d for n, d in rows.items() if n.startswith("Hybrid"))
    assert hybrid.bytes == 8 * per_layer_full + 24 * per_layer_full / 32
    mla = next(d for n, d in rows.items() if n.startswith("MLA"))
    assert mla.bytes == 131_072 * 32 * 576 * 2


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(window=0), "window"), (dict(kv_heads=3), "kv_heads"), (dict(tokens=0), "tokens")],
)
def test_cache_bytes_rejects_bad_input(kwargs, match):
    args = dict(shape="llama-3-8b", tokens=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        cache_bytes(**args)


def test_gqa_cache_bytes_against_the_seeds():
    llama8b = SHAPES["llama-3-8b"]
    rows = {r.group: r for r in gqa_cache_bytes(llama8b, context=8192)}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32]
    # Seed 000, section 9.3: 131,072 bytes per retained token for Llama 3 8B (8 KV heads, group 4).
    assert rows[4].kv_heads == 8 and rows[4].bytes_per_token == 131_072
    # Table 9.1: one 8,192-token sequence holds 1.07 GB of cache.
    assert round(rows[4].bytes_per_sequence / 1e9, 2) == 1.07
    # Per layer and token: 2 * 8 * 128 * 2 bytes (the seed's attention-intensity example).
    assert rows[4].bytes_per_token / llama8b.layers == 2 * 8 * 128 * 2
    for group, row in rows.items():  # bytes fall exactly with the group
        assert row.bytes_per_token * group == rows[1].bytes_per_token
    # Llama-2-13B is multi-head: group 1 is its published cache.
    assert (
        gqa_cache_bytes(SHAPES["llama-2-13b"], 1, groups=[1])[0].bytes_per_token
        == 2 * 40 * 40 * 128 * 2
    )


def test_bad_gqa_arguments_are_rejected():
    with pytest.raises(
        ValueError, match=r"group must divide Llama-3-8B's 32 query heads; allowed: \[1, 2, 4"
    ):
        gqa_cache_bytes(SHAPES["llama-3-8b"], 1024, groups=[3])
    with pytest.raises(ValueError, match="MLA"):
        gqa_cache_bytes(SHAPES["deepseek-v2"], 1024)
    with pytest.raises(TypeError, match="shape must be a kvlab ModelShape"):
        gqa_cache_bytes("llama-3-8b", 1024)
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        gqa_cache_bytes(SHAPES["llama-3-8b"], 0)


def test_cache_bytes_full_attention_reads_forwards():

    full = cache_bytes("mistral-7b", 32_768, full=True)
    assert full == 2 * 32_768 * 32 * 8 * 128 * 2  # no window: every token, every layer
    assert full / cache_bytes("mistral-7b", 32_768) == 8  # against its own 4,096-token window
    assert cache_bytes("llama-3-8b", 1000, full=True) == cache_bytes("llama-3-8b", 1000)
    with pytest.raises(ValueError, match="not both"):
        cache_bytes("mistral-7b", 32_768, window=4096, full=True)
    with pytest.raises(TypeError, match="full must be a bool"):
        cache_bytes("mistral-7b", 32_768, full=1)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "cache_bytes negative width": (
        lambda: cache_bytes("llama-3-8b", 1024, bytes_per_element=-2),
        ValueError,
        r"bytes_per_element must be a finite number > 0",
    ),
    "design_table gqa_heads": (
        lambda: design_table(gqa_heads=3),
        ValueError,
        r"gqa_heads must divide the 32 query heads",
    ),
    "quantized_nbytes 3 bits": (
        lambda: quantized_nbytes(64, 3, 8),
        ValueError,
        r"bits must be one of",
    ),
    "quantized_nbytes ragged": (
        lambda: quantized_nbytes(60, 4, 8),
        ValueError,
        "multiple of group_size",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {
    "cache_bytes tokens": (lambda x: cache_bytes("llama-3-8b", x), "tokens", 1),
    "window_span window": (lambda x: window_span(x, 4), "window", 1),
}


@pytest.mark.parametrize("name", INTEGER_ARGUMENTS)
@settings(max_examples=12, deadline=None)
@given(
    value=st.one_of(
        st.integers(max_value=-1), st.sampled_from([0.5, 2.0, "3", None, True, math.nan])
    )
)
def test_integer_arguments_refuse_what_is_not_an_int_in_range(name, value):
    call, argument, low = INTEGER_ARGUMENTS[name]
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return
    with pytest.raises(
        TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError,
        match=argument,
    ):
        call(value)


def test_rounding_model_explains_within_its_tolerance():
    from kvlab.theory.cache_sizes import ROUNDING_TOLERANCE, rounding_explains, rounding_rms

    assert rounding_rms(1.0) == pytest.approx(1 / 12**0.5)
    predicted = rounding_rms(0.5)
    for scale, explained in (
        (1 + 0.9 * ROUNDING_TOLERANCE, True),
        (1 + 1.1 * ROUNDING_TOLERANCE, False),
        (1 - 0.9 * ROUNDING_TOLERANCE, True),
        (1 - 1.1 * ROUNDING_TOLERANCE, False),
    ):
        assert rounding_explains(scale * predicted, 0.5) is explained
    assert not rounding_explains(0.0, 0.0)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: gqa_cache_bytes(SHAPES["llama-3-8b"], 128, groups=4),
            TypeError,
            "groups must be a list of ints",
        ),
        (
            lambda: gqa_cache_bytes(SHAPES["llama-3-8b"], 128, groups=[True]),
            TypeError,
            r"groups\[0\] must be an int",
        ),
        (
            lambda: kivi_nbytes(128, 64, 2, 32, 32, element_bytes=math.inf),
            ValueError,
            "element_bytes must be a finite",
        ),
        (
            lambda: kivi_nbytes(128, 64, 2, 32, 32, element_bytes=True),
            TypeError,
            "element_bytes must be",
        ),
    ],
)
def test_cache_sizes_refuse_bad_groups_and_element_sizes(call, error, match):
    """issue 22: not "'int' object is not iterable", nor an infinite number of bytes."""
    with pytest.raises(error, match=match):
        call()
