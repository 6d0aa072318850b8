"""Notebook 09, a worked path through a slow decode step (section 9.8): one decode step, repeatable.

To time and trace a decode step, notebook 09 needs the same step again and again, from the same
cache state. ``RepeatableStep`` holds a model with ``context`` cached tokens per sequence and one
step of a loop on it, then puts the cache back: ``naive`` (the whole sequence again, no cache),
``cached`` (the model's own DynamicCache, grown by one position and cropped back), ``static``
(``kvlab.decode``'s static step on a StaticCache of context + 1 slots) and ``paged`` (notebook 05's
paged cache, decoding forks of the prefilled sequences). ``step_time`` and ``prefill_time`` are the
times step 4 of the path needs (TPOT and TTFT). ``CPU_THREADS`` is the thread count every
measurement of the path runs on, on a CPU (``measurement_threads``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import torch

from kvlab._checks import causal_lm, instance, integer, restoring
from kvlab._checks import device as check_device
from kvlab.decode import StaticStep, new_static_cache
from kvlab.theory.shapes import ModelShape
from kvlab.theory.work import check_method
from kvlab.versions import cache_kwargs, drop_newest, returned_cache

# On a CPU, every measurement of the path runs on this many of torch's threads (set, then restored:
# kvlab.lab.hardware.cpu_threads), the count `make` gives every process (OMP_NUM_THREADS=1). A
# verdict that compares times (the useful batch, the faster loop) then does not depend on who
# started the process: on the loaded 2-core machine, two threads made batch 1 look best and one
# thread batch 4 (issue 26).
CPU_THREADS = 1


def measurement_threads(model, threads: int | None = CPU_THREADS) -> int | None:
    """The thread count to measure ``model`` with: ``threads`` on a CPU, None (the caller's,
    unchanged) for a model on a GPU, whose kernels do not run on torch's CPU threads."""
    if threads is not None:
        integer("threads", threads, 1)
    device = getattr(model, "device", None)
    return None if getattr(device, "type", "cpu") == "cuda" else threads


def check_ids(input_ids):
    """``input_ids`` if it is an integer tensor ``[batch >= 1, prompt_length >= 1]``."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}"
        )
    if (
        input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or input_ids.dtype == torch.bool
    ):
        raise TypeError(
            f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}"
        )
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(
            "input_ids must have shape [batch >= 1, prompt_length >= 1], got"
            f" {list(input_ids.shape)}"
        )
    return input_ids


def model_shape_of(model):
    """``model.shape`` (kvlab's models carry one), else the ``ModelShape`` of its config."""
    causal_lm("model", model)
    shape = getattr(model, "shape", None)
    return shape if isinstance(shape, ModelShape) else ModelShape.from_config(model.config)


def element_bytes(model) -> int:
    """Bytes per parameter of ``model`` (its first parameter's)."""
    instance("model", model, torch.nn.Module)
    return next(model.parameters()).element_size()


def prepared_ids(model, input_ids, context, method):
    """``(shape, ids)``: the model's shape and ``input_ids`` (checked) repeated to ``context``
    tokens per sequence (default: the prompt's length) on the model's device; refuses a context the
    model has no positions for."""
    shape = model_shape_of(model)
    check_method(method)
    input_ids = check_ids(input_ids)
    vocab = model.config.vocab_size
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab)].flatten()[:3].tolist()
        raise ValueError(
            f"input_ids must be token ids in [0, {vocab}) (the model's vocab_size), got {bad}"
        )
    context = input_ids.shape[1] if context is None else integer("context", context, 1)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and context + 1 > limit:
        raise ValueError(
            f"context must be <= {limit - 1} for this model (max_position_embeddings {limit}), "
            f"got {context}"
        )
    return shape, tile_prompt(input_ids.to(model.device), context)


def tile_prompt(input_ids, context: int):
    """``context`` tokens per sequence: the prompt, repeated as often as needed (timing does not
    depend on which tokens they are)."""
    input_ids, context = check_ids(input_ids), integer("context", context)
    reps = -(-context // input_ids.shape[1])
    return input_ids.repeat(1, reps)[:, :context]


def sync(device) -> None:
    """Wait for the device: a step is timed only once its kernels have finished."""
    device = check_device("device", device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RepeatableStep:
    """A model holding ``context`` cached tokens per sequence (``ids [batch, context]``), and one
    decode step of ``method`` on it that can be run again and again: ``reset()`` puts the cache back
    as it was before the step. ``close()`` gives the model back as it was (the paged method switches
    its attention). Each method builds its cache with the public mechanism of its notebook."""

    def __init__(self, model, ids, method: str, compile: bool | None = None):
        method = check_method(method)
        self.model, self.method, self.ids = model, method, ids
        self.batch, self.context = ids.shape
        self.device = ids.device
        self.token = ids[:, -1:].clone()
        self._borrowed = (
            contextlib.ExitStack()
        )  # the paged method switches the model's attention until close()
        try:
            with torch.inference_mode():
                getattr(self, f"_setup_{method}")(compile)
        except BaseException:
            self.close()  # a failed set-up leaves the model as it found it
            raise

    # -- naive: the whole sequence again, no cache
    def _setup_naive(self, compile):
        self.full = torch.cat([self.ids, self.token], dim=1)

    def _step_naive(self):
        return self.model(self.full, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1)

    def _reset_naive(self):
        pass

    # -- cached: the model's own DynamicCache, grown by one position and cropped back
    def _setup_cached(self, compile):
        out = self.model(self.ids, use_cache=True, logits_to_keep=1)
        self.kw = cache_kwargs(self.model, returned_cache(out))
        self.mask = torch.ones((self.batch, self.context + 1), dtype=torch.long, device=self.device)
        self.position = torch.full(
            (self.batch, 1), self.context, dtype=torch.long, device=self.device
        )

    def _step_cached(self):
        out = self.model(
            self.token,
            attention_mask=self.mask,
            position_ids=self.position,
            use_cache=True,
            **self.kw,
        )
        return out.logits[:, -1].argmax(-1)

    def _reset_cached(self):
        next(iter(self.kw.values())).crop(-1)

    # -- static: transformers' StaticCache of context + 1 slots; the step writes the last one
    def _setup_static(self, compile):
        cache = new_static_cache(self.model, self.context + 1)
        self.mask = torch.ones((self.batch, self.context + 1), dtype=torch.long, device=self.device)
        prefill_mask = self.mask.clone()
        prefill_mask[:, -1] = 0
        self.model(
            self.ids,
            attention_mask=prefill_mask,
            use_cache=True,
            logits_to_keep=1,
            **cache_kwargs(self.model, cache),
        )
        self.cache = cache
        self.position = torch.full(
            (self.batch, 1), self.context, dtype=torch.long, device=self.device
        )
        self.static = StaticStep(
            self.model,
            cache_kwargs(self.model, cache),
            self.device.type == "cuda" if compile is None else compile,
        )

    def _step_static(self):
        return self.static.step(self.token, self.position, self.mask)

    def _reset_static(self):
        drop_newest(self.cache, 1)

    # -- paged: kvlab's paged cache; each step decodes forks of the prefilled sequences
    def _setup_paged(self, compile):
        from kvlab.kernels import store_kv_ref
        from kvlab.serving.attention import register
        from kvlab.serving.paged_decode import cache_for, prefill

        self._borrowed.enter_context(restoring(self.model, attn_implementation=register()))
        gpu = self.device.type == "cuda"
        # A block size that divides the context: a fork's first append then opens a fresh block
        # instead of copying a shared one, so the step is an ordinary decode step.
        self.block_size = math.gcd(self.context, 16)
        blocks = self.batch * (self.context // self.block_size + 1)
        self.attention = "kernel" if gpu else "gather"
        # Without a GPU the Triton store runs in its interpreter: store with the PyTorch reference.
        self.cache = cache_for(
            self.model, blocks, self.block_size, store=None if gpu else store_kv_ref
        )
        self.seqs = [self.cache.new_sequence() for _ in range(self.batch)]
        for seq, row in zip(self.seqs, self.ids.tolist()):
            prefill(self.model, self.cache, seq, row, self.attention)
        self.forks = [self.cache.fork(s) for s in self.seqs]
        self.tokens = [row + [t] for row, t in zip(self.ids.tolist(), self.token[:, 0].tolist())]

    def _step_paged(self):
        from kvlab.serving.paged_decode import decode_step

        return decode_step(self.model, self.cache, self.forks, self.tokens, self.attention)

    def _reset_paged(self):
        for f in self.forks:
            self.cache.free(f)
        self.forks = [self.cache.fork(s) for s in self.seqs]

    # -- the public face
    def step(self):
        with torch.inference_mode():
            return getattr(self, f"_step_{self.method}")()

    def reset(self):
        with torch.inference_mode():
            getattr(self, f"_reset_{self.method}")()

    def time(self, warmup: int = 2, reps: int = 5, min_total_s: float = 0.05) -> list[float]:
        """Seconds of at least ``reps`` steps, each from the same cache state, after ``warmup``
        untimed ones. Short steps repeat (up to 10 * reps) until ``min_total_s`` is timed, so that
        the median of a millisecond step is not one unlucky time slice on a shared machine."""
        for _ in range(warmup):
            self.step()
            self.reset()
        times = []
        while len(times) < reps or (sum(times) < min_total_s and len(times) < 10 * reps):
            sync(self.device)
            start = time.perf_counter()
            self.step()
            sync(self.device)
            times.append(time.perf_counter() - start)
            self.reset()
        return times

    def close(self):
        self._borrowed.close()


def step_time(model, ids, method, warmup=1, reps=3, compile=None) -> float:
    """Median seconds of one ``method`` decode step after ``ids [batch, context]``
    (``RepeatableStep``)."""
    warmup, reps = integer("warmup", warmup, 0), integer("reps", reps)
    stepper = RepeatableStep(model, ids, method, compile)
    try:
        return statistics.median(stepper.time(warmup, reps))
    finally:
        stepper.close()


def prefill_time(model, ids, reps=2) -> float:
    """Time to first token: the prompt's forward pass with a cache, and the greedy pick."""
    reps = integer("reps", reps)
    times = []
    for _ in range(
        reps
    ):  # the fastest of ``reps``: a prefill is long enough to need no warm-up call
        sync(ids.device)
        start = time.perf_counter()
        with torch.inference_mode():
            model(ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)
        sync(ids.device)
        times.append(time.perf_counter() - start)
    return min(times)
