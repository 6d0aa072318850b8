"""Notebook 05's admission simulator: the engine's one scheduler over a block manager or contiguous
regions, on small traces worked out by hand (see ``simulate``'s docstring for the step rules). A
request holds its prompt and all but its newest output token: at its ``g``-th step, ``P + g - 1``
tokens."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.lab.paging import make_trace, simulate
from kvlab.serving.request import Request
from kvlab.theory.paging import predicted_waste, within_waste_bound


def req(i, prompt, output):
    return Request(i, [0] * prompt, output)


HAND_TRACE = [req(0, 4, 4), req(1, 10, 2), req(2, 5, 1)]


def test_reserve_max_by_hand():
    # budget 64, max_len 32: A at [0, 32), B at [32, 64); C waits until B finishes at step 2.
    # finals (tokens held at the last step): A 7, B 11, C 5.
    # step 1: A 4, B 10 -> used 14; reserved (7-4)+(11-10) = 4; internal (32-7)+(32-11) = 46
    # step 2: A 5, B 11 -> used 16, reserved 2, internal 46; B done
    # step 3: C admitted at [32, 64): A 6, C 5 -> used 11, reserved 1, internal 25+27 = 52; C done
    # step 4: A 7 -> used 7, reserved 0, internal 25; A done
    r = simulate(HAND_TRACE, "reserve-max", budget_tokens=64, block_size=16, max_len=32)
    assert (r.steps, r.used, r.reserved, r.internal, r.final_block) == (4, 48, 7, 169, 0)
    assert r.allocated == 64 + 64 + 64 + 32
    assert r.completed_by_step == [0, 1, 2, 3] and r.admitted == 3 and r.peak_batch == 2
    assert r.peak_metadata_bytes == 2 * 8 and r.preemptions == 0
    assert r.waste_fraction == pytest.approx(1 - 48 / 224)


def test_paged_by_hand():
    # block 16, 4 blocks: every request takes one block and never crosses a boundary. step 1: A 4, B
    # 10, C 5 -> used 19, final-block waste 48 - 19 = 29; C done step 2: A 5, B 11 -> used 16, waste
    # 16; B done.  step 3: A 6 (waste 10).  step 4: A 7 (waste 9)
    r = simulate(HAND_TRACE, "paged", budget_tokens=64, block_size=16, max_len=32)
    assert (r.steps, r.used, r.final_block, r.reserved, r.internal) == (
        4,
        19 + 16 + 6 + 7,
        29 + 16 + 10 + 9,
        0,
        0,
    )
    assert r.peak_metadata_bytes == 3 * 1 * 4 and r.completed_by_step == [1, 2, 2, 3]


def test_paged_preemption_by_hand():
    # block 2, 3 blocks; A and B are (prompt 2, output 3) and take one block each at admission. step
    # 1: both prefilled (2 tokens each). step 2: both decode and each needs a block, one is free:
    # B, the newest, is preempted (its 2 computed tokens dropped); A takes the block -> 3. step 3: B
    # would need 2 blocks for its prompt and first token, 1 is free: it waits. A -> 4, done. step 4:
    # B readmitted, prefills its 3 tokens. step 5: B decodes -> 4, done.
    trace = [req(0, 2, 3), req(1, 2, 3)]
    r = simulate(trace, "paged", budget_tokens=6, block_size=2, max_len=5)
    assert (r.steps, r.preemptions, r.recomputed_tokens, r.admitted, r.completed) == (5, 1, 2, 3, 2)
    assert (r.used, r.final_block, r.swapped_blocks) == (4 + 3 + 4 + 3 + 4, 0 + 1 + 0 + 1 + 0, 0)
    # The same with swap: B's one block goes to the host and back; nothing is recomputed.
    s = simulate(trace, "paged", budget_tokens=6, block_size=2, max_len=5, preemption="swap")
    assert (s.steps, s.preemptions, s.swapped_blocks, s.recomputed_tokens, s.admitted) == (
        5,
        1,
        1,
        0,
        2,
    )
    assert (s.used, s.final_block) == (r.used, r.final_block)


def test_reserve_estimate_overflow_by_hand():
    # estimate 3 (mean output of [1, 5]): A (2, 1) and B (2, 5) each reserve 5 slots; budget 10. B
    # holds 2, 3, 4, 5 tokens at steps 1-4; at step 5 its next token does not fit its region: it is
    # preempted (5 tokens to recompute) and nothing runs; at step 6 it is readmitted reserving
    # max_len (8), prefills its 6 tokens and finishes.
    r = simulate(
        [req(0, 2, 1), req(1, 2, 5)], "reserve-estimate", budget_tokens=10, block_size=2, max_len=8
    )
    assert (r.preemptions, r.recomputed_tokens, r.admitted, r.completed, r.steps) == (1, 5, 3, 2, 6)
    assert r.batch_by_step == [2, 1, 1, 1, 0, 1]


def test_first_fit_refusal_counts_external_fragmentation():
    # budget 13, estimate 2: regions [0, 3), [3, 8), [8, 11) for the first three; D needs 8 and 2
    # are free. After step 1 the two short requests are done: holes of 3 and 5 slots, 8 free in all,
    # and D still cannot be placed (external fragmentation, 8 slots at steps 2 and 3) until B
    # finishes at step 3.
    trace = [req(0, 1, 1), req(1, 3, 3), req(2, 1, 1), req(3, 6, 2)]
    r = simulate(trace, "reserve-estimate", budget_tokens=13, block_size=4, max_len=8, estimate=2)
    assert r.completed == 4 and r.external == 8 + 8 and r.batch_by_step == [3, 1, 1, 1, 1]


def test_reserve_max_waste_follows_the_per_request_formula():
    trace = make_trace(40, "lognormal", mean_prompt=20, mean_output=30, max_len=128, seed=4)
    r = simulate(trace, "reserve-max", budget_tokens=1024, block_size=16, max_len=128)
    held = sum(len(q.prompt) + g - 1 for q in trace for g in range(1, q.max_new_tokens + 1))
    slots = sum(128 for q in trace for _ in range(q.max_new_tokens))
    assert r.preemptions == 0 and r.waste_fraction == pytest.approx(1 - held / slots, abs=1e-12)


@pytest.mark.parametrize("distribution", ["uniform", "lognormal", "bimodal"])
def test_trace_lengths_are_bounded_and_reproducible(distribution):
    trace = make_trace(500, distribution, mean_prompt=40, mean_output=80, max_len=300, seed=3)
    again = make_trace(500, distribution, mean_prompt=40, mean_output=80, max_len=300, seed=3)
    assert [(len(r.prompt), r.max_new_tokens) for r in trace] == [
        (len(r.prompt), r.max_new_tokens) for r in again
    ]
    assert all(
        len(r.prompt) >= 1 and r.max_new_tokens >= 1 and len(r.prompt) + r.max_new_tokens <= 300
        for r in trace
    )
    assert 0.7 * 80 < sum(r.max_new_tokens for r in trace) / len(trace) < 1.3 * 80


@given(
    seed=st.integers(0, 1000),
    policy=st.sampled_from(["reserve-max", "reserve-estimate", "paged"]),
    block=st.sampled_from([1, 4, 16]),
    mode=st.sampled_from(["recompute", "swap"]),
)
@settings(max_examples=25, deadline=None)
def test_simulator_conserves_work(seed, policy, block, mode):
    trace = make_trace(30, "lognormal", mean_prompt=20, mean_output=30, max_len=128, seed=seed)
    r = simulate(
        trace,
        policy,
        budget_tokens=512,
        block_size=block,
        max_len=128,
        max_batch=8,
        preemption=mode,
    )
    assert r.completed == len(trace) and r.completed_by_step[-1] == len(trace)
    assert max(r.batch_by_step) <= 8
    # A request holds P + g - 1 tokens at its g-th step; preemptions only add steps.
    assert r.used >= sum(
        q.max_new_tokens * len(q.prompt) + q.max_new_tokens * (q.max_new_tokens - 1) // 2
        for q in trace
    )
    assert all(len(q.output) == 0 for q in trace)  # the trace's requests are copied, not run
    if policy == "paged" and mode == "recompute":
        assert r.swapped_blocks == 0
    if policy != "paged":
        assert r.final_block == 0 and r.swapped_blocks == 0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: simulate(HAND_TRACE, "buddy", 64), ValueError, "policy must be one of"),
        (
            lambda: simulate(HAND_TRACE, "reserve-max", 16, max_len=32),
            ValueError,
            "cannot hold one request",
        ),
        (
            lambda: simulate(HAND_TRACE, "paged", 64, max_len=8),
            ValueError,
            "max_len .* must be >= the longest",
        ),
        (lambda: simulate([(0, 5, 1)], "paged", 64), TypeError, r"trace\[0\] must be"),
        (
            lambda: simulate([req(0, 5, 1)], "reserve-estimate", 64, estimate=0),
            ValueError,
            "estimate must be an int >= 1",
        ),
        (lambda: simulate([req(0, 50, 10)], "paged", 16), ValueError, "cannot hold one request"),
        (
            lambda: simulate(HAND_TRACE, "paged", 64, preemption="drop"),
            ValueError,
            "preemption must be one of",
        ),
        (lambda: make_trace(4, "zipf"), ValueError, "distribution must be one of"),
        (lambda: make_trace(-1), ValueError, "n must be an int >= 0"),
        (lambda: make_trace(2.0), TypeError, "n must be an int"),
        (lambda: req(0, 5, 0), ValueError, r"max_new_tokens must be an int >= 1"),
        (lambda: Request(0, [], 1), ValueError, "token_ids must hold at least one token id"),
        (lambda: Request(-1, [1], 1), ValueError, "id must be an int >= 0"),
    ],
)
def test_simulator_and_trace_refuse_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_predicted_waste_is_the_simulation_without_queueing():
    """With room for every request at once nothing queues or is preempted: the simulator's
    time-weighted waste is the per-request formula exactly, for both policies, and paged waste keeps
    to its bound.
    """
    trace = make_trace(12, "lognormal", mean_prompt=10, mean_output=20, max_len=96, seed=4)
    for policy, block in (("reserve-max", 16), ("paged", 16), ("paged", 5)):
        sim = simulate(trace, policy, budget_tokens=12 * 96, block_size=block, max_len=96)
        assert sim.preemptions == 0
        assert sim.waste_fraction == pytest.approx(predicted_waste(trace, policy, block, 96))
        if policy == "paged":
            assert within_waste_bound(sim.waste_fraction, block, sim.mean_tokens_held)
