"""Notebooks 05, 06 and 11: the model runner, one forward pass per step over a paged KV cache.

:class:`ModelRunner` is the part of a serving engine that touches the model (as in nano-vllm,
Yu 2025): given a step's chunks it builds the step's metadata once
(:func:`kvlab.serving.attention.build_step`), runs the Hugging Face model once over every scheduled
token, and picks each chunk's next token greedily. It never changes the cache's bookkeeping: the
caller reserved the slots before and commits them after.

On a GPU, :class:`CudaGraphs` captures decode-only steps once per batch size and replays them
(PyTorch CUDA Graphs documentation), which takes the per-step launch work of a small model off
the critical path. It is written for CUDA; kvlab's CPU path never builds it.
"""

from __future__ import annotations

import warnings
from itertools import accumulate

import torch

from kvlab import kernels
from kvlab._checks import causal_lm, flag, integer, one_of, token_ids
from kvlab.cache.paged import PagedKVCache
from kvlab.serving.attention import ATTENTION_PATHS, StepMetadata, build_step, paged_forward
from kvlab.serving.request import Chunk


def query_group(model) -> int:
    """Query heads per KV head of a Hugging Face decoder (its grouped-query attention group)."""
    return model.config.num_attention_heads // model.config.num_key_value_heads


def model_geometry(model) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a Hugging Face decoder, as its KV cache must be shaped."""
    config = causal_lm("model", model).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


def check_cache_fits(model, cache, attention: str) -> None:
    """Everything a step needs from ``model`` and ``cache`` together, checked before any layer
    writes."""
    one_of("attention", attention, ATTENTION_PATHS)
    causal_lm("model", model)
    if not isinstance(cache, PagedKVCache):
        raise TypeError(
            f"cache must be a kvlab.cache.paged.PagedKVCache, got {type(cache).__name__}"
        )
    layers, kv_heads, head_dim = model_geometry(model)
    for name, expected in (
        ("num_layers", layers),
        ("num_kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype", model.dtype),
    ):
        if getattr(cache, name) != expected:
            raise ValueError(
                f"cache.{name} is {getattr(cache, name)} but the model needs {expected}; "
                "build the cache with kvlab.serving.paged_decode.cache_for(model, ...)"
            )
    check_kernel_limits(cache.block_size, head_dim, attention)
    model_device = torch.device(model.device)
    if (cache.device.type, cache.device.index or 0) != (model_device.type, model_device.index or 0):
        raise ValueError(
            f"cache.device is {cache.device} but the model is on {model_device}; "
            "build the cache with kvlab.serving.paged_decode.cache_for(model, ...)"
        )


def check_kernel_limits(block_size: int, head_dim: int, attention: str) -> None:
    """The Triton kernel's limits, for the paths that use it (the reference checks as the kernel
    does)."""
    one_of("attention", attention, ATTENTION_PATHS)
    block_size, head_dim = integer("block_size", block_size), integer("head_dim", head_dim)
    if attention == "gather":
        return
    if block_size & (block_size - 1):
        raise ValueError(
            f"block_size must be a power of two for attention={attention!r}, got {block_size}; "
            "use attention='gather' for other sizes"
        )
    if head_dim not in kernels.SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"the model's head_dim {head_dim} must be one of {kernels.SUPPORTED_HEAD_DIMS} "
            f"for attention={attention!r}; use attention='gather'"
        )


class ModelRunner:
    """One forward pass per step of ``model`` over ``cache``, greedy sampling (notebooks 05, 06,
    11).

    ``attention`` picks the path of :mod:`kvlab.serving.attention`; ``cuda_graphs`` (on a GPU, with
    the kernel path) replays decode-only steps of up to ``max_batch`` sequences as CUDA graphs.
    """

    def __init__(
        self, model, cache, attention: str = "kernel", cuda_graphs: bool = False, max_batch: int = 1
    ):
        check_cache_fits(model, cache, attention)
        flag("cuda_graphs", cuda_graphs)
        max_batch = integer("max_batch", max_batch)
        self.model, self.cache, self.attention = model, cache, attention
        self.group = query_group(model)
        if (
            attention == "kernel"
        ):  # the prefill kernel's program must fit this GPU's shared memory (a no-op on a CPU)
            config = kernels.configs.paged_prefill_config(
                kernels.paged_prefill.paged_prefill_kernel,
                cache.dtype,
                self.group,
                cache.head_dim,
                cache.block_size,
            )
            kernels.shared_memory.require_fits(config, cache.device)
        self.graphs = None
        if cuda_graphs and cache.device.type == "cuda" and attention == "kernel":
            try:
                self.graphs = CudaGraphs(self, max_batch)
            except (
                RuntimeError
            ) as error:  # a model whose forward cannot be captured still runs, eagerly
                warnings.warn(
                    f"CUDA-graph capture failed, decoding eagerly: {error}",
                    RuntimeWarning,
                    stacklevel=2,
                )

    @torch.inference_mode()
    def run(self, chunks) -> list[int]:
        """Feed each :class:`~kvlab.serving.request.Chunk` ``(seq_id, start, token_ids)`` at its
        positions; returns the greedy token after each chunk's last one (the next token when the
        chunk ends its sequence's tokens)."""
        chunks = [Chunk(*c) for c in chunks]
        if self.graphs is not None and self.graphs.covers(chunks):
            return self.graphs.run(chunks)
        meta = build_step(self.cache, chunks, self.attention, self.group)
        ids = [t for c in chunks for t in c.token_ids]
        positions = [p for c in chunks for p in range(c.start, c.start + len(c.token_ids))]
        # The embedding would fail on an id past the vocabulary (on a GPU, with a device assert).
        token_ids("the step's token ids", ids, self.model.config.vocab_size)
        dev = self.cache.device
        last = torch.tensor(list(accumulate(len(c.token_ids) for c in chunks)), device=dev) - 1
        ids, positions = torch.tensor([ids], device=dev), torch.tensor([positions], device=dev)
        logits = paged_forward(self.model, ids, positions, meta, last)
        return logits[0].argmax(dim=-1).tolist()


class CudaGraphs:
    """Decode-only steps captured as CUDA graphs, one per batch size, and replayed (notebook 11, GPU
    only).

    A step with ``B`` decoding sequences replays the graph of the smallest captured size ``>= B``;
    the spare rows feed token 0 at position 0 with slot -1 (the store skips it) and read block 0,
    and their outputs are dropped. The block tables are as wide as the longest sequence the pool or
    the model allows, so one graph serves every context length, with a split-K count fixed for that
    width.
    """

    def __init__(self, runner: ModelRunner, max_batch: int):
        self.runner, cache = runner, runner.cache
        dev = cache.device
        positions = (
            getattr(runner.model.config, "max_position_embeddings", None)
            or cache.num_blocks * cache.block_size
        )
        self.width = min(cache.num_blocks, -(-positions // cache.block_size))
        self.sizes = sorted(
            {b for b in (1, 2, 4, 8, *range(16, max_batch + 1, 16), max_batch) if b <= max_batch}
        )
        top = self.sizes[-1]
        self.ids = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.positions = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros((top, self.width), dtype=torch.int32, device=dev)
        self.lens = torch.ones(top, dtype=torch.int32, device=dev)
        self.graphs, self.logits = {}, {}
        self.capture()

    def covers(self, chunks) -> bool:
        """A captured graph can run this step: decode only, and every table fits the buffers."""
        return (
            len(chunks) <= self.sizes[-1]
            and all(len(c.token_ids) == 1 for c in chunks)
            and all(len(self.runner.cache.block_table(c.seq_id)) <= self.width for c in chunks)
        )

    def _meta(self, batch: int) -> StepMetadata:
        cache = self.runner.cache
        splits = kernels.choose_num_splits(
            batch,
            cache.num_kv_heads,
            self.width * cache.block_size,
            kernels.multiprocessor_count(cache.device),
        )
        return StepMetadata(
            cache.k_pools,
            cache.v_pools,
            "kernel",
            self.slots[:batch],
            batch,
            self.tables[:batch],
            self.lens[:batch],
            self.runner.group,
            num_splits=splits,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for batch in reversed(
            self.sizes
        ):  # the largest first, so that the smaller ones reuse its memory
            args = (
                self.runner.model,
                self.ids[:, :batch],
                self.positions[:, :batch],
                self._meta(batch),
                0,
            )
            paged_forward(*args)  # warm-up outside the graph (compiles the kernels)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = paged_forward(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[batch] = graph

    def run(self, chunks) -> list[int]:
        cache, bs = self.runner.cache, self.runner.cache.block_size
        n = len(chunks)
        batch = next(b for b in self.sizes if b >= n)
        starts = [c.start for c in chunks]
        tables = [cache.block_table(c.seq_id) for c in chunks]
        ids = [c.token_ids[0] for c in chunks] + [0] * (batch - n)
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, starts)] + [-1] * (batch - n)
        rows = [t + [0] * (self.width - len(t)) for t in tables] + [[0] * self.width] * (batch - n)
        self.ids[0, :batch].copy_(torch.tensor(ids), non_blocking=True)
        self.positions[0, :batch].copy_(torch.tensor(starts + [0] * (batch - n)), non_blocking=True)
        self.slots[:batch].copy_(torch.tensor(slots), non_blocking=True)
        self.tables[:batch].copy_(torch.tensor(rows, dtype=torch.int32), non_blocking=True)
        self.lens[:batch].copy_(
            torch.tensor([p + 1 for p in starts] + [1] * (batch - n), dtype=torch.int32),
            non_blocking=True,
        )
        self.graphs[batch].replay()
        return self.logits[batch][0, :n].argmax(dim=-1).tolist()
