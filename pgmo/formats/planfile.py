"""The pool's saved plans: a profile and its packing, which a bad file can never replace.

The file is JSON (gzip when the name ends in ``.gz``) holding the profile's
columns (``uppers`` null for an open block), the offsets of its closed blocks
and a SHA-256 checksum of their canonical JSON.  Loading checks, in order: it
parses, the format and version are ours, the checksum matches, the columns
are well-formed and within what a device can hold (``MAX_DEVICE_BYTES``),
and the offsets are a valid packing of exactly the profile's closed blocks.
Any failure raises :class:`~pgmo.errors.PlanFileError` naming the file and
the reason.  Every trace command reads these files too.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from ..errors import PlanFileError, TraceFormatError
from ..trace import Block, Trace, packing_peak
from ..units import ALIGNMENT, MAX_DEVICE_BYTES, size_refused
from ..validate import find_conflict
from .files import NESTED_TOO_DEEPLY, read_bytes, write_bytes_atomically
from .model import Loaded, ReadOptions

__all__ = ["NAME", "FORMAT", "VERSION", "SavedPlan", "dumps", "loads", "save", "load",
           "sniff", "read", "read_document"]

NAME = "pgmo-plan"
FORMAT = "pgmo-pool-plan"
VERSION = 1
_SNIFF = re.compile(rb'^\s*\{\s*"format"\s*:\s*"pgmo-pool-plan"')


class SavedPlan(NamedTuple):
    """A loaded plan file: the profile, offsets of its closed blocks, how they were found."""

    profile: Trace
    offsets: list[int]
    method: str
    extra: dict


def _checksum(payload: dict) -> str:
    canon = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def dumps(profile: Trace, offsets: Sequence[int], method: str,
          extra: dict | None = None) -> bytes:
    """Serialize a profile (block i = request i) and the offsets of its closed blocks."""
    blocks = profile.blocks
    closed = [i for i, b in enumerate(blocks) if b.upper is not None]
    if list(range(len(blocks))) != [b.id for b in blocks]:
        raise ValueError("a pool profile's block ids are its request indices 0..n-1")
    if len(closed) != len(offsets):
        raise ValueError(f"{len(offsets)} offsets for {len(closed)} closed blocks")
    payload = {
        "sizes": [b.size for b in blocks], "lowers": [b.lower for b in blocks],
        "uppers": [b.upper for b in blocks], "ids": closed,
        "offsets": [int(o) for o in offsets], "method": method,
        "peak": packing_peak(offsets, [blocks[i].size for i in closed]),
        "alignment": ALIGNMENT, "extra": extra or {},
    }
    doc = {"format": FORMAT, "version": VERSION, "payload": payload,
           "sha256": _checksum(payload)}
    return json.dumps(doc, separators=(",", ":")).encode()


def _non_negative_ints(col: Any) -> bool:
    return isinstance(col, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in col)


def read_document(data: bytes, source: str, fmt: str, version: int, what: str) -> dict:
    """``data`` parsed as a JSON document of format ``fmt`` and ``version`` (the plan file's,
    the plan cache's entries'); :class:`~pgmo.errors.PlanFileError` naming ``source`` and
    the reason otherwise (``what`` names the kind of file in the message)."""
    def fail(why: str) -> PlanFileError:
        return PlanFileError(f"{source}: {why}")

    try:
        doc = json.loads(data)
    except RecursionError:
        raise fail(f"not a pgmo {what} ({NESTED_TOO_DEEPLY})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise fail(f"not a pgmo {what} (damaged or truncated JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise fail(f"not a pgmo {what} (format is not {fmt!r})")
    if doc.get("version") != version:
        raise fail(f"{what} version {doc.get('version')!r} is not supported "
                   f"(this pgmo reads version {version})")
    return doc


def loads(data: bytes, source: str = "<bytes>") -> SavedPlan:
    """Parse and check; raise PlanFileError naming ``source`` and the reason."""
    def fail(why: str) -> PlanFileError:
        return PlanFileError(f"{source}: {why}")

    doc = read_document(data, source, FORMAT, VERSION, "plan file")
    payload = doc.get("payload")
    if not isinstance(payload, dict):
        raise fail("checksum mismatch: the file was modified or damaged")
    try:
        intact = doc.get("sha256") == _checksum(payload)
    except RecursionError:
        raise fail(f"not a pgmo plan file ({NESTED_TOO_DEEPLY})") from None
    if not intact:
        raise fail("checksum mismatch: the file was modified or damaged")
    try:
        sizes, lowers, uppers = payload["sizes"], payload["lowers"], payload["uppers"]
        ids, offsets = payload["ids"], payload["offsets"]
        alignment = payload["alignment"]
    except KeyError as e:
        raise fail(f"missing field {e.args[0]!r}") from None
    if alignment != ALIGNMENT:
        raise fail(f"alignment {alignment} does not match this pool's {ALIGNMENT}")
    for name, col in (("sizes", sizes), ("lowers", lowers), ("ids", ids),
                      ("offsets", offsets)):
        if not _non_negative_ints(col):
            raise fail(f"field {name!r} must hold non-negative integers")
    n = len(sizes)
    if not isinstance(uppers, list) or not (len(lowers) == n == len(uppers)) \
            or len(ids) != len(offsets):
        raise fail("columns have different lengths")
    if not all(u is None or (isinstance(u, int) and not isinstance(u, bool) and u > lo)
               for u, lo in zip(uppers, lowers)):
        raise fail("field 'uppers' must hold integers after their lowers, or null")
    if any(s <= 0 or s % ALIGNMENT for s in sizes):
        raise fail(f"field 'sizes' must hold positive multiples of {ALIGNMENT}")
    if any(o % ALIGNMENT for o in offsets):  # else the pool would hand out unaligned pointers
        raise fail(f"field 'offsets' must hold multiples of {ALIGNMENT}")
    beyond = _beyond_any_device(sizes, offsets, ids, payload.get("peak"))
    if beyond:
        raise fail(f"{beyond}: more than any device holds ({MAX_DEVICE_BYTES:,} B); "
                   "the file was modified or damaged")
    too_much = size_refused(0, sum(sizes))  # the trace's rule for the total
    if too_much:
        raise fail(f"{too_much}; the file was modified or damaged")
    if ids != [i for i in range(n) if uppers[i] is not None]:
        raise fail("plan ids do not name the profile's closed (freed) requests")
    profile = Trace(tuple(map(Block, range(n), lowers, uppers, sizes)),
                    {"recorded_by": "pgmo"}, source=source)
    why = find_conflict([profile.blocks[i] for i in ids], offsets)
    if why is not None:
        raise fail(f"plan does not fit its profile: {why}")
    extra = payload.get("extra")
    return SavedPlan(profile, list(offsets), str(payload.get("method", "file")),
                     extra if isinstance(extra, dict) else {})


def _beyond_any_device(sizes: list[int], offsets: list[int], ids: list[int],
                       stated_peak: Any) -> str:
    """What in the file no device can hold ("" when nothing): a size, an offset, a peak."""
    for name, column in (("size", sizes), ("offset", offsets)):
        worst = max(column, default=0)
        if worst > MAX_DEVICE_BYTES:
            return f"{name} {worst:,} B (request {column.index(worst)})"
    peak = packing_peak(offsets, [sizes[i] for i in ids])
    if peak > MAX_DEVICE_BYTES:
        return f"peak {peak:,} B"
    if isinstance(stated_peak, int) and stated_peak > MAX_DEVICE_BYTES:
        return f"field 'peak' {stated_peak:,} B"
    return ""


def save(path, profile: Trace, offsets: Sequence[int], method: str,
         extra: dict | None = None) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a plan."""
    write_bytes_atomically(path, dumps(profile, offsets, method, extra))


def load(path) -> SavedPlan:
    path = Path(path)
    if path.is_dir():
        raise PlanFileError(f"{path}: is a directory, not a plan file")
    try:
        data = read_bytes(path)
    except TraceFormatError as e:
        raise PlanFileError(f"{path}: {e.reason}") from None
    return loads(data, str(path))


# -- as a trace file, for every command that takes one ---------------------------
def sniff(head: bytes) -> bool:
    return bool(_SNIFF.match(head))


def read(path: Path, options: ReadOptions) -> Loaded:
    try:
        saved = load(path)
    except PlanFileError as e:
        raise TraceFormatError(str(e).removeprefix(f"{path}: "), path=str(path)) from None
    meta = {**saved.profile.metadata, "plan": {"method": saved.method, **saved.extra}}
    return Loaded(Trace(saved.profile.blocks, meta, source=str(path)), saved.offsets)
