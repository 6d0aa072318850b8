"""Notebook 05, PagedAttention (section 9.5): recompute against swap per token, the swap-out
overlapped or not.

A preempted request's cache comes back by recomputing it (a prefill, 2 P / F per token) or by
swapping it (a copy out when it is preempted and a copy back, K / beta each way). Only the copy back
delays the request; the copy out occupies the link, and an engine can overlap it with the batch's
compute. Sources: Kwon et al. 2023 (swap and recompute); the KV Cache Memory Wall, 2026 (the link
rates of ``kvlab.theory.specs.LINKS``).

Pure Python: importable without torch. Notation as in ``kvlab.theory.roofline``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import positive, real
from kvlab.theory.roofline import kv_bytes_per_token
from kvlab.theory.shapes import ModelShape, model_shape
from kvlab.theory.specs import LINKS, accelerator, as_link


@dataclass(frozen=True)
class RecomputeOrSwap:
    """Per-token cost of getting a preempted request's cache back (section 9.5), both ways.

    ``recompute`` = 2 P_active / F: the request's prefill multiplies every token by every (active)
    weight (the attention term, which grows with the request, only adds to it). The request waits
    for it, and the GPU spends that time on it instead of the batch.
    ``swap_in`` = K / beta: each cache byte crosses the host link back before the request can run.
    ``swap_out`` = K / beta: the copy out, made when the request is preempted. It occupies the link,
    not the request: an engine that issues it on a copy stream while the batch computes, and frees
    the blocks once it has landed, hides it (``overlap_swap_out``); one that waits for it adds it to
    the step that preempts. ``swap`` is what delays the request: the swap-in, plus the swap-out
    when it is not overlapped. Recompute wins when ``ratio`` = recompute / swap < 1, that is when
    F / beta exceeds ``break_even_flops_per_link_byte`` (2 P / K overlapped, P / K not).
    """

    shape: str
    device: str
    link: str
    recompute: float
    swap_in: float
    swap_out: float
    overlap_swap_out: bool
    params_per_kv_byte: float
    flops_per_link_byte: float

    @property
    def swap(self) -> float:
        """Seconds per token swap adds to the request's path back: the swap-in, and the swap-out
        unless hidden."""
        return self.swap_in + (0.0 if self.overlap_swap_out else self.swap_out)

    @property
    def ratio(self) -> float:
        """recompute / swap per token; above 1, swap is cheaper."""
        return self.recompute / self.swap

    @property
    def cheaper(self) -> str:
        return "swap" if self.ratio > 1 else "recompute"

    @property
    def break_even_flops_per_link_byte(self) -> float:
        """The F / beta at which both cost the same: 2 P / K with the swap-out hidden, P / K
        without."""
        return (2.0 if self.overlap_swap_out else 1.0) * self.params_per_kv_byte


def preemption_per_token(
    params_per_token: float,
    kv_bytes_per_token: float,
    flops: float,
    link_bytes_per_s: float,
    overlap_swap_out: bool = True,
    shape: str = "",
    device: str = "",
    link: str = "",
) -> RecomputeOrSwap:
    """Recompute against swap per token from the four numbers that decide it (section 9.5): the
    parameters a token multiplies P, its cache bytes K, the FLOP rate F and the link's one-way rate
    beta. For a published shape and device, :func:`recompute_or_swap` supplies them."""
    p = positive("params_per_token", params_per_token)
    k = positive("kv_bytes_per_token", kv_bytes_per_token)
    f = positive("flops", flops)
    beta = positive("link_bytes_per_s", link_bytes_per_s)
    if not isinstance(overlap_swap_out, bool):
        raise TypeError(f"overlap_swap_out must be a bool, got {overlap_swap_out!r}")
    return RecomputeOrSwap(
        shape=shape,
        device=device,
        link=link,
        recompute=2 * p / f,
        swap_in=k / beta,
        swap_out=k / beta,
        overlap_swap_out=overlap_swap_out,
        params_per_kv_byte=p / k,
        flops_per_link_byte=f / beta,
    )


def recompute_or_swap(
    shape: ModelShape,
    hw,
    link=None,
    w_kv: float = 2,
    mfu: float = 1.0,
    overlap_swap_out: bool = True,
) -> RecomputeOrSwap:
    """Recompute against swap per token, at the arithmetic level (section 9.5).

    ``hw`` supplies the FLOP rate F (dense bf16 peak times ``mfu``) and, unless ``link`` (a
    ``LINKS`` key or a ``Link``) is given, its host link. Short requests do not favour recompute:
    both costs are per token, and a short prefill still reads every weight. What this omits is how
    efficiently the link is used: many small copies (small blocks) reach a fraction of its rate,
    which ``kvlab.lab.preemption.measure_host_copy`` measures; and, with prefix caching, that
    a recomputed request finds most of its own blocks still cached (notebook 05).
    """
    shape, hw = model_shape(shape), accelerator(hw)
    mu = real("mfu", mfu, 0, 1, low_open=True)
    if link is None:
        if hw.host_link is None:
            raise ValueError(
                f"{hw.name} has no host_link recorded; pass link= one of {', '.join(LINKS)}"
            )
        link = hw.host_link
    chosen = as_link(link)
    return preemption_per_token(
        shape.params_per_token,
        kv_bytes_per_token(shape, w_kv),
        mu * hw.bf16_flops,
        chosen.bytes_per_s_each_way,
        overlap_swap_out,
        shape.name,
        hw.name,
        chosen.name,
    )
