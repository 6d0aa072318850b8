"""Every notebook: models to measure on, real Hugging Face architectures (Wolf et al. 2020) with
random weights, built from a ``kvlab.theory.shapes`` shape so that they run anywhere without a
download (Llama, Qwen2, Mistral, GPT-2, Mamba, and the Jamba hybrid of ``tiny_hybrid``), and hub
checkpoints for readers with a network.

Random weights time exactly like trained ones (the same matrices are read and multiplied); they only
make the generated text meaningless, which no measurement in the book depends on.
"""

from __future__ import annotations

from kvlab._checks import integer, one_of, positive, require_memory
from kvlab.theory.shapes import SHAPES, SSM_SHAPES, ModelShape, SSMShape
from kvlab.versions import warn_if_below_floor

# The hub checkpoints behind the small shapes, for readers with a network (load_model).
HUB_NAMES = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "gpt2": "openai-community/gpt2",
}

ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")
_REAL_DEFAULT = {
    "llama": "llama-3.2-1b",
    "qwen2": "qwen2.5-0.5b",
    "mistral": "mistral-7b",
    "gpt2": "gpt2",
}
# CPU size: tens of MB of fp32 weights, so that on a CPU a decode step is dominated by reading them.
_CPU = dict(layers=4, q=8, kv=2, d=64, hidden=512, intermediate=1536, vocab=8192)


def _config(arch: str, shape: ModelShape, max_positions: int):
    import transformers as tf

    if arch == "gpt2":
        return tf.GPT2Config(
            n_layer=shape.layers,
            n_head=shape.q_heads,
            n_embd=shape.hidden,
            n_inner=shape.intermediate,
            vocab_size=shape.vocab,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
    config_class = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[
        arch
    ]
    extra = {"sliding_window": shape.window} if arch == "mistral" else {}
    return config_class(
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.q_heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate or 4 * shape.hidden,
        vocab_size=shape.vocab,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        **extra,
    )


def _built_params(shape: ModelShape) -> float:
    """Parameters a model built from ``shape`` will allocate (``shape.params`` may describe another
    size after overrides): untied embedding and head, attention projections, a gated MLP."""
    attention = shape.hidden * shape.head_dim * (2 * shape.q_heads + 2 * shape.kv_heads)
    mlp = 3 * shape.hidden * (shape.intermediate or 4 * shape.hidden)
    return 2 * shape.vocab * shape.hidden + shape.layers * (attention + mlp)


def _transformer_shape(
    arch: str, size: str, shape: str | ModelShape | None, overrides: dict
) -> ModelShape:
    """The shape :func:`tiny_model` builds: ``shape`` or the CPU shape of ``arch``, with
    ``overrides`` applied (gpt2's ``kv_heads`` follow its ``q_heads``; a new ``hidden`` sets
    ``head_dim``)."""
    import dataclasses

    overrides = dict(overrides)
    _check_overrides(
        ModelShape,
        overrides,
        optional=("latent_dim", "rope_dim", "window", "intermediate", "active_params"),
    )
    if shape is not None and not isinstance(shape, (str, ModelShape)):
        raise TypeError(
            f"shape must be a ModelShape or one of {tuple(SHAPES)}, got {type(shape).__name__}"
        )
    if size == "real" or shape is not None:
        name = shape or _REAL_DEFAULT[arch]
        if not isinstance(shape, ModelShape) and name not in SHAPES:
            raise ValueError(f"shape must be a ModelShape or one of {tuple(SHAPES)}, got {shape!r}")
        base = shape if isinstance(shape, ModelShape) else SHAPES[name]
    else:
        c = _CPU if arch != "gpt2" else {**_CPU, "kv": _CPU["q"]}
        base = ModelShape(
            f"tiny-{arch}",
            c["layers"],
            c["q"],
            c["kv"],
            c["d"],
            c["hidden"],
            1.0,
            c["vocab"],
            intermediate=c["intermediate"],
        )
    if arch == "gpt2" and "q_heads" in overrides and "kv_heads" not in overrides:
        overrides["kv_heads"] = overrides["q_heads"]
    if "hidden" in overrides and "head_dim" not in overrides:
        q_heads = overrides.get("q_heads", base.q_heads)
        if overrides["hidden"] < q_heads:
            raise ValueError(
                f"hidden ({overrides['hidden']}) must be >= q_heads ({q_heads}): head_dim is hidden"
                " // q_heads"
            )
        overrides["head_dim"] = overrides["hidden"] // q_heads
    base = dataclasses.replace(base, **overrides)
    if arch == "gpt2" and base.kv_heads != base.q_heads:
        raise ValueError(
            f"gpt2 has multi-head attention: kv_heads ({base.kv_heads}) must equal q_heads"
        )
    if arch == "gpt2" and base.head_dim * base.q_heads != base.hidden:
        raise ValueError("gpt2 needs head_dim * q_heads == hidden")
    return base


def tiny_model(
    arch: str = "llama",
    size: str = "cpu",
    shape: str | ModelShape | None = None,
    dtype=None,
    device=None,
    seed: int = 0,
    max_positions: int = 4096,
    **overrides,
):
    """A Hugging Face causal LM with random weights, built from a config: no download.

    ``arch``: one of ``ARCHITECTURES`` (``llama`` with grouped-query attention, ``qwen2``,
    ``mistral``, ``gpt2`` with multi-head attention and learned positions). ``size="cpu"`` gives a
    model of tens of MB that decodes in milliseconds on a CPU; ``size="real"`` the published shape
    named by ``shape`` (a ``SHAPES`` key; by default Llama-3.2-1B, Qwen2.5-0.5B, Mistral-7B or
    GPT-2). ``overrides`` replace ``ModelShape`` fields (``layers``, ``hidden``, ``vocab``...) to
    make a test model smaller still. The model is in eval mode on ``device`` (kvlab's device by
    default) in ``dtype`` (fp32 on a CPU, bf16 on a GPU, fp16 on one without bf16 units, by
    default).
    """
    import torch
    import transformers

    from kvlab.devices import device_and_dtype

    warn_if_below_floor()
    one_of("arch", arch, ARCHITECTURES + SSM_ARCHITECTURES)
    one_of("size", size, ("cpu", "real"))
    seed, max_positions = integer("seed", seed, 0), integer("max_positions", max_positions, 2)
    if (
        arch in SSM_ARCHITECTURES
    ):  # a selective SSM (section 9.6); see _tiny_mamba for why not in ARCHITECTURES
        return _tiny_mamba(size, shape, dtype, device, seed, **overrides)
    base = _transformer_shape(arch, size, shape, overrides)
    dev, dtype = device_and_dtype(device, dtype)
    require_memory(
        f"a {base.name} model with random weights (about {_built_params(base):.3g} parameters)",
        int(_built_params(base) * torch.empty((), dtype=dtype).element_size()),
        dev,
    )
    config = _config(arch, base, max_positions)
    config.name_or_path = base.name
    torch.manual_seed(seed)
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    # Random weights have no meaningful end token: never stop generation early on one.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.shape = ModelShape.from_config(config, name=base.name)
    return model


# Accepted by tiny_model but kept out of ARCHITECTURES: kvlab.decode passes the growing attention
# mask at every decode step and uses StaticCache, which MambaForCausalLM does not take (section
# 9.6).
SSM_ARCHITECTURES = ("mamba",)
_SSM_REAL_DEFAULT = "mamba-130m"
# CPU size: about the parameter count of the CPU-size Llama (8 Mamba blocks ~ 4 attention+MLP
# blocks).
_SSM_CPU = SSMShape("tiny-mamba", layers=8, hidden=512, state_size=16, vocab=8192)


def _tiny_mamba(size, shape, dtype, device, seed, **overrides):
    """``tiny_model("mamba", ...)``: a random-weight ``MambaForCausalLM`` (section 9.6).

    ``size="cpu"`` gives 8 blocks of width 512 with a 16-element state per channel; ``size="real"``
    the ``SSM_SHAPES`` entry named by ``shape`` (default Mamba-130M). ``overrides`` replace
    ``SSMShape`` fields. ``model.shape`` is an ``SSMShape``.
    """
    import dataclasses

    import torch
    import transformers

    from kvlab.devices import device_and_dtype

    _check_overrides(SSMShape, overrides, optional=("dt_rank",))
    if isinstance(shape, SSMShape):
        base = shape
    elif size == "real" or shape is not None:
        if (shape or _SSM_REAL_DEFAULT) not in SSM_SHAPES:
            raise ValueError(
                f"shape must be one of {list(SSM_SHAPES)} or an SSMShape, got {shape!r}"
            )
        base = SSM_SHAPES[shape or _SSM_REAL_DEFAULT]
    else:
        base = _SSM_CPU
    base = dataclasses.replace(base, **overrides)
    dev, dtype = device_and_dtype(device, dtype)
    config = transformers.MambaConfig(
        hidden_size=base.hidden,
        num_hidden_layers=base.layers,
        state_size=base.state_size,
        vocab_size=base.vocab,
        expand=base.expand,
        conv_kernel=base.conv_kernel,
        time_step_rank=base.time_step_rank,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    config.name_or_path = base.name
    torch.manual_seed(seed)
    with torch.device(dev):
        model = transformers.MambaForCausalLM(config).to(dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.shape = base
    return model


def _check_overrides(shape_class, overrides: dict, optional: tuple) -> None:
    """Each override names a field of ``shape_class`` and holds a positive int (None where
    optional), checked before anything is derived from it."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(shape_class)} - {"name"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"unknown {shape_class.__name__} field(s) {unknown}; the overrides are {sorted(fields)}"
        )
    for name, value in overrides.items():
        if name in ("params", "active_params"):
            if value is not None or name not in optional:
                positive(name, value)
        elif value is not None or name not in optional:
            integer(name, value)


def tiny_hybrid(
    layers: int = 4,
    attention_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int | None = None,
    state_size: int = 16,
    expand: int = 2,
    vocab: int = 512,
    seed: int = 0,
    dtype=None,
    device=None,
):
    """A random-weight Jamba (Mamba layers with every (L/k)-th layer attention), built from a
    config.

    ``attention_layers`` k of ``layers`` L must divide L: layers L/k - 1, 2L/k - 1, ... are
    attention (multi-head unless ``kv_heads``), the rest Mamba layers of ``expand * hidden``
    channels and a ``state_size`` state; the MLPs are dense (one expert). Section 9.6: a real hybrid
    cache, as Jamba (Lieber et al. 2024) keeps one. k = 0 is refused: transformers' Jamba cannot run
    with a cache holding no attention layer (its ``get_seq_length`` raises); a pure SSM is
    ``tiny_model("mamba")``.
    """
    import torch
    import transformers

    from kvlab.devices import device_and_dtype

    warn_if_below_floor()
    for name, value in (
        ("layers", layers),
        ("attention_layers", attention_layers),
        ("hidden", hidden),
        ("heads", heads),
        ("state_size", state_size),
        ("expand", expand),
        ("vocab", vocab),
    ):
        integer(name, value)
    kv_heads, seed = (
        heads if kv_heads is None else integer("kv_heads", kv_heads),
        integer("seed", seed, 0),
    )
    if attention_layers > layers or layers % attention_layers:
        raise ValueError(
            f"attention_layers must be a divisor of layers={layers}, got {attention_layers}"
        )
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"heads must divide hidden ({hidden}) and kv_heads must divide heads; got"
            f" heads={heads}, kv_heads={kv_heads}"
        )
    dev = device_and_dtype(device, dtype)[0]  # checks both
    dtype = torch.float32 if dtype is None else dtype
    # The embedding and head, and per layer the Mamba mixer's projections (about 4 expand hidden^2)
    # and the dense MLP's; fp32 until converted.
    params = 2 * vocab * hidden + layers * (
        (4 * expand + 6) * hidden * hidden + 3 * expand * hidden * state_size
    )
    require_memory(
        f"a Jamba model with random weights (about {params:.3g} parameters)", 4 * params, dev
    )
    period = layers // attention_layers
    config = transformers.JambaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=2 * hidden,
        num_experts=1,
        num_experts_per_tok=1,
        attn_layer_period=period,
        attn_layer_offset=period - 1,
        mamba_d_state=state_size,
        mamba_expand=expand,
        mamba_dt_rank=max(1, -(-hidden // 16)),
        mamba_d_conv=4,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    with torch.device(dev):
        model = transformers.JambaForCausalLM(config)
    return model.to(dtype).eval()


def load_model(name: str, dtype=None, device=None):
    """A real checkpoint: a ``SHAPES`` key with a hub name (``llama-3.2-1b``...), a hub id, or a
    local path.

    Needs the network (or a local copy); offline it raises a ``RuntimeError`` that says so, and
    points at ``tiny_model`` which needs neither.
    """
    import transformers

    from kvlab.devices import device_and_dtype

    warn_if_below_floor()
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"name must be a SHAPES key, a hub id or a local path (a non-empty str), got {name!r}"
        )
    repo = HUB_NAMES.get(name, name)
    dev, dtype = device_and_dtype(device, dtype)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(repo, dtype=dtype).to(dev)
        tokenizer = transformers.AutoTokenizer.from_pretrained(repo)
    except OSError as e:
        raise RuntimeError(
            f"could not load {repo!r}: it is neither a local path nor reachable on the Hugging Face"
            f" hub from here ({e.__class__.__name__}). Offline, use kvlab.tiny_model(...), which"
            " builds the same architecture with random weights."
        ) from e
    model.eval()
    model.shape = ModelShape.from_config(model.config, name=name)
    model.tokenizer = tokenizer
    return model
