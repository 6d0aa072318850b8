"""Notebooks 05, 06 and 11: the model runner (as in nano-vllm, Yu 2025), one greedy forward pass
per step; on a GPU, :class:`CudaGraphs` replays decode-only steps, captured once per batch size."""

from __future__ import annotations

import warnings
from itertools import accumulate

import torch

from kvlab import kernels
from kvlab._checks import causal_lm
from kvlab.cache.paged import PagedKVCache
from kvlab.serving import _checks
from kvlab.serving.attention import StepMetadata, build_step, paged_forward
from kvlab.serving.request import Chunk


def model_geometry(model) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a Hugging Face decoder, as its KV cache must be shaped."""
    config = causal_lm("model", model).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


def cache_for(
    model, num_blocks: int, block_size: int = 16, prefix_caching: bool = False, device=None,
    store=None,
) -> PagedKVCache:  # fmt: skip
    """An empty :class:`PagedKVCache` shaped for ``model``; ``store`` replaces the ``store_kv``
    kernel of by-hand appends (e.g. ``store_kv_ref`` on a CPU)."""
    layers, kv_heads, head_dim = model_geometry(model)
    return PagedKVCache(
        layers, num_blocks, block_size, kv_heads, head_dim, dtype=model.dtype, store=store,
        device=model.device if device is None else device, prefix_caching=prefix_caching,
    )  # fmt: skip


class ModelRunner:
    """One forward pass per step; ``cuda_graphs`` replays decode steps of up to ``max_batch``."""

    def __init__(
        self, model, cache, attention="kernel", cuda_graphs=False, max_batch=1, checked=False
    ):
        geometry = model_geometry(model)
        if not checked:
            max_batch = _checks.runner(model, cache, attention, cuda_graphs, max_batch, geometry)
        self.model, self.cache, self.attention, self.geometry = model, cache, attention, geometry
        self.group = model.config.num_attention_heads // model.config.num_key_value_heads
        self.graphs = None
        if cuda_graphs and cache.device.type == "cuda" and attention == "kernel":
            try:
                self.graphs = CudaGraphs(self, max_batch)
            except RuntimeError as error:  # a forward that cannot be captured still runs, eagerly
                message = f"CUDA-graph capture failed, decoding eagerly: {error}"
                warnings.warn(message, RuntimeWarning, stacklevel=2)

    @torch.inference_mode()
    def run(self, chunks, checked: bool = False) -> list[int]:
        """Feed each chunk ``(seq_id, start, token_ids[, num_outputs])``; the greedy tokens after
        each chunk's last ``num_outputs`` tokens, in order (one per chunk by default)."""
        if not checked:  # the engine's scheduler made its chunks; a caller's are checked here
            _checks.step_chunks(self.cache, chunks, self.model.config.vocab_size)
        chunks = [Chunk(*c) for c in chunks]
        if self.graphs is not None and self.graphs.covers(chunks):
            return self.graphs.run(chunks)
        meta = build_step(self.cache, chunks, self.attention, self.group, checked=True)
        ids = [t for c in chunks for t in c.token_ids]
        positions = [p for c in chunks for p in range(c.start, c.start + len(c.token_ids))]
        dev = self.cache.device
        ends = accumulate(len(c.token_ids) for c in chunks)
        kept = [p for c, end in zip(chunks, ends) for p in range(end - c.num_outputs, end)]
        last = torch.tensor(kept, device=dev)
        ids, positions = torch.tensor([ids], device=dev), torch.tensor([positions], device=dev)
        logits = paged_forward(self.model, ids, positions, meta, last)
        return logits[0].argmax(dim=-1).tolist()


class CudaGraphs:
    """``B`` decoding sequences replay the smallest captured size ``>= B``; spare rows feed token 0
    at position 0, slot -1 (not stored), block 0, and are dropped. Tables are as wide as the longest
    sequence allowed: one graph, with one split-K count, serves every length."""

    def __init__(self, runner: ModelRunner, max_batch: int):
        self.runner, cache, dev = runner, runner.cache, runner.cache.device
        longest = getattr(runner.model.config, "max_position_embeddings", None)
        longest = longest or cache.num_blocks * cache.block_size
        self.width = min(cache.num_blocks, -(-longest // cache.block_size))
        sizes = (1, 2, 4, 8, *range(16, max_batch + 1, 16), max_batch)
        self.sizes = sorted({b for b in sizes if b <= max_batch})
        top, long, i32 = self.sizes[-1], torch.long, torch.int32
        self.ids, self.positions = torch.zeros((2, 1, top), dtype=long, device=dev)  # two views
        self.slots = torch.full((top,), -1, dtype=long, device=dev)
        self.tables = torch.zeros((top, self.width), dtype=i32, device=dev)
        self.lens = torch.ones(top, dtype=i32, device=dev)
        self.graphs, self.logits = {}, {}
        self.capture()

    def covers(self, chunks) -> bool:
        """Decode only, and every table fits the buffers."""
        table = self.runner.cache.block_table
        return len(chunks) <= self.sizes[-1] and all(
            len(c.token_ids) == 1 and len(table(c.seq_id)) <= self.width for c in chunks
        )

    @torch.inference_mode()
    def capture(self) -> None:
        cache, pool = self.runner.cache, None
        longest, sms = self.width * cache.block_size, kernels.multiprocessor_count(cache.device)
        for batch in reversed(self.sizes):  # the largest first: the smaller ones reuse its memory
            meta = StepMetadata(
                cache.k_pools, cache.v_pools, "kernel", self.slots[:batch], batch,
                self.tables[:batch], self.lens[:batch], self.runner.group,
                num_splits=kernels.choose_num_splits(batch, cache.num_kv_heads, longest, sms),
            )  # fmt: skip
            args = (self.runner.model, self.ids[:, :batch], self.positions[:, :batch], meta, 0)
            paged_forward(*args)  # warm-up outside the graph (compiles the kernels)
            torch.cuda.synchronize()
            self.graphs[batch] = graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = paged_forward(*args)
            pool = graph.pool() if pool is None else pool

    def run(self, chunks) -> list[int]:
        bs, n, table = self.runner.cache.block_size, len(chunks), self.runner.cache.block_table
        batch = next(b for b in self.sizes if b >= n)
        pad, starts = batch - n, [c.start for c in chunks]
        tables = [table(c.seq_id) for c in chunks]
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
