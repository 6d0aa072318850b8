"""kvlab.show.readings.long_context: the sentences that depend on a measurement, each fed both outcomes (CONTRIBUTING.md, readings).
"""

import re

from kvlab.show.readings import long_context


def no_roles(text):
    assert not re.search(r"\{(glue|cite|doc|ref)", text), text
    return text


def test_long_context_stream_both_outcomes():
    args = dict(window=32, sinks=4, kl_sinks=0.05, vocab=4096, t_end=511, mass_recent=0.07)
    usual = no_roles(long_context.stream_reading(kl_before=0.0, kl_window=0.06, loss_full=8.3, loss_window=8.31,
                                                 mass_first=0.008, **args))
    odd = no_roles(long_context.stream_reading(kl_before=0.3, kl_window=0.0, loss_full=5.0, loss_window=6.0,
                                               mass_first=0.2, **args))
    assert "rounding error" in usual and "becomes positive" in usual and "hardly moves" in usual
    assert "no attention sinks" in usual and "near $\\ln V" in usual
    assert "a bug to report" in odd and "carried no weight" in odd and "moved from 5.000" in odd
    assert "more than their share" in odd and "away from" in odd
    no_sinks = long_context.stream_reading(kl_before=0.0, kl_window=0.06, loss_full=8.3, loss_window=8.31,
                                           mass_first=0.008, **{**args, "kl_sinks": None})
    assert "sinks plus" not in no_sinks


def test_long_context_conventions_rerotation_both_outcomes():
    same = no_roles(long_context.convention_reading(0.05, 0.049, 0.07))
    apart = no_roles(long_context.convention_reading(0.05, 0.2, 0.07))
    assert "about equally far" in same and "different amounts" in apart
    big = no_roles(long_context.rerotation_reading(95, 1.22, 0.05, 0.04))
    small = no_roles(long_context.rerotation_reading(95, 0.05, 0.01, 0.01))
    assert "not rounding errors" in big and "low-frequency" in small


def test_long_context_quant_kivi_fewer_both_outcomes():
    good = no_roles(long_context.quant_reading(2, 32, 2.0, 4.5, 0.1, 0.3, 0.2, 0.1, 6.4))
    odd = no_roles(long_context.quant_reading(2, 16, 5.0, 4.5, 0.3, 0.1, 0.2, 0.4, 4.0))
    assert "only the outlier channels pay" in good and "within 10%" in good and "not 8 times" in good
    assert "expected to win" in odd and "misses one measured RMS error by 40%" in odd
    agree = no_roles(long_context.kivi_reading(2, 32, 1.8, 0.001, 0.98))
    disagree = no_roles(long_context.kivi_reading(2, 0, 6.0, 0.3, 0.5))
    assert "still agrees" in agree and "only 50%" in disagree
    exact = no_roles(long_context.fewer_reading(512, 0.047, 128, 0.046, 2e-8))
    lossy = no_roles(long_context.fewer_reading(512, 0.047, 128, 0.046, 1e-3))
    assert "is exact" in exact and "lost something" in lossy
