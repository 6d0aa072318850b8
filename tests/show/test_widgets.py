"""kvlab.show.widgets (static HTML slider and live ipywidgets panel) and kvlab.show.plots
helpers."""

import json
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("ipywidgets")  # a GPU image may lack it; the CPU suite always has it

from kvlab.show import plots, widgets  # noqa: E402
from kvlab.show.widgets import explore  # noqa: E402

STAMP = {
    "device": "Test Accelerator X1",
    "torch": "9.9",
    "transformers": "8.8",
    "date": "2030-01-02",
}


def tiny_plot(result, **params):
    """A very small figure whose pixels depend only on ``result``."""
    fig, ax = plt.subplots(figsize=(1.2, 0.9))
    ax.plot([0, 1], [0, result])
    ax.set_ylim(-10, 10)
    ax.set_axis_off()
    return fig


def by_a(a, b):
    return a  # the figure depends on a only: combinations with equal a draw the same picture


def images(page):
    return re.findall(r"data:image/png;base64,[A-Za-z0-9+/=]+", page)


def ranges(page):
    return re.findall(r'<input type="range"[^>]*>', page)


# -- static mode ---------------------------------------------------------------------------------


def test_static_one_range_per_slider_with_right_max():
    ex = explore(by_a, {"a": [1, 2, 3], "b": ["x", "y"]}, tiny_plot, static=True)
    page = ex._repr_html_()
    inputs = ranges(page)
    assert len(inputs) == 2
    assert 'max="2"' in inputs[0] and 'max="1"' in inputs[1]
    assert 'value="0"' in inputs[0]


def test_static_runs_every_combination_and_stores_each_distinct_image_once():
    ex = explore(by_a, {"a": [1, 2, 3], "b": [10, 20]}, tiny_plot, static=True)
    assert set(ex.results) == {(a, b) for a in (1, 2, 3) for b in (10, 20)}
    assert ex.errors == {}
    found = images(ex._repr_html_())
    assert len(found) == 3 == len(set(found))  # six combinations, three distinct figures


def test_static_defaults_pick_the_initial_frame():
    ex = explore(
        by_a, {"a": [1, 2, 3], "b": [10, 20]}, tiny_plot, defaults={"a": 2, "b": 20}, static=True
    )
    assert ex.params == {"a": 2, "b": 20}
    assert ex.result == 2
    page = ex._repr_html_()
    assert [re.search(r'value="(\d+)"', i).group(1) for i in ranges(page)] == ["1", "1"]
    assert 'alt="a=2, b=20"' in page


def test_static_html_is_self_contained():
    ex = explore(by_a, {"a": [1, 2], "b": [3]}, tiny_plot, title="demo", static=True)
    page = ex._repr_html_()
    srcs = re.findall(r'src="([^"]*)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 1 and "<script>" in page  # inline only, no src=
    # base64 can spell anything by chance, so look at the page with the images taken out
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page).lower()
    for bad in ("http://", "https://", "cdn", "require", "<link", "@import"):
        assert bad not in text


def test_two_explorers_have_distinct_ids():
    pages = [
        explore(by_a, {"a": [1, 2], "b": [3]}, tiny_plot, static=True)._repr_html_()
        for _ in range(2)
    ]
    ids = [set(re.findall(r'id="([^"]+)"', p)) for p in pages]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    for p, own in zip(pages, ids):
        root = re.search(r'<div id="([^"]+)" class="kvlab-explorer"', p).group(1)
        assert f'getElementById("{root}")' in p
        assert all(i.startswith(root) for i in own)


def test_static_error_in_one_combination_shows_text_and_others_still_render():
    def measure(a, b):
        if a == 2:
            raise ValueError("no room for <a=2> & more")
        return a + b

    ex = explore(measure, {"a": [1, 2, 3], "b": [0]}, tiny_plot, static=True)
    assert set(ex.results) == {(1, 0), (3, 0)}
    assert ex.errors == {(2, 0): "ValueError: no room for <a=2> & more"}
    page = ex._repr_html_()
    assert "Traceback" not in page
    assert len(images(page)) == 2
    # the message travels as escaped JSON inside the script, never as raw markup
    assert "ValueError: no room for \\u003ca=2\\u003e \\u0026 more" in page
    assert "<a=2>" not in page


def test_static_error_at_default_is_escaped_in_place_of_the_image():
    def measure(a):
        if a == 1:
            raise RuntimeError("broke </script> here")
        return a

    ex = explore(measure, {"a": [1, 2]}, tiny_plot, static=True)
    page = ex._repr_html_()
    assert "RuntimeError: broke &lt;/script&gt; here" in page
    assert page.count("</script>") == 1 and "Traceback" not in page
    assert len(images(page)) == 1
    with pytest.raises(RuntimeError, match="a=1"):
        ex.result


def test_static_error_in_plot_is_caught_too():
    def plot(result, a):
        if a == 2:
            raise KeyError("missing")
        return tiny_plot(result)

    ex = explore(lambda a: a, {"a": [1, 2]}, plot, static=True)
    assert ex.errors == {(2,): "KeyError: 'missing'"}
    assert ex.results == {(1,): 1, (2,): 2}  # measure succeeded for both
    assert plt.get_fignums() == []  # every figure closed, the failed one included


def test_static_mode_prints_nothing(capsys):
    from tqdm.auto import tqdm

    def measure(a):
        print("hello from measure")
        return sum(tqdm(range(a), desc="sweep"))

    def plot(result, a):
        print("hello from plot")
        return tiny_plot(result)

    explore(measure, {"a": [1, 3]}, plot, static=True)
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_static_from_environment(monkeypatch):
    monkeypatch.setenv("KVLAB_STATIC", "1")
    assert explore(lambda a: a, {"a": [1]}, tiny_plot).static
    monkeypatch.setenv("KVLAB_STATIC", "0")
    assert not explore(lambda a: a, {"a": [1]}, tiny_plot).static


def test_no_sliders_is_a_plain_figure():
    ex = explore(lambda: 3, {}, lambda r: tiny_plot(r), title="fixed", static=True)
    assert ex.results == {(): 3} and ex.result == 3
    page = ex._repr_html_()
    assert ranges(page) == [] and len(images(page)) == 1 and 'alt="fixed"' in page


def test_non_figure_from_plot_is_an_error():
    ex = explore(lambda a: a, {"a": [1]}, lambda r, a: None, static=True)
    assert ex.errors == {(1,): "TypeError: plot must return a matplotlib Figure, got NoneType"}


# -- readings ------------------------------------------------------------------------------------


def parity(result, a, b):
    """A reading with both outcomes written, as the notebooks' readings are."""
    kind = "even" if result % 2 == 0 else "odd"
    return (
        f"At $a = {a}$ the result **{result}** is {kind}.\n\n| a | b |\n|---|---|\n| {a} | {b} |\n"
    )


def test_reading_is_markdown_output_and_returns_none(monkeypatch):
    import IPython.display

    import kvlab

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    assert kvlab.reading("| x |\n|---|\n| $1$ |") is None
    assert len(shown) == 1 and isinstance(shown[0], IPython.display.Markdown)
    assert shown[0].data == "| x |\n|---|\n| $1$ |"
    assert shown[0]._repr_markdown_() == "| x |\n|---|\n| $1$ |"


def test_reading_rejects_non_text():
    import kvlab

    with pytest.raises(TypeError, match="markdown_text must be a str.*float"):
        kvlab.reading(2.5)


def test_markdown_html_renders_tables_and_math_for_mathjax():
    out = widgets.markdown_html(
        "Time $t$ at $$B$$\n\n| $B$ | $T$ |\n|---|--:|\n| 1 | 2 |\n\n$$\nx < y\n$$\n"
    )
    assert '<table class="table">' in out and "<th>" in out and "|---" not in out
    assert r'<span class="math notranslate nohighlight">\(B\)</span>' in out
    assert '<div class="math notranslate nohighlight">\n\\[x &lt; y\\]\n</div>' in out
    assert "<script" not in widgets.markdown_html(
        "<script>alert(1)</script>"
    )  # raw HTML is escaped


def test_static_reading_under_the_figure_follows_the_slider():
    ex = explore(
        lambda a, b: a,
        {"a": [1, 2, 3], "b": ["x", "y"]},
        tiny_plot,
        reading=parity,
        defaults={"a": 2},
        static=True,
    )
    assert ex.reading == parity(2, 2, "x")
    assert set(ex.readings) == set(ex.results) and len(ex.readings) == 6
    page = ex._repr_html_()
    default = re.search(r'<div class="kvlab-reading"[^>]*>(.*?)</div>\n', page, flags=re.S).group(1)
    assert "<strong>2</strong> is even" in default and "<table" in default
    assert r"\(a = 2\)" in default
    # every state's reading travels once, as HTML, with a frame map from slider indices to it
    data = _script_data(page)
    assert len(data["texts"]) == 6 and data["text_frames"]["0,1"] == data["texts"].index(
        widgets.markdown_html(parity(1, 1, "y"))
    )
    assert all("<table" in t and "|---" not in t for t in data["texts"])
    assert "typesetPromise" in page  # MathJax typesets the math again after a swap


def test_static_identical_readings_are_stored_once():
    ex = explore(
        lambda a, b: a,
        {"a": [1, 2], "b": [10, 20, 30]},
        tiny_plot,
        reading=lambda r, a, b: f"a is {a}",
        static=True,
    )
    data = _script_data(ex._repr_html_())
    assert len(data["texts"]) == 2 and len(data["text_frames"]) == 6


def test_reading_that_fails_or_returns_non_text_is_an_error_line():
    def reading(result, a):
        if a == 2:
            raise ValueError("no reading for a=2")
        return 42 if a == 3 else "fine"

    ex = explore(lambda a: a, {"a": [1, 2, 3]}, tiny_plot, reading=reading, static=True)
    assert ex.readings == {(1,): "fine"}
    assert ex.errors == {
        (2,): "ValueError: no reading for a=2",
        (3,): "TypeError: reading must return a str of Markdown, got int",
    }
    with pytest.raises(TypeError, match="reading must be a function"):
        explore(lambda a: a, {"a": [1]}, tiny_plot, reading="text", static=True)


def test_no_reading_function_means_no_reading_block():
    ex = explore(lambda a: a, {"a": [1, 2]}, tiny_plot, static=True)
    assert ex.reading is None and 'class="kvlab-reading"' not in ex._repr_html_()


def test_live_reading_is_redrawn_with_the_figure(monkeypatch):
    monkeypatch.setattr(
        widgets, "SLOW_RUN_S", float("inf")
    )  # rerun on change, however loaded the machine
    shown = []
    monkeypatch.setattr(widgets, "_in_ipython", lambda: True)
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    ex = explore(lambda a, b: a, {"a": [1, 2], "b": ["x"]}, tiny_plot, reading=parity, static=False)
    assert ex.reading == parity(1, 1, "x")
    assert [type(o).__name__ for o in shown[-2:]] == ["Image", "Markdown"]
    assert "is odd" in shown[-1].data
    ex.sliders["a"].value = 2
    assert "is even" in shown[-1].data and ex.readings[(2, "x")] == parity(2, 2, "x")


def _script_data(page: str) -> dict:
    """The JSON the static slider's script carries (``var ... d = {...};``)."""
    text = re.search(r"<script>(.*?)</script>", page, flags=re.S).group(1)
    start = text.index("d = ") + 4
    return json.JSONDecoder().raw_decode(text[start:])[0]


# -- validation ----------------------------------------------------------------------------------


def test_bad_default_names_slider_and_allowed_values():
    with pytest.raises(ValueError, match=r"'batch'.*\[1, 2, 4\]"):
        explore(
            lambda batch: batch, {"batch": [1, 2, 4]}, tiny_plot, defaults={"batch": 3}, static=True
        )


def test_default_for_unknown_slider():
    with pytest.raises(ValueError, match="'ctx'"):
        explore(lambda batch: batch, {"batch": [1]}, tiny_plot, defaults={"ctx": 3}, static=True)


def test_empty_value_list_names_slider():
    with pytest.raises(ValueError, match="'context'"):
        explore(lambda batch, context: 0, {"batch": [1], "context": []}, tiny_plot, static=True)
    with pytest.raises(ValueError, match="'context'"):
        explore(lambda batch, context: 0, {"batch": [1], "context": []}, tiny_plot, static=False)


def test_duplicate_values_and_bare_strings_are_rejected():
    with pytest.raises(ValueError, match="'b'"):
        explore(lambda b: 0, {"b": [1, 2, 1]}, tiny_plot, static=True)
    with pytest.raises(TypeError, match="'mode'"):
        explore(lambda mode: 0, {"mode": "abc"}, tiny_plot, static=True)


# -- live mode -----------------------------------------------------------------------------------


def test_live_builds_widgets_and_reruns_on_change(monkeypatch):
    # Whether a panel reruns on change depends on how long its first run took; on a loaded machine
    # that can pass SLOW_RUN_S, so fix the threshold rather than assert a timing.
    monkeypatch.setattr(widgets, "SLOW_RUN_S", float("inf"))
    calls = []

    def measure(a, b):
        calls.append((a, b))
        if b == "bad":
            raise ZeroDivisionError("division by zero")
        return a

    ex = explore(measure, {"a": [1, 2, 3], "b": ["ok", "bad"]}, tiny_plot, title="t", static=False)
    assert not ex.static and ex.run_button is None
    assert set(ex.sliders) == {"a", "b"} and ex.sliders["a"].continuous_update is False
    assert ex.widget.children[-2:] == (ex.status, ex.output)
    assert ex.results == {(1, "ok"): 1} and ex.result == 1

    ex.sliders["a"].value = 3
    assert set(ex.results) == {(1, "ok"), (3, "ok")}
    assert "a=3" in ex.status.value

    ex.sliders["b"].value = "bad"
    assert "ZeroDivisionError: division by zero" in ex.status.value
    assert "Traceback" not in ex.status.value
    assert ex.errors == {(3, "bad"): "ZeroDivisionError: division by zero"}

    ex.sliders["b"].value = "ok"  # cached: no second measurement
    assert calls.count((3, "ok")) == 1 and "cached" in ex.status.value
    assert ex.params == {"a": 1, "b": "ok"}  # params stay the defaults


def test_live_slow_first_run_adds_run_button(monkeypatch):
    monkeypatch.setattr(widgets, "SLOW_RUN_S", -1.0)  # every run counts as slow
    ex = explore(lambda a: a, {"a": [1, 2]}, tiny_plot, static=False)
    assert ex.run_button is not None and ex.run_button in ex.widget.children
    ex.sliders["a"].value = 2
    assert (2,) not in ex.results and "press Run" in ex.status.value
    ex.run_button.click()
    assert ex.results[(2,)] == 2 and "a=2" in ex.status.value


def test_live_with_progress_bar_and_no_sliders():
    from tqdm.auto import tqdm

    ex = explore(lambda: sum(tqdm(range(3))), {}, lambda r: tiny_plot(r), static=False)
    assert ex.result == 3 and ex.errors == {}
    assert ex._repr_html_() is None


# -- plots ---------------------------------------------------------------------------------------


def test_stamp_corner_writes_device_line():
    fig, ax = plots.new_figure()
    text = plots.stamp_corner(fig, STAMP)
    assert (
        text in fig.texts
        and "Test Accelerator X1" in text.get_text()
        and "2030-01-02" in text.get_text()
    )
    plots.stamp_corner(fig, STAMP)  # again: replaces, does not stack
    assert sum("Test Accelerator" in t.get_text() for t in fig.texts) == 1
    plt.close(fig)


def test_stamp_corner_defaults_to_this_machine(monkeypatch):
    monkeypatch.setattr(plots, "_local_stamp", lambda: STAMP)
    fig, _ = plots.new_figure()
    assert "Test Accelerator X1" in plots.stamp_corner(fig).get_text()
    plt.close(fig)


@pytest.mark.parametrize(
    "value, unit, expected",
    [
        (3.35e12, "B/s", "3.35 TB/s"),
        (0.0051, "s", "5.1 ms"),
        (2.5e-6, "s", "2.5 µs"),
        (12, "s", "12 s"),
        (989.5e12, "FLOP/s", "990 TFLOP/s"),
        (999.96e9, "B/s", "1 TB/s"),
        (16e9, "B", "16 GB"),
        (295.4, "FLOP/B", "295 FLOP/B"),
        (0, "B", "0 B"),
        (-2e6, "B", "-2 MB"),
    ],
)
def test_si(value, unit, expected):
    assert plots.si(value, unit) == expected


def test_new_figure_and_measured_vs_predicted():
    fig, axes = plots.new_figure(ncols=2)
    assert len(axes) == 2 and fig.get_layout_engine() is not None
    ax = plots.measured_vs_predicted(
        axes[0],
        [1, 2, 3],
        [1.1, 2.0, 2.9],
        [1, 2, 3],
        xlabel="x",
        ylabel="y",
        minmax=([1.0, 1.9, 2.8], [1.2, 2.1, 3.0]),
    )
    assert ax.get_xlabel() == "x"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["predicted", "measured"]
    plt.close(fig)


def test_roofline_axes_marks_ridge():
    fig, ax = plots.new_figure()
    plots.roofline_axes(ax, 989.5e12, 3.35e12)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)" and ax.get_ylabel() == "FLOP/s"
    assert any(t.get_text() == "ridge: 295 FLOP/B" for t in ax.texts)
    x, y = ax.lines[0].get_data()
    assert y.max() == pytest.approx(989.5e12) and y[0] == pytest.approx(x[0] * 3.35e12)
    plt.close(fig)
