"""Reading and writing traces and plans: MiniMalloc CSV and pgmo JSON.

CSV is MiniMalloc's format: header ``id,lower,upper,size`` (any column
order), optional ``offset`` column, half-open lifetimes.  JSON (optionally
gzip-compressed, ``.json.gz``) keeps the same rows plus metadata, so a trace
remembers how it was recorded.

Every problem in a file raises :class:`TraceFormatError` naming the file, the
line (CSV) or block (JSON) and the field.  Writes go to a temporary file that
replaces the target only when complete, so a failed write never leaves a
half-written trace behind.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from .trace import Block, Trace

__all__ = [
    "TraceFormatError",
    "read_trace",
    "read_trace_and_offsets",
    "write_trace",
    "blocks_from_rows",
    "write_bytes_atomically",
    "JSON_FORMAT",
]

JSON_FORMAT = "pgmo-trace"
JSON_VERSION = 1
REQUIRED = ("id", "lower", "upper", "size")
OPTIONAL = ("offset",)


class TraceFormatError(ValueError):
    """A trace or plan file is malformed; says where and which field."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = [path or "<trace>"]
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}")


def _check_block(values: dict[str, int], loc: dict[str, Any], inclusive: bool) -> Block:
    size, lower, upper = values["size"], values["lower"], values["upper"]
    if inclusive:
        upper += 1
    if size <= 0:
        raise TraceFormatError(f"size must be > 0, got {size}", field="size", **loc)
    if lower < 0:
        raise TraceFormatError(f"lower must be >= 0, got {lower}", field="lower", **loc)
    if upper <= lower:
        raise TraceFormatError(
            f"upper must be > lower for a half-open lifetime [lower, upper), "
            f"got lower={lower} upper={values['upper']}", field="upper", **loc)
    return Block(values["id"], lower, upper, size)


def _to_int(text: Any, field: str, loc: dict[str, Any]) -> int:
    if isinstance(text, bool):
        raise TraceFormatError(f"expected an integer, got {text!r}", field=field, **loc)
    if isinstance(text, int):
        return text
    try:
        return int(str(text).strip())
    except ValueError:
        raise TraceFormatError(f"expected an integer, got {text!r}", field=field, **loc) from None


def _to_id(text: Any, loc: dict[str, Any]) -> int | str:
    """Ids are integers when they look like one; MiniMalloc also allows names like 'b1'."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    text = str(text).strip()
    if not text:
        raise TraceFormatError("empty id", field="id", **loc)
    try:
        return int(text)
    except ValueError:
        return text


class _Collector:
    """Accumulates blocks and offsets, catching duplicate ids and partial offsets."""

    def __init__(self, path: str | None, has_offset: bool, inclusive: bool):
        self.path, self.has_offset, self.inclusive = path, has_offset, inclusive
        self.blocks: list[Block] = []
        self.offsets: list[int] = []
        self.seen: dict[int, Any] = {}

    def add(self, raw: dict[str, Any], where: int, line_kw: str = "line") -> None:
        loc = {"path": self.path, "line": where}
        values = {f: _to_int(raw[f], f, loc) for f in REQUIRED[1:]}
        values["id"] = _to_id(raw["id"], loc)
        block = _check_block(values, loc, self.inclusive)
        if block.id in self.seen:
            raise TraceFormatError(
                f"duplicate id {block.id} (first seen at {line_kw} {self.seen[block.id]})",
                field="id", **loc)
        self.seen[block.id] = where
        self.blocks.append(block)
        if self.has_offset:
            off = raw.get("offset")
            if off is None or (isinstance(off, str) and not off.strip()):
                raise TraceFormatError("missing value (the offset column is present, so "
                                       "every row needs one)", field="offset", **loc)
            off = _to_int(off, "offset", loc)
            if off < 0:
                raise TraceFormatError(f"offset must be >= 0, got {off}", field="offset", **loc)
            self.offsets.append(off)


def _open_text(path: Path):
    # utf-8-sig skips a byte-order mark (spreadsheet exports start with one).
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "r", encoding="utf-8-sig", newline="")


def _read_csv(path: Path, inclusive: bool) -> tuple[list[Block], list[int] | None]:
    try:
        return _read_csv_rows(path, inclusive)
    except (UnicodeDecodeError, csv.Error, OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot be read as UTF-8 CSV: {exc}", path=str(path)) from None


def _read_csv_rows(path: Path, inclusive: bool) -> tuple[list[Block], list[int] | None]:
    name = str(path)
    with _open_text(path) as fh:
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
        acc = _Collector(name, "offset" in index, inclusive)
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise TraceFormatError(
                    f"expected {len(columns)} fields ({','.join(columns)}), got {len(row)}",
                    path=name, line=line)
            acc.add({c: row[i] for c, i in index.items()}, line)
    if not acc.blocks:
        raise TraceFormatError("no blocks after the header", path=name, line=header_line + 1)
    return acc.blocks, (acc.offsets if acc.has_offset else None)


def _read_json(path: Path, inclusive: bool) -> tuple[list[Block], list[int] | None, dict]:
    name = str(path)
    try:
        with _open_text(path) as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc.msg}", path=name, line=exc.lineno) from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot be read: {exc}", path=name) from None
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT:
        raise TraceFormatError(f"not a pgmo trace (expected \"format\": \"{JSON_FORMAT}\")",
                               path=name, field="format")
    if doc.get("version") != JSON_VERSION:
        raise TraceFormatError(f"unsupported version {doc.get('version')!r} "
                               f"(this pgmo reads {JSON_VERSION})", path=name, field="version")
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
    acc = _Collector(name, "offset" in columns, inclusive)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise TraceFormatError(f"block {i}: expected a list of {len(columns)} values",
                                   path=name, field="rows")
        try:
            acc.add(dict(zip(columns, row)), i, line_kw="block")
        except TraceFormatError as exc:  # JSON has no useful line: name the block
            raise TraceFormatError(f"block {i}: {exc.reason}", path=name,
                                   field=exc.field) from None
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TraceFormatError("'metadata' must be an object", path=name, field="metadata")
    return acc.blocks, (acc.offsets if acc.has_offset else None), metadata


def _is_json(path: Path) -> bool:
    return path.name.endswith((".json", ".json.gz"))


def read_trace_and_offsets(path, inclusive: bool = False) -> tuple[Trace, list[int] | None]:
    """Read a trace and, when the file has an ``offset`` column, its offsets.

    ``inclusive=True`` reads lifetimes that include ``upper`` (IREE's files)
    and converts them to half-open ones.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError("no such file", path=str(path))
    if _is_json(path):
        blocks, offsets, metadata = _read_json(path, inclusive)
    else:
        blocks, offsets = _read_csv(path, inclusive)
        metadata = {}
    return Trace(tuple(blocks), metadata, source=str(path)), offsets


def read_trace(path, inclusive: bool = False) -> Trace:
    """Read a MiniMalloc CSV or pgmo JSON trace; an offset column is checked, then ignored."""
    return read_trace_and_offsets(path, inclusive)[0]


def blocks_from_rows(rows: Iterable[Sequence[int]]) -> tuple[Block, ...]:
    """Validate in-memory rows ``(lower, upper, size)`` or ``(id, lower, upper, size)``."""
    acc = _Collector(None, False, False)
    for i, row in enumerate(rows):
        row = tuple(row)
        if len(row) == 3:
            row = (i,) + row
        if len(row) != 4:
            raise TraceFormatError(f"row {i}: expected (lower, upper, size) or "
                                   f"(id, lower, upper, size), got {row!r}")
        acc.add(dict(zip(REQUIRED, row)), i, line_kw="row")
    return tuple(acc.blocks)


def _new_file_mode(path: Path) -> int:
    """Keep an existing file's permissions; a new file gets what open() would give."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _atomic_write(path: Path, write) -> None:
    """Render text to memory with ``write(fh)``, then store it with :func:`write_bytes_atomically`."""
    buf = io.StringIO(newline="")
    write(buf)
    write_bytes_atomically(path, buf.getvalue().encode("utf-8"))


def write_bytes_atomically(path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: never a half-written file.

    A name ending in ``.gz`` is gzip-compressed (mtime=0: reproducible bytes);
    an existing file keeps its permissions.
    """
    path = Path(path)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _new_file_mode(path))  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_trace(trace: Trace, path, offsets: Sequence[int] | None = None,
                extra_metadata: dict | None = None) -> None:
    """Write ``trace`` (and ``offsets``, if given) as CSV or JSON by file suffix."""
    path = Path(path)
    if offsets is not None and len(offsets) != len(trace):
        raise ValueError(f"{len(offsets)} offsets for {len(trace)} blocks")
    columns = list(REQUIRED) + (["offset"] if offsets is not None else [])

    def rows():
        for i, b in enumerate(trace.blocks):
            row = [b.id, b.lower, b.upper, b.size]
            if offsets is not None:
                row.append(int(offsets[i]))
            yield row

    if _is_json(path):
        doc = {"format": JSON_FORMAT, "version": JSON_VERSION,
               "metadata": {**trace.metadata, **(extra_metadata or {})},
               "columns": columns, "rows": list(rows())}

        def write(fh):
            json.dump(doc, fh, separators=(",", ":"))
    else:
        def write(fh):
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(columns)
            w.writerows(rows())
    _atomic_write(path, write)
