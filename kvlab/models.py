"""Model shapes and models: the published shapes the seeds reason about, and real Hugging Face
architectures with random weights that run anywhere without a download.

Random weights time exactly like trained ones (the same matrices are read and multiplied); they only
make the generated text meaningless, which no measurement in the book depends on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The constants of a decoder that decode cost depends on (section 9.3, seed 004 Table 1).

    ``params`` is the parameter count the seeds use; ``latent_dim`` and ``rope_dim`` describe a
    Multi-head Latent Attention cache (DeepSeek-V2); ``window`` a sliding-window model (Mistral 7B).
    ``intermediate`` (the MLP width) is only needed to build a model of this shape.
    ``active_params`` is set for a mixture of experts: the parameters one token is multiplied by
    (``params`` counts every expert, which decode must still hold and, at a large batch, read).
    """

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    params: float
    vocab: int
    latent_dim: int | None = None
    rope_dim: int | None = None
    window: int | None = None
    intermediate: int | None = None
    active_params: float | None = None

    def __post_init__(self):
        for field in ("layers", "q_heads", "kv_heads", "head_dim", "hidden", "vocab"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelShape.{field} must be a positive int, got {value!r}")
        if not self.params > 0:
            raise ValueError(f"ModelShape.params must be > 0, got {self.params!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"ModelShape.q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.active_params is not None and not 0 < self.active_params <= self.params:
            raise ValueError(f"ModelShape.active_params must be in (0, params={self.params}], got {self.active_params!r}")
        if (self.latent_dim is None) != (self.rope_dim is None):
            raise ValueError("ModelShape.latent_dim and rope_dim are set together (an MLA cache) or not at all")

    @property
    def group(self) -> int:
        """Query heads per KV head, g = n_q / n_kv (1 for multi-head attention)."""
        return self.q_heads // self.kv_heads

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """Cache bytes one retained token costs across all layers (seed 004, Eq. 1).

        Standard attention stores a key and a value per KV head: 2 * L * n_kv * d_h * w.
        MLA stores one latent of (d_c + d_r) elements per layer instead: L * (d_c + d_r) * w.
        """
        if not bytes_per_element > 0:
            raise ValueError(f"bytes_per_element must be > 0, got {bytes_per_element!r}")
        if self.latent_dim is not None:
            return self.layers * (self.latent_dim + self.rope_dim) * bytes_per_element
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element

    def weight_bytes(self, bytes_per_element: float = 2) -> float:
        return self.params * bytes_per_element

    @property
    def params_per_token(self) -> float:
        """Parameters each token is multiplied by: ``active_params`` for a mixture of experts, else ``params``."""
        return self.params if self.active_params is None else self.active_params

    def counted_params(self) -> float:
        """Parameters counted from the shape's matrices, for a dense decoder with a gated MLP and
        untied embeddings (the Llama family): per layer the query, key, value and output projections
        and three MLP matrices, plus the embedding and the output head. Norms (a few hundred thousand
        numbers) are left out.

        ``SHAPES`` keeps the seeds' rounded ``params`` (70e9 for Llama-3-70B); this count gives the
        real figure (about 70.55e9). Raises ValueError for shapes it cannot count (MLA, mixtures of
        experts, no ``intermediate``).
        """
        if self.latent_dim is not None or self.active_params is not None or self.intermediate is None:
            raise ValueError(f"counted_params counts dense decoders with a known MLP width; {self.name} is not one")
        h, d = self.hidden, self.head_dim
        attention = 2 * h * self.q_heads * d + 2 * h * self.kv_heads * d
        return float(self.layers * (attention + 3 * h * self.intermediate) + 2 * self.vocab * h)

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "ModelShape":
        """The shape of a Hugging Face config (Llama, Qwen2, Mistral, GPT-2 and their kin).

        ``params`` is counted from the config's matrices (embeddings, attention, MLP, head), which
        is what a decode step reads; norms and biases are left out as negligible.
        """
        get = lambda *names, default=None: next(  # noqa: E731
            (getattr(config, n) for n in names if getattr(config, n, None) is not None), default
        )
        hidden = get("hidden_size", "n_embd")
        layers = get("num_hidden_layers", "n_layer")
        q_heads = get("num_attention_heads", "n_head")
        kv_heads = get("num_key_value_heads", default=q_heads)
        head_dim = get("head_dim", default=hidden // q_heads)
        vocab = get("vocab_size")
        intermediate = get("intermediate_size", "n_inner", default=4 * hidden)
        gated = get("model_type") not in ("gpt2",)
        attn = hidden * q_heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        mlp = (3 if gated else 2) * hidden * intermediate
        tied = bool(get("tie_word_embeddings", default=False))
        embeddings = vocab * hidden * (1 if tied else 2) + hidden * get("n_positions", default=0)
        return cls(
            name=name or get("_name_or_path", default="") or get("model_type", default="model"),
            layers=layers, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
            params=float(layers * (attn + mlp) + embeddings), vocab=vocab,
            window=get("sliding_window"), intermediate=intermediate,
        )


def _shape(name, layers, q, kv, d, hidden, params, vocab, intermediate, **extra):
    return ModelShape(name, layers, q, kv, d, hidden, params, vocab, intermediate=intermediate, **extra)


# Published shapes. Parameter counts are those the seeds use (seed 004 appendix B.2 rounds 70B and
# 405B; seed 000 section 9.3 uses 8e9 for its Table 9.1, seed 004 8.03e9 for Llama-3-8B);
# ModelShape.counted_params() gives the unrounded count. Active parameters of the mixtures of
# experts: Mistral AI's Mixtral announcement (12.9B of 46.7B), the DeepSeek-V2 paper (21B of 236B).
SHAPES: dict[str, ModelShape] = {
    "llama-3-8b": _shape("Llama-3-8B", 32, 32, 8, 128, 4096, 8.03e9, 128256, 14336),
    "llama-3-70b": _shape("Llama-3-70B", 80, 64, 8, 128, 8192, 70e9, 128256, 28672),
    "llama-3.1-405b": _shape("Llama-3.1-405B", 126, 128, 8, 128, 16384, 405e9, 128256, 53248),
    "llama-2-13b": _shape("Llama-2-13B", 40, 40, 40, 128, 5120, 13e9, 32000, 13824),
    "mixtral-8x7b": _shape("Mixtral-8x7B", 32, 32, 8, 128, 4096, 46.7e9, 32000, 14336, active_params=12.9e9),
    "mistral-7b": _shape("Mistral-7B", 32, 32, 8, 128, 4096, 7.24e9, 32000, 14336, window=4096),
    "deepseek-v2": _shape("DeepSeek-V2", 60, 128, 128, 128, 5120, 236e9, 102400, 12288,
                          latent_dim=512, rope_dim=64, active_params=21e9),
    "llama-3.2-1b": _shape("Llama-3.2-1B", 16, 32, 8, 64, 2048, 1.24e9, 128256, 8192),
    "qwen2.5-0.5b": _shape("Qwen2.5-0.5B", 24, 14, 2, 64, 896, 0.494e9, 151936, 4864),
    "smollm2-135m": _shape("SmolLM2-135M", 30, 9, 3, 64, 576, 0.135e9, 49152, 1536),
    "gpt2": _shape("GPT-2 (124M)", 12, 12, 12, 64, 768, 0.124e9, 50257, 3072),
}

# The hub checkpoints behind the small shapes, for readers with a network (load_model).
HUB_NAMES = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "gpt2": "openai-community/gpt2",
}

ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")
_REAL_DEFAULT = {"llama": "llama-3.2-1b", "qwen2": "qwen2.5-0.5b", "mistral": "mistral-7b", "gpt2": "gpt2"}
# CPU size: tens of MB of fp32 weights, so that on a CPU a decode step is dominated by reading them.
_CPU = dict(layers=4, q=8, kv=2, d=64, hidden=512, intermediate=1536, vocab=8192)


def _config(arch: str, shape: ModelShape, max_positions: int):
    import transformers as tf

    if arch == "gpt2":
        return tf.GPT2Config(
            n_layer=shape.layers, n_head=shape.q_heads, n_embd=shape.hidden, n_inner=shape.intermediate,
            vocab_size=shape.vocab, n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=None, eos_token_id=None,
        )
    config_class = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[arch]
    extra = {"sliding_window": shape.window} if arch == "mistral" else {}
    return config_class(
        num_hidden_layers=shape.layers, num_attention_heads=shape.q_heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, hidden_size=shape.hidden, intermediate_size=shape.intermediate or 4 * shape.hidden,
        vocab_size=shape.vocab, max_position_embeddings=max_positions, tie_word_embeddings=False, **extra,
    )


def _built_params(shape: ModelShape) -> float:
    """Parameters a model built from ``shape`` will allocate (``shape.params`` may describe another
    size after overrides): untied embedding and head, attention projections, a gated MLP."""
    attention = shape.hidden * shape.head_dim * (2 * shape.q_heads + 2 * shape.kv_heads)
    mlp = 3 * shape.hidden * (shape.intermediate or 4 * shape.hidden)
    return 2 * shape.vocab * shape.hidden + shape.layers * (attention + mlp)


def tiny_model(arch: str = "llama", size: str = "cpu", shape: str | ModelShape | None = None, dtype=None,
               device=None, seed: int = 0, max_positions: int = 4096, **overrides):
    """A Hugging Face causal LM with random weights, built from a config: no download.

    ``arch``: one of ``ARCHITECTURES`` (``llama`` with grouped-query attention, ``qwen2``, ``mistral``,
    ``gpt2`` with multi-head attention and learned positions). ``size="cpu"`` gives a model of tens of
    MB that decodes in milliseconds on a CPU; ``size="real"`` the published shape named by ``shape``
    (a ``SHAPES`` key; by default Llama-3.2-1B, Qwen2.5-0.5B, Mistral-7B or GPT-2). ``overrides`` replace
    ``ModelShape`` fields (``layers``, ``hidden``, ``vocab``...) to make a test model smaller still.
    The model is in eval mode on ``device`` (kvlab's device by default) in ``dtype`` (fp32 on a CPU,
    bf16 on a GPU, fp16 on one without bf16 units, by default).
    """
    import dataclasses

    import torch
    import transformers

    from .hardware import device_and_dtype

    if arch in SSM_ARCHITECTURES:  # a selective SSM (section 9.6); see _tiny_mamba for why not in ARCHITECTURES
        return _tiny_mamba(size, shape, dtype, device, seed, **overrides)
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    if size not in ("cpu", "real"):
        raise ValueError(f"size must be 'cpu' or 'real', got {size!r}")
    if size == "real" or shape is not None:
        name = shape or _REAL_DEFAULT[arch]
        if not isinstance(shape, ModelShape) and name not in SHAPES:
            raise ValueError(f"shape must be a ModelShape or one of {tuple(SHAPES)}, got {shape!r}")
        base = shape if isinstance(shape, ModelShape) else SHAPES[name]
    else:
        c = _CPU if arch != "gpt2" else {**_CPU, "kv": _CPU["q"]}
        base = ModelShape(f"tiny-{arch}", c["layers"], c["q"], c["kv"], c["d"], c["hidden"], 1.0, c["vocab"],
                          intermediate=c["intermediate"])
    if arch == "gpt2" and "q_heads" in overrides and "kv_heads" not in overrides:
        overrides["kv_heads"] = overrides["q_heads"]
    if "hidden" in overrides and "head_dim" not in overrides:
        overrides["head_dim"] = overrides["hidden"] // overrides.get("q_heads", base.q_heads)
    base = dataclasses.replace(base, **overrides)
    if arch == "gpt2" and base.kv_heads != base.q_heads:
        raise ValueError(f"gpt2 has multi-head attention: kv_heads ({base.kv_heads}) must equal q_heads")
    if arch == "gpt2" and base.head_dim * base.q_heads != base.hidden:
        raise ValueError("gpt2 needs head_dim * q_heads == hidden")
    dev, dtype = device_and_dtype(device, dtype)
    from ._checks import require_memory

    require_memory(f"a {base.name} model with random weights (about {_built_params(base):.3g} parameters)",
                   int(_built_params(base) * torch.empty((), dtype=dtype).element_size()), dev)
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


# --- Selective state-space models (section 9.6) ------------------------------------------------

@dataclass(frozen=True)
class SSMShape:
    """The constants of a Mamba decoder that its serving state depends on (section 9.6).

    Each of the ``layers`` blocks widens the ``hidden`` stream to ``d_inner = expand * hidden``
    channels, runs a depthwise causal convolution of width ``conv_kernel`` over them, and then a
    selective scan whose state holds ``state_size`` numbers per channel. A sequence therefore keeps,
    per layer, a convolution window of ``d_inner * conv_kernel`` inputs (transformers keeps the whole
    window, mamba_ssm too) and an SSM state of ``d_inner * state_size``, whatever its length.
    ``dt_rank`` is the rank of the step-size projection (Mamba's default: ceil(hidden / 16)).
    """

    name: str
    layers: int
    hidden: int
    state_size: int
    vocab: int
    expand: int = 2
    conv_kernel: int = 4
    dt_rank: int | None = None

    def __post_init__(self):
        for field in ("layers", "hidden", "state_size", "vocab", "expand", "conv_kernel"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SSMShape.{field} must be a positive int, got {value!r}")
        if self.dt_rank is not None and (isinstance(self.dt_rank, bool) or not isinstance(self.dt_rank, int)
                                         or self.dt_rank < 1):
            raise ValueError(f"SSMShape.dt_rank must be a positive int or None, got {self.dt_rank!r}")

    @property
    def d_inner(self) -> int:
        return self.expand * self.hidden

    @property
    def time_step_rank(self) -> int:
        return self.dt_rank if self.dt_rank is not None else -(-self.hidden // 16)

    @property
    def params(self) -> float:
        """Parameters (tied embeddings): per layer in_proj, conv, x_proj, dt_proj, A, D and out_proj."""
        d, n, r, h = self.d_inner, self.state_size, self.time_step_rank, self.hidden
        per_layer = h * 2 * d + d * (self.conv_kernel + 1) + d * (r + 2 * n) + r * d + d + d * n + d + d * h + h
        return float(self.layers * per_layer + self.vocab * h + h)

    def state_bytes_per_layer(self, bytes_per_element: float = 2, state_bytes_per_element: float | None = None):
        """Bytes one sequence keeps in one layer: conv window plus SSM state, independent of its length.

        ``state_bytes_per_element`` is the SSM state's element size when it differs from the
        convolution window's (transformers' PyTorch path keeps the SSM state in fp32).
        """
        if not bytes_per_element > 0:
            raise ValueError(f"bytes_per_element must be > 0, got {bytes_per_element!r}")
        state_bytes = bytes_per_element if state_bytes_per_element is None else state_bytes_per_element
        if not state_bytes > 0:
            raise ValueError(f"state_bytes_per_element must be > 0, got {state_bytes_per_element!r}")
        return self.d_inner * (self.conv_kernel * bytes_per_element + self.state_size * state_bytes)

    def state_bytes_per_sequence(self, bytes_per_element: float = 2, state_bytes_per_element: float | None = None):
        return self.layers * self.state_bytes_per_layer(bytes_per_element, state_bytes_per_element)

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "SSMShape":
        """The shape of a Hugging Face ``MambaConfig``."""
        return cls(name=name or getattr(config, "_name_or_path", "") or "mamba", layers=config.num_hidden_layers,
                   hidden=config.hidden_size, state_size=config.state_size, vocab=config.vocab_size,
                   expand=config.intermediate_size // config.hidden_size, conv_kernel=config.conv_kernel,
                   dt_rank=int(config.time_step_rank))


# Published Mamba shapes (the state-spaces/mamba-*-hf configs; vocab padded to 50280).
SSM_SHAPES: dict[str, SSMShape] = {
    "mamba-130m": SSMShape("Mamba-130M", 24, 768, 16, 50280, dt_rank=48),
    "mamba-1.4b": SSMShape("Mamba-1.4B", 48, 2048, 16, 50280, dt_rank=128),
}
# Accepted by tiny_model but kept out of ARCHITECTURES: kvlab.decode passes the growing attention mask
# at every decode step and uses StaticCache, which MambaForCausalLM does not take (section 9.6).
SSM_ARCHITECTURES = ("mamba",)
_SSM_REAL_DEFAULT = "mamba-130m"
# CPU size: about the parameter count of the CPU-size Llama (8 Mamba blocks ~ 4 attention+MLP blocks).
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

    from .hardware import device_and_dtype

    if size not in ("cpu", "real"):
        raise ValueError(f"size must be 'cpu' or 'real', got {size!r}")
    if isinstance(shape, SSMShape):
        base = shape
    elif size == "real" or shape is not None:
        if (shape or _SSM_REAL_DEFAULT) not in SSM_SHAPES:
            raise ValueError(f"shape must be one of {list(SSM_SHAPES)} or an SSMShape, got {shape!r}")
        base = SSM_SHAPES[shape or _SSM_REAL_DEFAULT]
    else:
        base = _SSM_CPU
    unknown = set(overrides) - {f.name for f in dataclasses.fields(SSMShape)}
    if unknown:
        raise ValueError(f"unknown SSMShape field(s) {sorted(unknown)} for arch 'mamba'")
    base = dataclasses.replace(base, **overrides)
    dev, dtype = device_and_dtype(device, dtype)
    config = transformers.MambaConfig(
        hidden_size=base.hidden, num_hidden_layers=base.layers, state_size=base.state_size,
        vocab_size=base.vocab, expand=base.expand, conv_kernel=base.conv_kernel,
        time_step_rank=base.time_step_rank, bos_token_id=None, eos_token_id=None, pad_token_id=0,
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


def load_model(name: str, dtype=None, device=None):
    """A real checkpoint: a ``SHAPES`` key with a hub name (``llama-3.2-1b``...), a hub id, or a local path.

    Needs the network (or a local copy); offline it raises a ``RuntimeError`` that says so, and points
    at ``tiny_model`` which needs neither.
    """
    import torch
    import transformers

    from .hardware import device_and_dtype

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a SHAPES key, a hub id or a local path (a non-empty str), got {name!r}")
    repo = HUB_NAMES.get(name, name)
    dev, dtype = device_and_dtype(device, dtype)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(repo, dtype=dtype).to(dev)
        tokenizer = transformers.AutoTokenizer.from_pretrained(repo)
    except OSError as e:
        raise RuntimeError(
            f"could not load {repo!r}: it is neither a local path nor reachable on the Hugging Face hub "
            f"from here ({e.__class__.__name__}). Offline, use kvlab.tiny_model(...), which builds the same "
            f"architecture with random weights."
        ) from e
    model.eval()
    model.shape = ModelShape.from_config(model.config, name=name)
    model.tokenizer = tokenizer
    return model
