"""kvlab.theory.long_context: the rules page 08's verdicts are taken by, tested at their
boundaries."""

import math
import statistics

import pytest

from kvlab.theory import long_context as lc


def test_uniform_share_is_the_mean_of_one_over_t_plus_one():
    assert lc.uniform_share(20, first=1, skip=16) == pytest.approx(
        statistics.fmean(1 / (t + 1) for t in range(16, 20))
    )
    assert lc.uniform_share(10, first=4, skip=0) == pytest.approx(
        statistics.fmean(min(1, 4 / (t + 1)) for t in range(10))
    )
    with pytest.raises(ValueError, match="skip"):
        lc.uniform_share(10, skip=11)


def test_first_eviction_is_the_cache_size():
    assert lc.first_eviction(4, 60) == 64 and lc.first_eviction(0, 64) == 64
    with pytest.raises(ValueError, match="window"):
        lc.first_eviction(4, 0)


def test_unseen_distances_past_the_training_context():
    context = 8192
    assert not lc.unseen_distances(context, context) and lc.unseen_distances(context + 1, context)
    assert not lc.unseen_distances(int(0.9 * context), context) and lc.unseen_distances(
        int(1.1 * context), context
    )
    with pytest.raises(ValueError, match="context"):
        lc.unseen_distances(10, 0)


def test_same_up_to_rounding_at_its_gap():
    assert lc.same_up_to_rounding(0.9 * lc.ROUNDING_GAP) and not lc.same_up_to_rounding(
        1.1 * lc.ROUNDING_GAP
    )
    assert lc.same_up_to_rounding(0.0)


@pytest.mark.parametrize("uniform", [0.01, 0.2])  # the share floor decides, then the factor
def test_sink_heads_at_the_threshold(uniform):
    threshold = lc.sink_threshold(uniform)
    assert threshold == max(lc.SINK_SHARE, lc.SINK_FACTOR * uniform)
    share = [[0.9 * threshold, 1.1 * threshold], [threshold, 0.0]]
    heads = lc.sink_heads(share, uniform)
    assert [(layer, head) for layer, head, _ in heads] == [(0, 1), (1, 0)]
    with pytest.raises(ValueError, match="uniform"):
        lc.sink_threshold(0.0)


def test_outliers_at_the_factor():
    f = lc.OUTLIER_FACTOR
    assert lc.outlier_count([0.9 * f, f, 1.1 * f, 1.0]) == 2
    assert lc.keys_have_outliers([1.1 * f, 1.0], [0.9 * f, 1.0])
    assert not lc.keys_have_outliers([1.1 * f, 1.0], [1.1 * f, 1.0])


def test_t95_matches_the_table_and_the_expansion():
    assert lc.t95(1) == 12.706 and lc.t95(30) == 2.042
    assert lc.t95(31) == pytest.approx(2.0395, abs=1e-3) and lc.t95(120) == pytest.approx(
        1.9799, abs=1e-3
    )


def test_paired_spread_resolves_exactly_when_the_interval_excludes_zero():
    noise = [0.3, -0.1, 0.2, -0.4, 0.0, 0.1]
    base = [1.0] * len(noise)
    sd = statistics.stdev(noise)
    half = lc.t95(len(noise) - 1) * sd / math.sqrt(len(noise))
    for scale, resolved in ((0.9, False), (1.1, True)):
        shift = scale * half - statistics.fmean(
            noise
        )  # the mean difference at 0.9 and 1.1 of the half width
        sp = lc.paired_spread(base, [1.0 + d + shift for d in noise])
        assert sp.half_width == pytest.approx(half) and sp.mean == pytest.approx(scale * half)
        assert sp.resolved is resolved and sp.low == pytest.approx(sp.mean - half)
    with pytest.raises(ValueError, match="pair up"):
        lc.paired_spread([1, 2], [1])
    with pytest.raises(ValueError, match="at least 2"):
        lc.paired_spread([1], [1])
    with pytest.raises(ValueError, match="finite"):
        lc.paired_spread([1, 2], [1, float("nan")])


def test_block_means_drop_the_partial_block():
    assert lc.block_means([1, 3, 5, 7, 9], 2) == [2.0, 6.0]
    with pytest.raises(ValueError, match="block"):
        lc.block_means([1.0], 0)
