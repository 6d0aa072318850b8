"""What every notebook of the book needs besides measurements: problem sizes and prose numbers.

Serves every section: a notebook asks ``sizes`` for small problems on a CPU and real ones on a GPU,
and writes each paragraph that quotes a number with ``reading``: the cell that measured the number
prints the paragraph as Markdown, so it reads the same in the book, JupyterLab, VS Code and Colab.
A table of numbers is shown the same way with ``table``, never printed as text (which wraps and
loses its columns on a narrow page).
"""

from __future__ import annotations


def sizes(cpu, gpu):
    """``gpu`` on a CUDA machine, else ``cpu``: one place where a notebook states both sizes."""
    from kvlab.devices import on_gpu

    return gpu if on_gpu() else cpu


def reading(markdown_text: str) -> None:
    """Show ``markdown_text`` as a paragraph of the page (Markdown output); returns None.

    The readings convention of every section: a paragraph that quotes a measured or computed number
    is written by the code that has the number, so the sentence and the number always come from the
    same run. Tables (GitHub pipe tables) and ``$math$`` render in the book and in Jupyter.
    Returning None keeps a reading on the last line of a cell from echoing a value.
    """
    if not isinstance(markdown_text, str):
        raise TypeError(
            f"markdown_text must be a str of Markdown, got {type(markdown_text).__name__}"
        )
    from IPython.display import Markdown, display

    display(Markdown(markdown_text))


def table(header, rows, align: str | None = None, caption: str = "") -> None:
    """Show ``rows`` under ``header`` as a table of the page (a Markdown table); returns None.

    ``align``: one letter per column, ``l`` or ``r`` (default: the first column left, the others
    right); floats are written to three significant figures (``kvlab.show.format.markdown_table``).
    ``caption``, if given, is a sentence of Markdown shown above the table.
    """
    from kvlab.show.format import markdown_table

    if not isinstance(caption, str):
        raise TypeError(f"caption must be a str of Markdown, got {type(caption).__name__}")
    text = markdown_table(header, rows, align)
    reading(f"{caption}\n\n{text}" if caption else text)
