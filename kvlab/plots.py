"""Shared matplotlib helpers: house-style figures, measured-vs-predicted, roofline axes, the device stamp.

Serves every section of the book: each measurement is drawn beside its prediction on the same axes
(9.1 to 9.8, prefix caching, the memory wall), the roofline of 9.3 and the memory-wall chapter is
drawn by ``roofline_axes``, and every figure names, in its corner, the device and versions it was
measured on. No widgets here (those are in ``widgets.py``).
"""

from __future__ import annotations

import functools
import math

import matplotlib.pyplot as plt
import numpy as np

from . import hardware

_STAMP_GID = "kvlab-stamp"
_STAMP_SIZE = 6.5  # points
_LABEL_SIZE = 10
_TICK_SIZE = 9
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
    for t in [t for t in fig.texts if t.get_gid() == _STAMP_GID]:
        t.remove()
    line = hardware.stamp_line(stamp if stamp is not None else _local_stamp())
    text = fig.text(0.995, 0.005, line, ha="right", va="bottom", fontsize=_STAMP_SIZE,
                    color="0.5", gid=_STAMP_GID)
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
    if ncols < 1:
        raise ValueError(f"ncols must be at least 1, got {ncols}")
    if width is None:
        width = 5.2 if ncols == 1 else 4.4 * ncols
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), layout="constrained", squeeze=False)
    for ax in axes.flat:
        ax.tick_params(labelsize=_TICK_SIZE)
        ax.xaxis.label.set_fontsize(_LABEL_SIZE)
        ax.yaxis.label.set_fontsize(_LABEL_SIZE)
        ax.title.set_fontsize(_LABEL_SIZE + 1)
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, (axes[0, 0] if ncols == 1 else axes[0])


def measured_vs_predicted(ax, x, measured, predicted, *, xlabel: str, ylabel: str,
                          measured_label: str = "measured", predicted_label: str = "predicted",
                          minmax=None):
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
        raise ValueError(f"x, measured and predicted must have the same length, "
                         f"got {len(x)}, {len(measured)} and {len(predicted)}")
    order = np.argsort(x)
    ax.plot(x[order], predicted[order], "-", color="C0", lw=1.8, label=predicted_label, zorder=2)
    yerr = None
    if minmax is not None:
        lo, hi = (np.asarray(a, dtype=float) for a in minmax)
        if lo.shape != measured.shape or hi.shape != measured.shape:
            raise ValueError(f"minmax must be (lo, hi), each of length {len(measured)}")
        yerr = np.clip([measured - lo, hi - measured], 0, None)
    ax.errorbar(x, measured, yerr=yerr, fmt="o", color="C1", ms=5, capsize=3, lw=1,
                label=measured_label, zorder=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=_LEGEND_SIZE)
    return ax


def roofline_axes(ax, peak_flops: float, bytes_per_s: float, *, intensities=None, label: str | None = None):
    """Draw a log-log roofline: attainable FLOP/s = min(peak, AI * bandwidth), ridge point marked.

    ``intensities`` sets the span of arithmetic intensities drawn (FLOP/byte; any sequence, only its
    range is used); by default two decades either side of the ridge. ``label`` names the roof in
    the legend (default: the two ceilings). Call it twice on one Axes to compare two devices.
    Returns ``ax``. Serves 9.3 (GEMV-like decode) and the memory-wall chapter, and every section
    that places a kernel against its roof.
    """
    if not (peak_flops > 0 and bytes_per_s > 0):
        raise ValueError(f"peak_flops and bytes_per_s must be positive, got {peak_flops} and {bytes_per_s}")
    ridge = peak_flops / bytes_per_s
    if intensities is None:
        lo, hi = ridge / 100, ridge * 100
    else:
        ai = np.asarray(intensities, dtype=float)
        if ai.size == 0 or np.any(ai <= 0):
            raise ValueError("intensities must be a non-empty sequence of positive FLOP/byte values")
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
    ax.annotate(f"ridge: {_sig(ridge)} FLOP/B", (ridge, peak_flops), xytext=(8, -14),
                textcoords="offset points", fontsize=_TICK_SIZE, color=line.get_color())
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.legend(fontsize=_LEGEND_SIZE)
    return ax


_PREFIXES = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_SECONDS = [(1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]


def _sig(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}"


def si(value: float, unit: str, digits: int = 3) -> str:
    """Format a quantity with an SI prefix and ``digits`` significant figures, for prose and labels.

    ``si(3.35e12, "B/s") == "3.35 TB/s"``, ``si(0.0051, "s") == "5.1 ms"``, ``si(2.5e-6, "s") ==
    "2.5 µs"``. Seconds scale down (ms, µs, ns) but never up; other units scale up (k to E) but
    never down. Prefixes are decimal, as in the datasheets. Serves every section.
    """
    value = float(value)
    if not math.isfinite(value) or value == 0:
        return f"{value:g} {unit}".rstrip()
    sign = "-" if value < 0 else ""
    # Round first, so that 999.96e9 becomes "1 TB/s", not "1e+03 GB/s".
    mag = float(_sig(abs(value), digits))
    table = _SECONDS if unit == "s" else _PREFIXES + [(1.0, "")]
    for scale, prefix in table:
        if mag >= scale:
            break
    if unit == "s" and mag >= 1e3:
        return f"{sign}{mag:,.0f} s"
    return f"{sign}{_sig(mag / scale, digits)} {prefix}{unit}".rstrip()


def _op_kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("mm", "gemm", "gemv", "matmul", "linear", "addmm", "cutlass", "sm90", "sm80")):
        return "matmul"
    if any(k in n for k in ("attention", "sdpa", "flash", "softmax", "paged")):
        return "attention"
    if any(k in n for k in ("cat", "copy", "index", "memcpy", "memset", "store")):
        return "copy"
    return "other"


TIMELINE_COLORS = {"matmul": "C0", "attention": "C3", "copy": "C2", "other": "C7"}


def timeline(ax, spans, y: float, *, height: float = 0.6, label: str | None = None):
    """Draw ``spans`` (name, start_s, end_s) as bars on row ``y``, in ms, coloured by kind; gaps stay white.

    Serves section 9.8: a decode step's kernels (GPU) or operators (CPU) over time.
    """
    by_kind: dict[str, list] = {}
    for name, start, end in spans:
        by_kind.setdefault(_op_kind(name), []).append((start * 1e3, max((end - start) * 1e3, 1e-4)))
    for kind, bars in by_kind.items():
        ax.broken_barh(bars, (y - height / 2, height), color=TIMELINE_COLORS[kind], linewidth=0)
    if label is not None:
        ax.text(0, y + height / 2 + 0.05, label, fontsize=_TICK_SIZE, va="bottom")
    return ax
