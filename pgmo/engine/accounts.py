"""What the device memory holds, counted, and what troubles it had: rule 5 of :mod:`.memory`.

:class:`~.memory.DeviceMemory` is built on this: its state is declared here
once (each field set in its ``__init__``), with what every part reads of it:
the bytes held per source (``total_bytes() = arenas + heaps + the stock
pool's total``: rule 5), the limit and the peak, the release budget of a
boundary and its device sync (rule 4), and the troubles rule 7 reports.
:class:`RawListener` tells the memory when the stock pool took memory.
Tested in ``tests/test_memory.py`` and, by the bytes of whole runs, in
``tests/test_footprint.py``.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Callable

from ..errors import DeviceError
from .frees import KEPT, Arena

if TYPE_CHECKING:
    from ..placement import Placer
    from .handout import HotPath
    from .kept import KeptBuffers
    from .options import Buffer, ReservedRange, StockPool, StreamHeap

__all__ = ["MemoryAccounts", "RawListener", "NOT_GIVEN_BACK"]

log = logging.getLogger("pgmo.pool")

#: What a call that gives memory back may raise when the driver refuses it: nothing given
#: back, whatever the code (rule 7).
NOT_GIVEN_BACK = (DeviceError, MemoryError)


class MemoryAccounts:
    """The device memory's state, its byte counts and its troubles (see the module's
    docstring); :class:`~.memory.DeviceMemory` sets every field."""

    hot: HotPath  # the hot path: the current arena, live blocks, counters
    allocate: Callable[[int], Buffer]  # the raw allocator (cudaMalloc)
    stock: StockPool  # CuPy's stock pool
    oom_error: Callable[[int, int, int], BaseException]  # a full device's error
    _reserve: Callable[[int | None], ReservedRange] | None  # None: no (more) reserved arena
    _make_heap: Callable[[], StreamHeap] | None  # the driver's stream-ordered pool, or None
    _own_heap: bool  # the heap is pgmo's own (see .own_heap)
    _pages: bool  # and it is the page heap (see .page_heap)
    _heap_reserve: Callable[[int | None], ReservedRange] | None  # the own heap's range
    _stream: Callable[[], object] | None  # names the current stream
    device_memory: int  # the device's size (what a reservation spans)
    range: ReservedRange | None  # the reserved range (taken at the first arena)
    heap: StreamHeap | None  # the heap that serves now (made at its first request)
    _old_heaps: list[StreamHeap]  # heaps left behind (rule 7) with blocks in them
    arenas: set[Arena]  # the current arena and old ones with live blocks
    blocked: bool  # the last arena was refused: wait for memory to free up
    failures: int  # arenas refused
    wanted: int  # the least arena size: what placing an iteration off plan needed
    planned: int  # the arena the plans in use need (a reserved arena keeps that much)
    placer: Placer | None  # places a departed iteration in the arena's gaps
    holes: dict[int, int]  # the reserved arena's mappings unmapped in its middle (rule 6)
    limit: int  # 0: none
    peak_total: int  # most bytes held at once
    releases: int  # boundary releases (a device sync and one release call each)
    _released_at: int  # the boundary (iteration number) of the last release
    _refused_total: int  # bytes held when the device last refused an arena
    kept: KeptBuffers  # survivors' buffers (see .kept)
    reasons: dict[str, str]  # why a part does not use what the device offers (rule 7)
    _states: dict[str, str]  # passing troubles, each logged once while it lasts

    def make_room(self, collect: bool = True) -> None:
        """Rule 6 (:meth:`.memory.DeviceMemory.make_room`)."""
        raise NotImplementedError

    def _on_range(self, arena: Arena) -> bool:
        return self.range is not None and arena.buffer is self.range

    def _fall_back(self, part: str, why: str) -> None:
        """Rule 7: ``part`` ("arena" or "heap") uses cudaMalloc from now on."""
        self.reasons[part] = why
        log.warning("pgmo's %s uses cudaMalloc from now on: %s", part, why)

    def _trouble(self, state: str, message: str, *args: object) -> None:
        """A passing trouble (an arena refused, a release skipped): logged when it starts."""
        if state not in self._states:
            log.warning(message, *args)
        self._states[state] = message % args if args else message

    def _cleared(self, state: str) -> None:
        self._states.pop(state, None)

    def troubles(self) -> dict[str, str]:
        """Passing troubles now, and parts that fell back for good (part -> why)."""
        return {**self.reasons, **self._states}

    def _heaps(self) -> list[StreamHeap]:
        heaps = self._old_heaps
        if heaps:
            heaps = self._old_heaps = [h for h in heaps if h.held]
        return heaps + [self.heap] if self.heap is not None else heaps

    def _may_release(self) -> bool:
        """Whether this boundary may still give memory back (one release each, rule 4)."""
        boundary = self.hot.iteration
        if self._released_at == boundary:
            return False
        self._released_at = boundary
        self.releases += 1
        return True

    def _sync(self) -> bool:
        """Wait for the whole device before memory a kernel may use goes back (rule 4);
        False when the device cannot be waited for (then nothing goes back)."""
        try:
            if self.range is not None:
                self.range.synchronize()
            elif self._old_heaps:  # (rule 7) a cudaMalloc per request's sync waits for nothing
                self._old_heaps[0].synchronize()
            elif self.heap is not None:
                self.heap.synchronize()
            self._cleared("sync")
            return True
        except NOT_GIVEN_BACK as e:
            self._trouble("sync", "pgmo cannot wait for the device (%s); nothing is given back",
                          e)
            return False

    def note_reserved(self, uncounted: int = 0) -> None:
        """The memory held may have grown (by ``uncounted`` bytes not counted yet): its peak."""
        total = self.total_bytes() + uncounted
        if total > self.peak_total:
            self.peak_total = total

    def arena_total(self) -> int:
        """What the driver holds for the arenas (a reserved range: every mapping, also one a
        refused unmap left; rule 5)."""
        return sum(a.buffer.mapped if self._on_range(a) else a.size for a in self.arenas)

    def heap_total(self) -> int:
        """Bytes the heaps hold: the stream-ordered pool's backed memory, or the live blocks
        of their own."""
        return sum(h.held for h in self._heaps())

    def heap_used(self) -> int:
        """Bytes the live blocks of the heaps and of the stock pool hold (at a boundary:
        what outlives the iterations, weights say)."""
        return sum(h.used for h in self._heaps()) + self.stock.used_bytes()

    def kept_total(self) -> int:
        """Survivors' bytes: live, and idle buffers waiting for the next iteration."""
        return self.hot.source_bytes(KEPT) + self.kept.idle_bytes(self.hot.iteration)

    def own_free_bytes(self) -> int:
        """pgmo's idle bytes: arena room no live block uses, the heaps' idle memory, idle
        kept buffers."""
        heaps = self._heaps()
        heap_idle = sum(h.held - h.used for h in heaps)
        return self.arena_total() - self.hot.arena_used() + \
            self.kept.idle_bytes(self.hot.iteration) + heap_idle

    def total_bytes(self) -> int:
        return self.arena_total() + self.heap_total() + self.stock.total_bytes()

    def parts(self) -> dict[str, int]:
        """Bytes held, per source (what ``stats()`` reports; they add up to the total)."""
        arena = self.hot.arena
        current = 0
        if arena is not None:
            current = arena.buffer.mapped if self._on_range(arena) else arena.size
        kept = self.kept_total()
        return {"arena": current, "old_arenas": self.arena_total() - current,
                "exact": self.heap_total() - kept, "kept": kept,
                "stock": self.stock.total_bytes()}

    def free_gaps(self) -> int:
        """Free address ranges in the arenas, plus idle kept buffers and one for each heap
        holding idle memory (CuPy's free blocks)."""
        gaps = self.kept.idle_count() + sum(1 for h in self._heaps() if h.held > h.used)
        for arena in self.arenas:
            pos = 0
            for start, end in sorted(self.hot.live_spans(arena)):
                if start > pos:
                    gaps += 1
                pos = max(pos, end)
            if pos < arena.size:
                gaps += 1
        return gaps


class RawListener:
    """Tells a :class:`~.memory.DeviceMemory` that the stock pool took device memory
    (without keeping it alive).

    The stock pool's raw allocator calls it, so the peak of memory held is
    exact without asking the stock pool on every request.
    """

    __slots__ = ("_memory",)

    def __init__(self) -> None:
        self._memory: Callable[[], MemoryAccounts | None] = lambda: None

    def connect(self, memory: MemoryAccounts) -> None:
        self._memory = weakref.ref(memory)

    def __call__(self) -> None:
        memory = self._memory()
        if memory is not None:
            memory.note_reserved()
