"""Notebook 07, hybrid attention and SSM state (section 9.6): the measurements.

- ``decode_step_times``: one decode token of attention models and of Mamba after each context,
  all interleaved: the attention step grows with the context it rereads, the SSM step does not
  (Gu and Dao 2023);
- ``scan_inputs``: random selective-scan arguments of Mamba's shapes, for timing the scan orders
  of ``kvlab.cache.scan`` at prefill;
- ``mamba_path`` and ``quiet_mamba_fallback``: which implementation transformers' Mamba runs here,
  and a block in which its "falling back to the PyTorch implementation" warnings are held back,
  since kvlab times that path knowingly and names it once, in the bench rows' note;
- ``bench_rows``: both, for ``python -m kvlab bench``.

The mechanisms measured are ``kvlab.cache.mamba`` and ``kvlab.cache.scan``; their costs in closed
form are ``kvlab.theory.ssm``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import statistics

import torch
from transformers import DynamicCache

from kvlab._checks import device as check_device
from kvlab._checks import integer
from kvlab.cache.mamba import selective_scan
from kvlab.devices import on_gpu
from kvlab.lab.batch_tpot import min_scatter
from kvlab.lab.bench import Row
from kvlab.lab.models import tiny_model
from kvlab.lab.timing import Timing, measure
from kvlab.theory.ssm import DEFAULT_CHUNK_SIZE
from kvlab.versions import cache_kwargs, returned_cache

# Where transformers announces that Mamba's kernels are missing: 5.24 once per kernel function, from
# its hub-kernels integration; 5.5 once, from the Mamba model.
_FALLBACK_LOGGERS = (
    "transformers.integrations.hub_kernels",
    "transformers.models.mamba.modeling_mamba",
)


def mamba_path(device) -> str:
    """The implementation transformers' ``MambaForCausalLM`` runs on ``device``: the fused CUDA
    kernels of the ``mamba_ssm`` and ``causal_conv1d`` packages on a GPU that has both, else its
    reference PyTorch path (a sequential scan in PyTorch operations)."""
    device = check_device("device", device)
    kernels = all(importlib.util.find_spec(p) is not None for p in ("mamba_ssm", "causal_conv1d"))
    if torch.device(device).type == "cuda" and kernels:
        return "transformers' fused CUDA kernels (mamba_ssm, causal_conv1d)"
    return "transformers' reference PyTorch path (mamba_ssm and causal_conv1d kernels not in use)"


@contextlib.contextmanager
def quiet_mamba_fallback():
    """Hold back transformers' warnings that Mamba falls back to its PyTorch path, for the block
    only (the loggers' levels are restored after). kvlab measures that path on purpose on a CPU, and
    says so once (``mamba_path``) instead of four warnings."""
    loggers = [logging.getLogger(name) for name in _FALLBACK_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _filled_cache(model, context: int):
    """A cache as if ``context`` tokens had gone in: attention layers get ``context`` random keys
    and values (time like real ones); a Mamba model's state has one shape for any context, so a
    short real prefill fills it."""
    if model.config.model_type == "mamba":
        ids = torch.randint(0, model.config.vocab_size, (1, min(context, 8)), device=model.device)
        with torch.no_grad():
            return returned_cache(model(ids, use_cache=True))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    shape = (1, cfg.num_key_value_heads, context, head_dim)
    for layer in range(cfg.num_hidden_layers):
        cache.update(
            torch.randn(shape, dtype=model.dtype, device=model.device),
            torch.randn(shape, dtype=model.dtype, device=model.device),
            layer,
        )
    return cache


def decode_step_times(
    models: dict, contexts, warmup: int = 2, reps: int = 7, probes: dict | None = None
) -> dict:
    """Time one decode token of each Hugging Face model after each context (section 9.6).

    ``models`` maps a name to a model: attention models get a ``DynamicCache`` filled with
    ``context`` random keys and values (growing by one token per timed call, as in
    ``cached_decode``); a ``MambaForCausalLM`` its fixed state. All (model, context) pairs are timed
    interleaved, one step each per round, so that a shared machine's drift hits them alike. Returns
    ``{name: [Timing per context]}``. kvlab.decode's loops pass the whole attention mask at every
    step, which ``MambaForCausalLM`` mis-broadcasts, hence this loop. transformers' warnings that
    Mamba runs its PyTorch path are held back (``quiet_mamba_fallback``); ``mamba_path`` names the
    path. ``probes`` (name to ``kvlab.lab.hardware.Probe``) are timed once per round among the
    steps, the ceilings the slope is compared with; their ``Ceiling`` comes back under their names.
    """
    if not isinstance(models, dict) or not models:
        raise TypeError(
            f"models must be a non-empty dict {{name: model}}, got {type(models).__name__}"
        )
    for context in contexts:
        integer("context", context, 1)
    integer("warmup", warmup, 0)
    integer("reps", reps, 1)
    with quiet_mamba_fallback():
        steps = {}
        for name, model in models.items():
            for context in contexts:
                steps[name, context] = _decode_step(model, context)
        for step in steps.values():
            for _ in range(warmup):
                step()
        probes = probes or {}
        times = {key: [] for key in steps}
        probe_times = {name: [] for name in probes}
        for _ in range(reps):
            for key, step in steps.items():
                times[key].append(
                    measure(step, warmup=0, reps=1, device=models[key[0]].device).median
                )
            for name, probe in probes.items():
                probe_times[name].append(measure(probe.run, warmup=0, reps=1).median)
    out = {name: [_timing(times[name, c]) for c in contexts] for name in models}
    for name, probe in probes.items():
        t = _timing(probe_times[name])
        out[name] = dataclasses.replace(probe.ceiling(t), spread=min_scatter(t))
    return out


def _timing(times):
    return Timing(statistics.median(times), min(times), max(times), tuple(times))


def _decode_step(model, context: int):
    cache = _filled_cache(model, context)
    token = torch.randint(0, model.config.vocab_size, (1, 1), device=model.device)
    position = torch.tensor([[context]], device=model.device)
    extra = {} if model.config.model_type == "mamba" else {"position_ids": position}

    def step():
        with torch.no_grad():
            model(token, **cache_kwargs(model, cache), use_cache=True, **extra)

    return step


def scan_inputs(
    batch: int, dim: int, state: int, length: int, seed: int = 0, device=None, dtype=None
):
    """Random selective-scan inputs of the Mamba shapes, with Mamba-like A < 0 and small positive
    steps."""
    for name, value in (("batch", batch), ("dim", dim), ("state", state), ("length", length)):
        integer(name, value, 1)
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    A = -torch.exp(torch.randn(dim, state, generator=g)).to(device=device, dtype=torch.float32)
    delta = (torch.rand(batch, dim, length, generator=g) * 0.2 + 0.01).to(
        device=device, dtype=dtype
    )  # dt > 0
    return dict(
        u=rand(batch, dim, length),
        delta=delta,
        A=A,
        B=rand(batch, state, length),
        C=rand(batch, state, length),
    )


def bench_rows() -> list:
    """Section 9.6: scan orders at prefill, and decode step time of Mamba against Llama.

    CPU: a 1024-token scan over 256 channels with a 16-element state; the CPU-size models at
    contexts 256 and 4096. GPU: a 8192-token scan over 1536 channels; Mamba-1.4B against
    Llama-3.2-1B at 4096 and 32768. Methods run interleaved in one process; ratios are of medians.
    """
    gpu = on_gpu()
    length, dim = (8192, 1536) if gpu else (1024, 256)
    x = scan_inputs(1, dim, 16, length, device="cuda" if gpu else "cpu")
    runs = {"sequential": [], "parallel": [], "chunked": []}
    for _ in range(3):
        for method in runs:
            runs[method].append(
                measure(lambda: selective_scan(**x, method=method), warmup=1, reps=3).median
            )
    t = {m: statistics.median(v) for m, v in runs.items()}
    where = f"batch 1, dim {dim}, state 16, length {length}, chunk {DEFAULT_CHUNK_SIZE}"
    rows = [Row(f"scan {m}", t[m] * 1e3, "ms", where) for m in runs]
    rows += [
        Row(
            "sequential / parallel", t["sequential"] / t["parallel"], "x", "prefill scan, same run"
        ),
        Row("sequential / chunked", t["sequential"] / t["chunked"], "x", "prefill scan, same run"),
    ]
    size = dict(size="real") if gpu else {}
    with (
        quiet_mamba_fallback()
    ):  # transformers 5.5 warns as it builds the model; the note names the path
        mamba = tiny_model("mamba", shape="mamba-1.4b" if gpu else None, **size)
    llama = tiny_model("llama", max_positions=65536, **size)
    contexts = (4096, 32768) if gpu else (256, 4096)
    timed = decode_step_times({"mamba": mamba, "llama": llama}, contexts, warmup=2, reps=7)
    for i, context in enumerate(contexts):
        steps = {name: timed[name][i].median for name in timed}
        note = f"{mamba.shape.name} vs {llama.shape.name}, batch 1, context {context}"
        path = f"{note}; Mamba runs {mamba_path(mamba.device)}"
        rows += [
            Row(f"mamba step @ {context}", steps["mamba"] * 1e3, "ms", path if i == 0 else note),
            Row(f"llama step @ {context}", steps["llama"] * 1e3, "ms", note),
            Row(
                f"llama / mamba step @ {context}", steps["llama"] / steps["mamba"], "x", "same run"
            ),
        ]
    return rows
