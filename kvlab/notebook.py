"""What every notebook of the book needs besides measurements: problem sizes and prose numbers.

Serves every section: a notebook asks ``sizes`` for small problems on a CPU and real ones on a GPU,
and hands each number its prose quotes to ``glue`` so the text never carries a typed-in figure.
"""

from __future__ import annotations


def sizes(cpu, gpu):
    """``gpu`` on a CUDA machine, else ``cpu``: one place where a notebook states both sizes."""
    from .hardware import on_gpu

    return gpu if on_gpu() else cpu


def glue(name: str, value, display: bool = False):
    """Make ``value`` quotable in the prose as ``{glue:text}`name```; returns ``value``.

    Uses myst-nb's ``glue`` when it is installed (the book build); elsewhere (a Colab runtime) the
    value is simply returned, so a notebook runs the same everywhere.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return value
    myst_glue(name, value, display=display)
    return value
