"""MiniMalloc's CSV: header ``id,lower,upper,size`` (any order), optional ``offset``.

Lifetimes are half-open ``[lower, upper)``; ``inclusive=True`` reads files
whose lifetimes include ``upper`` (IREE's) and converts them.  pgmo also
writes an empty ``upper`` for a block still live when the recording ended
(an open block); MiniMalloc itself never does.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from ..errors import TraceFormatError
from ..trace import Block, SizeTotal, Trace, block_from_values, to_int
from .files import open_text, write_text_atomically
from .model import Loaded, ReadOptions, offsets_for_closed

__all__ = ["NAME", "sniff", "read", "write", "REQUIRED", "OPTIONAL"]

NAME = "minimalloc-csv"
REQUIRED = ("id", "lower", "upper", "size")
OPTIONAL = ("offset",)


def sniff(head: bytes) -> bool:
    """A first non-blank line naming the required columns."""
    text = head.decode("utf-8-sig", errors="replace")
    for line in text.splitlines():
        if line.strip():
            cells = {c.strip().lower() for c in line.split(",")}
            return set(REQUIRED) <= cells
    return False


def read(path: Path, options: ReadOptions) -> Loaded:
    try:
        return _read(path, options.inclusive)
    except (UnicodeDecodeError, csv.Error, OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot be read as UTF-8 CSV: {exc}", path=str(path)) from None


def _read(path: Path, inclusive: bool) -> Loaded:
    name = str(path)
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = None
        for header in reader:
            if any(cell.strip() for cell in header):
                break
        else:
            header = None
        if header is None:
            raise TraceFormatError("empty file: expected a header 'id,lower,upper,size'",
                                   path=name, line=1)
        header_line = reader.line_num
        columns = [h.strip().lower() for h in header]
        for req in REQUIRED:
            if req not in columns:
                raise TraceFormatError(
                    f"missing column (header is {','.join(columns)!r}, "
                    f"need id,lower,upper,size)", path=name, line=header_line, field=req)
        unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
        if unknown:
            raise TraceFormatError(f"unknown column {unknown[0]!r}", path=name,
                                   line=header_line, field=unknown[0])
        if len(set(columns)) != len(columns):
            dup = next(c for c in columns if columns.count(c) > 1)
            raise TraceFormatError("column appears twice", path=name, line=header_line, field=dup)
        index = {c: i for i, c in enumerate(columns)}
        has_offset = "offset" in index
        blocks: list[Block] = []
        offsets: list[int | None] = []
        seen: dict[int | str, int] = {}  # id -> the line it was first seen at
        total = SizeTotal()
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise TraceFormatError(
                    f"expected {len(columns)} fields ({','.join(columns)}), got {len(row)}",
                    path=name, line=line)
            where = {"path": name, "line": line}
            ident, lower, upper, size = (row[index[c]] for c in REQUIRED)
            block = block_from_values(ident, lower, upper, size, where=where,
                                      inclusive=inclusive, total=total)
            if block.id in seen:
                raise TraceFormatError(f"duplicate id {block.id} (first seen at line "
                                       f"{seen[block.id]})", path=name, line=line, field="id")
            seen[block.id] = line
            blocks.append(block)
            if has_offset:
                offsets.append(_offset(row[index["offset"]], block, where))
    if not blocks:
        raise TraceFormatError("no blocks after the header", path=name, line=header_line + 1)
    return Loaded(Trace(tuple(blocks), {}, source=name),
                  offsets_for_closed(blocks, offsets) if has_offset else None)


def _offset(text: str, block, where) -> int | None:
    if not text.strip():
        if block.upper is None:
            return None  # an open block has no planned place
        raise TraceFormatError("missing value (the offset column is present, so every "
                               "row needs one)", field="offset", **where)
    off = to_int(text, "offset", where)
    if off < 0:
        raise TraceFormatError(f"offset must be >= 0, got {off}", field="offset", **where)
    return off


def write(trace: Trace, path, offsets: Sequence[int] | None = None,
          extra_metadata: dict | None = None) -> None:
    """Write CSV; ``offsets`` are for the trace's closed blocks, in order."""
    columns = list(REQUIRED) + (["offset"] if offsets is not None else [])
    planned = iter(offsets or ())

    def rows():
        for b in trace.blocks:
            row = [b.id, b.lower, "" if b.upper is None else b.upper, b.size]
            if offsets is not None:
                row.append("" if b.upper is None else int(next(planned)))
            yield row

    def render(fh):
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows())

    write_text_atomically(path, render)
