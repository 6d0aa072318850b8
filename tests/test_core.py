"""hardware, timing and models: the specifications, shapes and instruments every section uses."""

import dataclasses

import pytest
import torch

import kvlab
from kvlab.theory.specs import SPECS, spec
from kvlab.lab.hardware import calibrate, stamp, stamp_line
from kvlab.theory.shapes import SHAPES, ModelShape
from kvlab.lab.models import load_model, tiny_model
from kvlab.lab.timing import measure


def test_specs_have_every_device_and_field():
    assert set(SPECS) == {"h100-sxm", "h200", "b200", "mi300x", "a100-80gb", "l4", "t4"}
    for key, s in SPECS.items():
        assert s.hbm_bytes > 0 and s.hbm_bytes_per_s > 0 and s.bf16_flops > 0 and s.dies >= 1, key
        assert s.die_bytes_per_s * s.dies == pytest.approx(s.hbm_bytes_per_s, rel=0.02), key
        assert s.source
    # Seed 004 appendix B.4: ridge points 295, 281 and 247 FLOP/B.
    assert round(SPECS["h100-sxm"].ridge_point) == 295
    assert round(SPECS["b200"].ridge_point) == 281
    assert round(SPECS["mi300x"].ridge_point) == 247


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match="unknown device 'h300'.*h100-sxm"):
        spec("h300")


def test_stamp_names_device_and_versions():
    s = stamp()
    assert {"device", "driver", "torch", "triton", "transformers", "date"} <= set(s)
    assert s["torch"] == torch.__version__
    assert s["device"] in stamp_line(s)


@pytest.mark.parametrize("capability, want", [((7, 0), torch.float16), ((7, 5), torch.float16),
                                              ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_gpu_dtype_is_bf16_only_with_bf16_units(monkeypatch, capability, want):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert kvlab.lab.hardware.device_and_dtype("cuda") == (torch.device("cuda"), want)  # V100, T4, A100, H100
    assert kvlab.lab.hardware.device_and_dtype("cuda", torch.float32)[1] == torch.float32  # asked for: kept
    assert kvlab.lab.hardware.device_and_dtype("cpu")[1] == torch.float32


def test_calibrate_measures_positive_ceilings():
    c = calibrate()
    assert c.copy_bytes_per_s > 1e8 and c.matmul_flops > 1e8
    assert calibrate() is c  # once per process


def test_measure_counts_calls_and_validates():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, reps=4, device="cpu")
    assert len(calls) == 6 and len(t.times) == 4 and t.min <= t.median <= t.max
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        measure(lambda: None, reps=0)
    with pytest.raises(TypeError, match="warmup must be an int"):
        measure(lambda: None, warmup=1.5)


def test_kv_bytes_per_token_from_the_seeds():
    assert SHAPES["llama-3-8b"].kv_bytes_per_token() == 131_072  # seed 000 section 9.3
    assert SHAPES["llama-3-70b"].kv_bytes_per_token() == 327_680  # seed 004 appendix B.4
    assert SHAPES["llama-3.1-405b"].kv_bytes_per_token() == 516_096  # seed 004 B.3
    assert SHAPES["llama-2-13b"].kv_bytes_per_token() == 819_200  # seed 004 section 2.1: 0.82 MB
    assert SHAPES["deepseek-v2"].kv_bytes_per_token() == 69_120  # seed 004 section 2.1, MLA
    assert SHAPES["llama-3-8b"].kv_bytes_per_token(1) == 65_536


def test_shapes_have_the_issue_keys_and_seed_parameter_counts():
    assert {"llama-3-8b", "llama-3-70b", "llama-3.1-405b", "llama-2-13b", "mixtral-8x7b", "mistral-7b",
            "deepseek-v2", "llama-3.2-1b", "qwen2.5-0.5b", "smollm2-135m"} <= set(SHAPES)
    assert SHAPES["llama-3-8b"].params == 8.03e9
    assert SHAPES["llama-3-70b"].params == 70e9
    assert SHAPES["llama-3.1-405b"].params == 405e9
    assert SHAPES["mistral-7b"].window == 4096


def test_model_shape_rejects_nonsense():
    with pytest.raises(ValueError, match="layers must be a positive int"):
        ModelShape("x", 0, 8, 8, 64, 512, 1e6, 100)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelShape("x", 2, 8, 3, 64, 512, 1e6, 100)
    with pytest.raises(ValueError, match="bytes_per_element must be > 0"):
        SHAPES["llama-3-8b"].kv_bytes_per_token(0)


@pytest.mark.parametrize("key, arch", [("llama-3.2-1b", "llama"), ("qwen2.5-0.5b", "qwen2"),
                                       ("smollm2-135m", "llama"), ("llama-3-8b", "llama")])
def test_from_config_recovers_published_shapes(key, arch):
    # Build only the config (a real-shape model would be gigabytes): the shape must survive the round trip,
    # and the parameter count from the config must be within 2% of the published one.
    from kvlab.lab.models import _config

    shape = SHAPES[key]
    config = _config(arch, shape, 4096)
    if key in ("llama-3.2-1b", "smollm2-135m", "qwen2.5-0.5b"):
        config.tie_word_embeddings = True  # these checkpoints share the embedding and the output head
    back = ModelShape.from_config(config, name=shape.name)
    for field in ("layers", "q_heads", "kv_heads", "head_dim", "hidden", "vocab"):
        assert getattr(back, field) == getattr(shape, field), field
    assert back.params == pytest.approx(shape.params, rel=0.02)


@pytest.mark.parametrize("arch", kvlab.lab.models.ARCHITECTURES)
def test_tiny_model_is_real_architecture_with_its_shape(arch):
    m = tiny_model(arch, layers=2, hidden=64, q_heads=4, intermediate=128, vocab=300)
    assert m.config.model_type == arch and not m.training
    counted = sum(p.numel() for p in m.parameters())
    assert m.shape.params == pytest.approx(counted, rel=0.02)  # from_config counts what is there
    logits = m(torch.randint(0, 300, (2, 5))).logits
    assert logits.shape == (2, 5, 300)


def test_tiny_model_cpu_size_is_weight_heavy():
    m = tiny_model("llama")
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    assert 20e6 < weight_bytes < 200e6  # tens of MB: weight reads matter on a CPU decode step
    assert m.shape.group == 4


def test_tiny_model_bad_arguments():
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny_model("bert")
    with pytest.raises(ValueError, match="size must be 'cpu' or 'real'"):
        tiny_model("llama", size="huge")
    with pytest.raises(ValueError, match="kv_heads .* must equal q_heads"):
        tiny_model("gpt2", layers=1, hidden=64, q_heads=4, kv_heads=2)


def test_load_model_offline_says_what_to_do(monkeypatch):
    # No network in tests: make the hub client fail as it does offline, and check what kvlab says.
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(RuntimeError, match="HuggingFaceTB/SmolLM2-135M.*tiny_model"):
        load_model("smollm2-135m")
    assert dataclasses.is_dataclass(SHAPES["gpt2"])
