"""kvlab.lab.ssm_timing: the step-time measurement runs on attention and Mamba models and refuses bad input.
"""

import pytest

import kvlab
from kvlab.lab.ssm_timing import decode_step_times, scan_inputs


def test_decode_step_times_runs_attention_and_mamba_models():
    models = {"llama": kvlab.tiny_model("llama", layers=1, hidden=32, q_heads=2, kv_heads=1, intermediate=32, vocab=64),
              "mamba": kvlab.tiny_model("mamba", layers=1, hidden=16, vocab=64)}
    times = decode_step_times(models, [3, 20], warmup=0, reps=2)
    assert set(times) == {"llama", "mamba"}
    assert all(len(v) == 2 and all(len(t.times) == 2 for t in v) for v in times.values())
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        decode_step_times(models, [0])


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "scan_inputs negative": (lambda: scan_inputs(-1, 4, 4, 4), ValueError, r"batch must be an int >= 1"),
    "decode_step_times list": (lambda: decode_step_times([], [4]), TypeError, "models must be"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
