"""kvlab.lab.models: random-weight Hugging Face models of the published shapes, Mamba and Jamba
included."""

import dataclasses

import pytest
import torch

import kvlab
from kvlab.lab.models import load_model, tiny_hybrid, tiny_model
from kvlab.theory.shapes import SHAPES, ModelShape


@pytest.mark.parametrize(
    "key, arch",
    [
        ("llama-3.2-1b", "llama"),
        ("qwen2.5-0.5b", "qwen2"),
        ("smollm2-135m", "llama"),
        ("llama-3-8b", "llama"),
    ],
)
def test_from_config_recovers_published_shapes(key, arch):
    # Build only the config (a real-shape model would be gigabytes): the shape must survive the
    # round trip, and the parameter count from the config must be within 2% of the published one.
    from kvlab.lab.models import _config

    shape = SHAPES[key]
    config = _config(arch, shape, 4096)
    if key in ("llama-3.2-1b", "smollm2-135m", "qwen2.5-0.5b"):
        # these checkpoints share the embedding and the output head
        config.tie_word_embeddings = True
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
    with pytest.raises(ValueError, match=r"size must be one of \('cpu', 'real'\)"):
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


def test_tiny_mamba_sizes_and_errors():
    m = kvlab.tiny_model("mamba", layers=1, hidden=16, vocab=64)
    assert isinstance(m.shape, kvlab.theory.shapes.SSMShape)
    assert m.shape.params == sum(p.numel() for p in m.parameters())
    assert "mamba" not in kvlab.lab.models.ARCHITECTURES
    with pytest.raises(ValueError, match="unknown SSMShape field"):
        kvlab.tiny_model("mamba", q_heads=4)
    with pytest.raises(ValueError, match="shape must be one of"):
        kvlab.tiny_model("mamba", shape="llama-3-8b")


def test_tiny_hybrid_places_attention_layers_and_checks_k():
    model = tiny_hybrid(layers=4, attention_layers=1, hidden=16, heads=2, state_size=2, vocab=32)
    # transformers 5.13 renamed Jamba's Mamba layers "linear_attention" (before: "mamba")
    assert [kind in ("mamba", "linear_attention") for kind in model.config.layer_types] == [
        True
    ] * 3 + [False]
    for bad in (0, 3, 5):
        with pytest.raises(ValueError, match="attention_layers"):
            tiny_hybrid(layers=4, attention_layers=bad)


# name: (call, error, a regex the message must match: the argument's name and what is allowed)
BAD_CALLS = {
    "tiny_model unknown shape": (
        lambda: kvlab.tiny_model("llama", shape="unknown"),
        ValueError,
        r"shape must be a ModelShape or one of",
    ),
    "tiny_model beyond memory": (
        lambda: kvlab.tiny_model(
            "llama", shape="llama-3.1-405b", device="cpu", dtype=torch.float32
        ),
        MemoryError,
        "bytes but only",
    ),
    "load_model None": (lambda: kvlab.load_model(None), TypeError, "name must be"),
    "max_positions 0": (
        lambda: tiny_model("llama", max_positions=0),
        ValueError,
        "max_positions must be an int",
    ),
    "layers True": (lambda: tiny_model("llama", layers=True), TypeError, "layers must be an int"),
    "hybrid heads 3": (lambda: tiny_hybrid(heads=3), ValueError, "heads must divide hidden"),
    "tiny_model dtype str": (
        lambda: tiny_model("llama", dtype="fp16"),
        TypeError,
        "dtype must be a torch.dtype",
    ),
    "tiny_model cuda": (
        lambda: (
            tiny_model("llama", device="cuda")
            if not torch.cuda.is_available()
            else tiny_model("llama", device="cuda:99")
        ),
        ValueError,
        "is not available on this machine",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_a_clear_error(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()
