"""kvlab.kernels.ssm_scan: the Triton decode-step update against its reference, strides and
refusals."""

import pytest
import torch

from kvlab.kernels import selective_state_update, selective_state_update_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch, dim, nstate", [(1, 1, 1), (2, 37, 5), (3, 16, 16)])
@pytest.mark.parametrize("options", [False, True])
def test_triton_step_matches_reference(dtype, batch, dim, nstate, options):
    g = torch.Generator().manual_seed(batch * 100 + dim)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    state = rand(batch, dim, nstate)
    args = dict(
        u=rand(batch, dim),
        delta=rand(batch, dim),
        A=-torch.rand(dim, nstate, generator=g),
        B=rand(batch, nstate),
        C=rand(batch, nstate),
    )
    if options:
        args.update(
            D=torch.randn(dim, generator=g),
            z=rand(batch, dim),
            delta_bias=torch.randn(dim, generator=g),
            delta_softplus=True,
        )
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
    args = dict(
        u=uz[:, :8],
        delta=torch.rand(8, 2).T,
        A=-torch.rand(8, 4),
        B=torch.randn(2, 4),
        C=torch.randn(2, 4),
        z=uz[:, 8:],
    )
    ref_state = state.clone()
    torch.testing.assert_close(
        selective_state_update(state, **args), selective_state_update_ref(ref_state, **args)
    )
    with pytest.raises(ValueError, match="C has state=3"):
        selective_state_update(state, **{**args, "C": torch.zeros(2, 3)})
    with pytest.raises(TypeError, match="state must have dtype"):
        selective_state_update(state.double(), **{k: v.double() for k, v in args.items()})


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ssm_args(batch=3, dim=20, nstate=5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    return dict(
        state=rand(batch, dim, nstate),
        u=rand(batch, dim),
        delta=rand(batch, dim).abs(),
        A=-rand(dim, nstate).abs(),
        B=rand(batch, nstate),
        C=rand(batch, nstate),
        D=rand(dim),
        delta_bias=rand(dim),
    )


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
    y_ref = selective_state_update_ref(
        **{**args, "state": ref_state, strided: base}, delta_softplus=True
    )
    y = selective_state_update(**{**args, "state": kernel_state}, delta_softplus=True)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kernel_state, ref_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "fn", [selective_state_update, selective_state_update_ref], ids=["triton", "ref"]
)
def test_ssm_refuses_an_expanded_state_and_leaves_it_alone(fn):
    args = _ssm_args()
    row = args["state"][:1].clone()
    args["state"] = row.expand(3, -1, -1)
    with pytest.raises(ValueError, match="state has overlapping elements"):
        fn(**args)
    assert torch.equal(args["state"][0], row[0])


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "ssm u inside state": (
        lambda: (lambda a: selective_state_update_ref(**{**a, "u": a["state"][:, :, 0]}))(
            _ssm_args()
        ),
        ValueError,
        "state and u share memory",
    ),
    "ssm expanded state (ref)": (
        lambda: selective_state_update_ref(
            **{**_ssm_args(), "state": _ssm_args()["state"][:1].expand(3, -1, -1)}
        ),
        ValueError,
        "state has overlapping",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
