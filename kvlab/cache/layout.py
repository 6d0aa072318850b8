"""KV-cache layouts: where each cached key and value lives, and what reading and appending cost (section 9.4).

Four layouts of one K pool; V is a second tensor of the same shape and layout:

* ``BHTD``, contiguous ``[layers, batch, kv_heads, tokens, head_dim]``: transformers' caches, SDPA's input;
* ``BTHD``, contiguous ``[layers, batch, tokens, kv_heads, head_dim]``: the order K/V projections produce;
* ``NHD``, paged ``[layers, num_blocks, block_size, kv_heads, head_dim]``: vLLM, ``kvlab.kernels``;
* ``HND``, paged ``[layers, num_blocks, kv_heads, block_size, head_dim]``: FlashInfer's other choice.

**How the layer enters.** kvlab gives every layout a *leading layer dimension*: one K tensor and
one V tensor hold all layers, and ``k[layer]`` is the per-layer tensor an attention call receives
(for ``NHD`` exactly the ``[num_blocks, block_size, num_kv_heads, head_dim]`` pool of
``kvlab.kernels``). An engine that allocates one tensor per layer uses the same offsets without the
layer term. For the paged layouts a sequence's block table maps its logical block
``token // block_size`` to a physical block; the token sits at ``token % block_size`` inside it.

The measurements time one layer: a model's decode step repeats them once per layer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from kvlab._checks import integer, require_memory
from kvlab.lab.hardware import device_and_dtype

LAYOUTS = ("BHTD", "BTHD", "NHD", "HND")
PAGED = ("NHD", "HND")
APPEND_METHODS = {"BHTD": ("index", "cat"), "BTHD": ("index", "cat"), "NHD": ("slot",), "HND": ("slot",)}

# Each layout's axes, outermost first, as (coordinate, coordinate symbol, size symbol).
_AXES = {
    "BHTD": (("layer", "l", "L"), ("seq", "b", "B"), ("head", "h", "H"), ("token", "t", "T"), ("dim", "d", "D")),
    "BTHD": (("layer", "l", "L"), ("seq", "b", "B"), ("token", "t", "T"), ("head", "h", "H"), ("dim", "d", "D")),
    "NHD": (("layer", "l", "L"), ("block", "p", "N"), ("slot", "o", "S"), ("head", "h", "H"), ("dim", "d", "D")),
    "HND": (("layer", "l", "L"), ("block", "p", "N"), ("head", "h", "H"), ("slot", "o", "S"), ("dim", "d", "D")),
}


# --------------------------------------------------------------------------- argument checks


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _check_index(name: str, value, high: int):
    """An int or an integer tensor, every entry in [0, high)."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an int or an integer tensor, got a {value.dtype} tensor")
        if value.numel() and (int(value.min()) < 0 or int(value.max()) >= high):
            got = int(value) if value.numel() == 1 else f"values from {int(value.min())} to {int(value.max())}"
            raise ValueError(f"{name} must be in [0, {high}), got {got}")
        return value
    return integer(name, value, 0, high)


def _as_block_table(block_table) -> torch.Tensor:
    if isinstance(block_table, torch.Tensor):
        table = block_table
    else:
        try:
            table = torch.tensor(block_table)
        except (TypeError, ValueError) as e:
            raise TypeError(f"block_table must be a 2-D integer tensor or a list of equal-length lists ({e})") from None
    if table.dtype.is_floating_point or table.dtype == torch.bool:
        raise TypeError(f"block_table must hold integers, got {table.dtype}")
    if table.dim() != 2:
        raise ValueError(f"block_table must be 2-D [sequences, blocks per sequence], got shape {tuple(table.shape)}")
    return table


# --------------------------------------------------------------------------- geometry and addresses


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one K (or V) pool in one layout, and its address arithmetic (section 9.4).

    Contiguous layouts (``BHTD``, ``BTHD``) set ``batch`` and ``max_tokens`` (slots per sequence);
    paged ones (``NHD``, ``HND``) set ``num_blocks`` and ``block_size``. Build one with
    :meth:`contiguous` or :meth:`paged`.
    """

    layout: str
    layers: int
    kv_heads: int
    head_dim: int
    batch: int = 0
    max_tokens: int = 0
    num_blocks: int = 0
    block_size: int = 0

    def __post_init__(self):
        _check_choice("layout", self.layout, LAYOUTS)
        for name in ("layers", "kv_heads", "head_dim"):
            integer(name, getattr(self, name), 1)
        used, unused = (("num_blocks", "block_size"), ("batch", "max_tokens")) if self.is_paged \
            else (("batch", "max_tokens"), ("num_blocks", "block_size"))
        for name in used:
            integer(name, getattr(self, name), 1)
        for name in unused:
            if getattr(self, name) != 0:
                kind = "paged" if name in ("num_blocks", "block_size") else "contiguous"
                raise ValueError(f"{name} applies to {kind} layouts only; leave it 0 for {self.layout}")

    @classmethod
    def contiguous(cls, layout: str, *, layers: int, batch: int, max_tokens: int, kv_heads: int,
                   head_dim: int) -> "KVGeometry":
        if layout in PAGED:
            raise ValueError(f"layout {layout!r} is paged; use KVGeometry.paged, or a layout in ('BHTD', 'BTHD')")
        return cls(layout, layers, kv_heads, head_dim, batch=batch, max_tokens=max_tokens)

    @classmethod
    def paged(cls, layout: str, *, layers: int, num_blocks: int, block_size: int, kv_heads: int,
              head_dim: int) -> "KVGeometry":
        if layout not in PAGED:
            raise ValueError(f"layout {layout!r} is contiguous; use KVGeometry.contiguous, or a layout in {PAGED}")
        return cls(layout, layers, kv_heads, head_dim, num_blocks=num_blocks, block_size=block_size)

    @property
    def is_paged(self) -> bool:
        return self.layout in PAGED

    @property
    def axes(self) -> tuple[str, ...]:
        """Names of the tensor's axes, outermost first."""
        return tuple(a for a, _, _ in _AXES[self.layout])

    @property
    def shape(self) -> tuple[int, ...]:
        sizes = {"layer": self.layers, "seq": self.batch, "token": self.max_tokens, "head": self.kv_heads,
                 "dim": self.head_dim, "block": self.num_blocks, "slot": self.block_size}
        return tuple(sizes[a] for a in self.axes)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides, the ones ``torch.empty(self.shape)`` has."""
        strides, step = [], 1
        for size in reversed(self.shape):
            strides.append(step)
            step *= size
        return tuple(reversed(strides))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def coordinates(self, layer, seq, token, head, dim, block_table=None) -> dict:
        """The tensor index of one element: a value per axis (paged: the block-table lookup done)."""
        _check_index("layer", layer, self.layers)
        _check_index("head", head, self.kv_heads)
        _check_index("dim", dim, self.head_dim)
        if not self.is_paged:
            _check_index("seq", seq, self.batch)
            _check_index("token", token, self.max_tokens)
            return {"layer": layer, "seq": seq, "head": head, "token": token, "dim": dim}
        if block_table is None:
            raise ValueError(f"a paged layout ({self.layout}) needs block_table to find a token's block")
        table = _as_block_table(block_table)
        if isinstance(token, torch.Tensor):
            table = table.to(token.device)  # index the table where the coordinates live
        rows, blocks_per_seq = table.shape
        _check_index("seq", seq, rows)
        _check_index("token", token, blocks_per_seq * self.block_size)
        physical = table[seq, token // self.block_size]
        _check_index(f"block_table entry (physical block of sequence {seq})", physical, self.num_blocks)
        if not any(isinstance(x, torch.Tensor) for x in (layer, seq, token, head, dim)):
            physical = int(physical)  # all-int arguments give an int offset
        return {"layer": layer, "block": physical, "slot": token % self.block_size, "head": head, "dim": dim}

    def address(self, layer, seq, token, head, dim, block_table=None):
        """Element offset of ``(layer, seq, token, head, dim)`` in this pool (section 9.4).

        Arguments are ints, or integer tensors that broadcast (then the result is a tensor).
        ``block_table`` (paged layouts only): ``[sequences, blocks per sequence]`` physical block ids.
        Byte address = base pointer + offset * element size; K and V share offsets.
        """
        coords = self.coordinates(layer, seq, token, head, dim, block_table)
        return sum(coords[a] * s for a, s in zip(self.axes, self.strides))

    def formula(self) -> str:
        """The offset formula in symbols, e.g. ``offset = (((l·B + b)·H + h)·T + t)·D + d``."""
        (_, first, _), *rest = _AXES[self.layout]
        expr = first
        for _, coord, size in rest:
            expr = f"({expr})·{size} + {coord}"
        expr = expr.replace("(l)", "l", 1)
        lookup = "p = table[b][t // S], o = t mod S;  " if self.is_paged else ""
        return f"{lookup}offset = {expr}"

    def explain(self, layer: int, seq: int, token: int, head: int, dim: int, block_table=None) -> str:
        """The formula with this element's numbers substituted, ending in its offset."""
        coords = self.coordinates(layer, seq, token, head, dim, block_table)
        values = [int(coords[a]) for a in self.axes]
        expr = str(values[0])
        for value, size in zip(values[1:], self.shape[1:]):
            expr = f"({expr}·{size} + {value})"
        lookup = ""
        if self.is_paged:
            lookup = (f"p = table[{seq}][{token} // {self.block_size}] = table[{seq}][{token // self.block_size}]"
                      f" = {int(coords['block'])}, o = {token} mod {self.block_size} = {int(coords['slot'])};  ")
        return f"{lookup}offset = {expr[1:-1]} = {int(self.address(layer, seq, token, head, dim, block_table)):,}"


def locate(token: int, block_table_row, block_size: int) -> tuple[int, int]:
    """(physical block, slot) of a sequence's ``token``: the block-table lookup of sections 9.4 and 9.5."""
    block_size = integer("block_size", block_size, 1)
    row = list(block_table_row.tolist() if isinstance(block_table_row, torch.Tensor) else block_table_row)
    token = integer("token", token, 0, len(row) * block_size)
    block = integer(f"block_table_row[{token // block_size}]", row[token // block_size], 0)
    return block, token % block_size


def contiguous_runs(geometry: KVGeometry, tokens: int, heads=None, seq: int = 0, block_table=None) -> torch.Tensor:
    """Lengths (in elements) of the unbroken address ranges a read of one sequence's K touches.

    The read covers tokens ``0..tokens-1``, every dim, of ``heads`` (a list of KV heads; default
    all). Long runs are what a GPU coalesces and a CPU prefetches; every layout here keeps the head
    dim innermost, so no run is shorter than one head vector.
    """
    heads = list(range(geometry.kv_heads)) if heads is None else list(heads)
    if not heads:
        raise ValueError("heads must name at least one KV head")
    if geometry.is_paged:
        if block_table is None:
            raise ValueError(f"a paged layout ({geometry.layout}) needs block_table to find a token's block")
        limit = _as_block_table(block_table).shape[1] * geometry.block_size
    else:
        limit = geometry.max_tokens
    tokens = integer("tokens", tokens, 1, limit + 1)
    t = torch.arange(tokens).view(-1, 1, 1)
    h = torch.tensor(heads).view(1, -1, 1)
    d = torch.arange(geometry.head_dim).view(1, 1, -1)
    offsets = geometry.address(0, seq, t, h, d, block_table).flatten().unique()  # unique() sorts
    breaks = torch.nonzero(offsets.diff() != 1).flatten() + 1
    edges = torch.cat([torch.tensor([0]), breaks, torch.tensor([offsets.numel()])])
    return edges.diff()


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
            buffer = self._workspace[name] = torch.empty(shape, dtype=self.k.dtype, device=self.k.device)
        return buffer

    def token_axis(self) -> int:
        """The axis of ``k`` that indexes tokens (contiguous layouts only)."""
        return self.geometry.axes.index("token")


def _allocate(layout: str, layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int,
              block_size: int, spare_blocks: int, dtype, device, generator: torch.Generator):
    """Zeroed K and V in ``layout``, and a block table of distinct random physical blocks."""
    if layout in PAGED:
        per_seq = -(-capacity // block_size)
        geometry = KVGeometry.paged(layout, layers=layers, num_blocks=batch * per_seq + spare_blocks,
                                    block_size=block_size, kv_heads=kv_heads, head_dim=head_dim)
        picks = torch.randperm(geometry.num_blocks, generator=generator)[: batch * per_seq]
        table = picks.view(batch, per_seq).to(device=device, dtype=torch.int32)
    else:
        geometry = KVGeometry.contiguous(layout, layers=layers, batch=batch, max_tokens=capacity,
                                         kv_heads=kv_heads, head_dim=head_dim)
        table = None
    nbytes = 2 * geometry.numel * torch.empty((), dtype=dtype).element_size()
    require_memory(f"a {layout} cache of shape {geometry.shape} (K and V)", nbytes, device or "cpu")
    k = torch.zeros(geometry.shape, dtype=dtype, device=device)
    return geometry, k, torch.zeros_like(k), table


def new_cache(layout: str, *, batch: int, length: int, kv_heads: int, head_dim: int, layers: int = 1,
              capacity: int | None = None, block_size: int = 16, spare_blocks: int = 0, dtype=None,
              device=None, seed: int = 0) -> KVCache:
    """A cache in ``layout`` holding ``length`` random tokens per sequence, room for ``capacity``.

    ``capacity`` defaults to ``length + 1`` (room for one append). Paged caches get
    ``ceil(capacity / block_size)`` blocks per sequence, drawn at random from a pool with
    ``spare_blocks`` extra blocks. dtype: bf16 on a GPU (fp16 without bf16 units), fp32 on a CPU by default.
    """
    _check_choice("layout", layout, LAYOUTS)
    batch = integer("batch", batch, 1)
    length = integer("length", length, 0)
    capacity = length + 1 if capacity is None else integer("capacity", capacity, max(length, 1))
    block_size = integer("block_size", block_size, 1)
    spare_blocks = integer("spare_blocks", spare_blocks, 0)
    device, dtype = device_and_dtype(device, dtype)
    gen = torch.Generator().manual_seed(seed)
    geometry, k, v, table = _allocate(layout, integer("layers", layers, 1), batch, capacity,
                                      integer("kv_heads", kv_heads, 1), integer("head_dim", head_dim, 1),
                                      block_size, spare_blocks, dtype, device, gen)
    device_gen = torch.Generator(device=device).manual_seed(seed)
    for pool in (k, v):
        pool.normal_(generator=device_gen)
    return KVCache(geometry, k, v, length, table)


def cache_from_dense(layout: str, k, v, *, capacity: int | None = None, block_size: int = 16,
                     spare_blocks: int = 0, seed: int = 0, block_table=None) -> KVCache:
    """A cache in ``layout`` holding ``k`` and ``v`` given as ``[layers, batch, tokens, kv_heads, head_dim]``.

    Slots beyond the tokens are zero. Paged: each sequence's blocks are a random choice (``seed``)
    among ``batch * ceil(capacity / block_size) + spare_blocks`` physical blocks, or the given
    ``block_table`` (``[batch, ceil(capacity / block_size)]`` distinct ids; the pool then has
    ``max(id) + 1 + spare_blocks`` blocks).
    """
    _check_choice("layout", layout, LAYOUTS)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 5:
            raise ValueError(f"{name} must be [layers, batch, tokens, kv_heads, head_dim], got shape {tuple(t.shape)}")
        _require_finite(name, t)
    if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"k and v must match in shape, dtype and device, got {tuple(k.shape)} {k.dtype} {k.device} "
                         f"and {tuple(v.shape)} {v.dtype} {v.device}")
    layers, batch, length, kv_heads, head_dim = k.shape
    if min(layers, batch, kv_heads, head_dim) < 1:
        raise ValueError(f"k must have at least one layer, sequence, KV head and dim, got shape {tuple(k.shape)}")
    capacity = max(length, 1) if capacity is None else integer("capacity", capacity, max(length, 1))
    block_size = integer("block_size", block_size, 1)
    gen = torch.Generator().manual_seed(seed)
    spare_blocks = integer("spare_blocks", spare_blocks, 0)
    if block_table is not None:
        if layout not in PAGED:
            raise ValueError(f"block_table applies to paged layouts {PAGED} only, not {layout!r}")
        given = _check_block_table(block_table, batch, -(-capacity // block_size))
        spare_blocks += int(given.max()) + 1 - given.numel()
    geometry, k_pool, v_pool, table = _allocate(layout, layers, batch, capacity, kv_heads, head_dim, block_size,
                                                spare_blocks, k.dtype, k.device, gen)
    if block_table is not None:
        table = given.to(device=k.device, dtype=torch.int32)
    for pool, dense in ((k_pool, k), (v_pool, v)):
        if layout == "BHTD":
            pool[:, :, :, :length] = dense.transpose(2, 3)
        elif layout == "BTHD":
            pool[:, :, :length] = dense
        else:
            per_seq = table.shape[1]
            padded = torch.zeros(layers, batch, per_seq * block_size, kv_heads, head_dim, dtype=k.dtype,
                                 device=k.device)
            padded[:, :, :length] = dense
            blocks = padded.view(layers, batch, per_seq, block_size, kv_heads, head_dim)
            pool[:, table.long()] = blocks if layout == "NHD" else blocks.transpose(3, 4)
    return KVCache(geometry, k_pool, v_pool, length, table)


def _check_block_table(block_table, batch: int, per_seq: int) -> torch.Tensor:
    table = _as_block_table(block_table).to("cpu", torch.int64)
    if tuple(table.shape) != (batch, per_seq):
        raise ValueError(f"block_table must be [batch, ceil(capacity / block_size)] = [{batch}, {per_seq}], "
                         f"got {list(table.shape)}")
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
            # [heads, batch * blocks, slot, dim]; one index_select over the transposed pool is far slower
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
    if q.dim() != 3 or q.shape[0] != cache.batch or q.shape[2] != g.head_dim or q.shape[1] % g.kv_heads:
        raise ValueError(f"q must be [batch={cache.batch}, q_heads (a multiple of {g.kv_heads}), "
                         f"head_dim={g.head_dim}], got {tuple(q.shape)}")
    if q.dtype != cache.k.dtype or q.device != cache.k.device:
        raise TypeError(f"q must be {cache.k.dtype} on {cache.k.device} like the cache, got {q.dtype} on {q.device}")
    _require_finite("q", q)
    return _decode_read(cache, q, layer)


def _decode_read(cache: KVCache, q: torch.Tensor, layer: int) -> torch.Tensor:
    """``decode_read`` without its checks, for timing after one validated call."""
    g = cache.geometry
    keys, values = layer_kv(cache, layer)
    batch, q_heads, dim = q.shape
    grouped = q.reshape(batch, g.kv_heads, q_heads // g.kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, keys, values)
    return out.reshape(batch, q_heads, dim)


def read_traffic(cache: KVCache) -> tuple[int, int]:
    """(K and V bytes one layer's decode read needs, bytes ``decode_read`` actually moves).

    Contiguous: the two are equal. Paged with a gather: the gather reads every held block and
    writes a copy of it (``2 * gathered``), then attention reads the copy (``kv``), plus the
    block-table entries. Reads and writes both count, as in ``calibrate().copy_bytes_per_s``.
    """
    kv = cache.batch * cache.length * cache.bytes_per_token
    if not cache.geometry.is_paged:
        return kv, kv
    blocks = -(-cache.length // cache.geometry.block_size)
    gathered = cache.batch * blocks * cache.geometry.block_size * cache.bytes_per_token
    table = cache.batch * blocks * cache.block_table.element_size()
    return kv, 2 * gathered + kv + table


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
            raise ValueError(f"{name} must be [layers, batch, kv_heads, head_dim] = {list(want)}, got {list(t.shape)}")
        if t.dtype != cache.k.dtype or t.device != cache.k.device:
            raise TypeError(f"{name} must be {cache.k.dtype} on {cache.k.device}, got {t.dtype} on {t.device}")
        _require_finite(name, t)


def _writer(cache: KVCache, method: str):
    """``write(k_new, v_new)``: store one token per sequence at position ``cache.length``.

    Returns the new (k, v) pools for ``cat`` (which builds new tensors), None otherwise. Nothing is
    validated here, so that timing measures the write alone.
    """
    pos, layout = cache.length, cache.layout
    if method == "index":
        where = (slice(None), slice(None), slice(None), pos) if layout == "BHTD" else (slice(None), slice(None), pos)

        def write(k_new, v_new):
            cache.k[where] = k_new
            cache.v[where] = v_new
        return write
    if method == "cat":
        axis = cache.token_axis()
        held = (slice(None),) * axis + (slice(0, pos),)

        def write(k_new, v_new):
            return (torch.cat([cache.k[held], k_new.unsqueeze(axis)], dim=axis),
                    torch.cat([cache.v[held], v_new.unsqueeze(axis)], dim=axis))
        return write
    size = cache.geometry.block_size
    blocks = cache.block_table[:, pos // size].long()
    if layout == "HND":
        def write(k_new, v_new):
            cache.k[:, blocks, :, pos % size] = k_new
            cache.v[:, blocks, :, pos % size] = v_new
        return write
    from kvlab import kernels  # imports triton: only when a paged NHD write needs it

    store = kernels.store_kv if cache.k.device.type == "cuda" else kernels.store_kv_ref
    slots = blocks * size + pos % size

    def write(k_new, v_new):
        for layer in range(cache.geometry.layers):
            store(k_new[layer], v_new[layer], cache.k[layer], cache.v[layer], slots)
    return write


def _check_method(cache: KVCache, method: str | None) -> str:
    method = APPEND_METHODS[cache.layout][0] if method is None else method
    _check_choice(f"method (for layout {cache.layout})", method, APPEND_METHODS[cache.layout])
    if method != "cat" and cache.length >= cache.capacity:
        raise ValueError(f"the cache is full (length {cache.length} = capacity {cache.capacity}); "
                         + ("grow it with method='cat' or allocate a larger capacity" if not cache.geometry.is_paged
                            else "give the sequences more blocks"))
    return method


def append_token(cache: KVCache, k_new: torch.Tensor, v_new: torch.Tensor, method: str | None = None) -> None:
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


# --------------------------------------------------------------------------- measurements


@dataclass(frozen=True)
class ReadMeasurement:
    """Timed decode read of one layer (section 9.4). Bytes count reads plus writes."""

    layout: str
    batch: int
    context: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    timing: object  # kvlab.lab.timing.Timing
    kv_bytes: int
    moved_bytes: int
    copy_bytes_per_s: float

    @property
    def kv_bytes_per_s(self) -> float:
        """Useful bandwidth: the K and V attention needs, per second."""
        return self.kv_bytes / self.timing.median

    @property
    def moved_bytes_per_s(self) -> float:
        return self.moved_bytes / self.timing.median

    @property
    def fraction_of_copy(self) -> float:
        """Moved bytes per second over the calibrated copy bandwidth."""
        return self.moved_bytes_per_s / self.copy_bytes_per_s

    @property
    def predicted_s(self) -> float:
        """The time if every moved byte went at copy bandwidth."""
        return self.moved_bytes / self.copy_bytes_per_s


@dataclass(frozen=True)
class AppendMeasurement:
    """Timed append of one token to every sequence of one layer (section 9.4)."""

    layout: str
    method: str
    batch: int
    context: int
    kv_heads: int
    head_dim: int
    dtype: str
    timing: object
    new_bytes: int
    moved_bytes: int
    copy_bytes_per_s: float

    @property
    def per_token_s(self) -> float:
        """Median time of one step's append divided by the tokens it appended (one per sequence)."""
        return self.timing.median / self.batch

    @property
    def predicted_s(self) -> float:
        return self.moved_bytes / self.copy_bytes_per_s


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def measure_read(cache: KVCache, q_heads: int | None = None, layer: int = 0, warmup: int = 2,
                 reps: int = 5) -> ReadMeasurement:
    """Time ``decode_read`` on ``cache`` with a random query of ``q_heads`` heads (default: KV heads)."""
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.timing import measure

    g = cache.geometry
    q_heads = g.kv_heads if q_heads is None else integer("q_heads", q_heads, 1)
    if q_heads % g.kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of the cache's kv_heads ({g.kv_heads})")
    q = torch.randn(cache.batch, q_heads, g.head_dim, dtype=cache.k.dtype, device=cache.k.device)
    decode_read(cache, q, layer)  # validates once; the timed calls skip nothing else
    timing = measure(lambda: _decode_read(cache, q, layer), warmup=warmup, reps=reps, device=cache.k.device)
    kv, moved = read_traffic(cache)
    return ReadMeasurement(cache.layout, cache.batch, cache.length, q_heads, g.kv_heads, g.head_dim,
                           _dtype_name(cache.k), timing, kv, moved, calibrate().copy_bytes_per_s)


def append_traffic(cache: KVCache, method: str) -> tuple[int, int]:
    """(bytes of the new tokens' K and V, bytes the append moves) for all layers.

    An in-place write reads the new token and writes it (``2 * new``). ``cat`` reads the held
    tokens and the new one and writes them all to a new tensor.
    """
    new = cache.geometry.layers * cache.batch * cache.bytes_per_token
    if method == "cat":
        return new, 2 * new * (cache.length + 1)
    return new, 2 * new


def measure_append(cache: KVCache, method: str | None = None, warmup: int = 2, reps: int = 5) -> AppendMeasurement:
    """Time appending one token per sequence at position ``cache.length``, without advancing it.

    Each timed call overwrites the same slot (``index``, ``slot``) or builds the same grown tensor
    (``cat``), so every call sees the same context.
    """
    from kvlab.lab.hardware import calibrate
    from kvlab.lab.timing import measure

    method = _check_method(cache, method)
    g = cache.geometry
    shape = (g.layers, cache.batch, g.kv_heads, g.head_dim)
    k_new = torch.randn(shape, dtype=cache.k.dtype, device=cache.k.device)
    v_new = torch.randn_like(k_new)
    write = _writer(cache, method)
    timing = measure(lambda: write(k_new, v_new), warmup=warmup, reps=reps, device=cache.k.device)
    new, moved = append_traffic(cache, method)
    return AppendMeasurement(cache.layout, method, cache.batch, cache.length, g.kv_heads, g.head_dim,
                             _dtype_name(cache.k), timing, new, moved, calibrate().copy_bytes_per_s)


# --------------------------------------------------------------------------- GQA


@dataclass(frozen=True)
class GQARow:
    """Cache cost of one grouping of a model's query heads (section 9.4, seed 002 on GQA)."""

    group: int
    kv_heads: int
    bytes_per_token: float
    bytes_per_sequence: float


def gqa_cache_bytes(shape, context: int, bytes_per_element: float = 2, groups=None) -> list[GQARow]:
    """KV-cache bytes per token and per ``context``-token sequence as query heads share KV heads.

    ``shape`` is a ``ModelShape``; ``groups`` the query heads per KV head to tabulate (default:
    every divisor of the query-head count, 1 = multi-head attention). Uses
    ``ModelShape.kv_bytes_per_token`` with the KV-head count replaced.
    """
    from kvlab.theory.shapes import ModelShape

    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a kvlab ModelShape, got {type(shape).__name__}")
    if shape.latent_dim is not None:
        raise ValueError(f"{shape.name} caches a latent (MLA), not per-head K and V: GQA grouping does not apply")
    context = integer("context", context, 1)
    divisors = [g for g in range(1, shape.q_heads + 1) if shape.q_heads % g == 0]
    groups = divisors if groups is None else list(groups)
    rows = []
    for group in groups:
        group = integer("group", group, 1)
        if shape.q_heads % group:
            raise ValueError(f"group must divide {shape.name}'s {shape.q_heads} query heads; allowed: {divisors}")
        grouped = dataclasses.replace(shape, kv_heads=shape.q_heads // group)
        per_token = grouped.kv_bytes_per_token(bytes_per_element)
        rows.append(GQARow(group, grouped.kv_heads, per_token, per_token * context))
    return rows


# --------------------------------------------------------------------------- benchmark


def bench_rows(rounds: int = 5, context: int | None = None, batch: int | None = None) -> list:
    """Read bandwidth and append cost of the four layouts, and MHA against GQA, side by side (9.4).

    Each round measures every layout and method once, interleaved; the rows are medians over rounds,
    and ratios of medians from the same run. CPU: batch 4, context 2048, 8 heads of 64, fp32.
    GPU: batch 32, context 4096, 32 query and 8 KV heads of 128, bf16.
    """
    import statistics

    from kvlab.lab.bench import Row
    from kvlab.lab.hardware import calibrate, on_gpu

    rounds = integer("rounds", rounds, 1)
    gpu = on_gpu()
    batch = integer("batch", batch, 1) if batch is not None else (32 if gpu else 4)
    context = integer("context", context, 1) if context is not None else (4096 if gpu else 2048)
    q_heads, kv_heads, dim = (32, 8, 128) if gpu else (8, 8, 64)
    caches = {layout: new_cache(layout, batch=batch, length=context, kv_heads=kv_heads, head_dim=dim, seed=i)
              for i, layout in enumerate(LAYOUTS)}
    reads: dict[str, list] = {layout: [] for layout in LAYOUTS}
    appends: dict[tuple, list] = {(lay, m): [] for lay in LAYOUTS for m in APPEND_METHODS[lay]}
    for _ in range(rounds):
        for layout, cache in caches.items():
            reads[layout].append(measure_read(cache, q_heads, warmup=1, reps=3))
            for method in APPEND_METHODS[layout]:
                appends[layout, method].append(measure_append(cache, method, warmup=1, reps=5))
    copy = calibrate().copy_bytes_per_s
    where = (f"batch {batch}, context {context}, {q_heads} q / {kv_heads} KV heads of {dim}, "
             f"{_dtype_name(caches['BHTD'].k)}, one layer")
    read_s = {lay: statistics.median(m.timing.median for m in ms) for lay, ms in reads.items()}
    rows = []
    for layout, ms in reads.items():
        kv, moved = ms[0].kv_bytes, ms[0].moved_bytes
        rows.append(Row(f"read {layout}", kv / read_s[layout] / 1e9, "GB/s", f"useful K+V bytes/s; {where}"))
        rows.append(Row(f"read {layout} moved / copy", moved / read_s[layout] / copy, "fraction",
                        f"moved {moved / kv:.2f}x the K+V bytes; copy {copy / 1e9:.1f} GB/s"))
    for paged in PAGED:
        for contiguous in ("BHTD", "BTHD"):
            rows.append(Row(f"read time {paged} / {contiguous}", read_s[paged] / read_s[contiguous], "x",
                            "ratio of medians, same run; paged gathers through its block table"))
    append_s = {key: statistics.median(m.per_token_s for m in ms) for key, ms in appends.items()}
    how = {"index": "write into preallocated slots", "cat": "torch.cat growth, as DynamicCache",
           "slot": "indexed write through the block table"}
    for (layout, method), seconds in append_s.items():
        note = ("kvlab.kernels.store_kv" + ("" if gpu else "_ref") + ", argument checks included"
                if layout == "NHD" else how[method])
        rows.append(Row(f"append {layout} {method}", seconds * 1e6, "µs/token", f"one layer; {note}"))
    for layout in ("BHTD", "BTHD"):
        rows.append(Row(f"append {layout} cat / index", append_s[layout, "cat"] / append_s[layout, "index"], "x",
                        "torch.cat growth copies the whole layer's cache"))
    rows.append(Row("read / append (BTHD index)", read_s["BTHD"] / (append_s["BTHD", "index"] * batch), "x",
                    "one decode step: read all K+V vs write one token per sequence"))
    rows += _gqa_rows(rounds, batch, context, q_heads, dim)
    return rows


def _gqa_rows(rounds: int, batch: int, context: int, q_heads: int, dim: int) -> list:
    import statistics

    from kvlab.lab.bench import Row

    kv_choices = (q_heads, q_heads // 4)
    caches = {h: new_cache("BHTD", batch=batch, length=context, kv_heads=h, head_dim=dim, seed=h) for h in kv_choices}
    times: dict[int, list] = {h: [] for h in kv_choices}
    for _ in range(rounds):
        for h, cache in caches.items():
            times[h].append(measure_read(cache, q_heads, warmup=1, reps=3).timing.median)
    mha, gqa = (statistics.median(times[h]) for h in kv_choices)
    return [
        Row(f"read MHA ({kv_choices[0]} KV) / GQA ({kv_choices[1]} KV)", mha / gqa, "x",
            f"{q_heads} query heads both; cache bytes ratio {kv_choices[0] // kv_choices[1]}x"),
    ]
