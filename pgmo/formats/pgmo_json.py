"""pgmo's JSON trace: MiniMalloc's rows plus metadata (how the trace was made).

``{"format": "pgmo-trace", "version": 1, "metadata": {...}, "columns": [...],
"rows": [[id, lower, upper, size(, offset)], ...]}``; gzip-compressed when the
name ends in ``.gz``.  ``upper`` is ``null`` for an open block.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from ..errors import TraceFormatError
from ..trace import Block, SizeTotal, Trace, block_from_values, to_int
from .files import NESTED_TOO_DEEPLY, open_text, write_text_atomically
from .minimalloc import OPTIONAL, REQUIRED
from .model import Loaded, ReadOptions, offsets_for_closed

__all__ = ["NAME", "FORMAT", "VERSION", "sniff", "read", "write"]

NAME = "pgmo-json"
FORMAT = "pgmo-trace"
VERSION = 1
_SNIFF = re.compile(rb'^\s*\{\s*"format"\s*:\s*"pgmo-trace"')


def sniff(head: bytes) -> bool:
    return bool(_SNIFF.match(head))


def read(path: Path, options: ReadOptions) -> Loaded:
    name = str(path)
    try:
        with open_text(path) as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc.msg}", path=name, line=exc.lineno) from None
    except RecursionError:
        raise TraceFormatError(NESTED_TOO_DEEPLY, path=name) from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot be read: {exc}", path=name) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceFormatError(f"not a pgmo trace (expected \"format\": \"{FORMAT}\")",
                               path=name, field="format")
    if doc.get("version") != VERSION:
        raise TraceFormatError(f"unsupported version {doc.get('version')!r} "
                               f"(this pgmo reads {VERSION})", path=name, field="version")
    columns = doc.get("columns")
    if not isinstance(columns, list) or any(c not in REQUIRED + OPTIONAL for c in columns):
        raise TraceFormatError(f"'columns' must list fields among {REQUIRED + OPTIONAL}",
                               path=name, field="columns")
    for req in REQUIRED:
        if req not in columns:
            raise TraceFormatError("missing column", path=name, field=req)
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise TraceFormatError("'rows' must be a non-empty list", path=name, field="rows")
    has_offset = "offset" in columns
    blocks: list[Block] = []
    offsets: list[int | None] = []
    seen: dict[int | str, int] = {}  # id -> the block it was first seen at
    total = SizeTotal()
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise TraceFormatError(f"block {i}: expected a list of {len(columns)} values",
                                   path=name, field="rows")
        values = dict(zip(columns, row))
        try:
            ident, lower, upper, size = (values[c] for c in REQUIRED)
            block = block_from_values(ident, lower, upper, size, where={},
                                      inclusive=options.inclusive, total=total)
            if block.id in seen:
                raise TraceFormatError(f"duplicate id {block.id} (first seen at block "
                                       f"{seen[block.id]})", field="id")
            seen[block.id] = i
            if has_offset:
                off = values["offset"]
                off = None if off is None else to_int(off, "offset", {})
                if off is None and block.upper is not None:
                    raise TraceFormatError("missing value", field="offset")
                if off is not None and off < 0:
                    raise TraceFormatError(f"offset must be >= 0, got {off}", field="offset")
                offsets.append(off)
        except TraceFormatError as exc:  # JSON has no useful line: name the block
            raise TraceFormatError(f"block {i}: {exc.reason}", path=name,
                                   field=exc.field) from None
        blocks.append(block)
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TraceFormatError("'metadata' must be an object", path=name, field="metadata")
    try:
        planned = offsets_for_closed(blocks, offsets) if has_offset else None
    except TraceFormatError as exc:
        raise TraceFormatError(exc.reason, path=name, field=exc.field) from None
    return Loaded(Trace(tuple(blocks), metadata, source=name), planned)


def write(trace: Trace, path, offsets: Sequence[int] | None = None,
          extra_metadata: dict | None = None) -> None:
    """Write pgmo JSON; ``offsets`` are for the trace's closed blocks, in order."""
    columns = list(REQUIRED) + (["offset"] if offsets is not None else [])
    planned = iter(offsets or ())
    rows = []
    for b in trace.blocks:
        row = [b.id, b.lower, b.upper, b.size]
        if offsets is not None:
            row.append(None if b.upper is None else int(next(planned)))
        rows.append(row)
    doc = {"format": FORMAT, "version": VERSION,
           "metadata": {**trace.metadata, **(extra_metadata or {})},
           "columns": columns, "rows": rows}
    write_text_atomically(path, lambda fh: json.dump(doc, fh, separators=(",", ":")))
