"""Reading and writing traces in every format pgmo knows, detected by content.

====================  ================================================  =========
name                  what                                              writes
====================  ================================================  =========
``minimalloc-csv``    MiniMalloc CSV: ``id,lower,upper,size[,offset]``  yes
``pgmo-json``         pgmo JSON: the same rows plus metadata            yes
``pgmo-plan``         a pool's saved plan (profile + offsets)           via pool
``pytorch-snapshot``  ``torch.cuda.memory._dump_snapshot`` pickle       no
``rmm-log``           RMM ``LoggingResourceAdaptor`` CSV                no
====================  ================================================  =========

Any of them may be gzip-compressed.  The format is recognised from the
file's first bytes, not its name; ``format=`` overrides.  Every problem raises
:class:`~pgmo.errors.TraceFormatError` naming the file, the line (or block)
and the field; a size is one when it is more than any device holds (256 TiB)
or when a trace's sizes together pass 1 EiB (``pgmo.units.size_refused``, the
rule of the pool's saved plans too).  Writes are atomic.  More readers plug in with
:func:`register`.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import TraceFormatError
from ..trace import SizeTotal, Trace, block_from_values
from . import minimalloc, pgmo_json, planfile, pytorch, rmm
from .files import read_head, write_bytes_atomically
from .model import Loaded, ReadOptions

__all__ = ["Format", "FORMATS", "register", "detect", "load", "read_trace", "write_trace",
           "Loaded", "ReadOptions", "TraceFormatError", "write_bytes_atomically"]


@dataclass(frozen=True)
class Format:
    """One trace format: how to recognise it and how to read it."""

    name: str
    description: str
    sniff: Callable[[bytes], bool]  # on the first bytes of the (decompressed) content
    read: Callable[[Path, ReadOptions], Loaded]
    selects: tuple[str, ...] = ()  # which of ReadOptions' device, stream, inclusive it honours
    no_device: str = ""  # why there is no device to choose, when that needs saying


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a reader; formats are tried in registration order when detecting."""
    FORMATS[fmt.name] = fmt
    return fmt


register(Format(planfile.NAME, "pgmo pool plan (saved by pool.save)", planfile.sniff,
                planfile.read))
register(Format(pgmo_json.NAME, "pgmo JSON trace", pgmo_json.sniff, pgmo_json.read,
                selects=("inclusive",)))
register(Format(pytorch.NAME, "PyTorch memory snapshot (torch.cuda.memory._dump_snapshot)",
                pytorch.sniff, pytorch.read, selects=("device", "stream")))
register(Format(rmm.NAME, "RMM allocation log (rmm.mr.LoggingResourceAdaptor CSV)",
                rmm.sniff, rmm.read, selects=("stream",),
                no_device="RMM writes one log per device (rmm_log.dev0.csv, ...): read "
                          "that device's file"))
register(Format(minimalloc.NAME, "MiniMalloc CSV (header id,lower,upper,size)",
                minimalloc.sniff, minimalloc.read, selects=("inclusive",)))


def detect(path: str | os.PathLike) -> Format:
    """The format of ``path``, from its content.

    When no reader recognises the content, JSON goes to the pgmo JSON reader
    and other text to the CSV reader, whose errors then say which field or
    column is wrong.
    """
    path = Path(path)
    head = read_head(path)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:
        raise TraceFormatError("empty file: no trace in it", path=str(path), line=1)
    if pytorch.is_old_pickle(head):
        raise TraceFormatError("a pickle of protocol 0 or 1, which pgmo does not load "
                               "(PyTorch memory snapshots are pickled with protocol 2 or "
                               "later)", path=str(path))
    for fmt in FORMATS.values():
        if fmt.sniff(head):
            return fmt
    if stripped[:1] in (b"{", b"["):
        return FORMATS[pgmo_json.NAME]
    if b"\0" not in head:
        try:  # incremental: the head may end inside a multi-byte character
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
            return FORMATS[minimalloc.NAME]
        except UnicodeDecodeError:
            pass
    known = "; ".join(f.description for f in FORMATS.values())
    raise TraceFormatError(f"unrecognised trace format (pgmo reads: {known}); "
                           f"name one with --format", path=str(path))


def load(path: str | os.PathLike, format: str | None = None,
         options: ReadOptions | None = None) -> Loaded:
    """Read any supported file: the trace and, when it holds a plan, its offsets."""
    path = Path(path)
    if format is None:
        fmt = detect(path)
    else:
        try:
            fmt = FORMATS[format]
        except KeyError:
            raise TraceFormatError(f"unknown format {format!r}; choose one of "
                                   f"{', '.join(FORMATS)}", path=str(path)) from None
        read_head(path)  # a missing file or a folder is reported as such
    options = options or ReadOptions()
    if options.inclusive and "inclusive" not in fmt.selects:
        raise TraceFormatError(f"inclusive lifetimes are read from CSV and pgmo JSON traces; a "
                               f"{fmt.name} file records its own events", path=str(path))
    for name in ("device", "stream"):
        if getattr(options, name) is not None and name not in fmt.selects:
            why = fmt.no_device if name == "device" and fmt.no_device else \
                f"a {fmt.name} file records one"
            raise TraceFormatError(f"there is no {name} to choose in this file: {why}",
                                   path=str(path))
    return fmt.read(path, options)


def read_trace(path: str | os.PathLike, inclusive: bool = False, format: str | None = None,
               **options: Any) -> Trace:
    """Read a trace from any supported file (see the table above).

    ``pgmo.read_trace`` (:func:`pgmo.bundled.read_trace`) also takes the name
    of a bundled trace.

    ``inclusive=True`` reads lifetimes that include ``upper`` (IREE's files).
    Other keywords are :class:`ReadOptions` fields.
    """
    return load(path, format, ReadOptions(inclusive=inclusive, **options)).trace


def _checked(trace: Trace, path: str | os.PathLike) -> Trace:
    """``trace`` with each block checked by the readers' rules (:func:`.block_from_values`),
    its numbers plain integers; a ValueError naming the block otherwise."""
    total = SizeTotal()
    blocks = []
    for i, b in enumerate(trace.blocks):
        try:
            blocks.append(block_from_values(b.id, b.lower, b.upper, b.size, {}, total=total))
        except TraceFormatError as e:
            raise ValueError(f"{os.fspath(path)}: block {i} (id {b.id!r}) cannot be written: "
                             f"field '{e.field}': {e.reason}") from None
    return Trace(tuple(blocks), trace.metadata, trace.source)


def write_trace(trace: Trace, path: str | os.PathLike, offsets: Sequence[int] | None = None,
                extra_metadata: dict | None = None) -> None:
    """Write ``trace`` (and the offsets of its closed blocks) as JSON or CSV, by suffix.

    ``.json``/``.json.gz`` write pgmo JSON (metadata kept); anything else
    MiniMalloc CSV (``.gz``: compressed).  Every block is checked as the readers check
    it (a ValueError names the block, and nothing is written): a file written here reads
    back.  NumPy integers are written as plain integers.
    """
    trace = _checked(trace, path)
    n_closed = sum(b.upper is not None for b in trace.blocks)
    if offsets is not None and len(offsets) != n_closed:
        raise ValueError(f"{len(offsets)} offsets for {n_closed} blocks")
    name = Path(path).name
    writer = pgmo_json if name.endswith((".json", ".json.gz")) else minimalloc
    writer.write(trace, path, offsets, extra_metadata)
