"""Notebook 04, KV-cache layout (section 9.4): what reading and appending cost in each layout,
measured.

- ``contiguous_runs``: the unbroken address ranges a read of one sequence touches, from the
  layout's address arithmetic (``kvlab.cache.addresses.KVGeometry``);
- ``read_traffic`` and ``append_traffic``: the bytes a decode read and an append must move, and the
  bytes they do move (a paged read without a paged kernel gathers a copy first);
- ``measure_read`` and ``measure_append``: one layer's decode read and one token's append, timed
  through the mechanism's checked-once paths (``decode_reader``, ``token_writer``), each beside
  the time its bytes take at the calibrated ceilings (the bytes model, ``predicted_s``);
  ``measure_reads``: several caches' reads timed in alternation, for a ratio that holds;
- ``last_level_cache_bytes``: the largest hardware cache of the device, which a small cache's read
  may come from instead of DRAM (``kvlab.theory.kv_traffic.cache_resident``);
- ``bench_rows``: all four layouts side by side, and multi-head against grouped-query attention
  (Ainslie et al. 2023), for ``python -m kvlab bench``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from kvlab._checks import instance, integer, items, one_of
from kvlab.cache.addresses import LAYOUTS, PAGED, KVGeometry, as_block_table
from kvlab.cache.layout import APPEND_METHODS, KVCache, decode_reader, new_cache, token_writer
from kvlab.devices import on_gpu
from kvlab.lab.bench import Row
from kvlab.lab.hardware import calibrate
from kvlab.lab.timing import interleaved, measure


def contiguous_runs(
    geometry: KVGeometry, tokens: int, heads=None, seq: int = 0, block_table=None
) -> torch.Tensor:
    """Lengths (in elements) of the unbroken address ranges a read of one sequence's K touches.

    The read covers tokens ``0..tokens-1``, every dim, of ``heads`` (a list of KV heads; default
    all). Long runs are what a GPU coalesces and a CPU prefetches; every layout here keeps the head
    dim innermost, so no run is shorter than one head vector.
    """
    instance("geometry", geometry, KVGeometry)
    heads = list(range(geometry.kv_heads)) if heads is None else list(heads)
    if not heads:
        raise ValueError("heads must name at least one KV head")
    if geometry.is_paged:
        if block_table is None:
            raise ValueError(
                f"a paged layout ({geometry.layout}) needs block_table to find a token's block"
            )
        limit = as_block_table(block_table).shape[1] * geometry.block_size
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


def read_traffic(cache: KVCache) -> tuple[int, int]:
    """(K and V bytes one layer's decode read needs, bytes ``decode_read`` actually moves).

    Contiguous: the two are equal. Paged with a gather: the gather reads every held block and
    writes a copy of it (``2 * gathered``), then attention reads the copy (``kv``), plus the
    block-table entries. Reads and writes both count, as in ``calibrate().copy_bytes_per_s``; the
    K and V read by attention alone is a read stream (``ReadMeasurement.predicted_s``).
    """
    instance("cache", cache, KVCache, "a kvlab.cache.layout.KVCache")
    kv = cache.batch * cache.length * cache.bytes_per_token
    if not cache.geometry.is_paged:
        return kv, kv
    blocks = -(-cache.length // cache.geometry.block_size)
    gathered = cache.batch * blocks * cache.geometry.block_size * cache.bytes_per_token
    table = cache.batch * blocks * cache.block_table.element_size()
    return kv, 2 * gathered + kv + table


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
    read_bytes_per_s: float

    @property
    def kv_bytes_per_s(self) -> float:
        """Useful bandwidth: the K and V attention needs, per second (fastest repeat)."""
        return self.kv_bytes / self.timing.min

    @property
    def moved_bytes_per_s(self) -> float:
        return self.moved_bytes / self.timing.min

    @property
    def fraction_of_read(self) -> float:
        """K and V read per second over the read bandwidth: at most 1 for a read from memory."""
        return self.kv_bytes_per_s / self.read_bytes_per_s

    @property
    def predicted_s(self) -> float:
        """The time if each byte went at the ceiling of its traffic: attention's read of the K and
        V at the read bandwidth, and a gather's copy (its bytes read plus written, ``moved_bytes``
        less the K and V) at the copy rate."""
        return (
            self.kv_bytes / self.read_bytes_per_s
            + (self.moved_bytes - self.kv_bytes) / self.copy_bytes_per_s
        )

    @property
    def fraction_of_ceilings(self) -> float:
        """The ceilings' time over the fastest measured one: 1 at the ceilings, below 1 slower."""
        return self.predicted_s / self.timing.min


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


def measure_read(
    cache: KVCache, q_heads: int | None = None, layer: int = 0, warmup: int = 2, reps: int = 5
) -> ReadMeasurement:
    """Time ``decode_read`` on ``cache`` with a random query of ``q_heads`` heads (default: KV
    heads)."""
    read, q_heads = _reader(cache, q_heads, layer)  # checked once; the timed calls check nothing
    timing = measure(read, warmup=warmup, reps=reps, device=cache.k.device)
    return _read_measurement(cache, q_heads, timing)


def measure_reads(
    caches: dict, q_heads: int | None = None, layer: int = 0, warmup: int = 1, reps: int = 7
) -> dict:
    """Time the reads of several caches (a dict, name to ``KVCache``) in alternation, one call each
    per round (``kvlab.lab.timing.interleaved``): drift on a shared machine slows them alike, so
    their ratio holds from run to run where reads timed a minute apart need not. Returns a
    ``ReadMeasurement`` per name."""
    instance("caches", caches, dict, "a dict of name to KVCache")
    items("caches", caches.values(), KVCache, each="a kvlab.cache.layout.KVCache")
    if not caches:
        raise ValueError("caches must hold at least one KVCache, got {}")
    devices = {cache.k.device for cache in caches.values()}
    if len(devices) > 1:
        raise ValueError(f"caches must all be on one device, got {sorted(map(str, devices))}")
    reads = {name: _reader(cache, q_heads, layer) for name, cache in caches.items()}
    timings = interleaved(
        {name: read for name, (read, _) in reads.items()}, reps, warmup, devices.pop()
    )
    return {name: _read_measurement(caches[name], reads[name][1], timings[name]) for name in caches}


def _reader(cache: KVCache, q_heads: int | None, layer: int):
    g = cache.geometry
    q_heads = g.kv_heads if q_heads is None else integer("q_heads", q_heads, 1)
    if q_heads % g.kv_heads:
        raise ValueError(
            f"q_heads ({q_heads}) must be a multiple of the cache's kv_heads ({g.kv_heads})"
        )
    q = torch.randn(cache.batch, q_heads, g.head_dim, dtype=cache.k.dtype, device=cache.k.device)
    return decode_reader(cache, q, layer), q_heads


def _read_measurement(cache: KVCache, q_heads: int, timing) -> ReadMeasurement:
    g = cache.geometry
    kv, moved = read_traffic(cache)
    return ReadMeasurement(
        cache.layout,
        cache.batch,
        cache.length,
        q_heads,
        g.kv_heads,
        g.head_dim,
        _dtype_name(cache.k),
        timing,
        kv,
        moved,
        calibrate().copy_bytes_per_s,
        calibrate().stream_bytes_per_s,
    )


def append_traffic(cache: KVCache, method: str) -> tuple[int, int]:
    """(bytes of the new tokens' K and V, bytes the append moves) for all layers.

    An in-place write reads the new token and writes it (``2 * new``). ``cat`` reads the held
    tokens and the new one and writes them all to a new tensor.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a kvlab.cache.layout.KVCache, got {type(cache).__name__}")
    one_of("method", method, APPEND_METHODS[cache.layout])
    new = cache.geometry.layers * cache.batch * cache.bytes_per_token
    if method == "cat":
        return new, 2 * new * (cache.length + 1)
    return new, 2 * new


def measure_append(
    cache: KVCache, method: str | None = None, warmup: int = 2, reps: int = 5
) -> AppendMeasurement:
    """Time appending one token per sequence at position ``cache.length``, without advancing it.

    Each timed call overwrites the same slot (``index``, ``slot``) or builds the same grown tensor
    (``cat``), so every call sees the same context.
    """
    instance("cache", cache, KVCache, "a kvlab.cache.layout.KVCache")
    write = token_writer(cache, method)
    method = method or APPEND_METHODS[cache.layout][0]
    g = cache.geometry
    shape = (g.layers, cache.batch, g.kv_heads, g.head_dim)
    k_new = torch.randn(shape, dtype=cache.k.dtype, device=cache.k.device)
    v_new = torch.randn_like(k_new)
    timing = measure(lambda: write(k_new, v_new), warmup=warmup, reps=reps, device=cache.k.device)
    new, moved = append_traffic(cache, method)
    return AppendMeasurement(
        cache.layout,
        method,
        cache.batch,
        cache.length,
        g.kv_heads,
        g.head_dim,
        _dtype_name(cache.k),
        timing,
        new,
        moved,
        calibrate().copy_bytes_per_s,
    )


def last_level_cache_bytes() -> int | None:
    """The largest hardware cache of this machine's device, in bytes: a GPU's L2, or the CPU's
    highest cache level as Linux reports it (``/sys/devices/system/cpu/cpu0/cache``); None where
    unknown. A read no larger than it may be served from that cache between repeats."""
    if on_gpu():
        return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    import glob

    best = None
    for folder in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{folder}/level") as f:
                level = int(f.read())
            with open(f"{folder}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        size = int(text.rstrip("KMG")) * scale
        if best is None or level > best[0]:
            best = (level, size)
    return None if best is None else best[1]


def bench_rows(rounds: int = 5, context: int | None = None, batch: int | None = None) -> list:
    """Read bandwidth and append cost of the four layouts, and MHA against GQA, side by side (9.4).

    Each round measures every layout and method once, interleaved; the rows are medians over rounds,
    and ratios of medians from the same run. CPU: batch 4, context 2048, 8 heads of 64, fp32.
    GPU: batch 32, context 4096, 32 query and 8 KV heads of 128, bf16.
    """
    rounds = integer("rounds", rounds, 1)
    gpu = on_gpu()
    batch = integer("batch", batch, 1) if batch is not None else (32 if gpu else 4)
    context = integer("context", context, 1) if context is not None else (4096 if gpu else 2048)
    q_heads, kv_heads, dim = (32, 8, 128) if gpu else (8, 8, 64)
    caches = {
        layout: new_cache(
            layout, batch=batch, length=context, kv_heads=kv_heads, head_dim=dim, seed=i
        )
        for i, layout in enumerate(LAYOUTS)
    }
    reads: dict[str, list] = {layout: [] for layout in LAYOUTS}
    appends: dict[tuple, list] = {(lay, m): [] for lay in LAYOUTS for m in APPEND_METHODS[lay]}
    for _ in range(rounds):
        for layout, cache in caches.items():
            reads[layout].append(measure_read(cache, q_heads, warmup=1, reps=3))
            for method in APPEND_METHODS[layout]:
                appends[layout, method].append(measure_append(cache, method, warmup=1, reps=5))
    copy, read = calibrate().copy_bytes_per_s, calibrate().stream_bytes_per_s
    where = (
        f"batch {batch}, context {context}, {q_heads} q / {kv_heads} KV heads of {dim}, "
        f"{_dtype_name(caches['BHTD'].k)}, one layer"
    )
    read_s = {lay: statistics.median(m.timing.median for m in ms) for lay, ms in reads.items()}
    rows = []
    for layout, ms in reads.items():
        kv, moved = ms[0].kv_bytes, ms[0].moved_bytes
        rows.append(
            Row(f"read {layout}", kv / read_s[layout] / 1e9, "GB/s", f"useful K+V bytes/s; {where}")
        )
        rows.append(
            Row(
                f"read {layout} ceilings' time / measured",
                (kv / read + (moved - kv) / copy) / read_s[layout],
                "fraction",
                f"moved {moved / kv:.2f}x the K+V bytes; read {read / 1e9:.1f} GB/s,"
                f" copy {copy / 1e9:.1f} GB/s",
            )
        )
    for paged in PAGED:
        for contiguous in ("BHTD", "BTHD"):
            rows.append(
                Row(
                    f"read time {paged} / {contiguous}",
                    read_s[paged] / read_s[contiguous],
                    "x",
                    "ratio of medians, same run; paged gathers through its block table",
                )
            )
    append_s = {key: statistics.median(m.per_token_s for m in ms) for key, ms in appends.items()}
    how = {
        "index": "write into preallocated slots",
        "cat": "torch.cat growth, as DynamicCache",
        "slot": "indexed write through the block table",
    }
    for (layout, method), seconds in append_s.items():
        note = (
            ("kvlab.kernels.paged_store, store_kv's launch" if gpu else "store_kv_ref's write")
            + ", checked once before timing"
            if layout == "NHD"
            else how[method]
        )
        rows.append(
            Row(f"append {layout} {method}", seconds * 1e6, "µs/token", f"one layer; {note}")
        )
    for layout in ("BHTD", "BTHD"):
        rows.append(
            Row(
                f"append {layout} cat / index",
                append_s[layout, "cat"] / append_s[layout, "index"],
                "x",
                "torch.cat growth copies the whole layer's cache",
            )
        )
    rows.append(
        Row(
            "read / append (BTHD index)",
            read_s["BTHD"] / (append_s["BTHD", "index"] * batch),
            "x",
            "one decode step: read all K+V vs write one token per sequence",
        )
    )
    rows += _gqa_rows(rounds, batch, context, q_heads, dim)
    return rows


def _gqa_rows(rounds: int, batch: int, context: int, q_heads: int, dim: int) -> list:
    kv_choices = (q_heads, q_heads // 4)
    caches = {
        h: new_cache("BHTD", batch=batch, length=context, kv_heads=h, head_dim=dim, seed=h)
        for h in kv_choices
    }
    times: dict[int, list] = {h: [] for h in kv_choices}
    for _ in range(rounds):
        for h, cache in caches.items():
            times[h].append(measure_read(cache, q_heads, warmup=1, reps=3).timing.median)
    mha, gqa = (statistics.median(times[h]) for h in kv_choices)
    return [
        Row(
            f"read MHA ({kv_choices[0]} KV) / GQA ({kv_choices[1]} KV)",
            mha / gqa,
            "x",
            f"{q_heads} query heads both; cache bytes ratio {kv_choices[0] // kv_choices[1]}x",
        )
    ]
