"""kvlab.lab.speculative: the counted replay, the race's token check, and the bench's contenders
(kvlab's loops and transformers' generate, plain and speculative) decoding the same tokens."""

import pytest
import torch

import kvlab
from kvlab.lab import speculative as lab
from kvlab.theory.speculative import acceptance_rate


def test_replay_counts_a_copied_output():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    output = [1, 2, 3, 4, 5, 6, 7, 8]  # copies the prompt: every guess after the first token hits
    steps = lab.replay(prompt, output, 3)
    assert steps == [(3, 3), (2, 2)]  # the last step guesses only what the request has room for
    assert acceptance_rate(steps) == 1.0
    assert lab.replay(prompt, [9, 10, 11], 4) == [(0, 0), (0, 0)]  # nothing recurs


def test_race_refuses_other_tokens():
    same, other = torch.tensor([[1, 2]]), torch.tensor([[1, 3]])
    result = lab.race({"a": lambda: same, "b": lambda: same}, rounds=1)
    assert len(result.seconds["a"]) == 2 and result.tokens == [1, 2]
    assert result.timed("a") == result.seconds["a"][1:]  # the cold first round does not count
    alone = lab.race({"a": lambda: same}, rounds=0)
    assert alone.timed("a") == alone.seconds["a"]  # unless it is the only one
    with pytest.raises(RuntimeError, match="b decoded other tokens than a"):
        lab.race({"a": lambda: same, "b": lambda: other}, rounds=0)


def test_contenders_decode_the_same_tokens():
    model = kvlab.tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    runs = lab.contenders(model, ids, 10)
    assert list(runs)[0] == "kvlab greedy"
    result = lab.race(runs, rounds=0)  # raises if any contender differs
    assert set(result.seconds) == set(runs)
    times = lab.verify_times(model, ids, (1, 5), reps=1)
    assert set(times) == {0, 1, 5}
    assert lab.predicted_speedup(model, ids, result.tokens, 4, times) > 0
