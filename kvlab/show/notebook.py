"""What every notebook of the book needs besides measurements: problem sizes and prose numbers.

Serves every section: a notebook asks ``sizes`` for small problems on a CPU and real ones on a GPU,
and writes each paragraph that quotes a number with ``reading``: the cell that measured the number
prints the paragraph as Markdown, so it reads the same in the book, JupyterLab, VS Code and Colab.
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
