"""Every notebook: model shapes, the constants of a decoder (or a Mamba stack) that decode cost
depends on, and the published shapes the sources reason about (KV Cache Memory Wall, 2026, Table 1).

Pure Python. ``kvlab.lab.models`` builds Hugging Face models of these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import integer, positive


@dataclass(frozen=True)
class ModelShape:
    """The constants of a decoder that decode cost depends on (section 9.3, KV Cache Memory Wall,
    2026 Table 1).

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
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__} {self.name!r}")
        for field in ("layers", "q_heads", "kv_heads", "head_dim", "hidden", "vocab"):
            integer(field, getattr(self, field))
        for field in ("latent_dim", "rope_dim", "window", "intermediate"):
            if getattr(self, field) is not None:
                integer(field, getattr(self, field))
        positive("params", self.params)
        if self.active_params is not None:
            positive("active_params", self.active_params)
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"ModelShape.q_heads ({self.q_heads}) must be a multiple of kv_heads"
                f" ({self.kv_heads})"
            )
        if self.active_params is not None and not 0 < self.active_params <= self.params:
            raise ValueError(
                f"ModelShape.active_params must be in (0, params={self.params}], got"
                f" {self.active_params!r}"
            )
        if (self.latent_dim is None) != (self.rope_dim is None):
            raise ValueError(
                "ModelShape.latent_dim and rope_dim are set together (an MLA cache) or not at all"
            )

    @property
    def group(self) -> int:
        """Query heads per KV head, g = n_q / n_kv (1 for multi-head attention)."""
        return self.q_heads // self.kv_heads

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """Cache bytes one retained token costs across all layers (KV Cache Memory Wall, 2026, Eq.
        1).

        Standard attention stores a key and a value per KV head: 2 * L * n_kv * d_h * w.
        MLA stores one latent of (d_c + d_r) elements per layer instead: L * (d_c + d_r) * w.
        """
        bytes_per_element = positive("bytes_per_element", bytes_per_element)
        if self.latent_dim is not None:
            return self.layers * (self.latent_dim + self.rope_dim) * bytes_per_element
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element

    def weight_bytes(self, bytes_per_element: float = 2) -> float:
        return self.params * positive("bytes_per_element", bytes_per_element)

    @property
    def params_per_token(self) -> float:
        """Parameters each token is multiplied by: ``active_params`` for a mixture of experts, else
        ``params``."""
        return self.params if self.active_params is None else self.active_params

    def counted_params(self) -> float:
        """Parameters counted from the shape's matrices, for a dense decoder with a gated MLP and
        untied embeddings (the Llama family): per layer the query, key, value and output projections
        and three MLP matrices, plus the embedding and the output head. Norms (a few hundred
        thousand numbers) are left out.

        ``SHAPES`` keeps the seeds' rounded ``params`` (70e9 for Llama-3-70B); this count gives the
        real figure (about 70.55e9). Raises ValueError for shapes it cannot count (MLA, mixtures of
        experts, no ``intermediate``).
        """
        if (
            self.latent_dim is not None
            or self.active_params is not None
            or self.intermediate is None
        ):
            raise ValueError(
                f"counted_params counts dense decoders with a known MLP width; {self.name} is"
                " not one"
            )
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
            layers=layers,
            q_heads=q_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            hidden=hidden,
            params=float(layers * (attn + mlp) + embeddings),
            vocab=vocab,
            window=get("sliding_window"),
            intermediate=intermediate,
        )


def model_shape(shape) -> ModelShape:
    """``shape`` itself, refused with a TypeError unless it is a ``ModelShape``."""
    if not isinstance(shape, ModelShape):
        raise TypeError(
            "shape must be a ModelShape (see kvlab.theory.shapes.SHAPES), got"
            f" {type(shape).__name__}"
        )
    return shape


def _shape(name, layers, q, kv, d, hidden, params, vocab, intermediate, **extra):
    return ModelShape(
        name, layers, q, kv, d, hidden, params, vocab, intermediate=intermediate, **extra
    )


# Published shapes. Parameter counts are those the sources use (KV Cache Memory Wall, 2026, appendix
# B.2 rounds 70B and 405B; Decode and KV Cache chapter, 2026 section 9.3 uses 8e9 for its Table 9.1,
# KV Cache Memory Wall, 2026 8.03e9 for Llama-3-8B); ModelShape.counted_params() gives the unrounded
# count. Active parameters of the mixtures of experts: Mistral AI's Mixtral announcement (12.9B of
# 46.7B), the DeepSeek-V2 paper (21B of 236B).
SHAPES: dict[str, ModelShape] = {
    "llama-3-8b": _shape("Llama-3-8B", 32, 32, 8, 128, 4096, 8.03e9, 128256, 14336),
    "llama-3-70b": _shape("Llama-3-70B", 80, 64, 8, 128, 8192, 70e9, 128256, 28672),
    "llama-3.1-405b": _shape("Llama-3.1-405B", 126, 128, 8, 128, 16384, 405e9, 128256, 53248),
    "llama-2-13b": _shape("Llama-2-13B", 40, 40, 40, 128, 5120, 13e9, 32000, 13824),
    "mixtral-8x7b": _shape(
        "Mixtral-8x7B", 32, 32, 8, 128, 4096, 46.7e9, 32000, 14336, active_params=12.9e9
    ),
    "mistral-7b": _shape("Mistral-7B", 32, 32, 8, 128, 4096, 7.24e9, 32000, 14336, window=4096),
    "deepseek-v2": _shape(
        "DeepSeek-V2",
        60,
        128,
        128,
        128,
        5120,
        236e9,
        102400,
        12288,
        latent_dim=512,
        rope_dim=64,
        active_params=21e9,
    ),
    "llama-3.2-1b": _shape("Llama-3.2-1B", 16, 32, 8, 64, 2048, 1.24e9, 128256, 8192),
    "qwen2.5-0.5b": _shape("Qwen2.5-0.5B", 24, 14, 2, 64, 896, 0.494e9, 151936, 4864),
    "smollm2-135m": _shape("SmolLM2-135M", 30, 9, 3, 64, 576, 0.135e9, 49152, 1536),
    "gpt2": _shape("GPT-2 (124M)", 12, 12, 12, 64, 768, 0.124e9, 50257, 3072),
}


# --- Selective state-space models (section 9.6) ------------------------------------------------


@dataclass(frozen=True)
class SSMShape:
    """The constants of a Mamba decoder that its serving state depends on (section 9.6).

    Each of the ``layers`` blocks widens the ``hidden`` stream to ``d_inner = expand * hidden``
    channels, runs a depthwise causal convolution of width ``conv_kernel`` over them, and then a
    selective scan whose state holds ``state_size`` numbers per channel. A sequence therefore keeps,
    per layer, the last ``conv_kernel - 1`` inputs of the convolution, ``d_inner * (conv_kernel -
    1)`` (the next output needs them and the new token; vLLM stores that many), and an SSM state of
    ``d_inner * state_size``, whatever its length. transformers' cache keeps the whole window of
    ``conv_kernel`` inputs, one more than needed (``conv_inputs``).
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
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__} {self.name!r}")
        for field in ("layers", "hidden", "state_size", "vocab", "expand", "conv_kernel"):
            integer(field, getattr(self, field))
        if self.dt_rank is not None:
            integer("dt_rank", self.dt_rank)

    @property
    def d_inner(self) -> int:
        return self.expand * self.hidden

    @property
    def time_step_rank(self) -> int:
        return self.dt_rank if self.dt_rank is not None else -(-self.hidden // 16)

    @property
    def params(self) -> float:
        """Parameters (tied embeddings): per layer in_proj, conv, x_proj, dt_proj, A, D and
        out_proj."""
        d, n, r, h = self.d_inner, self.state_size, self.time_step_rank, self.hidden
        per_layer = (
            h * 2 * d
            + d * (self.conv_kernel + 1)
            + d * (r + 2 * n)
            + r * d
            + d
            + d * n
            + d
            + d * h
            + h
        )
        return float(self.layers * per_layer + self.vocab * h + h)

    def state_bytes_per_layer(
        self,
        bytes_per_element: float = 2,
        state_bytes_per_element: float | None = None,
        conv_inputs: int | None = None,
    ):
        """Bytes one sequence keeps in one layer: the convolution's past inputs plus the SSM state,
        independent of its length.

        ``state_bytes_per_element`` is the SSM state's element size when it differs from the
        convolution's (transformers' PyTorch path and many hybrids keep the SSM state in fp32).
        ``conv_inputs`` is how many past inputs per channel are kept: ``conv_kernel - 1`` by
        default, what the next output needs; transformers' cache keeps ``conv_kernel``.
        """
        bytes_per_element = positive("bytes_per_element", bytes_per_element)
        state_bytes = (
            bytes_per_element
            if state_bytes_per_element is None
            else positive("state_bytes_per_element", state_bytes_per_element)
        )
        kept = (
            self.conv_kernel - 1
            if conv_inputs is None
            else integer("conv_inputs", conv_inputs, self.conv_kernel - 1, self.conv_kernel + 1)
        )
        return self.d_inner * (kept * bytes_per_element + self.state_size * state_bytes)

    def state_bytes_per_sequence(
        self,
        bytes_per_element: float = 2,
        state_bytes_per_element: float | None = None,
        conv_inputs: int | None = None,
    ):
        return self.layers * self.state_bytes_per_layer(
            bytes_per_element, state_bytes_per_element, conv_inputs
        )

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "SSMShape":
        """The shape of a Hugging Face ``MambaConfig``."""
        return cls(
            name=name or getattr(config, "_name_or_path", "") or "mamba",
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            state_size=config.state_size,
            vocab=config.vocab_size,
            expand=config.intermediate_size // config.hidden_size,
            conv_kernel=config.conv_kernel,
            dt_rank=int(config.time_step_rank),
        )


# Published Mamba shapes (the state-spaces/mamba-*-hf configs; vocab padded to 50280).
SSM_SHAPES: dict[str, SSMShape] = {
    "mamba-130m": SSMShape("Mamba-130M", 24, 768, 16, 50280, dt_rank=48),
    "mamba-1.4b": SSMShape("Mamba-1.4B", 48, 2048, 16, 50280, dt_rank=128),
}
