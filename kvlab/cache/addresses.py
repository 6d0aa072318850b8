"""Notebook 04, KV-cache layout (section 9.4): where each element of a KV pool lives.

Four layouts of one K pool; V is a second tensor of the same shape and layout:

* ``BHTD``, contiguous ``[layers, batch, kv_heads, tokens, head_dim]``: transformers' caches, SDPA's
  input;
* ``BTHD``, contiguous ``[layers, batch, tokens, kv_heads, head_dim]``: the order K/V projections
  produce;
* ``NHD``, paged ``[layers, num_blocks, block_size, kv_heads, head_dim]``: vLLM (Kwon et al. 2023),
  ``kvlab.kernels``;
* ``HND``, paged ``[layers, num_blocks, kv_heads, block_size, head_dim]``: FlashInfer's other
  choice.

**How the layer enters.** kvlab gives every layout a *leading layer dimension*: one K tensor and
one V tensor hold all layers, and ``k[layer]`` is the per-layer tensor an attention call receives
(for ``NHD`` exactly the ``[num_blocks, block_size, num_kv_heads, head_dim]`` pool of
``kvlab.kernels``). An engine that allocates one tensor per layer uses the same offsets without the
layer term. For the paged layouts a sequence's block table maps its logical block
``token // block_size`` to a physical block; the token sits at ``token % block_size`` inside it
(``locate``, the block lookup of the Decode and KV Cache chapter, 2026, section 9.5).

``KVGeometry`` is a pool's shape and its address arithmetic: ``address`` the element offset of
``(layer, seq, token, head, dim)``, ``formula`` and ``explain`` the same in symbols and in numbers.
The caches that live at these addresses are ``kvlab.cache.layout``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlab._checks import integer, one_of

LAYOUTS = ("BHTD", "BTHD", "NHD", "HND")
PAGED = ("NHD", "HND")

# Each layout's axes, outermost first, as (coordinate, coordinate symbol, size symbol).
_AXES = {
    "BHTD": (
        ("layer", "l", "L"),
        ("seq", "b", "B"),
        ("head", "h", "H"),
        ("token", "t", "T"),
        ("dim", "d", "D"),
    ),
    "BTHD": (
        ("layer", "l", "L"),
        ("seq", "b", "B"),
        ("token", "t", "T"),
        ("head", "h", "H"),
        ("dim", "d", "D"),
    ),
    "NHD": (
        ("layer", "l", "L"),
        ("block", "p", "N"),
        ("slot", "o", "S"),
        ("head", "h", "H"),
        ("dim", "d", "D"),
    ),
    "HND": (
        ("layer", "l", "L"),
        ("block", "p", "N"),
        ("head", "h", "H"),
        ("slot", "o", "S"),
        ("dim", "d", "D"),
    ),
}


# --------------------------------------------------------------------------- argument checks


def _check_index(name: str, value, high: int):
    """An int or an integer tensor, every entry in [0, high)."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(
                f"{name} must be an int or an integer tensor, got a {value.dtype} tensor"
            )
        if value.numel() and (int(value.min()) < 0 or int(value.max()) >= high):
            got = (
                int(value)
                if value.numel() == 1
                else f"values from {int(value.min())} to {int(value.max())}"
            )
            raise ValueError(f"{name} must be in [0, {high}), got {got}")
        return value
    return integer(name, value, 0, high)


def as_block_table(block_table) -> torch.Tensor:
    if isinstance(block_table, torch.Tensor):
        table = block_table
    else:
        try:
            table = torch.tensor(block_table)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"block_table must be a 2-D integer tensor or a list of equal-length lists ({e})"
            ) from None
    if table.dtype.is_floating_point or table.dtype == torch.bool:
        raise TypeError(f"block_table must hold integers, got {table.dtype}")
    if table.dim() != 2:
        raise ValueError(
            "block_table must be 2-D [sequences, blocks per sequence], got shape"
            f" {tuple(table.shape)}"
        )
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
        one_of("layout", self.layout, LAYOUTS)
        for name in ("layers", "kv_heads", "head_dim"):
            integer(name, getattr(self, name), 1)
        used, unused = (
            (("num_blocks", "block_size"), ("batch", "max_tokens"))
            if self.is_paged
            else (("batch", "max_tokens"), ("num_blocks", "block_size"))
        )
        for name in used:
            integer(name, getattr(self, name), 1)
        for name in unused:
            if getattr(self, name) != 0:
                kind = "paged" if name in ("num_blocks", "block_size") else "contiguous"
                raise ValueError(
                    f"{name} applies to {kind} layouts only; leave it 0 for {self.layout}"
                )

    @classmethod
    def contiguous(
        cls, layout: str, *, layers: int, batch: int, max_tokens: int, kv_heads: int, head_dim: int
    ) -> "KVGeometry":
        if layout in PAGED:
            raise ValueError(
                f"layout {layout!r} is paged; use KVGeometry.paged, or a layout in ('BHTD', 'BTHD')"
            )
        return cls(layout, layers, kv_heads, head_dim, batch=batch, max_tokens=max_tokens)

    @classmethod
    def paged(
        cls,
        layout: str,
        *,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
    ) -> "KVGeometry":
        if layout not in PAGED:
            raise ValueError(
                f"layout {layout!r} is contiguous; use KVGeometry.contiguous, or a layout in"
                f" {PAGED}"
            )
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
        sizes = {
            "layer": self.layers,
            "seq": self.batch,
            "token": self.max_tokens,
            "head": self.kv_heads,
            "dim": self.head_dim,
            "block": self.num_blocks,
            "slot": self.block_size,
        }
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
        """The tensor index of one element: a value per axis (paged: the block-table lookup
        done)."""
        _check_index("layer", layer, self.layers)
        _check_index("head", head, self.kv_heads)
        _check_index("dim", dim, self.head_dim)
        if not self.is_paged:
            _check_index("seq", seq, self.batch)
            _check_index("token", token, self.max_tokens)
            return {"layer": layer, "seq": seq, "head": head, "token": token, "dim": dim}
        if block_table is None:
            raise ValueError(
                f"a paged layout ({self.layout}) needs block_table to find a token's block"
            )
        table = as_block_table(block_table)
        if isinstance(token, torch.Tensor):
            table = table.to(token.device)  # index the table where the coordinates live
        rows, blocks_per_seq = table.shape
        _check_index("seq", seq, rows)
        _check_index("token", token, blocks_per_seq * self.block_size)
        physical = table[seq, token // self.block_size]
        _check_index(
            f"block_table entry (physical block of sequence {seq})", physical, self.num_blocks
        )
        if not any(isinstance(x, torch.Tensor) for x in (layer, seq, token, head, dim)):
            physical = int(physical)  # all-int arguments give an int offset
        return {
            "layer": layer,
            "block": physical,
            "slot": token % self.block_size,
            "head": head,
            "dim": dim,
        }

    def address(self, layer, seq, token, head, dim, block_table=None):
        """Element offset of ``(layer, seq, token, head, dim)`` in this pool (section 9.4).

        Arguments are ints, or integer tensors that broadcast (then the result is a tensor).
        ``block_table`` (paged layouts only): ``[sequences, blocks per sequence]`` physical block
        ids. Byte address = base pointer + offset * element size; K and V share offsets.
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

    def explain(
        self, layer: int, seq: int, token: int, head: int, dim: int, block_table=None
    ) -> str:
        """The formula with this element's numbers substituted, ending in its offset."""
        coords = self.coordinates(layer, seq, token, head, dim, block_table)
        values = [int(coords[a]) for a in self.axes]
        expr = str(values[0])
        for value, size in zip(values[1:], self.shape[1:]):
            expr = f"({expr}·{size} + {value})"
        lookup = ""
        if self.is_paged:
            lookup = (
                f"p = table[{seq}][{token} // {self.block_size}] ="
                f" table[{seq}][{token // self.block_size}] = {int(coords['block'])}, o = {token}"
                f" mod {self.block_size} = {int(coords['slot'])};  "
            )
        return (
            f"{lookup}offset = {expr[1:-1]} ="
            f" {int(self.address(layer, seq, token, head, dim, block_table)):,}"
        )


def locate(token: int, block_table_row, block_size: int) -> tuple[int, int]:
    """(physical block, slot) of a sequence's ``token``: the block-table lookup of sections 9.4 and
    9.5."""
    block_size = integer("block_size", block_size, 1)
    row = list(
        block_table_row.tolist() if isinstance(block_table_row, torch.Tensor) else block_table_row
    )
    token = integer("token", token, 0, len(row) * block_size)
    block = integer(f"block_table_row[{token // block_size}]", row[token // block_size], 0)
    return block, token % block_size
