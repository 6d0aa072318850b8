"""kvlab.lab.streams.needle_probe on a small random model: a window that holds everything scores
the answer as the full cache does, the needle's place and distance are where they were put, and bad
arguments are refused."""

import math

import pytest
import torch

import kvlab
from kvlab.lab.streams import needle_probe

SMALL = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, intermediate=128, vocab=512)


@pytest.fixture(scope="module")
def llama():
    return kvlab.tiny_model("llama", **SMALL)


def _ids(n, seed):
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def test_a_window_that_holds_everything_scores_as_the_full_cache(llama):
    hay, needle, q, a = _ids(40, 0), _ids(6, 1), _ids(4, 2), _ids(3, 3)
    p = needle_probe(llama, hay, needle, q, a, depth=0.5, num_sink=0, window=100)
    assert p.in_cache and math.isclose(p.full_nll, p.evicting_nll, rel_tol=1e-4, abs_tol=1e-4)
    assert p.distance == (20 + 6 + 20 + 4 - 1) - 20  # from the needle to the question's last token


def test_the_needle_leaves_a_short_window_unless_it_is_near_the_end(llama):
    hay, needle, q, a = _ids(40, 0), _ids(6, 1), _ids(4, 2), _ids(3, 3)
    middle = needle_probe(llama, hay, needle, q, a, depth=0.5, num_sink=2, window=10)
    end = needle_probe(llama, hay, needle, q, a, depth=1.0, num_sink=2, window=12)
    assert not middle.in_cache and end.in_cache
    assert middle.full_nll == pytest.approx(
        needle_probe(llama, hay, needle, q, a, 0.5, 2, 30).full_nll
    )  # the full cache does not depend on the window


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(depth=1.5), ValueError, "depth"),
        (dict(depth=True), TypeError, "depth"),
        (dict(window=0), ValueError, "window"),
        (dict(needle=torch.zeros(3)), TypeError, "needle must be a 1-D integer"),
    ],
)
def test_bad_arguments_are_refused(llama, kwargs, error, words):
    args = dict(
        haystack=_ids(20, 0),
        needle=_ids(4, 1),
        question=_ids(3, 2),
        answer=_ids(2, 3),
        depth=0.5,
        num_sink=1,
        window=8,
    )
    with pytest.raises(error, match=words):
        needle_probe(llama, **(args | kwargs))
