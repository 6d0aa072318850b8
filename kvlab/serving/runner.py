"""Notebooks 05, 06 and 11: the model runner, one forward pass per step over a paged KV cache.

:class:`ModelRunner` is the part of a serving engine that touches the model (as in nano-vllm,
Yu 2025): given a step's chunks, whose slots the caller reserved and committed, it builds the
step's metadata once (:func:`kvlab.serving.attention.build_step`), runs the Hugging Face model once
over every token, and picks each chunk's next token greedily. On a GPU, :class:`CudaGraphs`
replays decode-only steps captured once per batch size (PyTorch CUDA Graphs documentation), which
takes the per-step launch work of a small model off the critical path.
"""

from __future__ import annotations

import warnings
from itertools import accumulate

import torch

from kvlab import kernels
from kvlab._checks import causal_lm, flag, integer, one_of, token_ids
from kvlab.cache.paged import PagedKVCache
from kvlab.kernels.configs import paged_prefill_config
from kvlab.kernels.paged_prefill import paged_prefill_kernel
from kvlab.kernels.shared_memory import require_fits
from kvlab.serving import _checks
from kvlab.serving.attention import ATTENTION_PATHS, StepMetadata, build_step, paged_forward
from kvlab.serving.request import Chunk


def model_geometry(model) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a Hugging Face decoder, as its KV cache must be shaped."""
    config = causal_lm("model", model).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


def cache_for(
    model,
    num_blocks: int,
    block_size: int = 16,
    prefix_caching: bool = False,
    device=None,
    store=None,
) -> PagedKVCache:
    """An empty :class:`PagedKVCache` shaped for ``model`` (its layers, KV heads, head dim and
    dtype); ``store`` replaces the ``store_kv`` kernel of by-hand appends (e.g. ``store_kv_ref`` on
    a CPU)."""
    layers, kv_heads, head_dim = model_geometry(model)
    device = device if device is not None else model.device
    return PagedKVCache(
        layers, num_blocks, block_size, kv_heads, head_dim, dtype=model.dtype, device=device,
        store=store, prefix_caching=prefix_caching,
    )  # fmt: skip


class ModelRunner:
    """One forward pass per step of ``model`` over ``cache``, greedy (notebooks 05, 06, 11), by a
    path of :mod:`kvlab.serving.attention`; ``cuda_graphs`` (a GPU, the kernel path) replays
    decode-only steps of up to ``max_batch`` sequences."""

    def __init__(
        self, model, cache, attention: str = "kernel", cuda_graphs: bool = False, max_batch: int = 1
    ):
        one_of("attention", attention, ATTENTION_PATHS)
        _checks.cache_fits(model, cache, attention, geometry := model_geometry(model))
        flag("cuda_graphs", cuda_graphs)
        max_batch = integer("max_batch", max_batch)
        self.model, self.cache, self.attention, self.geometry = model, cache, attention, geometry
        self.group = model.config.num_attention_heads // model.config.num_key_value_heads
        if attention == "kernel":  # the prefill kernel's program must fit this GPU's shared memory
            config = paged_prefill_config(
                paged_prefill_kernel, cache.dtype, self.group, cache.head_dim, cache.block_size
            )
            require_fits(config, cache.device)  # a no-op on a CPU
        self.graphs = None
        if cuda_graphs and cache.device.type == "cuda" and attention == "kernel":
            try:
                self.graphs = CudaGraphs(self, max_batch)
            except RuntimeError as error:  # a forward that cannot be captured still runs, eagerly
                message = f"CUDA-graph capture failed, decoding eagerly: {error}"
                warnings.warn(message, RuntimeWarning, stacklevel=2)

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
        # The embedding would fail on an id past the vocabulary (on a GPU, with a device assert).
        token_ids("the step's token ids", ids, self.model.config.vocab_size)
        positions = [p for c in chunks for p in range(c.start, c.start + len(c.token_ids))]
        dev = self.cache.device
        last = torch.tensor(list(accumulate(len(c.token_ids) for c in chunks)), device=dev) - 1
        ids, positions = torch.tensor([ids], device=dev), torch.tensor([positions], device=dev)
        logits = paged_forward(self.model, ids, positions, meta, last)
        return logits[0].argmax(dim=-1).tolist()


class CudaGraphs:
    """Decode-only steps captured as CUDA graphs, one per batch size, and replayed (notebook 11).

    ``B`` decoding sequences replay the smallest captured size ``>= B``; spare rows feed token 0 at
    position 0, slot -1 (not stored), block 0, and are dropped. Tables are as wide as the longest
    sequence the pool or the model allows: one graph, with one split-K count, serves every length.
    """

    def __init__(self, runner: ModelRunner, max_batch: int):
        self.runner, cache = runner, runner.cache
        longest = getattr(runner.model.config, "max_position_embeddings", None)
        longest = longest or cache.num_blocks * cache.block_size
        self.width = min(cache.num_blocks, -(-longest // cache.block_size))
        sizes = (1, 2, 4, 8, *range(16, max_batch + 1, 16), max_batch)
        self.sizes = sorted({b for b in sizes if b <= max_batch})
        top, dev = self.sizes[-1], cache.device
        self.ids = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.positions = torch.zeros((1, top), dtype=torch.long, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros((top, self.width), dtype=torch.int32, device=dev)
        self.lens = torch.ones(top, dtype=torch.int32, device=dev)
        self.graphs, self.logits = {}, {}
        self.capture()

    def covers(self, chunks) -> bool:
        """A captured graph can run this step: decode only, and every table fits the buffers."""
        table = self.runner.cache.block_table
        return len(chunks) <= self.sizes[-1] and all(
            len(c.token_ids) == 1 and len(table(c.seq_id)) <= self.width for c in chunks
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
            cache.k_pools, cache.v_pools, "kernel", self.slots[:batch], batch, self.tables[:batch],
            self.lens[:batch], self.runner.group, num_splits=splits,
        )  # fmt: skip

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for batch in reversed(self.sizes):  # the largest first: the smaller ones reuse its memory
            ids, positions = self.ids[:, :batch], self.positions[:, :batch]
            args = (self.runner.model, ids, positions, self._meta(batch), 0)
            paged_forward(*args)  # warm-up outside the graph (compiles the kernels)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = paged_forward(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[batch] = graph

    def run(self, chunks) -> list[int]:
        bs, n = self.runner.cache.block_size, len(chunks)
        batch = next(b for b in self.sizes if b >= n)
        pad = batch - n
        starts = [c.start for c in chunks]
        tables = [self.runner.cache.block_table(c.seq_id) for c in chunks]
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, starts)]
        rows = [t + [0] * (self.width - len(t)) for t in tables] + [[0] * self.width] * pad
        for buffer, values in (
            (self.ids[0, :batch], [c.token_ids[0] for c in chunks] + [0] * pad),
            (self.positions[0, :batch], starts + [0] * pad),
            (self.slots[:batch], slots + [-1] * pad),
            (self.tables[:batch], rows),
            (self.lens[:batch], [p + 1 for p in starts] + [1] * pad),
        ):
            buffer.copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        self.graphs[batch].replay()
        return self.logits[batch][0, :n].argmax(dim=-1).tolist()
