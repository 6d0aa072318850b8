"""Prefix caching: which KV-cache blocks a new prompt can reuse (section 6, prefix caching).

:class:`PrefixCache` is the block manager of prefix caching, bookkeeping over block ids only (the
K and V tensors live in :class:`kvlab.cache.paged.PagedKVCache`; :mod:`kvlab.serving.prefix_paged` joins the two).
A request whose prompt begins with the same tokens as an earlier one reuses that request's blocks
instead of computing their keys and values again. The identity that matters is the exact token
sequence and its position, never the text:

- only **full** blocks are hashed and shared; a partial last block stays private;
- a block's hash chains its parent's hash with its own token ids, so block ``k`` is reused only
  when blocks ``0 .. k-1`` match too (and a token's position is fixed by the chain);
- ``salt`` (a tenant or cache-isolation key) enters the first block's hash;
- at least one prompt token is always computed (its logits give the first output token), so a
  prompt of exactly ``n`` blocks can reuse at most ``n - 1``;
- a block filled during decode is hashed, and becomes reusable, the moment it is full;
- a freed block keeps its contents and hash until its memory is needed. The free list is ordered
  by when blocks were freed: new blocks are taken from the least recently freed end, and a
  sequence frees its blocks tail first, so that among blocks freed together a chain loses its
  last block first (losing its head would orphan the rest). Freed blocks that hold no reusable
  hash go to the front: taking them evicts nothing. A hit on a freed block takes it back out of
  the free list;
- reference counts let any number of running sequences share a block.

``admit`` and ``append`` validate everything and check that the blocks they need are free before
they change anything: an :class:`~kvlab.cache.paged.OutOfBlocksError` leaves the cache as it was.

>>> cache = PrefixCache(num_blocks=8, block_size=4)
>>> a, cached = cache.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])      # nothing cached yet
>>> cached
0
>>> b, cached = cache.admit([1, 2, 3, 4, 5, 6, 7, 8, 42, 43])  # shares the first two blocks
>>> cached, cache.block_table(a)[:2] == cache.block_table(b)[:2]
(8, True)
"""

from __future__ import annotations

import hashlib
from array import array
import numbers
from collections import OrderedDict
from dataclasses import dataclass, field

from kvlab._checks import integer
from kvlab.cache.paged import OutOfBlocksError

_ROOT = b"kvlab-prefix-root"
MAX_TOKEN_ID = 2**63  # token ids are hashed as int64


# --------------------------------------------------------------------------- block hashes


def _salt_bytes(salt) -> bytes:
    if salt is None:
        return b""
    if isinstance(salt, str):
        return b"s" + salt.encode()
    if isinstance(salt, bytes):
        return b"b" + salt
    if isinstance(salt, numbers.Integral) and not isinstance(salt, bool):
        return b"i" + str(int(salt)).encode()
    raise TypeError(f"salt must be None, a str, bytes or an int, got {type(salt).__name__} {salt!r}")


def _chain(parent: bytes, block_tokens) -> bytes:
    """The hash of one full block: its parent's hash and its own token ids, 128-bit BLAKE2b."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", block_tokens).tobytes())
    return digest.digest()


def _first_parent(salt) -> bytes:
    return hashlib.blake2b(_ROOT + _salt_bytes(salt), digest_size=16).digest()


def _token_list(token_ids, name: str = "token_ids") -> list[int]:
    if isinstance(token_ids, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of token ids (ints >= 0), got a {type(token_ids).__name__}; "
                        "tokenize the text first")
    if hasattr(token_ids, "tolist"):  # a torch tensor or a numpy array
        token_ids = token_ids.tolist()
    try:
        tokens = list(token_ids)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of token ids (ints >= 0), got {type(token_ids).__name__}") from None
    if all(type(t) is int and 0 <= t < MAX_TOKEN_ID for t in tokens):  # the common case, quickly
        return tokens
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < MAX_TOKEN_ID:
            raise ValueError(f"{name}[{i}] must be a token id (an int in [0, 2**63)), got {t!r}")
    return [int(t) for t in tokens]


def block_hashes(token_ids, block_size: int, salt=None) -> list[bytes]:
    """The chained hashes of the full blocks of ``token_ids`` (section 6).

    Hash ``k`` covers tokens ``0 .. (k + 1) * block_size - 1`` and ``salt``: two prompts share hash
    ``k`` only when their first ``k + 1`` blocks hold the same token ids under the same salt.
    A partial last block has no hash.
    """
    return _hashes(_token_list(token_ids), integer("block_size", block_size), _first_parent(salt))


def _hashes(tokens: list[int], block_size: int, parent: bytes) -> list[bytes]:
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = _chain(parent, tokens[start:start + block_size])
        hashes.append(parent)
    return hashes


# --------------------------------------------------------------------------- the block manager


@dataclass
class _Sequence:
    tokens: list[int]
    blocks: list[int]
    hashes: list[bytes]  # the chain hash of each full block (registered in the cache or not)
    first_parent: bytes  # where the chain starts: the salt's root

    def parent_of_next_block(self) -> bytes:
        return self.hashes[-1] if self.hashes else self.first_parent


@dataclass
class PrefixStats:
    """Counters since the cache was made (section 6). ``hit_rate`` is the share of prompt tokens
    served from the cache."""

    admissions: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_blocks: int = 0
    evictions: int = 0  # cached blocks whose contents were given up to make room

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixCache:
    """Reference-counted blocks with chained-hash prefix reuse and LRU eviction (section 6).

    ``num_free``: blocks no running sequence holds (cached or not); ``num_cached``: blocks holding a
    reusable hash (held or free). ``stats`` counts admissions, hits and evictions; ``hit_blocks``,
    ``hit_tokens``, ``evictions`` and ``hit_rate`` read it directly.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = integer("num_blocks", num_blocks)
        self.block_size = integer("block_size", block_size)
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks  # the hash this block is registered under
        self._by_hash: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # front: taken next
        self._seqs: dict[int, _Sequence] = {}
        self._next_id = 0
        self.stats = PrefixStats()

    def __repr__(self) -> str:
        return (f"PrefixCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"sequences={len(self._seqs)}, free={self.num_free}, cached={self.num_cached})")

    # -- sizes and counters --------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    @property
    def hit_blocks(self) -> int:
        return self.stats.hit_blocks

    @property
    def hit_tokens(self) -> int:
        return self.stats.hit_tokens

    @property
    def evictions(self) -> int:
        return self.stats.evictions

    @property
    def hit_rate(self) -> float:
        return self.stats.hit_rate

    # -- read-only queries -------------------------------------------------------------------

    def sequences(self) -> list[int]:
        return list(self._seqs)

    def block_table(self, seq_id: int) -> list[int]:
        """``seq_id``'s physical blocks in logical order (a copy)."""
        return list(self._get(seq_id).blocks)

    def num_tokens(self, seq_id: int) -> int:
        return len(self._get(seq_id).tokens)

    def ref_count(self, block: int) -> int:
        return self._ref[integer("block", block, 0, self.num_blocks)]

    def block_hash(self, block: int) -> bytes | None:
        """The hash ``block`` is registered under, or None (never full, evicted, or a duplicate)."""
        return self._hash[integer("block", block, 0, self.num_blocks)]

    def cached_blocks(self) -> dict[bytes, int]:
        """Every reusable hash and the block that holds it (a copy)."""
        return dict(self._by_hash)

    def free_order(self) -> list[int]:
        """Free blocks in the order new blocks are taken from them (the first is taken next)."""
        return list(self._free)

    def lookup(self, token_ids, salt=None) -> int:
        """Leading tokens of ``token_ids`` that ``admit`` would serve from the cache now (no side effects)."""
        tokens = _token_list(token_ids)
        if not tokens:
            raise ValueError("token_ids must hold at least one token (an empty prompt has nothing to compute)")
        return len(self._match(tokens, _hashes(tokens, self.block_size, _first_parent(salt)))) * self.block_size

    def blocks_to_admit(self, token_ids, salt=None) -> int:
        """Free blocks ``admit(token_ids, salt)`` would take now: new blocks plus cached ones it
        takes back out of the free list."""
        tokens = _token_list(token_ids)
        if not tokens:
            raise ValueError("token_ids must hold at least one token (an empty prompt has nothing to compute)")
        hits = self._match(tokens, _hashes(tokens, self.block_size, _first_parent(salt)))
        return self._blocks_needed(len(tokens), hits)

    def blocks_to_append(self, seq_id: int) -> int:
        """Free blocks the next ``append(seq_id, ...)`` takes: 1 when its last block is full, else 0."""
        return int(len(self._get(seq_id).tokens) % self.block_size == 0)

    # -- admit, append, free -----------------------------------------------------------------

    def admit(self, token_ids, salt=None) -> tuple[int, int]:
        """Admit a sequence with prompt ``token_ids``; returns ``(seq_id, cached_tokens)``.

        ``cached_tokens`` (a multiple of ``block_size``, less than the prompt's length) leading
        tokens are served by cached blocks; the caller computes the rest. Every block of the prompt
        is allocated here, and its full blocks are registered under their hashes.
        """
        tokens = _token_list(token_ids)
        if not tokens:
            raise ValueError("token_ids must hold at least one token (an empty prompt has nothing to compute)")
        first_parent = _first_parent(salt)
        hashes = _hashes(tokens, self.block_size, first_parent)
        hits = self._match(tokens, hashes)
        needed = self._blocks_needed(len(tokens), hits)
        if needed > self.num_free:
            raise OutOfBlocksError(needed, self.num_free, self.num_blocks)
        # Nothing below can fail.
        for block in hits:
            self._hold(block)
        new = -(-len(tokens) // self.block_size) - len(hits)
        blocks = hits + [self._take_free() for _ in range(new)]
        for index in range(len(hits), len(hashes)):
            self._register(blocks[index], hashes[index])
        seq_id = self._next_id
        self._next_id += 1
        self._seqs[seq_id] = _Sequence(tokens, blocks, hashes, first_parent)
        cached = len(hits) * self.block_size
        s = self.stats
        s.admissions, s.prompt_tokens = s.admissions + 1, s.prompt_tokens + len(tokens)
        s.hit_blocks, s.hit_tokens = s.hit_blocks + len(hits), s.hit_tokens + cached
        return seq_id, cached

    def append(self, seq_id: int, token_id: int) -> None:
        """One generated token for ``seq_id``: a new block when its last one is full; the block is
        hashed and registered (reusable) as soon as this token fills it."""
        seq = self._get(seq_id)
        (token,) = _token_list([token_id], "token_id")
        if self.blocks_to_append(seq_id) > self.num_free:
            raise OutOfBlocksError(1, self.num_free, self.num_blocks)
        if self.blocks_to_append(seq_id):
            seq.blocks.append(self._take_free())
        seq.tokens.append(token)
        if len(seq.tokens) % self.block_size == 0:
            last = _chain(seq.parent_of_next_block(), seq.tokens[-self.block_size:])
            seq.hashes.append(last)
            self._register(seq.blocks[-1], last)

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``; blocks no one else holds join the free list, tail first, keeping their hash."""
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        for block in reversed(seq.blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:  # nothing reusable in it: hand it out before any cached block
                    self._free.move_to_end(block, last=False)

    # -- internals ---------------------------------------------------------------------------

    def _snapshot(self):
        """Everything mutable, copied: for callers that must undo an admit whose prefill failed."""
        seqs = {i: _Sequence(list(s.tokens), list(s.blocks), list(s.hashes), s.first_parent)
                for i, s in self._seqs.items()}
        return (list(self._ref), list(self._hash), dict(self._by_hash), OrderedDict(self._free), seqs,
                self._next_id, PrefixStats(**vars(self.stats)))

    def _restore(self, snapshot) -> None:
        (self._ref, self._hash, self._by_hash, self._free, self._seqs, self._next_id, self.stats) = snapshot

    def _get(self, seq_id) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"seq_id {seq_id!r} is not an admitted sequence; live: {sorted(self._seqs)}") from None

    def _match(self, tokens: list[int], hashes: list[bytes]) -> list[int]:
        """Cached blocks serving the longest run of leading full blocks, leaving >= 1 token to compute."""
        hits = []
        for h in hashes[: (len(tokens) - 1) // self.block_size]:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _blocks_needed(self, num_tokens: int, hits: list[int]) -> int:
        new = -(-num_tokens // self.block_size) - len(hits)
        return new + sum(1 for b in hits if self._ref[b] == 0)

    def _hold(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._free[block]
        self._ref[block] += 1

    def _take_free(self) -> int:
        """The least recently freed block, evicting the hash it held."""
        block, _ = self._free.popitem(last=False)
        if self._hash[block] is not None:
            del self._by_hash[self._hash[block]]
            self._hash[block] = None
            self.stats.evictions += 1
        self._ref[block] = 1
        return block

    def _register(self, block: int, h: bytes) -> None:
        """Make ``block`` the cached holder of ``h``, unless another block already holds it (then
        ``block`` stays an unregistered duplicate and is given up first)."""
        if h not in self._by_hash:
            self._by_hash[h] = block
            self._hash[block] = h


# --------------------------------------------------------------------------- a multi-tenant chat trace

REPLAY_POLICIES = ("lru", "reserve", "none")


@dataclass(frozen=True)
class ChatRequest:
    """One turn of one user's chat: ``prompt`` resends the system prompt and the whole history."""

    user: int
    turn: int
    system: int
    prompt: tuple
    reply: tuple


def make_chat_trace(num_system_prompts: int = 3, num_users: int = 24, turns: int = 3, system_tokens: int = 192,
                    user_tokens: int = 24, reply_tokens: int = 24, think_time: float = 6.0, vocab: int = 8192,
                    seed: int = 0) -> list:
    """A multi-tenant chat trace (section 6): a few shared system prompts, many users, multi-turn chats.

    Each user picks one of ``num_system_prompts`` system prompts at random and holds ``turns`` turns;
    turn ``t``'s prompt is the system prompt, then every earlier user message and reply, then a new
    user message of ``user_tokens`` tokens; the reply has ``reply_tokens`` tokens. Users arrive one
    after another (exponential gaps of mean 1) and each next turn follows after an exponential think
    time of mean ``think_time`` (in the same units), so that only some chats are active at a time.
    Requests are ordered by time. Token ids are random in ``[0, vocab)``.
    """
    import numpy as np

    for name, value, low in (("num_system_prompts", num_system_prompts, 1), ("num_users", num_users, 1),
                             ("turns", turns, 1), ("system_tokens", system_tokens, 0),
                             ("user_tokens", user_tokens, 1), ("reply_tokens", reply_tokens, 1),
                             ("vocab", vocab, 2)):
        integer(name, value, low)
    if not think_time >= 0:
        raise ValueError(f"think_time must be >= 0, got {think_time!r}")
    rng = np.random.default_rng(seed)
    draw = lambda n: tuple(int(t) for t in rng.integers(0, vocab, n))  # noqa: E731
    systems = [draw(system_tokens) for _ in range(num_system_prompts)]
    choice = rng.integers(0, num_system_prompts, num_users)
    starts = np.cumsum(rng.exponential(1.0, num_users))
    times = starts[:, None] + np.cumsum(rng.exponential(think_time, (num_users, turns)), axis=1)
    times[:, 0] = starts
    order = sorted((times[u, t], u, t) for u in range(num_users) for t in range(turns))
    history = {u: systems[choice[u]] for u in range(num_users)}
    trace = []
    for _, u, t in order:
        prompt = history[u] + draw(user_tokens)
        reply = draw(reply_tokens)
        trace.append(ChatRequest(u, t, int(choice[u]), prompt, reply))
        history[u] = prompt + reply
    return trace


class _NoEviction(PrefixCache):
    """The ``reserve`` policy: what is cached stays cached. A block is registered only while
    ``keep_free`` blocks stay out of the cache for running work; cached blocks are never evicted."""

    def __init__(self, num_blocks: int, block_size: int, keep_free: int):
        super().__init__(num_blocks, block_size)
        self.keep_free = keep_free

    def _register(self, block: int, h: bytes) -> None:
        if self.num_cached < self.num_blocks - self.keep_free:
            super()._register(block, h)

    def _take_free(self) -> int:
        block = next(iter(self._free))
        assert self._hash[block] is None, "reserve policy: no uncached block left (keep_free too small)"
        return super()._take_free()


@dataclass
class ReplayResult:
    """What one cache policy did with a chat trace (section 6): per request, prompt and cached tokens."""

    policy: str
    num_blocks: int
    block_size: int
    prompt_tokens: list = field(default_factory=list)
    cached_tokens: list = field(default_factory=list)
    evictions: int = 0
    peak_cached: int = 0  # most blocks holding a reusable hash at once
    final_cached: int = 0  # blocks holding a reusable hash when the trace ends

    @property
    def hit_rate(self) -> float:
        total = sum(self.prompt_tokens)
        return sum(self.cached_tokens) / total if total else 0.0

    def mean_ttft(self, prefill_seconds) -> float:
        """Mean time to first token, with ``prefill_seconds(prompt_tokens, cached_tokens)`` per request."""
        times = [prefill_seconds(p, c) for p, c in zip(self.prompt_tokens, self.cached_tokens)]
        return sum(times) / len(times) if times else 0.0


def replay(trace, num_blocks: int, block_size: int, policy: str = "lru") -> ReplayResult:
    """Run a chat trace through a prefix cache of ``num_blocks`` blocks, one request at a time (section 6).

    Each request is admitted, its reply appended token by token (all but the last, which is never fed
    back), and freed; its blocks stay cached. ``lru`` is :class:`PrefixCache`; ``reserve`` never
    evicts a cached block and keeps room for the longest request out of the cache; ``none`` computes
    every prompt in full. ``num_blocks`` must hold the longest request.
    """
    if policy not in REPLAY_POLICIES:
        raise ValueError(f"policy must be one of {REPLAY_POLICIES}, got {policy!r}")
    num_blocks, block_size = integer("num_blocks", num_blocks), integer("block_size", block_size)
    trace = list(trace)
    longest = max((-(-(len(r.prompt) + len(r.reply) - 1) // block_size) for r in trace), default=0)
    if longest > num_blocks:
        raise ValueError(f"num_blocks must be >= {longest} (the longest request's blocks at block size "
                         f"{block_size}), got {num_blocks}")
    result = ReplayResult(policy, num_blocks, block_size)
    if policy == "none":
        result.prompt_tokens = [len(r.prompt) for r in trace]
        result.cached_tokens = [0] * len(trace)
        return result
    cache = PrefixCache(num_blocks, block_size) if policy == "lru" else _NoEviction(num_blocks, block_size, longest)
    for request in trace:
        seq_id, cached = cache.admit(request.prompt)
        for token in request.reply[:-1]:
            cache.append(seq_id, token)
        cache.free(seq_id)
        result.prompt_tokens.append(len(request.prompt))
        result.cached_tokens.append(cached)
        result.peak_cached = max(result.peak_cached, cache.num_cached)
    result.evictions, result.final_cached = cache.evictions, cache.num_cached
    return result
