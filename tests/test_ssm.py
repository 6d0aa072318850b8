"""Section 9.6: the recurrence, the selective scan in three orders, the decode step and its Triton
kernel, against an fp64 reference written from the definition, Hugging Face's pure-PyTorch Mamba,
and the seed's worked example."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache import ssm
from kvlab.versions import cache_kwargs, returned_cache
from kvlab.kernels import selective_state_update, selective_state_update_ref


# --- the seed's worked example ------------------------------------------------------------------

def test_seed_two_token_example_exactly():
    states, outputs = ssm.SEED_RECURRENCE.run(ssm.SEED_INPUTS)
    assert states == [(2.0, 4.0), (2.0, 3.0)]  # h1 = (2, 4), h2 = (2, 3)
    assert outputs == [6.0, 5.0]  # y1 = 6, y2 = 5
    h1, y1 = ssm.SEED_RECURRENCE.step((0.0, 0.0), 2.0)
    assert (h1, y1) == ((2.0, 4.0), 6.0)
    assert ssm.SEED_RECURRENCE.step(h1, 1.0) == ((2.0, 3.0), 5.0)
    assert tuple(states) == ssm.SEED_STATES and tuple(outputs) == ssm.SEED_OUTPUTS


def test_seed_recurrence_is_a_scan_in_every_order():
    r = ssm.SEED_RECURRENCE
    xs = torch.tensor(ssm.SEED_INPUTS, dtype=torch.float64)
    a = torch.tensor(r.decay, dtype=torch.float64).expand(len(xs), -1)
    b = xs[:, None] * torch.tensor(r.gain, dtype=torch.float64)
    for method, chunk in (("sequential", None), ("parallel", None), ("chunked", 1)):
        states = ssm.affine_scan(a, b, method=method, chunk_size=chunk)
        assert states.tolist() == [[2.0, 4.0], [2.0, 3.0]], method
    assert (r.input_map(2) @ xs).tolist() == [2.0, 3.0]


def test_recurrence_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="gain must have 2 elements"):
        ssm.DiagonalRecurrence((0.5, 0.25), (1.0,), (1.0, 1.0))
    with pytest.raises(ValueError, match="state must have 2 elements"):
        ssm.SEED_RECURRENCE.step((0.0,), 1.0)


# --- the selective scan against an fp64 reference from the definition ---------------------------

def reference_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None):
    """Scalar fp64 loops over batch, channel, token and state element: the definition, nothing else."""
    batch, dim, length = u.shape
    n = A.shape[1]
    u, delta, A, B, C = (t.double().tolist() for t in (u, delta, A, B, C))
    D = None if D is None else D.double().tolist()
    z = None if z is None else z.double().tolist()
    bias = None if delta_bias is None else delta_bias.double().tolist()
    h0 = None if initial_state is None else initial_state.double().tolist()
    out = [[[0.0] * length for _ in range(dim)] for _ in range(batch)]
    last = [[[0.0] * n for _ in range(dim)] for _ in range(batch)]
    for b in range(batch):
        for d in range(dim):
            h = list(h0[b][d]) if h0 is not None else [0.0] * n
            for t in range(length):
                dt = delta[b][d][t] + (bias[d] if bias is not None else 0.0)
                if delta_softplus:
                    dt = math.log1p(math.exp(dt))
                h = [math.exp(dt * A[d][i]) * h[i] + dt * B[b][i][t] * u[b][d][t] for i in range(n)]
                y = sum(C[b][i][t] * h[i] for i in range(n))
                if D is not None:
                    y += D[d] * u[b][d][t]
                if z is not None:
                    y *= z[b][d][t] / (1.0 + math.exp(-z[b][d][t]))
                out[b][d][t] = y
            last[b][d] = h
    return torch.tensor(out, dtype=torch.float64), torch.tensor(last, dtype=torch.float64)


def random_case(batch, dim, state, length, seed, with_d, with_z, with_bias, softplus, with_initial):
    g = torch.Generator().manual_seed(seed)
    x = ssm.scan_inputs(batch, dim, state, length, seed=seed)
    if softplus:  # delta before softplus may be negative
        x["delta"] = torch.randn(batch, dim, length, generator=g) - 1.0
    extra = dict(
        D=torch.randn(dim, generator=g) if with_d else None,
        z=torch.randn(batch, dim, length, generator=g) if with_z else None,
        delta_bias=torch.rand(dim, generator=g) * 0.1 if with_bias else None,
        delta_softplus=softplus,
        initial_state=torch.randn(batch, dim, state, generator=g) if with_initial else None,
    )
    return x, extra


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    length=st.integers(1, 257), chunk=st.integers(1, 70), batch=st.integers(1, 2), dim=st.integers(1, 3),
    state=st.integers(1, 4), seed=st.integers(0, 2 ** 16), flags=st.tuples(*[st.booleans()] * 5),
)
def test_three_methods_match_fp64_definition(length, chunk, batch, dim, state, seed, flags):
    x, extra = random_case(batch, dim, state, length, seed, *flags)
    want, want_last = reference_scan(**x, **extra)
    for method, chunk_size in (("sequential", None), ("parallel", None), ("chunked", chunk)):
        out, last = ssm.selective_scan(**x, **extra, method=method, chunk_size=chunk_size, return_last_state=True)
        assert out.dtype == torch.float32 and out.shape == (batch, dim, length)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=method)
        torch.testing.assert_close(last.double(), want_last, rtol=1e-4, atol=1e-4, msg=method)


@pytest.mark.parametrize("length, chunk", [(256, 64), (257, 64), (257, 1)])
def test_long_sequences_with_every_option_match_fp64_definition(length, chunk):
    x, extra = random_case(1, 2, 3, length, 7, True, True, True, True, True)
    want, want_last = reference_scan(**x, **extra)
    for method, chunk_size in (("sequential", None), ("parallel", None), ("chunked", chunk)):
        out, last = ssm.selective_scan(**x, **extra, method=method, chunk_size=chunk_size, return_last_state=True)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=method)
        torch.testing.assert_close(last.double(), want_last, rtol=1e-4, atol=1e-4, msg=method)


@pytest.mark.parametrize("length, chunk", [(1, 1), (2, 1), (64, 16), (64, 7), (100, 64), (257, 32), (257, 256),
                                           (257, 300)])
def test_chunked_matches_sequential_in_fp64(length, chunk):
    x, extra = random_case(2, 5, 3, length, 1, True, True, True, True, True)
    x = {k: v.double() for k, v in x.items()}
    extra = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
    seq, seq_last = ssm.selective_scan(**x, **extra, return_last_state=True)
    assert seq.dtype == torch.float64
    for method, c in (("parallel", None), ("chunked", chunk)):
        out, last = ssm.selective_scan(**x, **extra, method=method, chunk_size=c, return_last_state=True)
        torch.testing.assert_close(out, seq, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(last, seq_last, rtol=1e-10, atol=1e-10)


def test_splitting_a_sequence_and_carrying_the_state_changes_nothing():
    """Chunked prefill by hand: the last state of the first part seeds the second."""
    x, extra = random_case(1, 4, 3, 50, 3, True, True, True, True, False)
    full, full_last = ssm.selective_scan(**x, **extra, return_last_state=True)
    cut = 23
    part = lambda t, s: t[..., s]  # noqa: E731
    first = {k: part(v, slice(None, cut)) if k not in ("A",) else v for k, v in x.items()}
    second = {k: part(v, slice(cut, None)) if k not in ("A",) else v for k, v in x.items()}
    z = extra.pop("z")
    extra.pop("initial_state")
    out1, h = ssm.selective_scan(**first, **extra, z=z[..., :cut], return_last_state=True, method="parallel")
    out2, last = ssm.selective_scan(**second, **extra, z=z[..., cut:], return_last_state=True, initial_state=h)
    torch.testing.assert_close(torch.cat([out1, out2], -1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, full_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softplus", [False, True])
def test_ssm_step_token_by_token_equals_the_scan(softplus):
    x, extra = random_case(2, 6, 4, 19, 5, True, True, True, softplus, True)
    want, want_last = ssm.selective_scan(**x, **extra, return_last_state=True)
    h = extra.pop("initial_state")
    z = extra.pop("z")
    ys = []
    for t in range(19):
        y, h = ssm.ssm_step(h, x["u"][..., t], x["delta"][..., t], x["A"], x["B"][..., t], x["C"][..., t],
                            z_t=z[..., t], **extra)
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, -1), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_last, rtol=1e-5, atol=1e-5)


def test_fp16_inputs_give_fp16_output_computed_in_fp32():
    x, extra = random_case(1, 4, 3, 33, 2, True, False, False, False, False)
    out = ssm.selective_scan(**{k: v.half() if k != "A" else v for k, v in x.items()}, **extra, method="chunked",
                             chunk_size=8)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), ssm.selective_scan(**x, **extra), rtol=2e-2, atol=2e-2)


def test_scan_counts():
    assert [ssm.scan_depth(n, "parallel") for n in (1, 2, 3, 4, 5, 1024)] == [0, 1, 2, 2, 3, 10]
    assert ssm.scan_depth(1000, "sequential") == 1000
    assert ssm.scan_depth(10, "chunked", 4) == 2 * 3 + 2
    # Hillis-Steele on 8 tokens: rounds of 7, 6 and 4 compositions, then 8 applications.
    assert ssm.scan_work(8, "parallel") == 7 + 6 + 4 + 8
    assert ssm.scan_work(10, "chunked", 4) == 2 * (3 + 2 + 4) + (1 + 2)


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("change, error, words", [
    (dict(method="fast"), ValueError, "method must be one of"),
    (dict(method="chunked", chunk_size=0), ValueError, "chunk_size must be an int >= 1"),
    (dict(method="chunked", chunk_size=-3), ValueError, "chunk_size must be an int >= 1"),
    (dict(method="chunked", chunk_size=2.5), TypeError, "chunk_size must be an int"),
    (dict(method="parallel", chunk_size=8), ValueError, "chunk_size applies to method in"),
    (dict(A=torch.zeros(4, 3)), ValueError, "A has dim=4 but u has dim=5"),
    (dict(B=torch.zeros(2, 3, 9)), ValueError, "B has length=9 but u has length=10"),
    (dict(C=torch.zeros(2, 3)), ValueError, r"C must have 3 dimensions \[batch, state, length\]"),
    (dict(D=torch.zeros(6)), ValueError, "D has dim=6"),
    (dict(initial_state=torch.zeros(2, 5, 4)), ValueError, "initial_state has state=4"),
    (dict(u=torch.zeros(2, 5, 10, dtype=torch.long)), TypeError, "u must be a floating-point tensor"),
    (dict(delta=[[0.0]]), TypeError, "delta must be a torch.Tensor"),
])
def test_bad_input_raises_clear_errors(change, error, words):
    x = ssm.scan_inputs(2, 5, 3, 10)
    with pytest.raises(error, match=words):
        ssm.selective_scan(**{**x, **change})


def test_ssm_step_rejects_bad_shapes():
    h = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match="B_t has state=4"):
        ssm.ssm_step(h, torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(5, 3), torch.zeros(2, 4), torch.zeros(2, 3))


# --- Hugging Face's pure-PyTorch Mamba ----------------------------------------------------------

@pytest.fixture(scope="module")
def mamba():
    return kvlab.tiny_model("mamba", layers=2, hidden=32, state_size=8, vocab=256, dt_rank=4, seed=3)


@pytest.mark.parametrize("method, chunk", [("sequential", None), ("parallel", None), ("chunked", 5)])
def test_full_sequence_matches_hugging_face(mamba, method, chunk):
    ids = torch.randint(0, 256, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = mamba(ids).logits
    got, _ = ssm.mamba_forward(mamba, ids, method=method, chunk_size=chunk)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mixer_matches_hugging_face_and_its_scan_function(mamba):
    from transformers.models.mamba import modeling_mamba as hf

    mixer = mamba.backbone.layers[0].mixer
    hidden = torch.randn(1, 17, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ssm.mamba_mixer(mixer, hidden)[0], mixer(hidden), rtol=1e-4, atol=1e-5)
    if not hasattr(hf, "mamba_selective_scan"):
        pytest.skip("the scan oracle, modeling_mamba.mamba_selective_scan, arrived in transformers 5.15")
    x, extra = random_case(2, 4, 3, 21, 4, True, True, True, True, False)
    extra.pop("initial_state")
    want, want_last = hf.mamba_selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], **extra,
                                              return_last_state=True)
    got, last = ssm.selective_scan(**x, **extra, method="parallel", return_last_state=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-5)
    h = torch.randn(2, 4, 3)
    h_hf = h.clone()
    args = (x["u"][..., 0], x["delta"][..., 0], x["A"], x["B"][..., 0], x["C"][..., 0])
    want = hf.mamba_selective_state_update(h_hf, *args, D=extra["D"], z=extra["z"][..., 0],
                                           dt_bias=extra["delta_bias"], dt_softplus=True)
    got, new = ssm.ssm_step(h, *args, D=extra["D"], z_t=extra["z"][..., 0], delta_bias=extra["delta_bias"],
                            delta_softplus=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new, h_hf, rtol=1e-5, atol=1e-5)


def test_token_by_token_decode_matches_hugging_face_cache(mamba):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    prompt, rest = ids[:, :5], ids[:, 5:]
    with torch.no_grad():
        out = mamba(prompt, use_cache=True)
        cache, want = returned_cache(out), [out.logits[:, -1]]
        for t in range(rest.shape[1]):
            out = mamba(rest[:, t:t + 1], **cache_kwargs(mamba, cache), use_cache=True)
            want.append(out.logits[:, -1])
    logits, states = ssm.mamba_forward(mamba, prompt, method="chunked", chunk_size=2)
    got = [logits[:, -1]]
    for t in range(rest.shape[1]):
        logits, states = ssm.mamba_forward(mamba, rest[:, t:t + 1], states)
        got.append(logits[:, -1])
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-4, atol=1e-4)
    for layer, state in zip(cache.layers, states):
        torch.testing.assert_close(state.ssm, ssm.layer_states(layer, "recurrent_states")[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(state.conv, ssm.layer_states(layer, "conv_states")[0], rtol=1e-5, atol=1e-6)


# --- the Triton decode-step kernel under the interpreter -----------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch, dim, nstate", [(1, 1, 1), (2, 37, 5), (3, 16, 16)])
@pytest.mark.parametrize("options", [False, True])
def test_triton_step_matches_reference(dtype, batch, dim, nstate, options):
    g = torch.Generator().manual_seed(batch * 100 + dim)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    state = rand(batch, dim, nstate)
    args = dict(u=rand(batch, dim), delta=rand(batch, dim), A=-torch.rand(dim, nstate, generator=g),
                B=rand(batch, nstate), C=rand(batch, nstate))
    if options:
        args.update(D=torch.randn(dim, generator=g), z=rand(batch, dim), delta_bias=torch.randn(dim, generator=g),
                    delta_softplus=True)
    else:
        args["delta"] = args["delta"].abs()
    ref_state = state.clone()
    want = selective_state_update_ref(ref_state, **args)
    got = selective_state_update(state, **args)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    assert got.dtype == dtype and state.dtype == dtype
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(state, ref_state, **tol)


def test_triton_step_takes_strided_inputs_and_rejects_bad_ones():
    state = torch.zeros(2, 8, 4)
    uz = torch.randn(2, 16)
    args = dict(u=uz[:, :8], delta=torch.rand(8, 2).T, A=-torch.rand(8, 4), B=torch.randn(2, 4), C=torch.randn(2, 4),
                z=uz[:, 8:])
    ref_state = state.clone()
    torch.testing.assert_close(selective_state_update(state, **args), selective_state_update_ref(ref_state, **args))
    with pytest.raises(ValueError, match="C_t has state=3"):
        selective_state_update(state, **{**args, "C": torch.zeros(2, 3)})
    with pytest.raises(TypeError, match="state must have dtype"):
        selective_state_update(state.double(), **{k: v.double() for k, v in args.items()})


# --- the cache budget, against real caches --------------------------------------------------------

def test_cache_bytes_match_real_llama_mamba_and_jamba_caches():
    import transformers

    llama = kvlab.tiny_model("llama", layers=3, hidden=64, q_heads=4, kv_heads=2, intermediate=64, vocab=128)
    mamba = kvlab.tiny_model("mamba", layers=3, hidden=32, state_size=4, vocab=128)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        kv = ssm.cache_nbytes(returned_cache(llama(ids, use_cache=True)))
        state = ssm.cache_nbytes(returned_cache(mamba(ids, use_cache=True)))
    assert kv == 3 * ssm.attention_kv_bytes(9, kv_width=2 * 16, bytes_per_element=4)
    assert kv == 9 * llama.shape.kv_bytes_per_token(4)
    assert state == mamba.shape.state_bytes_per_sequence(4)
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        hidden_size=32, num_hidden_layers=4, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, num_experts=1, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
        mamba_d_state=4, mamba_expand=2, mamba_dt_rank=4, mamba_d_conv=4)
    jamba = transformers.JambaForCausalLM(config).eval()
    with torch.no_grad():
        cache = returned_cache(jamba(ids, use_cache=True))
    assert ssm.layer_kinds(cache) == ["ssm", "attention", "ssm", "attention"]
    ssm_layer = kvlab.theory.shapes.SSMShape("jamba-ssm", 1, 32, 4, 128, expand=2, conv_kernel=4)
    want = ssm.hybrid_cache_bytes(9, layers=4, attention_layers=2, kv_bytes_per_token=2 * 2 * 8 * 4,
                                  state_bytes=ssm_layer.state_bytes_per_layer(4))
    assert ssm.cache_nbytes(cache) == want


def test_budget_arithmetic_and_its_checks():
    shape = kvlab.theory.shapes.SSM_SHAPES["mamba-130m"]
    per_layer = shape.state_bytes_per_layer(2)
    assert per_layer == 1536 * (16 + 4) * 2
    # The same width in attention: 768 KV elements per token for a key and for a value.
    assert ssm.breakeven_context(ssm.attention_kv_bytes(1, 768), per_layer) == 20
    assert ssm.hybrid_cache_bytes(100, 8, 8, 10, 50) == 8000
    assert ssm.hybrid_cache_bytes(100, 8, 0, 10, 50) == 400
    assert ssm.hybrid_cache_bytes(100, 8, 2, 10, 50, batch=3) == 3 * (2000 + 300)
    with pytest.raises(ValueError, match=r"attention_layers must be in \[0, layers=8\]"):
        ssm.hybrid_cache_bytes(100, 8, 9, 10, 50)
    with pytest.raises(ValueError, match="context must be an int >= 0"):
        ssm.attention_kv_bytes(-1, 8)


def test_tiny_mamba_sizes_and_errors():
    m = kvlab.tiny_model("mamba", layers=1, hidden=16, vocab=64)
    assert isinstance(m.shape, kvlab.theory.shapes.SSMShape)
    assert m.shape.params == sum(p.numel() for p in m.parameters())
    assert "mamba" not in kvlab.lab.models.ARCHITECTURES
    with pytest.raises(ValueError, match="unknown SSMShape field"):
        kvlab.tiny_model("mamba", q_heads=4)
    with pytest.raises(ValueError, match="shape must be one of"):
        kvlab.tiny_model("mamba", shape="llama-3-8b")


# --- what a fixed state cannot do ----------------------------------------------------------------

@pytest.mark.parametrize("n, length", [(1, 1), (2, 5), (4, 4), (4, 12), (6, 3)])
def test_mean_recall_error_is_one_minus_rank_over_length(n, length):
    r = ssm.spread_recurrence(n)
    assert ssm.linear_recall_error(r, length) == pytest.approx(1 - min(n, length) / length, abs=1e-9)


def test_recall_errors_per_position_and_bad_positions():
    r = ssm.spread_recurrence(3)
    errors = ssm.linear_recall_errors(r, 9)
    assert errors.shape == (9,) and float(errors.mean()) == pytest.approx(1 - 3 / 9, abs=1e-9)
    assert ssm.linear_recall_error(r, 9, 4) == pytest.approx(float(errors[4]))
    with pytest.raises(ValueError, match=r"position must be in \[0, length=9\)"):
        ssm.linear_recall_error(r, 9, 9)


def test_recall_error_matches_sampled_least_squares():
    r, length, p = ssm.spread_recurrence(3), 10, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, length, generator=g, dtype=torch.float64)
    h = x @ r.input_map(length).T
    readout = torch.linalg.lstsq(h, x[:, p:p + 1]).solution
    sampled = ((x[:, p:p + 1] - h @ readout) ** 2).mean() / (x[:, p] ** 2).mean()
    assert float(sampled) == pytest.approx(ssm.linear_recall_error(r, length, p), abs=0.02)


def test_attention_lookup_recalls_any_position():
    x = torch.randn(5, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for p in (0, 17, 39):
        torch.testing.assert_close(ssm.attention_recall(x, p), x[:, p], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ssm.attention_recall(x), x, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="position must be in"):
        ssm.attention_recall(x, 40)


def test_decode_step_times_runs_attention_and_mamba_models():
    models = {"llama": kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, kv_heads=1, intermediate=32, vocab=64),
              "mamba": kvlab.tiny_model("mamba", layers=1, hidden=16, vocab=64)}
    times = ssm.decode_step_times(models, [3, 20], warmup=0, reps=2)
    assert set(times) == {"llama", "mamba"}
    assert all(len(v) == 2 and all(len(t.times) == 2 for t in v) for v in times.values())
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        ssm.decode_step_times(models, [0])


def test_prefill_in_two_calls_carries_conv_window_and_state(mamba):
    ids = torch.randint(0, 256, (1, 19), generator=torch.Generator().manual_seed(4))
    full, _ = ssm.mamba_forward(mamba, ids, method="sequential")
    first, states = ssm.mamba_forward(mamba, ids[:, :2], method="parallel")  # shorter than the conv window
    second, _ = ssm.mamba_forward(mamba, ids[:, 2:], states, method="chunked", chunk_size=4)
    torch.testing.assert_close(torch.cat([first, second], 1), full, rtol=1e-4, atol=1e-4)


def test_tiny_hybrid_places_attention_layers_and_checks_k():
    model = ssm.tiny_hybrid(layers=4, attention_layers=1, hidden=16, heads=2, state_size=2, vocab=32)
    # transformers 5.13 renamed Jamba's Mamba layers "linear_attention" (before: "mamba")
    assert [kind in ("mamba", "linear_attention") for kind in model.config.layer_types] == [True] * 3 + [False]
    for bad in (0, 3, 5):
        with pytest.raises(ValueError, match="attention_layers"):
            ssm.tiny_hybrid(layers=4, attention_layers=bad)
