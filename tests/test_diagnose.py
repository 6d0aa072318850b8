"""Section 9.8's diagnosis path: its bytes and FLOPs agree with kvlab.theory.roofline, its repeatable step
decodes the same token as Hugging Face ``generate``, its verdict is a plain function of the
measurements (tested on numbers, never on timing thresholds), and bad arguments are refused."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.theory import roofline
from kvlab.lab.diagnose import KV_SHARE_THRESHOLD, LEVERS, METHODS, VERDICTS, BatchPoint, Diagnosis, Step, StepTrace, StepWork, Target, _Stepper, _tile, capacity_batch, decide, diagnose, lever, step_work, this_machine, trace_step, useful_batch
from kvlab.show.readings.diagnosis import reading_batch, reading_diagnosis, reading_methods, reading_timeline, reading_workloads
from kvlab.theory.shapes import SHAPES, ModelShape


@pytest.fixture(scope="module")
def small():
    return kvlab.tiny_model("llama", layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=256,
                            device="cpu")


def _ids(model, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


# --------------------------------------------------------------------------- bytes and FLOPs


@pytest.mark.parametrize("key", ["llama-3-8b", "llama-2-13b", "mistral-7b", "deepseek-v2", "qwen2.5-0.5b"])
@pytest.mark.parametrize("batch,context", [(1, 1), (3, 517), (32, 8192), (7, 131072)])
@pytest.mark.parametrize("w", [1, 2, 4])
def test_step_work_equals_roofline(key, batch, context, w):
    shape = SHAPES[key]
    for method in ("cached", "static", "paged"):
        work = step_work(shape, batch, context, method, w, w)
        assert work.weights_read == roofline.step_bytes(shape, batch, context, w, w).weights
        assert work.kv_read == roofline.step_bytes(shape, batch, context, w, w).kv
        assert work.kv_written == batch * roofline.kv_bytes_per_token(shape, w)
        assert work.flops == roofline.step_flops(shape, batch, context).total


@st.composite
def shapes(draw):
    kv = draw(st.integers(1, 16))
    return ModelShape("random", draw(st.integers(1, 96)), kv * draw(st.integers(1, 8)), kv,
                      draw(st.sampled_from([32, 64, 80, 128])), draw(st.integers(64, 16384)),
                      float(draw(st.integers(10**6, 10**12))), draw(st.integers(100, 300000)),
                      window=draw(st.one_of(st.none(), st.integers(1, 8192))))


@settings(max_examples=200, deadline=None)
@given(shape=shapes(), batch=st.integers(1, 512), context=st.integers(1, 10**6), w=st.sampled_from([1, 2, 4]))
def test_step_work_equals_roofline_for_random_shapes(shape, batch, context, w):
    work = step_work(shape, batch, context, "cached", w, w)
    read = roofline.step_bytes(shape, batch, context, w, w)
    assert (work.weights_read, work.kv_read) == (read.weights, read.kv)
    assert work.kv_written == batch * roofline.kv_bytes_per_token(shape, w)
    assert work.flops == roofline.step_flops(shape, batch, context).total
    assert 0 <= work.kv_share <= 1


@pytest.mark.parametrize("key", ["llama-3-8b", "mistral-7b"])
@pytest.mark.parametrize("batch,context", [(1, 1), (2, 37), (3, 5000)])
def test_naive_step_flops_from_the_definition(key, batch, context):
    shape = SHAPES[key]
    n = context + 1
    attention = 4 * shape.layers * shape.q_heads * shape.head_dim
    # Position i (1-based) of the full pass attends to min(i, window) keys; every position does 2P.
    expected = batch * sum(2 * shape.params + attention * min(i, shape.window or i) for i in range(1, n + 1))
    work = step_work(shape, batch, context, "naive", 2, 2)
    assert work.flops == pytest.approx(expected, rel=1e-12)
    assert (work.kv_read, work.kv_written) == (0, 0)
    assert work.weights_read == roofline.step_bytes(shape, batch, context).weights


@pytest.mark.parametrize("method", METHODS)
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


# --------------------------------------------------------------------------- the repeatable step


@pytest.mark.parametrize("method", METHODS)
def test_repeatable_step_decodes_what_generate_decodes(small, method):
    ids = _tile(_ids(small, 2, 5, seed=3), 11)
    fed = torch.cat([ids, ids[:, -1:]], dim=1)  # the step feeds the last token once more
    expected = small.generate(fed, attention_mask=torch.ones_like(fed), max_new_tokens=1, do_sample=False)[:, -1]
    stepper = _Stepper(small, ids, method)
    try:
        for _ in range(3):  # reset() puts the cache back: every repeat gives the same token
            got = stepper.step()
            stepper.reset()
            assert torch.equal(torch.as_tensor(got).reshape(-1), expected), method
    finally:
        stepper.close()
    assert small.config._attn_implementation != "kvlab_paged"


def test_paged_trace_leaves_the_model_as_it_was(small):
    before = small.config._attn_implementation
    trace_step(small, _ids(small, 1, 6), method="paged", warmup=0, reps=1)
    assert small.config._attn_implementation == before
    ids = _ids(small, 1, 6)
    assert torch.equal(kvlab.cached_decode(small, ids, 4),
                       small.generate(ids, max_new_tokens=4, do_sample=False)[:, 6:])


# --------------------------------------------------------------------------- verdicts


def test_decide_each_branch():
    base = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    assert decide(**base)[0] == "weights"
    assert decide(**{**base, "kv_share": 0.8})[0] == "kv"
    assert decide(**{**base, "flops_fraction": 0.7})[0] == "compute"
    assert decide(**{**base, "busy_fraction": 0.2})[0] == "overhead"
    assert decide(**{**base, "bandwidth_fraction": 0.01, "flops_fraction": 0.01})[0] == "overhead"
    assert decide(**base, admitted=False)[0] == "capacity"
    short = roofline.Admission(weights=4e9, kv=7e9, available=10e9)
    verdict, because = decide(**base, admitted=short)
    assert verdict == "capacity" and "does not fit by 1.0 GB" in because
    verdict, because = decide(**{**base, "kv_share": 0.8})
    assert "60%" in because and "80%" in because  # names the measurements it rests on


def test_decide_refuses_bad_numbers():
    good = dict(busy_fraction=0.9, bandwidth_fraction=0.6, flops_fraction=0.1, kv_share=0.1)
    with pytest.raises(ValueError, match="kv_share must be in"):
        decide(**{**good, "kv_share": 1.5})
    with pytest.raises(ValueError, match="busy_fraction must be a finite number >= 0"):
        decide(**{**good, "busy_fraction": -0.1})
    with pytest.raises(ValueError, match="flops_fraction"):
        decide(**{**good, "flops_fraction": float("nan")})
    with pytest.raises(TypeError, match="bandwidth_fraction must be a real number"):
        decide(**{**good, "bandwidth_fraction": "fast"})


def test_every_lever_names_a_function_or_section():
    for verdict in VERDICTS:
        for method in METHODS:
            text = lever(verdict, method)
            assert "kvlab." in text or "section" in text or "step 4" in text, (verdict, method)
    assert lever("compute", "naive") == LEVERS["compute-naive"]
    with pytest.raises(ValueError, match="verdict must be one of"):
        lever("slow", "cached")


def test_overhead_bound_model_gets_overhead(small):
    tiny = kvlab.tiny_model("llama", layers=1, hidden=16, q_heads=2, kv_heads=1, intermediate=32, vocab=32,
                            device="cpu")
    d = diagnose(tiny, _ids(tiny, 1, 8), 4, batches=[1])
    assert d.verdict == "overhead", str(d)
    assert [s.name for s in d.steps] == ["naive and cached decode (one sequence)", "per-token trace",
                                         "stable loop (compile, CUDA graph)", "useful batch size",
                                         "cache-memory pressure"]
    assert d.lever == lever("overhead", "cached")


def test_kv_dominated_model():
    # Many KV heads, a long context and small weights: the cache is most of each step's bytes.
    model = kvlab.tiny_model("llama", layers=1, hidden=64, q_heads=16, kv_heads=16, head_dim=64, intermediate=64,
                             vocab=64, device="cpu")
    d = diagnose(model, _ids(model, 2, 1024), 4, method="cached", batches=[2])
    assert d.trace.work.kv_share > 0.9
    assert d.trace.work.kv_read > 10 * d.trace.work.weights_read
    # The verdict follows from the measurements; on a quiet machine it is "kv", but the busy fraction
    # of a shared CPU can tip it to "overhead", so assert the rule rather than a timing.
    expected = decide(busy_fraction=d.trace.busy_fraction, bandwidth_fraction=d.bandwidth_fraction,
                      flops_fraction=d.flops_fraction, kv_share=d.trace.work.kv_share)[0]
    assert d.verdict == expected and expected in ("kv", "overhead", "compute")
    assert d.achieved_bandwidth == d.trace.achieved_bandwidth
    assert d.bandwidth_fraction == pytest.approx(d.achieved_bandwidth / kvlab.calibrate().copy_bytes_per_s)


def test_capacity_verdict_when_the_cache_does_not_fit(small):
    need = roofline.admitted(small.shape, this_machine(), 2, 12, 4, 4).needed
    d = diagnose(small, _ids(small, 2, 8), 4, target=Target(memory=need * 0.99), batches=[1, 2])
    assert d.verdict == "capacity"
    assert [p.batch for p in d.sweep] == [1, 2]
    assert bool(d.sweep[0].admission) and not d.sweep[1].admission
    assert d.useful_batch == 1


# --------------------------------------------------------------------------- step 4 arithmetic


def _point(batch, tpot, ttft=0.01, fits=True):
    return BatchPoint(batch, ttft, tpot, roofline.Admission(1.0, 1.0 if fits else 10.0, 5.0))


def test_useful_batch_under_a_target():
    sweep = [_point(1, 0.010), _point(2, 0.012), _point(4, 0.020), _point(8, 0.045, fits=False)]
    assert useful_batch(sweep, Target(tpot=0.015)) == 2
    assert useful_batch(sweep, Target(tpot=0.1)) == 4  # batch 8 would meet it but does not fit
    assert useful_batch(sweep, Target(tpot=0.001)) is None
    assert useful_batch(sweep, Target(ttft=0.001)) is None
    assert useful_batch(sweep, Target()) == 4  # most tokens per second among those that fit


@pytest.mark.parametrize("key", ["llama-3-8b", "llama-2-13b", "mistral-7b"])
@pytest.mark.parametrize("context", [1000, 32768, 131072])
def test_capacity_batch_is_the_admission_edge(key, context):
    shape, hw = SHAPES[key], kvlab.SPECS["h200"]
    b = capacity_batch(shape, hw, context, 2)
    assert b >= 1
    assert roofline.admitted(shape, hw, b, context)
    assert not roofline.admitted(shape, hw, b + 1, context)


def test_capacity_batch_zero_when_nothing_fits():
    assert capacity_batch(SHAPES["llama-3.1-405b"], kvlab.SPECS["l4"], 1000) == 0


# --------------------------------------------------------------------------- bad arguments


def test_bad_arguments_are_refused(small):
    ids = _ids(small, 1, 4)
    with pytest.raises(ValueError, match="method must be one of"):
        trace_step(small, ids, method="fast")
    with pytest.raises(TypeError, match="input_ids must hold integer token ids"):
        trace_step(small, ids.float())
    with pytest.raises(ValueError, match=r"input_ids must have shape \[batch >= 1, prompt_length >= 1\]"):
        trace_step(small, ids[0])
    with pytest.raises(ValueError, match="context must be an int >= 1, got 0"):
        trace_step(small, ids, 0)
    with pytest.raises(ValueError, match="context must be <= 4095"):
        trace_step(small, ids, 5000)
    with pytest.raises(TypeError, match="model must be a Hugging Face causal LM"):
        trace_step("llama", ids)
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        trace_step(small, ids, reps=0)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        diagnose(small, ids, 0)
    with pytest.raises(TypeError, match="target must be a kvlab.lab.diagnose.Target"):
        diagnose(small, ids, 2, target={"tpot": 0.1})
    with pytest.raises(ValueError, match="target.tpot must be a finite number > 0"):
        Target(tpot=-1)
    with pytest.raises(ValueError, match="batches must name at least one"):
        diagnose(small, ids, 2, batches=[])
    with pytest.raises(ValueError, match=r"batches\[i\] must be an int >= 1"):
        diagnose(small, ids, 2, batches=[0])
    with pytest.raises(ValueError, match="method must be one of"):
        step_work(SHAPES["llama-3-8b"], 1, 1, "fast")
    assert small.config._attn_implementation != "kvlab_paged"


def test_trace_round_trips_through_json(small):
    trace = trace_step(small, _ids(small, 1, 4), method="cached", warmup=0, reps=1)
    again = StepTrace.from_json(json.loads(json.dumps(trace.to_json())))
    assert dataclasses.replace(again, step_times=trace.step_times) == trace


# --------------------------------------------------------------------------- readings, both branches


def _trace(busy, traced=0.010, method="cached", kv=0.0, device="CPU: test"):
    return StepTrace(method, 1, 64, device, 0.008, traced, busy * traced, (("aten::mm", 0.004, 10),),
                     (("aten::mm", 0.0, 0.004),), StepWork(8e7, kv, 0.0, 4e7))


def _diagnosis(verdict, method="cached", because="because"):
    return Diagnosis(method, 1, 32, 16, 40, (Step("x", {}, {}, "y"),) * 5, verdict, because, lever(verdict, method),
                     1e9, 0.3, 0.05, _trace(0.9), (), 1, Target())


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
    ds = {m: _diagnosis("weights", m) for m in METHODS}
    faster = reading_methods(ds, generate_tokens_per_s=50.0, best_tokens_per_s=60.0, best="static")
    assert "no faster" in faster and "1.20 times" in faster
    slower = reading_methods(ds, generate_tokens_per_s=60.0, best_tokens_per_s=50.0, best="static")
    assert "expectation was parity" in slower


def test_reading_diagnosis_names_verdict_measurements_and_lever():
    text = reading_diagnosis(_diagnosis("kv", because="the KV cache is 80% of the bytes"))
    assert "`kv`" in text and "80% of the bytes" in text and "30%" in text and "kvlab.cache.longctx" in text
    assert "above 100%" not in text
    over = dataclasses.replace(_diagnosis("compute", "naive"), flops_fraction=1.3)
    assert "130%" in reading_diagnosis(over) and "above 100%" in reading_diagnosis(over)
    assert KV_SHARE_THRESHOLD == 0.5


# --------------------------------------------------------------------------- the command line


def test_cli_diagnose_prints_five_steps_and_a_verdict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kvlab", "diagnose", "--size", "cpu", "--context", "16",
                          "--new-tokens", "4", "--tpot-ms", "500", "--save-traces", str(tmp_path / "t.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for i in range(1, 6):
        assert f"\n{i}. " in out.stdout
    assert "verdict:" in out.stdout and "lever:" in out.stdout
    saved = json.loads((tmp_path / "t.json").read_text())
    assert set(saved["traces"]) == {"cached", "static"} and "device" in saved["stamp"]
    assert StepTrace.from_json(saved["traces"]["static"]).method == "static"
    bad = subprocess.run([sys.executable, "-m", "kvlab", "diagnose", "--method", "fast"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--method must be one of" in bad.stderr
    zero = subprocess.run([sys.executable, "-m", "kvlab", "diagnose", "--batch", "0"],
                          capture_output=True, text=True, timeout=300)
    assert zero.returncode == 2 and "--batch, --context and --new-tokens must be >= 1" in zero.stderr


def test_batch_sweep_points_and_admission(small):
    ids = _ids(small, 1, 6)
    need_two = roofline.admitted(small.shape, this_machine(), 2, 6 + 8, 4, 4).needed
    sweep = kvlab.lab.diagnose.batch_sweep(small, ids, 8, [1, 2, 3], memory=need_two)
    assert [p.batch for p in sweep] == [1, 2, 3]
    assert [bool(p.admission) for p in sweep] == [True, True, False]
    assert all(p.ttft > 0 and p.tpot > 0 and p.tokens_per_s == p.batch / p.tpot for p in sweep)
    with pytest.raises(ValueError, match="batches must name at least one"):
        kvlab.lab.diagnose.batch_sweep(small, ids, 8, [])


def test_failed_paged_setup_restores_the_attention(small, monkeypatch):
    import kvlab.serving.paged_decode as paged

    before = small.config._attn_implementation

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(paged, "prefill", broken)
    with pytest.raises(RuntimeError, match="injected failure"):
        trace_step(small, _ids(small, 1, 4), method="paged")
    assert small.config._attn_implementation == before


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


def test_step_findings_both_ways():
    from kvlab.lab.diagnose import _step1_finding, _step3_finding, _step5_finding

    assert "recomputation was the limit" in _step1_finding(20.0, 73.0)
    assert "bought only 1.2x" in _step1_finding(1.2, 73.0)
    assert "launch-bound (busy 20%)" in _step3_finding(0.2, 1.0, 2.0, "cached", gpu=True)
    assert "not launch-bound" in _step3_finding(0.9, 1.0, 1.1, "paged", gpu=False)
    assert "as fast as the paged one" in _step3_finding(0.9, 1.0, 1.1, "paged", gpu=False)
    fits, full = roofline.Admission(1.0, 1.0, 5.0), roofline.Admission(1.0, 9.0, 5.0)
    assert "does not fit" in _step5_finding(full, 0.9)
    assert "would shorten the step" in _step5_finding(fits, 0.9)
    assert "not the limit yet" in _step5_finding(fits, 0.1)


@pytest.mark.parametrize("method", METHODS)
def test_diagnose_walks_every_loop(small, method):
    ids = _ids(small, 2, 6)
    d = diagnose(small, ids, 4, method=method, batches=[1, 2], target=Target(tpot=10.0))
    assert d.method == method and d.verdict in VERDICTS and len(d.steps) == 5
    assert d.context == 6 + 4 // 2
    assert d.trace.work == step_work(small.shape, 2, d.context, method, 4, 4)
    assert d.useful_batch == 2  # both fit and meet a 10 s TPOT
    expected = decide(busy_fraction=d.trace.busy_fraction, bandwidth_fraction=d.bandwidth_fraction,
                      flops_fraction=d.flops_fraction, kv_share=d.trace.work.kv_share)
    assert (d.verdict, d.because) == expected
    assert "verdict:" in str(d) and small.config._attn_implementation != "kvlab_paged"
