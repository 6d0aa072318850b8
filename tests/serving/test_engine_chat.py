"""The engine (notebook 11) on real chat requests: SmolLM2-135M-Instruct (Q4_1 weights, dequantized,
``kvlab.pretrained_model``) serves a few chat prompts that end at the tokenizer's end-of-turn token
at different steps, one cut by its length, and every request equals ``generate`` on its prompt alone
token for token (greedy, fp32, ``generate``'s own end-of-sequence handling)."""

import pytest
import torch

import kvlab
from kvlab.lab.pretrained import chat_ids
from kvlab.serving.engine import Engine

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = (
    "What is the capital of France?",
    "Say hello in Spanish.",
    "Name three primary colours.",
)
# the first two end at their end-of-turn token (at different steps), the third is cut here
MAX_NEW = 10


@pytest.fixture(scope="module")
def smol():
    return kvlab.pretrained_model()


def test_chat_requests_stop_at_the_end_of_turn_as_generate_does(smol):
    model, tokenizer = smol
    prompts = [
        chat_ids(
            tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )[0].tolist()
        for q in QUESTIONS
    ]
    model.set_attn_implementation("sdpa")
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False
        )
        expected.append(out[0, len(prompt) :].tolist())
    engine = Engine(
        model, num_blocks=32, block_size=16, max_batch=4, debug=True
    )  # eos_token_id="auto"
    assert engine.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    requests = [engine.add_request(p, MAX_NEW) for p in prompts]
    while engine.has_work():
        engine.step()
    assert [r.output for r in requests] == expected
    assert [r.finish_reason for r in requests] == ["stop", "stop", "length"]
    finished_at = [
        next(e.step for e in engine.events if e.kind == "finish" and e.request == r.id)
        for r in requests
    ]
    assert len(set(finished_at)) == 3  # three requests, three different steps
    assert engine.all_blocks_free_or_cached()
