# Run by scripts/gpu_check.sh as one more cell after a notebook executed in live mode
# (tests/nbrun.py --after-file): moves a slider of one live explorer through the widget itself, as a
# reader's drag would (its observers run kvlab's callback; a slow panel's Run button is clicked the
# same way), and records how long the re-measured figure and reading took. It relies only on the
# attributes that kvlab's Explorer documents (sliders, run_button, results, readings, errors,
# title), and on no name in the notebook, so it works whatever the notebook is. Writes JSON to
# $KVLAB_SLIDER_OUT.
def _key(ex, name, value):
    """The explorer's key (values in slider order) with slider ``name`` set to ``value``."""
    return tuple(value if n == name else s.value for n, s in ex.sliders.items())


def _value(option):
    return (
        option[1] if isinstance(option, tuple) else option
    )  # (label, value) pairs, as kvlab gives them


def _kvlab_slider_check():
    import gc
    import json
    import os
    import time

    panels = [
        o
        for o in gc.get_objects()
        if type(o).__name__ == "Explorer" and getattr(o, "sliders", None)
    ]
    moves = [
        (ex, name, s, i)
        for ex in panels
        for name, s in ex.sliders.items()
        for i in range(len(s.options))
        if i != s.index and _key(ex, name, _value(s.options[i])) not in ex.results
    ]
    if not moves:
        raise AssertionError(
            f"no live explorer with a slider value not yet measured ({len(panels)} panels)"
        )
    ex, name, slider, index = moves[0]
    old, had_readings = slider.value, bool(ex.readings)
    seen = set(ex.results) | set(ex.errors)
    start = time.perf_counter()
    slider.index = index  # the widget's observers do the rest
    if ex.run_button is not None:
        ex.run_button.click()  # slow panels measure on Run, as a reader would press it
    seconds = time.perf_counter() - start
    new = [k for k in set(ex.results) | set(ex.errors) if k not in seen]
    errors = [ex.errors[k] for k in new if k in ex.errors]
    readings = [ex.readings[k] for k in new if k in ex.readings]
    record = {
        "title": ex.title,
        "slider": name,
        "from": str(old),
        "to": str(slider.value),
        "seconds": round(seconds, 3),
        "new_results": len(new),
        "errors": errors,
        "reading": readings[0][:400] if readings else None,
        "panels": len(panels),
    }
    out = os.environ.get("KVLAB_SLIDER_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(record, f, indent=1)
    print(json.dumps(record))
    assert new and not errors, f"moving {name!r} re-measured nothing or failed: {record}"
    assert readings or not had_readings, f"no reading re-rendered after moving {name!r}: {record}"


_kvlab_slider_check()
del _kvlab_slider_check, _key, _value
