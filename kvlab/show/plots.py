"""Every notebook: shared matplotlib helpers, house-style figures, measured-vs-predicted, roofline
axes, the device stamp.

Serves every section of the book: each measurement is drawn beside its prediction on the same axes
(9.1 to 9.8, prefix caching, the memory wall), the roofline of 9.3 and the memory-wall chapter is
drawn by ``roofline_axes``, and every figure names, in its corner, the device and versions it was
measured on. No widgets here (those are in ``widgets.py``).
"""

from __future__ import annotations

import functools

import matplotlib.pyplot as plt
import numpy as np

from kvlab._checks import instance, integer, items, positive, real
from kvlab.lab import hardware
from kvlab.show.format import si, sig

_STAMP_GID = "kvlab-stamp"
_STAMP_SIZE = 6.5  # points
_LABEL_SIZE = 10
_TICK_SIZE = 9
MAX_COLUMNS = 8  # panels side by side on a page
_LEGEND_SIZE = 9


@functools.lru_cache(maxsize=1)
def _local_stamp() -> dict:
    # stamp() imports torch and, on a GPU, runs nvidia-smi: once per process is enough.
    return hardware.stamp()


def stamp_corner(fig, stamp: dict | None = None):
    """Write ``hardware.stamp_line(stamp)`` in small grey text in the figure's bottom-right corner.

    ``stamp`` is a stamp dict (for instance the one stored with a recorded measurement file) or
    None for this machine. Calling it again replaces the earlier stamp. Returns the Text artist.
    Serves every section: every figure in the book names the device and versions behind it.
    """
    instance("fig", fig, plt.Figure, "a matplotlib Figure")
    for t in [t for t in fig.texts if t.get_gid() == _STAMP_GID]:
        t.remove()
    line = hardware.stamp_line(stamp if stamp is not None else _local_stamp())
    text = fig.text(
        0.995,
        0.005,
        line,
        ha="right",
        va="bottom",
        fontsize=_STAMP_SIZE,
        color="0.5",
        gid=_STAMP_GID,
    )
    engine = fig.get_layout_engine()
    if engine is not None and hasattr(engine, "set") and "rect" in engine.get():
        # Constrained layout ignores fig.text, so reserve a strip at the bottom for the stamp
        # instead of letting it overlap the x-axis label.
        strip = min(0.2, 1.8 * _STAMP_SIZE / 72 / fig.get_figheight())
        engine.set(rect=(0, strip, 1, 1 - strip))
    return text


def new_figure(ncols: int = 1, width: float | None = None, height: float = 3.4):
    """A figure in the book's house style: constrained layout, readable fonts, a light grid.

    Returns ``(fig, axes)``: a single Axes when ``ncols == 1``, else an array of ``ncols`` Axes.
    ``width`` defaults to 5.2 inches for one panel and 4.4 per panel beyond. Serves every section.
    """
    ncols = integer("ncols", ncols, 1, MAX_COLUMNS + 1)
    width = (5.2 if ncols == 1 else 4.4 * ncols) if width is None else positive("width", width)
    height = positive("height", height)
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), layout="constrained", squeeze=False)
    for ax in axes.flat:
        ax.tick_params(labelsize=_TICK_SIZE)
        ax.xaxis.label.set_fontsize(_LABEL_SIZE)
        ax.yaxis.label.set_fontsize(_LABEL_SIZE)
        ax.title.set_fontsize(_LABEL_SIZE + 1)
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, (axes[0, 0] if ncols == 1 else axes[0])


def measured_vs_predicted(
    ax,
    x,
    measured,
    predicted,
    *,
    xlabel: str,
    ylabel: str,
    measured_label: str = "measured",
    predicted_label: str = "predicted",
    minmax=None,
):
    """Measured values as markers and the prediction as a line, on the same axes, with a legend.

    ``minmax`` optionally gives the spread of each measurement as ``(lo, hi)``: two sequences (or a
    2 x N array) of absolute minimum and maximum values, drawn as error bars around ``measured``
    (for instance the ``min`` and ``max`` of ``timing.measure``). Returns ``ax``.
    Serves every section: each measurement in the book is shown against its prediction.
    """
    x = np.asarray(x, dtype=float)
    measured = np.asarray(measured, dtype=float)
    predicted = np.asarray(predicted, dtype=float)
    if not (len(x) == len(measured) == len(predicted)):
        raise ValueError(
            "x, measured and predicted must have the same length, "
            f"got {len(x)}, {len(measured)} and {len(predicted)}"
        )
    order = np.argsort(x)
    ax.plot(x[order], predicted[order], "-", color="C0", lw=1.8, label=predicted_label, zorder=2)
    yerr = None
    if minmax is not None:
        lo, hi = (np.asarray(a, dtype=float) for a in minmax)
        if lo.shape != measured.shape or hi.shape != measured.shape:
            raise ValueError(f"minmax must be (lo, hi), each of length {len(measured)}")
        yerr = np.clip([measured - lo, hi - measured], 0, None)
    ax.errorbar(
        x,
        measured,
        yerr=yerr,
        fmt="o",
        color="C1",
        ms=5,
        capsize=3,
        lw=1,
        label=measured_label,
        zorder=3,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=_LEGEND_SIZE)
    return ax


def roofline_axes(
    ax, peak_flops: float, bytes_per_s: float, *, intensities=None, label: str | None = None
):
    """Draw a log-log roofline: attainable FLOP/s = min(peak, AI * bandwidth), ridge point marked.

    ``intensities`` sets the span of arithmetic intensities drawn (FLOP/byte; any sequence, only its
    range is used); by default two decades either side of the ridge. ``label`` names the roof in
    the legend (default: the two ceilings). Call it twice on one Axes to compare two devices.
    Returns ``ax``. Serves 9.3 (GEMV-like decode) and the memory-wall chapter, and every section
    that places a kernel against its roof.
    """
    if not (peak_flops > 0 and bytes_per_s > 0):
        raise ValueError(
            f"peak_flops and bytes_per_s must be positive, got {peak_flops} and {bytes_per_s}"
        )
    ridge = peak_flops / bytes_per_s
    if intensities is None:
        lo, hi = ridge / 100, ridge * 100
    else:
        ai = np.asarray(intensities, dtype=float)
        if ai.size == 0 or np.any(ai <= 0):
            raise ValueError(
                "intensities must be a non-empty sequence of positive FLOP/byte values"
            )
        lo, hi = float(ai.min()), float(ai.max())
        if lo == hi:
            lo, hi = lo / 10, hi * 10
    grid = np.geomspace(lo, hi, 256)
    if lo < ridge < hi:
        grid = np.sort(np.append(grid, ridge))  # keep the corner sharp
    if label is None:
        label = f"roof: {si(peak_flops, 'FLOP/s')}, {si(bytes_per_s, 'B/s')}"
    (line,) = ax.loglog(grid, np.minimum(peak_flops, grid * bytes_per_s), "-", lw=2, label=label)
    ax.plot([ridge], [peak_flops], "o", color=line.get_color(), ms=6)
    ax.annotate(
        f"ridge: {sig(ridge)} FLOP/B",
        (ridge, peak_flops),
        xytext=(8, -14),
        textcoords="offset points",
        fontsize=_TICK_SIZE,
        color=line.get_color(),
    )
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.legend(fontsize=_LEGEND_SIZE)
    return ax


def _op_kind(name: str) -> str:
    n = name.lower()
    if any(
        k in n
        for k in ("mm", "gemm", "gemv", "matmul", "linear", "addmm", "cutlass", "sm90", "sm80")
    ):
        return "matmul"
    if any(k in n for k in ("attention", "sdpa", "flash", "softmax", "paged")):
        return "attention"
    if any(k in n for k in ("cat", "copy", "index", "memcpy", "memset", "store")):
        return "copy"
    return "other"


TIMELINE_COLORS = {"matmul": "C0", "attention": "C3", "copy": "C2", "other": "C7"}


def timeline(ax, spans, y: float, *, height: float = 0.6, label: str | None = None):
    """Draw ``spans`` (name, start_s, end_s) as bars on row ``y``, in ms, coloured by kind; gaps
    stay white.

    Serves section 9.8: a decode step's kernels (GPU) or operators (CPU) over time.
    """
    spans = items("spans", spans, tuple, what="(name, start_s, end_s) spans")
    y, height = real("y", y), positive("height", height)
    by_kind: dict[str, list] = {}
    for name, start, end in spans:
        by_kind.setdefault(_op_kind(name), []).append((start * 1e3, max((end - start) * 1e3, 1e-4)))
    for kind, bars in by_kind.items():
        ax.broken_barh(bars, (y - height / 2, height), color=TIMELINE_COLORS[kind], linewidth=0)
    if label is not None:
        ax.text(0, y + height / 2 + 0.05, label, fontsize=_TICK_SIZE, va="bottom")
    return ax


def step_timelines(panels, width: float = 9.0):
    """Section 9.8: one panel per title in ``panels`` (title -> {label: StepTrace}), each trace a
    row of bars over time, so the gaps between operators or kernels show as white space. Returns the
    figure.
    """
    instance("panels", panels, dict, "a dict of title -> {label: StepTrace}")
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(width, 0.6 + 1.5 * len(panels)),
        layout="constrained",
        squeeze=False,
    )
    for ax, (title, traces) in zip(axes[:, 0], panels.items()):
        rows = len(traces)
        for y, (label, t) in zip(range(rows - 1, -1, -1), traces.items()):
            timeline(ax, t.timeline, y)
            ax.text(
                0,
                y + 0.34,
                f"{label}: busy {t.busy_fraction:.0%} of {t.traced_s * 1e3:.3g} ms traced",
                fontsize=8,
                va="bottom",
            )
        ax.set(yticks=[], ylim=(-0.5, rows - 0.1), xlabel="time within the traced step (ms)")
        ax.set_title(title, fontsize=_TICK_SIZE, loc="left")
        ax.spines[["top", "right", "left"]].set_visible(False)
    axes[0, 0].legend(
        handles=[Patch(color=c, label=k) for k, c in TIMELINE_COLORS.items()],
        fontsize=8,
        ncol=len(TIMELINE_COLORS),
        loc="lower right",
        bbox_to_anchor=(1, 1.0),
    )
    stamp_corner(fig)
    return fig


def useful_batch_figure(
    points, tpot_target_s: float, capacity: int, useful: int | None, title: str, predicted=None
):
    """Section 9.8, step 4: measured TPOT and tokens/s against batch, the TPOT target, the batches
    that do not fit (``capacity``, from ``kvlab.theory.roofline.admitted``) and the useful batch;
    ``predicted`` (seconds per point, optional) draws the model's TPOT over the measurement.
    Returns the figure.
    """
    tpot_target_s = positive("tpot_target_s", tpot_target_s)
    fig, ax = new_figure(width=7.6, height=3.6)
    b = [p.batch for p in points]
    ax.plot(b, [p.tpot * 1e3 for p in points], "o-", color="C0", label="TPOT, measured")
    if predicted is not None:
        ax.plot(
            b,
            [t * 1e3 for t in predicted],
            "-",
            color="C1",
            lw=2,
            alpha=0.7,
            label="TPOT, roofline with this machine's ceilings",
        )
    ax.axhline(
        tpot_target_s * 1e3, color="C0", ls=":", label=f"TPOT target {tpot_target_s * 1e3:.3g} ms"
    )
    ax.set(
        xscale="log",
        xlabel="batch (sequences per step)",
        ylabel="TPOT (ms)",
        ylim=(0, None),
        xlim=(0.8, max(b) * 1.3),
    )
    ax.set_xticks(b, [str(x) for x in b])
    ax.minorticks_off()
    rate = ax.twinx()
    rate.plot(b, [p.tokens_per_s for p in points], "s--", color="C2", label="tokens/s, measured")
    rate.set(ylabel="tokens/s (all sequences)", ylim=(0, None))
    if capacity < max(b):
        ax.axvspan(
            capacity + 0.5,
            8 * max(b),
            color="C3",
            alpha=0.15,
            label=f"does not fit (roofline.admitted): batch > {capacity}",
        )
    if useful is not None:
        ax.axvline(useful, color="black", lw=1, label=f"useful batch {useful}")
    (h1, l1), (h2, l2) = ax.get_legend_handles_labels(), rate.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, fontsize=7, loc="outside right upper")
    ax.set_title(title, fontsize=_TICK_SIZE)
    stamp_corner(fig)
    return fig


def workload_bytes(diagnoses, selected: str | None = None):
    """Section 9.8: per workload (name -> Diagnosis), the bytes one step moves for weights and for
    the cache, the memory left for the cache, and the verdict with the fractions behind it."""
    instance("diagnoses", diagnoses, dict, "a dict of workload -> Diagnosis")
    fig, axes = new_figure(ncols=len(diagnoses), height=3.4)
    for ax, (name, d) in zip(np.atleast_1d(axes), diagnoses.items()):
        work, fit = d.trace.work, d.sweep[0].admission
        ax.bar(
            ["weights", "KV"],
            [work.weights_read / 1e6, (work.kv_read + work.kv_written) / 1e6],
            color=["C0", "C3"],
        )
        ax.axhline(
            (fit.available - fit.weights) / 1e6,
            color="C3",
            ls=":",
            lw=1,
            label="memory left for the cache",
        )
        ax.set(ylabel="MB moved per step")
        ax.set_title(
            f"{name}: P={d.prompt_tokens}, b={d.batch} → {d.verdict}\nbusy"
            f" {d.trace.busy_fraction:.0%} · bandwidth {d.bandwidth_fraction:.0%} · FLOP/s"
            f" {d.flops_fraction:.0%}",
            fontsize=_TICK_SIZE,
        )
        if name == selected:
            ax.set_facecolor("#fff6e0")
        ax.legend(fontsize=7, loc="upper left")
    stamp_corner(fig)
    return fig
