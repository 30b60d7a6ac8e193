"""PyTorch's CUDA memory snapshot: ``torch.cuda.memory._dump_snapshot("snap.pickle")``.

Schema followed: PyTorch 2.13.0, ``torch/cuda/memory.py`` (``_snapshot``'s
docstring: ``Snapshot``, ``Segment``, ``Block``, ``TraceEntry``), read
together with ``torch/cuda/_memory_viz.py`` and ``torch/utils/viz/MemoryViz.js``
(how PyTorch's own viewer replays a snapshot) and
``torch/csrc/cuda/memory_snapshot.cpp`` (the keys written).  The file is a
pickled dict::

    {"segments": [{"device", "address", "total_size", "stream",
                   "blocks": [{"size", "requested_size", "state", ...}], ...}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us",
                         "frames", ...}, ...],   # one list per device
                       ...],
     ...}

or, from ``torch.cuda.memory_snapshot()`` and old versions, just the list of
segments.  It is read WITHOUT importing torch, by an unpickler that builds
plain data only (:mod:`pgmo.formats.safe_pickle`).

How events become blocks (one device; all its streams unless ``stream`` is given):

* ``alloc`` starts a block of ``size`` bytes (the size asked for; PyTorch
  rounds it up to 512 B itself) at ``addr``;
* ``free_completed`` ends it: only then may the memory be reused.  A
  snapshot without any ``free_completed`` (``skip_actions``) ends blocks at
  ``free_requested``;
* a free of an address with no live block frees a block allocated before
  recording started; blocks still ``active_*`` in ``segments`` that the trace
  did not allocate were allocated before and never freed: both are kept
  (see :mod:`pgmo.formats.allocation_log`) and reported;
* ``segment_alloc``/``segment_map`` and ``segment_free``/``segment_unmap``
  are what the caching allocator reserved from CUDA: replayed backwards from
  the final segments they give the peak reserved memory;
* ``oom`` is counted; ``snapshot`` and ``annotate`` (the markers of
  ``torch.cuda.memory._annotate_memory``) are ignored; an action this reader
  does not know is skipped and counted, as PyTorch's own viewer does.

The default device is the one with the most trace events.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..trace import SizeTotal
from ..units import size_refused
from .allocation_log import AllocationLog
from .files import read_bytes
from .model import Loaded, ReadOptions
from .safe_pickle import loads_plain_data

__all__ = ["NAME", "sniff", "is_old_pickle", "read", "snapshot_to_trace"]

NAME = "pytorch-snapshot"
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
SEGMENT_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1,
                   "segment_unmap": -1}
OTHER_ACTIONS = ("oom", "snapshot", "annotate")
LIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")


def sniff(head: bytes) -> bool:
    """A binary pickle (protocol 2 or later): pgmo reads no other pickles."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


_OLD_PICKLE = re.compile(rb"\((dp|lp)\d*\n|c[\w.]+\n\w+\n|[}\]]q\x00")


def is_old_pickle(head: bytes) -> bool:
    """The start of a protocol 0 or 1 pickle (a dict, a list or an import)."""
    return _OLD_PICKLE.match(head) is not None


def read(path: Path, options: ReadOptions) -> Loaded:
    name = str(path)
    raw = read_bytes(path)
    if not sniff(raw[:2]):
        kind = "a pickle of protocol 0 or 1" if is_old_pickle(raw) else \
            "not a pickle" if raw.strip() else "an empty file"
        raise TraceFormatError(
            f"not a PyTorch memory snapshot: {kind} (torch.cuda.memory._dump_snapshot "
            f"writes a pickle of protocol 2 or later; this file starts with {raw[:16]!r})",
            path=name)
    data = loads_plain_data(raw, name, what="PyTorch memory snapshot")
    trace = snapshot_to_trace(data, options, name)
    return Loaded(trace, None)


# ----------------------------------------------------------------- validation
class _Where:
    """Names the place of a bad value: ``device_traces[0][17]``, ``segments[3]``..."""

    def __init__(self, path: str | None):
        self.path = path
        self.total = SizeTotal()  # the sizes of the trace's blocks so far

    def fail(self, place: str, message: str, field: str | None = None) -> TraceFormatError:
        return TraceFormatError(f"{place}: {message}", path=self.path, field=field)

    def integer(self, entry: dict, key: str, place: str, default: Any = None) -> int:
        value = entry.get(key, default)
        if value is None:
            raise self.fail(place, f"missing '{key}' (entry has {sorted(map(str, entry))})",
                            key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(place, f"expected an integer, got {value!r}", key)
        return value

    def size(self, entry: dict, key: str, place: str) -> int:
        value = self.integer(entry, key, place)
        if value < 0:
            raise self.fail(place, f"size must be >= 0, got {value}", key)
        why = size_refused(value)
        if why:
            raise self.fail(place, why, key)
        return value

    def block(self, size: int, place: str, key: str = "size") -> int:
        """``size`` as one block of the trace: counted in the total the size rule bounds."""
        try:
            return self.total.add(size, {}, key)
        except TraceFormatError as exc:
            raise self.fail(place, exc.reason, key) from None


def _stream(value: Any) -> Any:
    return 0 if value is None else value


def _wanted_stream(value: int | str | None) -> Any:
    """A chosen stream: PyTorch records handles as ints, so ``"0x7f..."`` is read as one."""
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            return value.strip()
    return value


def _parts(data: Any, where: _Where) -> tuple[list, list]:
    """``(segments, device_traces)`` of a snapshot, checked to be lists."""
    segments: Any
    traces: Any
    if isinstance(data, list):  # torch.cuda.memory_snapshot(): segments only
        segments, traces = data, []
    elif isinstance(data, dict):
        if "segments" not in data and "device_traces" not in data:
            keys = ", ".join(sorted(map(str, data))[:8]) or "none"
            raise where.fail("snapshot", f"not a PyTorch memory snapshot: a dict without "
                                         f"'segments' or 'device_traces' (its keys: {keys})")
        segments, traces = data.get("segments"), data.get("device_traces")
        segments = [] if segments is None else segments
        traces = [] if traces is None else traces
    else:
        raise where.fail("snapshot", f"not a PyTorch memory snapshot: the pickle holds a "
                                     f"{type(data).__name__}, not a dict of segments and traces")
    if not isinstance(segments, list):
        raise where.fail("snapshot", "'segments' must be a list", "segments")
    if not isinstance(traces, list):
        raise where.fail("snapshot", "'device_traces' must be a list (one per device)",
                         "device_traces")
    for d, events in enumerate(traces):
        if not isinstance(events, list):
            raise where.fail(f"device_traces[{d}]", "must be a list of trace entries")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise where.fail(f"segments[{i}]", f"expected a dict, got {type(seg).__name__}")
    return segments, traces


def _segment_device(seg: dict, i: int, where: _Where) -> int:
    return where.integer(seg, "device", f"segments[{i}]", default=0)


def _choose_device(segments: list, traces: list, options: ReadOptions, where: _Where) -> int:
    counts = Counter({d: len(events) for d, events in enumerate(traces) if events})
    seg_devices = Counter(_segment_device(s, i, where) for i, s in enumerate(segments))
    known = sorted(set(counts) | set(seg_devices))
    if options.device is not None:
        if options.device not in known:
            listed = ", ".join(map(str, known)) or "none"
            raise TraceFormatError(f"no device {options.device} in it (devices with events "
                                   f"or segments: {listed})", path=where.path, field="device")
        return options.device
    if counts:  # most events; the lowest device number on a tie
        return min(counts, key=lambda d: (-counts[d], d))
    if seg_devices:
        return min(seg_devices, key=lambda d: (-seg_devices[d], d))
    return 0


# -------------------------------------------------------------------- reading
def snapshot_to_trace(data: Any, options: ReadOptions | None = None,
                      path: str | None = None):
    """Turn an unpickled snapshot (plain data) into a :class:`~pgmo.trace.Trace`.

    The trace's metadata says what was read and found: device and streams,
    blocks allocated before the recording or live at its end, zero-size and
    failed requests, skipped actions, and ``reserved_peak`` (bytes the
    caching allocator held at most) when the segments allow it.
    """
    options = options or ReadOptions()
    where = _Where(path)
    segments, traces = _parts(data, where)
    device = _choose_device(segments, traces, options, where)
    events = traces[device] if device < len(traces) else []
    segs = [(i, s) for i, s in enumerate(segments) if _segment_device(s, i, where) == device]
    streams = sorted({_stream(e.get("stream")) for e in events if isinstance(e, dict)}
                     | {_stream(s.get("stream")) for _, s in segs},
                     key=lambda s: (str(type(s)), s))
    stream = _wanted_stream(options.stream)
    if stream is not None and stream not in streams:
        listed = ", ".join(map(str, streams)) or "none"
        raise where.fail(f"device {device}", f"no stream {stream} (streams: {listed})",
                         "stream")

    def selected(value: Any) -> bool:
        return stream is None or _stream(value) == stream

    log = AllocationLog()
    # A free ends a block at free_completed, unless the snapshot has none.
    ends_at = "free_completed" if any(isinstance(e, dict) and e.get("action") ==
                                      "free_completed" for e in events) else "free_requested"
    zero_size = 0
    oom: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    reserved_deltas: list[int] = []
    for i, e in enumerate(events):
        place = f"device_traces[{device}][{i}]"
        if not isinstance(e, dict):
            raise where.fail(place, f"expected a dict, got {type(e).__name__}")
        action = e.get("action")
        if not isinstance(action, str):
            raise where.fail(place, f"expected an action name, got {action!r}", "action")
        if not selected(e.get("stream")):
            continue
        if action in BLOCK_ACTIONS:
            addr = where.integer(e, "addr", place)
            size = where.size(e, "size", place)
            if action == "alloc":
                if size == 0:
                    zero_size += 1
                    continue
                live = log.live_block(addr)
                if live is not None:
                    raise where.fail(place, f"alloc at address {addr:#x}, which is still "
                                            f"allocated (no {ends_at} since its alloc)", "addr")
                log.alloc(addr, where.block(size, place))
            elif action == ends_at:
                if log.free(addr) is None and size > 0:
                    log.free_allocated_before(where.block(size, place))
        elif action in SEGMENT_ACTIONS:
            reserved_deltas.append(SEGMENT_ACTIONS[action] * where.size(e, "size", place))
        elif action == "oom":
            oom["count"] += 1
            oom["bytes"] += where.size(e, "size", place)
        elif action not in OTHER_ACTIONS:
            skipped[action] += 1

    before_live = _live_before_recording(segs, log, selected, where)
    for size in before_live:
        log.live_allocated_before(size)
    reserved_now = sum(where.size(s, "total_size", f"segments[{i}]") for i, s in segs
                       if selected(s.get("stream")))
    metadata: dict[str, Any] = {
        "source_format": NAME,
        "import": {**log.report(), "device": device,
                   "devices": sorted({d for d, ev in enumerate(traces) if ev}),
                   "streams": streams, "stream": stream, "events": len(events),
                   "block_ends_at": ends_at, "zero_size_requests": zero_size,
                   "failed_requests": {"count": oom["count"], "bytes": oom["bytes"]},
                   "skipped_actions": dict(sorted(skipped.items()))},
    }
    metadata.update(_reserved(reserved_now, reserved_deltas, bool(segs)))
    return log.trace(source=path, **metadata)


def _live_before_recording(segs, log: AllocationLog, selected, where: _Where) -> list[int]:
    """Sizes of blocks live in the final segments that the trace did not allocate."""
    live_in_trace = log.live_addresses
    sizes = []
    for i, seg in segs:
        if not selected(seg.get("stream")):
            continue
        place = f"segments[{i}]"
        addr = where.integer(seg, "address", place)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise where.fail(place, "'blocks' must be a list", "blocks")
        for j, b in enumerate(blocks):  # a block's address: the segment's plus the sizes before
            bplace = f"{place}.blocks[{j}]"
            if not isinstance(b, dict):
                raise where.fail(bplace, f"expected a dict, got {type(b).__name__}")
            size = where.size(b, "size", bplace)
            if b.get("state") in LIVE_STATES and addr not in live_in_trace:
                requested = b.get("requested_size")
                asked = where.size(b, "requested_size", bplace) if requested is not None \
                    else size
                if asked > 0:
                    sizes.append(where.block(asked, bplace, "requested_size" if requested
                                             is not None else "size"))
            addr += size
    return sizes


def _reserved(now: int, deltas: list[int], has_segments: bool) -> dict[str, Any]:
    """Peak reserved bytes: the final segments, with the segment history replayed backwards."""
    if not has_segments and not deltas:
        return {}
    level = now - sum(deltas)  # reserved when the recording started
    peak, lowest = level, level
    for d in deltas:
        level += d
        peak, lowest = max(peak, level), min(lowest, level)
    if lowest < 0:
        return {"reserved_note": "the segment history does not match the final segments "
                                 "(segment events skipped?): reserved memory not reported"}
    return {"reserved_peak": peak, "reserved_at_end": now,
            "reserved_by": "PyTorch (its segments)"}
