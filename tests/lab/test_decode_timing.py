"""kvlab.lab.decode_timing: profile_decode times the tokens the loop produces; compile break-even
from profiles."""

import pytest
import torch

import kvlab
from kvlab.decode import cached_decode, naive_decode, static_decode
from kvlab.lab.decode_timing import (
    CompileBreakEven,
    DecodeProfile,
    compile_break_even,
    profile_decode,
)

DECODERS = {"naive": naive_decode, "cached": cached_decode, "static": static_decode}

PROMPT, NEW = 7, 10


@pytest.fixture(scope="module", params=kvlab.lab.models.ARCHITECTURES)
def model(request):
    # Small enough for a fast test, big enough to have GQA (llama, qwen2, mistral) or MHA (gpt2).
    return kvlab.tiny_model(
        request.param,
        layers=2,
        hidden=64,
        q_heads=4,
        intermediate=128,
        vocab=512,
        **({} if request.param == "gpt2" else {"kv_heads": 2}),
    )


def _prompt(batch, padded, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 512, (batch, PROMPT), generator=g)
    if not padded:
        return ids, None
    mask = torch.ones_like(ids)
    for row in range(batch):
        mask[row, : (2 * row + 1) % PROMPT] = 0  # a different amount of left padding per row
    return ids, mask


def test_profile_decode_times_the_same_tokens(model):
    ids, mask = _prompt(3, True)
    for method in DECODERS:
        prof = profile_decode(model, ids, NEW, method=method, attention_mask=mask)
        assert torch.equal(prof.tokens, cached_decode(model, ids, NEW, attention_mask=mask))
        assert len(prof.step_times) == NEW - 1
        assert prof.ttft > 0 and all(t > 0 for t in prof.step_times)
        assert prof.tokens_per_s == pytest.approx(3 * NEW / prof.total)
    with pytest.raises(ValueError, match="method must be one of"):
        profile_decode(model, ids, NEW, method="fast")


def _profile(steps):
    return DecodeProfile(
        "static", 1, 8, len(steps) + 1, 0.01, tuple(steps), torch.zeros(1, len(steps) + 1)
    )


def test_compile_break_even_from_profiles():
    eager = _profile([0.004] * 20)
    compiled = _profile([2.0, 0.5] + [0.001] * 18)  # compiles during its first two steps
    r = compile_break_even(eager, compiled, warm=4)
    assert isinstance(r, CompileBreakEven)
    # extra time (2.528 - 0.09 s) plus 21 tokens x 3 ms of gain
    assert r.compile_seconds == pytest.approx(2.528 - 0.09 + 21 * 0.003)
    # the two runs' cumulative times, extrapolated at their steady steps, cross at the break-even
    n = r.tokens
    assert 0.09 + (n - 21) * 0.004 == pytest.approx(2.528 + (n - 21) * 0.001, rel=1e-9)
    assert compile_break_even(eager, compiled, warm=8).compile_seconds == pytest.approx(
        r.compile_seconds
    )
    assert r.step_gain == pytest.approx(0.003) and r.tokens == pytest.approx(
        r.compile_seconds / 0.003
    )
    with pytest.raises(ValueError, match="warm"):
        compile_break_even(eager, _profile([0.001] * 3), warm=4)
    with pytest.raises(TypeError, match="DecodeProfile"):
        compile_break_even(eager, [0.1], warm=1)
    with pytest.raises(ValueError, match="same number"):
        compile_break_even(eager, _profile([0.001] * 12), warm=4)


def test_compile_payoff_cost_counts_the_first_steps_beyond_steady_ones():
    from kvlab.lab.decode_timing import CompilePayoff
    from kvlab.lab.timing import Timing

    eager = Timing(0.010, 0.010, 0.012, (0.010, 0.012))
    compiled = Timing(0.006, 0.006, 0.007, (0.006, 0.007))
    p = CompilePayoff(0.0, eager, compiled, (0.011, 0.010), (5.0, 0.5))
    assert p.cost_after(1) == pytest.approx(5.0 - 0.006 - 0.001)
    assert p.cost_after(2) == pytest.approx(5.5 - 0.012 - 0.001)
    assert p.step_gain == pytest.approx(0.004) and p.spread == pytest.approx(0.05 + 0.25 / 6)
    with pytest.raises(ValueError, match=r"warm must be an int in \[1, 3\)"):
        p.cost_after(3)


def test_compile_payoff_refuses_bad_counts_before_compiling(model):
    from kvlab.lab.decode_timing import compile_payoff

    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="rounds must be an int >= 2"):
        compile_payoff(model, ids, rounds=1)
    with pytest.raises(ValueError, match="warm must be an int >= 1"):
        compile_payoff(model, ids, warm=0)
