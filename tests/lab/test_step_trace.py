"""kvlab.lab.step_trace: the trace reports kvlab.theory's work for the model, and round-trips
through JSON."""

import dataclasses
import json

import pytest
import torch

import kvlab
from kvlab.lab.step_trace import StepTrace, trace_step, trace_steps
from kvlab.theory.work import STEP_METHODS, step_work


@pytest.fixture(scope="module")
def small():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=64,
        q_heads=4,
        kv_heads=2,
        intermediate=128,
        vocab=256,
        device="cpu",
    )


def _ids(model, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


@pytest.mark.parametrize("method", STEP_METHODS)
@pytest.mark.parametrize("batch,context", [(1, 5), (3, 17)])
def test_trace_reports_roofline_work_for_the_model(small, method, batch, context):
    trace = trace_step(small, _ids(small, batch, 4), context, method, warmup=0, reps=1)
    w = 4  # fp32
    assert (trace.batch, trace.context) == (batch, context)
    assert trace.work == step_work(small.shape, batch, context, method, w, w)
    assert 0 < trace.busy_s <= trace.traced_s + 1e-9
    assert trace.step_s > 0 and trace.ops and trace.timeline
    assert all(0 <= start <= end <= trace.traced_s + 1e-9 for _, start, end in trace.timeline)
    assert trace.achieved_bandwidth == trace.work.total_bytes / trace.step_s


def test_paged_trace_leaves_the_model_as_it_was(small):
    before = small.config._attn_implementation
    trace_step(small, _ids(small, 1, 6), method="paged", warmup=0, reps=1)
    assert small.config._attn_implementation == before
    ids = _ids(small, 1, 6)
    assert torch.equal(
        kvlab.cached_decode(small, ids, 4),
        small.generate(ids, max_new_tokens=4, do_sample=False)[:, 6:],
    )


def test_trace_round_trips_through_json(small):
    trace = trace_step(small, _ids(small, 1, 4), method="cached", warmup=0, reps=1)
    again = StepTrace.from_json(json.loads(json.dumps(trace.to_json())))
    assert dataclasses.replace(again, step_times=trace.step_times) == trace


def test_traces_in_alternation_match_one_method_traced_alone(small):
    ids = _ids(small, 2, 5)
    both = trace_steps(small, ids, ("static", "cached"), 9, warmup=0, reps=2, traces=3)
    assert list(both) == ["static", "cached"]
    for method, trace in both.items():
        alone = trace_step(small, ids, 9, method, warmup=0, reps=1, traces=1)
        assert (trace.method, trace.batch, trace.context) == (method, 2, 9)
        assert trace.work == alone.work and len(trace.busy_fractions) == 3
        assert len(trace.step_times) >= 2 and 0 < trace.busy_s <= trace.traced_s + 1e-9


@pytest.mark.parametrize(
    "methods", [(), ("cached", "cached"), "cached", ("cached", "nonsense"), ("cached", "paged")]
)
def test_traces_in_alternation_refuse_a_bad_list_of_methods(small, methods):
    with pytest.raises(ValueError, match="method"):
        trace_steps(small, _ids(small, 1, 4), methods, warmup=0, reps=1, traces=1)
