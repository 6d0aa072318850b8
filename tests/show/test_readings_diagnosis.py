"""kvlab.show.readings.diagnosis and section 9.8's figures, fed both outcomes on made-up numbers.
"""

import dataclasses

from kvlab.lab.diagnose import Diagnosis, Step
from kvlab.lab.step_trace import StepTrace
from kvlab.show.readings.diagnosis import reading_batch, reading_diagnosis, reading_methods, reading_timeline, reading_workloads
from kvlab.theory import roofline
from kvlab.theory.verdict import BatchPoint, KV_SHARE_THRESHOLD, Target, lever
from kvlab.theory.work import STEP_METHODS, StepWork


def _trace(busy, traced=0.010, method="cached", kv=0.0, device="CPU: test"):
    return StepTrace(method, 1, 64, device, 0.008, traced, busy * traced, (("aten::mm", 0.004, 10),),
                     (("aten::mm", 0.0, 0.004),), StepWork(8e7, kv, 0.0, 4e7))


def _diagnosis(verdict, method="cached", because="because"):
    return Diagnosis(method, 1, 32, 16, 40, (Step("x", {}, {}, "y"),) * 5, verdict, because, lever(verdict, method),
                     1e9, 0.3, 0.05, _trace(0.9), (), 1, Target())


def _point(batch, tpot, ttft=0.01, fits=True):
    return BatchPoint(batch, ttft, tpot, roofline.Admission(1.0, 1.0 if fits else 10.0, 5.0))


def test_reading_timeline_both_branches():
    fewer = reading_timeline(_trace(0.5), _trace(0.9, method="static"), gpu=False)
    assert "left" in fewer and "Python dispatch" in fewer and "no CUDA graphs" in fewer
    same = reading_timeline(_trace(0.9), _trace(0.5, method="static"), gpu=True)
    assert "not clearly less idle" in same and "launch gaps" in same and "compiled and replayed" in same


def test_reading_batch_both_branches():
    grew = reading_batch([_point(1, 0.010), _point(4, 0.012)], Target(tpot=0.011), 1, 1000)
    assert "rose 3.3 times" in grew and "useful batch is 1" in grew and "1,000" in grew
    flat = reading_batch([_point(1, 0.010), _point(4, 0.038)], Target(tpot=0.001), None, 5)
    assert "rose only" in flat and "No measured batch met TPOT" in flat


def test_reading_workloads_both_branches():
    differ = reading_workloads({"chat": _diagnosis("overhead"), "rag": _diagnosis("kv"), "batch": _diagnosis("weights")})
    assert "different verdict" in differ
    same = reading_workloads({"chat": _diagnosis("weights"), "rag": _diagnosis("weights")})
    assert "Only 1 distinct verdict" in same


def test_reading_methods_both_branches():
    ds = {m: _diagnosis("weights", m) for m in STEP_METHODS}
    faster = reading_methods(ds, generate_tokens_per_s=50.0, best_tokens_per_s=60.0, best="static")
    assert "no faster" in faster and "1.20 times" in faster
    slower = reading_methods(ds, generate_tokens_per_s=60.0, best_tokens_per_s=50.0, best="static")
    assert "expectation was parity" in slower


def test_reading_diagnosis_names_verdict_measurements_and_lever():
    text = reading_diagnosis(_diagnosis("kv", because="the KV cache is 80% of the bytes"))
    assert "`kv`" in text and "80% of the bytes" in text and "30%" in text and "kvlab.cache.quantized" in text
    assert "above 100%" not in text
    over = dataclasses.replace(_diagnosis("compute", "naive"), flops_fraction=1.3)
    assert "130%" in reading_diagnosis(over) and "above 100%" in reading_diagnosis(over)
    assert KV_SHARE_THRESHOLD == 0.5


def test_figures_draw_from_fake_numbers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvlab.show import plots

    fig = plots.step_timelines({"one": {"cached": _trace(0.5), "static": _trace(0.9, method="static")}})
    assert any(t.get_gid() == "kvlab-stamp" for t in fig.texts)
    fig = plots.useful_batch_figure([_point(1, 0.010), _point(4, 0.012), _point(16, 0.03, fits=False)],
                                    0.02, 8, 4, "sweep")
    assert any(t.get_gid() == "kvlab-stamp" for t in fig.texts)
    d = _diagnosis("kv")
    d = dataclasses.replace(d, sweep=(_point(1, 0.01),))
    fig = plots.workload_bytes({"a": d, "b": d}, selected="a")
    assert len(fig.axes) == 2
    assert plots._op_kind("aten::mm") == "matmul" and plots._op_kind("aten::cat") == "copy"
    plt.close("all")
