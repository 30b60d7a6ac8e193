"""Measuring a pool's device footprint over whole runs, on host memory.

What a pool holds is judged the way NVML judges a process: every byte taken
from the device (the host stand-in for cudaMalloc,
:class:`~pgmo.device.host_memory.HostMemory`), at every moment of a whole
:class:`~pgmo.runs.Run`, beside the physical limit (the most bytes the run
has live at once) and beside CuPy's stock pool
(:class:`~pgmo.device.host_stock_pool.HostStockPool`, calibrated on the H100).  Every
block is checked (:func:`pgmo.measure.replay.replay_run`): a footprint bought with
a corrupted byte does not count.

:func:`measure` replays a run once; :func:`smallest_capacity` finds the
smallest device on which a run completes; :func:`largest_scale` the largest
activation scale (a larger batch) that completes on a given device.
``python -m scripts.bench_footprint`` prints them as tables.
"""

from __future__ import annotations

import gc
import importlib.util
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..device.host_memory import HostMemory
from ..device.host_stock_pool import HostStockPool
from ..runs import Run

__all__ = ["Footprint", "measure", "second_run", "completes", "stock_pool", "pgmo_pool", "smallest_capacity",
           "largest_scale", "physical_scale", "moments_above", "profiling_candidates"]

#: Makes a pool on a host device of the given capacity (None: unbounded); returns the pool.
PoolMaker = Callable[[int | None], Any]


def stock_pool(capacity: int | None = None) -> HostStockPool:
    """CuPy's stock pool (the host model) on a host device of ``capacity`` bytes."""
    return HostStockPool(HostMemory(capacity))


def pgmo_pool(**options: Any) -> PoolMaker:
    """A maker of pgmo pools on host memory with ``options`` (the pool's own defaults else).

    Where CuPy is installed, the pool (:func:`pgmo.measure.hosts.host_pool`); without it, its
    engine alone (:func:`pgmo.measure.hosts.host_engine`), which holds the same bytes at the same
    moments: the pool adds CuPy's conventions (memory objects, hooks, CuPy's
    ``OutOfMemoryError``), not memory.  Either has ``stats()``, ``close()`` and, as
    ``engine`` for the pool, the engine itself.

    The plan cache (:mod:`pgmo.plan_cache`) is off unless ``plan_cache=True``: a
    measurement is of a run as its first (a second run of the same workload, started
    from the plan the first kept, passes ``plan_cache=True`` to both; the pool's face
    keeps and reads plans, so that needs CuPy).
    """
    def make(capacity: int | None = None):
        from . import hosts

        settings = {"replan": "background", "method": "best", "plan_cache": False, **options}
        if has_cupy():
            return hosts.host_pool(capacity, **settings)
        return hosts.host_engine(capacity, **settings)

    return make


def second_run(run: Run, make: PoolMaker, *, step_seconds: float = 0.0) -> tuple[Footprint,
                                                                                  Footprint]:
    """``run`` twice, the second pool started from the plans the first kept (the plan cache,
    :mod:`pgmo.plan_cache`, in a temporary folder of its own: the user's is never touched):
    the first run's footprint and the second's.  ``make`` makes pools with
    ``plan_cache=True`` (which needs CuPy: the pool's face keeps the plans)."""
    import os
    import tempfile
    import threading

    from ..plan_cache import ENV

    before = os.environ.get(ENV)
    with tempfile.TemporaryDirectory(prefix="pgmo-second-run-") as folder:
        os.environ[ENV] = folder
        try:
            found = []
            for _ in range(2):
                pool = make(None)
                found.append(measure(run, pool, step_seconds=step_seconds))
                pool.close()
                for thread in threading.enumerate():  # plans still being written
                    if thread.name == "pgmo-save-plan":
                        thread.join()
                del pool
                gc.collect()
        finally:
            if before is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = before
    return found[0], found[1]


def has_cupy() -> bool:
    """Whether CuPy is installed (the pool's face needs it; the engine does not)."""
    return importlib.util.find_spec("cupy") is not None


def _device(pool: Any) -> HostMemory:
    return getattr(pool, "host_device", None) or pool.memory


@dataclass
class Footprint:
    """One replay of a run: what the device lent at its peak and at every event."""

    completed: bool
    peak: int  # most bytes held at once
    held: list[int] = field(repr=False, default_factory=list)  # most held during each event
    corrupted: int = 0
    error: str = ""
    seconds: float = 0.0
    stats: Any = field(repr=False, default=None)
    #: Per iteration: calls that waited for the device (cudaFree, device or stream syncs)
    #: inside it, and at the boundary after it (its end, the next one's begin and anything
    #: between), as the device counts them (``HostMemory.sync_calls``).
    syncs_inside: list[int] = field(repr=False, default_factory=list)
    syncs_boundary: list[int] = field(repr=False, default_factory=list)
    #: The same for the calls that gave memory back without a wait of their own (an unmap
    #: per mapping, a pool's trim; ``HostMemory.release_calls``).
    releases_inside: list[int] = field(repr=False, default_factory=list)
    releases_boundary: list[int] = field(repr=False, default_factory=list)
    #: Per iteration: requests, and those that reached the raw allocator (cudaMalloc).
    requests: list[int] = field(repr=False, default_factory=list)
    raw_allocations: list[int] = field(repr=False, default_factory=list)
    #: Per iteration run: whether a plan served it (the engine's ``served_by_plan``, read
    #: after its end; for a run cut short, the open iteration's so far); empty for a pool
    #: that plans nothing (CuPy's).
    served: list[bool] = field(repr=False, default_factory=list)
    #: The most held during the iterations no plan served (and before the first iteration),
    #: and during those a plan served, each iteration with the boundary after it: the
    #: larger of the two is :attr:`peak`.  None for a kind the run had none of, and both
    #: None for a pool that plans nothing or a measurement without a ``timeline``.
    peak_unplanned: int | None = None
    peak_planned: int | None = None

    def most_syncs_inside(self, after: int = 0) -> int:
        """The most synchronizing calls inside one iteration, from iteration ``after`` on."""
        return max(self.syncs_inside[after:], default=0)

    def most_syncs_at_a_boundary(self) -> int:
        return max(self.syncs_boundary, default=0)

    def most_releases_at_a_boundary(self) -> int:
        return max(self.releases_boundary, default=0)

    def raw_share(self, after: int = 5) -> float:
        """The share of requests after iteration ``after`` that reached the raw allocator."""
        requests = sum(self.requests[after:])
        return sum(self.raw_allocations[after:]) / requests if requests else 0.0


def measure(run: Run, pool: Any, *, timeline: bool = True, step_seconds: float = 0.0,
            write: bool | str = "ends") -> Footprint:
    """Replay ``run`` through ``pool`` (on a host device), checking every block.

    ``timeline``: record the most bytes held during each event (for the
    moment-by-moment comparison); ``step_seconds``: time each iteration
    takes besides allocating (a background planner works meanwhile);
    ``write``: which bytes of each block carry a pattern checked at its free
    (:class:`pgmo.measure.replay.Checker`).  By default both ends of every block
    are stamped: writing every byte made a ResNet-50 run's replay 200 times
    slower (108 s instead of 0.5 s) and touched 4.8 GB of host memory,
    while address checks cover every byte either way.  A run that runs out
    of memory is not completed.  With a ``timeline``, on a pgmo pool, the peak
    is also split between the iterations no plan served and those a plan
    served (:attr:`Footprint.peak_unplanned`, :attr:`Footprint.peak_planned`).
    """
    from .replay import replay_run

    device = _device(pool)
    device.reset_peak()
    held: list[int] = []
    served: list[bool] = []
    engine = getattr(pool, "engine", pool)  # the pool's engine, or the engine alone
    plans = hasattr(type(engine), "served_by_plan")
    kinds = [kind for kind, _ in run.events()]
    n = len(run.iterations)
    counts = {"inside": [0] * n, "boundary": [0] * n, "requests": [0] * n, "raw": [0] * n,
              "released inside": [0] * n, "released at boundary": [0] * n}
    where = {"iteration": -1, "inside": False, "syncs": device.sync_calls,
             "mallocs": device.allocations, "releases": device.release_calls}

    def on_event(k: int) -> None:
        if timeline:
            held.append(device.peak)
            device.reset_peak()
        kind = kinds[k]
        syncs, mallocs = device.sync_calls - where["syncs"], device.allocations - where["mallocs"]
        releases = device.release_calls - where["releases"]
        where["syncs"], where["mallocs"] = device.sync_calls, device.allocations
        where["releases"] = device.release_calls
        it = where["iteration"]
        if kind == "begin":
            where["iteration"] = it = it + 1
            where["inside"] = True
            if it > 0:
                counts["boundary"][it - 1] += syncs
                counts["released at boundary"][it - 1] += releases
        elif kind == "end":
            where["inside"] = False
            if plans:
                served.append(engine.served_by_plan)
            counts["boundary"][it] += syncs
            counts["released at boundary"][it] += releases
            if step_seconds:
                time.sleep(step_seconds)
        elif where["inside"]:
            counts["inside"][it] += syncs
            counts["released inside"][it] += releases
            counts["raw"][it] += mallocs
            counts["requests"][it] += kind == "alloc"
        elif it >= 0:
            counts["boundary"][it] += syncs
            counts["released at boundary"][it] += releases

    started = time.perf_counter()
    try:
        result = replay_run(run, pool, write=write, on_event=on_event)
    except MemoryError as e:
        if plans and where["inside"]:
            served.append(engine.served_by_plan)  # the iteration cut short, so far
        unplanned, planned = _split_peaks(held, kinds, served, device.peak, timeline)
        return Footprint(False, max([*held, device.peak]), held, 0, str(e),
                         time.perf_counter() - started, served=served,
                         peak_unplanned=unplanned, peak_planned=planned)
    seconds = time.perf_counter() - started
    bad = result["corrupted"] + result["overlaps"]
    unplanned, planned = _split_peaks(held, kinds, served, device.peak, timeline)
    return Footprint(bad == 0, max([*held, device.peak]), held, bad,
                     f"{bad} blocks corrupted" if bad else "", seconds, result["stats"],
                     syncs_inside=counts["inside"], syncs_boundary=counts["boundary"],
                     releases_inside=counts["released inside"],
                     releases_boundary=counts["released at boundary"],
                     requests=counts["requests"], raw_allocations=counts["raw"],
                     served=served, peak_unplanned=unplanned, peak_planned=planned)


def _split_peaks(held: list[int], kinds: list[str], served: list[bool], tail: int,
                 timeline: bool) -> tuple[int | None, int | None]:
    """(the most held in the iterations no plan served, in those a plan served): each
    event counts for the iteration it belongs to (from its begin to the next one's; the
    events before the first iteration count as unplanned), the bytes held after the last
    event for the last."""
    if not timeline or not served:
        return None, None
    peaks: dict[bool, int | None] = {False: None, True: None}
    it = -1
    for k, high in enumerate(held):
        if kinds[k] == "begin":
            it += 1
        if k == len(held) - 1:
            high = max(high, tail)
        kind = 0 <= it < len(served) and served[it]
        peaks[kind] = max(peaks[kind] or 0, high)
    if not held:
        peaks[False] = tail
    return peaks[False], peaks[True]


def completes(run: Run, make: PoolMaker, capacity: int, step_seconds: float = 0.0) -> bool:
    """Whether ``run`` completes (every block checked) on a fresh pool of ``capacity`` bytes."""
    pool = make(capacity)
    try:
        return measure(run, pool, timeline=False, step_seconds=step_seconds).completed
    finally:
        close = getattr(pool, "close", None)
        if close is not None:
            close()
        del pool
        gc.collect()


def smallest_capacity(run: Run, make: PoolMaker, low: int, high: int, *,
                      tolerance: float = 0.005, step_seconds: float = 0.0,
                      unit: int = 1) -> int | None:
    """The smallest device (bytes, within ``tolerance``) on which ``run`` completes.

    Searched between ``low`` (which must not complete, or is the answer) and
    ``high``; None when even ``high`` does not complete.  ``unit``: only
    devices of whole units are tried (``low`` rounded up to one, ``high``
    down), and the answer is one of them: with the device's page (2 MiB),
    the smallest device in whole pages, exactly when ``tolerance`` is 0.
    """
    if unit > 1:
        low, high = -(-low // unit) * unit, max(high // unit, 1) * unit
    if not completes(run, make, high, step_seconds):
        return None
    if low >= high:
        return high
    if completes(run, make, low, step_seconds):
        return low
    while high - low > max(512, tolerance * low, unit):
        mid = (low + high) // 2 // unit * unit
        if completes(run, make, mid, step_seconds):
            high = mid
        else:
            low = mid
    return high


def largest_scale(run: Run, make: PoolMaker, capacity: int, *, low: float = 0.25,
                  high: float = 4.0, tolerance: float = 0.01,
                  step_seconds: float = 0.0) -> float:
    """The largest activation scale (batch, relative) at which ``run`` completes on ``capacity``.

    0.0 when not even ``low`` completes.
    """
    if not completes(run.scaled(low), make, capacity, step_seconds):
        return 0.0
    if completes(run.scaled(high), make, capacity, step_seconds):
        return high
    while high - low > tolerance * low:
        mid = (low + high) / 2
        if completes(run.scaled(mid), make, capacity, step_seconds):
            low = mid
        else:
            high = mid
    return low


def physical_scale(run: Run, capacity: int, *, low: float = 0.25, high: float = 4.0,
                   tolerance: float = 0.001) -> float:
    """The largest activation scale whose physical limit fits ``capacity`` (no pool does better)."""
    if run.scaled(low).lower_bound_rounded() > capacity:
        return 0.0
    while high - low > tolerance * low:
        mid = (low + high) / 2
        if run.scaled(mid).lower_bound_rounded() <= capacity:
            low = mid
        else:
            high = mid
    return low


def moments_above(mine: list[int], theirs: list[int]) -> tuple[int, int]:
    """Events at which ``mine`` held more than ``theirs`` had held by then, and the worst excess.

    Both are bytes held per event of the same run (:attr:`Footprint.held`);
    CuPy's stock pool never gives memory back, so its most held so far is
    what it holds at that point.
    """
    moments = worst = high = 0
    for held, other in zip(mine, theirs):
        high = max(high, other)
        if held > high:
            moments += 1
            worst = max(worst, held - high)
    return moments, worst


def profiling_candidates(run: Run, iterations: int = 2) -> dict[str, int]:
    """Peak bytes held over the first ``iterations`` of ``run`` (warm-up and profiling),
    served by each allocator pgmo could profile with.

    ``stock``: CuPy's caching pool (pgmo before); ``exact``: an allocation per
    request (pgmo now): the live bytes; ``growing arena``: requests placed
    best-fit in an arena that grows by another segment of
    :data:`~pgmo.engine.memory.GROWTH` times its size when full (segments
    cannot merge without virtual memory mapping); ``expandable arena``: the
    same in one address range that grows in place (what CUDA's virtual
    memory management or cudaMallocAsync's pool allow): its high-water mark.
    """
    from ..engine.memory import GROWTH
    from ..placement import Placer

    end = run.iterations[iterations - 1][1] if len(run.iterations) >= iterations else None
    blocks = run.trace.blocks
    events = []
    for kind, i in run.events():
        b = blocks[i] if kind in ("alloc", "free") else None
        tick = None if b is None else (b.lower if kind == "alloc" else b.upper)
        if end is not None and tick is not None and tick >= end:
            continue
        if b is not None:
            events.append((kind, i, -(-b.size // 512) * 512))
    out = {"stock": footprint_of_stock(run, end)}
    live = peak = 0
    for kind, _, size in events:
        live += size if kind == "alloc" else -size
        peak = max(peak, live)
    out["exact"] = peak
    for name, expandable in (("growing arena", False), ("expandable arena", True)):
        segments: list[Placer] = [Placer(1 << 20, [])]
        where: dict[int, tuple[int, int]] = {}
        high = 0
        for kind, i, size in events:
            if kind == "free":
                k, lo = where.pop(i)
                segments[k].release(lo, lo + size)
                continue
            for k, seg in enumerate(segments):
                lo = seg.place(size)
                if lo >= 0:
                    where[i] = (k, lo)
                    break
            else:
                if expandable:  # grow the one range in place: its tail becomes free
                    seg = segments[0]
                    grow = max(size, int(seg.size * (GROWTH - 1)))
                    seg.release(seg.size, seg.size + grow)
                    seg.size += grow
                    where[i] = (0, seg.place(size))
                else:
                    seg = Placer(max(size, int(sum(s.size for s in segments) * (GROWTH - 1))),
                                 [])
                    segments.append(seg)
                    where[i] = (len(segments) - 1, seg.place(size))
            high = max(high, sum(s.size for s in segments))
        out[name] = high
    return out


def footprint_of_stock(run: Run, end: int | None) -> int:
    """CuPy's pool's peak over the run's events before tick ``end``."""
    pool = stock_pool()
    blocks, live = run.trace.blocks, {}
    for kind, i in run.events():
        if kind not in ("alloc", "free"):
            continue
        b = blocks[i]
        tick = b.lower if kind == "alloc" else b.upper
        if end is not None and tick is not None and tick >= end:
            continue
        if kind == "alloc":
            live[i] = pool.malloc(b.size)
        else:
            del live[i]
    return pool.memory.peak
