"""The one attention function and its per-step metadata (notebooks 05, 06, 11), without a model: a
step that mixes a decode token, a prefill chunk that continues a sequence and a fresh prefill,
through each path, against fp64 attention written from the definition; the kernel path (the paged
decode and prefill kernels, interpreted on a CPU) against the reference path on mixed steps in fp32
and fp16, GQA groups 1, 4 and 8, chunks that start and end inside a block, and an empty cached
prefix; and the step checks."""

import types

import pytest
import torch

from kvlab.cache.paged import PagedKVCache
from kvlab.kernels import store_kv_ref
from kvlab.serving.attention import ATTENTION_PATHS, build_step, paged_attention
from kvlab.serving.request import Chunk

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 16, 4


def _cache():
    """A decodes its 10th token, B prefills 5 more after 6 written ones, C prefills all 7 of its
    prompt."""
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(1, 16, BLOCK, KV_HEADS, DIM, torch.float32, "cpu", store=store_kv_ref)
    seqs = []
    for written, more in ((9, 1), (6, 5)):
        seq = cache.new_sequence()
        k = torch.randn(written, KV_HEADS, DIM, generator=gen)
        cache.append(seq, 0, k, -k)
        cache.reserve(seq, more)
        seqs.append(seq)
    seqs.append(cache.admit([2] * 7)[0])
    return cache, seqs, gen


def _schedule(cache, pairs):
    """Each ``(seq, count)`` as a step schedules it: its next ``count`` reserved tokens, committed
    (without prefix caching, their ids are never read: ones)."""
    chunks = []
    for seq, count in pairs:
        start = cache.num_computed(seq)
        chunks.append(Chunk(seq, start, [1] * count))
        cache.commit(seq, start + count, (), checked=True)  # the step writes them
    return chunks


def _oracle(cache_before, seqs, pairs, q, k, v, scale):
    """fp64: each new token of a chunk attends to its sequence's written tokens and the chunk up to
    itself."""
    out, t = [], 0
    for seq, count in pairs:
        old_k, old_v = cache_before[seq]
        keys, values = (
            torch.cat([old_k, k[t : t + count]]).double(),
            torch.cat([old_v, v[t : t + count]]).double(),
        )
        for i in range(count):
            n = old_k.shape[0] + i + 1
            kk = keys[:n].repeat_interleave(HEADS // KV_HEADS, dim=1)
            vv = values[:n].repeat_interleave(HEADS // KV_HEADS, dim=1)
            weights = (torch.einsum("hd,nhd->hn", q[t + i].double(), kk) * scale).softmax(-1)
            out.append(torch.einsum("hn,nhd->hd", weights, vv))
        t += count
    return torch.stack(out)


@pytest.mark.parametrize("path", ATTENTION_PATHS)
def test_a_mixed_step_matches_fp64_attention_and_stores_every_token(path):
    cache, seqs, gen = _cache()
    pairs = [(seqs[0], 1), (seqs[1], 5), (seqs[2], 7)]
    before = {s: cache.gather(s, 0) for s in seqs}
    total = sum(n for _, n in pairs)
    chunks = _schedule(cache, pairs)
    q = torch.randn(total, HEADS, DIM, generator=gen)
    k, v = (
        torch.randn(total, KV_HEADS, DIM, generator=gen),
        torch.randn(total, KV_HEADS, DIM, generator=gen),
    )
    meta = build_step(cache, chunks, path, group=HEADS // KV_HEADS)
    decode_rows = total if path == "reference" else 1  # the reference: every token one row
    assert meta.num_decode == decode_rows and meta.slots.shape == (total,)
    out, none = paged_attention(
        types.SimpleNamespace(layer_idx=0),
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        None,
        scaling=0.3,
        kvlab_step=meta,
    )
    assert none is None and out.shape == (1, total, HEADS, DIM)
    torch.testing.assert_close(
        out[0].double(), _oracle(before, seqs, pairs, q, k, v, 0.3), atol=1e-5, rtol=1e-5
    )
    t = 0
    for seq, count in pairs:  # the new K and V are in the pool at the reserved slots
        got_k, got_v = cache.gather(seq, 0)
        assert torch.equal(got_k[-count:], k[t : t + count]) and torch.equal(
            got_v[-count:], v[t : t + count]
        )
        t += count


def test_the_step_is_checked_once_and_names_the_problem():
    cache, (a, b, c), _ = _cache()
    cache.commit(a, 10, (), checked=True)  # a's decode token and b's five prefill tokens
    cache.commit(b, 11, (), checked=True)  # are scheduled
    d = cache.admit([3] * 5)[0]
    cache.preempt(d, "recompute")
    for chunks, error, match in [
        ([(a, 9, [1, 1])], ValueError, "has 1 committed token"),
        ([(b, 6, [1] * 6)], ValueError, "has 5 committed token"),
        ([(a, 9, [])], ValueError, "got a chunk of 0"),
        ([(a, -1, [1])], ValueError, r"chunks\[0\].start must be an int >= 0"),
        ([(b, 6, [1]), (b, 6, [1])], ValueError, "appears twice"),
        ([(b, 6, [1] * 5), (a, 9, [1])], ValueError, "must come before"),
        ([(99, 0, [1])], ValueError, "not a live sequence"),
        ([(d, 0, [1])], ValueError, "is preempted"),
        ([(a, 1)], TypeError, r"must be a \(seq_id, start, token_ids\) chunk"),
        ([], ValueError, "at least one"),
        ("ab", TypeError, "chunks must be a list"),
    ]:
        with pytest.raises(error, match=match):
            build_step(cache, chunks, "gather")
    with pytest.raises(ValueError, match="path must be one of"):
        build_step(cache, [(a, 9, [1])], "flash")
    two = PagedKVCache(2, 4, BLOCK, KV_HEADS, DIM, torch.float32, "cpu", store=store_kv_ref)
    f = two.new_sequence()
    two.append(f, 0, torch.zeros(2, KV_HEADS, DIM), torch.zeros(2, KV_HEADS, DIM))  # not layer 1
    with pytest.raises(ValueError, match="mid-step"):
        build_step(two, [(f, 0, [1])], "gather")


def test_the_attention_function_needs_its_metadata():
    with pytest.raises(ValueError, match="needs the kvlab_step= keyword"):
        paged_attention(types.SimpleNamespace(layer_idx=0), None, None, None, None)


def _mixed_cache(dtype, group, seed):
    """Five sequences in blocks of 4: two decoding (9 and 4 tokens written), one continuing its
    prefill from token 6 to 11 (a chunk that starts and ends inside a block), one with nothing
    cached (an empty prefix, 7 new tokens) and one with a long cached prefix and a 3-token chunk (13
    -> 16)."""
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(1, 40, BLOCK, KV_HEADS, DIM, dtype, "cpu", store=store_kv_ref)
    chunks = []
    for written, new in ((9, 1), (4, 1), (6, 5), (0, 7), (13, 3)):
        seq = cache.new_sequence()
        if written:
            k = torch.randn(written, KV_HEADS, DIM, generator=gen).to(dtype)
            cache.append(seq, 0, k, torch.randn(written, KV_HEADS, DIM, generator=gen).to(dtype))
        cache.reserve(seq, new)
        chunks.append((seq, new))
    total = sum(n for _, n in chunks)
    chunks = _schedule(cache, chunks)
    q = torch.randn(total, group * KV_HEADS, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(total, KV_HEADS, DIM, generator=gen).to(dtype) for _ in range(2))
    return cache, chunks, q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_the_kernel_path_equals_the_reference_on_a_mixed_step(dtype, group):
    """Decode rows through the decode kernel and every longer chunk through the paged prefill
    kernel, in one step, against the fp64 reference path on the same cache."""
    cache, chunks, q, k, v = _mixed_cache(dtype, group, seed=group)
    outputs = {}
    for path in ("reference", "kernel"):  # both store the same K and V at the same slots
        meta = build_step(cache, chunks, path, group=group)
        out, _ = paged_attention(
            types.SimpleNamespace(layer_idx=0),
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            None,
            scaling=DIM**-0.5,
            kvlab_step=meta,
        )
        outputs[path] = out[0]
    kernel_meta = build_step(cache, chunks, "kernel", group=group)
    assert kernel_meta.num_decode == 2 and kernel_meta.cu_query_lens.tolist() == [0, 5, 12, 15]
    assert kernel_meta.context_lens.tolist() == [11, 7, 16] and kernel_meta.tiles.shape[1] == 2
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    assert outputs["kernel"].dtype == dtype
    torch.testing.assert_close(
        outputs["kernel"].float(), outputs["reference"].float(), atol=tolerance, rtol=tolerance
    )


def test_a_step_built_for_another_group_is_refused():
    cache, chunks, q, k, v = _mixed_cache(torch.float32, 4, seed=0)
    meta = build_step(cache, chunks, "kernel", group=2)
    with pytest.raises(ValueError, match="built for 2 query head"):
        paged_attention(
            types.SimpleNamespace(layer_idx=0),
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            None,
            kvlab_step=meta,
        )
    for bad in (0, True, 1.5):
        with pytest.raises((ValueError, TypeError), match="group must be an int >= 1"):
            build_step(cache, chunks, "gather", group=bad)
