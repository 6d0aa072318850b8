"""Drop repeated <script> entries from each page.

sphinx-thebe adds its inline configuration (``const THEBE_JS_URL = ...``) once per reading pass, and
Jupyter Book can read twice, so pages declared the same constant twice and the browser logged an
error on every page. Keeping the first copy of each identical script fixes that.
"""


def _unique_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, kept = set(), []
    for script in scripts:
        # Inline scripts come with filename None or '' depending on who added them.
        key = (
            str(getattr(script, "filename", script) or ""),
            repr(sorted(getattr(script, "attributes", {}).items())),
        )
        if key not in seen:
            seen.add(key)
            kept.append(script)
    scripts[:] = kept  # in place: the list is the builder's, which other extensions append to


def setup(app):
    # Late, so that scripts added by other page-context handlers (MathJax's) are already there.
    app.connect("html-page-context", _unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
