"""kvlab.cache.layout: caches in each layout read like fp64 attention, append, and refuse bad input
unchanged."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cache import layout as L
from kvlab.cache.addresses import LAYOUTS, PAGED
from kvlab.lab.layout_timing import measure_read, read_traffic


def codes(layers, batch, tokens, heads, dim):
    """Canonical [layer, seq, token, head, dim] tensor whose value is the element's row-major index
    (fp64, exact for these sizes: keys and values are floating point)."""
    return torch.arange(layers * batch * tokens * heads * dim, dtype=torch.float64).view(
        layers, batch, tokens, heads, dim
    )


def contiguous_oracle(layout, canonical):
    return (
        canonical.permute(0, 1, 3, 2, 4).contiguous()
        if layout == "BHTD"
        else canonical.contiguous()
    )


def paged_oracle(layout, canonical, table, num_blocks, block_size):
    """The pool built block by block with a loop: token j*S+o of sequence b at block table[b][j],
    slot o."""
    layers, batch, tokens, heads, dim = canonical.shape
    shape = (
        (layers, num_blocks, block_size, heads, dim)
        if layout == "NHD"
        else (layers, num_blocks, heads, block_size, dim)
    )
    pool = torch.full(shape, -1, dtype=torch.float64)
    for b in range(batch):
        for t in range(tokens):
            block, slot = int(table[b][t // block_size]), t % block_size
            if layout == "NHD":
                pool[:, block, slot] = canonical[:, b, t]
            else:
                pool[:, block, :, slot] = canonical[:, b, t]
    return pool


def random_table(batch, per_seq, num_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randperm(num_blocks, generator=g)[: batch * per_seq]
        .view(batch, per_seq)
        .to(torch.int32)
    )


sizes = st.tuples(
    st.integers(1, 3), st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(1, 9)
)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cache_from_dense_matches_the_independent_construction(layout):
    canonical = codes(2, 3, 21, 2, 4)
    cache = L.cache_from_dense(
        layout, canonical, canonical + 1, capacity=27, block_size=4, spare_blocks=5, seed=3
    )
    for pool, dense in ((cache.k, canonical), (cache.v, canonical + 1)):
        if layout in PAGED:
            table = cache.block_table
            assert table.dtype == torch.int32 and table.shape == (3, 7)
            assert len(set(table.flatten().tolist())) == table.numel()  # no block owned twice
            expected = paged_oracle(layout, dense, table.tolist(), cache.geometry.num_blocks, 4)
            held = expected >= 0
            assert torch.equal(pool[held], expected[held]) and not pool[~held].any()
        else:
            padded = torch.zeros(2, 3, 27, 2, 4, dtype=torch.float64)
            padded[:, :, :21] = dense
            assert torch.equal(pool, contiguous_oracle(layout, padded))


@pytest.mark.parametrize("layout", PAGED)
def test_cache_from_dense_takes_a_given_block_table(layout):
    canonical = codes(2, 2, 40, 3, 4)
    table = [[7, 2, 15], [0, 11, 3]]  # request A is the seed's example (section 9.5)
    cache = L.cache_from_dense(layout, canonical, canonical, block_size=16, block_table=table)
    assert cache.block_table.tolist() == table and cache.geometry.num_blocks == 16
    expected = paged_oracle(layout, canonical, table, 16, 16)
    held = expected >= 0
    assert torch.equal(cache.k[held], expected[held])
    with pytest.raises(
        ValueError, match=r"block_table must be \[batch, ceil\(capacity / block_size\)\] = \[2, 3\]"
    ):
        L.cache_from_dense(
            layout, canonical, canonical, block_size=16, block_table=[[7, 2], [0, 1]]
        )
    with pytest.raises(ValueError, match="must not give one physical block to two logical blocks"):
        L.cache_from_dense(
            layout, canonical, canonical, block_size=16, block_table=[[7, 2, 15], [0, 7, 3]]
        )
    with pytest.raises(ValueError, match="entries must be >= 0"):
        L.cache_from_dense(
            layout, canonical, canonical, block_size=16, block_table=[[7, 2, 15], [0, -1, 3]]
        )
    with pytest.raises(ValueError, match="applies to paged layouts"):
        L.cache_from_dense("BHTD", canonical, canonical, block_table=table)


def attention_fp64(q, k, v):
    """Decode attention from the definition: q [B, Hq, D], k and v [B, T, Hkv, D]; head i uses KV
    head i // g."""
    group = q.shape[1] // k.shape[2]
    k = k.double().repeat_interleave(group, dim=2)
    v = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.double(), k) / math.sqrt(q.shape[2])
    return torch.einsum("bht,bthd->bhd", scores.softmax(-1), v)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_read_equals_fp64_attention(layout, group, dtype):
    g = torch.Generator().manual_seed(group)
    batch, kv_heads, dim, block_size = 3, 2, 16, 8
    for length in (1, block_size - 1, block_size, block_size + 1, 45):
        k = torch.randn(2, batch, length, kv_heads, dim, generator=g).to(dtype)
        v = torch.randn(2, batch, length, kv_heads, dim, generator=g).to(dtype)
        q = torch.randn(batch, kv_heads * group, dim, generator=g).to(dtype)
        cache = L.cache_from_dense(
            layout, k, v, capacity=length + 3, block_size=block_size, spare_blocks=7
        )
        out = L.decode_read(cache, q, layer=1)
        assert out.shape == q.shape and out.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(out.double(), attention_fp64(q, k[1], v[1]), atol=tol, rtol=tol)
        kv, moved = read_traffic(cache)
        assert kv == 2 * batch * length * kv_heads * dim * k.element_size()
        assert moved == kv if layout not in PAGED else moved > 3 * kv - 1


@pytest.mark.parametrize(
    "layout,method", [(lay, m) for lay in LAYOUTS for m in L.APPEND_METHODS[lay]]
)
def test_append_then_read_sees_the_new_token(layout, method):
    g = torch.Generator().manual_seed(7)
    layers, batch, length, kv_heads, dim = 2, 3, 17, 2, 8
    k = torch.randn(layers, batch, length, kv_heads, dim, generator=g)
    v = torch.randn(layers, batch, length, kv_heads, dim, generator=g)
    capacity = length if method == "cat" else length + 2
    cache = L.cache_from_dense(layout, k, v, capacity=capacity, block_size=4, spare_blocks=4)
    for _ in range(2):
        k_new = torch.randn(layers, batch, kv_heads, dim, generator=g)
        v_new = torch.randn(layers, batch, kv_heads, dim, generator=g)
        L.append_token(cache, k_new, v_new, method)
        k = torch.cat([k, k_new.unsqueeze(2)], dim=2)
        v = torch.cat([v, v_new.unsqueeze(2)], dim=2)
    assert cache.length == length + 2
    q = torch.randn(batch, 2 * kv_heads, dim, generator=g)
    for layer in range(layers):
        torch.testing.assert_close(
            L.decode_read(cache, q, layer).double(),
            attention_fp64(q, k[layer], v[layer]),
            atol=1e-5,
            rtol=1e-5,
        )
    # The last token sits where the address function says, in K and in V.
    offset = cache.geometry.address(1, 2, length + 1, 1, 5, block_table=cache.block_table)
    assert cache.k.flatten()[offset] == k[1, 2, length + 1, 1, 5]
    assert cache.v.flatten()[offset] == v[1, 2, length + 1, 1, 5]


def test_bad_cache_operations_are_rejected():
    cache = L.new_cache("BHTD", batch=2, length=4, kv_heads=2, head_dim=8, capacity=4, device="cpu")
    new = torch.zeros(1, 2, 2, 8)
    with pytest.raises(ValueError, match="the cache is full"):
        L.append_token(cache, new, new, "index")
    with pytest.raises(
        ValueError, match=r"method \(for layout BHTD\) must be one of \('index', 'cat'\)"
    ):
        L.append_token(cache, new, new, "slot")
    with pytest.raises(ValueError, match=r"k_new must be \[layers, batch, kv_heads, head_dim\]"):
        L.append_token(cache, torch.zeros(2, 2, 8), new, "cat")
    with pytest.raises(TypeError, match="v_new must be torch.float32"):
        L.append_token(cache, new, new.half(), "cat")
    with pytest.raises(
        ValueError, match=r"q must be \[batch=2, q_heads \(a multiple of 2\), head_dim=8\]"
    ):
        L.decode_read(cache, torch.zeros(2, 3, 8))
    with pytest.raises(TypeError, match="q must be torch.float32"):
        L.decode_read(cache, torch.zeros(2, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="q_heads .3. must be a multiple"):
        measure_read(cache, q_heads=3)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 1\)"):
        L.layer_kv(cache, 1)
    empty = L.new_cache("NHD", batch=1, length=0, kv_heads=1, head_dim=8, device="cpu")
    with pytest.raises(ValueError, match="holds no tokens"):
        L.decode_read(empty, torch.zeros(1, 1, 8))
    with pytest.raises(ValueError, match=r"capacity must be an int >= 5"):
        L.new_cache("HND", batch=1, length=5, capacity=3, kv_heads=1, head_dim=8)
    with pytest.raises(
        ValueError, match=r"k must be \[layers, batch, tokens, kv_heads, head_dim\]"
    ):
        L.cache_from_dense("BTHD", torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))


def test_decode_read_refuses_nan_queries():
    cache = L.new_cache(
        "BHTD", batch=1, length=4, kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu"
    )
    q = torch.full((1, 2, 16), float("nan"))
    with pytest.raises(ValueError, match="q holds NaN"):
        L.decode_read(cache, q)


@pytest.mark.parametrize("lay", ["BHTD", "NHD"])
@settings(max_examples=15, deadline=None)
@given(steps=st.lists(st.sampled_from(["ok", "shape", "dtype", "nan"]), min_size=1, max_size=6))
def test_layout_append_token_is_all_or_nothing(lay, steps):
    cache = L.new_cache(
        lay,
        batch=2,
        length=2,
        capacity=10,
        kv_heads=2,
        head_dim=8,
        dtype=torch.float32,
        device="cpu",
        block_size=4,
    )
    gen = torch.Generator().manual_seed(len(steps))
    for step in steps:
        k, v = torch.randn(1, 2, 2, 8, generator=gen), torch.randn(1, 2, 2, 8, generator=gen)
        before = (cache.length, cache.k.clone(), cache.v.clone())
        if step == "ok":
            L.append_token(cache, k, v)
            assert cache.length == before[0] + 1
            continue
        k = {"shape": k[:, :1], "dtype": k.double(), "nan": k.fill_(math.nan)}[step]
        with pytest.raises((TypeError, ValueError)):
            L.append_token(cache, k, v)
        assert (
            cache.length == before[0]
            and torch.equal(cache.k, before[1])
            and torch.equal(cache.v, before[2])
        )


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "layout cache beyond memory": (
        lambda: L.new_cache(
            "BHTD", batch=10**6, length=10**6, kv_heads=8, head_dim=128, device="cpu"
        ),
        MemoryError,
        "bytes but only",
    ),
    "layout nan keys": (
        lambda: L.cache_from_dense(
            "BHTD", torch.full((1, 1, 4, 2, 8), math.nan), torch.rand(1, 1, 4, 2, 8)
        ),
        ValueError,
        "k holds NaN",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# Integer arguments: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {
    "layout.new_cache batch": (
        lambda x: L.new_cache("BHTD", batch=x, length=2, kv_heads=1, head_dim=4, device="cpu"),
        "batch",
        1,
    )
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
