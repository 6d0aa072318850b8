"""Notebooks 05, 06 and 11: the argument and invariant checks of the block allocator, the block
manager and the paged cache (:mod:`kvlab.cache.blocks`, :mod:`~kvlab.cache.block_manager`,
:mod:`~kvlab.cache.paged`), and the error a pool without enough free blocks raises.

Those modules hold the mechanism; a public method there checks all its arguments in one call, into
:mod:`kvlab._checks`' vocabulary or into the compound checks below, which return the converted
values. Every check runs before anything changes, and its message names the argument, the value and
what is allowed.
``manager_invariants`` and ``paged_invariants`` are the bodies of ``BlockManager.check`` and
``PagedKVCache.check`` (the property tests call them after every step).
"""

from __future__ import annotations

import numbers

from kvlab import _checks as checks
from kvlab._checks import flag, integer, integers, one_of, positive, require_memory, token_ids


def optional(check, name: str, value, *args):
    """``value`` checked by ``check(name, value, *args)``, or None."""
    return None if value is None else check(name, value, *args)


# --------------------------------------------------------------------------- free blocks


class OutOfBlocksError(MemoryError):
    """Not enough free blocks: ``needed``, ``free`` and ``total`` blocks, and bytes when the caller
    knows the size of a block; ``what`` says what needed them."""

    def __init__(self, needed, free, total, bytes_per_block=None, what=None):
        message = (
            f"{what + ' ' if what else ''}need{'s' if what else ''} {needed} KV-cache block(s) but"
            f" only {free} of {total} are free"
        )
        if bytes_per_block:
            message += (
                f" ({needed * bytes_per_block:,} bytes needed, {free * bytes_per_block:,} bytes"
                f" free, {bytes_per_block:,} bytes per block)"
            )
        super().__init__(message + "; free or preempt a sequence first")
        self.needed, self.free, self.total = needed, free, total


def free_blocks(manager, needed: int) -> None:
    """Refuse a call that needs more free blocks than ``manager`` has."""
    if needed > manager.num_free:
        total, size = manager.num_blocks, manager.bytes_per_block
        raise OutOfBlocksError(needed, manager.num_free, total, size)


# --------------------------------------------------------------------------- blocks and tables


def pool_size(num_blocks, max_block_id: int, bytes_per_block: int) -> int:
    """``num_blocks`` as the size of a pool whose bookkeeping fits in host memory."""
    num_blocks = integer("num_blocks", num_blocks, 1, max_block_id + 1)
    what = f"a pool of {num_blocks:,} blocks (allocator bookkeeping)"
    require_memory(what, num_blocks * bytes_per_block, "cpu")
    return num_blocks


def free_args(pool, block, cached) -> tuple[int, bool]:
    """``(block, cached)`` for ``BlockAllocator.free``: a held block and a flag."""
    flag("cached", cached)
    return held_block(pool, block, "free"), cached


def allocation(pool, count) -> int:
    """``count`` as a number of blocks ``pool`` has free."""
    count = integer("count", count, 0)
    if count > pool.num_free:
        raise OutOfBlocksError(count, pool.num_free, pool.num_blocks)
    return count


def known_block(pool, block) -> int:
    """``block`` as an id of ``pool``'s blocks."""
    return integer("block", block, 0, pool.num_blocks)


def held_block(pool, block, action: str) -> int:
    """``block`` as an id of a block someone holds (``action``: what the caller does to it)."""
    if pool.ref_count(block) == 0:  # ref_count checks the id
        raise ValueError(f"cannot {action} block {block}: it is free (not allocated)")
    return int(block)


def free_block(pool, block) -> int:
    """``block`` as an id of a block nobody holds."""
    if pool.ref_count(block):  # ref_count checks the id
        raise ValueError(
            f"cannot reclaim block {block}: it is held ({pool.ref_count(block)} holder(s))"
        )
    return int(block)


def block_ids(blocks, high: int) -> list[int]:
    """``blocks`` as a list of block ids, each in ``[0, high)``."""
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
        raise TypeError(
            f"blocks must be a list of block ids (ints), got {type(blocks).__name__} {blocks!r}"
        )
    return [integer(f"blocks[{i}]", b, 0, high) for i, b in enumerate(blocks)]


def table_args(block_size, blocks, num_tokens, high: int) -> tuple[int, list[int], int]:
    """``(block_size, blocks, num_tokens)`` of a ``BlockTable``."""
    block_size = integer("block_size", block_size, 1)
    blocks = block_ids(blocks, high)
    return block_size, blocks, table_tokens(num_tokens, len(blocks), block_size)


def table_tokens(num_tokens, num_blocks: int, block_size: int) -> int:
    """``num_tokens`` as a token count that ``num_blocks`` blocks of ``block_size`` hold."""
    integer("num_tokens", num_tokens, 0)
    if num_tokens > num_blocks * block_size:
        raise ValueError(
            f"num_tokens must be in [0, {num_blocks * block_size}] for {num_blocks} block(s) of"
            f" {block_size}, got {num_tokens}"
        )
    return num_tokens


def token_span(start, end, capacity: int) -> tuple[int, int]:
    """``(start, end)``, tokens ``start .. end - 1`` of a table that stores ``capacity`` tokens."""
    integer("start", start, 0)
    integer("end", end, start)
    if end > capacity:  # the first token past the blocks held, as physical_location names it
        integer("token", max(start, capacity), 0, capacity)
    return start, end


# --------------------------------------------------------------------------- hashes


def hash_args(ids, block_size) -> tuple[list[int], int]:
    """``(token_ids, block_size)`` of ``block_hashes``."""
    return token_ids("token_ids", ids, empty=True), integer("block_size", block_size)


def chain_args(parent, block_tokens) -> tuple[bytes, list[int]]:
    """``(parent, block_tokens)`` of ``chain_hash``."""
    return parent_hash(parent), token_ids("block_tokens", block_tokens)


def reusable_args(first_difference, num_tokens, block_size) -> tuple[int | None, int, int]:
    """``(first_difference, num_tokens, block_size)`` of ``reusable_tokens``."""
    num_tokens, block_size = integer("num_tokens", num_tokens), integer("block_size", block_size)
    return optional(integer, "first_difference", first_difference, 0), num_tokens, block_size


def salt(value):
    """``value`` if it can salt a hash chain: None, a str, bytes or an int."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return value
    raise TypeError(
        f"salt must be None, a str, bytes or an int, got {type(value).__name__} {value!r}"
    )


def parent_hash(value) -> bytes:
    """``value`` if it is the bytes of a hash."""
    if isinstance(value, bytes):
        return value
    kind = type(value).__name__
    raise TypeError(f"parent must be the bytes of a hash (root_hash, chain_hash), got {kind}")


# --------------------------------------------------------------------------- sequences


def sequence(seqs: dict, seq_id, state: str | None = None):
    """The record of live sequence ``seq_id`` in ``seqs``; ``state="resident"`` refuses a preempted
    one, ``state="preempted"`` a resident one."""
    seq = seqs.get(integer("seq_id", seq_id, 0))  # never True for sequence 1
    if seq is None:
        raise ValueError(f"seq_id {seq_id!r} is not a live sequence; live: {sorted(seqs)}")
    if state == "resident" and seq.state != "resident":
        raise ValueError(f"sequence {seq_id} is preempted ({seq.state}); resume({seq_id}) first")
    if state == "preempted" and seq.state == "resident":
        raise ValueError(f"sequence {seq_id} is not preempted")
    return seq


def own_snapshot(manager, snapshot) -> tuple:
    """A snapshot this very manager took (restoring another's would corrupt the pool)."""
    if not (isinstance(snapshot, tuple) and len(snapshot) == 7 and snapshot[0] is manager):
        raise ValueError(
            "snapshot must be what this BlockManager's snapshot() returned, got a"
            f" {type(snapshot).__name__} taken elsewhere (another manager's would corrupt the pool)"
        )
    return snapshot


def manager_args(prefix_caching, bytes_per_block, block_size) -> tuple:
    """The checked arguments of a ``BlockManager``, but ``num_blocks`` (its allocator's)."""
    prefix_caching = flag("prefix_caching", prefix_caching)
    bytes_per_block = optional(integer, "bytes_per_block", bytes_per_block)
    return prefix_caching, bytes_per_block, integer("block_size", block_size)


def prompt(ids) -> list[int]:
    """``ids`` as a prompt's token ids (not empty: a prompt needs a token to compute)."""
    return token_ids("token_ids", ids)


def resume_tokens(seqs: dict, seq_id, ids) -> list[int]:
    """``ids`` as the token ids of preempted sequence ``seq_id``: at least the tokens it held."""
    seq = sequence(seqs, seq_id, "preempted")
    ids = token_ids("token_ids", ids)
    if len(ids) < seq.num_tokens:
        raise ValueError(
            f"token_ids must hold sequence {seq_id}'s {seq.num_tokens} tokens (then any new"
            f" ones), got {len(ids)}"
        )
    return ids


def commit_args(manager, seq_id, value, ids) -> tuple[int, object]:
    """``(num_computed, token_ids)`` of ``commit``: ``value`` no fewer than the computed tokens
    before, no more than it holds; ``ids`` the sequence's finalized tokens (with prefix caching),
    at least as many as its cached blocks hold, each a token id up to the last full computed block
    (the blocks commit hashes come after the cached ones)."""
    seq = sequence(manager.seqs, seq_id, "resident")
    value = integer("num_computed", value, seq.num_computed, seq.num_tokens + 1)
    if not manager.prefix_caching:
        return value, []
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise TypeError(f"token_ids must be sequence {seq_id}'s token ids, got {ids!r:.80}")
    size, cached = manager.block_size, len(seq.hashes) * manager.block_size
    if len(ids) < cached:
        raise ValueError(
            f"token_ids holds {len(ids)} tokens, fewer than the {cached} of sequence {seq_id}'s"
            " cached blocks: pass its finalized tokens from the first"
        )
    end = max(cached, min(value, len(ids)) // size * size)
    return value, token_ids(f"token_ids[:{end}]", ids[:end], empty=True)


def truncation(seqs: dict, seq_id, num_tokens, block_size: int) -> tuple:
    """``(sequence record, num_tokens)`` of ``truncate``: no more than it holds, and not into a
    block whose hash it registered."""
    seq = sequence(seqs, seq_id, "resident")
    return seq, integer("num_tokens", num_tokens, len(seq.hashes) * block_size, seq.num_tokens + 1)


def append_count(seqs: dict, seq_id, num_tokens) -> tuple:
    """``(sequence record, num_tokens)`` of ``blocks_to_append``."""
    return sequence(seqs, seq_id, "resident"), integer("num_tokens", num_tokens, 0)


def preemption(owner, seq_id, mode, modes) -> str:
    """``mode`` if it is a preemption mode and ``seq_id`` a resident sequence of ``owner`` (a block
    manager, or a paged cache, where it must not be mid-step)."""
    one_of("mode", mode, modes)
    if hasattr(owner, "manager"):
        in_step(owner, seq_id)
    else:
        sequence(owner.seqs, seq_id, "resident")
    return mode


def forkable(seqs: dict, seq_id):
    """The record of a resident sequence whose reserved tokens all have their K and V written."""
    seq = sequence(seqs, seq_id, "resident")
    if seq.num_computed != seq.num_tokens:
        raise ValueError(
            f"sequence {seq_id} has {seq.num_tokens - seq.num_computed} reserved token(s)"
            " whose K and V are not written yet; fork it once they are (commit)"
        )
    return seq


def in_step(cache, seq_id):
    """``seq_id`` unless it is unknown, preempted, or half way through a by-hand append."""
    sequence(cache.manager.seqs, seq_id, "resident")
    counts = cache.layer_tokens[seq_id]
    if len(set(counts)) != 1:
        raise ValueError(
            f"sequence {seq_id} is mid-step (tokens per layer {counts}); finish appending "
            "to every layer first"
        )
    return seq_id


def written(cache, seq_id, value, ids) -> tuple[int, list[int]]:
    """``(num_computed, token_ids)`` of ``PagedKVCache.commit`` at its door: ``value`` no fewer than
    the computed tokens and none whose K and V not every layer holds (committing them would let a
    later prefix hit read K and V nobody wrote); ``ids`` the sequence's token ids through them."""
    held = cache.layer_tokens[in_step(cache, seq_id)][0]
    if integer("num_computed", value, cache.num_computed(seq_id)) > held:
        raise ValueError(
            f"num_computed must be at most {held}, the tokens of sequence {seq_id} whose K and V"
            f" every layer holds (append writes them), got {value}; a model step commits"
            " the tokens it schedules with checked=True"
        )
    ids = token_ids("token_ids", ids, empty=True)
    if len(ids) < value:
        raise ValueError(
            f"token_ids must hold sequence {seq_id}'s first {value} tokens, got {len(ids)}"
        )
    return value, ids


def step_count(cache, seq_id, num_tokens) -> int:
    """``num_tokens`` as a count of tokens (0 allowed), once ``seq_id`` is ready for a step."""
    in_step(cache, seq_id)
    return integer("num_tokens", num_tokens, 0)


def resident(cache, seq_ids) -> list[int]:
    """``seq_ids`` as a list of ids of resident sequences."""
    seq_ids = integers("seq_ids", seq_ids, 0, empty=True)
    for seq_id in seq_ids:
        sequence(cache.manager.seqs, seq_id, "resident")
    return seq_ids


def lens_args(cache, seq_ids, layer) -> tuple[int, list[int]]:
    """``(layer, seq_ids)`` of ``seq_lens``; layer None is layer 0."""
    layer = integer("layer", 0 if layer is None else layer, 0, cache.num_layers)
    return layer, resident(cache, seq_ids)


def gather_layer(cache, seq_id, layer) -> int:
    """``layer`` as a layer of ``cache``, once ``seq_id`` is a resident sequence."""
    layer = integer("layer", layer, 0, cache.num_layers)
    sequence(cache.manager.seqs, seq_id, "resident")
    return layer


# --------------------------------------------------------------------------- tensors


def cache_args(num_layers, block_size, num_kv_heads, head_dim, dtype, store, device) -> tuple:
    """The four sizes (positive ints), dtype, store and device (None or checked) of a
    ``PagedKVCache``."""
    sizes = dict(
        num_layers=num_layers, block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim
    )
    sizes = [integer(name, value) for name, value in sizes.items()]
    dtype, store = checks.dtype("dtype", dtype), optional(checks.function, "store", store)
    return (*sizes, dtype, store, optional(checks.device, "device", device))


def append_args(cache, seq_id, layer, k, v, ids) -> tuple:
    """``(layer, k, v, the sequence's token ids)`` of a by-hand ``append``."""
    layer = integer("layer", layer, 0, cache.num_layers)
    sequence(cache.manager.seqs, seq_id, "resident")
    k, v = kv_rows(k, v, cache.num_kv_heads, cache.head_dim, cache.dtype, cache.device)
    return layer, k, v, append_ids(cache, seq_id, layer, k.shape[0], ids)


def pool_memory(cache, shape: tuple) -> None:
    """Room on ``cache.device`` for its K and V pools of ``shape``, one of each per layer."""
    what = f"K and V pools {shape} x {cache.num_layers} layers"
    require_memory(what, cache.num_blocks * cache.bytes_per_block, cache.device)


def kv_rows(k, v, heads: int, dim: int, dtype, device):
    """``k`` and ``v``, ``[tokens, heads, dim]`` floating tensors of one shape, on ``device`` in
    ``dtype``."""
    import torch

    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 or tuple(t.shape[1:]) != (heads, dim):
            raise ValueError(
                f"{name} must be [tokens, {heads}, {dim}] (num_kv_heads, head_dim), got"
                f" {tuple(t.shape)}"
            )
        if not t.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating-point tensor (stored as {dtype}), got {t.dtype}"
            )
        if t.device.type == "meta":
            raise ValueError(f"{name} is on the meta device (no data); pass a tensor on {device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    return k.to(device, dtype), v.to(device, dtype)


def append_ids(cache, seq_id, layer: int, count: int, ids) -> list[int]:
    """The sequence's tokens through the ``count`` rows a by-hand append stores in ``layer`` (the
    ids its commit hashes; required with prefix caching, else zeros by default)."""
    start, ahead = cache.layer_tokens[seq_id][layer], cache.layer_tokens[seq_id][0]
    if layer > 0 and start + count > ahead:
        raise ValueError(
            f"layer {layer} of sequence {seq_id} would hold {start + count} tokens but layer 0 "
            f"holds {ahead}: append to layer 0 first (it reserves the slots)"
        )
    if ids is None:
        if cache.prefix_caching:
            raise ValueError(
                "token_ids is required with prefix caching on: the block hashes are made of them"
            )
        return [0] * (start + count)
    ids = token_ids("token_ids", ids, empty=True)
    if len(ids) != start + count:
        raise ValueError(
            f"token_ids must hold sequence {seq_id}'s tokens through these rows ({start} + {count}"
            f" = {start + count}), got {len(ids)}"
        )
    return ids


def pool_blocks(k_pools, v_pools, blocks) -> list[int]:
    """``blocks`` as ids of the blocks of ``k_pools`` and ``v_pools``, equally long lists of 4-D
    tensors, one per layer."""
    import torch

    if (
        not isinstance(k_pools, (list, tuple))
        or not k_pools
        or len(k_pools) != len(v_pools)
        or not all(isinstance(p, torch.Tensor) and p.dim() == 4 for p in (*k_pools, *v_pools))
    ):
        raise TypeError(
            "k_pools and v_pools must be equally long lists of [num_blocks, block_size, kv_heads, "
            "head_dim] tensors, one per layer (PagedKVCache.k_pools and .v_pools)"
        )
    return integers("blocks", blocks, 0, k_pools[0].shape[0], empty=True)  # no wrap-around


def budget_args(budget_bytes, value, bytes_per_element):
    """``value`` if it is a kvlab ``ModelShape``, and the two sizes positive."""
    from kvlab.theory.shapes import ModelShape

    positive("budget_bytes", budget_bytes)
    positive("bytes_per_element", bytes_per_element)
    if not isinstance(value, ModelShape):
        raise TypeError(
            "shape must be a kvlab ModelShape (see kvlab.theory.shapes.SHAPES), got"
            f" {type(value).__name__}"
        )
    return value


# --------------------------------------------------------------------------- invariants


def _require(condition: bool, message: str, what: str = "block manager") -> None:
    if not condition:
        raise AssertionError(f"{what} invariant broken: {message}")


def manager_invariants(m) -> None:
    """Raise AssertionError unless ``m``'s bookkeeping is consistent: every block counted once (free
    plus held equals the pool), reference counts equal holders, tables sized to their tokens, a
    block shared only by tables that agree on its place and hashes, and every registered block
    that someone holds written and hashed as its holders hashed it."""
    holders = _holders(m)
    free = set(m.allocator.free_order())
    _require(len(free) + len(holders) == m.num_blocks, "free plus held blocks is not the pool")
    for block in range(m.num_blocks):
        count, refs = len(holders.get(block, [])), m.allocator.ref_count(block)
        _require(refs == count, f"block {block}: reference count {refs}, holders {count}")
        _require((block in free) == (count == 0), f"block {block} is free and held, or neither")
    for block, places in holders.items():
        _require(
            all(p[:2] == places[0][:2] for p in places),
            f"block {block} is shared by tables that disagree on its place or hashes",
        )
    for h, block in m.cached_blocks().items():
        _require(m.block_hash(block) == h, f"block {block}'s hash does not match the hash table")
        for k, _, seq in holders.get(block, []):
            _require(
                (k + 1) * m.block_size <= seq.num_computed and seq.hashes[k] == h,
                f"block {block} is registered but not written, or under another hash",
            )


def _holders(m) -> dict[int, list]:
    """Each held block's holders: (logical index, the hashes up to it, the sequence)."""
    holders: dict[int, list] = {}
    for i, seq in m.seqs.items():
        _require(
            len(set(seq.blocks)) == len(seq.blocks),
            f"sequence {i} names a block twice: {seq.blocks}",
        )
        expected = -(-seq.num_tokens // m.block_size) if seq.state == "resident" else 0
        _require(
            len(seq.blocks) == expected,
            f"sequence {i}: {seq.num_tokens} tokens in {len(seq.blocks)} blocks",
        )
        _require(
            0 <= seq.num_computed <= seq.num_tokens, f"sequence {i} computed more than it holds"
        )
        for k, block in enumerate(seq.blocks):
            holders.setdefault(block, []).append((k, seq.hashes[: k + 1], seq))
    return holders


def paged_invariants(cache) -> None:
    """The block manager's invariants, and each sequence's layers between its computed and held
    tokens."""
    manager_invariants(cache.manager)
    for seq_id, counts in cache.layer_tokens.items():
        computed, held = cache.num_computed(seq_id), cache.num_tokens(seq_id)
        _require(
            min(counts) == computed and max(counts) == counts[0] <= held,
            f"sequence {seq_id} holds {held} tokens, {computed} computed, per layer {counts}",
            "paged cache",
        )
        _require(
            cache.is_swapped(seq_id) == (seq_id in cache.host),
            f"sequence {seq_id}'s host copy",
            "paged cache",
        )
