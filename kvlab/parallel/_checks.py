"""Notebook 12, decode across devices: what the ranks of a disaggregated handoff must agree on,
checked in the parent before a process starts, and what crosses between them, checked on arrival.

The handoff moves paged KV blocks as they are, so the prefill and the decode rank must agree on
the block size, the dtype, the layers, the KV heads and the head dim; the header the prefill rank
sends carries them, with the prompt length, the first token and the block count, and the decode
rank refuses a header that disagrees with its cache or with itself before it receives anything
sized by it (a receive sized from a lie would abort inside gloo or return uninitialised memory).
"""

from __future__ import annotations

import torch

from kvlab import kernels
from kvlab._checks import causal_lm, integer, one_of

# What the header holds, in order (int64 each); the dtype travels as its index in DTYPES.
HEADER = ("length", "first", "blocks", "block_size", "layers", "kv_heads", "head_dim", "dtype")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def geometry(model) -> dict:
    """The KV layout a model's paged cache has: layers, KV heads, head dim and dtype."""
    config = model.config
    heads = config.num_attention_heads
    return {
        "layers": config.num_hidden_layers,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "dtype": model.dtype,
    }


def handoff_ranks(model, decode_model, block_size, decode_block_size, attention) -> tuple:
    """``(decode_model, block_size)`` once the two ranks agree on everything the blocks carry:
    refused here, in the parent, never inside gloo."""
    causal_lm("model", model)
    decode_model = model if decode_model is None else causal_lm("decode_model", decode_model)
    block_size = integer("block_size", block_size)
    if decode_block_size is not None:
        decode_block_size = integer("decode_block_size", decode_block_size)
        if decode_block_size != block_size:
            raise ValueError(
                f"decode_block_size must equal block_size: the handoff moves whole blocks, got "
                f"{decode_block_size} against {block_size}"
            )
    if decode_model.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"decode_model must share model's vocabulary, got vocab_size "
            f"{decode_model.config.vocab_size} against {model.config.vocab_size}"
        )
    prefill, decode = geometry(model), geometry(decode_model)
    for name in ("layers", "kv_heads", "head_dim", "dtype"):
        if prefill[name] != decode[name]:
            raise ValueError(
                f"decode_model must have the {name} of model (the blocks it receives are model's), "
                f"got {decode[name]} against {prefill[name]}"
            )
    if attention != "gather" and block_size & (block_size - 1):
        raise ValueError(
            f"block_size must be a power of two for attention={attention!r}, got {block_size}"
        )
    if prefill["head_dim"] not in kernels.SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"model's head_dim {prefill['head_dim']} must be one of {kernels.SUPPORTED_HEAD_DIMS}"
            f" for attention={attention!r}"
        )
    return decode_model, block_size


def header_for(cache, length: int, first: int, blocks: int) -> list[int]:
    """The header the prefill rank sends for ``blocks`` blocks of a ``length``-token prompt."""
    layout = (cache.block_size, cache.num_layers, cache.num_kv_heads, cache.head_dim)
    return [length, first, blocks, *layout, DTYPES.index(cache.dtype)]


def header_on_arrival(cache, header: list[int], vocab: int) -> dict:
    """The received header as ``{field: value}`` once it agrees with itself and with ``cache``
    (the decode rank's): a count it lies about is refused before anything is received by it."""
    got = dict(zip(HEADER, header))
    expected = dict(zip(HEADER[3:], header_for(cache, 0, 0, 0)[3:]))
    for name, value in expected.items():
        if got[name] != value:
            shown = (
                DTYPES[got[name]] if name == "dtype" and 0 <= got[name] < len(DTYPES) else got[name]
            )
            mine = DTYPES[value] if name == "dtype" else value
            raise ValueError(
                f"the received header's {name} is {shown} but this rank's cache has {mine}: the "
                "ranks must agree on it"
            )
    length = integer("the received header's length", got["length"])
    integer("the received header's first token", got["first"], 0, vocab)
    needed = -(-length // cache.block_size)
    if got["blocks"] != needed:
        raise ValueError(
            f"the received header's blocks is {got['blocks']} but {length} tokens fill {needed} "
            f"blocks of {cache.block_size}"
        )
    if needed > cache.manager.num_free:
        raise ValueError(
            f"the received header's {needed} blocks exceed the "
            f"{cache.manager.num_free} free in this rank's cache"
        )
    return got


def received_table(table: list[int]) -> list[int]:
    """The received block table, refused where a shorter message left the buffer's fill (-1) or
    where it names a block twice."""
    if any(b < 0 for b in table) or len(set(table)) != len(table):
        raise ValueError(
            f"the received block table must be distinct block ids, got {table}: the sender sent"
            " fewer than its header promised"
        )
    return table


def attention_path(attention, device) -> str:
    """The decode rank's attention path (default: the kernel on a GPU, its reference elsewhere)."""
    attention = attention or ("kernel" if device == "cuda" else "reference")
    return one_of("attention", attention, ("kernel", "reference"))
