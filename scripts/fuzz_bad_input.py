"""A bad-input run over kvlab's public names (issue 22): each name is called once with valid
arguments, then once per argument and class of bad value (a bool for an int, a non-integral float,
an infinity, a string for a flag, a token id past the vocabulary, None, ...), and every call is
counted as

- ``clear``: a ValueError, TypeError or MemoryError whose message names the argument;
- ``unclear``: any other exception, or one that does not name the argument (or reads like Python's
  or torch's own: "'NoneType' object has no attribute", "index out of range in self", ...);
- ``silent``: it returned (or ran past the time limit) although the value is one it should refuse.

Stateful objects (the block manager, the paged cache, the engine) and the model are snapshotted
before each call: a failed call that changed one counts as ``changed``, a call that left the
caller's model altered (attention implementation, dtype, training flag) as ``altered``.

    PYTHONPATH=$PWD python scripts/fuzz_bad_input.py [--json OUT.json] [--only SUBSTRING] [--show
    unclear,silent]

Not part of the test suite, except on kvlab.show's names (``--only show.``, about 15 s), which
tests/test_fuzz_bad_input.py runs: the tables of bad calls live beside each module's tests. This
script is the broad sweep those tables were grown from, rerun to count before and after a change.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import signal
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("KVLAB_STATIC", "1")

import torch  # noqa: E402

import kvlab  # noqa: E402
from kvlab import kernels  # noqa: E402

kernels.use_interpreter()
torch.set_num_threads(1)
warnings.simplefilter("ignore")

VOCAB = 128
LIMIT_S = 20

# --------------------------------------------------------------------------- bad values by kind


def bad_values(kind: str):
    """``[(class, value)]`` for an argument of ``kind``; a trailing ``?`` means None is allowed."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    table = {
        "int": [
            ("bool-as-int", True),
            ("float-as-int", 1.5),
            ("zero", 0),
            ("negative", -1),
            ("inf", math.inf),
            ("nan", math.nan),
            ("str", "3"),
            ("none", None),
        ],
        "int0": [
            ("bool-as-int", True),
            ("float-as-int", 1.5),
            ("negative", -1),
            ("inf", math.inf),
            ("str", "3"),
            ("none", None),
        ],
        "size": [
            ("bool-as-int", True),
            ("float-as-int", 1.5),
            ("zero", 0),
            ("negative", -1),
            ("huge", 10**13),
            ("inf", math.inf),
            ("str", "3"),
            ("none", None),
        ],
        "seed": [("bool-as-int", True), ("float-as-int", 1.5), ("str", "3")],
        "real": [
            ("bool-as-int", True),
            ("zero", 0.0),
            ("negative", -1.0),
            ("inf", math.inf),
            ("nan", math.nan),
            ("str", "1"),
            ("none", None),
        ],
        "real0": [
            ("bool-as-int", True),
            ("negative", -1.0),
            ("inf", math.inf),
            ("nan", math.nan),
            ("str", "1"),
            ("none", None),
        ],
        "frac": [
            ("bool-as-int", True),
            ("out-of-range", 1.5),
            ("negative", -0.1),
            ("nan", math.nan),
            ("inf", math.inf),
            ("str", "0.5"),
            ("none", None),
        ],
        "flag": [("str-as-flag", "yes"), ("str-as-flag", "no"), ("int-as-flag", 1), ("none", None)],
        "choice": [("bad-choice", "nonsense"), ("int-as-choice", 3), ("none", None)],
        "tokens": [
            ("float-token", [1.5, 2]),
            ("negative-token", [-1, 2]),
            ("token-past-vocab", [VOCAB, 1]),
            ("str-as-tokens", "abcd"),
            ("int-as-tokens", 7),
            ("bool-token", [True, 2]),
            ("empty", []),
            ("none", None),
            ("nested", [[1, 2]]),
        ],
        "ids": [
            ("none", None),
            ("list-as-tensor", [[1, 2, 3]]),
            ("float-ids", torch.ones(1, 3)),
            ("1d-ids", torch.tensor([1, 2, 3])),
            ("token-past-vocab", torch.tensor([[1, VOCAB]])),
            ("negative-token", torch.tensor([[1, -1]])),
        ],
        "model": [("none", None), ("str-as-model", "model"), ("int-as-model", 3)],
        "tensor": [
            ("none", None),
            ("list-as-tensor", [[1.0, 2.0]]),
            ("int-tensor", torch.ones(2, 2, dtype=torch.long)),
            ("wrong-rank", torch.ones(3)),
        ],
        "callable": [("str-as-callable", "f"), ("int-as-callable", 3), ("none", None)],
        "device": [
            ("no-cuda", "cuda"),
            ("no-cuda", "cuda:7"),
            ("bad-device", "bogus"),
            ("int-as-device", 3.5),
        ],
        "dtype": [("str-as-dtype", "fp16"), ("int-dtype", torch.int64), ("int-as-dtype", 3)],
        "seq": [
            ("bool-as-int", True),
            ("float-as-int", 1.5),
            ("negative", -1),
            ("unknown-id", 99),
            ("str", "a"),
            ("none", None),
        ],
        "ints": [
            ("zero", [0]),
            ("float-as-int", [1.5]),
            ("bool-as-int", [True]),
            ("int-as-list", 3),
            ("str-as-list", "ab"),
            ("empty", []),
            ("none", None),
        ],
        "shape": [("none", None), ("str-as-shape", "nonsense"), ("int-as-shape", 3)],
        "hw": [("none", None), ("str-as-hw", "nonsense"), ("int-as-hw", 3)],
        "salt": [("float-salt", 1.5), ("list-salt", [1]), ("bool-salt", True)],
        "text": [("int-as-str", 3), ("none", None), ("bytes-as-str", b"x")],
        "reals": [
            ("nan-in-list", [1.0, math.nan]),
            ("inf-in-list", [1.0, math.inf]),
            ("negative-in-list", [1.0, -2.0]),
            ("bool-in-list", [True, 1.0]),
            ("str-as-list", "ab"),
            ("none", None),
        ],
        "paired": [
            ("unpaired", [1.0, 2.0]),
            ("nan-in-list", [1.0, math.nan, 2.0, 3.0]),
            ("negative-in-list", [1.0, -2.0, 2.0, 3.0]),
            ("str-as-list", "ab"),
            ("none", None),
        ],
        "cuts": [
            ("int-as-list", 5),
            ("str-as-list", "ab"),
            ("negative", [-1]),
            ("past-end", [11]),
            ("float-as-int", [1.5]),
            ("none-in-list", [None]),
        ],
        "nonempty_text": [
            ("empty", ""),
            ("blank", "  "),
            ("int-as-str", 3),
            ("bytes-as-str", b"x"),
        ],
        "trace": [("none", None), ("str", "abc"), ("int", 3), ("dicts", [{"prompt": [1]}])],
        "path": [("not-a-path", "not a path"), ("int", 3), ("none", None)],
        "stopset": [
            ("negative", frozenset({-5})),
            ("float-token", frozenset({1.5})),
            ("bool-token", frozenset({True})),
            ("list-as-set", [1]),
        ],
        "position": [
            ("past-end", torch.tensor([[8]])),
            ("float-position", torch.tensor([[1.0]])),
            ("wrong-shape", torch.tensor([0])),
            ("none", None),
        ],
        "mask8": [
            ("longer", torch.ones(1, 9, dtype=torch.long)),
            ("fractional", torch.full((1, 8), 0.5)),
            ("none", None),
        ],
        "static_model": [
            ("mamba", "mamba"),
            ("meta-model", "meta"),
            ("none", None),
            ("str-as-model", "model"),
        ],
        "record": [("none", None), ("str-as-record", "record"), ("float-as-record", 1.5)],
        "dict": [("none", None), ("list-as-dict", [1]), ("str-as-dict", "d"), ("empty", {})],
        "names": [("str-as-list", "h200"), ("bad-choice", ["nonsense"]), ("empty", [])],
        "any": [],
    }[kind]
    return [(c, v) for c, v in table if not (optional and v is None)]


def infer_kind(value) -> str:
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "real"
    if isinstance(value, torch.nn.Module):
        return "model"
    if isinstance(value, torch.Tensor):
        return "ids" if not value.dtype.is_floating_point else "tensor"
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return "tokens"
    if isinstance(value, str):
        return "choice"
    return "any"


# --------------------------------------------------------------------------- the objects the calls
# use


@functools.lru_cache(maxsize=None)
def model(layers: int = 2):
    m = kvlab.tiny_model(
        "llama",
        layers=layers,
        hidden=64,
        q_heads=4,
        kv_heads=2,
        vocab=VOCAB,
        intermediate=128,
        device="cpu",
        dtype=torch.float32,
        seed=3,
        max_positions=256,
    )
    m.set_attn_implementation("sdpa")
    return m


def model_state(m):
    p = next(m.parameters())
    return (
        m.config._attn_implementation,
        p.dtype,
        p.device,
        m.training,
        float(p.detach().flatten()[:8].sum()),
    )


def reset_model(m, state):
    attn, dtype, device, training, _ = state
    if m.config._attn_implementation != attn:
        m.set_attn_implementation(attn)
    if next(m.parameters()).dtype != dtype or next(m.parameters()).device != device:
        m.to(device=device, dtype=dtype)
    m.train(training)


def block_manager(prefix_caching=True):
    from kvlab.cache.block_manager import BlockManager

    m = BlockManager(8, 4, prefix_caching=prefix_caching)
    a, _ = m.admit([1, 2, 3, 4, 5, 6])
    m.commit(a, 6, [1, 2, 3, 4, 5, 6])
    b, _ = m.admit([1, 2, 3, 4, 9])
    m.commit(b, 5, [1, 2, 3, 4, 9])
    c = m.fork(a)
    m.preempt(c, "recompute")
    return m


def manager_state(m):
    return m.snapshot()


def paged_cache(prefix_caching=True, blocks=8, block_size=4):
    from kvlab.serving.paged_decode import cache_for, prefill

    c = cache_for(model(), blocks, block_size, prefix_caching=prefix_caching)
    a, _ = c.admit([1, 2, 3, 4, 5, 6])
    prefill(model(), c, a, [1, 2, 3, 4, 5, 6], attention="gather")
    b = c.new_sequence()
    prefill(model(), c, b, [1, 2, 3, 4, 9], attention="gather")
    return c


def cache_state(c):
    m = c.manager
    data = []
    for s in m.sequences():
        if m.state(s) == "resident":
            for layer in range(c.num_layers):
                k, v = c.gather(s, layer)
                n = m.num_computed(s)
                data.append((s, layer, k[:n].clone(), v[:n].clone()))
    registered = {
        h: (b, [p[b].clone() for p in c.k_pools], [p[b].clone() for p in c.v_pools])
        for h, b in m.cached_blocks().items()
    }
    return (
        m.snapshot(),
        {s: list(t) for s, t in c.layer_tokens.items()},
        sorted(c.host),
        dict(c.preemptions),
        data,
        registered,
    )


def engine(**options):
    from kvlab.serving.engine import Engine

    e = Engine(
        model(),
        num_blocks=16,
        block_size=4,
        max_batch=4,
        max_batched_tokens=64,
        attention="gather",
        **options,
    )
    e.add_request([1, 2, 3, 4, 5], 3)
    e.add_request([1, 2, 3, 4, 7, 8], 2)
    e.step()
    return e


def engine_state(e):
    reqs = [
        (r.id, r.state, r.seq, list(r.output), r.preemptions, r.admitted_tokens, r.cached_tokens)
        for r in e.requests.values()
    ]
    s = e.stats
    return (
        reqs,
        s.steps,
        s.generated_tokens,
        s.prefill_tokens,
        len(s.batch_sizes),
        len(e.events),
        [r.id for r in e.scheduler.waiting],
        [r.id for r in e.scheduler.running],
        [r.id for r in e.scheduler.swapped],
        cache_state(e.cache),
    )


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False


# --------------------------------------------------------------------------- the table of names


@dataclass
class Entry:
    name: str
    call: object  # call(obj, **kwargs) when setup is given, else call(**kwargs)
    args: dict
    kinds: dict = field(default_factory=dict)
    setup: object = None
    observe: object = None
    skip: tuple = ()  # arguments not varied
    allow: dict = field(default_factory=dict)  # {argument: classes that are valid for it}


def ids(*rows):
    return torch.tensor(rows or [[1, 2, 3, 4]])


def entries() -> list[Entry]:
    from kvlab import decode, devices, versions
    from kvlab.cache import block_manager as bm
    from kvlab.cache import blocks, layout, paged, quantized, window
    from kvlab.kernels import ssm_scan
    from kvlab.lab import (
        cache_quality,
        diagnose,
        hardware,
        models,
        paging,
        prefix,
        streams,
        timing,
        trained,
    )
    from kvlab.lab import engine as lab_engine
    from kvlab.serving import attention, paged_decode, request, runner, scheduler
    from kvlab.serving import engine as serving_engine
    from kvlab.show import format as fmt
    from kvlab.show import notebook, plots, widgets
    from kvlab.theory import (
        cache_sizes,
        matmul,
        memory_wall,
        roofline,
        shapes,
        specs,
        ssm,
        verdict,
        work,
    )

    M = model()
    shape8b = shapes.SHAPES["llama-3-8b"]
    E = []
    add = lambda *a, **k: E.append(Entry(*a, **k))  # noqa: E731

    # -- the block allocator, tables and hashes
    add("blocks.BlockAllocator", blocks.BlockAllocator, dict(num_blocks=8), dict(num_blocks="size"))
    add(
        "blocks.BlockAllocator.allocate",
        lambda o, **k: o.allocate(**k),
        dict(count=2),
        dict(count="int0"),
        setup=lambda: blocks.BlockAllocator(8),
        observe=lambda o: o.snapshot(),
    )
    add(
        "blocks.BlockAllocator.free",
        lambda o, **k: o.free(**k),
        dict(block=1, cached=False),
        dict(block="seq"),
        setup=lambda: (lambda a: (a.allocate(3), a)[1])(blocks.BlockAllocator(8)),
        observe=lambda o: o.snapshot(),
    )
    add(
        "blocks.BlockTable",
        blocks.BlockTable,
        dict(block_size=4, blocks=[3, 1], num_tokens=6),
        dict(blocks="ints", num_tokens="int0"),
        allow={"blocks": {"zero", "empty"}},
    )
    add(
        "blocks.BlockTable.slots",
        lambda o, **k: o.slots(**k),
        dict(start=1, end=5),
        dict(start="int0", end="int"),
        setup=lambda: blocks.BlockTable(4, [3, 1], 6),
    )
    add(
        "blocks.block_hashes",
        blocks.block_hashes,
        dict(token_ids=[1, 2, 3, 4, 5], block_size=2, salt=None),
        dict(salt="salt", token_ids="tokens"),
        allow={"token_ids": {"token-past-vocab", "empty"}},
    )

    # -- the block manager (prefix caching on)
    mgr = dict(setup=block_manager, observe=manager_state)
    add(
        "BlockManager",
        bm.BlockManager,
        dict(num_blocks=8, block_size=4, prefix_caching=True, bytes_per_block=64),
        dict(num_blocks="size", block_size="int", bytes_per_block="int?"),
    )
    add(
        "BlockManager.admit",
        lambda o, **k: o.admit(**k),
        dict(token_ids=[1, 2, 3, 4, 5, 6, 7], salt=None),
        dict(salt="salt"),
        allow={"token_ids": {"token-past-vocab"}},
        **mgr,
    )
    add(
        "BlockManager.lookup",
        lambda o, **k: o.lookup(**k),
        dict(token_ids=[1, 2, 3, 4, 5], salt=None),
        dict(salt="salt"),
        allow={"token_ids": {"token-past-vocab"}},
        **mgr,
    )
    add(
        "BlockManager.reserve",
        lambda o, **k: o.reserve(**k),
        dict(seq_id=1, num_tokens=2),
        dict(seq_id="seq", num_tokens="int0"),
        **mgr,
    )
    add(
        "BlockManager.commit",
        lambda o, **k: o.commit(**k),
        dict(seq_id=1, num_computed=8, token_ids=[1, 2, 3, 4, 9, 7, 8, 6]),
        dict(seq_id="seq", num_computed="int"),
        allow={"token_ids": {"token-past-vocab"}},
        setup=lambda: (lambda m: (m.reserve(1, 3), m)[1])(block_manager()),
        observe=manager_state,
    )
    add("BlockManager.fork", lambda o, **k: o.fork(**k), dict(seq_id=0), dict(seq_id="seq"), **mgr)
    add("BlockManager.free", lambda o, **k: o.free(**k), dict(seq_id=1), dict(seq_id="seq"), **mgr)
    add(
        "BlockManager.preempt",
        lambda o, **k: o.preempt(**k),
        dict(seq_id=1, mode="swap"),
        dict(seq_id="seq"),
        **mgr,
    )
    add(
        "BlockManager.resume",
        lambda o, **k: o.resume(**k),
        dict(seq_id=2, token_ids=[1, 2, 3, 4, 5, 6, 7]),
        dict(seq_id="seq"),
        allow={"token_ids": {"token-past-vocab"}},
        **mgr,
    )
    add(
        "BlockManager.blocks_to_append",
        lambda o, **k: o.blocks_to_append(**k),
        dict(seq_id=1, num_tokens=3),
        dict(seq_id="seq", num_tokens="int0"),
        **mgr,
    )
    add(
        "BlockManager.block_hash",
        lambda o, **k: o.block_hash(**k),
        dict(block=0),
        dict(block="seq"),
        **mgr,
    )
    add(
        "BlockManager.ref_count",
        lambda o, **k: o.ref_count(**k),
        dict(block=0),
        dict(block="seq"),
        **mgr,
    )
    add(
        "BlockManager.table", lambda o, **k: o.table(**k), dict(seq_id=0), dict(seq_id="seq"), **mgr
    )

    # -- the paged cache
    pc = dict(setup=paged_cache, observe=cache_state)
    add(
        "PagedKVCache",
        paged.PagedKVCache,
        dict(
            num_layers=2,
            num_blocks=8,
            block_size=4,
            num_kv_heads=2,
            head_dim=16,
            dtype=torch.float32,
            device="cpu",
            store=kernels.store_kv_ref,
            prefix_caching=True,
        ),
        dict(
            num_blocks="size",
            block_size="size",
            num_layers="size",
            num_kv_heads="size",
            head_dim="size",
            dtype="dtype",
            device="device",
            store="callable?",
        ),
    )
    add(
        "PagedKVCache.admit",
        lambda o, **k: o.admit(**k),
        dict(token_ids=[1, 2, 3, 4, 5, 6, 9], salt=None),
        dict(salt="salt"),
        allow={"token_ids": {"token-past-vocab"}},
        **pc,
    )
    add(
        "PagedKVCache.append",
        lambda o, **k: o.append(**k),
        dict(
            seq_id=1,
            layer=0,
            k=torch.ones(2, 2, 16),
            v=torch.ones(2, 2, 16),
            token_ids=[1, 2, 3, 4, 9, 5, 6],
        ),
        dict(seq_id="seq", layer="int0", k="tensor", v="tensor", token_ids="tokens?"),
        allow={"token_ids": {"token-past-vocab"}},
        **pc,
    )
    add(
        "PagedKVCache.reserve",
        lambda o, **k: o.reserve(**k),
        dict(seq_id=1, num_tokens=2),
        dict(seq_id="seq", num_tokens="int0"),
        **pc,
    )
    add(
        "PagedKVCache.commit",
        lambda o, **k: o.commit(**k),
        dict(seq_id=1, num_computed=5, token_ids=[1, 2, 3, 4, 9, 5, 6, 7]),  # what is written
        dict(seq_id="seq", num_computed="int"),
        allow={"token_ids": {"token-past-vocab"}},
        setup=lambda: (lambda c: (c.reserve(1, 3), c)[1])(paged_cache()),
        observe=cache_state,
    )
    add("PagedKVCache.fork", lambda o, **k: o.fork(**k), dict(seq_id=0), dict(seq_id="seq"), **pc)
    add("PagedKVCache.free", lambda o, **k: o.free(**k), dict(seq_id=1), dict(seq_id="seq"), **pc)
    add(
        "PagedKVCache.preempt",
        lambda o, **k: o.preempt(**k),
        dict(seq_id=1, mode="swap"),
        dict(seq_id="seq"),
        **pc,
    )
    add(
        "PagedKVCache.gather",
        lambda o, **k: o.gather(**k),
        dict(seq_id=0, layer=1),
        dict(seq_id="seq", layer="int0"),
        **pc,
    )
    add(
        "PagedKVCache.seq_lens",
        lambda o, **k: o.seq_lens(**k),
        dict(seq_ids=[0, 1], layer=1),
        dict(seq_ids="ints", layer="int0?"),
        allow={"seq_ids": {"zero", "empty"}},
        **pc,
    )
    add(
        "PagedKVCache.block_tables",
        lambda o, **k: o.block_tables(**k),
        dict(seq_ids=[0, 1]),
        dict(seq_ids="ints"),
        allow={"seq_ids": {"zero", "empty"}},
        **pc,
    )
    add(
        "paged.tokens_in_budget",
        paged.tokens_in_budget,
        dict(budget_bytes=1e9, shape=shape8b, bytes_per_element=2),
        dict(budget_bytes="real", shape="shape", bytes_per_element="real"),
    )
    add(
        "paged.copy_blocks_to_host",
        lambda o, **k: paged.copy_blocks_to_host(o.k_pools, o.v_pools, **k),
        dict(blocks=[0, 1]),
        dict(blocks="ints"),
        allow={"blocks": {"zero", "empty"}},
        **pc,
    )

    # -- the paged decode loops
    add(
        "paged_decode.cache_for",
        paged_decode.cache_for,
        dict(
            model=M,
            num_blocks=8,
            block_size=4,
            prefix_caching=True,
            device="cpu",
            store=kernels.store_kv_ref,
        ),
        dict(num_blocks="size", block_size="size", device="device", store="callable?"),
    )
    add(
        "paged_decode.prefill",
        lambda o, **k: paged_decode.prefill(cache=o, **k),
        dict(model=M, seq_id=1, token_ids=[1, 2, 3, 4, 9, 5, 6], attention="gather", max_tokens=2),
        dict(seq_id="seq", max_tokens="int?"),
        **pc,
    )
    add(
        "paged_decode.decode_step",
        lambda o, **k: paged_decode.decode_step(cache=o, **k),
        dict(
            model=M,
            seq_ids=[0, 1],
            token_ids=[[1, 2, 3, 4, 5, 6, 5], [1, 2, 3, 4, 9, 6]],
            attention="gather",
        ),
        dict(seq_ids="ints", token_ids="any"),
        allow={"seq_ids": {"zero"}},
        **pc,
    )
    add(
        "paged_decode.generate",
        lambda o, **k: paged_decode.generate(cache=o, **k),
        dict(
            model=M,
            token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 10],
            max_new_tokens=3,
            salt=None,
            attention="gather",
        ),
        dict(max_new_tokens="size", salt="salt"),
        **pc,
    )
    add(
        "paged_decode.paged_generate",
        paged_decode.paged_generate,
        dict(
            model=M,
            prompts=[[1, 2, 3], [4, 5]],
            max_new_tokens=3,
            block_size=4,
            num_blocks=8,
            attention="gather",
            preemption="swap",
            max_batch=2,
        ),
        dict(
            prompts="tokens",
            max_new_tokens="size",
            block_size="size",
            num_blocks="size?",
            max_batch="int",
            attention="choice?",
        ),
        allow={"prompts": {"nested"}},
    )

    # -- the engine
    en = dict(setup=engine, observe=engine_state)
    add(
        "Engine",
        serving_engine.Engine,
        dict(
            model=M,
            num_blocks=16,
            block_size=4,
            max_batch=4,
            max_batched_tokens=64,
            prefix_caching=True,
            preemption="recompute",
            kv_budget_bytes=None,
            attention="gather",
            cuda_graphs=False,
            watermark=0.01,
            debug=False,
        ),
        dict(
            num_blocks="size?",
            block_size="size",
            max_batch="int",
            max_batched_tokens="int",
            kv_budget_bytes="size?",
            cuda_graphs="flag?",
            watermark="frac",
            attention="choice?",
        ),
    )
    add(
        "Engine.add_request",
        lambda o, **k: o.add_request(**k),
        dict(prompt=[1, 2, 3], max_new_tokens=2),
        dict(max_new_tokens="size"),
        allow={"max_new_tokens": {"huge"}},
        **en,
    )
    add(
        "Engine.generate",
        lambda o, **k: o.generate(**k),
        dict(prompts=[[1, 2, 3], [4, 5]], max_new_tokens=[2, 3]),
        dict(prompts="tokens", max_new_tokens="ints"),
        allow={"max_new_tokens": {"int-as-list"}},
        **en,
    )
    add(
        "Engine.metrics",
        lambda o, **k: o.metrics(**k),
        dict(requests=None),
        dict(requests="ints?"),
        allow={"requests": {"empty"}},
        **en,
    )
    add(
        "request.Request",
        request.Request,
        dict(id=0, token_ids=[1, 2], max_new_tokens=2, arrival=0.0),
        dict(id="int0", max_new_tokens="int", arrival="real0"),
        allow={"token_ids": {"token-past-vocab"}, "arrival": {"negative"}},
    )  # no vocabulary; times are relative
    add(
        "lab.engine.timeline",
        lab_engine.timeline,
        dict(events=[request.Event(0, 0, "arrive")], num_steps=3),
        dict(events="any", num_steps="int0"),
    )
    add(
        "scheduler.Scheduler",
        lambda **k: scheduler.Scheduler(bm.BlockManager(8, 4), **k),
        dict(
            max_batch=4, max_batched_tokens=16, preemption="recompute", watermark_blocks=0, log=None
        ),
        dict(max_batch="int", max_batched_tokens="int", watermark_blocks="int0", log="callable?"),
    )
    add(
        "runner.ModelRunner",
        lambda o, **k: runner.ModelRunner(cache=o, **k),
        dict(model=M, attention="gather", cuda_graphs=False, max_batch=1),
        dict(max_batch="int"),
        **pc,
    )
    add(
        "runner.ModelRunner.run",
        lambda o, **k: runner.ModelRunner(M, o, "gather").run(**k),
        dict(chunks=[(0, 6, [7])]),
        dict(chunks="any"),
        setup=lambda: (  # as the scheduler leaves it: reserved, committed for the step
            lambda c: (c.reserve(0, 1), c.commit(0, 7, [1, 2, 3, 4, 5, 6, 7], checked=True), c)[2]
        )(paged_cache()),
        observe=cache_state,
    )
    add(
        "attention.build_step",
        lambda o, **k: attention.build_step(o, **k),
        dict(chunks=[(1, 5, [5])], path="gather"),
        setup=lambda: (
            lambda c: (c.reserve(1, 1), c.commit(1, 6, [1, 2, 3, 4, 9, 5], checked=True), c)[2]
        )(paged_cache()),
        observe=cache_state,
    )

    # -- lab: engine, prefix, paging
    add(
        "lab.engine.make_requests",
        lab_engine.make_requests,
        dict(
            n=4,
            distribution="lognormal",
            mean_prompt=8.0,
            mean_output=4.0,
            max_len=32,
            shared_prompts=2,
            shared_len=4,
            shared_fraction=0.5,
            vocab=VOCAB,
            seed=0,
        ),
        dict(
            n="int0",
            max_len="int",
            shared_prompts="int0",
            shared_len="int0",
            shared_fraction="frac",
            vocab="int",
            seed="seed",
            mean_prompt="real",
            mean_output="real",
        ),
    )
    add(
        "lab.engine.static_generate",
        lab_engine.static_generate,
        dict(model=M, prompts=[[1, 2, 3], [4, 5]], max_new_tokens=[2, 3], batch_size=2),
        dict(prompts="tokens", max_new_tokens="ints", batch_size="int"),
    )
    add(
        "lab.engine.compare_serving",
        lab_engine.compare_serving,
        dict(
            model=M,
            prompts=[[1, 2, 3], [4, 5]],
            max_new_tokens=[2, 3],
            max_batch=2,
            block_size=4,
            num_blocks=8,
            reps=1,
            contenders=("engine", "padded generate"),
            attention="gather",
        ),
        dict(
            prompts="tokens",
            max_new_tokens="ints",
            max_batch="int",
            block_size="size",
            num_blocks="size?",
            reps="int",
            attention="choice?",
        ),
    )
    add(
        "lab.engine.latency_throughput",
        lab_engine.latency_throughput,
        dict(
            model=M,
            prompts=[[1, 2, 3], [4, 5]],
            max_new_tokens=[2, 3],
            batches=(1, 2),
            num_blocks=8,
            block_size=4,
            attention="gather",
        ),
        dict(
            prompts="tokens",
            max_new_tokens="ints",
            batches="ints",
            num_blocks="size?",
            attention="choice?",
        ),
    )
    add(
        "lab.prefix.make_chat_trace",
        prefix.make_chat_trace,
        dict(
            num_system_prompts=2,
            num_users=3,
            turns=2,
            system_tokens=8,
            user_tokens=4,
            reply_tokens=4,
            think_time=2.0,
            vocab=VOCAB,
            seed=0,
        ),
        dict(
            num_system_prompts="size",
            num_users="size",
            turns="size",
            system_tokens="int0",
            user_tokens="size",
            reply_tokens="size",
            think_time="real0",
            vocab="int",
            seed="seed",
        ),
    )
    trace = prefix.make_chat_trace(2, 3, 2, 8, 4, 4, 2.0, VOCAB, 0)
    add(
        "lab.prefix.replay",
        prefix.replay,
        dict(trace=trace, num_blocks=16, block_size=4, policy="lru"),
        dict(trace="any", num_blocks="size", block_size="int"),
    )
    add(
        "lab.prefix.simulate_eviction",
        prefix.simulate_eviction,
        dict(trace=trace, num_blocks=16, block_size=4, policy="leaf-lru"),
        dict(trace="any", num_blocks="size", block_size="int", policy="choice"),
    )
    add(
        "lab.prefix.measure_ttft",
        prefix.measure_ttft,
        dict(
            model=M,
            prompt_tokens=12,
            prefix_tokens=[0, 8],
            block_size=4,
            warmup=0,
            reps=1,
            seed=0,
            attention="gather",
        ),
        dict(
            prompt_tokens="size",
            prefix_tokens="ints",
            block_size="size",
            warmup="int0",
            reps="int",
            seed="seed",
            attention="choice?",
        ),
        allow={"prefix_tokens": {"zero"}},
    )
    add(
        "lab.prefix.measure_decode_after_prefix",
        prefix.measure_decode_after_prefix,
        dict(model=M, prompt_tokens=8, block_size=4, steps=2, seed=0, attention="gather"),
        dict(
            prompt_tokens="size", block_size="size", steps="size", seed="seed", attention="choice?"
        ),
    )
    add(
        "lab.paging.make_trace",
        paging.make_trace,
        dict(n=4, distribution="lognormal", mean_prompt=8.0, mean_output=4.0, max_len=32, seed=0),
        dict(n="size", max_len="int", seed="seed"),
        allow={"n": {"zero"}},
    )
    ptrace = paging.make_trace(4, "uniform", 8.0, 4.0, 32, 0)
    add(
        "lab.paging.simulate",
        paging.simulate,
        dict(
            trace=ptrace,
            policy="paged",
            budget_tokens=128,
            block_size=4,
            max_batch=4,
            max_len=32,
            estimate=4,
            preemption="recompute",
        ),
        dict(
            trace="any",
            budget_tokens="size",
            block_size="int",
            max_batch="int",
            max_len="int?",
            estimate="int?",
        ),
    )
    add(
        "lab.paging.ContiguousMemory",
        paging.ContiguousMemory,
        dict(budget=64, max_len=16, estimate=4),
        dict(budget="int", max_len="int", estimate="int?"),
    )

    # -- lab: diagnose, verdict, trained, models, streams, quality, hardware, timing
    add(
        "lab.diagnose.batch_sweep",
        diagnose.batch_sweep,
        dict(
            model=M,
            input_ids=ids(),
            max_new_tokens=2,
            batches=[1],
            method="cached",
            memory=None,
            compile=False,
        ),
        dict(max_new_tokens="size", batches="ints", memory="real?", compile="flag?"),
    )
    add("lab.diagnose.this_machine", diagnose.this_machine, dict(memory=None), dict(memory="real?"))
    from kvlab.lab import step_trace

    add(
        "lab.step_trace.trace_steps",
        step_trace.trace_steps,
        dict(model=M, input_ids=ids(), methods=("cached", "static"), warmup=0, reps=1, traces=1),
        dict(model="model", methods="names", warmup="int0", reps="int", traces="int"),
    )
    add(
        "theory.verdict.decide",
        verdict.decide,
        dict(
            busy_fraction=0.9,
            bandwidth_fraction=0.3,
            flops_fraction=0.1,
            kv_share=0.2,
            admitted=True,
        ),
        dict(
            busy_fraction="frac",
            bandwidth_fraction="real0",
            flops_fraction="real0",
            kv_share="frac",
            admitted="flag",
        ),
    )
    add("theory.verdict.lever", verdict.lever, dict(verdict="kv", method="cached"))
    add(
        "theory.verdict.Target",
        verdict.Target,
        dict(tpot=0.1, ttft=None, memory=None),
        dict(tpot="real?", ttft="real?", memory="real?"),
    )
    add(
        "theory.verdict.capacity_batch",
        verdict.capacity_batch,
        dict(shape=shape8b, hw="h100-sxm", context=4096, w=2.0),
        dict(shape="shape", hw="hw", context="int", w="real"),
    )
    add(
        "theory.verdict.useful_batch",
        verdict.useful_batch,
        dict(sweep=[], target=verdict.Target()),
        dict(sweep="any", target="shape"),
    )
    add(
        "lab.trained.heldout_perplexity",
        trained.heldout_perplexity,
        dict(
            model=kvlab.trained_model()[0],
            context=32,
            max_tokens=64,
            text="In the beginning was the word.",
        ),
        dict(context="size?", max_tokens="int?", text="text?"),
    )
    add(
        "lab.trained.heldout_ids",
        trained.heldout_ids,
        dict(text="In the beginning."),
        dict(text="text?"),
    )
    add(
        "lab.models.tiny_model",
        models.tiny_model,
        dict(
            arch="llama",
            size="cpu",
            layers=1,
            hidden=32,
            q_heads=2,
            kv_heads=1,
            vocab=64,
            intermediate=32,
            device="cpu",
            dtype=torch.float32,
            seed=0,
            max_positions=64,
        ),
        dict(
            layers="size",
            hidden="size",
            q_heads="size",
            kv_heads="size",
            vocab="size",
            intermediate="size",
            device="device",
            dtype="dtype",
            seed="seed",
            max_positions="int",
        ),
        allow={"intermediate": {"none"}},
    )
    add(
        "lab.models.tiny_hybrid",
        models.tiny_hybrid,
        dict(
            layers=2,
            attention_layers=1,
            hidden=32,
            heads=2,
            kv_heads=None,
            state_size=4,
            expand=2,
            vocab=64,
            seed=0,
            device="cpu",
            dtype=torch.float32,
        ),
        dict(
            layers="size",
            attention_layers="size",
            hidden="size",
            heads="size",
            kv_heads="size?",
            state_size="size",
            expand="size",
            vocab="size",
            seed="seed",
            device="device",
            dtype="dtype?",
        ),
    )
    add(
        "lab.streams.kl_divergence",
        streams.kl_divergence,
        dict(
            reference=torch.log_softmax(torch.randn(3, 5), -1),
            other=torch.log_softmax(torch.randn(3, 5), -1),
        ),
        dict(reference="tensor", other="tensor"),
    )
    add(
        "lab.streams.eviction_mask",
        streams.eviction_mask,
        dict(n=8, num_sink=1, window=4),
        dict(n="size", num_sink="int0", window="int?"),
        allow={"n": {"zero"}},
    )
    add(
        "lab.cache_quality.attention_error",
        cache_quality.attention_error,
        dict(
            q=torch.randn(2, 4),
            k=torch.randn(5, 4),
            v=torch.randn(5, 4),
            k_hat=torch.randn(5, 4),
            v_hat=torch.randn(5, 4),
        ),
        dict(q="tensor", k="tensor", v="tensor", k_hat="tensor", v_hat="tensor"),
    )
    add(
        "lab.cache_quality.outlier_keys",
        cache_quality.outlier_keys,
        dict(tokens=8, head_dim=8, outlier_channels=2, outlier_scale=20.0, seed=0),
        dict(
            tokens="size",
            head_dim="size",
            outlier_channels="int0",
            outlier_scale="real",
            seed="seed",
        ),
    )
    add(
        "lab.cache_quality.uniform_share",
        cache_quality.uniform_share,
        dict(n=64, first=1, skip=16),
        dict(n="int", first="int", skip="int0"),
    )
    add("lab.hardware.stamp_line", hardware.stamp_line, dict(s=hardware.stamp()), dict(s="shape?"))
    add(
        "lab.hardware.calibrated_device",
        hardware.calibrated_device,
        dict(calibration=None, memory=1e9),
        dict(memory="real?", calibration="shape?"),
    )
    add(
        "lab.hardware.memory_bytes",
        hardware.memory_bytes,
        dict(device="cpu"),
        dict(device="device"),
    )
    add(
        "lab.timing.measure",
        timing.measure,
        dict(fn=lambda: None, warmup=1, reps=2, device=None),
        dict(fn="callable", warmup="int0", reps="int", device="device?"),
    )

    # -- the decode loops and versions
    add(
        "decode.naive_decode",
        decode.naive_decode,
        dict(model=M, input_ids=ids(), max_new_tokens=2),
        dict(max_new_tokens="int0"),
    )
    add(
        "decode.cached_decode",
        decode.cached_decode,
        dict(model=M, input_ids=ids(), max_new_tokens=2),
        dict(max_new_tokens="int0"),
    )
    add(
        "decode.static_decode",
        decode.static_decode,
        dict(model=M, input_ids=ids(), max_new_tokens=2, compile=False),
        dict(max_new_tokens="int0", compile="flag?"),
    )
    add(
        "versions.drop_newest",
        lambda **k: versions.drop_newest(_static_cache(M), **k),
        dict(tokens=1),
        dict(tokens="size"),
    )
    add(
        "versions.cache_kwargs", versions.cache_kwargs, dict(model=M, cache=None), dict(cache="any")
    )
    add(
        "versions.returned_cache",
        versions.returned_cache,
        dict(output=M(ids(), use_cache=True)),
        dict(output="model"),
    )
    add(
        "versions.takes",
        versions.takes,
        dict(model=M, argument="logits_to_keep"),
        dict(argument="text"),
    )
    add(
        "versions.require_transformers",
        versions.require_transformers,
        dict(minimum="5.0", feature="x"),
        dict(minimum="text", feature="text"),
    )
    add(
        "versions.upgrade_command",
        versions.upgrade_command,
        dict(low={"torch": "2.0"}),
        dict(low="shape"),
    )
    add(
        "versions.installed",
        versions.installed,
        dict(distribution="torch"),
        dict(distribution="text"),
    )
    add(
        "devices.device_and_dtype",
        devices.device_and_dtype,
        dict(device="cpu", dtype=torch.float32),
        dict(device="device?", dtype="dtype?"),
    )

    # -- caches of section 9.7
    add(
        "cache.quantized.QuantizedKVCache",
        quantized.QuantizedKVCache,
        dict(bits=4, group_size=8, residual=8, key_groups="channel"),
        dict(bits="int", group_size="int", residual="int0"),
    )
    add(
        "cache.quantized.quantize",
        quantized.quantize,
        dict(x=torch.randn(4, 8), bits=4, group_size=4, axis=-1),
        dict(x="tensor", bits="int", group_size="size", axis="seed"),
    )
    add(
        "cache.window.SinkCache",
        window.SinkCache,
        dict(num_sink=2, window=8, rope="original", model=None),
        dict(num_sink="int0", window="int", model="model?"),
    )
    add(
        "cache.window.SlidingWindowCache",
        window.SlidingWindowCache,
        dict(window=8, rope="original", model=None),
        dict(window="int", model="model?"),
    )
    add(
        "cache.layout.new_cache",
        layout.new_cache,
        dict(
            layout="NHD",
            batch=2,
            length=4,
            kv_heads=2,
            head_dim=8,
            layers=1,
            capacity=8,
            block_size=4,
            spare_blocks=0,
            dtype=torch.float32,
            device="cpu",
            seed=0,
        ),
        dict(
            batch="size",
            length="int0",
            kv_heads="size",
            head_dim="size",
            layers="size",
            capacity="size?",
            block_size="size",
            spare_blocks="int0",
            dtype="dtype?",
            device="device?",
            seed="seed",
        ),
    )
    add(
        "cache.layout.cache_from_dense",
        layout.cache_from_dense,
        dict(
            layout="NHD",
            k=torch.randn(1, 2, 6, 2, 8),
            v=torch.randn(1, 2, 6, 2, 8),
            capacity=8,
            block_size=4,
            spare_blocks=0,
            seed=0,
        ),
        dict(
            k="tensor",
            v="tensor",
            capacity="size?",
            block_size="size",
            spare_blocks="int0",
            seed="seed",
        ),
    )
    add(
        "kernels.selective_state_update_ref",
        ssm_scan.selective_state_update_ref,
        dict(
            state=torch.zeros(1, 4, 2),
            u=torch.randn(1, 4),
            delta=torch.rand(1, 4),
            A=-torch.rand(4, 2),
            B=torch.randn(1, 2),
            C=torch.randn(1, 2),
            delta_softplus=True,
        ),
        dict(
            state="tensor",
            u="tensor",
            delta="tensor",
            A="tensor",
            B="tensor",
            C="tensor",
            delta_softplus="flag",
        ),
    )

    # -- theory
    add(
        "theory.shapes.ModelShape",
        shapes.ModelShape,
        dict(
            name="m",
            layers=2,
            q_heads=4,
            kv_heads=2,
            head_dim=8,
            hidden=32,
            params=1e6,
            vocab=64,
            latent_dim=None,
            rope_dim=None,
            window=None,
            intermediate=None,
            active_params=None,
        ),
        dict(name="text", params="real", window="int?", intermediate="int?", active_params="real?"),
    )
    add(
        "theory.specs.Accelerator",
        specs.Accelerator,
        dict(
            name="x",
            hbm_bytes=80e9,
            hbm_bytes_per_s=3e12,
            bf16_flops=1e15,
            dies=1,
            die_bytes_per_s=3e12,
            fabric_bytes_per_s=None,
            source="s",
            hbm_bytes_exposed=None,
            host_link=None,
        ),
        dict(
            name="text",
            source="text",
            hbm_bytes="real",
            hbm_bytes_per_s="real",
            bf16_flops="real",
            dies="int",
            die_bytes_per_s="real",
            fabric_bytes_per_s="real?",
            hbm_bytes_exposed="real?",
            host_link="choice?",
        ),
    )
    add(
        "theory.roofline.step_time_floor",
        roofline.step_time_floor,
        dict(
            shape=shape8b,
            hw="h100-sxm",
            batch=4,
            context=1024,
            w_p=2.0,
            w_kv=2.0,
            placement="striped",
        ),
        dict(shape="shape", hw="hw", batch="int", context="int", w_p="real", w_kv="real"),
    )
    add(
        "theory.roofline.admitted",
        roofline.admitted,
        dict(shape=shape8b, hw="h100-sxm", batch=4, context=1024, w_p=2.0, w_kv=2.0, devices=1),
        dict(
            shape="shape",
            hw="hw",
            batch="int",
            context="int",
            w_p="real",
            w_kv="real",
            devices="int",
        ),
    )
    add(
        "theory.roofline.prefill_time",
        roofline.prefill_time,
        dict(shape=shape8b, hw="h100-sxm", tokens=1024, mfu=0.7, hit_rate=0.0, prefix_tokens=0),
        dict(
            shape="shape", hw="hw", tokens="int", mfu="frac", hit_rate="frac", prefix_tokens="int0"
        ),
        allow={"mfu": {"zero"}},
    )
    add(
        "theory.roofline.compression_speedup",
        roofline.compression_speedup,
        dict(c=2.0, context=4096, s_star=1000.0),
        dict(c="real", context="int", s_star="real"),
        allow={"s_star": {"inf"}},
    )
    add(
        "theory.roofline.sharing_factor",
        roofline.sharing_factor,
        dict(prefix_tokens=100, suffix_tokens=10, requests=4),
        dict(prefix_tokens="int0", suffix_tokens="int0", requests="int"),
    )
    add(
        "theory.roofline.transfer_time",
        roofline.transfer_time,
        dict(nbytes=1e9, link_bytes_per_s=1e10, codec=1.0),
        dict(nbytes="real0", link_bytes_per_s="real", codec="real"),
    )
    add(
        "theory.memory_wall.footprint",
        memory_wall.footprint,
        dict(
            shape=shape8b,
            context=4096,
            batch=4,
            w_q=2.0,
            retention=1.0,
            fragmentation=0.0,
            sharing=1.0,
            hbm_fraction=1.0,
        ),
        dict(
            shape="shape",
            context="int",
            batch="int",
            w_q="real",
            retention="frac",
            fragmentation="frac",
            sharing="real",
            hbm_fraction="frac",
        ),
        allow={"retention": {"zero"}, "hbm_fraction": {"zero"}},
    )
    add(
        "theory.memory_wall.recommend",
        memory_wall.recommend,
        dict(
            shape=shape8b,
            hw="h100-sxm",
            context=4096,
            batch=4,
            quality_budget="moderate",
            retrieval_critical=False,
        ),
        dict(shape="shape", hw="hw", context="int", batch="int", retrieval_critical="flag"),
    )
    add(
        "theory.work.step_work",
        work.step_work,
        dict(shape=shape8b, batch=2, context=128, method="cached", w_p=2.0, w_kv=2.0),
        dict(shape="shape", batch="int", context="int", w_p="real", w_kv="real"),
    )
    add(
        "theory.work.positions_processed",
        work.positions_processed,
        dict(P=4, G=3, cached=True),
        dict(P="int", G="int0", cached="flag"),
    )
    add(
        "theory.ssm.scan_work",
        ssm.scan_work,
        dict(length=16, method="chunked", chunk_size=4),
        dict(length="int", chunk_size="int?"),
    )
    add(
        "theory.cache_sizes.cache_bytes",
        cache_sizes.cache_bytes,
        dict(
            shape=shape8b,
            tokens=1024,
            bytes_per_element=2.0,
            window=None,
            kv_heads=None,
            full=False,
        ),
        dict(
            shape="shape",
            tokens="int0",
            bytes_per_element="real",
            window="int?",
            kv_heads="int?",
            full="flag",
        ),
    )
    add(
        "theory.matmul.matmul_bytes",
        matmul.matmul_bytes,
        dict(n=4, K=64, N=64, element_size=2.0),
        dict(n="int", K="int", N="int", element_size="real"),
    )

    # -- show
    add(
        "show.notebook.reading",
        notebook.reading,
        dict(markdown_text="a *b*"),
        dict(markdown_text="text"),
    )
    add(
        "show.format.si",
        fmt.si,
        dict(value=3.2e9, unit="B/s", digits=3),
        dict(value="real0", unit="text", digits="size"),
        allow={"value": {"negative", "inf", "nan"}},
    )
    add(
        "show.format.sig",
        fmt.sig,
        dict(x=3.14159, digits=3),
        dict(x="real0", digits="size"),
        allow={"x": {"negative", "inf", "nan"}},
    )
    add(
        "show.plots.new_figure",
        plots.new_figure,
        dict(ncols=1, width=4.0, height=3.0),
        dict(ncols="size", width="real?", height="real"),
    )
    add(
        "show.widgets.explore",
        widgets.explore,
        dict(
            measure=lambda x: x,
            sliders={"x": [1, 2]},
            plot=lambda ax, r, **p: None,
            defaults=None,
            title="t",
            reading=None,
            static=True,
        ),
        dict(
            measure="callable",
            sliders="any",
            plot="callable",
            title="text?",
            reading="callable?",
            static="flag?",
        ),
    )
    return E + newer_entries() + door_entries() + reading_entries()


def newer_entries() -> list[Entry]:
    """Issue 33: the names added since the sweep was first written (the models the readings decide
    by, decode across devices without spawning, the static step and cache, the lab's new doors)."""
    import tempfile

    from kvlab import decode
    from kvlab.cache.layout import new_cache
    from kvlab.lab import decode_peers, layout_timing, paging, pretrained, trained
    from kvlab.parallel import context
    from kvlab.serving.request import Request
    from kvlab.theory import (
        cache_sizes,
        decode_step,
        kernel_rounding,
        long_context,
        matmul,
        peers,
        prefill_attention,
        prefix,
        serving,
        shapes,
        verdict,
        work,
    )
    from kvlab.theory import paging as paging_model
    from kvlab.theory import parallel as par
    from kvlab.versions import cache_kwargs

    M, E = model(), []
    add = lambda *a, **k: E.append(Entry(*a, **k))  # noqa: E731
    signed = {"zero", "negative"}  # a difference or a change may be zero or negative
    trace = [Request(0, [1] * 10, 20)]
    l1b, l70 = shapes.SHAPES["llama-3.2-1b"], shapes.SHAPES["llama-3-70b"]
    T = lambda name, fn, args, kinds, **k: add("theory." + name, fn, args, kinds, **k)  # noqa: E731

    T(
        "decode_step.near_floor",
        decode_step.near_floor,
        dict(step=1.2, floor=1.0, band=1.5),
        dict(step="real", floor="real", band="real"),
    )
    T(
        "decode_step.stands_out",
        decode_step.stands_out,
        dict(change=0.1, step=1.0, spread=0.05),
        dict(change="real", step="real", spread="real0"),
        allow={"change": signed},
    )
    T(
        "decode_step.predicted_step",
        decode_step.predicted_step,
        dict(t0=0.01, s0=10, context=100, kv_bytes_per_token=1024, bandwidth=1e10, passes=3),
        dict(t0="real0", s0="real0", kv_bytes_per_token="real0", bandwidth="real", passes="int"),
        skip=("context",),
    )
    T(
        "decode_step.step_slope",
        decode_step.step_slope,
        dict(kv_bytes_per_token=1024, bandwidth=1e10, passes=3),
        dict(kv_bytes_per_token="real0", bandwidth="real", passes="int"),
    )
    T(
        "decode_step.step_spread",
        decode_step.step_spread,
        dict(step_times=[1.0, 1.1, 1.2, 0.9]),
        dict(step_times="reals"),
    )
    T(
        "decode_step.fitted_growth",
        decode_step.fitted_growth,
        dict(step_times=[1.0, 1.1, 1.2, 0.9]),
        dict(step_times="reals"),
    )
    T(
        "decode_step.weight_read_floor",
        decode_step.weight_read_floor,
        dict(weight_bytes=1e6, bandwidth=1e10),
        dict(weight_bytes="real0", bandwidth="real"),
    )
    T("cache_sizes.rounding_rms", cache_sizes.rounding_rms, dict(step=0.1), dict(step="real0"))
    T(
        "cache_sizes.rounding_explains",
        cache_sizes.rounding_explains,
        dict(measured_rms=0.03, step_rms=0.1),
        dict(measured_rms="real0", step_rms="real0"),
    )
    T(
        "kernel_rounding.explained_by_rounding",
        kernel_rounding.explained_by_rounding,
        dict(difference=1e-6, dtype="float32"),
        dict(difference="real0", dtype="choice"),
    )
    T(
        "peers.target_met",
        peers.target_met,
        dict(value=1.2, target=1.0),
        dict(value="real", target="real"),
    )
    T(
        "prefix.hit_rate_verdict",
        prefix.hit_rate_verdict,
        dict(hit=0.5, baseline_hit=0.4, margin=0.02),
        dict(hit="real", baseline_hit="real", margin="real0"),
        allow={"hit": signed, "baseline_hit": signed},
    )
    T(
        "serving.speedup_verdict",
        serving.speedup_verdict,
        dict(measured=2.0, low=1.5, high=3.0, tolerance=1.25),
        dict(measured="real", low="real", high="real", tolerance="real"),
    )
    T(
        "serving.batch_bound",
        serving.batch_bound,
        dict(capacity=4.0, max_batch=8),
        dict(capacity="real0", max_batch="int"),
    )
    T(
        "paging.within_waste_bound",
        paging_model.within_waste_bound,
        dict(waste=0.1, block_size=16, mean_tokens=100.0),
        dict(waste="frac", block_size="size", mean_tokens="real0"),
        allow={"block_size": {"huge"}},  # a formula: a huge block is no wrong answer
    )
    for name in ("predicted_waste", "paging_saves"):
        args = dict(trace=trace, block_size=16, max_len=29)
        if name == "predicted_waste":
            args = dict(args, policy="paged")
        T(
            f"paging.{name}",
            getattr(paging_model, name),
            args,
            dict(block_size="size", max_len="size", policy="choice"),
            skip=("trace",),
            allow={"max_len": {"huge"}, "block_size": {"huge"}},
        )
    T(
        "long_context.sink_heads",
        long_context.sink_heads,
        dict(share=[[0.5, 0.1]], uniform=0.1),
        dict(uniform="real"),
        skip=("share",),
    )
    T(
        "long_context.outlier_count",
        long_context.outlier_count,
        dict(ratios=[1.0, 5.0]),
        dict(ratios="reals"),
    )
    T(
        "long_context.keys_have_outliers",
        long_context.keys_have_outliers,
        dict(key_ratios=[5.0, 1.0], value_ratios=[1.0, 1.0]),
        dict(key_ratios="reals", value_ratios="reals"),
    )
    T(
        "long_context.same_up_to_rounding",
        long_context.same_up_to_rounding,
        dict(gap=1e-4),
        dict(gap="real"),
        allow={"gap": signed},
    )
    T(
        "long_context.block_means",
        long_context.block_means,
        dict(values=[1.0, 2.0, 3.0], block=1),
        dict(values="reals", block="int"),
        allow={"values": {"negative-in-list"}},
    )
    T(
        "matmul.fit_roofline",
        matmul.fit_roofline,
        dict(intensities=[1.0, 2.0, 4.0, 8.0], rates=[1e9, 2e9, 3e9, 3e9]),
        dict(intensities="paired", rates="paired"),
    )
    T(
        "parallel.link_table",
        par.link_table,
        dict(shapes=[l70, l1b], hw="h200", batch=1, context=4096, world=2, latency=0.0),
        dict(hw="hw", batch="int", context="int", world="int", latency="real0"),
        skip=("shapes",),
    )
    T(
        "parallel.tensor_parallel_step",
        par.tensor_parallel_step,
        dict(
            shape=l1b,
            hw="h200",
            batch=1,
            context=1024,
            world=2,
            link="nvlink4",
            latency=0.0,
            vocab_sharded=False,
        ),
        dict(
            shape="shape",
            hw="hw",
            batch="int",
            context="int",
            world="int",
            link="choice",
            latency="real0",
            vocab_sharded="flag",
        ),
    )
    work_ = prefill_attention.prefill_attention_work([8], [8], 32, 8, 128, 2, 16)
    T(
        "prefill_attention.attention_floor",
        prefill_attention.attention_floor,
        dict(work=work_, hw="h200", tiled=True),
        dict(hw="hw", tiled="flag"),
        skip=("work",),
    )
    T(
        "work.pass_time",
        work.pass_time,
        dict(tokens=10, a=1.0, b=0.1),
        dict(tokens="real0", a="real0", b="real0"),
    )
    T(
        "work.request_time",
        work.request_time,
        dict(P=4, G=2, a=1.0, b=0.1, cached=False),
        dict(P="int", G="int0", a="real0", b="real0", cached="flag"),
    )
    T(
        "work.compile_repaid",
        work.compile_repaid,
        dict(compile_seconds=1.0, step_gain=0.01, tokens=200),
        dict(compile_seconds="real0", step_gain="real", tokens="int0"),
        allow={"step_gain": signed},
    )
    T(
        "verdict.compare_loops",
        verdict.compare_loops,
        dict(tokens_per_s=100.0, reference_tokens_per_s=110.0, spread=0.1),
        dict(tokens_per_s="real", reference_tokens_per_s="real", spread="real0"),
    )
    T(
        "verdict.compare_idle",
        verdict.compare_idle,
        dict(
            static_idle_s=0.1,
            cached_idle_s=0.2,
            cached_ops=10,
            static_ops=10,
            graphed=False,
            spread=0.1,
        ),
        dict(
            static_idle_s="real0",
            cached_idle_s="real",
            cached_ops="int",
            static_ops="int",
            graphed="flag",
            spread="real0",
        ),
    )
    T(
        "verdict.compare_batch_tpot",
        verdict.compare_batch_tpot,
        dict(tpot_b=0.012, predicted=0.01, spread=0.05),
        dict(tpot_b="real", predicted="real", spread="real0"),
    )
    T(
        "verdict.past_ridge",
        verdict.past_ridge,
        dict(intensity=5.0, ridge=10.0),
        dict(intensity="real0", ridge="real"),
    )
    T(
        "verdict.exceeds_ceilings",
        verdict.exceeds_ceilings,
        dict(bandwidth_fraction=0.5, flops_fraction=0.2),
        dict(bandwidth_fraction="real0", flops_fraction="real0"),
    )

    add(
        "parallel.context.split_positions",
        context.split_positions,
        dict(length=10, world_size=2, cuts=[5]),
        dict(length="int0", world_size="int", cuts="cuts"),
    )
    add(
        "parallel.context.partial_attention",
        context.partial_attention,
        dict(
            q=torch.randn(1, 4, 8), k=torch.randn(1, 2, 5, 8), v=torch.randn(1, 2, 5, 8), scale=0.25
        ),
        dict(scale="real?", q="tensor", k="tensor", v="tensor"),
    )

    add(
        "decode.new_static_cache",
        decode.new_static_cache,
        dict(model=M, max_len=8),
        dict(max_len="size"),
    )
    add(
        "decode.StaticStep.step",
        lambda o, **k: o.step(**k),
        dict(
            token=torch.tensor([[1]]),
            position=torch.tensor([[0]]),
            mask=torch.ones(1, 8, dtype=torch.long),
        ),
        dict(token="ids", position="position", mask="mask8"),
        setup=lambda: decode.StaticStep(M, cache_kwargs(M, decode.new_static_cache(M, 8)), False),
    )
    add(
        "decode.static_decode",
        lambda model, **k: decode.static_decode(_as_model(model), **k),
        dict(model=M, input_ids=ids(), max_new_tokens=2),
        dict(model="static_model", input_ids="ids", max_new_tokens="int0"),
    )

    cache = new_cache("BHTD", batch=1, length=4, kv_heads=2, head_dim=8)
    add(
        "lab.layout_timing.append_traffic",
        layout_timing.append_traffic,
        dict(cache=cache, method="cat"),
        dict(method="choice", cache="model"),
    )
    add(
        "lab.layout_timing.measure_reads",
        layout_timing.measure_reads,
        dict(caches={"a": cache, "b": cache}, q_heads=2, warmup=0, reps=1),
        dict(caches="dict", q_heads="int?", warmup="int0", reps="int"),
    )
    add(
        "lab.trained.heldout_ids",
        trained.heldout_ids,
        dict(text="some text"),
        dict(text="nonempty_text"),
    )
    add(
        "lab.decode_peers.generate_peer",
        decode_peers.generate_peer,
        dict(model=M, input_ids=ids(), max_new_tokens=2),
        dict(model="model", input_ids="ids", max_new_tokens="int"),
    )
    add(
        "lab.paging.simulate",
        paging.simulate,
        dict(trace=trace, policy="paged", budget_tokens=256, block_size=16),
        dict(trace="trace", policy="choice", budget_tokens="size", block_size="size"),
    )
    stamp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False)
    add(
        "lab.pretrained.cache_stamp",
        pretrained.cache_stamp,
        dict(gguf_file=__import__("pathlib").Path(stamp.name)),
        dict(gguf_file="path"),
    )
    add(
        "serving.request.Request(stop)",
        Request,
        dict(id=0, token_ids=[1, 2], max_new_tokens=3, stop=frozenset({3})),
        dict(stop="stopset"),
        skip=("id", "token_ids", "max_new_tokens"),
    )
    return E


def door_entries() -> list[Entry]:
    """Issue 33, second round: the theory models, readings helpers and lab doors that the coverage
    test (tests/test_bad_call_coverage.py) found without a row, each with its valid call."""
    from kvlab.lab import bench, diagnose, engine, paging, repeatable_step, speculative
    from kvlab.show import readings
    from kvlab.show.readings import devices, verdicts
    from kvlab.show.readings import engine as engine_readings
    from kvlab.show.readings import speculative as spec_readings
    from kvlab.theory import agreement, matmul, memory_wall, roofline, shapes, ssm
    from kvlab.theory import speculative as spec

    E = []
    add = lambda *a, **k: E.append(Entry(*a, **k))  # noqa: E731
    l70 = shapes.SHAPES["llama-3-70b"]
    add(
        "theory.agreement.ratio_words",
        agreement.ratio_words,
        dict(r=1.5),
        dict(r="real"),
        allow={"r": {"zero", "negative"}},
    )
    add(
        "theory.agreement.factor_edges",
        agreement.factor_edges,
        dict(predicted=1.0, tolerance=2.0),
        dict(predicted="real", tolerance="real"),
    )
    add(
        "theory.matmul.compare_with_roofline",
        matmul.compare_with_roofline,
        dict(seconds=1e-3, n=1, K=64, N=64, element_size=4, bandwidth=1e10, peak=1e10),
        dict(
            seconds="real",
            n="int",
            K="int",
            N="int",
            element_size="real",
            bandwidth="real",
            peak="real",
        ),
    )
    add(
        "theory.memory_wall.map_regime",
        memory_wall.map_regime,
        dict(shape=l70, hw="h200", context=1024, batch=4),
        dict(shape="any", hw="hw", context="int", batch="int"),
    )
    add(
        "theory.roofline.step_time_floor",
        roofline.step_time_floor,
        dict(shape=l70, hw="h200", batch=4, context=1024),
        dict(shape="any", hw="hw", batch="int", context="int"),
    )
    add(
        "theory.roofline.transfer_time",
        roofline.transfer_time,
        dict(nbytes=1e9, link_bytes_per_s=1e10, codec=1.0),
        dict(nbytes="real", link_bytes_per_s="real", codec="real"),
    )
    add(
        "theory.speculative.speedup",
        spec.speedup,
        dict(alpha=0.5, k=4, t1=0.01, t_verify=0.012),
        dict(alpha="frac", k="int", t1="real", t_verify="real"),
        allow={"alpha": {"zero"}, "k": {"zero"}},  # k = 0 guesses is plain decoding
    )
    add(
        "theory.ssm.sampled_agrees",
        ssm.sampled_agrees,
        dict(sampled=0.5, exact=0.5, samples=100, state_size=4),
        dict(sampled="real0", exact="real0", samples="int", state_size="int"),
    )
    add(
        "show.readings.ratio_text",
        readings.ratio_text,
        dict(measured=1.2, predicted=1.0),
        dict(measured="real0", predicted="real"),
    )
    add(
        "show.readings.within",
        readings.within,
        dict(measured=1.2, predicted=1.0, factor=2.0),
        dict(measured="real", predicted="real", factor="real"),
        allow={"measured": {"zero", "negative"}, "predicted": {"zero", "negative"}},
    )
    add("show.readings.engine.number", engine_readings.number, dict(n=3), dict(n="int0"))
    add("show.readings.devices.binary_bytes", devices.binary_bytes, dict(n=4096), dict(n="real0"))
    add(
        "show.readings.verdicts.method_note",
        verdicts.method_note,
        dict(repeats=5),
        dict(repeats="int"),
    )
    add(
        "show.readings.speculative.spread",
        spec_readings.spread,
        dict(low=1.0, high=1.2),
        dict(low="real", high="real"),
    )
    add(
        "lab.bench.chapter_heading",
        bench.chapter_heading,
        dict(section="9.5 paged attention"),
        dict(section="text"),
    )
    add("lab.diagnose.threads_text", diagnose.threads_text, dict(threads=1), dict(threads="int"))
    add(
        "lab.engine.burst_requests",
        engine.burst_requests,
        dict(vocab=64, n=4, system=8, new=2),
        dict(vocab="int", n="int", system="int0", new="int"),
    )
    add("lab.paging.make_trace", paging.make_trace, dict(n=4), dict(n="int0"))
    add(
        "lab.repeatable_step.tile_prompt",
        repeatable_step.tile_prompt,
        dict(input_ids=ids(), context=8),
        dict(context="int"),
        allow={"input_ids": {"token-past-vocab", "negative-token"}},  # no model: checked where run
    )
    add(
        "lab.speculative.replay",
        speculative.replay,
        dict(prompt=[1, 2, 1, 2], output=[1, 2], k=2),
        dict(k="int"),
        allow={"prompt": {"token-past-vocab"}, "output": {"token-past-vocab", "empty"}},
    )
    return E


def reading_entries() -> list[Entry]:
    """Issue 33, third round: the readings and worked solutions that were owed a door, each called
    with records like the lab's (fakes with the fields a reading reads, where the real record needs
    a measurement). A record's own unmeasured fields are the tables' (tests/show), not varied
    here."""
    from types import SimpleNamespace as Fake

    from kvlab.lab.decode_peers import PeerComparison
    from kvlab.lab.paged_kernel import split_grid
    from kvlab.lab.preemption import CachedRecompute
    from kvlab.lab.timing import Timing
    from kvlab.show.readings import (
        cache_reuse,
        diagnosis,
        gemv,
        kv_layout,
        long_context,
        paged_attention,
        paged_kernel,
        preemption,
        prefix_caching,
    )
    from kvlab.show.readings.exercises import kv_layout as kv_layout_ex
    from kvlab.show.readings.exercises import long_context as long_context_ex
    from kvlab.show.readings.exercises import paged_kernel as paged_kernel_ex
    from kvlab.theory import roofline, shapes
    from kvlab.theory.long_context import Spread
    from kvlab.theory.peers import GENERATE, GENERATE_COMPILED

    E = []
    add = lambda *a, **k: E.append(Entry(*a, **k))  # noqa: E731

    def timing(t):
        return Timing(t, t, 1.1 * t, (t, 1.05 * t, 1.1 * t))

    def read(t, batch=2):
        return Fake(
            batch=batch, context=256, kv_heads=4, kv_bytes=2**20, timing=timing(t), predicted_s=t
        )

    def append(t):
        return Fake(new_bytes=64, timing=timing(t), predicted_s=t)

    times = {GENERATE: (1.0, 1.1), GENERATE_COMPILED: (0.9, 1.0), "cached": (0.8, 0.9)}
    times["static, compiled"] = (0.7, 0.8)
    peers = PeerComparison("tiny", "float32", "cpu", 1, 8, 8, times, times, {})
    trace = Fake(step_s=0.01, busy_fraction=0.9, busy_spread=0.05)
    diag = Fake(
        method="cached",
        context=40,
        batch=1,
        threads=1,
        trace=trace,
        verdict="weights",
        verdicts=("weights",),
        firm=True,
        because="b",
        lever="l",
        bandwidth_fraction=0.5,
        flops_fraction=0.1,
    )
    spread = Spread(0.5, 0.1, 6, 0.1, 0.9)
    cost = Fake(
        tokens=64,
        bytes_each_way=4096,
        recompute=timing(2e-3),
        swap_out=timing(1e-3),
        swap_in=timing(1e-3),
    )
    recompute = CachedRecompute(16, 200, (40, 20), (32, 16), {False: 260, True: 212}, True)
    floor = roofline.decode_floor_table(
        shapes.SHAPES["llama-3-8b"], "h100-sxm", [(1, 8192), (32, 2048), (32, 8192)], params=8e9
    )

    add(
        "show.readings.cache_reuse.peers_reading",
        cache_reuse.peers_reading,
        dict(result=peers),
        dict(result="record"),
    )
    add(
        "show.readings.diagnosis.verdict_label",
        diagnosis.verdict_label,
        dict(d=diag),
        dict(d="record"),
    )
    add(
        "show.readings.diagnosis.reading_diagnosis",
        diagnosis.reading_diagnosis,
        dict(d=diag),
        dict(d="record"),
    )
    add(
        "show.readings.kv_layout.append_reading",
        kv_layout.append_reading,
        dict(read=read(1e-3), index=append(1e-6), slot=append(1e-6), cat=append(2e-3)),
        dict.fromkeys(("read", "index", "slot", "cat"), "record"),
    )
    add(
        "show.readings.kv_layout.gqa_reading",
        kv_layout.gqa_reading,
        dict(mha=read(1e-3), small=read(5e-4), llc=None),
        dict(mha="record", small="record", llc="int?"),
    )
    add(
        "show.readings.exercises.kv_layout.kv_layout_batch",
        kv_layout_ex.kv_layout_batch,
        dict(
            lo_read=read(1e-3),
            hi_read=read(2e-3, 4),
            lo_append=append(1e-6),
            hi_append=append(1e-6),
            llc=None,
        ),
        dict(
            lo_read="record", hi_read="record", lo_append="record", hi_append="record", llc="int?"
        ),
    )
    add(
        "show.readings.exercises.kv_layout.kv_layout_cat",
        kv_layout_ex.kv_layout_cat,
        dict(read=read(1e-3), cat=append(2e-3)),
        dict(read="record", cat="record"),
    )
    add(
        "show.readings.exercises.long_context.long_context_sinks",
        long_context_ex.long_context_sinks,
        dict(sink_heads=4, heads=27, one_vs_four=spread, kjv_heads=0, kjv_rescue=spread, budget=64),
        dict(
            sink_heads="int0",
            heads="int",
            one_vs_four="record",
            kjv_heads="int0",
            kjv_rescue="record",
            budget="int",
        ),
    )
    add(
        "show.readings.exercises.paged_kernel.paged_kernel_splits",
        paged_kernel_ex.paged_kernel_splits,
        dict(grid=split_grid(1, 8, 4096, 132), tile_tokens=64, min_tiles=4, programs_per_sm=2),
        dict(grid="record", tile_tokens="int", min_tiles="int", programs_per_sm="int"),
    )
    add(
        "show.readings.exercises.paged_kernel.paged_kernel_empty_split",
        paged_kernel_ex.paged_kernel_empty_split,
        dict(
            masked_difference=0.0,
            lse_difference=0.0,
            nan_rows=24,
            rows=24,
            stage_one_largest=0.0,
            empty_splits=17,
        ),
        dict(
            masked_difference="real0",
            lse_difference="real0",
            nan_rows="int0",
            rows="int",
            stage_one_largest="real0",
            empty_splits="int",
        ),
        allow=dict.fromkeys(("masked_difference", "lse_difference", "stage_one_largest"), {"nan"}),
    )  # NaN is what this exercise looks for
    add(
        "show.readings.gemv.latency_throughput_reading",
        gemv.latency_throughput_reading,
        dict(rows=floor),
        dict(rows="ints"),
    )
    add(
        "show.readings.long_context.channel_reading",
        long_context.channel_reading,
        dict(
            key_ratio_by_layer=[9.0, 12.0],
            value_ratio_by_layer=[2.0, 3.0],
            key_ratios=[1.0, 9.0, 12.0],
            value_ratios=[1.0, 2.0, 3.0],
        ),
        dict.fromkeys(
            ("key_ratio_by_layer", "value_ratio_by_layer", "key_ratios", "value_ratios"), "reals"
        ),
    )
    add(
        "show.readings.paged_attention.preemption_reading",
        paged_attention.preemption_reading,
        dict(cost=cost, demo_preemptions=3),
        dict(cost="record", demo_preemptions="int0"),
    )
    add(
        "show.readings.paged_kernel.padding_reading",
        paged_kernel.padding_reading,
        dict(rows={1: 16, 4: 16, 32: 32}),
        dict(rows="dict"),
    )
    add(
        "show.readings.paged_kernel.recorded_reading",
        paged_kernel.recorded_reading,
        dict(runs=[], folder="book/data/measurements/"),
        dict(runs="ints", folder="text"),
        allow={"runs": {"empty"}},
    )  # no record: the reading says so
    add(
        "show.readings.preemption.crossover_reading",
        preemption.crossover_reading,
        dict(shapes=None, devices=["h200"]),
        dict(shapes="names?", devices="names?"),
    )
    add(
        "show.readings.preemption.cached_recompute_reading",
        preemption.cached_recompute_reading,
        dict(r=recompute, num_requests=3, num_blocks=8),
        dict(r="record", num_requests="int", num_blocks="int"),
    )
    add(
        "show.readings.prefix_caching.identity_reading",
        prefix_caching.identity_reading,
        dict(rows=[("same", 40, None, 32), ("edit", 40, 20, 16)], block_size=16),
        dict(rows="ints", block_size="int"),
    )
    return E


def _as_model(value):
    """The model a ``static_model`` class names: a Mamba, a model on the meta device."""
    if value == "mamba":
        return kvlab.tiny_model("mamba", layers=1, hidden=32, vocab=VOCAB)
    if value == "meta":
        return kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, vocab=VOCAB).to("meta")
    return value


def _static_cache(m):
    from kvlab.decode import new_static_cache
    from kvlab.versions import cache_kwargs

    cache = new_static_cache(m, 8)
    with torch.inference_mode():
        m(ids(), use_cache=True, **cache_kwargs(m, cache))
    return cache


# --------------------------------------------------------------------------- the scenarios

# Each scenario sets up a state, makes one call that must fail, and returns (call, argument,
# observed objects): the call is counted like any other, with ``argument`` the name its message must
# carry.


def _scenarios():
    from kvlab.lab import engine as lab_engine
    from kvlab.lab.engine import timeline
    from kvlab.serving import paged_decode
    from kvlab.serving.engine import Engine
    from kvlab.serving.request import Event
    from kvlab.theory.verdict import decide
    from kvlab.versions import drop_newest

    def layers_mismatch():
        c = paged_cache()
        return (
            lambda: paged_decode.prefill(model(3), c, 1, [1, 2, 3, 4, 9, 5], attention="gather"),
            "cache",
            [c],
        )

    def odd_block_kernel():
        c = paged_cache(block_size=3)
        return (
            lambda: paged_decode.prefill(model(), c, 1, [1, 2, 3, 4, 9, 5], attention="kernel"),
            "block_size",
            [c],
        )

    def generate_longer_than_pool():
        c = paged_cache(blocks=5)
        return (
            lambda: paged_decode.generate(
                model(), c, [1, 2, 3, 4, 5, 6, 11], 12, attention="gather"
            ),
            "max_new_tokens",
            [c],
        )

    def decode_after_reserve():
        c = paged_cache()
        c.reserve(1, 1)
        return (
            lambda: paged_decode.decode_step(
                model(), c, [1], [[1, 2, 3, 4, 9, 8]], attention="gather"
            ),
            "prefill",
            [c],
        )

    def engine_dtype_changed():
        m = kvlab.tiny_model(
            "llama",
            layers=2,
            hidden=64,
            q_heads=4,
            kv_heads=2,
            vocab=VOCAB,
            intermediate=128,
            device="cpu",
            dtype=torch.float32,
            seed=3,
        )
        e = Engine(m, num_blocks=16, block_size=4, max_batch=4, attention="gather")
        e.add_request([1, 2, 3], 2)
        m.to(torch.float64)
        return (e.step, "dtype", [e])

    def engine_block_freed_behind():
        e = engine()
        e.cache.free(e.scheduler.running[0].seq)
        return (e.step, "sequence", [e], RuntimeError)

    def engine_conflicting_budget():
        return (
            lambda: Engine(model(), num_blocks=8, kv_budget_bytes=10, attention="gather"),
            "kv_budget_bytes",
            [],
        )

    def metrics_duplicates():
        e = engine()
        while e.has_work():
            e.step()
        r = e.requests[0]
        return (lambda: e.metrics([r, r]), "requests", [e])

    def metrics_other_engine():
        e, other = engine(), engine()
        return (lambda: e.metrics([other.requests[0]]), "requests", [e])

    def two_prompts_one_count():
        return (
            lambda: lab_engine.static_generate(model(), [[1, 2], [3, 4]], [2], 2),
            "max_new_tokens",
            [],
        )

    def admitted_none():
        return (
            lambda: decide(
                busy_fraction=0.9,
                bandwidth_fraction=0.3,
                flops_fraction=0.1,
                kv_share=0.2,
                admitted=None,
            ),
            "admitted",
            [],
        )

    def drop_more_than_held():
        cache = _static_cache(model())
        return (lambda: drop_newest(cache, 99), "tokens", [])

    def timeline_negative():
        return (lambda: timeline([Event(0, 0, "arrive")], -1), "num_steps", [])

    def copy_negative_block():
        c = paged_cache()
        return (lambda: paged_decode_copy(c, [-1]), "blocks", [c])

    def paged_decode_copy(c, blocks):
        from kvlab.cache.paged import copy_blocks_to_host

        return copy_blocks_to_host(c.k_pools, c.v_pools, blocks)

    return [
        layers_mismatch,
        odd_block_kernel,
        generate_longer_than_pool,
        decode_after_reserve,
        engine_dtype_changed,
        engine_block_freed_behind,
        engine_conflicting_budget,
        metrics_duplicates,
        metrics_other_engine,
        two_prompts_one_count,
        admitted_none,
        drop_more_than_held,
        timeline_negative,
        copy_negative_block,
    ]


def _observe(obj):
    from kvlab.cache.paged import PagedKVCache

    return cache_state(obj) if isinstance(obj, PagedKVCache) else engine_state(obj)


def run_scenarios(counts, details, show):
    for scenario in _scenarios():
        call, argument, objects, *expected = scenario()
        before = [_observe(o) for o in objects]
        entry = Entry(scenario.__name__, lambda: call(), {})
        error, timed_out, _, altered = call_once(entry, {})
        changed = error is not None and not all(
            same(b, _observe(o)) for b, o in zip(before, objects)
        )
        outcome = classify(error, argument, timed_out)
        if expected and isinstance(error, expected[0]) and argument in str(error):
            outcome = "clear"  # the kind of error this misuse should raise
        counts["scenario " + outcome] += 1
        counts["scenario changed"] += changed
        if outcome in show or changed:
            message = (
                "timeout"
                if timed_out
                else (f"{type(error).__name__}: {error}"[:200] if error else "returned")
            )
            details.append(
                dict(
                    name="scenario " + scenario.__name__,
                    argument=argument,
                    cls="scenario",
                    outcome=outcome,
                    changed=changed,
                    altered=altered,
                    message=message,
                )
            )


# --------------------------------------------------------------------------- running and counting


class TimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise TimeLimit()


UNCLEAR = re.compile(
    r"'NoneType' object|object is not iterable|index out of range|not supported between instances|"
    r"object is not callable|not compiled with CUDA|has no attribute|unhashable|"
    r"object cannot be interpreted|takes \d+ positional|got an unexpected keyword|"
    r"must be real number, not|can't multiply sequence|unsupported operand"
)


def classify(error: BaseException | None, argument: str, timed_out: bool) -> str:
    if (
        timed_out or error is None or "TimeLimit" in repr(error)
    ):  # a compile that ran into the limit accepted it
        return "silent"
    message = str(error)
    named = argument.split("[")[0] in message
    sized = (
        isinstance(error, MemoryError) and "bytes" in message and "free" in message
    )  # needed and free
    if (
        isinstance(error, (ValueError, TypeError, MemoryError))
        and (named or sized)
        and not UNCLEAR.search(message)
    ):
        return "clear"
    return "unclear"


def call_once(entry: Entry, kwargs: dict):
    """``(error, timed_out, changed, altered)`` for one call."""
    obj = entry.setup() if entry.setup else None
    before = entry.observe(obj) if entry.observe else None
    m_before = {id(m): model_state(m) for m in _models()}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    error, timed_out = None, False
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            entry.call(obj, **kwargs) if entry.setup else entry.call(**kwargs)
    except TimeLimit:
        timed_out = True
    except BaseException as e:  # noqa: BLE001 - counting every kind of failure is the point
        if isinstance(e, KeyboardInterrupt):
            raise
        error = e
    finally:
        signal.alarm(0)
    changed = (
        error is not None and entry.observe is not None and not same(before, entry.observe(obj))
    )
    altered = False
    for m in _models():
        if id(m) in m_before and model_state(m) != m_before[id(m)]:
            altered = True
            reset_model(m, m_before[id(m)])
    return error, timed_out, changed, altered


def _models():
    return [model(), model(3)]


def run(only: str | None, show: set[str]) -> dict:
    counts, by_class, details = Counter(), defaultdict(Counter), []
    baseline_failures = []
    for entry in entries():
        if only and only not in entry.name:
            continue
        error, timed_out, _, altered = call_once(entry, dict(entry.args))
        if error is not None or timed_out:
            baseline_failures.append((entry.name, "timeout" if timed_out else repr(error)))
            continue
        for argument, valid in entry.args.items():
            if argument in entry.skip:
                continue
            kind = entry.kinds.get(argument) or infer_kind(valid)
            for cls, bad in bad_values(kind):
                if cls in entry.allow.get(argument, ()):
                    continue
                kwargs = dict(entry.args, **{argument: bad})
                error, timed_out, changed, altered = call_once(entry, kwargs)
                outcome = classify(error, argument, timed_out)
                counts[outcome] += 1
                counts["calls"] += 1
                counts["changed"] += changed
                counts["altered"] += altered
                by_class[cls][outcome] += 1
                if outcome in show or changed or altered:
                    message = (
                        "timeout"
                        if timed_out
                        else (f"{type(error).__name__}: {error}"[:200] if error else "returned")
                    )
                    details.append(
                        dict(
                            name=entry.name,
                            argument=argument,
                            cls=cls,
                            outcome=outcome,
                            changed=changed,
                            altered=altered,
                            message=message,
                        )
                    )
    if not only or only == "scenario":
        run_scenarios(counts, details, show)
    return dict(
        counts=dict(counts),
        by_class={k: dict(v) for k, v in by_class.items()},
        details=details,
        baseline_failures=baseline_failures,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the full result here")
    parser.add_argument("--only", help="only names containing this")
    parser.add_argument(
        "--show", default="unclear,silent", help="outcomes to list (comma-separated)"
    )
    args = parser.parse_args()
    start = time.time()
    result = run(args.only, set(args.show.split(",")) if args.show else set())
    for d in result["details"]:
        flags = (" CHANGED" if d["changed"] else "") + (" ALTERED" if d["altered"] else "")
        print(f"{d['outcome']:>8}{flags} {d['name']}({d['argument']}={d['cls']}): {d['message']}")
    for name, why in result["baseline_failures"]:
        print(f"BASELINE FAILED {name}: {why}")
    c = result["counts"]
    print(
        f"\n{c.get('calls', 0)} calls in {time.time() - start:.0f} s: {c.get('clear', 0)} clear,"
        f" {c.get('unclear', 0)} unclear, {c.get('silent', 0)} silent; {c.get('changed', 0)} failed"
        f" calls changed state, {c.get('altered', 0)} left a model altered;"
        f" {len(result['baseline_failures'])} baselines failed"
    )
    print(
        f"scenarios: {c.get('scenario clear', 0)} clear, {c.get('scenario unclear', 0)} unclear, "
        f"{c.get('scenario silent', 0)} silent, {c.get('scenario changed', 0)} changed state"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
