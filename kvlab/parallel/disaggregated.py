"""Disaggregated prefill and decode (notebook 12, "Decode across devices"; Zhong et al. 2024): one
rank prefills a prompt into its paged KV cache and sends the blocks, with their block table, to
another rank, which continues the generation from them.

The prefill rank runs ``kvlab.serving.paged_decode.prefill`` as a single-device engine would, then
sends, with ``torch.distributed`` point-to-point messages:

1. a header: the prompt length, the first generated token, the number of blocks, and the layout
   the blocks have (block size, layers, KV heads, head dim, dtype), which the decode rank checks
   against its own cache and against the length before it receives anything sized by it;
2. the block table (``int32``; the prefill pool's block ids, in the sequence's logical order);
3. the blocks: for every layer its K and V blocks, gathered from the pools in table order, one
   tensor ``[layers, 2, blocks, block_size, kv_heads, head_dim]``.

Block ids belong to a pool, so the decode rank does not reuse them: it writes the i-th block it
received into the i-th block of a sequence in its own pool (``PagedKVCache.append``, which
allocates them), then decodes with ``paged_decode.decode_step``. The KV bytes sent are whole
blocks, ceil(s / B) B K (``kvlab.theory.parallel.kv_transfer_bytes``).

This uses the public API of ``kvlab.cache.paged.PagedKVCache`` (``new_sequence``, ``table``,
``k_pools``/``v_pools``, ``append``) and of ``kvlab.serving.paged_decode``.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import torch
import torch.distributed as dist

from kvlab._checks import integer, token_ids
from kvlab.parallel import _checks, launch
from kvlab.parallel.tensor import save_checkpoint


@dataclasses.dataclass(frozen=True)
class Handoff:
    """What a disaggregated generation did: the tokens (the first from the prefill rank, the rest
    from the decode rank), the two ranks' block tables for the sequence, and the bytes sent."""

    tokens: list[int]
    prefill_table: list[int]
    decode_table: list[int]
    kv_bytes: int
    table_bytes: int
    header_bytes: int
    send_s: float
    messages: int = 3

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.table_bytes + self.header_bytes


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _paged_model(path: str, device):
    import transformers

    from kvlab.parallel.tensor import quiet_progress
    from kvlab.serving.paged_decode import use_paged_attention

    with quiet_progress():
        model = transformers.AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    return use_paged_attention(model)


def send_prompt_cache(model, cache, prompt: list[int], to_rank: int, attention: str) -> dict:
    """Prefill ``prompt`` into ``cache`` and send its blocks and block table to ``to_rank``."""
    prompt = token_ids("prompt", prompt)
    from kvlab.serving.paged_decode import prefill

    seq = cache.new_sequence()
    first = prefill(model, cache, seq, prompt, attention=attention)
    table = list(cache.table(seq).blocks)
    index = torch.tensor(table, dtype=torch.long, device=cache.device)
    blocks = torch.stack(
        [
            torch.stack([cache.k_pools[layer][index], cache.v_pools[layer][index]])
            for layer in range(cache.num_layers)
        ]
    )
    header = _checks.header_for(cache, len(prompt), first, len(table))
    header = torch.tensor(header, dtype=torch.long, device=cache.device)
    table_tensor = torch.tensor(table, dtype=torch.int32, device=cache.device)
    messages = [m.contiguous() for m in (header, table_tensor, blocks)]
    dist.barrier()  # both ranks ready: the time below is the transfer, not the receiver's start-up
    start = time.perf_counter()
    for message in messages:
        dist.send(message, dst=to_rank)
    return {
        "prefill_table": table,
        "kv_bytes": _nbytes(blocks),
        "table_bytes": _nbytes(table_tensor),
        "header_bytes": _nbytes(header),
        "send_s": time.perf_counter() - start,
    }


def receive_prompt_cache(cache, from_rank: int, vocab: int = 2**63) -> tuple[int, int, list[int]]:
    """Receive a prompt's blocks into a new sequence of ``cache``; returns (sequence id, first
    token, the sender's table). The header is checked on arrival, before anything sized by it."""
    from_rank = integer("from_rank", from_rank, 0)
    header = torch.full((len(_checks.HEADER),), -1, dtype=torch.long, device=cache.device)
    dist.barrier()
    dist.recv(header, src=from_rank)
    got = _checks.header_on_arrival(cache, header.tolist(), vocab)
    length, first, count = got["length"], got["first"], got["blocks"]
    table = torch.full((count,), -1, dtype=torch.int32, device=cache.device)
    dist.recv(table, src=from_rank)
    _checks.received_table(table.tolist())
    blocks = torch.empty(
        (cache.num_layers, 2, count, cache.block_size, cache.num_kv_heads, cache.head_dim),
        dtype=cache.dtype,
        device=cache.device,
    )
    dist.recv(blocks, src=from_rank)
    seq = cache.new_sequence()
    for layer in range(cache.num_layers):  # the i-th block received is the sequence's i-th block
        k, v = (blocks[layer, part].flatten(0, 1)[:length] for part in (0, 1))
        cache.append(seq, layer, k, v)
    return seq, first, table.tolist()


def handoff_on_rank(
    rank: int,
    world_size: int,
    path: str,
    prompt: list[int],
    max_new_tokens: int,
    block_size: int,
    prefill_rank: int,
    decode_rank: int,
    attention: str,
):
    """What every rank runs: the prefill rank prefills and sends, the decode rank receives and
    decodes, any other rank only joins the barrier."""
    launch.check_rank("rank", rank, world_size)
    from kvlab.serving.paged_decode import cache_for, decode_step

    if rank not in (prefill_rank, decode_rank):
        dist.barrier()  # the handoff's barrier is collective: every rank takes part
        return None
    device = launch.rank_device()
    paths = (path, path) if isinstance(path, str) else path  # (prefill's, decode's) checkpoints
    model = _paged_model(paths[rank == decode_rank], device)
    blocks = -(-(len(prompt) + max_new_tokens) // block_size) + 1
    cache = cache_for(model, blocks, block_size, device=device)
    if rank == prefill_rank:
        return send_prompt_cache(model, cache, prompt, decode_rank, attention)
    seq, token, sent_table = receive_prompt_cache(cache, prefill_rank, model.config.vocab_size)
    tokens = [token]
    for _ in range(max_new_tokens - 1):
        tokens += decode_step(model, cache, [seq], [prompt + tokens], attention=attention)
    return {
        "tokens": tokens,
        "decode_table": list(cache.table(seq).blocks),
        "sent_table": sent_table,
    }


def disaggregated_generate(
    model,
    prompt,
    max_new_tokens: int,
    block_size: int = 16,
    prefill_rank: int = 0,
    decode_rank: int = 1,
    world_size: int = 2,
    attention: str | None = None,
    decode_model=None,
    decode_block_size: int | None = None,
    workers: launch.Workers | None = None,
    backend: str | None = None,
    device: str = "cpu",
    timeout: float = 300.0,
) -> Handoff:
    """Greedy generation of ``max_new_tokens`` tokens after ``prompt`` (a list of token ids),
    prefilled on ``prefill_rank`` and decoded on ``decode_rank``; the same tokens as
    ``model.generate``.

    ``attention`` is the decode rank's paged attention path: the Triton ``"kernel"`` (default on a
    GPU) or its PyTorch ``"reference"`` (default on the CPU, where the kernel would run in Triton's
    interpreter). ``decode_model`` and ``decode_block_size`` are the decode rank's own (default:
    ``model`` and ``block_size``); the blocks travel as they are, so both ranks must agree on the
    block size, dtype, layers and KV heads. Everything is checked before a process starts.
    """
    world_size = launch.world_of(workers, world_size, backend, device)
    world_size = integer("world_size", world_size, 2)
    prefill_rank = launch.check_rank("prefill_rank", prefill_rank, world_size)
    decode_rank = launch.check_rank("decode_rank", decode_rank, world_size)
    if prefill_rank == decode_rank:
        raise ValueError(f"prefill_rank and decode_rank must differ, both are {prefill_rank}")
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    attention = _checks.attention_path(attention, device)
    decode_model, block_size = _checks.handoff_ranks(
        model, decode_model, block_size, decode_block_size, attention
    )
    prompt = token_ids("prompt", prompt, model.config.vocab_size)
    with tempfile.TemporaryDirectory(prefix="kvlab-pd-") as path:
        save_checkpoint(model, f"{path}/prefill")
        if decode_model is not model:
            save_checkpoint(decode_model, f"{path}/decode")
        paths = (f"{path}/prefill", f"{path}/{'prefill' if decode_model is model else 'decode'}")
        ranks = launch.call(
            workers,
            handoff_on_rank,
            paths,
            prompt,
            max_new_tokens,
            block_size,
            prefill_rank,
            decode_rank,
            attention,
            world_size=world_size,
            backend=backend,
            device=device,
            timeout=timeout,
        )
    sent, got = ranks[prefill_rank], ranks[decode_rank]
    if got["sent_table"] != sent["prefill_table"]:
        raise RuntimeError(
            "the decode rank received another block table than the prefill rank sent"
        )
    return Handoff(
        got["tokens"],
        sent["prefill_table"],
        got["decode_table"],
        sent["kv_bytes"],
        sent["table_bytes"],
        sent["header_bytes"],
        sent["send_s"],
    )
