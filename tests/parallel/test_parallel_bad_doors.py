"""Every notebook: the parallel package's public names that no other table reached refuse a bad
argument at the door, naming it, before any process starts or any tensor is sent (issue 33)."""

import math

import pytest
import torch

import kvlab
from kvlab.parallel import context, disaggregated, launch, tensor

Q, KV = torch.ones(1, 2, 8), torch.ones(1, 1, 4, 8)


def _model():
    return kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, kv_heads=1, vocab=64)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "partial_attention negative scale": (
        lambda: context.partial_attention(Q, KV, KV, scale=-1.0),
        ValueError,
        "scale",
    ),
    "partial_attention bool scale": (
        lambda: context.partial_attention(Q, KV, KV, scale=True),
        TypeError,
        "scale",
    ),
    "context_parallel_attention NaN scale": (
        lambda: context.context_parallel_attention(Q, KV, KV, scale=math.nan),
        ValueError,
        "scale",
    ),
    "send_prompt_cache text prompt": (
        lambda: disaggregated.send_prompt_cache(_model(), None, "abc", 1, "gather"),
        TypeError,
        "prompt",
    ),
    "receive_prompt_cache negative rank": (
        lambda: disaggregated.receive_prompt_cache(None, -1),
        ValueError,
        "from_rank",
    ),
    "handoff_on_rank rank past the world": (
        lambda: disaggregated.handoff_on_rank(2, 2, "/nowhere", [1, 2], 2, 4, 0, 1, "gather"),
        ValueError,
        "rank",
    ),
    "WorkerError text rank": (lambda: launch.WorkerError("0", "x"), TypeError, "rank"),
    "default_backend bogus device": (lambda: launch.default_backend("bogus"), ValueError, "device"),
    "check_rank past the world": (
        lambda: launch.check_rank("to_rank", 2, 2),
        ValueError,
        "to_rank",
    ),
    "world_of zero world": (lambda: launch.world_of(None, 0), ValueError, "world_size"),
    "call text fn": (lambda: launch.call(None, "fn"), TypeError, "fn"),
    "vocab_sharded text": (lambda: tensor.vocab_sharded("model"), TypeError, "model"),
    "save_checkpoint int folder": (
        lambda: tensor.save_checkpoint(_model(), 3),
        TypeError,
        "folder",
    ),
    "load_sharded missing path": (
        lambda: tensor.load_sharded("/no/such/checkpoint"),
        ValueError,
        "path",
    ),
    "decode_on_rank rank past the world": (
        lambda: tensor.decode_on_rank(
            2, 2, "/nowhere", torch.ones(1, 2, dtype=torch.long), 2, None
        ),
        ValueError,
        "rank",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_naming_its_argument(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
