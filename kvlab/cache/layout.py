"""Notebook 04, KV-cache layout (section 9.4): a KV cache in one of four layouts, read and appended.

``KVCache`` holds K and V of ``batch`` sequences in a layout of ``kvlab.cache.addresses``
(``BHTD``, ``BTHD``, or the paged ``NHD`` and ``HND`` with a block table). A decode step reads it
(``layer_kv`` gives one layer's K and V ready for attention: views for the contiguous layouts, a
gather through the block table for the paged ones; ``decode_read`` attends one query per
sequence over them) and appends one token per sequence (``append_token``: an indexed write into
preallocated capacity, ``torch.cat`` growth as transformers' DynamicCache does, or a slot write
through the block table, Kwon et al. 2023). What reading and appending cost is measured by
``kvlab.lab.layout_timing``, one layer at a time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvlab._checks import integer, one_of, require_memory
from kvlab.cache.addresses import LAYOUTS, PAGED, KVGeometry, as_block_table
from kvlab.devices import device_and_dtype

APPEND_METHODS = {
    "BHTD": ("index", "cat"),
    "BTHD": ("index", "cat"),
    "NHD": ("slot",),
    "HND": ("slot",),
}


# --------------------------------------------------------------------------- a cache in one layout


@dataclass
class KVCache:
    """K and V of ``batch`` sequences, ``length`` tokens each, in one layout (section 9.4).

    ``k`` and ``v`` have ``geometry.shape``; a paged cache also has ``block_table``
    (int32 ``[batch, blocks per sequence]``). Token ``length`` is where the next append goes.
    """

    geometry: KVGeometry
    k: torch.Tensor
    v: torch.Tensor
    length: int
    block_table: torch.Tensor | None = None
    _workspace: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def layout(self) -> str:
        return self.geometry.layout

    @property
    def batch(self) -> int:
        return self.block_table.shape[0] if self.geometry.is_paged else self.geometry.batch

    @property
    def capacity(self) -> int:
        """Tokens per sequence the allocation holds before it must grow (or get more blocks)."""
        if self.geometry.is_paged:
            return self.block_table.shape[1] * self.geometry.block_size
        return self.geometry.max_tokens

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes one token of one sequence takes in one layer."""
        return 2 * self.geometry.kv_heads * self.geometry.head_dim * self.k.element_size()

    def workspace(self, name: str, shape: tuple) -> torch.Tensor:
        """A scratch tensor kept between calls (the paged gather's destination)."""
        buffer = self._workspace.get(name)
        if buffer is None or tuple(buffer.shape) != tuple(shape):
            buffer = self._workspace[name] = torch.empty(
                shape, dtype=self.k.dtype, device=self.k.device
            )
        return buffer

    def token_axis(self) -> int:
        """The axis of ``k`` that indexes tokens (contiguous layouts only)."""
        return self.geometry.axes.index("token")


def _allocate(
    layout: str,
    layers: int,
    batch: int,
    capacity: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    spare_blocks: int,
    dtype,
    device,
    generator: torch.Generator,
):
    """Zeroed K and V in ``layout``, and a block table of distinct random physical blocks."""
    per_seq = -(-capacity // block_size)
    if layout in PAGED:
        geometry = KVGeometry.paged(
            layout,
            layers=layers,
            num_blocks=batch * per_seq + spare_blocks,
            block_size=block_size,
            kv_heads=kv_heads,
            head_dim=head_dim,
        )
    else:
        geometry = KVGeometry.contiguous(
            layout,
            layers=layers,
            batch=batch,
            max_tokens=capacity,
            kv_heads=kv_heads,
            head_dim=head_dim,
        )
    nbytes = 2 * geometry.numel * torch.empty((), dtype=dtype).element_size()
    require_memory(f"a {layout} cache of shape {geometry.shape} (K and V)", nbytes, device or "cpu")
    table = None
    if layout in PAGED:
        picks = torch.randperm(geometry.num_blocks, generator=generator)[: batch * per_seq]
        table = picks.view(batch, per_seq).to(device=device, dtype=torch.int32)
    k = torch.zeros(geometry.shape, dtype=dtype, device=device)
    return geometry, k, torch.zeros_like(k), table


def new_cache(
    layout: str,
    *,
    batch: int,
    length: int,
    kv_heads: int,
    head_dim: int,
    layers: int = 1,
    capacity: int | None = None,
    block_size: int = 16,
    spare_blocks: int = 0,
    dtype=None,
    device=None,
    seed: int = 0,
) -> KVCache:
    """A cache in ``layout`` holding ``length`` random tokens per sequence, room for ``capacity``.

    ``capacity`` defaults to ``length + 1`` (room for one append). Paged caches get ``ceil(capacity
    / block_size)`` blocks per sequence, drawn at random from a pool with ``spare_blocks`` extra
    blocks. dtype: bf16 on a GPU (fp16 without bf16 units), fp32 on a CPU by default.
    """
    one_of("layout", layout, LAYOUTS)
    batch = integer("batch", batch, 1)
    length = integer("length", length, 0)
    capacity = length + 1 if capacity is None else integer("capacity", capacity, max(length, 1))
    block_size = integer("block_size", block_size, 1)
    spare_blocks = integer("spare_blocks", spare_blocks, 0)
    device, dtype = device_and_dtype(device, dtype)
    gen = torch.Generator().manual_seed(integer("seed", seed, 0))
    geometry, k, v, table = _allocate(
        layout,
        integer("layers", layers, 1),
        batch,
        capacity,
        integer("kv_heads", kv_heads, 1),
        integer("head_dim", head_dim, 1),
        block_size,
        spare_blocks,
        dtype,
        device,
        gen,
    )
    device_gen = torch.Generator(device=device).manual_seed(seed)
    for pool in (k, v):
        pool.normal_(generator=device_gen)
    return KVCache(geometry, k, v, length, table)


def cache_from_dense(
    layout: str,
    k,
    v,
    *,
    capacity: int | None = None,
    block_size: int = 16,
    spare_blocks: int = 0,
    seed: int = 0,
    block_table=None,
) -> KVCache:
    """A cache in ``layout`` holding ``k`` and ``v`` given as ``[layers, batch, tokens, kv_heads,
    head_dim]``.

    Slots beyond the tokens are zero. Paged: each sequence's blocks are a random choice (``seed``)
    among ``batch * ceil(capacity / block_size) + spare_blocks`` physical blocks, or the given
    ``block_table`` (``[batch, ceil(capacity / block_size)]`` distinct ids; the pool then has
    ``max(id) + 1 + spare_blocks`` blocks).
    """
    one_of("layout", layout, LAYOUTS)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating-point tensor (keys and values), got {t.dtype}"
            )
        if t.dim() != 5:
            raise ValueError(
                f"{name} must be [layers, batch, tokens, kv_heads, head_dim], got shape"
                f" {tuple(t.shape)}"
            )
        _require_finite(name, t)
    if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(
            f"k and v must match in shape, dtype and device, got {tuple(k.shape)} {k.dtype}"
            f" {k.device} and {tuple(v.shape)} {v.dtype} {v.device}"
        )
    layers, batch, length, kv_heads, head_dim = k.shape
    if min(layers, batch, kv_heads, head_dim) < 1:
        raise ValueError(
            f"k must have at least one layer, sequence, KV head and dim, got shape {tuple(k.shape)}"
        )
    capacity = max(length, 1) if capacity is None else integer("capacity", capacity, max(length, 1))
    block_size = integer("block_size", block_size, 1)
    gen = torch.Generator().manual_seed(integer("seed", seed, 0))
    spare_blocks = integer("spare_blocks", spare_blocks, 0)
    if block_table is not None:
        if layout not in PAGED:
            raise ValueError(f"block_table applies to paged layouts {PAGED} only, not {layout!r}")
        given = _check_block_table(block_table, batch, -(-capacity // block_size))
        spare_blocks += int(given.max()) + 1 - given.numel()
    geometry, k_pool, v_pool, table = _allocate(
        layout,
        layers,
        batch,
        capacity,
        kv_heads,
        head_dim,
        block_size,
        spare_blocks,
        k.dtype,
        k.device,
        gen,
    )
    if block_table is not None:
        table = given.to(device=k.device, dtype=torch.int32)
    for pool, dense in ((k_pool, k), (v_pool, v)):
        if layout == "BHTD":
            pool[:, :, :, :length] = dense.transpose(2, 3)
        elif layout == "BTHD":
            pool[:, :, :length] = dense
        else:
            per_seq = table.shape[1]
            padded = torch.zeros(
                layers,
                batch,
                per_seq * block_size,
                kv_heads,
                head_dim,
                dtype=k.dtype,
                device=k.device,
            )
            padded[:, :, :length] = dense
            blocks = padded.view(layers, batch, per_seq, block_size, kv_heads, head_dim)
            pool[:, table.long()] = blocks if layout == "NHD" else blocks.transpose(3, 4)
    return KVCache(geometry, k_pool, v_pool, length, table)


def _check_block_table(block_table, batch: int, per_seq: int) -> torch.Tensor:
    table = as_block_table(block_table).to("cpu", torch.int64)
    if tuple(table.shape) != (batch, per_seq):
        raise ValueError(
            f"block_table must be [batch, ceil(capacity / block_size)] = [{batch}, {per_seq}], "
            f"got {list(table.shape)}"
        )
    if int(table.min()) < 0:
        raise ValueError(f"block_table entries must be >= 0, got {int(table.min())}")
    if table.unique().numel() != table.numel():
        raise ValueError("block_table must not give one physical block to two logical blocks")
    return table


# --------------------------------------------------------------------------- the read path


def layer_kv(cache: KVCache, layer: int = 0):
    """K and V of one layer as ``[batch, kv_heads, length, head_dim]``, ready for attention.

    Contiguous layouts give views of the cache (no copy: ``BTHD`` is a transposed view). Paged
    layouts gather every sequence's blocks through the block table into a workspace the cache keeps
    (as an engine would, so the copy does not also pay for a fresh allocation): a full copy, and the
    views returned alias that workspace until the next gather.
    """
    integer("layer", layer, 0, cache.geometry.layers)
    n = cache.length
    if n < 1:
        raise ValueError("the cache holds no tokens (length 0): there is nothing to read")
    if cache.layout == "BHTD":
        return cache.k[layer, :, :, :n], cache.v[layer, :, :, :n]
    if cache.layout == "BTHD":
        return cache.k[layer, :, :n].transpose(1, 2), cache.v[layer, :, :n].transpose(1, 2)
    blocks = cache.block_table[:, : -(-n // cache.geometry.block_size)].reshape(-1).long()
    batch, heads, dim = cache.batch, cache.geometry.kv_heads, cache.geometry.head_dim
    out = []
    for name, pool in (("k", cache.k[layer]), ("v", cache.v[layer])):
        if cache.layout == "NHD":  # blocks land as [batch * blocks, slot, heads, dim]: BTHD order
            buffer = cache.workspace(name, (blocks.numel(), *pool.shape[1:]))
            torch.index_select(pool, 0, blocks, out=buffer)
            out.append(buffer.view(batch, -1, heads, dim)[:, :n].transpose(1, 2))
        else:  # head by head (one head of a block is slot * dim contiguous elements), landing as
            # [heads, batch * blocks, slot, dim]; one index_select over the transposed pool is far
            # slower
            buffer = cache.workspace(name, (heads, blocks.numel(), *pool.shape[2:]))
            for head in range(heads):
                torch.index_select(pool[:, head], 0, blocks, out=buffer[head])
            out.append(buffer.view(heads, batch, -1, dim)[:, :, :n].transpose(0, 1))
    return tuple(out)


def decode_read(cache: KVCache, q: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """One decode step's attention for one layer: each sequence's query against all its K and V.

    ``q``: ``[batch, q_heads, head_dim]``, ``q_heads`` a multiple of the KV heads (query head
    ``i`` uses KV head ``i // group``). Returns ``[batch, q_heads, head_dim]``. Uses torch SDPA on
    the layout's views; the ``group`` query heads of a KV head are passed as ``group`` query rows,
    so no KV head is copied ``group`` times.
    """
    g = cache.geometry
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if (
        q.dim() != 3
        or q.shape[0] != cache.batch
        or q.shape[2] != g.head_dim
        or q.shape[1] % g.kv_heads
    ):
        raise ValueError(
            f"q must be [batch={cache.batch}, q_heads (a multiple of {g.kv_heads}), "
            f"head_dim={g.head_dim}], got {tuple(q.shape)}"
        )
    if q.dtype != cache.k.dtype or q.device != cache.k.device:
        raise TypeError(
            f"q must be {cache.k.dtype} on {cache.k.device} like the cache, got {q.dtype} on"
            f" {q.device}"
        )
    _require_finite("q", q)
    integer("layer", layer, 0, g.layers)
    return _attend(cache, q, layer)


def decode_reader(cache: KVCache, q: torch.Tensor, layer: int = 0):
    """``decode_read(cache, q, layer)`` checked once, returned as a call with no arguments that
    reads again without checking: the timed path of section 9.4 (``kvlab.lab.layout_timing``)."""
    decode_read(cache, q, layer)
    return lambda: _attend(cache, q, layer)


def _attend(cache: KVCache, q: torch.Tensor, layer: int) -> torch.Tensor:
    g = cache.geometry
    keys, values = layer_kv(cache, layer)
    batch, q_heads, dim = q.shape
    grouped = q.reshape(batch, g.kv_heads, q_heads // g.kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, keys, values)
    return out.reshape(batch, q_heads, dim)


# --------------------------------------------------------------------------- the append path


def _require_finite(name: str, t: torch.Tensor) -> None:
    """Checked where data enters a cache: torch's SDPA on a CPU turns NaN keys into a zero output,
    a wrong number that would look like data. (Not on every read: that would double the traffic.)"""
    if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or infinite values")


def _check_new_token(cache: KVCache, k_new, v_new) -> None:
    g = cache.geometry
    want = (g.layers, cache.batch, g.kv_heads, g.head_dim)
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != want:
            raise ValueError(
                f"{name} must be [layers, batch, kv_heads, head_dim] = {list(want)}, got"
                f" {list(t.shape)}"
            )
        if t.dtype != cache.k.dtype or t.device != cache.k.device:
            raise TypeError(
                f"{name} must be {cache.k.dtype} on {cache.k.device}, got {t.dtype} on {t.device}"
            )
        _require_finite(name, t)


def _writer(cache: KVCache, method: str):
    """``write(k_new, v_new)``: store one token per sequence at position ``cache.length``.

    Returns the new (k, v) pools for ``cat`` (which builds new tensors), None otherwise. Nothing is
    validated here, so that timing measures the write alone.
    """
    pos, layout = cache.length, cache.layout
    if method == "index":
        where = (
            (slice(None), slice(None), slice(None), pos)
            if layout == "BHTD"
            else (slice(None), slice(None), pos)
        )

        def write(k_new, v_new):
            cache.k[where] = k_new
            cache.v[where] = v_new

        return write
    if method == "cat":
        axis = cache.token_axis()
        held = (slice(None),) * axis + (slice(0, pos),)

        def write(k_new, v_new):
            return (
                torch.cat([cache.k[held], k_new.unsqueeze(axis)], dim=axis),
                torch.cat([cache.v[held], v_new.unsqueeze(axis)], dim=axis),
            )

        return write
    size = cache.geometry.block_size
    blocks = cache.block_table[:, pos // size].long()
    if layout == "HND":

        def write(k_new, v_new):
            cache.k[:, blocks, :, pos % size] = k_new
            cache.v[:, blocks, :, pos % size] = v_new

        return write
    offset = pos % size
    if cache.k.device.type != "cuda":  # store_kv_ref's indexed write, its checks left out

        def write(k_new, v_new):
            cache.k[:, blocks, offset] = k_new
            cache.v[:, blocks, offset] = v_new

        return write
    from kvlab import kernels  # imports triton: only when a paged NHD write on a GPU needs it

    slots = blocks * size + offset

    def write(k_new, v_new):  # store_kv's launch without its checks (kernels.paged_store)
        for layer in range(cache.geometry.layers):
            kernels.paged_store(k_new[layer], v_new[layer], cache.k[layer], cache.v[layer], slots)

    return write


def _check_method(cache: KVCache, method: str | None) -> str:
    method = APPEND_METHODS[cache.layout][0] if method is None else method
    one_of(f"method (for layout {cache.layout})", method, APPEND_METHODS[cache.layout])
    if method != "cat" and cache.length >= cache.capacity:
        raise ValueError(
            f"the cache is full (length {cache.length} = capacity {cache.capacity}); "
            + (
                "grow it with method='cat' or allocate a larger capacity"
                if not cache.geometry.is_paged
                else "give the sequences more blocks"
            )
        )
    return method


def token_writer(cache: KVCache, method: str | None = None):
    """``write(k_new, v_new)`` for ``append_token``'s ``method`` on ``cache``, the method checked
    once: each call stores one token per sequence at position ``cache.length`` without checking its
    arguments and without advancing ``length`` (``cat`` returns the grown pools instead of keeping
    them). The timed path of section 9.4 (``kvlab.lab.layout_timing``)."""
    return _writer(cache, _check_method(cache, method))


def append_token(
    cache: KVCache, k_new: torch.Tensor, v_new: torch.Tensor, method: str | None = None
) -> None:
    """Append one token per sequence, ``[layers, batch, kv_heads, head_dim]`` each, in place.

    ``method``: ``"index"`` (contiguous, write into preallocated capacity), ``"cat"`` (contiguous,
    grow with ``torch.cat`` like transformers' DynamicCache: a new tensor each time) or ``"slot"``
    (paged: ``kvlab.kernels.store_kv`` on a GPU, ``store_kv_ref`` on a CPU, for ``NHD``; an
    indexed write for ``HND``, which ``store_kv`` does not take). Default: index, or slot.
    """
    method = _check_method(cache, method)
    _check_new_token(cache, k_new, v_new)
    grown = _writer(cache, method)(k_new, v_new)
    if grown is not None:
        cache.k, cache.v = grown
        cache.geometry = dataclasses.replace(cache.geometry, max_tokens=cache.length + 1)
    cache.length += 1
