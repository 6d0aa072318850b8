"""kvlab.cache.addresses: each layout's offsets against torch's own strides and an independent
construction."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cache.addresses import KVGeometry, locate


def codes(layers, batch, tokens, heads, dim):
    """Canonical [layer, seq, token, head, dim] tensor whose value is the element's row-major
    index."""
    return torch.arange(layers * batch * tokens * heads * dim, dtype=torch.int64).view(
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
    return (
        torch.randperm(num_blocks, generator=g)[: batch * per_seq]
        .view(batch, per_seq)
        .to(torch.int32)
    )


def all_coords(layers, batch, tokens, heads, dim):
    grids = torch.meshgrid(
        *(torch.arange(n) for n in (layers, batch, tokens, heads, dim)), indexing="ij"
    )
    return [g.flatten() for g in grids]


sizes = st.tuples(
    st.integers(1, 3), st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(1, 9)
)


@settings(max_examples=30, deadline=None)
@given(
    sizes=sizes,
    layout=st.sampled_from(["BHTD", "BTHD"]),
    spare=st.integers(0, 5),
    seed=st.integers(0, 99),
)
def test_contiguous_address_finds_the_element_torch_stores_there(sizes, layout, spare, seed):
    layers, batch, tokens, heads, dim = sizes
    capacity = tokens + spare
    canonical = codes(layers, batch, capacity, heads, dim)
    tensor = contiguous_oracle(layout, canonical)
    geometry = KVGeometry.contiguous(
        layout, layers=layers, batch=batch, max_tokens=capacity, kv_heads=heads, head_dim=dim
    )
    assert geometry.shape == tuple(tensor.shape)
    assert same_strides(geometry, tensor)
    l, b, t, h, d = all_coords(layers, batch, capacity, heads, dim)
    offsets = geometry.address(l, b, t, h, d)
    assert torch.equal(tensor.flatten()[offsets], canonical[l, b, t, h, d])
    # One element as plain ints: an int offset, the dot product of its index with torch's strides.
    g = torch.Generator().manual_seed(seed)
    point = [
        int(torch.randint(n, (1,), generator=g)) for n in (layers, batch, capacity, heads, dim)
    ]
    offset = geometry.address(*point)
    assert isinstance(offset, int)
    index = {
        "layer": point[0],
        "seq": point[1],
        "token": point[2],
        "head": point[3],
        "dim": point[4],
    }
    assert offset == sum(index[a] * s for a, s in zip(geometry.axes, tensor.stride()))
    assert int(tensor.flatten()[offset]) == int(canonical[tuple(point)])


@settings(max_examples=30, deadline=None)
@given(
    sizes=sizes,
    layout=st.sampled_from(["NHD", "HND"]),
    block_size=st.sampled_from([1, 2, 3, 8, 16]),
    seed=st.integers(0, 999),
)
def test_paged_address_follows_a_random_permuted_block_table(sizes, layout, block_size, seed):
    layers, batch, tokens, heads, dim = sizes
    per_seq = -(-tokens // block_size)
    num_blocks = 3 * batch * per_seq  # a pool three times the needed size
    table = random_table(batch, per_seq, num_blocks, seed)
    canonical = codes(layers, batch, tokens, heads, dim)
    pool = paged_oracle(layout, canonical, table.tolist(), num_blocks, block_size)
    geometry = KVGeometry.paged(
        layout,
        layers=layers,
        num_blocks=num_blocks,
        block_size=block_size,
        kv_heads=heads,
        head_dim=dim,
    )
    assert geometry.shape == tuple(pool.shape) and same_strides(geometry, pool)
    l, b, t, h, d = all_coords(layers, batch, tokens, heads, dim)
    offsets = geometry.address(l, b, t, h, d, block_table=table)
    assert torch.equal(pool.flatten()[offsets], canonical[l, b, t, h, d])
    # As ints, with the table as nested lists.
    point = (layers - 1, batch - 1, tokens - 1, heads - 1, dim - 1)
    offset = geometry.address(*point, block_table=table.tolist())
    assert isinstance(offset, int) and int(pool.flatten()[offset]) == int(canonical[point])


def test_seed_block_lookup_example():
    # Seed 000, section 9.5: request A maps logical blocks [0, 1, 2] to physical blocks [7, 2, 15],
    # 16 tokens each.
    table = [7, 2, 15]
    assert [locate(16 * j, table, 16)[0] for j in range(3)] == table
    assert locate(37, table, 16) == (15, 5)
    assert locate(47, table, 16) == (15, 15)
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 48\)"):
        locate(48, table, 16)


def test_formulas_and_explanations():
    g = KVGeometry.contiguous("BHTD", layers=2, batch=4, max_tokens=64, kv_heads=8, head_dim=16)
    assert g.formula() == "offset = (((l·B + b)·H + h)·T + t)·D + d"
    assert g.explain(1, 2, 37, 3, 5).endswith(f"= {g.address(1, 2, 37, 3, 5):,}")
    p = KVGeometry.paged("HND", layers=2, num_blocks=20, block_size=16, kv_heads=8, head_dim=16)
    assert p.formula().startswith("p = table[b][t // S], o = t mod S;")
    assert "= 15, o = 37 mod 16 = 5" in p.explain(1, 0, 37, 3, 5, [[7, 2, 15]])


def test_bad_geometry_is_rejected():
    with pytest.raises(ValueError, match="layout must be one of"):
        KVGeometry.contiguous("THBD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="is paged; use KVGeometry.paged"):
        KVGeometry.contiguous("NHD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="is contiguous; use KVGeometry.contiguous"):
        KVGeometry.paged("BHTD", layers=1, num_blocks=1, block_size=1, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        KVGeometry.contiguous("BHTD", layers=1, batch=1, max_tokens=1, kv_heads=1, head_dim=0)
    with pytest.raises(TypeError, match="kv_heads must be an int"):
        KVGeometry.contiguous("BHTD", layers=1, batch=1, max_tokens=1, kv_heads=2.0, head_dim=1)
    with pytest.raises(ValueError, match="block_size applies to paged layouts only"):
        KVGeometry("BTHD", 1, 1, 1, batch=1, max_tokens=1, block_size=16)


def test_bad_addresses_are_rejected():
    g = KVGeometry.contiguous("BTHD", layers=2, batch=3, max_tokens=10, kv_heads=4, head_dim=8)
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
    p = KVGeometry.paged("NHD", layers=1, num_blocks=4, block_size=2, kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="needs block_table"):
        p.address(0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"token must be an int in \[0, 4\)"):
        p.address(0, 0, 4, 0, 0, block_table=[[0, 1]])
    with pytest.raises(ValueError, match=r"seq must be an int in \[0, 1\)"):
        p.address(0, 1, 0, 0, 0, block_table=[[0, 1]])
    with pytest.raises(
        ValueError, match=r"physical block of sequence 0\) must be in \[0, 4\), got 9"
    ):
        p.address(0, 0, 3, 0, 0, block_table=[[0, 9]])
    with pytest.raises(ValueError, match="block_table must be 2-D"):
        p.address(0, 0, 0, 0, 0, block_table=[0, 1])
    with pytest.raises(TypeError, match="block_table must hold integers"):
        p.address(0, 0, 0, 0, 0, block_table=[[0.0, 1.0]])


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "layout locate negative block": (
        lambda: locate(1, [-1, 2], 4),
        ValueError,
        r"block_table_row\[0\] must be an int >= 0, got -1",
    )
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
