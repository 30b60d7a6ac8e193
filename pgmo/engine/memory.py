"""Every byte of device memory the pool holds is obtained and released here.

pgmo exists to hold less device memory than CuPy's stock pool, and to cost
the GPU no synchronization for it, so what it holds, and when it gives
memory back, is decided in one place, with its accounting.  Four sources:

``arena``
    Planned requests are carved from it at their planned offsets; what of a
    departed iteration fits in its gaps is placed there (:mod:`.placement`).
    Where the device has virtual memory management (``Backend.reserve``), it
    is **one reserved address range per pool**, backed by physical memory as
    it grows and trimmed at its end: offsets stay valid, there is never a
    second arena nor a copy.  Elsewhere it is one raw allocation
    (cudaMalloc) of the plan's size, replaced when a plan needs more.
``heap``
    Memory of a block's own, for the requests no plan covers: the warm-up
    and profiled iterations, an iteration waiting for its plan, survivors
    (blocks that outlive their iteration), and what finds no room in an
    arena that cannot grow.  From pgmo's page heap (:mod:`.page_heap`, the
    default) or own heap (:mod:`.own_heap`, ``heap="own"``) in a
    reserved range of their own where the device has virtual memory; else
    from a private stream-ordered pool (``Backend.heap``:
    cudaMallocFromPoolAsync / cudaFreeAsync) when the device has one; else
    a raw allocation per request (:mod:`.raw_heap`, whose cudaFree waits
    for the device).  See :mod:`.heap_choice`.
``kept``
    Survivors get a buffer of their own (from the heap) that, once freed,
    waits for the same size in the next iteration (:mod:`.kept`).
``stock``
    CuPy's stock pool, for what lies outside every plan: requests between
    iterations, between ``interrupt()`` and ``resume()``, and from another
    thread, device or stream.

The decisions are written here, each under its rule below; the mechanisms
they use are :class:`DeviceMemory`'s bases, each in a module of its own:
:mod:`.reserved_arena` (the arena on a reserved range), :mod:`.heap_choice`
(which heap serves), :mod:`.stock_use` (CuPy's stock pool within the limit)
and :mod:`.accounts` (the state, every byte counted, the troubles reported).
Tested in ``tests/test_memory.py`` (the rules against the code, and what a
run does not show by its bytes), ``tests/test_engine_arenas.py``, and by the
bytes of whole runs in ``tests/test_footprint.py``.

The footprint policy, and why:

1. **Hold near the live bytes while profiling.**  A caching pool's
   profiled iteration costs its fragmented peak, and its cache then lives
   beside the arena (on the H100, 2026-11-25: 1.5x-1.8x CuPy's footprint).
   The heap places blocks as they come and keeps freed memory for reuse,
   without a device sync; its idle memory goes back at boundaries (rule 4).
   The page heap (the default, :mod:`.page_heap`) maps wholly free pages again where
   blocks need memory, holding the pages with live bytes; old mappings go at boundaries.
2. **No device sync inside an iteration.**  cudaFree and unmapping wait for
   (or must follow) every queued kernel: inside an iteration pgmo calls
   neither (blocks are freed into the heap or the arena, and the arena grows
   by mapping, which waits for nothing); only a device that is full makes it
   give memory back mid-iteration (rule 6).
3. **One arena, grown in place.**  A plan that needs more, or a departed
   iteration that finds no gap, maps more memory at the arena's end (in
   mappings of about 1/32 of the arena, :data:`MAPPING_MAX` at most, so that
   the end can be trimmed finely; access is granted once per growth; a
   departed iteration grows it by :data:`GROW_STEP` of its size at least).
   Without virtual memory, an arena that must grow is replaced: the old one
   lives only while blocks live in it, and when the device refuses the new
   one the pool keeps the old one (it never drops an arena it cannot
   replace); a varying workload's arena then grows by :data:`GROWTH` at
   least, so that it does not change at every boundary.
4. **Give back at boundaries, at most one release each, after a device
   sync.**  As an iteration ends, memory nothing needs goes back with one
   device-wide sync (an array of the arena may be in use by a kernel on any
   stream, and neither ``cuMemUnmap`` nor ``cudaMemPoolTrimTo`` waits for
   it) and one release.  With a plan (:meth:`DeviceMemory.fit`), on a
   reserved arena: the heap's wholly free chunks (``cudaMemPoolTrimTo``)
   before the arena grows; else the arena's end beyond the plan and its live
   blocks (``cuMemUnmap`` of whole mappings) when it is :data:`TRIM_SLACK` or
   more above what is needed (not below what an iteration that just left its
   plan grew it to: the next one, awaiting the plan, would map it again);
   else the heap's free chunks when they are :data:`HEAP_SLACK` or more of
   what is held (a cudaMalloc arena that must change is replaced instead,
   the idle one given back first: rule 3).
   While a plan is awaited
   (:meth:`DeviceMemory.awaiting_plan`): the heap's free chunks, the same
   share, only when the iterations waiting for it vary (a late plan then
   costs no more than they need); iterations that repeat reuse the heap's
   memory as it lies, as trimming it would cost them more.  Survivors' idle
   buffers and the stock pool's free blocks go back as the next iteration
   begins.
5. **Count every byte.**  ``total_bytes() = arenas (what the driver holds for
   them) + heaps + the stock pool's total``; the limit caps that sum for
   every source, and the peak is updated wherever it grows.
6. **Room when full.**  When the device or the limit refuses memory, idle
   memory (dead blocks, idle kept buffers, the heap's free chunks, the
   stock pool's free blocks, the arena's unused end) is given back and the
   request tried once more; then CuPy's ``OutOfMemoryError``, with the
   numbers.  Inside an iteration that left its plan, a reserved arena's free
   middle goes back too: each mapping that lies wholly in a gap is unmapped
   (a *hole*, in which nothing is placed), as a caching pool frees its free
   chunks; the holes are mapped again as the iteration ends, and no plan is
   followed in the arena while one is left (its iterations are placed in its
   gaps, around the holes, until the device has room again).
7. **A driver that says no costs a fallback, never a stuck pool.**  A call
   that fails for another reason than a full device
   (:class:`~pgmo.errors.DeviceError`: NOT_SUPPORTED under a container, say)
   switches that part to cudaMalloc for good: the reserved range to
   cudaMalloc arenas, the stream-ordered pool to a cudaMalloc per request
   (what lives in the old one stays until freed); a release the driver
   refuses is skipped, and what it could not give back stays counted; a
   mapping a refused call left where the arena maps next is unmapped first
   (after a device sync), or the arena maps nothing over it.  The
   reason is in ``stats().device_reasons`` and ``memory_summary()``, and
   logged once per change of state, not once per boundary.
"""

from __future__ import annotations

import gc
from typing import Callable

from ..errors import DeviceError
from ..placement import Placer
from ..units import round_size
from .accounts import MemoryAccounts, RawListener
from .frees import EXACT, STOCK, Arena
from .handout import HotPath
from .heap_choice import HeapChoice
from .kept import KeptBuffers
from .options import Buffer, ReservedRange, StockPool, StreamHeap
from .reserved_arena import ReservedArena
from .stock_use import StockUse

__all__ = ["DeviceMemory", "RawListener", "GROWTH", "MAPPING_MAX", "TRIM_SLACK"]

#: How much a cudaMalloc arena grows, at least, when a varying workload outgrows it.
GROWTH = 1.1
#: The most bytes one mapping of a reserved arena holds: its end is trimmed in these steps.
MAPPING_MAX = 64 << 20
#: The arena's end is trimmed when it holds this share more than its plan and live blocks need.
TRIM_SLACK = 0.02
#: The heap is trimmed at a boundary when its idle chunks are this share of what pgmo holds.
HEAP_SLACK = 0.02
#: A departed iteration grows a reserved arena by this share of its size at least.
GROW_STEP = 1 / 32


class DeviceMemory(ReservedArena, HeapChoice, StockUse, MemoryAccounts):
    """The arenas, the heap, the survivors' buffers and the stock pool, counted.

    The decisions are here, each under its rule; the mechanisms they use are
    its bases': :class:`~.reserved_arena.ReservedArena` (the reserved range's
    arena), :class:`~.heap_choice.HeapChoice` (which heap serves),
    :class:`~.stock_use.StockUse` (CuPy's stock pool) and
    :class:`~.accounts.MemoryAccounts` (the state, every byte counted, troubles).
    """

    def __init__(self, hot: HotPath, allocate: Callable[[int], Buffer], stock: StockPool,
                 oom_error: Callable[[int, int, int], BaseException],
                 reserve: Callable[[int | None], ReservedRange] | None = None,
                 heap: Callable[[], StreamHeap] | None = None, device_memory: int = 0,
                 reasons: dict[str, str] | None = None, own_heap: bool = True,
                 stream: Callable[[], object] | None = None, pages: bool = False):
        """``allocate(size)``: the raw allocator (cudaMalloc; MemoryError when full);
        ``stock``: CuPy's pool; ``oom_error(size, total, limit)``: a full device's error;
        ``reserve(size)``: a virtual address range (None: no virtual memory management);
        ``heap()``: the driver's private stream-ordered pool (None: none); ``own_heap``:
        the heap is pgmo's own (:mod:`.own_heap`; ``pages``: :mod:`.page_heap`) where there
        is virtual memory, else that pool, else a raw allocation per request; ``stream()``
        names the current stream (the own heap serves one at a time); ``device_memory``: the
        device's size (what a reservation spans); ``reasons``: why a part of the device
        layer is not used from the start (part -> why)."""
        self.hot = hot
        self.allocate = allocate
        self.stock = stock
        self.oom_error = oom_error
        self._reserve = reserve
        self._make_heap = heap
        self._own_heap = own_heap and reserve is not None
        self._pages = pages
        self._heap_reserve = reserve  # the own heap's (the arena's may be given up: rule 7)
        self._stream = stream
        self.device_memory = device_memory
        self.range: ReservedRange | None = None  # the reserved range (taken at the first arena)
        self.heap: StreamHeap | None = None  # the heap that serves now (made at its first request)
        self._old_heaps: list[StreamHeap] = []  # heaps left behind (rule 7) with blocks in them
        self.arenas: set[Arena] = set()  # the current arena and old ones with live blocks
        self.blocked = False  # the last arena was refused: wait for memory to free up
        self.failures = 0  # arenas refused
        self.wanted = 0  # the least arena size: what placing an iteration off plan needed
        self.planned = 0  # the arena the plans in use need (a reserved arena keeps that much)
        self.departed_end = 0  # how far the last iteration, off its plan, used the arena
        self.placer: Placer | None = None
        self.holes: dict[int, int] = {}  # start -> bytes: the arena's middle unmapped (rule 6)
        self.limit = 0  # 0: none
        self.peak_total = 0  # most bytes held at once
        self.releases = 0  # boundary releases (a device sync and one release call each)
        self._released_at = -1  # the boundary (iteration number) of the last release
        self._refused_total = 0  # bytes held when the device last refused an arena
        self.kept = KeptBuffers()
        #: Why a part does not use what the device offers (rule 7): part -> reason.
        self.reasons: dict[str, str] = dict(reasons or {})
        self._states: dict[str, str] = {}  # passing troubles, each logged once while it lasts

    # ------------------------------------------------------------ raw memory
    def _room_for(self, size: int) -> None:
        """Make sure ``size`` more bytes stay within the limit (making room once), or raise."""
        if self.limit and self.total_bytes() + size > self.limit:
            self.make_room()
            if self.total_bytes() + size > self.limit:
                raise self.oom_error(size, self.total_bytes(), self.limit)

    def _retrying(self, take: Callable[[], Buffer], size: int) -> Buffer:
        """``take()``; when the device refuses, make room and try once more, then OOM."""
        try:
            return take()
        except MemoryError:
            self.make_room()
            try:
                return take()
            except MemoryError:
                raise self.oom_error(size, self.total_bytes(), self.limit) from None

    def raw(self, size: int) -> Buffer:
        """A raw allocation of ``size`` bytes within the limit, making room once if refused."""
        self._room_for(size)
        buffer = self._retrying(lambda: self.allocate(size), size)
        # Not counted anywhere yet (its arena comes next): add it.
        self.note_reserved(size)
        return buffer

    def exact(self, rs: int) -> Buffer:
        """A block's own memory, from the heap, given back at its free (the owner keeps it)."""
        self._room_for(rs)
        while True:
            heap = self._heap()
            try:
                block = self._retrying(lambda: heap.malloc(rs), rs)
                break
            except DeviceError as e:  # rule 7: the stream-ordered pool said no
                self._heap_off(f"{e}")
        self.note_reserved()
        return block

    def between_iterations(self) -> tuple[Callable[[int], Buffer], int]:
        """What serves the owner's requests between iterations, and its source: the heap
        when it is pgmo's own or a stream-ordered pool (model weights made before the first
        iteration never sit in a cache whose release costs a cudaFree each), else the stock
        pool."""
        if self._own_heap or self._make_heap is not None:
            return self.exact, EXACT
        stock = self.stock
        return (lambda rs: stock.malloc(rs)), STOCK

    def lend_kept(self, rs: int) -> Buffer:
        """A survivor's buffer (see :mod:`.kept`)."""
        return self.kept.lend(rs, self.hot.iteration, take=self.exact)

    def make_room(self, collect: bool = True) -> None:
        """Give back what is idle: dead blocks (frees applied), kept buffers, the heap's free
        chunks, stock blocks, the arena's unused end (rule 6: a full device only)."""
        if collect:
            gc.collect()
        self.hot.drain()
        self.kept.release(self.hot.iteration)
        self.stock.free_all_blocks()
        if any(h.held > h.used for h in self._heaps()) and self._sync():
            for heap in self._heaps():
                self._trim(heap)
        arena = self.hot.arena
        if arena is not None and self._on_range(arena):
            # the arena's end beyond its plan and its live blocks (a departed iteration grew it)
            self._trim_range(arena, max(self.planned, self._live_end(arena)), budget=False)
            if self.placer is not None:  # a departed iteration: its free middle goes too
                self._give_back_middle(arena, self.placer)

    # ---------------------------------------------------------------- arenas
    def fit(self, size: int, varying: bool = False) -> bool:
        """Make the current arena right for a plan of ``size`` bytes; True when it changed.

        ``varying``: the plan grew because the workload varies (a cudaMalloc
        arena that must grow then grows by :data:`GROWTH` at least).
        """
        if self._reserve is not None:
            changed = self._fit_range(size)
            if self._reserve is not None:
                return changed
            # the driver refused the range (rule 7): a cudaMalloc arena from now on
        if self.holes:  # an arena with holes on a range the driver refused serves no plan
            self.drop()
        hot = self.hot
        if varying and size > 0:  # what placing a varying iteration needed, at least
            size = max(size, self.wanted)
        arena = hot.arena
        old = arena.size if arena is not None else 0
        if arena is not None:
            roomy = varying and size <= arena.size <= size * GROWTH
            if arena.size == size or roomy or (arena.size > size and arena.overdue):
                return False
        if size <= 0:
            if arena is not None:
                self.drop()
            return old != 0
        if self.blocked and arena is not None and self.total_bytes() >= self._refused_total:
            return False  # the last larger arena was refused, and nothing went back since
        target = size
        if varying and old and size > old:
            target = max(size, round_size(int(old * GROWTH)))
        if arena is not None and hot.arena_idle(arena):
            self.drop()  # idle: given back before the next one is taken (rule 4)
            arena = None
        taken = self._take(target)
        if taken is None and target > size:
            taken = self._take(size)
        if taken is None:
            if arena is not None:
                return False  # keep the arena we have rather than strand it
            if old:  # the idle one went back first: take its size again, to go on with it
                blocked, self.blocked = self.blocked, False
                taken = self._take(old)
                self.blocked = blocked or taken is None
            hot.set_arena(taken)
            return taken is None and old != 0
        if arena is not None:
            self.drop()  # lives on while its blocks do
        hot.set_arena(taken)
        self._cleared("arena refused")  # the plan's arena was had
        return True

    def drop(self) -> None:
        """Forget the current arena; given back now if idle, else when its last block is freed.

        A reserved arena is the pool's for good: what no live block needs of
        it is unmapped instead.
        """
        hot = self.hot
        hot.retire()
        arena = hot.arena
        if arena is not None and self._on_range(arena) and self._reserve is not None:
            self._trim_range(arena, self._live_end(arena), budget=False)
            return
        self.holes.clear()  # (a holed range arena is let go with its blocks)
        hot.set_arena(None)
        if arena is not None and not arena.overdue:
            self.released(arena)

    def released(self, arena: Arena) -> None:
        """An old arena's last block was freed: let its memory go (a reserved range left
        behind by rule 7 is closed, after a device sync)."""
        self.arenas.discard(arena)
        if self._on_range(arena) and self._reserve is None:
            self._close_range()

    def _take(self, size: int) -> Arena | None:
        self.release_cached()  # what is idle goes first (rule 4)
        try:
            buffer = self.raw(size)
        except MemoryError as e:
            self.failures += 1
            self.blocked = True
            self._refused_total = self.total_bytes()
            self._trouble("arena refused", "pgmo cannot allocate a %d-byte arena (%s); serving "
                          "each request from memory of its own", size, e)
            return None
        arena = Arena(buffer, size)
        self.arenas.add(arena)
        self.blocked = False  # a smaller arena, taken after a larger one was refused
        return arena

    # ------------------------------------------------ the reserved-range arena
    def _fit_range(self, size: int) -> bool:
        """Map the reserved arena up to ``size`` bytes, or trim its end down to it (rule 3)."""
        departed_end = self.departed_end if size == self.planned else 0  # (a new plan: none)
        self.departed_end, self.planned = 0, max(size, 0)
        if self.holes and not self.mend() and self._reserve is None:
            return False  # the driver refused the range meanwhile (rule 7)
        if size <= 0:
            arena = self.hot.arena
            if arena is None:
                return False
            self.hot.retire()
            return self._trim_range(arena, self._live_end(arena))
        arena = self.hot.arena
        if arena is None:
            arena = self._range_arena()
            if arena is None:
                return False
        if arena.size < size:
            self.release_cached()  # what is idle goes first (rule 4)
            self.trim_heap(force=True)
            if not self._grow_range(arena, size):
                if self._reserve is None:  # the driver refused the range: rule 7
                    return False
                self.failures += 1
                self.blocked = True
                self._trouble("arena refused", "pgmo cannot map its arena up to %d bytes (%d "
                              "mapped); requests beyond it get memory of their own", size,
                              arena.size)
                return False
            self.blocked = False
            self._cleared("arena refused")
            return True
        self.blocked = False
        self._cleared("arena refused")
        # The live blocks' end is looked for only when the arena is worth trimming and a
        # mapping starts beyond the plan (an O(n) scan of the plan's slots: not at every
        # boundary of a repeating run whose arena ends in a mapping the plan reaches into).
        rng = self.range
        assert rng is not None  # the arena is on the reserved range
        if arena.size - size >= TRIM_SLACK * size:
            holes = self.holes
            end = self._usable_end() if holes else rng.usable_end()
            if not holes and not self._starts_in(size, end):
                arena.size = end  # nothing to unmap (as _trim_range would find)
            else:
                need = max(size, self._live_end(arena), departed_end)
                if arena.size - need >= TRIM_SLACK * need and self._trim_range(arena, need):
                    return True
        self.trim_heap()
        return False

    def _grow_range(self, arena: Arena, size: int) -> bool:
        """Map the reserved arena up to ``size`` bytes (rule 3), in mappings of about 1/32 of
        it (:data:`MAPPING_MAX` at most): its end can be trimmed in steps of that size (the
        driver unmaps whole mappings only)."""
        granule = self.range.granule if self.range is not None else 1
        end = -(-size // granule) * granule
        return self._map_end(arena, end, min(MAPPING_MAX,
                                             max(granule, -(-end // (32 * granule)) * granule)))

    def grow_for_placer(self, extra: int) -> int:
        """A departed iteration found no gap for ``extra`` more bytes at the arena's end: map
        them and a step more (:data:`GROW_STEP`), or just them when the step is refused.

        Returns the arena's size now (unchanged when the device refuses).
        """
        arena = self.hot.arena
        if arena is None or not self._on_range(arena) or self._reserve is None:
            return arena.size if arena is not None else 0
        old = arena.size
        if not self._grow_range(arena, old + max(extra, int(old * GROW_STEP))) \
                and self._reserve is not None and not self._grow_range(arena, old + extra) \
                and self._reserve is not None:
            # A full device: what is idle goes back (rule 6), then once more; the placer lent to
            # the hot path meanwhile, so that the frees drained now give it their gaps.
            self.hot.set_placer(self.placer)
            try:
                self.make_room()
            finally:
                self.hot.set_placer(None)
            self._grow_range(arena, old + extra)
        return arena.size if self.hot.arena is arena else old

    # ------------------------------------------------------------- placement
    def start_placing(self, apart: frozenset = frozenset()) -> None:
        """The iteration left its plan (or its arena has holes, rule 6): place the rest of it
        in the arena's gaps (growing a reserved arena at its end when none holds a request),
        but for requests of the sizes ``apart`` (survivors'), which get memory of their
        own."""
        hot = self.hot
        arena = hot.arena
        if arena is None:
            return
        hot.drain()  # the frees so far: their gaps are the placer's from the start
        grow = self.grow_for_placer if self._on_range(arena) else None
        self.placer = placer = Placer(arena.size, self.hot.live_spans(arena), apart,
                                      grow=grow, snug=True)  # grow: grow_for_placer, or None
        for start, nbytes in self.holes.items():  # (rule 6) nothing is placed in a hole
            placer.withhold(start, start + nbytes)
        hot.set_placer(placer)

    def stop_placing(self, placer: Placer | None) -> None:
        """The iteration ended (``placer``: its placer, already taken off :attr:`placer` as
        it ended): a cudaMalloc arena whose gaps it overflowed grows at the next boundary
        (when the workload varies; otherwise its next plan covers it)."""
        if placer is None and not self.holes:  # (at every boundary: the usual case)
            return
        arena = self.hot.arena
        if placer is not None and placer.overflowed and arena is not None:
            self.wanted = max(self.wanted, round_size(int(arena.size * GROWTH)))
        if placer is not None and arena is not None:  # kept at the next boundary (rule 4)
            self.departed_end = arena.size
        self.mend()

    def mend(self) -> bool:
        """Map the arena's holes (rule 6) again, its end beyond the plan and the live blocks
        trimmed first; the device refusing, idle memory goes back and it is tried once
        more.  True when the arena is whole (a plan may be followed in it)."""
        if not self.holes:
            return True
        arena = self.hot.arena
        if arena is not None and self._on_range(arena):
            self._trim_range(arena, max(self.planned, self._live_end(arena)), budget=False)
        if self._refill():
            self._cleared("arena holes")
            return True
        if self._reserve is not None:
            self.release_cached()
            self.trim_heap(force=True)
            if self._refill():
                self._cleared("arena holes")
                return True
        self._trouble("arena holes", "pgmo cannot map its arena's middle again (%d bytes); "
                      "no plan is followed in the arena until it can",
                      sum(self.holes.values()))
        return False

    # ------------------------------------------------------------ boundaries
    def awaiting_plan(self, varied: bool) -> bool:
        """A boundary with no plan installed (rule 4): the heap's idle memory goes back only
        when the iterations waiting for the plan vary (``varied``: the last two unplanned
        iterations differed); True when memory went back."""
        return self.trim_heap() if varied else self.tidy_heap()

    def trim_heap(self, force: bool = False) -> bool:
        """Give the heaps' wholly free chunks back (one device sync, one trim call) when they
        are worth it, or before an arena grows (``force``); once per boundary (rule 4)."""
        heaps = self._heaps()
        idle = held = 0
        for heap in heaps:
            h = heap.held
            if h:  # (nothing held, nothing idle: its live blocks are not summed)
                held += h
                idle += h - heap.used
        # All pgmo holds (the heaps' part of it first) is summed only when something idle may
        # be worth giving back: not at every boundary of a repeating run.
        if idle <= 0 or (not force and (idle < HEAP_SLACK * held
                                        or idle < HEAP_SLACK * self.total_bytes())):
            return self.tidy_heap(heaps)
        if not self._may_release() or not self._sync():
            return False
        for heap in heaps:
            self._trim(heap)
        return True

    def release_cached(self) -> None:
        """Give back survivors' buffers idle for a whole iteration and the stock pool's free
        blocks (those of a whole allocation): as an iteration begins, and before an arena
        is taken (rule 4).

        The stock pool serves nothing inside an iteration but interruptions
        and other threads, so its free blocks would only sit beside the arena.
        """
        self.kept.release(self.hot.iteration, before=self.hot.iteration)
        if self.stock.n_free_blocks():
            self.stock.free_all_blocks()

    def release_idle(self, arena_too: bool) -> None:
        """``free_all_blocks``: every idle byte goes back; the current arena too if idle."""
        self.make_room(collect=False)
        arena = self.hot.arena
        if arena_too and arena is not None and self.hot.arena_idle(arena):
            self.drop()
        self.blocked = False

    # ------------------------------------------------------------- the limit
    def set_limit(self, size: int) -> None:
        limit = int(size)
        if limit > 0:  # checked inline first: a Ctrl-C below never leaves a limit unchecked
            self.hot.set_limited(True)
        self.limit = limit
        self.blocked = False
        self.hot.set_limited(limit > 0)
        self.sync_stock_limit()
