"""kvlab.cache.hf_cache and the layers built on it: a failed update changes nothing."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cache.latent import LatentLayer
from kvlab.cache.quantized import QuantizedLayer, QuantizedTensor
from kvlab.cache.window import BoundedLayer


def _layer_state(layer) -> list:
    """Every tensor and count a cache layer holds, flattened (QuantizedTensor fields included)."""
    out = []
    for name in (
        "keys",
        "values",
        "positions",
        "seen",
        "qkeys",
        "qvalues",
        "latent",
        "is_initialized",
    ):
        value = getattr(layer, name, None)
        if isinstance(value, QuantizedTensor):
            out += [value.codes, value.scale, value.zero]
        else:
            out.append(value)
    return out


def _same_layer_state(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b)
    )


_ORTHONORMAL_32 = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))[
    0
]

LAYER_KINDS = {
    "sink": lambda: BoundedLayer(num_sink=2, window=5),
    "kivi": lambda: QuantizedLayer(bits=4, group_size=4, residual=3),
    "latent": lambda: LatentLayer(
        _ORTHONORMAL_32, torch.zeros(32), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8), 1.0
    ),  # full rank: 2 heads x head_dim 8 x (K and V)
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
        k, v = (
            torch.randn(1, 2, count, 8, generator=gen),
            torch.randn(1, 2, count, 8, generator=gen),
        )
        if fail_first and faulty.is_initialized:
            before = _layer_state(faulty)
            with pytest.raises(RuntimeError):
                faulty.update(k, v[..., :4])
            assert _same_layer_state(before, _layer_state(faulty))
        out_clean, out_faulty = clean.update(k, v), faulty.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(out_clean, out_faulty))
    assert _same_layer_state(_layer_state(clean), _layer_state(faulty))
