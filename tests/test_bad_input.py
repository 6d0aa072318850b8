"""Bad input never yields a wrong number, and a failed call changes nothing (CONTRIBUTING.md, "Errors").

Three parts:

1. Per public function, a table of bad inputs and the error each must raise (the argument's name
   must appear in the message), with hypothesis where a space of inputs is natural.
2. The cases of issue 11, each pinned by a test: inputs that once returned a wrong number silently.
3. Per stateful object, a hypothesis test that interleaves failing calls with valid ones and checks
   that the full state after each failure equals the state before it.

The serving stack's parts (block manager, paged cache, kernels, plain loops, engine) keep theirs
beside their own tests: tests/cache/, tests/kernels/, tests/serving/, tests/lab/.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab import decode
from kvlab.cache import layout, longctx
from kvlab.theory import roofline
from kvlab.kernels import selective_state_update, selective_state_update_ref
from kvlab.theory.shapes import SHAPES
from kvlab.serving.attention import use_paged_attention

INTERPRETED = not torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- shared inputs


def _ssm_args(batch=3, dim=20, nstate=5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    return dict(state=rand(batch, dim, nstate), u=rand(batch, dim), delta=rand(batch, dim).abs(),
                A=-rand(dim, nstate).abs(), B=rand(batch, nstate), C=rand(batch, nstate), D=rand(dim),
                delta_bias=rand(dim))


@pytest.fixture(scope="module")
def model():
    """A two-layer Llama small enough for many decode steps on a CPU, switched to paged attention."""
    m = kvlab.tiny_model("llama", layers=2, hidden=64, q_heads=4, kv_heads=2, vocab=128, intermediate=128,
                         device="cpu", dtype=torch.float32, seed=5)
    return use_paged_attention(m)


# =========================================================================== 1. tables of bad inputs

# Integer arguments across modules: (a call taking the value, the argument's name, the smallest allowed value)
INTEGER_ARGUMENTS = {
    "roofline.retained_tokens context": (lambda x: roofline.retained_tokens(SHAPES["llama-3-8b"], x), "context", 1),
    "roofline.footprint batch": (lambda x: roofline.footprint(SHAPES["llama-3-8b"], 64, x), "batch", 1),
    "longctx.cache_bytes tokens": (lambda x: longctx.cache_bytes("llama-3-8b", x), "tokens", 1),
    "longctx.window_span window": (lambda x: longctx.window_span(x, 4), "window", 1),
    "decode.positions_processed P": (lambda x: decode.positions_processed(x, 2), "P", 1),
    "decode.attention_work G": (lambda x: decode.attention_work(4, x), "G", 0),
    "layout.new_cache batch": (lambda x: layout.new_cache("BHTD", batch=x, length=2, kv_heads=1, head_dim=4,
                                                         device="cpu"), "batch", 1),
    "ssm.scan_work length": (lambda x: kvlab.cache.ssm.scan_work(x, "parallel"), "length", 1),
    "gemv.matmul_flops n": (lambda x: kvlab.lab.gemv.matmul_flops(x, 8, 8), "n", 1),
}


@pytest.mark.parametrize("name", INTEGER_ARGUMENTS)
@settings(max_examples=12, deadline=None)
@given(value=st.one_of(st.integers(max_value=-1), st.sampled_from([0.5, 2.0, "3", None, True, math.nan])))
def test_integer_arguments_refuse_what_is_not_an_int_in_range(name, value):
    call, argument, low = INTEGER_ARGUMENTS[name]
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return
    with pytest.raises(TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError,
                       match=argument):
        call(value)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "ssm u inside state": (lambda: (lambda a: selective_state_update_ref(**{**a, "u": a["state"][:, :, 0]}))(
        _ssm_args()), ValueError, "state and u share memory"),
    "ssm expanded state (ref)": (lambda: selective_state_update_ref(
        **{**_ssm_args(), "state": _ssm_args()["state"][:1].expand(3, -1, -1)}), ValueError, "state has overlapping"),
    # roofline, longctx, models, decode, layout
    "footprint w_q nan": (lambda: roofline.footprint(SHAPES["llama-3-8b"], 1024, 1, w_q=float("nan")), ValueError,
                          r"w_q must be a finite number > 0"),
    "cache_bytes negative width": (lambda: longctx.cache_bytes("llama-3-8b", 1024, bytes_per_element=-2), ValueError,
                                   r"bytes_per_element must be a finite number > 0"),
    "design_table gqa_heads": (lambda: longctx.design_table(gqa_heads=3), ValueError,
                               r"gqa_heads must divide the 32 query heads"),
    "quantized_nbytes 3 bits": (lambda: longctx.quantized_nbytes(64, 3, 8), ValueError, r"bits must be one of"),
    "quantized_nbytes ragged": (lambda: longctx.quantized_nbytes(60, 4, 8), ValueError, "multiple of group_size"),
    "eviction_mask window 0": (lambda: longctx.eviction_mask(8, 0, 0), ValueError, r"window must be an int >= 1"),
    "tiny_model unknown shape": (lambda: kvlab.tiny_model("llama", shape="unknown"), ValueError,
                                 r"shape must be a ModelShape or one of"),
    "work counter cached": (lambda: decode.positions_processed(4, 2, cached="yes"), TypeError, "cached must be"),
    "gemv infinite intensity": (lambda: kvlab.lab.gemv.batch_at_intensity(math.inf, 64, 64, 2), ValueError,
                                r"intensity must be a finite number"),
    "ssm infinite state": (lambda: kvlab.cache.ssm.breakeven_context(4.0, math.inf), ValueError,
                           r"state_bytes must be a finite number > 0"),
    "ssm recurrence None": (lambda: kvlab.cache.ssm.spread_recurrence(4, fastest=None), TypeError, "fastest must be"),
    "outlier_keys negative": (lambda: longctx.outlier_keys(-1, 8), ValueError, r"tokens must be an int >= 1"),
    "outlier_keys channels": (lambda: longctx.outlier_keys(4, 8, outlier_channels=9), ValueError,
                              r"outlier_channels must be an int in \[0, 9\)"),
    "affine_scan int": (lambda: kvlab.cache.ssm.affine_scan(torch.ones(3, 2, dtype=torch.long),
                                                      torch.ones(3, 2, dtype=torch.long)),
                        TypeError, "floating dtype"),
    "recurrence nan input": (lambda: kvlab.cache.ssm.spread_recurrence(2).step((0.0, 0.0), math.nan), ValueError,
                             "x must be a finite number"),
    "attention_recall sharpness": (lambda: kvlab.cache.ssm.attention_recall(torch.rand(5), sharpness=-1.0), ValueError,
                                   "sharpness must be a finite number > 0"),
    "attention_recall nan": (lambda: kvlab.cache.ssm.attention_recall(torch.tensor([1.0, math.nan])), ValueError, "NaN"),
    "kl shapes": (lambda: longctx.kl_divergence(torch.zeros(3, 4), torch.zeros(3, 5)), ValueError, "one shape"),
    "rotate positions": (lambda: longctx.rotate(torch.rand(1, 1, 4, 8), torch.arange(3), torch.rand(4)), ValueError,
                         r"positions must be \[n\] or \[batch, n\] with n = 4"),
    "layout cache beyond memory": (lambda: layout.new_cache("BHTD", batch=10**6, length=10**6, kv_heads=8,
                                                            head_dim=128, device="cpu"), MemoryError, "bytes but only"),
    "layout locate negative block": (lambda: layout.locate(1, [-1, 2], 4), ValueError,
                                     r"block_table_row\[0\] must be an int >= 0, got -1"),
    "layout nan keys": (lambda: layout.cache_from_dense("BHTD", torch.full((1, 1, 4, 2, 8), math.nan),
                                                        torch.rand(1, 1, 4, 2, 8)), ValueError, "k holds NaN"),
    "tiny_model beyond memory": (lambda: kvlab.tiny_model("llama", shape="llama-3.1-405b", device="cpu",
                                                          dtype=torch.float32), MemoryError, "bytes but only"),
    "load_model None": (lambda: kvlab.load_model(None), TypeError, "name must be"),
    "gemv sweep beyond memory": (lambda: kvlab.lab.gemv.sweep(ns=[1], K=10**6, N=10**6, reps=1), MemoryError,
                                 "bytes but only"),
    "gemv weight bytes of None": (lambda: kvlab.lab.gemv.weight_read_bytes(None), TypeError, "model must be"),
    "gemv negative memory": (lambda: kvlab.lab.gemv.calibrated_device(kvlab.lab.hardware.Calibration.__new__(
        kvlab.lab.hardware.Calibration), memory=-1), ValueError, "memory must be a finite number > 0"),
    "scan_inputs negative": (lambda: kvlab.cache.ssm.scan_inputs(-1, 4, 4, 4), ValueError, r"batch must be an int >= 1"),
    "decode_step_times list": (lambda: kvlab.cache.ssm.decode_step_times([], [4]), TypeError, "models must be"),
    "decode fractional mask": (lambda: decode.cached_decode(None, torch.ones(1, 3, dtype=torch.long), 2,
                                                            attention_mask=torch.tensor([[0.5, 1.0, 1.0]])),
                               ValueError, r"only 0 \(padding\) and 1 \(token\), got values such as \[0.5\]"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


# =========================================================================== 2. the cases of issue 11


@pytest.mark.parametrize("strided", ["D", "delta_bias", "A", "u"])
def test_ssm_kernel_honours_strides(strided):
    """A ``[::2]`` view (or a transposed one) gives the same numbers as a contiguous copy."""
    args = _ssm_args()
    base = args[strided]
    wide = torch.zeros(*base.shape[:-1], 2 * base.shape[-1], dtype=base.dtype, device=base.device)
    wide[..., ::2] = base
    args[strided] = wide[..., ::2]
    assert not args[strided].is_contiguous()
    ref_state, kernel_state = args["state"].clone(), args["state"].clone()
    y_ref = selective_state_update_ref(**{**args, "state": ref_state, strided: base}, delta_softplus=True)
    y = selective_state_update(**{**args, "state": kernel_state}, delta_softplus=True)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kernel_state, ref_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [selective_state_update, selective_state_update_ref], ids=["triton", "ref"])
def test_ssm_refuses_an_expanded_state_and_leaves_it_alone(fn):
    args = _ssm_args()
    row = args["state"][:1].clone()
    args["state"] = row.expand(3, -1, -1)
    with pytest.raises(ValueError, match="state has overlapping elements"):
        fn(**args)
    assert torch.equal(args["state"][0], row[0])


def test_masked_stream_eval_refuses_window_zero(model):
    with pytest.raises(ValueError, match=r"window must be an int >= 1, got 0"):
        longctx.masked_stream_eval(model, torch.arange(8), num_sink=0, window=0)


@pytest.mark.parametrize("loop", ["naive_decode", "cached_decode", "static_decode", "profile_decode"])
def test_decode_loops_refuse_token_ids_outside_the_vocabulary(model, loop):
    model.set_attn_implementation("sdpa")
    try:
        for ids in (torch.tensor([[1, 128]]), torch.tensor([[-1, 2]])):
            with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 128\)"):
                getattr(decode, loop)(model, ids, 2)
    finally:
        use_paged_attention(model)


def test_decode_past_learned_positions_is_refused():
    gpt2 = kvlab.tiny_model("gpt2", layers=1, hidden=32, q_heads=2, vocab=64, intermediate=64, max_positions=16,
                            device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"prompt \(10\) \+ max_new_tokens \(7\) must be <= 16"):
        decode.cached_decode(gpt2, torch.ones(1, 10, dtype=torch.long), 7)
    assert decode.cached_decode(gpt2, torch.ones(1, 10, dtype=torch.long), 6).shape == (1, 6)


def test_static_decode_refuses_a_cache_beyond_memory(model):
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(MemoryError, match="static cache of 1 x 10000000002 tokens"):
            decode.static_decode(model, torch.tensor([[1, 2]]), 10**10)
    finally:
        use_paged_attention(model)


def test_a_latent_cache_from_another_model_is_refused(model):
    model.set_attn_implementation("sdpa")
    try:
        other = kvlab.tiny_model("llama", layers=3, hidden=64, q_heads=4, kv_heads=4, vocab=128, intermediate=128,
                                 device="cpu", dtype=torch.float32)
        with pytest.raises(ValueError, match="cache has 3 layers but the model has 2"):
            decode.cached_decode(model, torch.tensor([[1, 2]]), 1, cache=longctx.LatentKVCache(other, 8))
        wider = kvlab.tiny_model("llama", layers=2, hidden=64, q_heads=4, kv_heads=4, vocab=128, intermediate=128,
                                 device="cpu", dtype=torch.float32)
        with pytest.raises(ValueError, match="built for \\[K; V\\] of 128 elements per token, but the model writes 64"):
            decode.cached_decode(model, torch.tensor([[1, 2]]), 1, cache=longctx.LatentKVCache(wider, 8))
    finally:
        use_paged_attention(model)


def test_cached_decode_refuses_a_used_cache(model):
    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    try:
        cache = DynamicCache()
        decode.cached_decode(model, torch.tensor([[1, 2]]), 1, cache=cache)
        with pytest.raises(ValueError, match="cache must be empty"):
            decode.cached_decode(model, torch.tensor([[1, 2]]), 1, cache=cache)
        with pytest.raises(TypeError, match="cache must be a transformers Cache"):
            decode.cached_decode(model, torch.tensor([[1, 2]]), 1, cache={})
    finally:
        use_paged_attention(model)


def test_mamba_forward_refuses_ids_outside_the_vocabulary():
    mamba = kvlab.tiny_model("mamba", layers=1, hidden=32, vocab=64, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 64\)"):
        kvlab.cache.ssm.mamba_forward(mamba, torch.tensor([[1, 64]]))
    with pytest.raises(TypeError, match="input_ids must be an int64 tensor"):
        kvlab.cache.ssm.mamba_forward(mamba, torch.tensor([[1.0, 2.0]]))


def test_decode_read_refuses_nan_queries():
    cache = layout.new_cache("BHTD", batch=1, length=4, kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu")
    q = torch.full((1, 2, 16), float("nan"))
    with pytest.raises(ValueError, match="q holds NaN"):
        layout.decode_read(cache, q)


# --------------------------------------------------------------------------- the long-context cache layers


def _layer_state(layer) -> list:
    """Every tensor and count a cache layer holds, flattened (QuantizedTensor fields included)."""
    out = []
    for name in ("keys", "values", "positions", "seen", "qkeys", "qvalues", "latent", "is_initialized"):
        value = getattr(layer, name, None)
        if isinstance(value, longctx.QuantizedTensor):
            out += [value.codes, value.scale, value.zero]
        else:
            out.append(value)
    return out


def _same_layer_state(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


_ORTHONORMAL_32 = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))[0]
LAYER_KINDS = {
    "sink": lambda: longctx.BoundedLayer(num_sink=2, window=5),
    "kivi": lambda: longctx.QuantizedLayer(bits=4, group_size=4, residual=3),
    "latent": lambda: longctx.LatentLayer(_ORTHONORMAL_32, torch.zeros(32), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8),
                                          1.0),  # full rank: 2 heads x head_dim 8 x (K and V)
}


@pytest.mark.parametrize("kind", LAYER_KINDS)
@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=12))
def test_cache_layer_update_is_all_or_nothing(kind, steps):
    """A failing update (values of the wrong width) between valid ones leaves the layer as it was;
    the faulty layer ends equal to a twin that only saw the valid updates."""
    clean, faulty = LAYER_KINDS[kind](), LAYER_KINDS[kind]()
    gen = torch.Generator().manual_seed(len(steps))
    for count, fail_first in steps:
        k, v = torch.randn(1, 2, count, 8, generator=gen), torch.randn(1, 2, count, 8, generator=gen)
        if fail_first and faulty.is_initialized:
            before = _layer_state(faulty)
            with pytest.raises(RuntimeError):
                faulty.update(k, v[..., :4])
            assert _same_layer_state(before, _layer_state(faulty))
        out_clean, out_faulty = clean.update(k, v), faulty.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(out_clean, out_faulty))
    assert _same_layer_state(_layer_state(clean), _layer_state(faulty))


@pytest.mark.parametrize("lay", ["BHTD", "NHD"])
@settings(max_examples=15, deadline=None)
@given(steps=st.lists(st.sampled_from(["ok", "shape", "dtype", "nan"]), min_size=1, max_size=6))
def test_layout_append_token_is_all_or_nothing(lay, steps):
    cache = layout.new_cache(lay, batch=2, length=2, capacity=10, kv_heads=2, head_dim=8, dtype=torch.float32,
                             device="cpu", block_size=4)
    gen = torch.Generator().manual_seed(len(steps))
    for step in steps:
        k, v = torch.randn(1, 2, 2, 8, generator=gen), torch.randn(1, 2, 2, 8, generator=gen)
        before = (cache.length, cache.k.clone(), cache.v.clone())
        if step == "ok":
            layout.append_token(cache, k, v)
            assert cache.length == before[0] + 1
            continue
        k = {"shape": k[:, :1], "dtype": k.double(), "nan": k.fill_(math.nan)}[step]
        with pytest.raises((TypeError, ValueError)):
            layout.append_token(cache, k, v)
        assert cache.length == before[0] and torch.equal(cache.k, before[1]) and torch.equal(cache.v, before[2])


