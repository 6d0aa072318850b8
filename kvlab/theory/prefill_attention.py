"""The work of one paged prefill ("extend") attention launch: FLOPs and bytes (notebooks 06 and 11).

A sequence brings ``n`` new query tokens at the end of a context of ``c`` tokens (``c - n`` cached).
Query ``i`` of the chunk sees ``c - n + i + 1`` keys, so the chunk attends

    pairs(n, c) = n (c - n) + n (n + 1) / 2

(query, key) pairs. Each pair costs a score and a weighted sum per query head, ``4 d_h`` FLOP (``A =
4 n_q d_h`` per layer, the attention term of the decode step; softmax is left out as lower order).
The bytes a launch cannot avoid are: the queries read and the outputs written (``n n_q d_h w``
each), each context's K and V read once per KV head (``2 c n_kv d_h w``), and the block-table
entries and lengths that say where they are. A kernel that tiles the queries reads each tile's keys
again, up to that tile's last query: ``tile_bytes`` counts those reads, an upper bound on memory
traffic that caches can only lower. A decode step (``n = 1``) gives back the decode attention's
figures, ``4 n_q d_h c`` FLOP over ``2 c n_kv d_h w`` cache bytes (KV Cache Memory Wall, 2026, Eqs.
1, 5).

Pure Python: importable without torch. Dividing by a measured time gives FLOP/s and bytes/s, and
those by the machine's matmul rate and copy bandwidth the fractions of its ceilings;
:func:`attention_floor` gives the roofline's lower bound on an accelerator (Williams et al. 2009).
With ``tokens_per_tile=1`` the same formulas give the cost of attending one query token at a time,
each reading its whole context (a prefill run as decode rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import flag, integer
from kvlab.theory.specs import accelerator

INDEX_BYTES = 4  # int32 block-table entries and lengths


def visible_pairs(query_len: int, context_len: int) -> int:
    """(query, key) pairs a causal chunk of ``query_len`` tokens at the end of ``context_len``
    attends."""
    n = integer("query_len", query_len, 0)
    c = integer("context_len", context_len, n)
    return n * (c - n) + n * (n + 1) // 2


def tile_keys(query_len: int, context_len: int, tokens_per_tile: int) -> int:
    """Keys a query-tiled kernel reads for one chunk and one KV head: each tile reads keys 0 up to
    its last query."""
    n = integer("query_len", query_len, 0)
    c = integer("context_len", context_len, n)
    t = integer("tokens_per_tile", tokens_per_tile, 1)
    return sum(c - n + min(start + t, n) for start in range(0, n, t))


@dataclass(frozen=True)
class PrefillWork:
    """FLOPs and bytes of one attention launch (one layer) over a batch of chunks."""

    flops: int
    bytes: int  # compulsory: Q, O, every context's K and V once, block-table entries and lengths
    tile_bytes: int  # as a query-tiled kernel requests them: K and V once per query tile

    @property
    def intensity(self) -> float:
        """FLOP per compulsory byte."""
        return self.flops / self.bytes if self.bytes else 0.0


def prefill_attention_work(
    query_lens,
    context_lens,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    element_bytes: int = 2,
    block_size: int = 16,
    tokens_per_tile: int | None = None,
) -> PrefillWork:
    """FLOPs and bytes of one paged prefill attention launch (notebooks 06 and 11).

    ``query_lens[b]`` new tokens of sequence ``b`` at the end of its ``context_lens[b]``;
    ``tokens_per_tile`` query tokens per program of the kernel (None: one tile per chunk, so
    ``tile_bytes == bytes``).
    """
    chunks = _chunks(query_lens, context_lens)
    hq, hkv = integer("num_q_heads", num_q_heads), integer("num_kv_heads", num_kv_heads)
    if hq % hkv:
        raise ValueError(f"num_q_heads ({hq}) must be a multiple of num_kv_heads ({hkv})")
    d, w = integer("head_dim", head_dim), integer("element_bytes", element_bytes)
    bs = integer("block_size", block_size)
    pairs = sum(visible_pairs(n, c) for n, c in chunks)
    query_bytes = 2 * sum(n for n, _ in chunks) * hq * d * w  # Q read, O written
    active = [(n, c) for n, c in chunks if n]  # a sequence without new tokens is never read
    metadata = INDEX_BYTES * (2 * len(chunks) + 1 + sum(-(-c // bs) for _, c in active))
    kv_bytes = 2 * sum(c for _, c in active) * hkv * d * w
    if tokens_per_tile is None:
        tiled_kv = kv_bytes
    else:
        tiled_kv = 2 * sum(tile_keys(n, c, tokens_per_tile) for n, c in active) * hkv * d * w
    return PrefillWork(
        flops=4 * hq * d * pairs,
        bytes=query_bytes + kv_bytes + metadata,
        tile_bytes=query_bytes + tiled_kv + metadata,
    )


def _chunks(query_lens, context_lens) -> list[tuple[int, int]]:
    """(new tokens, context) per sequence, each checked: 0 <= new tokens <= context."""
    query_lens, context_lens = list(query_lens), list(context_lens)
    if len(query_lens) != len(context_lens):
        raise ValueError(
            f"query_lens and context_lens must have one entry per sequence, got {len(query_lens)} "
            f"and {len(context_lens)}"
        )
    chunks = []
    for b, (n, c) in enumerate(zip(query_lens, context_lens)):
        n = integer(f"query_lens[{b}]", n, 0)
        chunks.append((n, integer(f"context_lens[{b}]", c, n)))
    return chunks


@dataclass(frozen=True)
class AttentionFloor:
    """The roofline's floor of one launch: its FLOPs at the accelerator's bf16 rate and its bytes at
    its HBM bandwidth; the launch takes at least the larger (Williams et al. 2009)."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which ceiling sets the floor."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def attention_floor(work: PrefillWork, hw, tiled: bool = True) -> AttentionFloor:
    """The floor of ``work`` on ``hw`` (an ``Accelerator`` or its key in
    ``kvlab.theory.specs.SPECS``): with ``tiled`` the bytes a query-tiled kernel requests
    (``tile_bytes``), else the compulsory ones.
    """
    if not isinstance(work, PrefillWork):
        raise TypeError(
            f"work must be a PrefillWork (from prefill_attention_work), got {type(work).__name__}"
        )
    hw, tiled = accelerator(hw), flag("tiled", tiled)
    nbytes = work.tile_bytes if tiled else work.bytes
    return AttentionFloor(work.flops / hw.bf16_flops, nbytes / hw.hbm_bytes_per_s)
