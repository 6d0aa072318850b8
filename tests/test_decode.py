"""kvlab.decode: the three loops of sections 9.1 and 9.2 decode exactly what Hugging Face
``generate`` decodes (greedy, left-padded batches included), process the positions of 9.1's closed
form, and refuse bad input.
"""

import pytest
import torch

import kvlab
from kvlab.decode import StaticStep, cached_decode, naive_decode, new_static_cache, static_decode
from kvlab.theory.work import positions_processed

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


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_all_loops_match_generate(model, batch, padded):
    ids, mask = _prompt(batch, padded)
    extra = {} if mask is None else {"attention_mask": mask}
    expected = model.generate(ids, max_new_tokens=NEW, do_sample=False, **extra)[:, PROMPT:]
    assert expected.shape == (batch, NEW)
    for name, decode in DECODERS.items():
        got = decode(model, ids, NEW, attention_mask=mask)
        assert got.shape == (batch, NEW), name
        assert torch.equal(got, expected), f"{name} differs from generate"


def _count_forward_positions(model):
    """Count the token positions every forward pass feeds the model, as the embedding layer sees
    them."""
    seen = []
    handle = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].shape[1])
    )
    return seen, handle


@pytest.mark.parametrize("method, cached", [("naive", False), ("cached", True), ("static", True)])
def test_positions_processed_matches_the_real_loop(model, method, cached):
    ids, _ = _prompt(1, False)
    seen, handle = _count_forward_positions(model)
    try:
        DECODERS[method](model, ids, NEW)
    finally:
        handle.remove()
    assert sum(seen) == positions_processed(PROMPT, NEW, cached=cached)
    assert len(seen) == NEW  # one forward pass per generated token


def test_zero_new_tokens_runs_nothing(model):
    ids, mask = _prompt(3, True)
    seen, handle = _count_forward_positions(model)
    try:
        for decode in DECODERS.values():
            out = decode(model, ids, 0, attention_mask=mask)
            assert out.shape == (3, 0) and out.dtype == ids.dtype
    finally:
        handle.remove()
    assert seen == []


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (-1, ValueError, "max_new_tokens must be an int >= 0"),
        (2.0, TypeError, "max_new_tokens must be an int"),
        (True, TypeError, "max_new_tokens must be an int"),
        ("3", TypeError, "max_new_tokens must be an int"),
    ],
)
def test_bad_max_new_tokens(model, bad, error, words):
    ids, _ = _prompt(1, False)
    for decode in DECODERS.values():
        with pytest.raises(error, match=words):
            decode(model, ids, bad)


def test_bad_inputs(model):
    ids, _ = _prompt(2, False)
    for decode in DECODERS.values():
        with pytest.raises(TypeError, match="input_ids must hold integer token ids"):
            decode(model, ids.float(), 3)
        with pytest.raises(
            ValueError, match=r"attention_mask must have the shape of input_ids \[2, 7\]"
        ):
            decode(model, ids, 3, attention_mask=torch.ones(2, 6, dtype=torch.long))
        right_padded = torch.ones_like(ids)
        right_padded[0, -2:] = 0
        with pytest.raises(ValueError, match="left-padded"):
            decode(model, ids, 3, attention_mask=right_padded)
        with pytest.raises(ValueError, match=r"shape \[batch, prompt_length >= 1\]"):
            decode(model, ids[0], 3)


def test_compiled_static_step_is_one_graph_with_no_recompiles(model, monkeypatch):
    """What CUDA-graph replay needs (section 9.2): the step traced whole (fullgraph=True) and
    compiled once for 20 steps, on a batch with left padding; the tokens equal the cached loop's."""
    from kvlab import decode

    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward  # run the traced graph as is: no CUDA here to replay it

    torch._dynamo.reset()
    monkeypatch.setattr(decode, "COMPILE_OPTIONS", dict(backend=counting_backend, fullgraph=True))
    ids, mask = _prompt(2, True)
    got = static_decode(model, ids, 21, attention_mask=mask, compile=True)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 20 steps"
    assert decode.COMPILE_OPTIONS["fullgraph"]
    assert torch.equal(got, cached_decode(model, ids, 21, attention_mask=mask))


def test_static_loop_passes_cache_position_to_a_model_that_declares_it(model):
    """transformers' generate gives ``cache_position`` (the slots written) to a forward that
    declares it; so does the static loop, and the slots advance one per step."""
    seen = []

    class Declares(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        dtype = property(lambda self: self.inner.dtype)
        device = property(lambda self: self.inner.device)

        def forward(
            self,
            input_ids,
            attention_mask=None,
            position_ids=None,
            cache=None,
            past_key_values=None,
            use_cache=None,
            cache_position=None,
            logits_to_keep=0,
        ):
            seen.append(cache_position.tolist())
            kw = kvlab.versions.cache_kwargs(
                self.inner, cache if cache is not None else past_key_values
            )
            return self.inner(
                input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **kw,
            )

    ids = _prompt(1, False)[0]
    assert torch.equal(static_decode(Declares(model), ids, 4), static_decode(model, ids, 4))
    P = ids.shape[1]
    assert seen == [list(range(P)), [P], [P + 1], [P + 2]]


def test_decode_past_learned_positions_is_refused():
    gpt2 = kvlab.tiny_model(
        "gpt2",
        layers=1,
        hidden=32,
        q_heads=2,
        vocab=64,
        intermediate=64,
        max_positions=16,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(ValueError, match=r"prompt \(10\) \+ max_new_tokens \(7\) must be <= 16"):
        cached_decode(gpt2, torch.ones(1, 10, dtype=torch.long), 7)
    assert cached_decode(gpt2, torch.ones(1, 10, dtype=torch.long), 6).shape == (1, 6)


@pytest.fixture(scope="module")
def small_llama():
    """A two-layer Llama with a vocabulary of 128, for the refusals below."""
    return kvlab.tiny_model(
        "llama",
        layers=2,
        hidden=64,
        q_heads=4,
        kv_heads=2,
        vocab=128,
        intermediate=128,
        device="cpu",
        dtype=torch.float32,
        seed=5,
    )


@pytest.mark.parametrize(
    "loop", ["naive_decode", "cached_decode", "static_decode", "profile_decode"]
)
def test_decode_loops_refuse_token_ids_outside_the_vocabulary(small_llama, loop):
    for ids in (torch.tensor([[1, 128]]), torch.tensor([[-1, 2]])):
        with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 128\)"):
            getattr(kvlab, loop)(small_llama, ids, 2)


def test_static_decode_refuses_a_cache_beyond_memory(small_llama):
    with pytest.raises(MemoryError, match="static cache of 1 x 10000000002 tokens"):
        static_decode(small_llama, torch.tensor([[1, 2]]), 10**10)


def test_cached_decode_refuses_a_used_cache(small_llama):
    from transformers import DynamicCache

    cache = DynamicCache()
    cached_decode(small_llama, torch.tensor([[1, 2]]), 1, cache=cache)
    with pytest.raises(ValueError, match="cache must be empty"):
        cached_decode(small_llama, torch.tensor([[1, 2]]), 1, cache=cache)
    with pytest.raises(TypeError, match="cache must be a transformers Cache"):
        cached_decode(small_llama, torch.tensor([[1, 2]]), 1, cache={})


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "decode fractional mask": (
        lambda m: cached_decode(
            m, torch.ones(1, 3, dtype=torch.long), 2, attention_mask=torch.tensor([[0.5, 1.0, 1.0]])
        ),
        ValueError,
        r"only 0 \(padding\) and 1 \(token\), got values such as \[0.5\]",
    ),
    "decode without a model": (
        lambda m: cached_decode(None, torch.ones(1, 3, dtype=torch.long), 2),
        TypeError,
        r"model must be a Hugging Face causal LM",
    ),
    "static cache of no slots": (lambda m: new_static_cache(m, 0), ValueError, "max_len"),
    "static cache of negative slots": (lambda m: new_static_cache(m, -4), ValueError, "max_len"),
    "static cache of 2.5 slots": (lambda m: new_static_cache(m, 2.5), TypeError, "max_len"),
    "static cache past memory": (
        lambda m: new_static_cache(m, 10**12),
        MemoryError,
        "static cache of 1000000000000 slots",
    ),
    "static step past the last slot": (
        lambda m: _step(m).step(torch.tensor([[1]]), torch.tensor([[8]]), torch.ones(1, 8).long()),
        ValueError,
        r"position must be in \[0, 8\)",
    ),
    "static step mask longer than the cache": (
        lambda m: _step(m).step(torch.tensor([[1]]), torch.tensor([[2]]), torch.ones(1, 9).long()),
        ValueError,
        r"mask must have shape \[1, 8\]",
    ),
    "static step float position": (
        lambda m: _step(m).step(
            torch.tensor([[1]]), torch.tensor([[2.0]]), torch.ones(1, 8).long()
        ),
        TypeError,
        "position must be an integer",
    ),
    "static step token past the vocabulary": (
        lambda m: _step(m).step(
            torch.tensor([[128]]), torch.tensor([[2]]), torch.ones(1, 8).long()
        ),
        ValueError,
        "token must be token ids",
    ),
    "static step compile not a flag": (
        lambda m: StaticStep(m, {}, "no"),
        TypeError,
        "compile must be True or False",
    ),
    "static decode of a Mamba": (
        lambda m: static_decode(
            kvlab.tiny_model("mamba", layers=1, hidden=32, vocab=64), torch.tensor([[1, 2]]), 2
        ),
        ValueError,
        "model .MambaForCausalLM. has no attention layers",
    ),
    "static decode of meta ids": (
        lambda m: static_decode(m, torch.tensor([[1, 2]], device="meta"), 2),
        ValueError,
        "input_ids is on the meta device",
    ),
    "static decode of a meta model": (
        lambda m: static_decode(_meta_llama(), torch.tensor([[1, 2]]), 2),
        ValueError,
        "model is on the meta device",
    ),
}


def _step(model):
    from kvlab.versions import cache_kwargs

    step = StaticStep(model, cache_kwargs(model, new_static_cache(model, 8)), False)
    step.step(torch.tensor([[1]]), torch.tensor([[0]]), torch.ones(1, 8).long())  # a valid one
    return step


def _meta_llama():
    return kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, vocab=64).to("meta")


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(small_llama, name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call(small_llama)
