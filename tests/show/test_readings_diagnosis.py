"""kvlab.show.readings.diagnosis and section 9.8's figures: every decision fed inputs on both sides
of the boundary that its model in kvlab.theory.verdict puts there.
"""

import dataclasses

from kvlab.lab.diagnose import Diagnosis, Step
from kvlab.lab.step_trace import StepTrace
from kvlab.show.readings.diagnosis import (
    reading_batch,
    reading_diagnosis,
    reading_methods,
    reading_real_model,
    reading_timeline,
    reading_workloads,
)
from kvlab.theory import roofline, verdict
from kvlab.theory.agreement import factor_edges
from kvlab.theory.verdict import KV_SHARE_THRESHOLD, BatchPoint, Target, lever
from kvlab.theory.work import STEP_METHODS, StepWork


def _trace(busy, traced=0.010, method="cached", kv=0.0, device="CPU: test", ops=1):
    return StepTrace(
        method,
        1,
        64,
        device,
        0.008,
        traced,
        busy * traced,
        (("aten::mm", 0.004, 10),),
        (("aten::mm", 0.0, 0.004),) * ops,
        StepWork(8e7, kv, 0.0, 4e7),
    )


def _idle_trace(idle, ops, method="static", traced=0.010):
    """A trace of ``ops`` operators idle for ``idle`` seconds of ``traced``."""
    return StepTrace(
        method,
        1,
        64,
        "CPU: test",
        0.008,
        traced,
        traced - idle,
        (("aten::mm", 0.004, 10),),
        (("aten::mm", 0.0, 0.004),) * ops,
        StepWork(8e7, 0.0, 0.0, 4e7),
    )


def _diagnosis(verdict, method="cached", because="because"):
    return Diagnosis(
        method,
        1,
        32,
        16,
        40,
        (Step("x", {}, {}, "y"),) * 5,
        verdict,
        because,
        lever(verdict, method),
        1e9,
        0.3,
        0.05,
        _trace(0.9),
        (),
        1,
        Target(),
    )


def _point(batch, tpot, ttft=0.01, fits=True):
    return BatchPoint(batch, ttft, tpot, roofline.Admission(1.0, 1.0 if fits else 10.0, 5.0))


def test_reading_timeline_on_both_sides_of_the_stable_loop_model():
    cached = _idle_trace(1e-3, 100, "cached")
    expected = verdict.expected_static_idle(
        cached.idle_s, 100, 120
    )  # eager: idle scales with the operators
    low, high = factor_edges(expected, verdict.IDLE_TOLERANCE)
    same = reading_timeline(cached, _idle_trace(expected, 120), gpu=False)
    assert "As the model says" in same and "index_copy_" in same and "Python dispatch" in same
    assert "120 against 100" in same and "expected_static_idle" in same
    more = reading_timeline(cached, _idle_trace(1.1 * high, 120), gpu=False)
    assert "More idle than its operators explain" in more and "descheduled" in more
    less = reading_timeline(cached, _idle_trace(0.9 * low, 120), gpu=False)
    assert "Less idle than its operators predict" in less
    # Replayed as one CUDA graph: less idle than the cached step is the model, anything else is not.
    g_low, _ = factor_edges(cached.idle_s, verdict.IDLE_TOLERANCE)
    graphed = reading_timeline(cached, _idle_trace(0.9 * g_low, 120), gpu=True)
    assert "As expected" in graphed and "launch gaps" in graphed
    not_graphed = reading_timeline(cached, _idle_trace(1.1 * g_low, 120), gpu=True)
    assert "Not less idle, against the model" in not_graphed


def test_reading_batch_on_both_sides_of_the_shared_weight_model():
    seq_bytes, beta = 1e5, 1e10
    predicted = verdict.shared_weight_tpot(0.010, 4, seq_bytes, beta)
    low, high = factor_edges(predicted, verdict.BATCH_TOLERANCE)
    shared = reading_batch(
        [_point(1, 0.010), _point(4, predicted)], Target(tpot=0.011), 1, 1000, seq_bytes, beta
    )
    assert "as the model says" in shared and "useful batch is 1" in shared and "1,000" in shared
    assert "shared_weight_tpot" in shared and "100.0 kB" in shared
    grew = reading_batch(
        [_point(1, 0.010), _point(4, 1.1 * high)], Target(tpot=0.001), None, 5, seq_bytes, beta
    )
    assert "grew more than the model allows" in grew and "No measured batch met TPOT" in grew
    less = reading_batch([_point(1, 0.010), _point(4, 0.9 * low)], Target(), 4, 5, seq_bytes, beta)
    assert "grew less than even the cache bytes predict" in less and "no latency limit" in less


def test_reading_workloads_both_branches():
    differ = reading_workloads(
        {"chat": _diagnosis("overhead"), "rag": _diagnosis("kv"), "batch": _diagnosis("weights")}
    )
    assert "different verdict" in differ
    same = reading_workloads({"chat": _diagnosis("weights"), "rag": _diagnosis("weights")})
    assert "Only 1 distinct verdict" in same


def test_reading_methods_on_both_sides_of_parity():
    ds = {m: _diagnosis("weights", m) for m in STEP_METHODS}
    low, high = factor_edges(50.0, verdict.LOOP_TOLERANCE)
    parity = reading_methods(ds, generate_tokens_per_s=50.0, best_tokens_per_s=50.0, best="static")
    assert "Parity, as expected" in parity
    faster = reading_methods(
        ds, generate_tokens_per_s=50.0, best_tokens_per_s=1.1 * high, best="static"
    )
    assert "faster than parity allows" in faster and "logits processors" in faster
    slower = reading_methods(
        ds, generate_tokens_per_s=50.0, best_tokens_per_s=0.9 * low, best="static"
    )
    assert "`generate` was faster than parity allows" in slower


def test_reading_real_model_same_or_different_verdict():
    same = reading_real_model(
        _diagnosis("weights"), _diagnosis("weights"), "tiny-llama", "SmolLM2-135M-Instruct"
    )
    assert (
        "share the verdict" in same
        and "SmolLM2-135M-Instruct, cached loop: verdict `weights`" in same
    )
    differ = reading_real_model(
        _diagnosis("overhead"), _diagnosis("weights"), "tiny-llama", "SmolLM2"
    )
    assert "The verdicts differ" in differ and "the shapes differ" in differ


def test_reading_diagnosis_names_verdict_measurements_and_lever():
    text = reading_diagnosis(_diagnosis("kv", because="the KV cache is 80% of the bytes"))
    assert (
        "`kv`" in text
        and "80% of the bytes" in text
        and "30%" in text
        and "kvlab.cache.quantized" in text
    )
    assert "above 100%" not in text
    over = dataclasses.replace(_diagnosis("compute", "naive"), flops_fraction=1.1)
    assert "110%" in reading_diagnosis(over) and "above 100%" in reading_diagnosis(over)
    under = dataclasses.replace(_diagnosis("compute", "naive"), flops_fraction=0.9)
    assert "above 100%" not in reading_diagnosis(under)
    pinned = dataclasses.replace(_diagnosis("weights"), threads=1)
    assert "on 1 CPU thread (set for the measurement)" in reading_diagnosis(pinned)
    assert KV_SHARE_THRESHOLD == 0.5


def test_figures_draw_from_fake_numbers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvlab.show import plots

    fig = plots.step_timelines(
        {"one": {"cached": _trace(0.5), "static": _trace(0.9, method="static")}}
    )
    assert any(t.get_gid() == "kvlab-stamp" for t in fig.texts)
    fig = plots.useful_batch_figure(
        [_point(1, 0.010), _point(4, 0.012), _point(16, 0.03, fits=False)], 0.02, 8, 4, "sweep"
    )
    assert any(t.get_gid() == "kvlab-stamp" for t in fig.texts)
    d = _diagnosis("kv")
    d = dataclasses.replace(d, sweep=(_point(1, 0.01),))
    fig = plots.workload_bytes({"a": d, "b": d}, selected="a")
    assert len(fig.axes) == 2
    assert plots._op_kind("aten::mm") == "matmul" and plots._op_kind("aten::cat") == "copy"
    plt.close("all")
