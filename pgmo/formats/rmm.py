"""RAPIDS RMM's allocation log: the CSV of ``rmm.mr.LoggingResourceAdaptor``.

Format followed: RMM's ``logging_resource_adaptor`` and its documentation
(``docs/user_guide/logging.md``).  The header has always been
``Thread,Time,Action,Pointer,Size,Stream``; each line is one call.  The
pointer and stream columns changed with the logging library behind them,
and all three forms are read:

* RMM's spdlog/fmt releases (before 25.02): ``0x``-prefixed pointers and
  streams (``fmt::ptr``);
* the first rapids-logger releases: ``allocate,%llx,%zu,%llx``, hexadecimal
  with no prefix (``7f8a40000000``);
* RMM 25.x/26.x (``cpp/src/mr/logging_resource_adaptor.cpp``): the pointer
  as ``%p`` (``0x7f8a40000000``, ``(nil)`` for a failure) and the stream from
  ``rmm::detail::format_stream`` (``std::hex`` of the handle: ``0`` for the
  default stream, ``0x...`` otherwise)::

    140573312345856,12:34:56.123456,allocate,0x7f8a40000000,1024,0
    140573312345856,12:34:56.234567,free,0x7f8a40000000,1024,0

Pointers and streams are therefore always read as hexadecimal, with or
without ``0x``.  ``Action`` is ``allocate``, ``free`` or ``allocate failure``
(RMM's documentation also shows ``deallocate``; it is read as ``free``).
``Size`` is the bytes asked for; ``Time`` is the wall clock, not needed:
lines are in call order.  A free must name the size of its allocation, as
RMM requires.

Blocks pair by pointer (a pointer is reused once freed); a free of a pointer
never allocated in the log was allocated before logging started and is kept
(see :mod:`pgmo.formats.allocation_log`).  Zero-size requests take no memory
and are counted, not kept.  All streams are read unless ``stream`` is given.
RMM writes one log per device (``rmm_log.dev0.csv``...), so there is no
device to choose.  The log does not say how much memory the resource under
the adaptor (a pool) reserved; ``pgmo analyze --reserved`` takes it from
elsewhere.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..trace import SizeTotal, to_int
from ..units import size_refused
from .allocation_log import AllocationLog
from .files import open_text
from .model import Loaded, ReadOptions

__all__ = ["NAME", "HEADER", "sniff", "read", "parse_stream", "stream_name"]

NAME = "rmm-log"
HEADER = ("thread", "time", "action", "pointer", "size", "stream")
REQUIRED = ("action", "pointer", "size")
ACTIONS = {"allocate": "alloc", "free": "free", "deallocate": "free",
           "allocate failure": "failure"}
NULL_POINTERS = ("(nil)", "nil", "null", "nullptr", "0", "0x0")


def sniff(head: bytes) -> bool:
    """A first non-blank line that is RMM's header."""
    text = head.decode("utf-8-sig", errors="replace")
    for line in text.splitlines():
        if line.strip():
            return tuple(c.strip().lower() for c in line.split(",")) == HEADER
    return False


def parse_stream(text: int | str) -> int | str:
    """A stream as RMM logs it (hexadecimal: ``0``, ``0x7f...``, ``7f...``) as an int.

    An int is taken as it is; text that is no hexadecimal number stays text.
    """
    if isinstance(text, int):
        return text
    text = text.strip()
    if text.lower() in NULL_POINTERS:
        return 0
    try:
        return int(text, 16)
    except ValueError:
        return text


def stream_name(stream: int | str) -> str:
    """A stream the way RMM writes it, for messages."""
    return f"{stream:#x}" if isinstance(stream, int) and stream else str(stream)


def _pointer(text: str, where: dict) -> int:
    text = text.strip()
    if text.lower() in NULL_POINTERS:
        return 0
    try:
        return int(text, 16)
    except ValueError:
        raise TraceFormatError(f"expected a hexadecimal pointer such as 0x7f8a40000000, "
                               f"got {text!r}", field="Pointer", **where) from None


def read(path: Path, options: ReadOptions) -> Loaded:
    try:
        return Loaded(_read(path, options), None)
    except (UnicodeDecodeError, csv.Error, OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot be read as UTF-8 CSV: {exc}", path=str(path)) from None


def _read(path: Path, options: ReadOptions):
    name = str(path)
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next((row for row in reader if any(c.strip() for c in row)), None)
        if header is None:
            raise TraceFormatError("empty file: expected RMM's header "
                                   "'Thread,Time,Action,Pointer,Size,Stream'", path=name, line=1)
        header_line = reader.line_num
        columns = [c.strip().lower() for c in header]
        for req in REQUIRED:
            if req not in columns:
                raise TraceFormatError(f"missing column (header is {','.join(header)!r}, RMM "
                                       f"writes Thread,Time,Action,Pointer,Size,Stream)",
                                       path=name, line=header_line, field=req.capitalize())
        stream = None if options.stream is None else parse_stream(options.stream)
        return _events(reader, name, header, columns, header_line, stream)


def _events(reader, name: str, header: list[str], columns: list[str], header_line: int,
            stream: int | str | None):
    col = {c: i for i, c in enumerate(columns)}
    log = AllocationLog()
    allocated_at: dict[int, tuple[int, int]] = {}  # pointer -> (size, line) of the live block
    zero_size, rows = 0, 0
    total = SizeTotal()  # the sizes of the trace's blocks so far
    failures: Counter = Counter()
    streams: set = set()
    for row in reader:
        line = reader.line_num  # RMM never quotes a newline: one record per line
        if not any(c.strip() for c in row):
            continue
        where = {"path": name, "line": line}
        if len(row) != len(columns):
            cut = not any(any(c.strip() for c in rest) for rest in reader)
            hint = (" (the log ends mid-line: flush it before reading, e.g. "
                    "LoggingResourceAdaptor.flush(), or let the program exit)") if cut else ""
            raise TraceFormatError(f"expected {len(columns)} fields ({','.join(header)}), "
                                   f"got {len(row)}{hint}", **where)
        rows += 1
        text = row[col["action"]].strip()
        action = ACTIONS.get(text.lower())
        if action is None:
            raise TraceFormatError(f"unknown action {text!r} (RMM logs 'allocate', 'free' "
                                   f"and 'allocate failure')", field="Action", **where)
        on = parse_stream(row[col["stream"]]) if "stream" in col else 0
        streams.add(on)
        if stream is not None and on != stream:
            continue
        size = to_int(row[col["size"]], "Size", where)
        if size < 0:
            raise TraceFormatError(f"size must be >= 0, got {size}", field="Size", **where)
        too_big = size_refused(size)
        if too_big:
            raise TraceFormatError(too_big, field="Size", **where)
        pointer = _pointer(row[col["pointer"]], where)
        if action == "failure":
            failures["count"] += 1
            failures["bytes"] += size
        elif size == 0:
            zero_size += action == "alloc"  # its free is no second request
        elif action == "alloc":
            if pointer == 0:
                raise TraceFormatError("allocate returned a null pointer (a failed request is "
                                       "logged as 'allocate failure')", field="Pointer", **where)
            if log.live_block(pointer) is not None:
                raise TraceFormatError(
                    f"pointer {pointer:#x} allocated again without a free since line "
                    f"{allocated_at[pointer][1]}", field="Pointer", **where)
            log.alloc(pointer, total.add(size, where, "Size"))
            allocated_at[pointer] = (size, line)
        else:
            if log.live_block(pointer) is None:
                log.free_allocated_before(total.add(size, where, "Size"))
                continue
            asked, at = allocated_at.pop(pointer)
            if asked != size:
                raise TraceFormatError(f"free of {pointer:#x} with size {size}, but line {at} "
                                       f"allocated it with size {asked} (RMM frees must name "
                                       f"the allocated size)", field="Size", **where)
            log.free(pointer)
    if rows == 0:
        raise TraceFormatError("no allocations after the header", path=name,
                               line=header_line + 1)
    if stream is not None and stream not in streams:
        listed = ", ".join(map(stream_name, sorted(streams, key=str)))
        raise TraceFormatError(f"no stream {stream_name(stream)} in the log "
                               f"(streams: {listed})",
                               path=name, field="Stream")
    metadata: dict[str, Any] = {
        "source_format": NAME,
        "import": {**log.report(), "events": rows, "stream": stream,
                   "streams": sorted(streams, key=str), "zero_size_requests": zero_size,
                   "failed_requests": {"count": failures["count"], "bytes": failures["bytes"]}},
    }
    return log.trace(source=name, **metadata)
