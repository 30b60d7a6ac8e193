"""Will pgmo save me memory?  Compare a recorded trace's plans with what its allocator reserved.

:func:`analyze` reads any trace pgmo knows (a PyTorch snapshot, an RMM log,
a CuPy recording, pgmo's own files), and reports in one :class:`Analysis`:

* the lower bound: the most bytes live at once over the whole recording (every
  iteration in it, weights included), which no allocator can beat;
* the peak of the paper's best-fit plan and of the chosen method (``best``);
* what the recording allocator reserved, when the file records it (PyTorch's
  segments) or, for a file that does not, when it is given (``reserved=``: a
  byte count, or the log of the memory under a pool, such as an RMM log of a
  pool's upstream);
* the saving of each against that reservation, in bytes and percent.

Sizes are analysed at pgmo's pool granularity by default: each request
rounded up to 512 B, as the pool rounds it (``granularity=1``: the sizes as
requested; the trace itself always keeps them as requested).  Recording
allocators round too (PyTorch to 512 B, RMM's pools to 256 B), so their
reservation includes their own rounding.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import bundled
from ..formats import ReadOptions, detect, load
from ..plan import Plan
from ..solver import SolverOptions, solve
from ..solver.options import solver_options
from ..errors import TraceFormatError
from ..trace import Block, SizeTotal, Trace
from ..units import ALIGNMENT, format_bytes

__all__ = ["Analysis", "analyze", "parse_bytes", "human_bytes"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_BYTES = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int | None:
    """``"8589934592"``, ``"8 GiB"``, ``"7.5GB"`` as bytes; None when it is not a size."""
    m = _BYTES.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        return None
    digits, unit = m.group(1).replace("_", "").replace(",", ""), _UNITS[m.group(2).lower()]
    if "." in digits:
        return int(round(float(digits) * unit))
    return int(digits) * unit


def human_bytes(nbytes: int | None) -> str:
    """``2.14 GiB``, ``512 B``: the unit a person reads (``-`` for unknown)."""
    return "-" if nbytes is None else format_bytes(nbytes)


@dataclass
class Analysis:
    """What a profile-guided plan would need, against what the recording allocator reserved."""

    source: str
    format: str | None
    requests: int  # blocks in the trace (open ones included)
    open_blocks: int  # never freed while recorded: live until the end
    granularity: int  # sizes rounded up to a multiple of this many bytes
    lower_bound: int
    no_reuse: int  # every request its own memory: the sum of sizes
    plans: dict[str, dict[str, Any]]  # method -> peak, ratio, seconds, optimal
    reserved: int | None  # bytes the recording allocator held at most; None: not known
    reserved_by: str | None
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # the reader's import report
    trace: Trace | None = field(default=None, repr=False)  # at the analysed granularity
    plan: Plan | None = field(default=None, repr=False)  # the last (best) plan

    def saving(self, nbytes: int | None) -> tuple[int, float] | None:
        """``(bytes, percent)`` saved against the reservation; None when it is unknown."""
        if self.reserved is None or nbytes is None:
            return None
        saved = self.reserved - nbytes
        return saved, (100.0 * saved / self.reserved if self.reserved else 0.0)

    def rows(self) -> list[tuple[str, int, bool]]:
        """``(label, bytes, compared)`` in the order the table prints them.

        ``compared``: the row is a way to serve the trace, whose saving against
        the reservation the table shows.
        """
        rows: list[tuple[str, int, bool]] = []
        if self.reserved is not None:
            rows.append((f"reserved by {self.reserved_by or 'the allocator'}", self.reserved,
                         False))
        rows.append(("lower bound (most live at once, whole recording)",
                     self.lower_bound, True))
        for method, plan in self.plans.items():
            label = "bestfit plan (the paper's heuristic)" if method == "bestfit" \
                else f"{method} plan"
            rows.append((label, plan["peak"], True))
        rows.append(("no reuse (sum of all requests)", self.no_reuse, False))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every number, the savings against the reservation, the notes."""
        savings = {}
        for key, nbytes in [("lower_bound", self.lower_bound)] + \
                [(m, p["peak"]) for m, p in self.plans.items()]:
            s = self.saving(nbytes)
            savings[key] = None if s is None else {"bytes": s[0], "percent": round(s[1], 3)}
        return {"source": self.source, "format": self.format, "requests": self.requests,
                "open_blocks": self.open_blocks, "granularity": self.granularity,
                "lower_bound": self.lower_bound, "no_reuse": self.no_reuse,
                "plans": self.plans, "reserved": self.reserved, "reserved_by": self.reserved_by,
                "savings_vs_reserved": savings, "notes": self.notes, "import": self.details}

    def format_table(self) -> str:
        """The human report: one table, then the notes."""
        head = f"{self.source}"
        if self.format:
            head += f" ({self.format})"
        lines = [head, f"{_blocks(self.requests, 'request')}, sizes "
                       + ("as requested" if self.granularity == 1 else
                          f"rounded up to {self.granularity} B"), ""]
        table = [("", "bytes", "", "saved vs reserved" if self.reserved is not None else "", "")]
        for label, nbytes, compared in self.rows():
            s = self.saving(nbytes) if compared else None
            table.append((label, f"{nbytes:,}", human_bytes(nbytes),
                          "" if s is None else f"{s[0]:,}", "" if s is None else f"{s[1]:.1f} %"))
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        for r in table:
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  "
                         f"{r[3]:>{widths[3]}}  {r[4]:>{widths[4]}}".rstrip())
        if self.notes:
            lines.append("")
            lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def at_granularity(trace: Trace, granularity: int) -> Trace:
    """The same blocks with each size rounded up to a multiple of ``granularity``.

    The rounded sizes obey the size rule of every trace
    (:func:`pgmo.units.size_refused`); a :class:`~pgmo.errors.TraceFormatError` if not.
    """
    if granularity < 1:
        raise ValueError(f"granularity must be a positive number of bytes, got {granularity}")
    if granularity == 1:
        return trace
    g = granularity
    blocks = tuple(Block(b.id, b.lower, b.upper, -(-b.size // g) * g) for b in trace.blocks)
    total = SizeTotal()  # rounded up, the sizes must still obey the size rule
    for b in blocks:
        try:
            total.add(b.size, {})
        except TraceFormatError as exc:
            raise TraceFormatError(f"block id={b.id} rounded up to granularity {g:,} B: "
                                   f"{exc.reason}", path=trace.source, field="size") from None
    return Trace(blocks, {**trace.metadata, "granularity": g}, trace.source)


def _reserved_from(value: Any, options: ReadOptions) -> tuple[int, str]:
    """A byte count, or a log whose peak of live bytes is the reservation."""
    if isinstance(value, bool):
        raise ValueError(f"reserved must be a byte count or a file, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"reserved must be >= 0 bytes, got {value}")
        return value, "--reserved"
    if isinstance(value, str):
        if re.match(r"^\s*-\s*[0-9]", value):
            raise ValueError(f"reserved must be >= 0 bytes, got {value.strip()!r}")
        nbytes = parse_bytes(value)
        if nbytes is not None:
            return nbytes, "--reserved"
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.exists():
            raise ValueError(f"reserved: {os.fspath(value)!r} is neither a size (bytes, or "
                             "with a unit: '12GiB', '8 GB') nor a file (a log of the memory "
                             "under the pool)")
        if path.is_dir():
            raise ValueError(f"reserved: {os.fspath(value)!r} is a folder, neither a size "
                             "nor a file (a log of the memory under the pool)")
        other = load(path, None, ReadOptions(stream=options.stream)).trace
        return other.lower_bound(), f"{path.name} (its peak of live bytes)"
    raise ValueError(f"reserved must be a byte count or a file, got {value!r}")


def _blocks(n: int, noun: str = "block") -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _import_notes(details: dict[str, Any], metadata: dict[str, Any]) -> list[str]:
    """What the reader found that a user should know: kept, skipped, chosen."""
    notes = []

    def counted(key: str, noun: str, text: str) -> None:
        entry = details.get(key) or {}
        if entry.get("count"):
            notes.append(f"{_blocks(entry['count'], noun)} ({human_bytes(entry['bytes'])}) "
                         f"{text}")

    counted("before_freed", "block", "allocated before recording started and freed during "
                                     "it: live from the start until freed")
    counted("before_live", "block", "allocated before recording and never freed (weights, "
                                    "optimizer state...): live throughout")
    counted("live_at_end", "block", "still allocated when recording ended: live until the "
                                    "end")
    counted("failed_requests", "request", "failed (out of memory): not in the trace")
    if details.get("zero_size_requests"):
        n = details["zero_size_requests"]
        notes.append(f"{_blocks(n, 'zero-size request')} {'takes' if n == 1 else 'take'} no "
                     f"memory: skipped")
    if details.get("frees_not_heard"):
        notes.append(f"{_blocks(details['frees_not_heard'], 'free')} not heard (freed in "
                     f"another thread?): ended where their address was reused")
    if details.get("skipped_actions"):
        listed = ", ".join(f"{k} x{v}" for k, v in details["skipped_actions"].items())
        notes.append(f"actions this reader does not know were skipped: {listed}")
    devices = details.get("devices") or []
    if len(devices) > 1:
        notes.append(f"device {details.get('device')} of devices {devices} "
                     f"(--device picks another)")
    streams = details.get("streams") or []
    if details.get("stream") is None and len(streams) > 1:
        notes.append(f"all {len(streams)} streams analysed together, as they share the "
                     f"device's memory (--stream picks one)")
    if metadata.get("reserved_note"):
        notes.append(metadata["reserved_note"])
    if metadata.get("source_format") == "pytorch-snapshot" and not details.get("events"):
        notes.append("the snapshot has no allocation history, only the blocks live when it "
                     "was taken: record one with torch.cuda.memory._record_memory_history() "
                     "before the iteration")
    return notes


def analyze(source: Trace | str | os.PathLike, *, format: str | None = None,
            device: int | None = None, stream: int | str | None = None,
            inclusive: bool = False, reserved: int | str | os.PathLike | None = None,
            granularity: int = ALIGNMENT,
            options: SolverOptions | None = None, **changes: Any) -> Analysis:
    """Read (or take) a trace, plan it, and compare with what its allocator reserved.

    ``source``: a trace file in any format pgmo reads, the name of a bundled trace
    (``pgmo.bundled.names()``), or a :class:`Trace`.
    ``device``/``stream``/``inclusive``: how to read it (see
    :class:`~pgmo.formats.ReadOptions`).  ``reserved``: what the recording
    allocator reserved, for a file that does not say (an RMM log): bytes, or a
    log whose peak of live bytes it is; a ``ValueError`` for a file that
    records its own (a PyTorch snapshot), which is the figure to compare with.
    ``granularity``: round sizes up to a multiple of this (default: pgmo's
    512 B).  Solver ``options``/``changes`` choose the second plan (default
    ``best`` within its time limit); the first is always ``bestfit``.
    """
    options = solver_options(options, **changes)
    read_options = ReadOptions(inclusive=inclusive, device=device, stream=stream)
    if isinstance(source, Trace):
        trace, name, fmt = source, source.source or "<trace>", None
    else:
        path = bundled.resolve(source)  # a file, or a bundled trace of that name
        trace = load(path, format, read_options).trace
        name, fmt = str(source), format or detect(path).name
    metadata = dict(trace.metadata)
    details = dict(metadata.get("import") or {})
    analysed = at_granularity(trace, granularity)

    reserved_by = None
    nbytes: int | None
    recorded = metadata.get("reserved_peak")
    if reserved is not None and recorded is not None:
        by = metadata.get("reserved_by") or "the recording allocator"
        raise ValueError(f"{name} records what was reserved: {human_bytes(recorded)} by "
                         f"{by}; --reserved (reserved=) is only for a file that does not say "
                         f"(an RMM log)")
    if reserved is not None:
        nbytes, reserved_by = _reserved_from(reserved, read_options)
    else:
        nbytes = metadata.get("reserved_peak")
        if nbytes is not None:
            reserved_by = metadata.get("reserved_by") or "the recording allocator"
    notes = _import_notes(details, metadata)
    if granularity != 1:
        how = "as pgmo's pool rounds them" if granularity == ALIGNMENT else "as asked"
        notes.insert(0, f"sizes rounded up to {granularity} B {how} "
                        f"(granularity 1: as requested)")
    lb = analysed.lower_bound()
    total = analysed.total_bytes
    plans: dict[str, dict[str, Any]] = {}
    last_plan = None
    if len(analysed) == 0:
        notes.append("nothing to optimize: the trace has no allocation requests")
    else:
        methods = ["bestfit"] + ([options.method] if options.method != "bestfit" else [])
        for method in methods:
            if options.progress and method != "bestfit":
                limit = "no time limit" if options.time_limit is None \
                    else f"up to {options.time_limit:g} s"
                print(f"pgmo: planning {len(analysed):,} blocks with '{method}' ({limit})...",
                      file=sys.stderr, flush=True)
            plan = solve(analysed, options.replace(method=method))
            plans[method] = {"peak": plan.peak, "ratio": round(plan.ratio, 6),
                             "seconds": round(plan.seconds, 3), "optimal": plan.optimal}
            last_plan = plan
        if lb == total and len(analysed) > 1:
            notes.append(f"nothing to optimize: all {len(analysed):,} requests are live at the "
                         f"same time, so any allocator needs their sum")
        elif len(analysed) == 1:
            notes.append("nothing to optimize: the trace has one request")
    if nbytes is not None and nbytes < lb:
        notes.append(f"the reservation ({human_bytes(nbytes)}) is below the lower bound "
                     f"({human_bytes(lb)}), which no allocator can beat: it is not this "
                     f"trace's (another file, device or stream?), and its savings mean "
                     f"nothing")
    if nbytes is None:
        notes.append("the file does not record how much memory its allocator reserved; "
                     "give it with --reserved (bytes, or the log of the memory under a pool)")
    return Analysis(source=name, format=fmt, requests=len(trace), open_blocks=len(trace.open_ids),
                    granularity=granularity, lower_bound=lb, no_reuse=total, plans=plans,
                    reserved=nbytes, reserved_by=reserved_by, notes=notes, details=details,
                    trace=analysed, plan=last_plan)
