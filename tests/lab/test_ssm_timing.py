"""kvlab.lab.ssm_timing: the step-time measurement runs on attention and Mamba models and refuses
bad input."""

import pytest

import kvlab
from kvlab.lab.ssm_timing import decode_step_times, mamba_path, quiet_mamba_fallback, scan_inputs


def test_decode_step_times_runs_attention_and_mamba_models():
    models = {
        "llama": kvlab.tiny_model(
            "llama", layers=1, hidden=32, q_heads=2, kv_heads=1, intermediate=32, vocab=64
        ),
        "mamba": kvlab.tiny_model("mamba", layers=1, hidden=16, vocab=64),
    }
    times = decode_step_times(models, [3, 20], warmup=0, reps=2)
    assert set(times) == {"llama", "mamba"}
    assert all(len(v) == 2 and all(len(t.times) == 2 for t in v) for v in times.values())
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        decode_step_times(models, [0])
    # Ceilings timed among the steps come back under their names, with their scatter.
    from kvlab.lab.hardware import read_probe

    probed = decode_step_times(models, [3], warmup=0, reps=2, probes={"read": read_probe(1 << 20)})
    assert probed["read"].unit == "B/s" and probed["read"].rate > 0 and probed["read"].spread >= 0


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "scan_inputs negative": (
        lambda: scan_inputs(-1, 4, 4, 4),
        ValueError,
        r"batch must be an int >= 1",
    ),
    "decode_step_times list": (lambda: decode_step_times([], [4]), TypeError, "models must be"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_fallback_warnings_are_held_back_only_inside_the_block(caplog):
    import logging

    log = logging.getLogger("transformers.integrations.hub_kernels")
    before = log.level
    with caplog.at_level(logging.WARNING):
        with quiet_mamba_fallback():
            log.warning(
                "`causal_conv1d_fn` is falling back to its reference PyTorch implementation"
            )
        assert log.level == before
        log.warning("outside the block")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["outside the block"]
    assert "reference PyTorch path" in mamba_path("cpu")


def test_mamba_measurements_print_no_fallback_lines():
    # A fresh process, so that transformers' warn-once caches are empty (issue 26, item 6).
    import subprocess
    import sys

    code = (
        "import kvlab; from kvlab.lab.ssm_timing import decode_step_times,"
        " quiet_mamba_fallback\nwith quiet_mamba_fallback():\n    m = kvlab.tiny_model('mamba',"
        " layers=1, hidden=16, vocab=64)\ndecode_step_times({'mamba': m}, [4], warmup=0, reps=1)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        "falling back" not in out.stderr.lower()
        and "fast path is not available" not in out.stderr.lower()
    )
