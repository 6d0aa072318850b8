"""The static book as a reader sees it: one search box, no console error, a favicon, and a
stylesheet for tables, code and figures on narrow screens (``book/_static/kvlab.css``).

- pydata-sphinx-theme logs "Got invalid theme mode" on a first visit when no default mode is set:
  the book sets the template's ``default_mode`` to light.
- sphinx-book-theme puts a search box both in the header and in the sidebar: the sidebar's goes.
"""

from pathlib import Path

STATIC = Path(__file__).resolve().parents[1] / "_static"
SIDEBAR = ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]


def _configure(app, config):
    config.html_context = {**(config.html_context or {}), "default_mode": "light"}
    config.html_sidebars = {"**": SIDEBAR}
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    config.html_favicon = str(STATIC / "favicon.png")


def setup(app):
    app.connect("config-inited", _configure)
    app.add_css_file("kvlab.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
