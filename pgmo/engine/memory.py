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
    arena that cannot grow.  From a private stream-ordered pool
    (``Backend.heap``: cudaMallocFromPoolAsync / cudaFreeAsync) when the
    device has one; else a raw allocation per request (:mod:`.raw_heap`,
    whose cudaFree waits for the device).
``kept``
    Survivors get a buffer of their own (from the heap) that, once freed,
    waits for the same size in the next iteration (:mod:`.kept`).
``stock``
    CuPy's stock pool, for what lies outside every plan: requests between
    iterations, between ``interrupt()`` and ``resume()``, and from another
    thread, device or stream.

The footprint policy, and why:

1. **Hold near the live bytes while profiling.**  A caching pool's
   profiled iteration costs its fragmented peak, and its cache then lives
   beside the arena (on the H100, 2026-11-25: 1.5x-1.8x CuPy's footprint).
   The heap places blocks as they come and keeps freed memory for reuse,
   without a device sync; its idle memory is trimmed at boundaries (rule 4).
2. **No device sync inside an iteration.**  cudaFree and unmapping wait for
   (or must follow) every queued kernel: inside an iteration pgmo calls
   neither (blocks are freed into the heap or the arena, and the arena grows
   by mapping, which waits for nothing); only a device that is full makes it
   give memory back mid-iteration (rule 6).
3. **One arena, grown in place.**  A plan that needs more, or a departed
   iteration that finds no gap, maps more memory at the arena's end (in
   mappings of about 1/32 of the arena, :data:`MAPPING_MAX` at most, so that
   the end can be trimmed finely; access is granted once per growth).
   Without virtual memory, an arena that must grow is replaced: the old one
   lives only while blocks live in it, and when the device refuses the new
   one the pool keeps the old one (it never drops an arena it cannot
   replace); a varying workload's arena then grows by :data:`GROWTH` at
   least, so that it does not change at every boundary.
4. **Give back at boundaries, at most one release each, after a device
   sync.**  As an iteration ends, memory nothing needs goes back with one
   device-wide sync (an array of the arena may be in use by a kernel on any
   stream, and neither ``cuMemUnmap`` nor ``cudaMemPoolTrimTo`` waits for
   it) and one release: the heap's wholly free chunks
   (``cudaMemPoolTrimTo``) before an arena grows, when they are a sizeable
   share of what is held (:data:`HEAP_SLACK`), or when the engine asks
   (iterations that vary while a plan is awaited, see
   :meth:`.core.Engine._at_boundary`); else the arena's end beyond the plan
   and its live blocks (``cuMemUnmap`` of whole mappings) when it is
   :data:`TRIM_SLACK` or more above what is needed.  Survivors' idle
   buffers and the stock pool's free blocks go back as the next iteration
   begins.
5. **Count every byte.**  ``total_bytes() = arenas (what the driver holds for
   them) + heaps + the stock pool's total``; the limit caps that sum for
   every source, and the peak is updated wherever it grows.
6. **Room when full.**  When the device or the limit refuses memory, idle
   memory (dead blocks, idle kept buffers, the heap's free chunks, the
   stock pool's free blocks, the arena's unused end) is given back and the
   request tried once more; then CuPy's ``OutOfMemoryError``, with the
   numbers.
7. **A driver that says no costs a fallback, never a stuck pool.**  A call
   that fails for another reason than a full device
   (:class:`~pgmo.errors.DeviceError`: NOT_SUPPORTED under a container, say)
   switches that part to cudaMalloc for good: the reserved range to
   cudaMalloc arenas, the stream-ordered pool to a cudaMalloc per request
   (what lives in the old one stays until freed); a release the driver
   refuses is skipped, and what it could not give back stays counted.  The
   reason is in ``stats().device_reasons`` and ``memory_summary()``, and
   logged once per change of state, not once per boundary.
"""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Callable

from ..errors import DeviceError
from ..units import round_size
from .frees import EXACT, KEPT, STOCK, Arena
from .handout import HotPath
from .kept import KeptBuffers
from .options import Buffer, ReservedRange, StockPool, StreamHeap
from .own_heap import OwnHeap
from ..placement import Placer
from .raw_heap import RawHeap

__all__ = ["DeviceMemory", "RawListener", "GROWTH", "MAPPING_MAX", "TRIM_SLACK"]

log = logging.getLogger("pgmo.pool")

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

#: What a call that gives memory back may raise when the driver refuses it: nothing given
#: back, whatever the code (rule 7).
_NOT_GIVEN_BACK = (DeviceError, MemoryError)

#: What ``stats().arena_kind`` and ``heap_kind`` say.
RANGE, CUDA_MALLOC, NO_ARENA = "reserved range", "cudaMalloc", "none"
STREAM_POOL = "stream-ordered pool"


class DeviceMemory:
    """The arenas, the heap, the survivors' buffers and the stock pool, counted."""

    def __init__(self, hot: HotPath, allocate: Callable[[int], Buffer], stock: StockPool,
                 oom_error: Callable[[int, int, int], BaseException],
                 reserve: Callable[[int | None], ReservedRange] | None = None,
                 heap: Callable[[], StreamHeap] | None = None, device_memory: int = 0,
                 reasons: dict[str, str] | None = None, own_heap: bool = True,
                 stream: Callable[[], object] | None = None):
        """``allocate(size)``: the raw allocator (cudaMalloc; MemoryError when full);
        ``stock``: CuPy's pool; ``oom_error(size, total, limit)``: a full device's error;
        ``reserve(size)``: a virtual address range (None: no virtual memory management);
        ``heap()``: the driver's private stream-ordered pool (None: none); ``own_heap``:
        the heap is pgmo's own (:mod:`.own_heap`) where there is virtual memory, else that
        pool, else a raw allocation per request; ``stream()`` names the current stream
        (the own heap serves one at a time); ``device_memory``: the device's size (what a
        reservation spans); ``reasons``: why a part of the device layer is not used from
        the start (part -> why)."""
        self.hot = hot
        self.allocate = allocate
        self.stock = stock
        self.oom_error = oom_error
        self._reserve = reserve
        self._make_heap = heap
        self._own_heap = own_heap and reserve is not None
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
        self.placer: Placer | None = None
        self.limit = 0  # 0: none
        self.peak_total = 0  # most bytes held at once
        self.releases = 0  # boundary releases (a device sync and one release call each)
        self._released_at = -1  # the boundary (iteration number) of the last release
        self._refused_total = 0  # bytes held when the device last refused an arena
        self.kept = KeptBuffers()
        #: Why a part does not use what the device offers (rule 7): part -> reason.
        self.reasons: dict[str, str] = dict(reasons or {})
        self._states: dict[str, str] = {}  # passing troubles, each logged once while it lasts

    # ------------------------------------------------------------- the layer
    @property
    def arena_kind(self) -> str:
        """What holds the current arena: ``"reserved range"``, ``"cudaMalloc"``, or
        ``"none"`` (no arena now)."""
        arena = self.hot.arena
        if arena is None:
            return NO_ARENA
        return RANGE if self._on_range(arena) else CUDA_MALLOC

    @property
    def heap_kind(self) -> str:
        """What serves memory of a block's own now: ``"own heap (reserved range)"``,
        ``"stream-ordered pool"`` (the driver's) or ``"cudaMalloc per request"``."""
        heap = self.heap
        if heap is None:
            if self._own_heap:
                return OwnHeap.kind
            return STREAM_POOL if self._make_heap is not None else RawHeap.kind
        return str(getattr(heap, "kind", STREAM_POOL))

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

    def _heap(self) -> StreamHeap:
        heap = self.heap
        if heap is None:
            try:
                if self._own_heap:
                    assert self._heap_reserve is not None  # own_heap needs virtual memory
                    # address space is cheap, contiguous gaps are not: 8x the device
                    heap = OwnHeap(self._heap_reserve(8 * self.device_memory or None),
                                   self._stream)
                elif self._make_heap is not None:
                    heap = self._make_heap()
                else:
                    heap = RawHeap(self.allocate)
            except (DeviceError, MemoryError) as e:  # rule 7 (MemoryError: no address space)
                self._heap_off(f"{e}")
                return self._heap()
            self.heap = heap
        return heap

    def _heap_off(self, why: str) -> None:
        """Rule 7: the next heap from now on (pgmo's own, the driver's pool, a cudaMalloc per
        request); the old heap stays for its blocks."""
        heap = self.heap
        if heap is not None and not isinstance(heap, RawHeap):
            self._old_heaps.append(heap)
        self.heap = None
        if self._own_heap:
            self._own_heap = False
            nxt = STREAM_POOL if self._make_heap is not None else RawHeap.kind
        else:
            self._make_heap = None
            nxt = RawHeap.kind
        self.reasons["heap"] = f"{why}; the heap is a {nxt} from now on"
        log.warning("pgmo's heap is a %s from now on: %s", nxt, why)

    def reuse(self, rs: int) -> Buffer | None:
        """A block of the stock pool's idle memory, if it holds ``rs`` bytes without growing.

        Idle memory is used before new memory is taken: a chunk the stock pool
        could not give back (split by a block still alive there) serves a
        request of its own instead of sitting beside it.
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

    def lend_kept(self, rs: int) -> Buffer:
        """A survivor's buffer (see :mod:`.kept`)."""
        return self.kept.lend(rs, self.hot.iteration, self.exact)

    def from_stock(self, size: int, rs: int) -> Buffer:
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
    def _range_off(self, why: str) -> None:
        """Rule 7: cudaMalloc arenas from now on.  An arena on the range serves on as a
        fixed-size arena until a plan needs another size (then it is dropped like a cudaMalloc
        arena, and the range closed once its last block is freed)."""
        self._reserve = None
        self._fall_back("arena", why)
        if self.range is not None and not any(self._on_range(a) for a in self.arenas):
            self._close_range()

    def _close_range(self) -> None:
        rng, self.range = self.range, None
        if rng is None:
            return
        try:
            rng.close()  # a device sync, then every mapping and the address space go back
        except _NOT_GIVEN_BACK as e:
            self._trouble("range close", "pgmo could not give its reserved range back (%s)", e)

    def _range_arena(self) -> Arena | None:
        """The arena on the reserved range (reserved at its first use), or None if refused."""
        hot = self.hot
        arena = hot.arena
        if arena is not None:
            return arena
        if self.range is None:
            assert self._reserve is not None  # only a device with virtual memory gets here
            try:
                self.range = self._reserve(2 * self.device_memory or None)
            except MemoryError as e:
                self.failures += 1
                self.blocked = True
                self._trouble("arena refused", "pgmo cannot reserve address space for its "
                              "arena (%s)", e)
                return None
            except DeviceError as e:
                self._range_off(f"{e}")
                return None
        arena = Arena(self.range, self.range.usable_end())
        self.arenas.add(arena)
        hot.set_arena(arena)
        return arena

    def _fit_range(self, size: int) -> bool:
        """Map the reserved arena up to ``size`` bytes, or trim its end down to it (rule 3)."""
        self.planned = max(size, 0)
        if size <= 0:
            arena = self.hot.arena
            if arena is None:
                return False
            self.hot.retire()
            return self._trim_range(arena, self._live_end(arena))
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
        # The live blocks' end is looked for only when the arena is worth trimming (an O(n)
        # scan of the plan's slots: not at every boundary of a repeating run).
        if arena.size - size >= TRIM_SLACK * size:
            need = max(size, self._live_end(arena))
            if arena.size - need >= TRIM_SLACK * need and self._trim_range(arena, need):
                return True
        self.trim_heap()
        return False

    def _grow_range(self, arena: Arena, size: int) -> bool:
        """Map ``[arena.size, size)`` (granules; mappings of :data:`MAPPING_MAX` at most), access
        granted once.  No device sync: a mapping waits for nothing.  False, with the arena as
        it was, when the limit or the device refuses (or the driver refuses the range: rule 7).
        """
        rng = self.range
        assert rng is not None  # only the reserved arena grows in place
        arena.size = rng.usable_end()  # (a growth or trim cut short may have left it behind)
        granule = rng.granule
        end = -(-size // granule) * granule
        if arena.size >= end:
            return True
        if end > rng.size or \
                (self.limit and self.total_bytes() + end - arena.size > self.limit):
            return False
        # Mappings of about 1/32 of the arena (and MAPPING_MAX at most): its end can be
        # trimmed in steps of that size (the driver unmaps whole mappings only).
        piece = min(MAPPING_MAX, max(granule, -(-end // (32 * granule)) * granule))
        try:
            rng.map(arena.size, end - arena.size, piece)
        except MemoryError:
            return False
        except DeviceError as e:
            self._range_off(f"{e}")
            return False
        finally:
            arena.size = rng.usable_end()
        self.note_reserved()
        return True

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
            self.make_room()  # a full device: what is idle goes back (rule 6), then once more
            self._grow_range(arena, old + extra)
        return arena.size if self.hot.arena is arena else old

    def _trim_range(self, arena: Arena, keep: int, budget: bool = True) -> bool:
        """Unmap the arena's whole mappings beyond ``keep`` bytes (one device sync, one
        release); False when none lies wholly beyond it, or when this boundary has had its
        release (``budget``, rule 4).  A refused unmap leaves what stays mapped counted and
        the arena at the end of its usable memory (rule 7)."""
        rng = self.range
        assert rng is not None  # only the reserved arena is trimmed
        arena.size = rng.usable_end()  # (a growth or trim cut short may have left it behind)
        cut = arena.size
        for start, _ in reversed(rng.mappings()):
            if start >= arena.size:  # beyond the usable end: left by a refused call (rule 7)
                continue
            if start < keep:
                break
            cut = start
        if cut >= arena.size or (budget and not self._may_release()) or not self._sync():
            return False
        try:
            rng.unmap(cut, arena.size - cut)
            self._cleared("unmap")
        except _NOT_GIVEN_BACK as e:
            self._trouble("unmap", "pgmo could not unmap its arena's end (%s); it stays "
                          "counted", e)
        finally:
            arena.size = min(arena.size, rng.usable_end())
        return True

    def _heaps(self) -> list[StreamHeap]:
        heaps = [h for h in self._old_heaps if h.held]
        self._old_heaps = heaps
        return heaps + [self.heap] if self.heap is not None else heaps

    def trim_heap(self, force: bool = False) -> bool:
        """Give the heaps' wholly free chunks back (one device sync, one trim call) when they
        are worth it, or before an arena grows (``force``); once per boundary (rule 4)."""
        heaps = self._heaps()
        idle = sum(h.held - h.used for h in heaps)
        if idle <= 0 or (not force and idle < HEAP_SLACK * self.total_bytes()) \
                or not self._may_release() or not self._sync():
            return False
        for heap in heaps:
            self._trim(heap)
        return True

    def _trim(self, heap: StreamHeap) -> None:
        try:
            heap.trim()
            self._cleared("trim")
        except _NOT_GIVEN_BACK as e:  # rule 7: the memory stays held, and counted
            self._trouble("trim", "pgmo could not trim its stream-ordered pool (%s); skipped",
                          e)

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
            elif self.heap is not None or self._old_heaps:
                (self.heap or self._old_heaps[0]).synchronize()
            self._cleared("sync")
            return True
        except _NOT_GIVEN_BACK as e:
            self._trouble("sync", "pgmo cannot wait for the device (%s); nothing is given back",
                          e)
            return False

    def _live_end(self, arena: Arena) -> int:
        return max((end for _, end in self.hot.live_spans(arena)), default=0)

    # ------------------------------------------------------------- placement
    def start_placing(self, apart: frozenset = frozenset()) -> None:
        """The iteration left its plan: place the rest of it in the arena's gaps (growing a
        reserved arena at its end when none holds a request), but for requests of the sizes
        ``apart`` (survivors'), which get memory of their own."""
        hot = self.hot
        arena = hot.arena
        if arena is None:
            return
        grow = self.grow_for_placer if self._on_range(arena) else None
        self.placer = Placer(arena.size, self.hot.live_spans(arena), apart, grow, snug=True)
        hot.set_placer(self.placer)

    def stop_placing(self) -> None:
        """The iteration ended: a cudaMalloc arena whose gaps it overflowed grows at the next
        boundary (when the workload varies; otherwise its next plan covers it)."""
        placer, self.placer = self.placer, None
        arena = self.hot.arena
        if placer is not None and placer.overflowed and arena is not None:
            self.wanted = max(self.wanted, round_size(int(arena.size * GROWTH)))

    # ------------------------------------------------------------ boundaries
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
        """What the driver holds for the arenas (a reserved range: every mapping, also one a
        refused unmap left; rule 5)."""
        return sum(a.buffer.mapped if self._on_range(a) else a.size for a in self.arenas)

    def heap_total(self) -> int:
        """Bytes the heaps hold: the stream-ordered pool's backed memory, or the live blocks
        of their own."""
        return sum(h.held for h in self._heaps())

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
        """Free address ranges in the arenas, plus idle kept buffers (CuPy's free blocks)."""
        gaps = self.kept.idle_count()
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
