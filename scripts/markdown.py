"""Markdown tables, written by the reports and read back from a GPU session's files.

The reports (``bench_memory``, the quick check, the recomputation table,
``docs/results.md``) write their tables with :func:`table`;
``results_table`` reads a session's reports back with :func:`tables` and
:func:`rows_under`, each table's rows keyed by its own header, so that a
page built from them says only what the files say.  :data:`NA` marks every
cell of a CPU dry run that would need a GPU.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

#: A dry run's cell where a GPU would give a number: never a stand-in's number.
NA = "n/a (CPU)"


def mib(value: float | None) -> str:
    """Bytes in MiB to 0.1, with thousands separators ("1,688.1"); ``-`` for None."""
    return "-" if value is None else f"{value / 2**20:,.1f}"


# ------------------------------------------------------------------ writing
def table(columns: Sequence[str], rows: Iterable[Sequence], text_columns: int = 1) -> list[str]:
    """A Markdown table's lines: the first ``text_columns`` columns left-aligned, the others
    (numbers) right-aligned."""
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i < text_columns else "---:"
                            for i in range(len(columns))) + "|"]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


# ------------------------------------------------------------------ reading
def tables(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Every Markdown table in ``text``: (the heading above it, its rows keyed by header)."""
    out, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$",
                                                                    lines[i + 1].strip()):
            header = cells(line)
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, cells(lines[i]))))
                i += 1
            out.append((heading, rows))
            continue
        i += 1
    return out


def cells(line: str) -> list[str]:
    """A table line's cells, stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def rows_under(text: str, heading_start: str, index: int = 0) -> list[dict[str, str]]:
    """The ``index``-th table under the first heading that starts with ``heading_start``
    (empty when there is none)."""
    found = [rows for heading, rows in tables(text) if heading.startswith(heading_start)]
    return found[index] if len(found) > index else []


def bullets(text: str) -> dict[str, str]:
    """``- key: value`` lines (a report's header: command, device, versions, date)."""
    return {m[1]: m[2].strip("` ") for m in re.finditer(r"(?m)^- ([\w /]+): (.*)$", text)}


def number(cell: str | None) -> float | None:
    """The first number in a cell ("1,688.1 / 2,417.1" -> 1688.1); None for "-" or text."""
    if cell is None:
        return None
    m = re.search(r"-?\d[\d,]*\.?\d*", cell)
    return float(m[0].replace(",", "")) if m else None


def pair(cell: str | None) -> tuple[float | None, float | None]:
    """Both numbers of a "stock / pgmo" cell."""
    if not cell or "/" not in cell:
        return None, None
    a, b = cell.split("/", 1)
    return number(a), number(b)
