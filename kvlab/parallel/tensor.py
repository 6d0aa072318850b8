"""Tensor-parallel decode with transformers' own tensor parallelism (notebook 12, "Decode across
devices"; Shoeybi et al. 2019).

kvlab writes none of the split. A Llama, Qwen2 or Mistral config carries a tensor-parallel plan
(``base_model_tp_plan``): the query, key and value projections and the MLP's gate and up projections
are split by output columns, the attention output and the MLP's down projection by input rows. Each
rank therefore computes n_q / p query heads against its own n_kv / p KV heads (and caches only
those), and the row-split projections leave partial sums that one all-reduce per projection adds:
two per layer. ``from_pretrained`` applies the plan as it loads a checkpoint, so the parent writes
kvlab's random-weight model to a temporary checkpoint and every rank loads its share of it. Which
transformers releases do what (both checked on the CPU with gloo at world size 2):

- 5.5 (the floor): ``from_pretrained(path, tp_plan="auto")``; weights become plain tensors holding
  the rank's share; embedding and head are kept whole on every rank.
- 5.24: ``from_pretrained(path, distributed_config=DistributedConfig(tp_size=p))``; weights become
  DTensors; the plan also splits the embedding and the head by vocabulary (one more all-reduce
  after the embedding, an all-gather of the logits).

What kvlab adds: the checks before any process starts, the unchanged decode loop
(``kvlab.decode.cached_decode``) on every rank, and what each rank's cache holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile

import torch

from kvlab._checks import causal_lm, instance, integer
from kvlab.parallel import launch
from kvlab.theory.parallel import tensor_parallel_heads
from kvlab.theory.shapes import ModelShape

SPLITTABLE = (
    "llama",
    "qwen2",
    "mistral",
)  # the model types checked token for token against generate


@dataclasses.dataclass(frozen=True)
class ParallelDecode:
    """What a tensor-parallel decode returned: the tokens (equal on every rank), the KV heads each
    rank's cache holds of ``kv_heads``, and each rank's cache bytes against one device's."""

    tokens: torch.Tensor
    world_size: int
    kv_heads: int
    kv_heads_per_rank: tuple[int, ...]
    cache_bytes_per_rank: tuple[int, ...]
    vocab_sharded: bool


def vocab_sharded(model) -> bool:
    """Whether this transformers release's plan for ``model`` splits the embedding or the head."""
    causal_lm("model", model)
    plan = getattr(model, "tp_plan", None) or {}
    return any(key.endswith(("embed_tokens", "lm_head")) for key in plan)


def check_splittable(model, world_size: int) -> ModelShape:
    """The model's shape, after checking that tensor parallelism over ``world_size`` ranks can split
    it: a model type kvlab has checked, a tensor-parallel plan in its config, and a world size that
    divides its KV heads and MLP width (and vocabulary, where the plan splits it)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SPLITTABLE or not getattr(config, "base_model_tp_plan", None):
        raise ValueError(
            f"kvlab cannot split a {type(model).__name__} (model_type {model_type!r}) by tensor "
            f"parallelism: it splits {', '.join(SPLITTABLE)}, whose transformers configs carry a "
            "tensor-parallel plan"
        )
    shape = ModelShape.from_config(config)
    tensor_parallel_heads(shape, world_size, "world_size")
    if vocab_sharded(model) and shape.vocab % world_size:
        raise ValueError(
            f"world_size={world_size} must divide the vocabulary ({shape.vocab}), which this "
            "transformers release splits across ranks"
        )
    return shape


@contextlib.contextmanager
def quiet_progress():
    """transformers' progress bars off inside the block (a notebook would show one per save and
    load)."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def save_checkpoint(model, folder: str) -> str:
    """Write ``model`` where every rank can load it: ``from_pretrained`` is where tensor parallelism
    applies its plan. Returns ``folder``."""
    instance("folder", folder, str, "a str (a folder path)")
    with quiet_progress():
        model.save_pretrained(folder)
    return folder


def _sharded_loading() -> dict:
    """``from_pretrained`` keywords that ask for tensor parallelism over all ranks of the group."""
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    if "tp_size" in {f.name for f in dataclasses.fields(DistributedConfig)}:
        return {"distributed_config": DistributedConfig(tp_size=dist.get_world_size())}
    return {"tp_plan": "auto"}


def load_sharded(path: str, dtype=None):
    """Inside a rank: this rank's share of the checkpoint at ``path``, split by the model's plan."""
    if not os.path.isdir(path):
        raise ValueError(f"path must be a saved checkpoint folder, got {path!r}")
    import transformers

    with quiet_progress():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, **_sharded_loading()
        )
    return model.eval()


def decode_on_rank(
    rank: int, world_size: int, path: str, input_ids, max_new_tokens: int, dtype
) -> dict:
    """What every rank runs: load its share of the checkpoint, decode with kvlab's cached loop, and
    report the tokens and what its cache holds."""
    launch.check_rank("rank", rank, world_size)
    from transformers import DynamicCache

    from kvlab.decode import cached_decode

    model = load_sharded(path, dtype)
    cache = DynamicCache()
    tokens = cached_decode(model, input_ids.to(model.device), max_new_tokens, cache=cache)
    keys = [layer.keys for layer in cache.layers]
    cache_bytes = sum(2 * k.numel() * k.element_size() for k in keys)
    return {"tokens": tokens.cpu(), "kv_heads": int(keys[0].shape[1]), "cache_bytes": cache_bytes}


def tensor_parallel_decode(
    model,
    input_ids,
    max_new_tokens: int,
    world_size: int = 2,
    backend: str | None = None,
    device: str = "cpu",
    workers: launch.Workers | None = None,
    timeout: float = 300.0,
) -> ParallelDecode:
    """Greedy decode of ``input_ids`` (``[batch, prompt]``, no padding) by ``model`` split over
    ``world_size`` ranks; the same tokens as ``model.generate(..., do_sample=False)``.

    Runs on ``workers`` (a :class:`~kvlab.parallel.launch.Workers`, whose world size then counts) or
    on fresh processes. Everything is checked before a process starts; the ranks' tokens must agree.
    """
    world_size = launch.world_of(workers, world_size, backend, device)
    check_splittable(model, world_size)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.dtype != torch.long
    ):
        raise TypeError(
            f"input_ids must be a [batch, prompt] torch.long tensor, got {input_ids!r:.80}"
        )
    vocab = model.config.vocab_size
    if input_ids.numel() == 0 or int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids must be a non-empty tensor of token ids in [0, {vocab})")
    with tempfile.TemporaryDirectory(prefix="kvlab-tp-") as path:
        save_checkpoint(model, path)
        ranks = launch.call(
            workers,
            decode_on_rank,
            path,
            input_ids.cpu(),
            max_new_tokens,
            model.dtype,
            world_size=world_size,
            backend=backend,
            device=device,
            timeout=timeout,
        )
    tokens = ranks[0]["tokens"]
    if any(not torch.equal(r["tokens"], tokens) for r in ranks):
        raise RuntimeError(
            "the ranks generated different tokens; their shares of the model disagree"
        )
    return ParallelDecode(
        tokens,
        world_size,
        model.config.num_key_value_heads,
        tuple(r["kv_heads"] for r in ranks),
        tuple(r["cache_bytes"] for r in ranks),
        vocab_sharded(model),
    )
