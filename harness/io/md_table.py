"""The one Markdown table writer: a header, the ``|---|`` rule and the rows, as lines.

Cells are written as given (a number or a string the caller formatted and, for text from a
configuration or a model, escaped with :func:`harness.io.escape.md`); the table itself only keeps its
shape: an unescaped ``|`` in a cell is escaped and a line break becomes a space, so no cell can add a
column or end a row. An empty cell is written ``| |``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_PIPE = re.compile(r"(?<!\\)\|")


def md_cell(value: object) -> str:
    """One cell's text: ``str(value)`` on one line, its unescaped pipes escaped."""
    text = str(value)
    if "\n" in text or "\r" in text:
        text = " ".join(text.splitlines())
    return _PIPE.sub(r"\\|", text)


def md_row(cells: Sequence[object]) -> str:
    """One table line: ``| a | b |``."""
    return "|" + "|".join(f" {t} " if (t := md_cell(c)) else " " for c in cells) + "|"


def md_table(header: Sequence[object], rows: Iterable[Sequence[object]], *, aligned: bool = False) -> list[str]:
    """The lines of a table: header, rule, one line per row (each row as long as the header).

    ``aligned``: every column padded to its widest cell and the rule as wide (``| a   | bb |``, ``|-----|----|``),
    for a table read as plain text too (the ladder)."""
    body = [list(row) for row in rows]
    for row in body:
        if len(row) != len(header):
            raise ValueError(f"Markdown table row: expected {len(header)} cells, found {len(row)}: {row!r}")
    if not aligned:
        return [md_row(header), "|" + "---|" * len(header)] + [md_row(row) for row in body]
    cells = [[md_cell(c) for c in row] for row in [list(header), *body]]
    widths = [max(len(c) for c in col) for col in zip(*cells)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    return [lines[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *lines[1:]]
