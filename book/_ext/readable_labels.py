"""Readable labels in the bibliography: "[Kwon et al. 2023]", not "[Kwo23]" or "[see26a]".

Each entry of ``book/references.bib`` carries a ``shorthand`` field, the same text the pages use
when they cite it as a link to the references page. An entry without one gets "Author Year" (or
"Author et al. Year"). The style is the bibliography's default (``bibtex_default_style: readable``).
"""

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle


class ReadableLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            yield entry.fields.get("shorthand") or _author_year(entry)


def _author_year(entry) -> str:
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    year = entry.fields.get("year", "")
    if not people:
        return f"{entry.fields.get('title', entry.key)} {year}".strip()
    first = " ".join(people[0].last_names)
    names = (
        first
        if len(people) == 1
        else (
            f"{first} and {' '.join(people[1].last_names)}"
            if len(people) == 2
            else f"{first} et al."
        )
    )
    return f"{names} {year}".strip()


class ReadableStyle(UnsrtStyle):
    default_label_style = "readable"


def setup(app):
    register_plugin("pybtex.style.labels", "readable", ReadableLabels)
    register_plugin("pybtex.style.formatting", "readable", ReadableStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
