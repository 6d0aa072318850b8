"""KV-cache layouts (section 9.4): address functions against torch's own strides, reads against an
fp64 attention written from the definition, appends, GQA arithmetic against the seeds, bad input.

The oracles are independent of kvlab.cache.layout: a layout's tensor is built here with torch.permute (the
contiguous layouts) or with a Python loop over the block table (the paged ones), filled with a code
that names each element, and every address kvlab computes must find the element it names.
"""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import SHAPES
from kvlab.cache import layout as L
from kvlab.lab.bench import Row


def codes(layers, batch, tokens, heads, dim):
    """Canonical [layer, seq, token, head, dim] tensor whose value is the element's row-major index."""
    return torch.arange(layers * batch * tokens * heads * dim, dtype=torch.int64).view(layers, batch, tokens, heads,
                                                                                       dim)


def contiguous_oracle(layout, canonical):
    return canonical.permute(0, 1, 3, 2, 4).contiguous() if layout == "BHTD" else canonical.contiguous()


def paged_oracle(layout, canonical, table, num_blocks, block_size):
    """The pool built block by block with a loop: token j*S+o of sequence b at block table[b][j], slot o."""
    layers, batch, tokens, heads, dim = canonical.shape
    shape = (layers, num_blocks, block_size, heads, dim) if layout == "NHD" else (layers, num_blocks, heads,
                                                                                   block_size, dim)
    pool = torch.full(shape, -1, dtype=torch.int64)
    for b in range(batch):
        for t in range(tokens):
            block, slot = int(table[b][t // block_size]), t % block_size
            if layout == "NHD":
                pool[:, block, slot] = canonical[:, b, t]
            else:
                pool[:, block, :, slot] = canonical[:, b, t]
    return pool


def same_strides(geometry, tensor):
    """Strides agree on every axis longer than 1 (torch may give a length-1 axis any stride)."""
    return all(a == b for a, b, n in zip(geometry.strides, tensor.stride(), tensor.shape) if n > 1)


def random_table(batch, per_seq, num_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq).to(torch.int32)


def all_coords(layers, batch, tokens, heads, dim):
    grids = torch.meshgrid(*(torch.arange(n) for n in (layers, batch, tokens, heads, dim)), indexing="ij")
    return [g.flatten() for g in grids]


sizes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(1, 9))


@settings(max_examples=30, deadline=None)
@given(sizes=sizes, layout=st.sampled_from(["BHTD", "BTHD"]), spare=st.integers(0, 5), seed=st.integers(0, 99))
def test_contiguous_address_finds_the_element_torch_stores_there(sizes, layout, spare, seed):
    layers, batch, tokens, heads, dim = sizes
    capacity = tokens + spare
    canonical = codes(layers, batch, capacity, heads, dim)
    tensor = contiguous_oracle(layout, canonical)
    geometry = L.KVGeometry.contiguous(layout, layers=layers, batch=batch, max_tokens=capacity, kv_heads=heads,
                                       head_dim=dim)
    assert geometry.shape == tuple(tensor.shape)
    assert same_strides(geometry, tensor)
    l, b, t, h, d = all_coords(layers, batch, capacity, heads, dim)
    offsets = geometry.address(l, b, t, h, d)
    assert torch.equal(tensor.flatten()[offsets], canonical[l, b, t, h, d])
    # One element as plain ints: an int offset, the dot product of its index with torch's strides.
    g = torch.Generator().manual_seed(seed)
    point = [int(torch.randint(n, (1,), generator=g)) for n in (layers, batch, capacity, heads, dim)]
    offset = geometry.address(*point)
    assert isinstance(offset, int)
    index = {"layer": point[0], "seq": point[1], "token": point[2], "head": point[3], "dim": point[4]}
    assert offset == sum(index[a] * s for a, s in zip(geometry.axes, tensor.stride()))
    assert int(tensor.flatten()[offset]) == int(canonical[tuple(point)])


@settings(max_examples=30, deadline=None)
@given(sizes=sizes, layout=st.sampled_from(["NHD", "HND"]), block_size=st.sampled_from([1, 2, 3, 8, 16]),
       seed=st.integers(0, 999))
def test_paged_address_follows_a_random_permuted_block_table(sizes, layout, block_size, seed):
    layers, batch, tokens, heads, dim = sizes
    per_seq = -(-tokens // block_size)
    num_blocks = 3 * batch * per_seq  # a pool three times the needed size
    table = random_table(batch, per_seq, num_blocks, seed)
    canonical = codes(layers, batch, tokens, heads, dim)
    pool = paged_oracle(layout, canonical, table.tolist(), num_blocks, block_size)
    geometry = L.KVGeometry.paged(layout, layers=layers, num_blocks=num_blocks, block_size=block_size,
                                  kv_heads=heads, head_dim=dim)
    assert geometry.shape == tuple(pool.shape) and same_strides(geometry, pool)
    l, b, t, h, d = all_coords(layers, batch, tokens, heads, dim)
    offsets = geometry.address(l, b, t, h, d, block_table=table)
    assert torch.equal(pool.flatten()[offsets], canonical[l, b, t, h, d])
    # As ints, with the table as nested lists.
    point = (layers - 1, batch - 1, tokens - 1, heads - 1, dim - 1)
    offset = geometry.address(*point, block_table=table.tolist())
    assert isinstance(offset, int) and int(pool.flatten()[offset]) == int(canonical[point])


@pytest.mark.parametrize("layout", L.LAYOUTS)
def test_cache_from_dense_matches_the_independent_construction(layout):
    canonical = codes(2, 3, 21, 2, 4)
    cache = L.cache_from_dense(layout, canonical, canonical + 1, capacity=27, block_size=4, spare_blocks=5, seed=3)
    for pool, dense in ((cache.k, canonical), (cache.v, canonical + 1)):
        if layout in L.PAGED:
            table = cache.block_table
            assert table.dtype == torch.int32 and table.shape == (3, 7)
            assert len(set(table.flatten().tolist())) == table.numel()  # no block owned twice
            expected = paged_oracle(layout, dense, table.tolist(), cache.geometry.num_blocks, 4)
            held = expected >= 0
            assert torch.equal(pool[held], expected[held]) and not pool[~held].any()
        else:
            padded = torch.zeros(2, 3, 27, 2, 4, dtype=torch.int64)
            padded[:, :, :21] = dense
            assert torch.equal(pool, contiguous_oracle(layout, padded))


@pytest.mark.parametrize("layout", L.PAGED)
def test_cache_from_dense_takes_a_given_block_table(layout):
    canonical = codes(2, 2, 40, 3, 4)
    table = [[7, 2, 15], [0, 11, 3]]  # request A is the seed's example (section 9.5)
    cache = L.cache_from_dense(layout, canonical, canonical, block_size=16, block_table=table)
    assert cache.block_table.tolist() == table and cache.geometry.num_blocks == 16
    expected = paged_oracle(layout, canonical, table, 16, 16)
    held = expected >= 0
    assert torch.equal(cache.k[held], expected[held])
    with pytest.raises(ValueError, match=r"block_table must be \[batch, ceil\(capacity / block_size\)\] = \[2, 3\]"):
        L.cache_from_dense(layout, canonical, canonical, block_size=16, block_table=[[7, 2], [0, 1]])
    with pytest.raises(ValueError, match="must not give one physical block to two logical blocks"):
        L.cache_from_dense(layout, canonical, canonical, block_size=16, block_table=[[7, 2, 15], [0, 7, 3]])
    with pytest.raises(ValueError, match="entries must be >= 0"):
        L.cache_from_dense(layout, canonical, canonical, block_size=16, block_table=[[7, 2, 15], [0, -1, 3]])
    with pytest.raises(ValueError, match="applies to paged layouts"):
        L.cache_from_dense("BHTD", canonical, canonical, block_table=table)


def attention_fp64(q, k, v):
    """Decode attention from the definition: q [B, Hq, D], k and v [B, T, Hkv, D]; head i uses KV head i // g."""
    group = q.shape[1] // k.shape[2]
    k = k.double().repeat_interleave(group, dim=2)
    v = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.double(), k) / math.sqrt(q.shape[2])
    return torch.einsum("bht,bthd->bhd", scores.softmax(-1), v)


@pytest.mark.parametrize("layout", L.LAYOUTS)
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_read_equals_fp64_attention(layout, group, dtype):
    g = torch.Generator().manual_seed(group)
    batch, kv_heads, dim, block_size = 3, 2, 16, 8
    for length in (1, block_size - 1, block_size, block_size + 1, 45):
        k = torch.randn(2, batch, length, kv_heads, dim, generator=g).to(dtype)
        v = torch.randn(2, batch, length, kv_heads, dim, generator=g).to(dtype)
        q = torch.randn(batch, kv_heads * group, dim, generator=g).to(dtype)
        cache = L.cache_from_dense(layout, k, v, capacity=length + 3, block_size=block_size, spare_blocks=7)
        out = L.decode_read(cache, q, layer=1)
        assert out.shape == q.shape and out.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(out.double(), attention_fp64(q, k[1], v[1]), atol=tol, rtol=tol)
        kv, moved = L.read_traffic(cache)
        assert kv == 2 * batch * length * kv_heads * dim * k.element_size()
        assert moved == kv if layout not in L.PAGED else moved > 3 * kv - 1


@pytest.mark.parametrize("layout,method", [(lay, m) for lay in L.LAYOUTS for m in L.APPEND_METHODS[lay]])
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
        torch.testing.assert_close(L.decode_read(cache, q, layer).double(), attention_fp64(q, k[layer], v[layer]),
                                   atol=1e-5, rtol=1e-5)
    # The last token sits where the address function says, in K and in V.
    offset = cache.geometry.address(1, 2, length + 1, 1, 5, block_table=cache.block_table)
    assert cache.k.flatten()[offset] == k[1, 2, length + 1, 1, 5]
    assert cache.v.flatten()[offset] == v[1, 2, length + 1, 1, 5]


def test_contiguous_runs_match_the_layouts_arithmetic():
    heads, dim, block = 4, 8, 16
    bhtd = L.KVGeometry.contiguous("BHTD", layers=1, batch=2, max_tokens=40, kv_heads=heads, head_dim=dim)
    assert L.contiguous_runs(bhtd, 40, [1]).tolist() == [40 * dim]
    assert L.contiguous_runs(bhtd, 40).tolist() == [heads * 40 * dim]  # full capacity: one run
    assert L.contiguous_runs(bhtd, 30).tolist() == [30 * dim] * heads  # spare capacity splits the heads
    bthd = dataclasses.replace(bhtd, layout="BTHD")
    assert L.contiguous_runs(bthd, 40, [2]).tolist() == [dim] * 40
    assert L.contiguous_runs(bthd, 33).tolist() == [33 * heads * dim]
    table = torch.tensor([[9, 4, 0]])  # no two logical neighbours are physical neighbours
    for layout, one_head in (("NHD", [dim] * 40), ("HND", [block * dim, block * dim, 8 * dim])):
        paged = L.KVGeometry.paged(layout, layers=1, num_blocks=10, block_size=block, kv_heads=heads, head_dim=dim)
        assert sorted(L.contiguous_runs(paged, 40, [3], block_table=table).tolist()) == sorted(one_head)
        all_heads = L.contiguous_runs(paged, 40, block_table=table).tolist()
        assert sum(all_heads) == 40 * heads * dim and max(all_heads) == block * heads * dim


def test_seed_block_lookup_example():
    # Seed 000, section 9.5: request A maps logical blocks [0, 1, 2] to physical blocks [7, 2, 15], 16 tokens each.
    table = [7, 2, 15]
    assert [L.locate(16 * j, table, 16)[0] for j in range(3)] == table
    assert L.locate(37, table, 16) == (15, 5)
    assert L.locate(47, table, 16) == (15, 15)
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 48\)"):
        L.locate(48, table, 16)


def test_gqa_cache_bytes_against_the_seeds():
    llama8b = SHAPES["llama-3-8b"]
    rows = {r.group: r for r in L.gqa_cache_bytes(llama8b, context=8192)}
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
    assert L.gqa_cache_bytes(SHAPES["llama-2-13b"], 1, groups=[1])[0].bytes_per_token == 2 * 40 * 40 * 128 * 2


def test_formulas_and_explanations():
    g = L.KVGeometry.contiguous("BHTD", layers=2, batch=4, max_tokens=64, kv_heads=8, head_dim=16)
    assert g.formula() == "offset = (((l·B + b)·H + h)·T + t)·D + d"
    assert g.explain(1, 2, 37, 3, 5).endswith(f"= {g.address(1, 2, 37, 3, 5):,}")
    p = L.KVGeometry.paged("HND", layers=2, num_blocks=20, block_size=16, kv_heads=8, head_dim=16)
    assert p.formula().startswith("p = table[b][t // S], o = t mod S;")
    assert "= 15, o = 37 mod 16 = 5" in p.explain(1, 0, 37, 3, 5, [[7, 2, 15]])


def test_measurements_and_bench_rows_run():
    for layout in L.LAYOUTS:
        cache = L.new_cache(layout, batch=2, length=33, kv_heads=2, head_dim=8, block_size=8, device="cpu")
        read = L.measure_read(cache, q_heads=4, warmup=0, reps=1)
        assert read.kv_bytes == 2 * 2 * 33 * 2 * 8 * 4 and read.moved_bytes >= read.kv_bytes
        assert read.timing.median > 0 and read.predicted_s > 0
        for method in L.APPEND_METHODS[layout]:
            append = L.measure_append(cache, method, warmup=0, reps=1)
            assert append.new_bytes == 2 * 2 * 2 * 8 * 4 and append.per_token_s > 0
        assert cache.length == 33  # measuring does not advance the cache
    rows = L.bench_rows(rounds=1, context=40, batch=2)
    assert rows and all(isinstance(r, Row) for r in rows)
    assert {"read BHTD", "read NHD", "append BTHD cat / index"} <= {r.name for r in rows}


# --------------------------------------------------------------------------- bad input


def test_bad_geometry_is_rejected():
    with pytest.raises(ValueError, match="layout must be one of"):
        L.KVGeometry.contiguous("THBD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="is paged; use KVGeometry.paged"):
        L.KVGeometry.contiguous("NHD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="is contiguous; use KVGeometry.contiguous"):
        L.KVGeometry.paged("BHTD", layers=1, num_blocks=1, block_size=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        L.KVGeometry.contiguous("BHTD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=0)
    with pytest.raises(TypeError, match="kv_heads must be an int"):
        L.KVGeometry.contiguous("BHTD", layers=1, batch=1, max_tokens=1, kv_heads=2.0, head_dim=1)
    with pytest.raises(ValueError, match="block_size applies to paged layouts only"):
        L.KVGeometry("BTHD", 1, 1, 1, batch=1, max_tokens=1, block_size=16)


def test_bad_addresses_are_rejected():
    g = L.KVGeometry.contiguous("BTHD", layers=2, batch=3, max_tokens=10, kv_heads=4, head_dim=8)
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 10\), got 10"):
        g.address(0, 0, 10, 0, 0)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 2\), got -1"):
        g.address(-1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\)"):
        g.address(0, 0, 0, torch.tensor([1, 4]), 0)
    with pytest.raises(TypeError, match="dim must be an int or an integer tensor"):
        g.address(0, 0, 0, 0, torch.tensor([0.5]))
    with pytest.raises(TypeError, match="seq must be an int"):
        g.address(0, 1.0, 0, 0, 0)
    p = L.KVGeometry.paged("NHD", layers=1, num_blocks=4, block_size=2, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="needs block_table"):
        p.address(0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 4\)"):
        p.address(0, 0, 4, 0, 0, block_table=[[0, 1]])
    with pytest.raises(ValueError, match=r"seq must be an int in \[0, 1\)"):
        p.address(0, 1, 0, 0, 0, block_table=[[0, 1]])
    with pytest.raises(ValueError, match=r"physical block of sequence 0\) must be in \[0, 4\), got 9"):
        p.address(0, 0, 3, 0, 0, block_table=[[0, 9]])
    with pytest.raises(ValueError, match="block_table must be 2-D"):
        p.address(0, 0, 0, 0, 0, block_table=[0, 1])
    with pytest.raises(TypeError, match="block_table must hold integers"):
        p.address(0, 0, 0, 0, 0, block_table=[[0.0, 1.0]])


def test_bad_cache_operations_are_rejected():
    cache = L.new_cache("BHTD", batch=2, length=4, kv_heads=2, head_dim=8, capacity=4, device="cpu")
    new = torch.zeros(1, 2, 2, 8)
    with pytest.raises(ValueError, match="the cache is full"):
        L.append_token(cache, new, new, "index")
    with pytest.raises(ValueError, match=r"method \(for layout BHTD\) must be one of \('index', 'cat'\)"):
        L.append_token(cache, new, new, "slot")
    with pytest.raises(ValueError, match=r"k_new must be \[layers, batch, kv_heads, head_dim\]"):
        L.append_token(cache, torch.zeros(2, 2, 8), new, "cat")
    with pytest.raises(TypeError, match="v_new must be torch.float32"):
        L.append_token(cache, new, new.half(), "cat")
    with pytest.raises(ValueError, match=r"q must be \[batch=2, q_heads \(a multiple of 2\), head_dim=8\]"):
        L.decode_read(cache, torch.zeros(2, 3, 8))
    with pytest.raises(TypeError, match="q must be torch.float32"):
        L.decode_read(cache, torch.zeros(2, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="q_heads .3. must be a multiple"):
        L.measure_read(cache, q_heads=3)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 1\)"):
        L.layer_kv(cache, 1)
    empty = L.new_cache("NHD", batch=1, length=0, kv_heads=1, head_dim=8, device="cpu")
    with pytest.raises(ValueError, match="holds no tokens"):
        L.decode_read(empty, torch.zeros(1, 1, 8))
    with pytest.raises(ValueError, match=r"capacity must be an int >= 5"):
        L.new_cache("HND", batch=1, length=5, capacity=3, kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match=r"k must be \[layers, batch, tokens, kv_heads, head_dim\]"):
        L.cache_from_dense("BTHD", torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))


def test_bad_gqa_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"group must divide Llama-3-8B's 32 query heads; allowed: \[1, 2, 4"):
        L.gqa_cache_bytes(SHAPES["llama-3-8b"], 1024, groups=[3])
    with pytest.raises(ValueError, match="MLA"):
        L.gqa_cache_bytes(SHAPES["deepseek-v2"], 1024)
    with pytest.raises(TypeError, match="shape must be a kvlab ModelShape"):
        L.gqa_cache_bytes("llama-3-8b", 1024)
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        L.gqa_cache_bytes(SHAPES["llama-3-8b"], 0)
