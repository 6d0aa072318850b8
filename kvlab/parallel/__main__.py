"""``torchrun --nproc-per-node 2 -m kvlab.parallel MECHANISM``: the three mechanisms of notebook 12
("Decode across devices") on ranks that torchrun started, each checked against one process.

MECHANISM is ``tensor`` (tensor-parallel decode against ``generate``), ``context`` (context-parallel
attention against fp64 attention) or ``handoff`` (disaggregated prefill and decode against
``generate``). Every rank builds the same random-weight model from the same seed; rank 0 prints.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kvlab.parallel import context, disaggregated, launch, tensor

MECHANISMS = ("tensor", "context", "handoff")


def _shared_folder(rank: int) -> str:
    """A folder rank 0 creates and every rank then knows (the ranks share this machine's disk)."""
    name = [tempfile.mkdtemp(prefix="kvlab-torchrun-") if rank == 0 else None]
    dist.broadcast_object_list(name, src=0)
    return name[0]


def _check_tensor(rank, world, model, ids, new, path) -> str:
    if rank == 0:
        tensor.save_checkpoint(model, path)
    dist.barrier()
    got = tensor.decode_on_rank(rank, world, path, ids, new, model.dtype)
    expected = model.generate(ids, max_new_tokens=new, do_sample=False)[:, ids.shape[1] :]
    return (
        f"tensor parallel over {world} ranks: tokens equal generate:"
        f" {torch.equal(got['tokens'], expected)}; this rank caches {got['kv_heads']} of"
        f" {model.config.num_key_value_heads} KV heads"
    )


def _check_context(rank, world, model, ids, new, path) -> str:
    g = torch.Generator().manual_seed(0)  # the same q, k, v on every rank
    shape = model.shape
    q = torch.randn(1, shape.q_heads, shape.head_dim, generator=g)
    k, v = torch.randn(2, 1, shape.kv_heads, 1000, shape.head_dim, generator=g)
    start, end = context.split_positions(1000, world)[rank]
    device = launch.rank_device()
    got = context.context_parallel_attention(
        q.to(device), k[:, :, start:end].to(device), v[:, :, start:end].to(device)
    ).cpu()
    exact = F.scaled_dot_product_attention(
        q[:, :, None].double(), k.double(), v.double(), enable_gqa=True
    )[:, :, 0]
    return (
        f"context parallel over {world} ranks: largest difference from fp64 attention"
        f" {(got - exact).abs().max():.1e}"
    )


def _check_handoff(rank, world, model, ids, new, path) -> str:
    if rank == 0:
        tensor.save_checkpoint(model, path)
    dist.barrier()
    prompt = ids[0].tolist()
    got = disaggregated.handoff_on_rank(rank, world, path, prompt, new, 16, 0, 1, "reference")
    result = [got]
    dist.broadcast_object_list(result, src=1)  # rank 1 decoded; rank 0 prints
    expected = model.generate(ids[:1], max_new_tokens=new, do_sample=False)[
        0, len(prompt) :
    ].tolist()
    return (
        "prefill on rank 0, decode on rank 1: tokens equal generate:"
        f" {result[0]['tokens'] == expected}"
    )


def main(argv=None) -> None:
    from kvlab.lab.models import tiny_model

    parser = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node 2 -m kvlab.parallel", description=__doc__
    )
    parser.add_argument("mechanism", choices=MECHANISMS)
    parser.add_argument("--arch", default="llama", choices=tensor.SPLITTABLE)
    parser.add_argument("--new", type=int, default=8, help="tokens to generate")
    args = parser.parse_args(argv)
    rank, world = launch.init_from_env()
    path = _shared_folder(rank)
    try:
        model = tiny_model(args.arch, device="cpu", dtype=torch.float32)
        tensor.check_splittable(model, world)
        ids = torch.randint(
            0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
        )
        check = {"tensor": _check_tensor, "context": _check_context, "handoff": _check_handoff}[
            args.mechanism
        ]
        line = check(rank, world, model, ids, args.new, path)
        dist.barrier()  # every rank is done with the checkpoint
        if rank == 0:
            print(line, flush=True)
    finally:
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
