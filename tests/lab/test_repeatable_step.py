"""kvlab.lab.repeatable_step: every loop's repeatable step decodes what generate decodes, and cleans
up."""

import pytest
import torch

import kvlab
from kvlab.lab.repeatable_step import RepeatableStep, tile_prompt
from kvlab.lab.step_trace import trace_step
from kvlab.theory.work import STEP_METHODS


@pytest.fixture(scope="module")
def small():
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=64,
        q_heads=4,
        kv_heads=2,
        intermediate=128,
        vocab=256,
        device="cpu",
    )


def _ids(model, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


@pytest.mark.parametrize("method", STEP_METHODS)
def test_repeatable_step_decodes_what_generate_decodes(small, method):
    ids = tile_prompt(_ids(small, 2, 5, seed=3), 11)
    fed = torch.cat([ids, ids[:, -1:]], dim=1)  # the step feeds the last token once more
    expected = small.generate(
        fed, attention_mask=torch.ones_like(fed), max_new_tokens=1, do_sample=False
    )[:, -1]
    stepper = RepeatableStep(small, ids, method)
    try:
        for _ in range(3):  # reset() puts the cache back: every repeat gives the same token
            got = stepper.step()
            stepper.reset()
            assert torch.equal(torch.as_tensor(got).reshape(-1), expected), method
    finally:
        stepper.close()
    assert small.config._attn_implementation != "kvlab_paged"


def test_failed_paged_setup_restores_the_attention(small, monkeypatch):
    import kvlab.serving.paged_decode as paged

    before = small.config._attn_implementation

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(paged, "prefill", broken)
    with pytest.raises(RuntimeError, match="injected failure"):
        trace_step(small, _ids(small, 1, 4), method="paged")
    assert small.config._attn_implementation == before
