"""kvlab.cache.mamba: the selective scan against an fp64 definition, and a Hugging Face Mamba run on
kvlab's scan against Hugging Face's own path.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache.mamba import mamba_forward, mamba_mixer, selective_scan, ssm_step
from kvlab.lab.cache_bytes import layer_states
from kvlab.lab.ssm_timing import scan_inputs
from kvlab.versions import cache_kwargs, returned_cache


def reference_scan(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    """Scalar fp64 loops over batch, channel, token and state element: the definition, nothing
    else."""
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
    x = scan_inputs(batch, dim, state, length, seed=seed)
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
    length=st.integers(1, 257),
    chunk=st.integers(1, 70),
    batch=st.integers(1, 2),
    dim=st.integers(1, 3),
    state=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    flags=st.tuples(*[st.booleans()] * 5),
)
def test_three_methods_match_fp64_definition(length, chunk, batch, dim, state, seed, flags):
    x, extra = random_case(batch, dim, state, length, seed, *flags)
    want, want_last = reference_scan(**x, **extra)
    for method, chunk_size in (("sequential", None), ("parallel", None), ("chunked", chunk)):
        out, last = selective_scan(
            **x, **extra, method=method, chunk_size=chunk_size, return_last_state=True
        )
        assert out.dtype == torch.float32 and out.shape == (batch, dim, length)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=method)
        torch.testing.assert_close(last.double(), want_last, rtol=1e-4, atol=1e-4, msg=method)


@pytest.mark.parametrize("length, chunk", [(256, 64), (257, 64), (257, 1)])
def test_long_sequences_with_every_option_match_fp64_definition(length, chunk):
    x, extra = random_case(1, 2, 3, length, 7, True, True, True, True, True)
    want, want_last = reference_scan(**x, **extra)
    for method, chunk_size in (("sequential", None), ("parallel", None), ("chunked", chunk)):
        out, last = selective_scan(
            **x, **extra, method=method, chunk_size=chunk_size, return_last_state=True
        )
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=method)
        torch.testing.assert_close(last.double(), want_last, rtol=1e-4, atol=1e-4, msg=method)


@pytest.mark.parametrize(
    "length, chunk",
    [(1, 1), (2, 1), (64, 16), (64, 7), (100, 64), (257, 32), (257, 256), (257, 300)],
)
def test_chunked_matches_sequential_in_fp64(length, chunk):
    x, extra = random_case(2, 5, 3, length, 1, True, True, True, True, True)
    x = {k: v.double() for k, v in x.items()}
    extra = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in extra.items()}
    seq, seq_last = selective_scan(**x, **extra, return_last_state=True)
    assert seq.dtype == torch.float64
    for method, c in (("parallel", None), ("chunked", chunk)):
        out, last = selective_scan(
            **x, **extra, method=method, chunk_size=c, return_last_state=True
        )
        torch.testing.assert_close(out, seq, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(last, seq_last, rtol=1e-10, atol=1e-10)


def test_splitting_a_sequence_and_carrying_the_state_changes_nothing():
    """Chunked prefill by hand: the last state of the first part seeds the second."""
    x, extra = random_case(1, 4, 3, 50, 3, True, True, True, True, False)
    full, full_last = selective_scan(**x, **extra, return_last_state=True)
    cut = 23
    part = lambda t, s: t[..., s]  # noqa: E731
    first = {k: part(v, slice(None, cut)) if k not in ("A",) else v for k, v in x.items()}
    second = {k: part(v, slice(cut, None)) if k not in ("A",) else v for k, v in x.items()}
    z = extra.pop("z")
    extra.pop("initial_state")
    out1, h = selective_scan(
        **first, **extra, z=z[..., :cut], return_last_state=True, method="parallel"
    )
    out2, last = selective_scan(
        **second, **extra, z=z[..., cut:], return_last_state=True, initial_state=h
    )
    torch.testing.assert_close(torch.cat([out1, out2], -1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, full_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softplus", [False, True])
def test_ssm_step_token_by_token_equals_the_scan(softplus):
    x, extra = random_case(2, 6, 4, 19, 5, True, True, True, softplus, True)
    want, want_last = selective_scan(**x, **extra, return_last_state=True)
    h = extra.pop("initial_state")
    z = extra.pop("z")
    ys = []
    for t in range(19):
        y, h = ssm_step(
            h,
            x["u"][..., t],
            x["delta"][..., t],
            x["A"],
            x["B"][..., t],
            x["C"][..., t],
            z_t=z[..., t],
            **extra,
        )
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, -1), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_last, rtol=1e-5, atol=1e-5)


def test_fp16_inputs_give_fp16_output_computed_in_fp32():
    x, extra = random_case(1, 4, 3, 33, 2, True, False, False, False, False)
    out = selective_scan(
        **{k: v.half() if k != "A" else v for k, v in x.items()},
        **extra,
        method="chunked",
        chunk_size=8,
    )
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), selective_scan(**x, **extra), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(method="fast"), ValueError, "method must be one of"),
        (dict(method="chunked", chunk_size=0), ValueError, "chunk_size must be an int >= 1"),
        (dict(method="chunked", chunk_size=-3), ValueError, "chunk_size must be an int >= 1"),
        (dict(method="chunked", chunk_size=2.5), TypeError, "chunk_size must be an int"),
        (dict(method="parallel", chunk_size=8), ValueError, "chunk_size applies to method in"),
        (dict(A=torch.zeros(4, 3)), ValueError, "A has dim=4 but u has dim=5"),
        (dict(B=torch.zeros(2, 3, 9)), ValueError, "B has length=9 but u has length=10"),
        (
            dict(C=torch.zeros(2, 3)),
            ValueError,
            r"C must have 3 dimensions \[batch, state, length\]",
        ),
        (dict(D=torch.zeros(6)), ValueError, "D has dim=6"),
        (dict(initial_state=torch.zeros(2, 5, 4)), ValueError, "initial_state has state=4"),
        (
            dict(u=torch.zeros(2, 5, 10, dtype=torch.long)),
            TypeError,
            "u must be a floating-point tensor",
        ),
        (dict(delta=[[0.0]]), TypeError, "delta must be a torch.Tensor"),
    ],
)
def test_bad_input_raises_clear_errors(change, error, words):
    x = scan_inputs(2, 5, 3, 10)
    with pytest.raises(error, match=words):
        selective_scan(**{**x, **change})


def test_ssm_step_rejects_bad_shapes():
    h = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match="B_t has state=4"):
        ssm_step(
            h,
            torch.zeros(2, 5),
            torch.zeros(2, 5),
            torch.zeros(5, 3),
            torch.zeros(2, 4),
            torch.zeros(2, 3),
        )


@pytest.fixture(scope="module")
def mamba():
    return kvlab.tiny_model(
        "mamba", layers=2, hidden=32, state_size=8, vocab=256, dt_rank=4, seed=3
    )


@pytest.mark.parametrize(
    "method, chunk", [("sequential", None), ("parallel", None), ("chunked", 5)]
)
def test_full_sequence_matches_hugging_face(mamba, method, chunk):
    ids = torch.randint(0, 256, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = mamba(ids).logits
    got, _ = mamba_forward(mamba, ids, method=method, chunk_size=chunk)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mixer_matches_hugging_face_and_its_scan_function(mamba):
    from transformers.models.mamba import modeling_mamba as hf

    mixer = mamba.backbone.layers[0].mixer
    hidden = torch.randn(1, 17, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            mamba_mixer(mixer, hidden)[0], mixer(hidden), rtol=1e-4, atol=1e-5
        )
    if not hasattr(hf, "mamba_selective_scan"):
        pytest.skip(
            "the scan oracle, modeling_mamba.mamba_selective_scan, arrived in transformers 5.15"
        )
    x, extra = random_case(2, 4, 3, 21, 4, True, True, True, True, False)
    extra.pop("initial_state")
    want, want_last = hf.mamba_selective_scan(
        x["u"], x["delta"], x["A"], x["B"], x["C"], **extra, return_last_state=True
    )
    got, last = selective_scan(**x, **extra, method="parallel", return_last_state=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-5)
    h = torch.randn(2, 4, 3)
    h_hf = h.clone()
    args = (x["u"][..., 0], x["delta"][..., 0], x["A"], x["B"][..., 0], x["C"][..., 0])
    want = hf.mamba_selective_state_update(
        h_hf,
        *args,
        D=extra["D"],
        z=extra["z"][..., 0],
        dt_bias=extra["delta_bias"],
        dt_softplus=True,
    )
    got, new = ssm_step(
        h,
        *args,
        D=extra["D"],
        z_t=extra["z"][..., 0],
        delta_bias=extra["delta_bias"],
        delta_softplus=True,
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new, h_hf, rtol=1e-5, atol=1e-5)


def test_token_by_token_decode_matches_hugging_face_cache(mamba):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    prompt, rest = ids[:, :5], ids[:, 5:]
    with torch.no_grad():
        out = mamba(prompt, use_cache=True)
        cache, want = returned_cache(out), [out.logits[:, -1]]
        for t in range(rest.shape[1]):
            out = mamba(rest[:, t : t + 1], **cache_kwargs(mamba, cache), use_cache=True)
            want.append(out.logits[:, -1])
    logits, states = mamba_forward(mamba, prompt, method="chunked", chunk_size=2)
    got = [logits[:, -1]]
    for t in range(rest.shape[1]):
        logits, states = mamba_forward(mamba, rest[:, t : t + 1], states)
        got.append(logits[:, -1])
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-4, atol=1e-4)
    for layer, state in zip(cache.layers, states):
        torch.testing.assert_close(
            state.ssm, layer_states(layer, "recurrent_states")[0], rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(
            state.conv, layer_states(layer, "conv_states")[0], rtol=1e-5, atol=1e-6
        )


def test_prefill_in_two_calls_carries_conv_window_and_state(mamba):
    ids = torch.randint(0, 256, (1, 19), generator=torch.Generator().manual_seed(4))
    full, _ = mamba_forward(mamba, ids, method="sequential")
    first, states = mamba_forward(
        mamba, ids[:, :2], method="parallel"
    )  # shorter than the conv window
    second, _ = mamba_forward(mamba, ids[:, 2:], states, method="chunked", chunk_size=4)
    torch.testing.assert_close(torch.cat([first, second], 1), full, rtol=1e-4, atol=1e-4)


def test_mamba_forward_refuses_ids_outside_the_vocabulary():
    mamba = kvlab.tiny_model(
        "mamba", layers=1, hidden=32, vocab=64, device="cpu", dtype=torch.float32
    )
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 64\)"):
        mamba_forward(mamba, torch.tensor([[1, 64]]))
    with pytest.raises(TypeError, match="input_ids must be an int64 tensor"):
        mamba_forward(mamba, torch.tensor([[1.0, 2.0]]))
