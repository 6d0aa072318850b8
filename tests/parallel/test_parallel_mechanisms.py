"""The three ways of decoding across devices, at world size 2 on gloo, against single-device
oracles: tensor-parallel tokens against ``generate`` (llama, qwen2, mistral with GQA),
context-parallel attention against fp64 attention over the whole cache (uneven shards, an empty
shard), and disaggregated prefill/decode against ``generate`` with the bytes sent against the KV
size formula.

One set of worker processes serves the whole module: starting a rank (torch, transformers) costs
seconds, running a mechanism on it a fraction of one.
"""

import pytest
import torch
import torch.nn.functional as F

import kvlab
from kvlab.lab import parallel as lab
from kvlab.parallel._checks import HEADER
from kvlab.parallel.context import (
    context_parallel_decode_attention,
    partial_attention,
    split_positions,
)
from kvlab.parallel.disaggregated import disaggregated_generate
from kvlab.parallel.launch import Workers
from kvlab.parallel.tensor import tensor_parallel_decode
from kvlab.theory.parallel import kv_transfer_bytes
from kvlab.theory.shapes import ModelShape

SMALL = dict(
    layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512
)  # GQA, group 2


@pytest.fixture(scope="module")
def workers():
    with Workers(2) as w:
        yield w


def _prompt(batch, length, seed):
    return torch.randint(
        0, SMALL["vocab"], (batch, length), generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_tensor_parallel_tokens_equal_generate(workers, arch):
    model = kvlab.tiny_model(arch, **SMALL)
    ids = _prompt(2, 9, seed=1)
    expected = model.generate(ids, max_new_tokens=8, do_sample=False)[:, 9:]
    got = tensor_parallel_decode(model, ids, 8, workers=workers)
    assert torch.equal(got.tokens, expected)
    # Each rank caches its own KV heads only: H_kv / p of them, 1/p of one device's cache bytes.
    assert got.kv_heads_per_rank == (1, 1) and got.kv_heads == 2
    one_device = (
        2 * SMALL["layers"] * 2 * (9 + 7) * 2 * 16 * 4
    )  # K and V, L, batch, tokens, heads, d, fp32
    assert got.cache_bytes_per_rank == (one_device // 2,) * 2


def _fp64_attention(q, k, v):
    return F.scaled_dot_product_attention(
        q[:, :, None].double(), k.double(), v.double(), enable_gqa=True
    )[:, :, 0]


@pytest.mark.parametrize("seed", range(4))
def test_context_parallel_attention_equals_fp64_attention(workers, seed):
    g = torch.Generator().manual_seed(seed)
    batch, kv_heads, group, dim = 2, 2, [1, 4, 2, 8][seed], 16
    length = int(torch.randint(1, 40, (1,), generator=g))
    q = torch.randn(batch, kv_heads * group, dim, generator=g)
    k, v = torch.randn(2, batch, kv_heads, length, dim, generator=g)
    cut = [0, length, int(torch.randint(0, length + 1, (1,), generator=g)), length // 3][
        seed
    ]  # empty shards too
    got = context_parallel_decode_attention(q, k, v, cuts=[cut], workers=workers)
    torch.testing.assert_close(got.double(), _fp64_attention(q, k, v), atol=2e-6, rtol=2e-6)


def test_context_parallel_in_fp64_is_exact_to_rounding(workers):
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 8, 32, dtype=torch.float64, generator=g)
    k, v = torch.randn(2, 1, 2, 101, 32, dtype=torch.float64, generator=g)
    got = context_parallel_decode_attention(q, k, v, cuts=[77], workers=workers)
    torch.testing.assert_close(got, _fp64_attention(q, k, v), atol=1e-12, rtol=1e-12)


def test_partial_attention_of_an_empty_shard_weighs_nothing():
    q, k = torch.randn(1, 4, 8), torch.randn(1, 2, 0, 8)
    out, lse = partial_attention(q, k, k)
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())


def test_split_positions():
    assert split_positions(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_positions(3, 4) == [(0, 1), (1, 2), (2, 3), (3, 3)]
    assert split_positions(10, 2, [10]) == [(0, 10), (10, 10)]


@pytest.mark.parametrize("prompt_len, block_size", [(21, 8), (16, 16)])
def test_disaggregated_tokens_equal_generate_and_bytes_equal_the_formula(
    workers, prompt_len, block_size
):
    model = kvlab.tiny_model("llama", **SMALL)
    prompt = _prompt(1, prompt_len, seed=3)
    expected = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, prompt_len:].tolist()
    got = disaggregated_generate(
        model, prompt[0].tolist(), 8, block_size=block_size, workers=workers
    )
    assert got.tokens == expected
    shape = ModelShape.from_config(model.config)
    assert got.kv_bytes == kv_transfer_bytes(shape, prompt_len, w_kv=4, block_size=block_size)
    blocks = -(-prompt_len // block_size)
    assert (
        len(got.prefill_table) == blocks
        and got.table_bytes == 4 * blocks
        and got.header_bytes == 8 * len(HEADER)  # int64 each: counts and the blocks' layout
    )
    assert len(got.decode_table) == -(-(prompt_len + 7) // block_size)  # grew on the decode rank


def test_measurements_run_and_predict_from_the_calibrated_link(workers):
    link = lab.calibrate_link(
        workers, sizes=(4096, 4 * 2**20), reps=3
    )  # sizes far apart: noise cannot invert them
    assert link.bytes_per_s > 0 and link.latency_s >= 0 and len(link.one_way_s) == 2
    assert link.link().bytes_per_s_each_way == link.bytes_per_s
    for kind, steps in (("all_reduce", 2), ("all_gather", 1)):
        sweep = lab.measure_collectives(workers, link, kind, sizes=(4096,), reps=2)
        assert sweep.measured_s[0] > 0
        assert sweep.predicted_s[0] == pytest.approx(
            steps * link.latency_s + 4096 / link.bytes_per_s
        )
    model = kvlab.tiny_model("llama", **SMALL)
    step = lab.compare_tensor_parallel_step(model, workers, batch=2, context=8, steps=2, reps=2)
    assert step.calls == 2 * SMALL["layers"] and step.message_bytes == 2 * SMALL["hidden"] * 4
    assert step.predicted_s == pytest.approx(step.one_process_s / 2 + step.communication_s)
    # the rounds' scatter, both steps', is what the page's verdict takes as its spread
    assert step.one_process_spread >= 0 and step.split_spread >= 0
    assert step.spread == pytest.approx(step.one_process_spread + step.split_spread)
    sweep = lab.measure_collectives(workers, link, "all_reduce", sizes=(4096, 8192), reps=3)
    assert len(sweep.spreads) == 2 and all(s >= 0 for s in sweep.spreads)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda w: lab.calibrate_link(w, sizes=(4097,)), "multiples of 4"),
        (lambda w: lab.calibrate_link(w, sizes=()), "sizes"),
        (lambda w: lab.measure_collectives(w, None, "broadcast"), "kind"),
        (
            lambda w: lab.compare_tensor_parallel_step(
                kvlab.tiny_model("llama", **SMALL), w, batch=0
            ),
            "batch",
        ),
    ],
)
def test_measurements_refuse_bad_input_before_the_ranks_run(workers, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(workers)


def test_calibration_measures_again_when_noise_inverts_the_sizes():
    """A sweep whose small message came out slower than its large one is measured again, with twice
    the repetitions; only when every try is inverted does the fit's error reach the caller."""
    import types

    sweeps = iter(
        [[2e-3, 1e-3], [1e-5, 1e-3]]
    )  # one-way seconds at 4 KiB and 4 MiB: inverted, then sane
    calls = []

    def run(fn, sizes, reps):
        calls.append(reps)
        return [next(sweeps)]

    link = lab.calibrate_link(
        types.SimpleNamespace(backend="gloo", run=run), sizes=(4096, 4 * 2**20), reps=3
    )
    assert calls == [3, 6] and link.one_way_s == (1e-5, 1e-3)
    assert link.predicted(4096) == pytest.approx(1e-5, rel=1e-6)
    inverted = types.SimpleNamespace(backend="gloo", run=lambda fn, sizes, reps: [[2e-3, 1e-3]])
    with pytest.raises(ValueError, match="do not grow with the message size"):
        lab.calibrate_link(inverted, sizes=(4096, 4 * 2**20), reps=3)
