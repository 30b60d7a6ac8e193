"""Saved profiles and plans: skip profiling in a new process, never trust a bad file.

The file is JSON (gzip when the name ends in ``.gz``) holding the profile
columns, the plan's offsets and a SHA-256 checksum of their canonical JSON.
Loading checks, in order: it parses, the format and version are ours, the
checksum matches, the columns are well-formed, and the offsets are a valid
packing of exactly the profile's blocks.  Any failure raises
:class:`PlanFileError` naming the file and the reason.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

from .io import write_bytes_atomically
from .plan import Plan
from .trace import Block, Trace

__all__ = ["PlanFileError", "FORMAT", "VERSION", "dumps", "loads", "save", "load"]

FORMAT = "pgmo-pool-plan"
VERSION = 1


class PlanFileError(ValueError):
    """A saved plan is damaged or does not fit; the message says which and why."""


def _checksum(payload: dict) -> str:
    canon = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def dumps(arrays, plan: Plan, extra: dict | None = None) -> bytes:
    """Serialize ``(sizes, lowers, uppers)`` and the plan placing its blocks."""
    sizes, lowers, uppers = arrays
    payload = {
        "sizes": list(sizes), "lowers": list(lowers), "uppers": list(uppers),
        "ids": [b.id for b in plan.trace.blocks], "offsets": list(plan.offsets),
        "method": plan.method, "peak": plan.peak, "alignment": 512,
        "extra": extra or {},
    }
    doc = {"format": FORMAT, "version": VERSION, "payload": payload,
           "sha256": _checksum(payload)}
    return json.dumps(doc, separators=(",", ":")).encode()


def loads(data: bytes, source: str = "<bytes>"):
    """Parse and check; return ``(arrays, plan)`` or raise PlanFileError."""
    def fail(why: str) -> PlanFileError:
        return PlanFileError(f"{source}: {why}")

    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise fail(f"not a pgmo plan file (damaged or truncated JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise fail(f"not a pgmo plan file (format is not {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise fail(f"plan file version {doc.get('version')!r} is not supported "
                   f"(this pgmo reads version {VERSION})")
    payload = doc.get("payload")
    if not isinstance(payload, dict) or doc.get("sha256") != _checksum(payload):
        raise fail("checksum mismatch: the file was modified or damaged")
    try:
        sizes, lowers, uppers = payload["sizes"], payload["lowers"], payload["uppers"]
        ids, offsets = payload["ids"], payload["offsets"]
        alignment = payload["alignment"]
    except KeyError as e:
        raise fail(f"missing field {e.args[0]!r}") from None
    if alignment != 512:
        raise fail(f"alignment {alignment} does not match this pool's 512")
    n = len(sizes)
    if not (len(lowers) == n == len(uppers)) or len(ids) != len(offsets):
        raise fail("columns have different lengths")
    for name, col in (("sizes", sizes), ("lowers", lowers), ("ids", ids),
                      ("offsets", offsets)):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in col):
            raise fail(f"field {name!r} must hold non-negative integers")
    if not all(u is None or (isinstance(u, int) and u > lo) for u, lo in zip(uppers, lowers)):
        raise fail("field 'uppers' must hold integers after their lowers, or null")
    if any(s <= 0 or s % 512 for s in sizes):
        raise fail("field 'sizes' must hold positive multiples of 512")
    if any(not 0 <= i < n or uppers[i] is None for i in ids) or len(set(ids)) != len(ids):
        raise fail("plan ids do not name the profile's non-surviving requests")
    blocks = tuple(Block(i, lowers[i], uppers[i], sizes[i]) for i in ids)
    trace = Trace(blocks, {"recorded_by": "pgmo", "source": source})
    try:
        plan = Plan(trace, tuple(offsets), method=str(payload.get("method", "file")))
    except ValueError as e:
        raise fail(str(e)) from None
    arrays = (list(sizes), list(lowers), list(uppers))
    from ._engine import _check_plan_matches

    try:
        _check_plan_matches(arrays, plan)
    except ValueError as e:
        raise fail(f"plan does not fit its profile: {e}") from None
    return arrays, plan


def save(path: str | os.PathLike, arrays, plan: Plan, extra: dict | None = None) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a plan."""
    write_bytes_atomically(path, dumps(arrays, plan, extra))


def load(path: str | os.PathLike):
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PlanFileError(f"{path}: cannot read plan file ({e.strerror})") from None
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise PlanFileError(f"{path}: damaged gzip data ({e})") from None
    return loads(data, str(path))
