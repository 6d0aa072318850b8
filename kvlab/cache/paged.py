"""Notebooks 05, 06 and 11: the paged KV cache, per-layer K and V pools over one block manager.

``k_pools[layer]`` and ``v_pools[layer]`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``
(Kwon et al. 2023); one :class:`~kvlab.cache.block_manager.BlockManager` (prefix caching on or off)
owns the block tables, and all layers of a sequence share its table: token ``t`` sits in the same
block and offset in every layer.

Two ways to write K and V:

- a model step (:mod:`kvlab.serving`): ``admit`` or ``reserve`` the step's slots, run the model (its
  attention function stores every layer's new K and V at those slots), then ``commit``;
- by hand, one layer at a time (notebook 05): ``append(seq_id, layer, k, v)``. Layer 0 goes first
  and reserves the slots; layers 1.. write into slots layer 0 already owns, and may not run ahead.

``fork`` shares every block (reference counts); the first append that writes into a shared, partly
filled last block copies it first, in every layer (copy-on-write). ``preempt(seq_id, "recompute")``
drops a sequence's blocks; ``"swap"`` copies its K and V to host memory first; ``resume`` brings
it back. All of them work with prefix caching on.

A call that fails changes nothing: every method checks its arguments first, and the ones that
write tensors restore a snapshot if the write fails (``all_or_nothing``), under the block manager's
rollback rule (an evicted hash stays evicted).
"""

from __future__ import annotations

from collections import Counter

import torch

from kvlab import _checks, kernels
from kvlab._checks import integer, integers, one_of, require_memory, restoring
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.blocks import PREEMPTION_MODES, BlockTable, OutOfBlocksError
from kvlab.devices import device as default_device


def copy_blocks_to_host(k_pools, v_pools, blocks: list[int]) -> tuple:
    """K and V of ``blocks`` in every layer, copied to host memory: ``(k, v)``, each
    ``[layers, len(blocks), block_size, kv_heads, head_dim]``. Notebook 05 (swap preemption).

    On a GPU the host copies are pinned, so the transfer runs at the link's speed; the call returns
    once they are complete.
    """
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
    blocks = integers(
        "blocks", blocks, 0, k_pools[0].shape[0], empty=True
    )  # a negative id would wrap around
    device = k_pools[0].device
    index = torch.tensor(blocks, dtype=torch.long, device=device)
    pin = device.type == "cuda"
    host = []
    for pools in (k_pools, v_pools):
        stacked = torch.stack([pool[index] for pool in pools])
        copy = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=pin)
        copy.copy_(stacked, non_blocking=pin)
        host.append(copy)
    if pin:
        torch.cuda.synchronize(device)
    return tuple(host)


class PagedKVCache:
    """Per-layer K and V pools and one :class:`~kvlab.cache.block_manager.BlockManager` (notebooks
    05, 06, 11).

    ``store`` writes the by-hand ``append`` (default :func:`kvlab.kernels.store_kv`; pass
    ``kvlab.kernels.store_kv_ref`` to time host-side work on a CPU). A model step stores through
    the attention function instead (:mod:`kvlab.serving.attention`).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype=torch.float16,
        device=None,
        store=None,
        prefix_caching: bool = False,
    ):
        for name, value in (
            ("num_layers", num_layers),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            integer(name, value, 1)
        _checks.dtype("dtype", dtype)
        if store is not None:
            _checks.function("store", store)
        self.device = _checks.device("device", device) if device is not None else default_device()
        self.num_layers, self.block_size = num_layers, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.manager = BlockManager(
            num_blocks, block_size, prefix_caching, bytes_per_block=self.bytes_per_block
        )
        self.num_blocks = self.manager.num_blocks
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        require_memory(
            f"K and V pools {shape} x {num_layers} layers",
            num_blocks * self.bytes_per_block,
            self.device,
        )
        self.k_pools = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.v_pools = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self._store = store
        self._layer_tokens: dict[
            int, list[int]
        ] = {}  # per sequence: tokens whose K and V each layer holds
        self._host: dict[int, tuple] = {}  # swapped-out sequences' K and V
        self.preemptions = Counter()  # {"recompute": n, "swap": n}

    # -- sizes and queries ---------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    @property
    def num_free(self) -> int:
        return self.manager.num_free

    @property
    def prefix_caching(self) -> bool:
        return self.manager.prefix_caching

    def sequences(self) -> list[int]:
        return self.manager.sequences()

    def table(self, seq_id: int) -> BlockTable:
        return self.manager.table(seq_id)

    def block_table(self, seq_id: int) -> list[int]:
        """``seq_id``'s physical blocks in logical order (a copy)."""
        return self.manager.block_table(seq_id)

    def tokens(self, seq_id: int) -> list[int]:
        return self.manager.tokens(seq_id)

    def num_tokens(self, seq_id: int) -> int:
        """Tokens whose slots ``seq_id`` holds (reserved, written or not)."""
        return self.manager.num_tokens(seq_id)

    def num_computed(self, seq_id: int) -> int:
        """Leading tokens whose K and V every layer holds."""
        return self.manager.num_computed(seq_id)

    def state(self, seq_id: int) -> str:
        return self.manager.state(seq_id)

    def is_swapped(self, seq_id: int) -> bool:
        return self.manager.state(seq_id) == "swap"

    def blocks_to_admit(self, token_ids, salt=None) -> int:
        return self.manager.blocks_to_admit(token_ids, salt)

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        return self.manager.blocks_to_append(seq_id, num_tokens)

    def blocks_to_resume(self, seq_id: int, token_ids=()) -> int:
        return self.manager.blocks_to_resume(seq_id, token_ids)

    # -- sequences and slots -------------------------------------------------------------------

    def new_sequence(self, salt=None) -> int:
        """An empty sequence (no blocks yet); returns its id."""
        seq_id = self.manager.new_sequence(salt)
        self._layer_tokens[seq_id] = [0] * self.num_layers
        return seq_id

    def admit(self, token_ids, salt=None) -> tuple[int, int]:
        """A sequence holding the slots of prompt ``token_ids``; returns ``(seq_id,
        cached_tokens)``. The first ``cached_tokens`` tokens' K and V are already in the pools
        (prefix hits)."""
        seq_id, cached = self.manager.admit(token_ids, salt)
        self._layer_tokens[seq_id] = [cached] * self.num_layers
        return seq_id, cached

    def reserve(self, seq_id: int, token_ids) -> None:
        """Slots for ``token_ids`` after ``seq_id``'s tokens; a shared, partly filled last block is
        copied first, in every layer (copy-on-write)."""
        self.require_in_step(seq_id)
        tokens = _checks.token_ids("token_ids", token_ids, empty=True)
        new = -(-(self.num_tokens(seq_id) + len(tokens)) // self.block_size) - len(
            self.block_table(seq_id)
        )
        if (
            self.blocks_to_append(seq_id, len(tokens)) == new
        ):  # no copy: the manager's reserve is all or nothing
            self.manager.reserve(seq_id, tokens)
            return
        with self.all_or_nothing():
            self._reserve(seq_id, tokens)

    def commit(self, seq_id: int, num_computed: int) -> None:
        """Every layer now holds the K and V of ``seq_id``'s first ``num_computed`` tokens."""
        self.manager.commit(seq_id, num_computed)
        self._layer_tokens[seq_id] = [num_computed] * self.num_layers

    def append(
        self, seq_id: int, layer: int, k: torch.Tensor, v: torch.Tensor, token_ids=None
    ) -> None:
        """Store ``k`` and ``v`` (``[tokens, num_kv_heads, head_dim]``) after ``seq_id``'s tokens in
        ``layer``.

        Layer 0 writes first: into slots ``admit`` reserved and, past them, into new slots it
        reserves for tokens ``token_ids`` (one per row; required with prefix caching on, else ids
        0). Other layers follow. When every layer holds a token, it counts as computed (``commit``).
        All or nothing: on any error no block, count or table has changed."""
        layer = integer("layer", layer, 0, self.num_layers)
        self._require_resident(seq_id)
        k, v = self._check_kv(k, v)
        start, count = self._layer_tokens[seq_id][layer], k.shape[0]
        new_ids = self._new_token_ids(seq_id, layer, start, count, token_ids)
        with self.all_or_nothing():
            if new_ids:
                self._reserve(seq_id, new_ids)
            slots = torch.tensor(
                self.table(seq_id).slots(start, start + count),
                dtype=torch.int64,
                device=self.device,
            )
            (self._store or kernels.store_kv)(k, v, self.k_pools[layer], self.v_pools[layer], slots)
            self._layer_tokens[seq_id][layer] += count
            self.manager.commit(seq_id, min(self._layer_tokens[seq_id]))

    def fork(self, seq_id: int) -> int:
        """A new sequence that shares every block of ``seq_id`` (reference counts, no copy)."""
        self.require_in_step(seq_id)
        child = self.manager.fork(seq_id)
        self._layer_tokens[child] = list(self._layer_tokens[seq_id])
        return child

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id`` and its hold on every block (with prefix caching, full written blocks
        stay cached)."""
        self.manager.free(seq_id)
        del self._layer_tokens[seq_id]
        self._host.pop(seq_id, None)

    # -- preemption ----------------------------------------------------------------------------

    def preempt(self, seq_id: int, mode: str) -> int:
        """Take ``seq_id``'s blocks back; returns the number of tokens whose K and V it held.

        ``"recompute"``: the blocks are dropped; after ``resume`` the caller prefills the tokens
        again (notebook 05, vLLM's default). ``"swap"``: their K and V are copied to host memory
        first, and ``resume`` copies them back. A sequence may be preempted in the middle of its
        prefill.
        """
        one_of("mode", mode, PREEMPTION_MODES)
        self.require_in_step(seq_id)
        if mode == "swap":
            computed = -(-self.num_computed(seq_id) // self.block_size)
            host = copy_blocks_to_host(
                self.k_pools, self.v_pools, self.manager.block_table(seq_id)[:computed]
            )
        held = self.manager.preempt(seq_id, mode)
        if mode == "swap":
            self._host[seq_id] = host
        self._layer_tokens[seq_id] = [self.num_computed(seq_id)] * self.num_layers
        self.preemptions[mode] += 1
        return held

    def resume(self, seq_id: int, token_ids=()) -> int:
        """Blocks again for a preempted sequence (and slots for ``token_ids`` after its tokens);
        returns how many leading tokens cached blocks served. After ``"swap"`` the rest of its K and
        V are copied back from host memory (all or nothing)."""
        swapped = self.is_swapped(seq_id)
        with self.all_or_nothing():
            cached = self.manager.resume(seq_id, token_ids)
            if swapped:
                computed = self.num_computed(seq_id)
                self._copy_from_host(
                    seq_id, cached // self.block_size, -(-computed // self.block_size)
                )
                self.manager.commit(seq_id, computed)
        self._host.pop(seq_id, None)
        self._layer_tokens[seq_id] = [self.num_computed(seq_id)] * self.num_layers
        return cached

    # -- what the attention kernel reads -------------------------------------------------------

    def block_tables(self, seq_ids) -> torch.Tensor:
        """``int32 [batch, max_blocks]``; entries past a sequence's blocks are 0 (never read)."""
        seq_ids = integers("seq_ids", seq_ids, 0, empty=True)
        for seq_id in seq_ids:
            self._require_resident(seq_id)
        tables = [self.manager.block_table(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=0) or 1
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.device).reshape(len(tables), width)

    def seq_lens(self, seq_ids, layer: int | None = None) -> torch.Tensor:
        """``int32 [batch]``: tokens stored for each sequence (in ``layer``; default layer 0)."""
        layer = integer("layer", 0 if layer is None else layer, 0, self.num_layers)
        seq_ids = integers("seq_ids", seq_ids, 0, empty=True)
        return torch.tensor(
            [self._layer_count(s, layer) for s in seq_ids], dtype=torch.int32, device=self.device
        )

    def gather(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_id``'s K and V in ``layer`` in logical order, contiguous ``[tokens, num_kv_heads,
        head_dim]``."""
        layer = integer("layer", layer, 0, self.num_layers)
        length = self._layer_count(seq_id, layer)
        table = self.manager.block_table(seq_id)
        blocks = torch.tensor(
            table[: -(-length // self.block_size)], dtype=torch.long, device=self.device
        )
        k = self.k_pools[layer][blocks].flatten(0, 1)[:length]
        v = self.v_pools[layer][blocks].flatten(0, 1)[:length]
        return k.contiguous(), v.contiguous()

    # -- rollback and invariants ---------------------------------------------------------------

    def snapshot(self):
        """The bookkeeping a failed call must put back (not the pools' contents: a failed call
        writes only into slots whose K and V no registered hash or computed token vouches for)."""
        layers = {i: list(t) for i, t in self._layer_tokens.items()}
        return self.manager.snapshot(), layers, dict(self._host), Counter(self.preemptions)

    def restore(self, snapshot) -> None:
        manager, layers, host, self.preemptions = snapshot
        self.manager.restore(manager)
        self._layer_tokens, self._host = {i: list(t) for i, t in layers.items()}, dict(host)

    def all_or_nothing(self):
        """Everything as it was if the block raises (a model step, a write, a copy):
        ``kvlab._checks.restoring`` over :meth:`snapshot` and :meth:`restore`."""
        return restoring(self)

    def check(self) -> None:
        """The block manager's invariants, and each sequence's layers between its computed and held
        tokens."""
        self.manager.check()
        for seq_id, counts in self._layer_tokens.items():
            computed, held = self.num_computed(seq_id), self.num_tokens(seq_id)
            if not (min(counts) == computed and max(counts) == counts[0] <= held):
                raise AssertionError(
                    f"paged cache invariant broken: sequence {seq_id} holds {held} tokens, "
                    f"{computed} computed, per layer {counts}"
                )
            if self.is_swapped(seq_id) != (seq_id in self._host):
                raise AssertionError(f"paged cache invariant broken: sequence {seq_id}'s host copy")

    # -- internals -----------------------------------------------------------------------------

    def _require_resident(self, seq_id) -> None:
        if self.manager.state(seq_id) != "resident":  # state() refuses an unknown id
            raise ValueError(
                f"sequence {seq_id} is preempted ({self.manager.state(seq_id)}); resume({seq_id})"
                " first"
            )

    def _layer_count(self, seq_id, layer: int) -> int:
        self._require_resident(seq_id)
        return self._layer_tokens[seq_id][layer]

    def require_in_step(self, seq_id) -> None:
        """Refuse a sequence that is unknown, preempted, or half way through a by-hand append (its
        layers hold different numbers of tokens): a model step needs every layer at the same token.
        """
        self._require_resident(seq_id)
        counts = self._layer_tokens[seq_id]
        if len(set(counts)) != 1:
            raise ValueError(
                f"sequence {seq_id} is mid-step (tokens per layer {counts}); finish appending "
                "to every layer first"
            )

    def _reserve(self, seq_id: int, token_ids) -> None:
        pair = self.manager.reserve(seq_id, token_ids)
        if pair is not None:
            self._copy_block(*pair)

    def _new_token_ids(self, seq_id, layer: int, start: int, count: int, token_ids) -> list[int]:
        """The ids of the tokens a by-hand append reserves (layer 0, past the reserved slots),
        checked before anything changes."""
        reserved, ahead = self.num_tokens(seq_id), self._layer_tokens[seq_id][0]
        if layer > 0 and start + count > ahead:
            raise ValueError(
                f"layer {layer} of sequence {seq_id} would hold {start + count} tokens but layer 0 "
                f"holds {ahead}: append to layer 0 first (it reserves the slots)"
            )
        fresh = max(0, start + count - reserved) if layer == 0 else 0
        if token_ids is None:
            if fresh and self.prefix_caching:
                raise ValueError(
                    "token_ids is required with prefix caching on: the block hashes are made of"
                    " them"
                )
            ids = [0] * fresh
        else:
            token_ids = _checks.token_ids("token_ids", token_ids, empty=True)
            if len(token_ids) != count:
                raise ValueError(
                    f"token_ids must hold one id per row of k ({count}), got {len(token_ids)}"
                )
            if (
                layer == 0
                and token_ids[: count - fresh] != self.tokens(seq_id)[start : start + count - fresh]
            ):
                raise ValueError(
                    f"token_ids disagree with the tokens sequence {seq_id} reserved at positions "
                    f"{start}..{start + count - fresh - 1}"
                )
            ids = token_ids[count - fresh :]
        needed = self.manager.blocks_to_append(seq_id, fresh)
        if needed > self.num_free:
            raise OutOfBlocksError(needed, self.num_free, self.num_blocks, self.bytes_per_block)
        return ids

    def _check_kv(self, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` and ``v`` checked and converted to the pools' device and dtype (before anything
        changes)."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3 or tuple(t.shape[1:]) != (self.num_kv_heads, self.head_dim):
                raise ValueError(
                    f"{name} must be [tokens, {self.num_kv_heads}, {self.head_dim}] "
                    f"(num_kv_heads, head_dim), got {tuple(t.shape)}"
                )
            if not t.dtype.is_floating_point:
                raise TypeError(
                    f"{name} must be a floating-point tensor (stored as {self.dtype}), got"
                    f" {t.dtype}"
                )
            if t.device.type == "meta":
                raise ValueError(
                    f"{name} is on the meta device (no data); pass a tensor on {self.device}"
                )
        if k.shape != v.shape:
            raise ValueError(
                f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        return k.to(self.device, self.dtype), v.to(self.device, self.dtype)

    def _copy_block(self, source: int, copy: int) -> None:
        for k_pool, v_pool in zip(self.k_pools, self.v_pools):
            k_pool[copy].copy_(k_pool[source])
            v_pool[copy].copy_(v_pool[source])

    def _copy_from_host(self, seq_id: int, first: int, end: int) -> None:
        """Host copies of logical blocks ``first .. end - 1`` into their new physical blocks."""
        blocks = self.manager.block_table(seq_id)[first:end]
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        for pools, host in zip((self.k_pools, self.v_pools), self._host[seq_id]):
            for layer, pool in enumerate(pools):
                pool[index] = host[layer, first:end].to(self.device, non_blocking=True)


def tokens_in_budget(budget_bytes: float, shape, bytes_per_element: float = 2) -> int:
    """KV slots (tokens, all layers) that ``budget_bytes`` holds for a ``ModelShape`` (notebook
    05)."""
    from kvlab._checks import positive
    from kvlab.theory.shapes import ModelShape

    positive("budget_bytes", budget_bytes)
    positive("bytes_per_element", bytes_per_element)
    if not isinstance(shape, ModelShape):
        raise TypeError(
            "shape must be a kvlab ModelShape (see kvlab.theory.shapes.SHAPES), got"
            f" {type(shape).__name__}"
        )
    return int(budget_bytes // shape.kv_bytes_per_token(bytes_per_element))


__all__ = ["PREEMPTION_MODES", "PagedKVCache", "copy_blocks_to_host", "tokens_in_budget"]
