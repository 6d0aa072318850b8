"""kvlab.theory.parallel against the ring-collective formulas written out by hand, and against the
KV Cache Memory Wall paper's transfer figures (sections 5.3 and appendix B.5)."""

import dataclasses
import math
import subprocess
import sys

import pytest

from kvlab.theory import parallel as par
from kvlab.theory import roofline as rf
from kvlab.theory.shapes import SHAPES, ModelShape
from kvlab.theory.specs import LINKS, SPECS, Link

L70, L1B, QWEN = SHAPES["llama-3-70b"], SHAPES["llama-3.2-1b"], SHAPES["qwen2.5-0.5b"]
H200 = SPECS["h200"]
NVLINK, PCIE = LINKS["nvlink4"].bytes_per_s_each_way, LINKS["pcie5-x16"].bytes_per_s_each_way
ETHERNET_400G = Link("400 Gbps Ethernet", 400e9 / 8, "seed 004, section 5.3")


def test_importable_without_torch():
    code = "import sys; sys.modules['torch'] = None; import kvlab.theory.parallel"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("world, share", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_all_reduce_moves_2_p_minus_1_over_p_of_the_message(world, share):
    assert par.collective_bytes("all_reduce", 1e6, world) == pytest.approx(share * 1e6)
    assert par.collective_bytes("all_gather", 1e6, world) == pytest.approx((world - 1) * 1e6)


def test_ring_steps():
    assert [par.ring_steps("all_reduce", p) for p in (1, 2, 8)] == [0, 2, 14]
    assert [par.ring_steps("all_gather", p) for p in (1, 2, 8)] == [0, 1, 7]


def test_collective_time_is_latency_plus_bytes_at_the_one_way_rate():
    assert par.collective_time("all_reduce", 9e6, 4, "nvlink4", latency=7e-6) == pytest.approx(
        7e-6 + 1.5 * 9e6 / 450e9
    )
    assert par.collective_time("all_gather", 1e6, 2, "pcie5-x16") == pytest.approx(1e6 / 64e9)
    assert (
        par.collective_time("all_reduce", 1e6, 1, "pcie5-x16", latency=1.0) == 0.0
    )  # nothing to talk to


@pytest.mark.parametrize("shape", [L70, L1B, QWEN], ids=lambda s: s.name)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("link", ["nvlink4", "pcie5-x16"])
def test_tensor_parallel_step_by_hand(shape, world, link):
    if shape.q_heads % world:
        pytest.skip("not splittable")
    batch, context, alpha = 8, 4096, 5e-6
    step = par.tensor_parallel_step(shape, "h200", batch, context, world, link, latency=alpha)
    rate = LINKS[link].bytes_per_s_each_way
    # Memory bound at this batch: bytes / HBM bandwidth. The head is read whole by each device; an
    # untied embedding (Llama-3-70B) is looked up, b rows, not read; a tied one is the head.
    table = shape.vocab * shape.hidden * 2
    tied = shape is not L70
    assert par.tied_embeddings(shape) == tied
    lookup = 0 if tied else batch * shape.hidden * 2
    kv = batch * context * 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    moved = shape.params * 2 + kv - (0 if tied else table - lookup)
    one = moved / H200.hbm_bytes_per_s
    whole = table + lookup
    split = ((moved - whole) / world + whole) / H200.hbm_bytes_per_s
    message = batch * shape.hidden * 2
    comm = 2 * shape.layers * (alpha + 2 * (world - 1) / world * message / rate)
    assert step.one_device == pytest.approx(one)
    assert step.compute == pytest.approx(split)
    assert step.calls == 2 * shape.layers
    assert step.communication == pytest.approx(comm)
    assert step.total == pytest.approx(split + comm)
    assert step.pays == (split + comm < one)


def test_vocabulary_sharded_plan_adds_an_all_reduce_and_a_logit_gather():
    plain = par.tensor_parallel_step(L1B, "h200", 4, 1024, 2, "nvlink4", latency=3e-6)
    sharded = par.tensor_parallel_step(
        L1B, "h200", 4, 1024, 2, "nvlink4", latency=3e-6, vocab_sharded=True
    )
    assert sharded.calls == plain.calls + 2
    extra = 2 * 3e-6 + (4 * L1B.hidden * 2 + 4 * L1B.vocab / 2 * 2) / NVLINK
    assert sharded.communication - plain.communication == pytest.approx(extra)
    assert sharded.compute == pytest.approx(plain.one_device / 2)  # everything split: T1 / p


def test_one_device_is_the_roofline_floor_and_costs_nothing_extra():
    step = par.tensor_parallel_step(L70, "h200", 3, 2048, 1, "pcie5-x16", latency=1e-3)
    # The roofline floor, less the untied embedding table the step looks up rather than reads.
    saving = (L70.vocab - 3) * L70.hidden * 2
    floor = rf.step_time_floor(L70, "h200", 3, 2048) - saving / H200.hbm_bytes_per_s
    assert step.one_device == step.compute == pytest.approx(floor)
    assert step.communication == 0 and step.speedup == 1 and not step.pays


def test_context_parallel_step_by_hand():
    batch, context, world, alpha = 2, 100_000, 4, 8e-6
    step = par.context_parallel_step(L70, "h200", batch, context, world, "nvlink4", latency=alpha)
    kv = batch * context * 327_680
    assert step.compute == pytest.approx((L70.params * 2 + kv / world) / H200.hbm_bytes_per_s)
    part = batch * L70.q_heads * (L70.head_dim + 1) * 4
    assert step.calls == L70.layers
    assert step.communication == pytest.approx(L70.layers * (alpha + (world - 1) * part / NVLINK))


def test_context_parallel_crossing_matches_the_closed_form():
    # Memory bound: pays once (1 - 1/p) b s K / beta > L (alpha + (p - 1) m / beta_link).
    batch, world, alpha = 1, 2, 10e-6
    crossing = par.context_parallel_crossing(L70, "h200", batch, world, "pcie5-x16", latency=alpha)
    part = batch * L70.q_heads * (L70.head_dim + 1) * 4
    comm = L70.layers * (alpha + part / PCIE)
    s_star = comm * H200.hbm_bytes_per_s / ((1 - 1 / world) * batch * 327_680)
    assert crossing.at == math.floor(s_star) + 1 and not crossing.pays_at_low
    assert par.context_parallel_step(
        L70, "h200", batch, crossing.at, world, "pcie5-x16", alpha
    ).pays
    assert not par.context_parallel_step(
        L70, "h200", batch, crossing.at - 1, world, "pcie5-x16", alpha
    ).pays


def test_a_window_can_keep_context_parallelism_from_ever_paying():
    short = dataclasses.replace(SHAPES["mistral-7b"], window=64)
    crossing = par.context_parallel_crossing(short, "h200", 1, 2, "pcie5-x16", latency=10e-6)
    assert crossing.at is None and not crossing.pays_at_low


def test_tensor_parallel_crossing_in_both_directions():
    # A small model at batch 1: 2L latencies outweigh half a 0.5 ms step; a larger batch pays.
    starts = par.tensor_parallel_crossing(L1B, "h200", 4096, 2, "nvlink4", latency=10e-6)
    assert not starts.pays_at_low and starts.at is not None
    assert par.tensor_parallel_step(L1B, "h200", starts.at, 4096, 2, "nvlink4", 10e-6).pays
    assert not par.tensor_parallel_step(L1B, "h200", starts.at - 1, 4096, 2, "nvlink4", 10e-6).pays
    # A large model at short context over PCIe Gen3: pays at batch 1, but each sequence adds more
    # all-reduce time (2L h w_a / 16 GB/s, 164 us) than the cache reads it saves, so a large batch
    # stops paying.
    stops = par.tensor_parallel_crossing(L70, "h200", 256, 2, "pcie3-x16", latency=0.0)
    assert stops.pays_at_low and stops.at is not None
    assert not par.tensor_parallel_step(L70, "h200", stops.at, 256, 2, "pcie3-x16").pays
    assert par.tensor_parallel_step(L70, "h200", stops.at - 1, 256, 2, "pcie3-x16").pays
    # Without latency and on NVLink, a 70B split always pays.
    assert par.tensor_parallel_crossing(L70, "h200", 4096, 2, "nvlink4").at is None


def test_kv_transfer_bytes_is_the_cache_size_and_counts_whole_blocks():
    assert par.kv_transfer_bytes(L70, 1000) == 1000 * 327_680
    assert par.kv_transfer_bytes(L70, 33, block_size=16) == 48 * 327_680
    assert par.kv_transfer_bytes(L70, 32, block_size=16) == 32 * 327_680
    mistral = SHAPES["mistral-7b"]  # a 4,096-token window: only the window is kept, and sent
    assert par.kv_transfer_bytes(mistral, 10_000) == 4096 * mistral.kv_bytes_per_token()


def test_section_5_3_and_b5_handoff_figures():
    # W4: Llama-3-70B, 128k tokens, 41.9 GB ("42 GB per request"), 0.84 s over 400 Gbps Ethernet,
    # 0.66 s over PCIe Gen5 x16, 0.16 s with the 4x codec.
    move = par.handoff(L70, "b200", 128_000, ETHERNET_400G)
    assert round(move.nbytes / 1e9) == 42 and round(move.nbytes / 1e9, 1) == 41.9
    assert round(move.transfer, 2) == 0.84
    assert round(par.handoff(L70, "b200", 128_000, "pcie5-x16").transfer, 2) == 0.66
    assert round(par.handoff(L70, "b200", 128_000, "pcie5-x16", codec=4).transfer, 2) == 0.16
    assert move.prefill == rf.prefill_time(L70, "b200", 128_000) and move.pays
    assert move.break_even_bytes_per_s == pytest.approx(move.nbytes / move.prefill)


def test_link_table_covers_each_splittable_shape_on_each_link():
    rows = par.link_table([L70, L1B, QWEN], "h200", 1, 4096, 4)
    assert [(r.shape, r.link) for r in rows] == [
        (s.name, LINKS[k].name) for s in (L70, L1B) for k in ("nvlink4", "pcie5-x16")
    ]  # Qwen's 14 heads: not by 4


def test_heads_per_device():
    assert par.tensor_parallel_heads(L70, 8) == (8, 1)
    assert par.tensor_parallel_heads(QWEN, 2) == (7, 1)


BAD = [
    (
        lambda: par.tensor_parallel_heads(L70, 3),
        ValueError,
        r"world=3 must divide the KV heads .*allowed world sizes: \[1, 2, 4, 8\]",
    ),
    (lambda: par.tensor_parallel_heads(L70, 0), ValueError, "world"),
    (lambda: par.tensor_parallel_heads(L70, 2.0), TypeError, "world"),
    (lambda: par.tensor_parallel_heads("llama", 2), TypeError, "shape"),
    (lambda: par.tensor_parallel_step(L70, "h200", 1, 100, 16, "nvlink4"), ValueError, "world=16"),
    (lambda: par.tensor_parallel_step(L70, "h200", 0, 100, 2, "nvlink4"), ValueError, "batch"),
    (
        lambda: par.tensor_parallel_step(L70, "h200", 1, 100, 2, "carrier-pigeon"),
        ValueError,
        "unknown link",
    ),
    (lambda: par.tensor_parallel_step(L70, "h200", 1, 100, 2, 64e9), TypeError, "link"),
    (
        lambda: par.tensor_parallel_step(L70, "h200", 1, 100, 2, "nvlink4", latency=-1),
        ValueError,
        "latency",
    ),
    (
        lambda: par.tensor_parallel_step(L70, "h201", 1, 100, 2, "nvlink4"),
        ValueError,
        "unknown device",
    ),
    (lambda: par.context_parallel_step(L70, "h200", 1, 0, 2, "nvlink4"), ValueError, "context"),
    (lambda: par.context_parallel_step(L70, "h200", 1, 10, 2, "nvlink4", w_a=0), ValueError, "w_a"),
    (lambda: par.collective_bytes("broadcast", 1, 2), ValueError, "kind"),
    (lambda: par.collective_bytes("all_reduce", 0, 2), ValueError, "nbytes"),
    (
        lambda: par.collective_time("all_reduce", 1, 2, "nvlink4", latency=math.inf),
        ValueError,
        "latency",
    ),
    (
        lambda: par.tensor_parallel_crossing(L70, "h200", 10, 2, "nvlink4", max_batch=0),
        ValueError,
        "max_batch",
    ),
    (
        lambda: par.context_parallel_crossing(L70, "h200", 1, 2, "nvlink4", max_context=1),
        ValueError,
        "max_context",
    ),
    (lambda: par.kv_transfer_bytes(L70, 0), ValueError, "tokens"),
    (lambda: par.kv_transfer_bytes(L70, 10, block_size=0), ValueError, "block_size"),
    (lambda: par.handoff(L70, "h200", 10, "nvlink4", codec=0), ValueError, "codec"),
]


@pytest.mark.parametrize("call, error, pattern", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_named(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_a_model_shape_with_an_mlp_width_the_world_does_not_divide():
    odd = ModelShape("odd", 2, 4, 2, 16, 64, 1e6, 100, intermediate=99)
    with pytest.raises(ValueError, match="MLP width"):
        par.tensor_parallel_heads(odd, 2)


def test_vocabulary_bytes_count_one_table_when_tied():
    # Llama-3.2-1B ties its embedding to its head: one table of V h, read whole for the logits, not
    # 2 V h (which overstated its unsplit bytes by about 0.5 GB in bf16).
    table = L1B.vocab * L1B.hidden * 2
    assert par.vocabulary_bytes(L1B, 8) == table
    assert par.embedding_saving(L1B, 8) == 0
    # Untied (Llama-3-70B): the head whole and the b rows looked up; the rest of the table unread.
    assert par.vocabulary_bytes(L70, 8) == (L70.vocab + 8) * L70.hidden * 2
    assert par.embedding_saving(L70, 8) == (L70.vocab - 8) * L70.hidden * 2
    # Exercise 2 of notebook 12: the latency per call below which Llama-3.2-1B's split pays.
    free = par.tensor_parallel_step(L1B, "h200", 1, 8192, 2, "nvlink4", 0.0)
    assert (free.saved - free.communication) / free.calls == pytest.approx(7.23e-6, rel=1e-2)
