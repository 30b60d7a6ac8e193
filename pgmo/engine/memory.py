"""Every byte of device memory the pool holds is obtained and released here.

pgmo exists to hold less device memory than CuPy's stock pool, so what it
holds is decided in one place, with its accounting.  Four sources:

``arena``
    One raw allocation of the plan's peak (:meth:`DeviceMemory.fit`); planned
    requests are carved from it.  It changes only at an iteration boundary.
``exact``
    A raw allocation per request, given back at its free
    (:meth:`DeviceMemory.exact`): the warm-up and profiled iterations, an
    iteration waiting for its plan, what of an iteration that left its plan
    finds no gap in the arena (:mod:`.placement`), and every iteration when
    no arena can be had.
``kept``
    Survivors (blocks the profile saw outlive their iteration: gradients, a
    kept loss) get a buffer of their own that, once freed, waits for the same
    size in the next iteration (:meth:`DeviceMemory.kept`).
``stock``
    CuPy's stock pool, for what lies outside every plan: requests between
    iterations, between ``interrupt()`` and ``resume()``, and from another
    thread, device or stream.

The footprint policy, and why:

1. **Cache nothing the plan does not need.**  A caching pool's profiled
   iteration costs its fragmented peak, and its cache then lives beside the
   arena (on the H100: 1.5x-1.8x CuPy's footprint).  Exact blocks follow the
   live bytes; the measurements of the alternatives are in
   ``docs/footprint.md``.
2. **Release before taking.**  At a boundary an idle arena is given back
   before the next one is taken; as an iteration begins, survivors' buffers
   idle for a whole iteration and the stock pool's free blocks (what was
   used between iterations: it would sit beside the arena) are given back.
3. **One arena, grown by a factor.**  A replaced arena lives only while
   blocks live in it; it is given back when its last block is freed.  When
   the workload varies (iterations of other shapes, placed in the arena's
   gaps) an arena that must grow, or whose gaps overflowed, grows by
   :data:`GROWTH` at least, so that it does not change at every boundary.
4. **Room when full.**  When the device or the limit refuses an allocation,
   idle memory (dead blocks, idle kept buffers, the stock pool's free
   blocks) is given back and the allocation tried once more; then CuPy's
   ``OutOfMemoryError``, with the numbers.
5. **Count every byte.**  ``total_bytes() = arenas + exact blocks + kept
   buffers (live and idle) + the stock pool's total``; the limit caps that
   sum for every source, and the peak is updated wherever it grows.
"""

from __future__ import annotations

import collections
import gc
import logging
import weakref
from typing import Any, Callable

from ..units import round_size
from .frees import EXACT, KEPT, Arena
from .handout import NO_SLOT, HotPath
from .placement import Placer

__all__ = ["DeviceMemory", "RawListener", "GROWTH"]

log = logging.getLogger("pgmo.pool")

#: How much an arena grows, at least, when a varying workload outgrows it.
GROWTH = 1.1


class _KeptBlock:
    """A survivor's buffer lent out; its death puts the buffer back for the next iteration."""

    __slots__ = ("ptr", "size", "_buffer", "_returned")

    def __del__(self):
        self._returned.append(self._buffer)


class DeviceMemory:
    """The arenas, the exact blocks, the survivors' buffers and the stock pool, counted."""

    def __init__(self, hot: HotPath, allocate: Callable[[int], Any], stock: Any,
                 oom_error: Callable[[int, int, int], BaseException]):
        """``allocate(size)``: the raw allocator (cudaMalloc; MemoryError when full);
        ``stock``: CuPy's pool; ``oom_error(size, total, limit)``: a full device's error."""
        self.hot = hot
        self.allocate = allocate
        self.stock = stock
        self.oom_error = oom_error
        self.arenas: set[Arena] = set()  # the current arena and old ones with live blocks
        self.blocked = False  # the last arena was refused: wait for memory to free up
        self.failures = 0  # arenas refused
        self.wanted = 0  # the least arena size: what placing an iteration off plan needed
        self.placer: Placer | None = None
        self.limit = 0  # 0: none
        self.peak_total = 0  # most bytes held at once
        self._idle_kept: dict[int, list[tuple[Any, int]]] = {}  # size -> (buffer, stamp)
        self._idle_kept_bytes = 0
        self._returned: collections.deque = collections.deque()  # kept buffers freed

    # ------------------------------------------------------------ raw memory
    def raw(self, size: int) -> Any:
        """A raw allocation of ``size`` bytes within the limit, making room once if refused."""
        if self.limit and self.total_bytes() + size > self.limit:
            self.make_room()
            if self.total_bytes() + size > self.limit:
                raise self.oom_error(size, self.total_bytes(), self.limit)
        try:
            buffer = self.allocate(size)
        except MemoryError:
            self.make_room()
            try:
                buffer = self.allocate(size)
            except MemoryError:
                raise self.oom_error(size, self.total_bytes(), self.limit) from None
        # Not counted anywhere yet (its block, kept buffer or arena comes next): add it.
        self.note_reserved(size)
        return buffer

    def exact(self, rs: int) -> Any:
        """A block's own memory, given back at its free (the block's owner keeps it)."""
        return self.raw(rs)

    def reuse(self, rs: int) -> Any:
        """A block of the stock pool's idle memory, if it holds ``rs`` bytes without growing.

        Idle memory is used before new memory is taken (policy 1): a chunk the
        stock pool could not give back (split by a block still alive there)
        serves a request of its own instead of sitting beside it.
        """
        stock = self.stock
        if not stock.n_free_blocks() or stock.free_bytes() < rs:
            return None
        limit = stock.get_limit()
        stock.set_limit(size=max(1, stock.total_bytes()))  # no growth: cached memory only
        try:
            return stock.malloc(rs)
        except MemoryError:
            return None
        finally:
            stock.set_limit(size=limit)

    def kept(self, rs: int) -> _KeptBlock:
        """A survivor's buffer: an idle one of this size, else a new one."""
        self._collect_kept()
        idle = self._idle_kept.get(rs)
        if idle:
            buffer, _ = idle.pop()
            self._idle_kept_bytes -= rs
        else:
            buffer = self.raw(rs)
        block = _KeptBlock()
        block.ptr, block.size, block._buffer, block._returned = (
            buffer.ptr, rs, buffer, self._returned)
        return block

    def _collect_kept(self) -> None:
        returned = self._returned
        stamp = self.hot.iteration
        while returned:
            buffer = returned.popleft()
            self._idle_kept.setdefault(buffer.size, []).append((buffer, stamp))
            self._idle_kept_bytes += buffer.size

    def _release_kept(self, before: int | None = None) -> None:
        """Give back idle kept buffers (those freed before iteration ``before``; None: all)."""
        self._collect_kept()
        for size in list(self._idle_kept):
            keep = [(b, s) for b, s in self._idle_kept[size] if before is not None and s >= before]
            self._idle_kept_bytes -= size * (len(self._idle_kept[size]) - len(keep))
            if keep:
                self._idle_kept[size] = keep
            else:
                del self._idle_kept[size]

    def from_stock(self, size: int, rs: int) -> Any:
        """A stock pool block within the limit, after making room if refused."""
        if self.limit:
            self.sync_stock_limit()
        try:
            return self.stock.malloc(size)
        except MemoryError:
            self.make_room()
            if self.limit:
                self.sync_stock_limit()
            try:
                return self.stock.malloc(size)
            except MemoryError:
                raise self.oom_error(rs, self.total_bytes(), self.limit) from None

    def make_room(self, collect: bool = True) -> None:
        """Give back what is idle: dead blocks (frees applied), kept buffers, stock blocks."""
        if collect:
            gc.collect()
        self.hot.drain()
        self._release_kept()
        self.stock.free_all_blocks()

    # ---------------------------------------------------------------- arenas
    def fit(self, size: int, varying: bool = False) -> bool:
        """Make the current arena right for a plan of ``size`` bytes; True when it changed.

        ``varying``: the plan grew because the workload varies; an arena that
        must grow then grows by :data:`GROWTH` at least, and keeps that
        headroom while later plans fit in it.
        """
        hot = self.hot
        if varying and size > 0:  # what placing a varying iteration needed, at least
            size = max(size, self.wanted)
        arena = hot.arena
        old = arena.size if arena is not None else 0
        if arena is not None:
            roomy = varying and size <= arena.size <= size * GROWTH
            if arena.size == size or roomy or (arena.size > size and arena.overdue):
                return False
            self.drop()
        arena = None  # no reference of ours keeps a dropped arena alive
        if size <= 0 or self.blocked:
            return old != 0
        target = size
        if varying and old and size > old:
            target = max(size, round_size(int(old * GROWTH)))
        taken = self._take(target)
        if taken is None and target > size:
            taken = self._take(size)
        hot.set_arena(taken)
        return True

    def drop(self) -> None:
        """Forget the current arena; given back now if idle, else when its last block is freed."""
        hot = self.hot
        hot.retire()
        arena = hot.arena
        hot.set_arena(None)
        if arena is not None and not arena.overdue:
            self.arenas.discard(arena)

    def released(self, arena: Arena) -> None:
        """An old arena's last block was freed: let its memory go."""
        self.arenas.discard(arena)

    def _take(self, size: int) -> Arena | None:
        self.release_cached()  # what is idle goes first (policy 2)
        try:
            buffer = self.raw(size)
        except MemoryError as e:
            self.failures += 1
            self.blocked = True
            log.warning("pgmo cannot allocate a %d-byte arena (%s); serving each request "
                        "from memory of its own", size, e)
            return None
        arena = Arena(buffer, size)
        self.arenas.add(arena)
        self.blocked = False  # a smaller arena, taken after a larger one was refused
        return arena

    def start_placing(self, apart: frozenset = frozenset()) -> None:
        """The iteration left its plan: place the rest of it in the arena's gaps, but for
        requests of the sizes ``apart`` (survivors'), which get kept buffers."""
        hot = self.hot
        arena = hot.arena
        if arena is None:
            return
        self.placer = Placer(arena.size, self._live_spans(arena), apart)
        hot.set_placer(self.placer)

    def stop_placing(self) -> None:
        """The iteration ended: an arena whose gaps it overflowed grows at the next boundary
        (when the workload varies; otherwise its next plan covers it)."""
        placer, self.placer = self.placer, None
        arena = self.hot.arena
        if placer is not None and placer.overflowed and arena is not None:
            self.wanted = max(self.wanted, round_size(int(arena.size * GROWTH)))

    # ------------------------------------------------------------ boundaries
    def release_cached(self) -> None:
        """Give back survivors' buffers idle for a whole iteration and the stock pool's free
        blocks (those of a whole allocation): as an iteration begins, and before an arena
        is taken (policy 2).

        The stock pool serves nothing inside an iteration but interruptions
        and other threads, so its free blocks would only sit beside the arena.
        """
        self._release_kept(before=self.hot.iteration)
        if self.stock.n_free_blocks():
            self.stock.free_all_blocks()

    def release_idle(self, arena_too: bool) -> None:
        """``free_all_blocks``: every idle byte goes back; the current arena too if idle."""
        self.make_room(collect=False)
        arena = self.hot.arena
        if arena_too and arena is not None and self.hot.arena_idle(arena):
            self.drop()
        self.blocked = False

    # ----------------------------------------------------------------- bytes
    def set_limit(self, size: int) -> None:
        self.limit = int(size)
        self.blocked = False
        self.hot.set_limited(self.limit > 0)
        self.sync_stock_limit()

    def sync_stock_limit(self) -> None:
        """The stock pool may use what the limit leaves after pgmo's own memory."""
        if self.limit == 0:
            self.stock.set_limit(size=0)
        else:
            own = self.total_bytes() - self.stock.total_bytes()
            self.stock.set_limit(size=max(1, self.limit - own))

    def note_reserved(self, uncounted: int = 0) -> None:
        """The memory held may have grown (by ``uncounted`` bytes not counted yet): its peak."""
        total = self.total_bytes() + uncounted
        if total > self.peak_total:
            self.peak_total = total

    def arena_total(self) -> int:
        return sum(a.size for a in self.arenas)

    def kept_total(self) -> int:
        self._collect_kept()
        return self.hot.source_used[KEPT] + self._idle_kept_bytes

    def own_free_bytes(self) -> int:
        """pgmo's idle bytes: arena room no live block uses, idle kept buffers."""
        self._collect_kept()
        return self.arena_total() - self.hot.arena_used() + self._idle_kept_bytes

    def total_bytes(self) -> int:
        hot = self.hot
        return (self.arena_total() + hot.source_used[EXACT] + self.kept_total()
                + self.stock.total_bytes())

    def parts(self) -> dict[str, int]:
        """Bytes held, per source (what ``stats()`` reports)."""
        arena = self.hot.arena
        return {"arena": arena.size if arena is not None else 0,
                "old_arenas": self.arena_total() - (arena.size if arena is not None else 0),
                "exact": self.hot.source_used[EXACT], "kept": self.kept_total(),
                "stock": self.stock.total_bytes()}

    def _live_spans(self, arena: Arena) -> list[tuple[int, int]]:
        """``(start, end)`` of every block alive in ``arena``: overdue, or in its planned slot."""
        spans = [(start, end) for start, end, _ in arena.overdue.values()]
        hot = self.hot
        if arena is hot.arena:
            rows = hot.rows
            spans += [(rows[j][1], rows[j][1] + rows[j][0])
                      for j, it in enumerate(hot.slot) if it != NO_SLOT]
        return spans

    def free_gaps(self) -> int:
        """Free address ranges in the arenas, plus idle kept buffers (CuPy's free blocks)."""
        gaps = sum(len(v) for v in self._idle_kept.values())
        for arena in self.arenas:
            pos = 0
            for start, end in sorted(self._live_spans(arena)):
                if start > pos:
                    gaps += 1
                pos = max(pos, end)
            if pos < arena.size:
                gaps += 1
        return gaps


class RawListener:
    """Tells a :class:`DeviceMemory` that the stock pool took device memory, without keeping it.

    The stock pool's raw allocator calls it, so the peak of memory held is
    exact without asking the stock pool on every request.
    """

    __slots__ = ("_memory",)

    def __init__(self) -> None:
        self._memory: Callable[[], DeviceMemory | None] = lambda: None

    def connect(self, memory: DeviceMemory) -> None:
        self._memory = weakref.ref(memory)

    def __call__(self) -> None:
        memory = self._memory()
        if memory is not None:
            memory.note_reserved()
