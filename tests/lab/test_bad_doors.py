"""The lab's doors that issue 33 found answering nonsense, or passing a library's own error through:
each now raises naming the argument, before it computes or loads anything."""

import pytest
import torch

import kvlab
from kvlab.cache.layout import new_cache
from kvlab.lab.decode_peers import generate_peer
from kvlab.lab.layout_timing import append_traffic
from kvlab.lab.paged_attention import paged_prefill_work
from kvlab.lab.paging import simulate
from kvlab.lab.pretrained import cache_stamp, chat_ids, pretrained_model
from kvlab.lab.trained import heldout_ids
from kvlab.serving.request import Request


def _model():
    return kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, kv_heads=1, vocab=64)


def _prefill(block_size=4, head_dim=32, cu=(0, 3), lens=(3,)):
    q = torch.randn(cu[-1], 2, head_dim)
    k_cache = torch.randn(4, block_size, 1, head_dim)
    return (q, k_cache, torch.tensor(cu, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32))


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "heldout_ids of empty text": (lambda: heldout_ids(text=""), ValueError, "text must hold"),
    "heldout_ids of bytes": (lambda: heldout_ids(text=b"x"), TypeError, "text must be a str"),
    "append_traffic of a bogus method": (
        lambda: append_traffic(
            new_cache("BHTD", batch=1, length=4, kv_heads=2, head_dim=8), "bogus"
        ),
        ValueError,
        "method must be one of",
    ),
    "append_traffic of a non-cache": (
        lambda: append_traffic("cache", "cat"),
        TypeError,
        "cache must be a kvlab.cache.layout.KVCache",
    ),
    "generate_peer of 1.5 tokens": (
        lambda: generate_peer(_model(), torch.tensor([[1, 2]]), 1.5),
        TypeError,
        "max_new_tokens",
    ),
    "generate_peer of float ids": (
        lambda: generate_peer(_model(), torch.ones(1, 2), 2),
        TypeError,
        "input_ids",
    ),
    "paged_prefill_work of a block of 3": (
        lambda: paged_prefill_work(*_prefill(block_size=3)),
        ValueError,
        "block_size must be a power of two",
    ),
    "paged_prefill_work of a head dim the kernel has not": (
        lambda: paged_prefill_work(*_prefill(head_dim=24)),
        ValueError,
        "head_dim one of",
    ),
    "paged_prefill_work of queries past the context": (
        lambda: paged_prefill_work(*_prefill(lens=(2,))),
        ValueError,
        "context_lens",
    ),
    "paged_prefill_work of cu_query_lens short of q": (
        lambda: paged_prefill_work(
            *_prefill()[:2], torch.tensor([0, 2], dtype=torch.int32), _prefill()[3]
        ),
        ValueError,
        "cu_query_lens",
    ),
    "simulate of no trace": (
        lambda: simulate(None, "paged", 256),
        TypeError,
        "trace must be a list",
    ),
    "pretrained_model with a bogus attention": (
        lambda: pretrained_model(attn_implementation="bogus"),
        ValueError,
        "attn_implementation must be one of",
    ),
    "cache_stamp of no file": (
        lambda: cache_stamp("not a path"),
        ValueError,
        "gguf_file must be the path of an existing GGUF file",
    ),
    "chat_ids with a number for content": (
        lambda: chat_ids(None, [{"role": "user", "content": 5}]),
        TypeError,
        r"messages\[0\] must have a str role and a str content",
    ),
    "a request stopping at -5": (
        lambda: Request(0, [1, 2], 3, stop=frozenset({-5})),
        ValueError,
        r"stop\[0\] must be a token id",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_the_doors_still_open_for_good_input():
    assert heldout_ids(text="In the beginning").dtype == torch.long
    cache = new_cache("BHTD", batch=1, length=4, kv_heads=2, head_dim=8)
    assert append_traffic(cache, "cat")[1] > append_traffic(cache, "index")[1]
    assert paged_prefill_work(*_prefill()).flops > 0
