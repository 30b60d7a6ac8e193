"""Whole runs: every request of a process, with the iterations marked.

One iteration is not enough to judge a pool's footprint: what it holds
depends on what came before (weights, optimizer state, the warm-up's cache,
the last iteration's gradients) and on how it gets to its plan.  A
:class:`Run` is one :class:`~pgmo.trace.Trace` over a whole process on one
event clock (a tick per alloc and per free; block ``i`` is the ``i``-th
request; a block never freed is open) plus the iterations, as half-open
tick ranges ``[begin, end)``.  Requests outside every iteration (building
the model, evaluating) are part of the run too.

A run file is a pgmo JSON trace (``.run.json.gz`` by convention) whose
metadata holds ``"iterations": [[begin, end], ...]``; any reader of pgmo
traces reads it.  :class:`RunRecorder` writes one from live calls,
:func:`run_from_iteration` builds one from a single recorded iteration.

Core module: no CuPy.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .errors import TraceFormatError
from .recorder import EventRecorder
from .trace import Block, Trace, max_load
from .units import round_size

__all__ = ["Run", "RunBounds", "RunRecorder", "read_run", "write_run", "run_from_trace",
           "run_from_iteration"]


@dataclass(frozen=True)
class RunBounds:
    """What a benchmark needs to know of a run without replaying it; every size rounded
    up to ``unit`` bytes first, as pools round.

    ``physical``: the physical limit (the most bytes live at once over the run);
    ``iterations``: each iteration's own lower bound, the blocks it allocates and frees
    (see :meth:`Run.iteration_lower_bounds`); ``largest``: the largest of them (0
    without iterations); ``long_lived``: the most bytes live across one iteration
    boundary (weights, optimizer state, gradients; see
    :meth:`Run.long_lived_bytes_rounded`).  ``largest + long_lived`` is the physical
    limit when the largest iteration peaks with the most long-lived bytes live; it
    is above it when the iteration's peak comes before its gradients are made.
    """

    physical: int
    iterations: tuple[int, ...]
    largest: int
    long_lived: int
    unit: int


@dataclass(frozen=True)
class Run:
    """A whole run: its trace on one event clock and its iterations' tick ranges."""

    trace: Trace
    iterations: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        last = 0
        for k, (begin, end) in enumerate(self.iterations):
            if not (isinstance(begin, int) and isinstance(end, int)) or begin > end:
                raise TraceFormatError(f"iteration {k}: [{begin!r}, {end!r}) is not a tick range")
            if begin < last:
                raise TraceFormatError(f"iteration {k} begins at tick {begin}, before the "
                                       f"end of the one before it ({last})")
            last = end

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.trace.metadata

    def __len__(self) -> int:
        return len(self.trace)

    def lower_bound(self) -> int:
        """The physical limit: the most bytes live at once over the whole run.

        Weights, optimizer state and gradients included; no pool can hold
        less at its peak.  ``granularity`` rounds each size first (512: as
        CuPy's and pgmo's pools round).
        """
        return self._max_live(1)

    def lower_bound_rounded(self, unit: int = 512) -> int:
        """:meth:`lower_bound` with every size rounded up to ``unit`` bytes, as pools round."""
        return self._max_live(unit)

    def _max_live(self, unit: int) -> int:
        lowers, uppers, sizes = self.trace.columns()
        horizon = self.trace.horizon
        if unit > 1:
            sizes = [-(-s // unit) * unit for s in sizes]
        return max_load(lowers, [horizon if u is None else u for u in uppers], sizes)

    def long_lived(self) -> list[Block]:
        """Blocks live across an iteration boundary or never freed (weights, state, gradients)."""
        marks = sorted({t for it in self.iterations for t in it})
        out = []
        for b in self.trace.blocks:
            k = bisect.bisect_right(marks, b.lower)
            if b.upper is None or (k < len(marks) and marks[k] < b.upper):
                out.append(b)
        return out

    def long_lived_bytes(self) -> int:
        """The most bytes live across one iteration boundary (weights, state, gradients)."""
        horizon = self.trace.horizon
        best = 0
        for mark in sorted({t for it in self.iterations for t in it}):
            live = sum(b.size for b in self.trace.blocks
                       if b.lower < mark < (horizon if b.upper is None else b.upper))
            best = max(best, live)
        return best

    def iteration_lower_bounds(self, unit: int = 512, survivors: bool = False) -> list[int]:
        """Each iteration's own lower bound: the most bytes live at once among the blocks
        it allocates and frees (sizes rounded up to ``unit``).

        What a plan of that iteration alone needs at least: blocks that outlive it
        (weights, optimizer state, gradients) are not planned but kept apart, and blocks
        from before it are not its own.  With ``survivors`` the blocks it allocates and
        does not free count too, until its end.
        """
        if not self.iterations:
            return []
        blocks = sorted(self.trace.blocks, key=lambda b: b.lower)
        n = len(blocks)
        lowers = np.fromiter((b.lower for b in blocks), np.int64, n)
        uppers = np.fromiter((-1 if b.upper is None else b.upper for b in blocks), np.int64, n)
        sizes = -(-np.fromiter((b.size for b in blocks), np.int64, n) // unit) * unit
        out = []
        for begin, end in self.iterations:
            first, last = np.searchsorted(lowers, [begin, end])
            lo, up, size = lowers[first:last], uppers[first:last], sizes[first:last]
            outlive = (up < 0) | (up > end)
            if survivors:
                up = np.where(outlive, end, up)
            else:
                lo, up, size = lo[~outlive], up[~outlive], size[~outlive]
            if not len(size):
                out.append(0)
                continue
            ticks = np.concatenate([lo, up])
            deltas = np.concatenate([size, -size])
            order = np.lexsort((deltas, ticks))  # at one tick, frees first
            out.append(int(np.cumsum(deltas[order]).max()))
        return out

    def long_lived_bytes_rounded(self, unit: int = 512) -> int:
        """The most bytes (sizes rounded up to ``unit``) live across one iteration
        boundary: allocated before it and freed after it, or never."""
        marks = sorted({t for it in self.iterations for t in it})
        if not marks or not self.trace.blocks:
            return 0
        blocks = self.trace.blocks
        sizes = -(-np.fromiter((b.size for b in blocks), np.int64, len(blocks)) // unit) * unit
        lowers = np.fromiter((b.lower for b in blocks), np.int64, len(blocks))
        freed = np.array([b.upper is not None for b in blocks], bool)
        uppers = np.fromiter((b.upper for b in blocks if b.upper is not None), np.int64,
                             int(freed.sum()))
        by_lower = np.argsort(lowers, kind="stable")
        made = np.concatenate([[0], np.cumsum(sizes[by_lower])])
        by_upper = np.argsort(uppers, kind="stable")
        gone = np.concatenate([[0], np.cumsum(sizes[freed][by_upper])])
        marks_arr = np.asarray(marks, np.int64)
        live = (made[np.searchsorted(lowers[by_lower], marks_arr, "left")]
                - gone[np.searchsorted(uppers[by_upper], marks_arr, "right")])
        return int(live.max())

    def bounds(self, unit: int = 512) -> RunBounds:
        """The physical limit, each iteration's own lower bound and the largest, and the
        long-lived bytes, sizes rounded up to ``unit``: a benchmark's figures without a
        replay."""
        per = tuple(self.iteration_lower_bounds(unit))
        return RunBounds(physical=self.lower_bound_rounded(unit), iterations=per,
                         largest=max(per, default=0),
                         long_lived=self.long_lived_bytes_rounded(unit), unit=unit)

    def iteration_of(self) -> list[int]:
        """For each block, the iteration its alloc falls in (-1: outside every iteration)."""
        out = []
        k = 0
        its = self.iterations
        for b in self.trace.blocks:  # lowers increase: one pass
            while k < len(its) and its[k][1] <= b.lower:
                k += 1
            out.append(k if k < len(its) and its[k][0] <= b.lower else -1)
        return out

    def scaled(self, factor: float) -> "Run":
        """The run with its activations ``factor`` times as large (a larger batch, say).

        Blocks allocated inside an iteration and freed in it scale; blocks
        that cross an iteration boundary, are never freed, or live outside
        iterations (weights, optimizer state, gradients) keep their size.
        """
        keep = {b.id for b in self.long_lived()}
        where = self.iteration_of()
        blocks = [b if (b.id in keep or where[i] < 0)
                  else dataclasses.replace(b, size=max(1, int(round(b.size * factor))))
                  for i, b in enumerate(self.trace.blocks)]
        meta = {**self.metadata, "activation_scale": factor}
        return Run(Trace(tuple(blocks), meta), self.iterations)

    def events(self) -> Iterator[tuple[str, int]]:
        """``("begin", k)``, ``("end", k)``, ``("alloc", i)`` and ``("free", i)``, in order."""
        stream: list[tuple[int, int, int, str]] = []
        for i, b in enumerate(self.trace.blocks):
            stream.append((b.lower, 3, i, "alloc"))
            if b.upper is not None:
                stream.append((b.upper, 2, i, "free"))
        for k, (begin, end) in enumerate(self.iterations):
            stream.append((begin, 1, k, "begin"))
            stream.append((end, 0, k, "end"))
        # At one tick: an iteration ends, then the next begins, then frees, then allocs.
        stream.sort()
        for _, _, i, kind in stream:
            yield kind, i


class RunRecorder(EventRecorder):
    """Log a whole run: allocs and frees on the event clock, and iteration marks."""

    def __init__(self, round_to: int = 1) -> None:
        super().__init__(round_to)
        self.iterations: list[list[int]] = []
        self._in_iteration = False

    def begin(self) -> None:
        if self._in_iteration:
            raise RuntimeError("begin() inside an iteration: end() first")
        self.iterations.append([self.tick, self.tick])
        self._in_iteration = True

    def end(self) -> None:
        if not self._in_iteration:
            raise RuntimeError("end() without begin()")
        self.iterations[-1][1] = self.tick
        self._in_iteration = False

    def run(self, **metadata: Any) -> Run:
        """The run so far (an iteration still open ends now)."""
        iterations = [(begin, end) for begin, end in self.iterations]
        if self._in_iteration:
            iterations[-1] = (iterations[-1][0], self.tick)
        metadata = {**metadata, "iterations": [list(it) for it in iterations]}
        return Run(self.trace(**metadata), tuple(iterations))


def run_from_trace(trace: Trace, where: str = "trace") -> Run:
    """A trace whose metadata holds ``iterations``, as a :class:`Run`."""
    raw = trace.metadata.get("iterations")
    if raw is None:
        raise TraceFormatError(f"{where}: no 'iterations' in its metadata: not a run file")
    try:
        iterations = tuple((int(b), int(e)) for b, e in raw)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{where}: field 'iterations' must be a list of "
                               f"[begin, end] tick pairs") from None
    return Run(trace, iterations)


def read_run(path: str | Path) -> Run:
    """Read a run file (any pgmo trace format whose metadata marks the iterations)."""
    from .formats import read_trace

    return run_from_trace(read_trace(path), str(path))


def write_run(run: Run, path: str | Path) -> None:
    from .formats import write_trace

    meta = {**run.metadata, "iterations": [list(it) for it in run.iterations]}
    write_trace(Trace(run.trace.blocks, meta), path)


def run_from_iteration(trace: Trace, iterations: int = 10, *, setup: Sequence[int] = (),
                       state: Sequence[int] = (), **metadata: Any) -> Run:
    """A whole run made of one recorded iteration, repeated ``iterations`` times.

    ``setup``: sizes allocated as the first iteration starts and kept (the
    weights, made by the first forward pass as Chainer's lazy layers do);
    ``state``: sizes allocated at the end of the first iteration and kept
    (optimizer state, made by the first update).  The trace's open
    blocks (gradients, a kept loss) are allocated in each iteration and freed
    in the next one: when the trace says (blocks live from its first ticks
    whose free it heard, as :class:`pgmo.TraceRecorder` records memory
    allocated before it started: ``metadata["import"]["before_freed"]``),
    matched by rounded size; else just before the next iteration's first
    open block is made (Chainer's ``cleargrads()`` comes after the forward
    pass, before backward makes the new gradients).  The last iteration's
    open blocks stay open.
    """
    if iterations < 1:
        raise ValueError(f"a run needs at least one iteration, got {iterations}")
    blocks = sorted(trace.blocks, key=lambda b: b.lower)
    start = blocks[0].lower if blocks else 0
    before = int(trace.metadata.get("import", {}).get("before_freed", {}).get("count", 0) or 0)
    inherited = [b for b in blocks[:before] if b.upper is not None]
    own = blocks[len(inherited):]
    opened = [b for b in own if b.upper is None]
    rec = RunRecorder()
    carried: list[int] = []
    for k in range(iterations):
        rec.begin()
        if k == 0:
            for size in setup:
                rec.alloc(size)
        # One event list per iteration: (tick, order, serial, kind, item); frees first.
        stream: list[tuple[int, int, int, str, Any]] = []
        for n, b in enumerate(own):
            stream.append((b.lower, 1, n, "alloc", b))
            if b.upper is not None:
                stream.append((b.upper, 0, n, "free", b))
        first_open = opened[0].lower if opened else start
        for n, (tick, handle) in enumerate(_carried_frees(inherited, carried, rec, first_open)):
            stream.append((tick, 0, -1 - n, "carried", handle))
        stream.sort(key=lambda e: (e[0], e[1], e[2]))
        handles: dict[Any, int] = {}
        for _, _, _, kind, item in stream:
            if kind == "alloc":
                handles[item.id] = rec.alloc(item.size)
            elif kind == "free":
                rec.free(handles[item.id])
            else:
                rec.free(item)
        carried = [handles[b.id] for b in opened]
        if k == 0:
            for size in state:
                rec.alloc(size)
        rec.end()
    meta = {k: v for k, v in trace.metadata.items() if k != "iterations"}
    meta.update(metadata)
    meta["run_from"] = "one recorded iteration, repeated"
    return rec.run(**meta)


def _carried_frees(inherited: Sequence[Block], carried: Sequence[int], rec: RunRecorder,
                   otherwise: int) -> list[tuple[int, int]]:
    """When each of the last iteration's open blocks is freed: (tick, handle).

    Matched to the trace's inherited frees by rounded size, in free order;
    those the trace says nothing about are freed at tick ``otherwise``.
    """
    free_by_size: dict[int, list[int]] = {}
    for handle in carried:
        free_by_size.setdefault(round_size(rec.size(handle)), []).append(handle)
    out = []
    ends = [(b.upper, b.size) for b in inherited if b.upper is not None]  # all are freed
    for upper, size in sorted(ends, key=lambda end: end[0]):
        same = free_by_size.get(round_size(size))
        if same:
            out.append((upper, same.pop(0)))
    rest = sorted(h for hs in free_by_size.values() for h in hs)
    out += [(otherwise, h) for h in rest]
    return out
