"""kvlab.theory.speculative: E(alpha, k) checked by counting every accept pattern, the roofline's
verify cost against the seed's ridge, the speed-up and best k on both sides of the ridge."""

import itertools
import math

import pytest

from kvlab.theory.roofline import ridge_batch
from kvlab.theory.speculative import (
    acceptance_rate,
    best_k,
    empty_fraction,
    expected_tokens,
    request_speedup,
    speedup,
    verify_time,
)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.77, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_expected_tokens_by_counting(alpha, k):
    # Every pattern of right/wrong guesses, weighted by its probability: the step keeps the right
    # prefix and one token more.
    expected = 0.0
    for pattern in itertools.product((True, False), repeat=k):
        p = math.prod(alpha if right else 1 - alpha for right in pattern)
        kept = next((i for i, right in enumerate(pattern) if not right), k)
        expected += p * (kept + 1)
    assert expected_tokens(alpha, k) == pytest.approx(expected)


def test_acceptance_rate_counts_rejections():
    assert acceptance_rate([(4, 4), (4, 1), (0, 0), (3, 0)]) == 5 / 7
    assert acceptance_rate([(0, 0)]) == 0.0
    assert empty_fraction([(0, 0), (2, 1)]) == 0.5
    with pytest.raises(ValueError, match="accepted"):
        acceptance_rate([(2, 3)])


def test_verify_time_flat_until_the_ridge():
    b = ridge_batch("h100-sxm")  # the seed's ridge: hundreds of positions per weight read
    assert b == pytest.approx(295, abs=1)  # 989 TFLOP/s over 3.35 TB/s, w_p = 2
    assert verify_time(1.0, 9, b) == 1.0
    assert verify_time(1.0, 2 * round(b), b) == pytest.approx(2 * round(b) / b)


def test_speedup_and_best_k_on_both_sides_of_the_ridge():
    assert speedup(0.8, 4, 1.0, 1.0) == pytest.approx(expected_tokens(0.8, 4))
    assert speedup(0.0, 4, 1.0, 2.0) == 0.5  # nothing accepted, a dearer step: slower
    assert speedup(0.9, 4, 1.0, 1.0, empty=1.0) == 1.0
    gpu_k, gpu_s = best_k(0.8, ridge_batch("h100-sxm"))
    cpu_k, cpu_s = best_k(0.8, 1.0)  # ridge at batch 1: every position costs a step
    assert gpu_k > cpu_k and gpu_s > 1 > cpu_s
    assert best_k(0.8, ridge_batch("h100-sxm"), draft_fraction=0.5)[0] < gpu_k


def test_request_speedup_keeps_the_prefill():
    assert request_speedup(2.0, 0.0, 1.0, 11) == 2.0
    assert 1 < request_speedup(2.0, 10.0, 1.0, 11) < 2.0
