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
from kvlab.theory.agreement import edges
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
    lo_d, lo_a, hi_a, hi_d = edges(expected, 0.0)  # one trace each: no spread, the 10% floor
    same = reading_timeline(cached, _idle_trace(expected, 120), gpu=False)
    assert "As the model says" in same and "index_copy_" in same and "Python dispatch" in same
    assert "120 against 100" in same and "expected_static_idle" in same
    more = reading_timeline(cached, _idle_trace(1.1 * hi_d, 120), gpu=False)
    assert "More idle than its operator count predicts, beyond the traces' scatter" in more
    assert "likely" not in more  # what was not measured is not offered as the reason
    unsure = reading_timeline(cached, _idle_trace((hi_a * hi_d) ** 0.5, 120), gpu=False)
    assert "cannot tell" in unsure and "The traces scatter too much to tell" in unsure
    unsure_low = reading_timeline(cached, _idle_trace((lo_d * lo_a) ** 0.5, 120), gpu=False)
    assert "cannot tell" in unsure_low and "The traces scatter too much to tell" in unsure_low
    less = reading_timeline(cached, _idle_trace(0.9 * lo_d, 120), gpu=False)
    assert "Less idle than its operator count predicts, beyond the traces' scatter" in less
    for agrees in (1.1 * lo_a, 0.9 * hi_a):
        assert "As the model says" in reading_timeline(cached, _idle_trace(agrees, 120), gpu=False)
    # Replayed as one CUDA graph: far less idle than the cached step is the model.
    g_lo_d, g_lo_a, _, _ = edges(cached.idle_s, 0.0)
    graphed = reading_timeline(cached, _idle_trace(0.9 * g_lo_d, 120), gpu=True)
    assert "As expected" in graphed and "launch gaps" in graphed
    not_graphed = reading_timeline(cached, _idle_trace(1.01 * g_lo_a, 120), gpu=True)
    assert "Not clearly less idle, against the model" in not_graphed
    unsure = reading_timeline(cached, _idle_trace((g_lo_a * g_lo_d) ** 0.5, 120), gpu=True)
    assert "cannot tell" in unsure and "Not clearly less idle" in unsure


def _batch_case(measured_16, spread=0.15):
    """A sweep of batches 1 and 16 whose batch-16 TPOT is ``measured_16``, with the prediction of
    ``verdict.batch_tpot`` for weights of 80 MB at 10 GB/s and 40 MFLOP per sequence."""
    rates = {1: 1e10, 16: 2e10}
    pred = [0.010, verdict.batch_tpot(0.010, 16, 80e6, 1e5, 40e6, 1e10, 1e10, 2e10)]
    sweep = [_point(1, 0.010), _point(16, measured_16)]
    return sweep, pred, [spread, spread], rates


def test_reading_batch_on_every_side_of_the_roofline():
    sweep, pred, spreads, rates = _batch_case(0.0)
    lo_d, lo_a, hi_a, hi_d = edges(pred[1], spreads[1])
    args = (pred, spreads, 1e10, rates, 80e6, 40e6)

    sweep[1] = _point(16, pred[1])
    agrees = reading_batch(sweep, Target(tpot=0.011), 1, 1000, *args)
    assert "Over the sweep the model agrees" in agrees and "from batch 16 the products" in agrees
    assert "useful batch is 1" in agrees and "1,000" in agrees and "batch_tpot" in agrees
    assert "flat region" not in agrees
    gpu = reading_batch(sweep, Target(), 1, 1000, *args, gpu_ridge=295.4)
    assert "near batch 295 for bf16" in gpu and "H100 datasheet" in gpu

    sweep[1] = _point(16, 1.1 * hi_d)
    above = reading_batch(sweep, Target(tpot=0.001), None, 5, *args)
    assert "the model disagrees: from batch 1 to 16 TPOT grew by" in above
    assert "No measured batch met TPOT" in above
    assert "misses a term that grows with the batch" in above

    sweep[1] = _point(16, 0.9 * lo_d)
    below = reading_batch(sweep, Target(), 16, 5, *args)
    assert "disagrees: TPOT grew less" in below and "no latency limit" in below

    for inside in ((hi_a * hi_d) ** 0.5, (lo_a * lo_d) ** 0.5):
        sweep[1] = _point(16, inside)
        assert "cannot tell" in reading_batch(sweep, Target(), 16, 5, *args)
    # Just inside the agreement band, on either side.
    for edge in (0.99 * hi_a, 1.01 * lo_a):
        sweep[1] = _point(16, edge)
        assert "model agrees" in reading_batch(sweep, Target(), 16, 5, *args)


def test_reading_batch_names_the_point_that_decided_the_sweep():
    # Batch 2 is further from the model but inside its wide band; batch 16 misses clearly.
    rates = {1: 1e10, 2: 1e10, 16: 2e10}
    pred = [0.010] + [
        verdict.batch_tpot(0.010, b, 80e6, 1e5, 40e6, 1e10, 1e10, rates[b]) for b in (2, 16)
    ]
    sweep = [_point(1, 0.010), _point(2, 1.9 * pred[1]), _point(16, 1.5 * pred[2])]
    text = reading_batch(sweep, Target(), 16, 5, pred, [0.05, 0.9, 0.05], 1e10, rates, 80e6, 40e6)
    assert "the furthest point, batch 16, is 1.5 times the prediction: above it" in text
    assert "from batch 1 to 16 TPOT grew" in text


def test_reading_diagnosis_says_when_a_run_cannot_tell():
    firm = dataclasses.replace(_diagnosis("weights"), verdicts=("weights",))
    text = reading_diagnosis(firm)
    assert "verdict `weights`." in text and "Next lever" in text and "cannot tell" not in text
    torn = dataclasses.replace(_diagnosis("weights"), verdicts=("overhead", "weights"))
    text = reading_diagnosis(torn)
    assert "`overhead` or `weights` (cannot tell)" in text and "Both levers apply" in text
    both = reading_workloads({"chat": torn, "rag": _diagnosis("kv")})
    assert "chat: `overhead` or `weights` (cannot tell)" in both


def test_reading_workloads_both_branches():
    differ = reading_workloads(
        {"chat": _diagnosis("overhead"), "rag": _diagnosis("kv"), "batch": _diagnosis("weights")}
    )
    assert "different verdict" in differ
    same = reading_workloads({"chat": _diagnosis("weights"), "rag": _diagnosis("weights")})
    assert "Only 1 distinct verdicts" in same and "cache, yet" not in same
    heavy = dataclasses.replace(_diagnosis("overhead"), trace=_trace(0.9, kv=4e8))
    far = reading_workloads({"chat": _diagnosis("overhead"), "rag": heavy})
    assert "The rag step's bytes are 83% cache, yet it moved them at 30%" in far
    full = dataclasses.replace(_diagnosis("capacity"), trace=_trace(0.9, kv=4e8))
    assert "cache, yet" not in reading_workloads({"chat": _diagnosis("overhead"), "batch": full})


def test_reading_methods_on_every_side_of_parity():
    ds = {m: _diagnosis("weights", m) for m in STEP_METHODS}
    lo_d, lo_a, hi_a, hi_d = edges(50.0, 0.1)

    def text(best):
        return reading_methods(ds, 50.0, best, "static", 0.1)

    parity = text(50.0)
    assert "agrees" in parity and "runs the same computation" in parity and "spread 10%" in parity
    faster = text(1.1 * hi_d)
    assert "above it" in faster and "faster than parity" in faster and "logits" in faster
    assert "cannot tell" in text((hi_a * hi_d) ** 0.5)
    slower = text(0.9 * lo_d)
    assert "`generate` ran faster than parity" in slower
    assert "cannot tell" in text((lo_a * lo_d) ** 0.5)


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


def test_idle_spread_is_the_median_trace_against_the_kept_one():
    from dataclasses import replace

    kept_first = (0.8, 0.6, 0.7, 0.75, 0.5)  # idle shares 0.2, 0.4, 0.3, 0.25, 0.5: median 0.3
    trace = replace(_idle_trace(0.002, 10), busy_fractions=kept_first)
    assert abs(trace.idle_spread - 0.5) < 1e-12  # (0.3 - 0.2) / 0.2
    assert replace(trace, busy_fractions=(0.8,)).idle_spread == 0.0  # one trace
    assert replace(trace, busy_fractions=(1.0, 0.9)).idle_spread == 0.0  # no gaps kept
