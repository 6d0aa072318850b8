"""kvlab.speculative: the speculative loop decodes exactly greedy's tokens, on random tiny models for
k from 1 to 8 with both proposers, and on the real model against transformers' generate; bad input
is refused before anything runs."""

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.decode import cached_decode
from kvlab.lab.speculative import replay
from kvlab.speculative import EarlyExit, prompt_lookup, speculative_decode, speculative_steps

_MODELS = {}


def _model(arch, seed):
    if (arch, seed) not in _MODELS:
        _MODELS[arch, seed] = kvlab.tiny_model(arch, seed=seed)
    return _MODELS[arch, seed]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arch=st.sampled_from(("llama", "qwen2", "mistral")),
    seed=st.integers(0, 1),
    draft=st.sampled_from(("prompt_lookup", "early_exit")),
    k=st.integers(1, 8),
    prompt=st.integers(1, 24),
    repeat=st.integers(0, 16),
    new=st.integers(1, 20),
    static=st.booleans(),
    data=st.data(),
)
def test_tokens_equal_greedy(arch, seed, draft, k, prompt, repeat, new, static, data):
    model = _model(arch, seed)
    ids = torch.tensor([data.draw(st.lists(st.integers(0, 40), min_size=prompt, max_size=prompt))])
    ids = torch.cat([ids, ids[:, :repeat]], dim=1)  # a repeat gives prompt lookup work to do
    layers = data.draw(st.integers(1, model.config.num_hidden_layers - 1))
    extra = dict({"layers": layers} if draft == "early_exit" else {}, static=static)
    out = speculative_decode(model, ids, new, draft=draft, k=k, **extra)
    assert torch.equal(out, cached_decode(model, ids, new))
    steps = list(speculative_steps(model, ids, new, draft=draft, k=k, **extra))
    assert sum(len(s.tokens) for s in steps) == new
    assert all(s.accepted <= s.proposed <= k and len(s.tokens) == s.accepted + 1 for s in steps)
    if draft == "prompt_lookup":  # counting on the greedy output gives the loop's own steps
        counted = replay(ids[0].tolist(), out[0].tolist(), k)
        assert counted == [(s.proposed, s.accepted) for s in steps[1:]]


def test_gpt2_prompt_lookup_and_zero_tokens():
    model = _model("gpt2", 0)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    expected = cached_decode(model, ids, 12)
    assert torch.equal(speculative_decode(model, ids, 12, k=5), expected)
    assert torch.equal(speculative_decode(model, ids, 12, k=5, static=True), expected)
    assert speculative_decode(model, ids, 0).shape == (1, 0)


def test_compiled_verify_is_one_graph_with_no_recompiles(monkeypatch):
    """The static verify pass has one shape, [1, k + 1]: traced whole and compiled once for every
    step of a request, tokens equal to greedy's."""
    from kvlab import speculative

    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    options = dict(backend=counting_backend, fullgraph=True)
    monkeypatch.setattr(speculative, "COMPILE_OPTIONS", options)
    model = _model("llama", 0)
    ids = torch.tensor([[3, 4, 5, 6, 7, 3, 4, 5, 9, 9, 3, 4]])
    steps = list(speculative_steps(model, ids, 20, k=4, static=True, compile=True))
    assert len(steps) > 3 and len(graphs) == 1, f"{len(graphs)} graphs for {len(steps)} steps"
    tokens = [t for s in steps for t in s.tokens]
    assert tokens == cached_decode(model, ids, 20)[0].tolist()


def test_prompt_lookup_finds_the_first_continuation():
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 3], 8) == [9, 1, 2, 3]
    assert prompt_lookup([4, 1, 7, 1], 3) == [7, 1]  # the 1-gram when no 2-gram recurs
    assert prompt_lookup([1, 2, 3], 3) == []
    assert prompt_lookup([1], 3) == []


def test_early_exit_leaves_the_model_whole():
    model = _model("llama", 0)
    every = model.config.num_hidden_layers
    draft = EarlyExit(model, 1)
    assert len(draft([1, 2, 3, 4], 3)) == 3
    assert len(draft([1, 2, 3, 5, 6], 2)) == 2  # cropped back to the common prefix, then on
    assert model.config.num_hidden_layers == every


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"k": 0}, ValueError, "k must be an int in [1, 65)"),
        ({"k": 2.0}, TypeError, "k must be an int"),
        ({"draft": "medusa"}, ValueError, "draft"),
        ({"layers": 1}, ValueError, "layers is for draft='early_exit' only"),
        ({"draft": "early_exit", "layers": 0}, ValueError, "layers must be an int"),
        ({"draft": "early_exit", "layers": 99}, ValueError, "layers must be an int"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens"),
        ({"input_ids": torch.ones(2, 4, dtype=torch.long)}, ValueError, "batch 1"),
        ({"input_ids": torch.ones(1, 4)}, TypeError, "input_ids"),
        ({"model": "llama"}, TypeError, "model"),
        ({"static": 1}, TypeError, "static must be"),
        ({"compile": True}, ValueError, "compile is for static=True only"),
    ],
)
def test_bad_input_is_refused(kwargs, error, words):
    call = {"model": _model("llama", 0), "input_ids": torch.ones(1, 4, dtype=torch.long)}
    call.update({"max_new_tokens": 4, **kwargs})
    with pytest.raises(error, match=re.escape(words)):
        speculative_decode(**call)


def test_early_exit_refuses_gpt2():
    with pytest.raises(ValueError, match="model.model.layers"):
        speculative_decode(_model("gpt2", 0), torch.ones(1, 4, dtype=torch.long), 4, "early_exit")


@pytest.fixture(scope="module")
def pretrained():
    return kvlab.pretrained_model()


@pytest.mark.parametrize(
    "draft, k, static",
    [("prompt_lookup", 1, False), ("prompt_lookup", 8, False), ("prompt_lookup", 5, True)]
    + [("early_exit", 3, False)],
)
def test_real_model_equals_generate(pretrained, draft, k, static):
    from kvlab.lab.speculative import generate_run, task_ids

    model, tokenizer = pretrained
    ids = task_ids(tokenizer, "quote")
    out = speculative_decode(model, ids, 12, draft=draft, k=k, static=static)
    assert torch.equal(out, generate_run(model, ids, 12)())
