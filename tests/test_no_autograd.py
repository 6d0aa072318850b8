"""Every decode loop, step and engine path runs with autograd off (issue 25).

Autograd on costs a decode step its graph bookkeeping on every operator; a forward pre-hook on the
model's decoder layers fails the call that reaches one with gradients enabled.
"""

import pytest
import torch

import kvlab
import kvlab.decode
from kvlab.decode import decode_steps
from kvlab.serving.engine import Engine
from kvlab.serving.paged_decode import paged_generate


def _autograd_off(module, args):
    if (
        torch.compiler.is_compiling()
    ):  # traced, not run: the compiled step is checked where it is called
        return
    assert torch.is_inference_mode_enabled() or not torch.is_grad_enabled(), type(module).__name__


@pytest.fixture(scope="module")
def model():
    m = kvlab.tiny_model("llama", layers=2)
    hooks = [layer.register_forward_pre_hook(_autograd_off) for layer in m.model.layers]
    yield m
    for hook in hooks:
        hook.remove()


def _prompt(model, n=9):
    return torch.randint(
        0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize("method", ["naive", "cached", "static"])
def test_decode_loops_run_without_autograd(model, method):
    assert torch.is_grad_enabled()  # the caller's default: the loop must turn it off itself
    tokens = list(decode_steps(method, model, _prompt(model), 4))
    assert len(tokens) == 4


def test_compiled_static_step_runs_without_autograd(model, monkeypatch):
    step = kvlab.decode.StaticStep.step

    def checked(self, *args):
        _autograd_off(self.model, args)
        return step(self, *args)

    monkeypatch.setattr(kvlab.decode.StaticStep, "step", checked)
    assert kvlab.static_decode(model, _prompt(model), 3, compile=True).shape == (1, 3)


def test_paged_loop_and_engine_run_without_autograd(model):
    prompts = [_prompt(model, n)[0].tolist() for n in (5, 11)]
    assert len(paged_generate(model, prompts, 3, block_size=4, attention="reference").tokens) == 2
    engine = Engine(model, num_blocks=16, block_size=4, attention="reference", cuda_graphs=False)
    assert all(len(out) == 3 for out in engine.generate(prompts, 3))
