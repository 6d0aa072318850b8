"""Every notebook: sliders over a measurement, live in a Jupyter kernel, pre-rendered in the static
book.

Serves every section of the book: each notebook ends its idea with ``explore(measure, sliders,
plot)``, which reruns a real measurement when the reader moves a slider. The same ``plot`` draws
both ways:

* live (a running kernel): ipywidgets sliders rerun ``measure`` on release, a Run button appears
  when one run takes over a second, progress bars of sweeps show in the panel, and errors show as
  one red line, never a traceback;
* static (the book build, ``KVLAB_STATIC=1``): ``measure`` runs over every slider combination up
  front and the result is a self-contained HTML slider (inline PNGs, a few lines of inline
  JavaScript, nothing fetched) that flips between the pre-rendered figures, offline too.

A ``reading(result, **params)`` function, when given, writes the paragraph under the figure as
Markdown. It is redrawn with the figure: live, as Markdown output in the panel; static, converted
to HTML per slider state at build time (tables and ``$math$`` included; MathJax typesets the math
again after each swap).
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from kvlab._checks import flag, function, instance

STATIC_DPI = 90
LIVE_DPI = 100
SLOW_RUN_S = 1.0  # a first run slower than this turns off rerun-on-change and shows a Run button


def explore(
    measure: Callable,
    sliders: Mapping[str, Sequence],
    plot: Callable,
    *,
    defaults: Mapping | None = None,
    title: str | None = None,
    reading: Callable | None = None,
    static: bool | None = None,
) -> Explorer:
    """Show ``plot(measure(**params), **params)`` with one slider per parameter.

    ``sliders`` maps each parameter name to its discrete values (ints, floats or strings), in
    display order; ``{}`` gives a plain figure. ``defaults`` picks a starting value per slider
    (each one of that slider's values); otherwise the first value. ``measure(**params)`` returns any
    result object and ``plot(result, **params)`` a matplotlib Figure. ``reading(result, **params)``,
    if given, returns the Markdown shown under the figure and redrawn with it. ``static=None`` means
    ``os.environ.get("KVLAB_STATIC") == "1"``.

    Returns an :class:`Explorer`; its ``.result`` (the result at the defaults) is what later cells
    quote. Serves every section of the book.
    """
    return Explorer(
        measure, sliders, plot, defaults=defaults, title=title, reading=reading, static=static
    )


class Explorer:
    """The panel ``explore`` returns; see :func:`explore`. Serves every section of the book.

    Attributes: ``params`` (the defaults, name -> value), ``result`` (the result at the defaults),
    ``reading`` (its Markdown, or None), ``readings`` (Markdown per combination drawn so far),
    ``results`` and ``errors`` (keyed by a tuple of values in slider order: the result, or the
    ``TypeName: message`` text of what ``measure`` or ``plot`` raised, for every combination run so
    far), ``static`` (which mode). Live mode adds the widgets: ``sliders`` (name ->
    SelectionSlider), ``status``, ``output``, ``run_button`` (None unless runs are slow) and
    ``widget``, the VBox.
    """

    def __init__(
        self,
        measure: Callable,
        sliders: Mapping[str, Sequence],
        plot: Callable,
        *,
        defaults: Mapping | None = None,
        title: str | None = None,
        reading: Callable | None = None,
        static: bool | None = None,
    ):
        function("measure", measure)
        function("plot", plot)
        if reading is not None:
            function("reading", reading)
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title must be a str or None, got {type(title).__name__} {title!r}")
        self._values = _check_sliders(sliders)
        self._names = list(self._values)
        self.params = _check_defaults(self._values, defaults)
        self._measure, self._plot, self._reading, self.title = measure, plot, reading, title
        self.static = (
            os.environ.get("KVLAB_STATIC") == "1" if static is None else flag("static", static)
        )
        self.results: dict[tuple, object] = {}
        self.errors: dict[tuple, str] = {}
        self._pngs: dict[tuple, bytes] = {}
        self.readings: dict[tuple, str] = {}
        self._default_key = tuple(self.params[n] for n in self._names)
        if self.static:
            with _quiet():
                for key in itertools.product(*self._values.values()):
                    self._compute(key, STATIC_DPI)
            self._html = self._static_html()
        else:
            self._build_live()

    @property
    def result(self):
        """The result of ``measure`` at the defaults; raises RuntimeError if that run failed."""
        key = self._default_key
        if key not in self.results:
            raise RuntimeError(
                f"measure failed at {self._describe(key)}: {self.errors.get(key, 'not run')}"
            )
        return self.results[key]

    @property
    def reading(self) -> str | None:
        """The Markdown under the figure at the defaults (None without a ``reading`` function)."""
        return self.readings.get(self._default_key)

    def __repr__(self) -> str:
        mode = "static" if self.static else "live"
        return (
            f"<Explorer {self.title or ''} ({mode}): {len(self.results)} results, "
            f"{len(self.errors)} errors, defaults {self.params}>"
        )

    def _describe(self, key: tuple) -> str:
        return ", ".join(f"{n}={v}" for n, v in zip(self._names, key))

    def _compute(self, key: tuple, dpi: int, fresh: bool = False) -> bytes | None:
        """Measure (unless cached), draw and write the reading of one combination.

        Returns PNG bytes, or None on error (the error text is kept in ``errors``).
        """
        params = dict(zip(self._names, key))
        self.errors.pop(key, None)
        self._pngs.pop(key, None)
        self.readings.pop(key, None)
        try:
            if fresh or key not in self.results:
                self.results.pop(key, None)
                self.results[key] = self._measure(**params)
            png = _render(self._plot, self.results[key], params, dpi)
            if self._reading is not None:
                text = self._reading(self.results[key], **params)
                if not isinstance(text, str):
                    raise TypeError(
                        f"reading must return a str of Markdown, got {type(text).__name__}"
                    )
                self.readings[key] = text
        except Exception as e:  # shown to the reader as one line; KeyboardInterrupt still stops
            self.errors[key] = f"{type(e).__name__}: {e}"
            return None
        self._pngs[key] = png
        return png

    # -- static mode -----------------------------------------------------------------------------

    def _repr_html_(self) -> str | None:
        return self._html if self.static else None

    def _static_html(self) -> str:
        uid = f"kvlab-x-{uuid.uuid4().hex}"
        labels = [[str(v) for v in self._values[n]] for n in self._names]
        default_idx = [self._values[n].index(self.params[n]) for n in self._names]
        title = self.title or ""
        default_png = self._pngs.get(self._default_key)
        images, frames, texts, text_frames = self._static_frames(default_png)

        parts = [f'<div id="{uid}" class="kvlab-explorer" style="margin:0.5em 0">']
        if title:
            parts.append(
                f'<div style="font-weight:bold;margin-bottom:0.3em">{html.escape(title)}</div>'
            )
        for j, name in enumerate(self._names):
            i, vals = default_idx[j], labels[j]
            parts.append(
                '<div style="display:flex;align-items:center;gap:0.6em;margin:0.15em 0"><label'
                f' for="{uid}-s{j}" style="min-width:8em">{html.escape(name)}</label><input'
                f' type="range" id="{uid}-s{j}" min="0" max="{len(vals) - 1}" step="1" value="{i}"'
                f' autocomplete="off" aria-valuetext="{html.escape(vals[i])}"'
                ' style="width:16em"><output'
                f' for="{uid}-s{j}">{html.escape(vals[i])}</output></div>'
            )
        alt = html.escape(
            _alt(title, self._names, [labels[j][i] for j, i in enumerate(default_idx)])
        )
        err = self.errors.get(self._default_key)
        src = f' src="{_data_uri(default_png)}"' if default_png is not None else ""
        parts.append(
            f'<img{src} alt="{alt}" style="max-width:100%;height:auto;'
            f'{"display:none" if default_png is None else ""}">'
        )
        parts.append(
            '<pre class="kvlab-error" style="color:#b00000;white-space:pre-wrap;'
            f'{"" if err else "display:none"}">{html.escape(err or "")}</pre>'
        )
        if self._reading is not None:
            default_text = self.readings.get(self._default_key)
            parts.append(
                '<div class="kvlab-reading" aria-live="polite">'
                f"{markdown_html(default_text) if default_text is not None else ''}</div>"
            )
        if self._names:
            data = {
                "images": images,
                "frames": frames,
                "labels": labels,
                "names": self._names,
                "title": title,
                "texts": texts,
                "text_frames": text_frames,
            }
            script = _SCRIPT.replace("__ID__", json.dumps(uid)).replace("__DATA__", _js(data))
            parts.append(f"<script>{script}</script>")
        parts.append("</div>")
        return "\n".join(parts)

    def _static_frames(self, default_png: bytes | None):
        """The page's tables, one entry per slider position (``"i,j,..."``): ``images`` (each
        distinct PNG once, as a data URI) and ``frames`` (the image's index, or the error text),
        ``texts`` (each distinct reading once, as HTML) and ``text_frames`` (the reading's
        index)."""
        # The default PNG lives only in the <img> src, which is also what a reader without
        # JavaScript sees.
        images: list[str | None] = []
        by_bytes: dict[bytes, int] = {}
        frames: dict[str, int | str] = {}
        texts: list[str] = []  # each distinct reading once, as HTML
        by_text: dict[str, int] = {}
        text_frames: dict[str, int] = {}
        for idx in itertools.product(*(range(len(v)) for v in self._values.values())):
            key = tuple(self._values[n][i] for n, i in zip(self._names, idx))
            name = ",".join(map(str, idx))
            png = self._pngs.get(key)
            if png is None:
                frames[name] = self.errors.get(key, "not run")
                continue
            if png not in by_bytes:
                by_bytes[png] = len(images)
                images.append(None if png == default_png else _data_uri(png))
            frames[name] = by_bytes[png]
            if key in self.readings:
                text = self.readings[key]
                if text not in by_text:
                    by_text[text] = len(texts)
                    texts.append(markdown_html(text))
                text_frames[name] = by_text[text]
        return images, frames, texts, text_frames

    # -- live mode -------------------------------------------------------------------------------

    def _build_live(self) -> None:
        import ipywidgets as w

        self.sliders = {
            name: w.SelectionSlider(
                options=[(str(v), v) for v in vals],
                index=vals.index(self.params[name]),
                description=name,
                continuous_update=False,
                style={"description_width": "initial"},
                layout=w.Layout(width="28em"),
            )
            for name, vals in self._values.items()
        }
        self.status = w.HTML()
        self.output = w.Output()
        self.run_button = None
        elapsed = self._run_live(self._default_key)
        if elapsed > SLOW_RUN_S:
            self.run_button = w.Button(
                description="Run",
                icon="play",
                button_style="primary",
                tooltip="measure at the selected values",
            )
            self.run_button.on_click(lambda _: self._run_live(self._selected(), fresh=True))
            if not self.errors:
                self.status.value += _grey(" · slow run: move the sliders, then press Run")
        for s in self.sliders.values():
            s.observe(self._on_change, names="value")
        children = [w.HTML(f"<b>{html.escape(self.title)}</b>")] if self.title else []
        children += list(self.sliders.values())
        children += [self.run_button] if self.run_button else []
        self.widget = w.VBox(children + [self.status, self.output])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.static:
            display({"text/html": self._html, "text/plain": repr(self)}, raw=True)
        else:
            display(self.widget)

    def _selected(self) -> tuple:
        # Read the index, not .value, so values that compare oddly still map back exactly.
        return tuple(self._values[n][s.index] for n, s in self.sliders.items())

    def _on_change(self, _change) -> None:
        key = self._selected()
        if key in self._pngs:
            self._show(key, "cached")
        elif self.run_button is None:
            self._run_live(key)
        else:
            self.status.value = _grey(f"{html.escape(self._describe(key))}: press Run to measure")

    def _run_live(self, key: tuple, fresh: bool = False) -> float:
        """Measure and draw ``key`` inside the Output (so tqdm bars show there); returns seconds."""
        self.status.value = _grey(f"running… {html.escape(self._describe(key))}")
        t0 = time.perf_counter()
        with self.output:
            if _in_ipython():
                self.output.clear_output(wait=True)  # the old figure stays until new output arrives
            self._compute(key, LIVE_DPI, fresh=fresh)
        elapsed = time.perf_counter() - t0
        self._show(key, f"{elapsed:.2f} s")
        return elapsed

    def _show(self, key: tuple, note: str) -> None:
        png, err, text = self._pngs.get(key), self.errors.get(key), self.readings.get(key)
        if _in_ipython():
            from IPython.display import Image, Markdown, display

            with self.output:
                self.output.clear_output(wait=png is not None)
                if png is not None:
                    display(Image(data=png, format="png"))
                if text is not None:
                    display(Markdown(text))
        if err is not None:
            self.status.value = f'<span style="color:#b00000">{html.escape(err)}</span>'
        else:
            self.status.value = _grey(f"{html.escape(self._describe(key))} · {note}")


def _check_sliders(sliders) -> dict[str, list]:
    if not isinstance(sliders, Mapping):
        raise TypeError(f"sliders must be a dict of name -> values, got {type(sliders).__name__}")
    out = {}
    for name, values in sliders.items():
        if not isinstance(name, str):
            raise TypeError(f"slider names must be strings, got {name!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(
                f"slider {name!r}: values must be a list or tuple of values, got {values!r}"
            )
        values = list(values)
        if not values:
            raise ValueError(f"slider {name!r} has no values; give at least one")
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ValueError(f"slider {name!r} lists the value {v!r} twice: {values!r}")
        out[name] = values
    return out


def _check_defaults(values: dict[str, list], defaults) -> dict:
    params = {name: vals[0] for name, vals in values.items()}
    for name, v in (defaults or {}).items():
        if name not in values:
            raise ValueError(
                f"defaults names {name!r}, which is not a slider; sliders: {list(values)}"
            )
        if v not in values[name]:
            raise ValueError(
                f"default for slider {name!r} is {v!r}; allowed values: {values[name]!r}"
            )
        params[name] = values[name][values[name].index(v)]
    return params


def _render(plot: Callable, result, params: dict, dpi: int) -> bytes:
    """Call ``plot``, save the figure as PNG bytes, and close every figure the call opened."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    before = set(plt.get_fignums())
    fig = None
    try:
        returned = plot(result, **params)
        fig = returned if isinstance(returned, Figure) else getattr(returned, "figure", None)
        if not isinstance(fig, Figure):  # an Axes is accepted for its figure; anything else is not
            fig = None
            raise TypeError(f"plot must return a matplotlib Figure, got {type(returned).__name__}")
        buf = io.BytesIO()
        # Same canvas size for every combination (no bbox_inches="tight"), so the picture does not
        # jump as the reader slides; no Software metadata, so identical figures give identical
        # bytes.
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
        return buf.getvalue()
    finally:
        if fig is not None:
            plt.close(fig)
        for num in set(plt.get_fignums()) - before:
            plt.close(num)


def markdown_html(text: str) -> str:
    """Markdown to HTML for the static book: CommonMark with pipe tables and ``$math$``.

    Math is written the way Sphinx writes it (``\\(...\\)`` and ``\\[...\\]`` in elements of class
    ``math``), so the book's bundled MathJax typesets it.
    """
    instance("text", text, str)
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    def tex(content: str, options: dict) -> str:
        content = html.escape(content)
        return f"\\[{content}\\]" if options["display_mode"] else f"\\({content}\\)"

    md = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough")
    md.use(dollarmath_plugin, renderer=tex)
    out = md.render(text)
    # the plugin's classes ("math inline"/"math block") plus Sphinx's, so both CSS rules apply
    out = out.replace("<table>", '<table class="table">')
    return out.replace('class="math inline"', 'class="math notranslate nohighlight"').replace(
        'class="math block"', 'class="math notranslate nohighlight"'
    )


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _alt(title: str, names: list[str], labels: list[str]) -> str:
    values = ", ".join(f"{n}={v}" for n, v in zip(names, labels))
    return f"{title}: {values}" if title and values else (title or values or "figure")


def _js(obj) -> str:
    # JSON inside <script>: escape <, > and & so no value (an error message) can close the tag.
    return json.dumps(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _grey(text: str) -> str:
    return f'<span style="color:#666">{text}</span>'


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


@contextlib.contextmanager
def _quiet():
    """Swallow stdout, stderr and rich display output (a tqdm.notebook bar): the book shows them."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            from IPython.utils.capture import capture_output
        except ImportError:
            yield
            return
        with capture_output(stdout=False, stderr=False, display=True):
            yield


# Frames are keyed by the slider indices joined with commas; a number is an index into images
# (null: the one already in the <img>), a string is an error message shown instead of the image.
_SCRIPT = """
(function () {
  var root = document.getElementById(__ID__), d = __DATA__;
  var img = root.querySelector("img"), err = root.querySelector(".kvlab-error");
  var reading = root.querySelector(".kvlab-reading");
  var inputs = root.querySelectorAll("input[type=range]"), outs = root.querySelectorAll("output");
  for (var k = 0; k < d.images.length; k++)
    if (d.images[k] === null) d.images[k] = img.getAttribute("src");
  function show() {
    var idx = [], vals = [];
    for (var j = 0; j < inputs.length; j++) {
      var i = +inputs[j].value, label = d.labels[j][i];
      idx.push(i); vals.push(d.names[j] + "=" + label);
      outs[j].textContent = label; inputs[j].setAttribute("aria-valuetext", label);
    }
    var name = idx.join(","), f = d.frames[name];
    if (typeof f === "number") {
      img.src = d.images[f]; img.alt = (d.title ? d.title + ": " : "") + vals.join(", ");
      img.style.display = ""; err.style.display = "none";
    } else {
      err.textContent = f; err.style.display = ""; img.style.display = "none";
    }
    if (reading) showReading(d.text_frames[name]);
  }
  var shownText = -1;
  function showReading(t) {
    if (t === shownText) return;
    shownText = t;
    var M = window.MathJax;
    if (M && M.typesetClear) M.typesetClear([reading]);
    reading.innerHTML = typeof t === "number" ? d.texts[t] : "";
    // MathJax 3 asks that typesets be chained through startup.promise, never run side by side.
    if (M && M.typesetPromise && M.startup && M.startup.promise) {
      M.startup.promise = M.startup.promise.then(function () {
        return M.typesetPromise([reading]);
      });
    }
  }
  for (var j = 0; j < inputs.length; j++) inputs[j].addEventListener("input", show);
  show();
})();
"""
