"""Where every block is handed out, and where its free comes back: the hot path.

Plain Python, or compiled by Cython when pgmo was installed with a C compiler
(types in ``handout.pxd``; :data:`COMPILED` says which; tests run both).

A handed-out block is a memory object ``memory_type(ptr, size, owner,
device_id)`` (CuPy's ``UnownedMemory``, each at offset 0, as Chainer's
``F.as_strided`` needs) whose *owner* is a :class:`~.frees.Release`, whose
death is the block's free (see :mod:`.frees`); the engine applies queued
frees in order at its next call (:meth:`HotPath.drain`).  A block's *source*
says where its memory comes from (:mod:`.memory` obtains and releases all).

:meth:`HotPath.malloc` answers the owner thread's usual requests inline; the
rest go to the engine's slow path (:mod:`.core`), which decides only whose
request it is (another thread's, one between iterations, the first of an
iteration whose shape picks its plan).  Both then hand out through the same
methods: :meth:`HotPath.serve_numbered` is **the one hand-out decision** for
a request of an iteration (its row: planned size, offset, blocks due dead,
overdue blocks in the way), and :meth:`HotPath.serve_outside` hands out and
counts every request outside an iteration's plan.  When a request departs
from its plan, the decision calls the engine back (``on_departure``,
``on_late_free``) and goes on; it is made once per request.

The engine reads this object's state (read-only when compiled) and changes it
only through its methods; ``tests/test_hot_path_seal.py`` checks that no
module outside the hot path assigns to its fields.

Tested in ``tests/test_hot_path_seal.py`` and, on both hot paths, in
``tests/test_engine_*.py`` and ``tests/test_replay.py``.
"""

from __future__ import annotations

import array
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Final

from pgmo.engine.schedule import CAP, DUE, OFFSET, SENTINEL
from pgmo.trace import intervals_overlap
from pgmo.units import ALIGNMENT

from .frees import (APART, ARENA, EXACT, KEPT, KEY_BIAS, KEY_LOW, SOURCE_BITS, STOCK, Arena,
                    Counts, Inbox, Release)

if TYPE_CHECKING:
    from pgmo.placement import Placer
    from .schedule import Row

__all__ = ["HotPath", "COMPILED", "NO_SLOT", "NOT_FREED", "OUTSIDE", "WATCHED", "SLOW",
           "PLANNED", "RECORDED", "FALLBACK", "INLINE_MAX"]

log = logging.getLogger("pgmo.pool")

# The calling thread's id: compiled, the C function ``handout.pxd`` binds; as plain
# Python, threading's (through globals(): Cython sees no assignment to its C name).
globals().setdefault("PyThread_get_thread_ident", threading.get_ident)

#: ``HotPath._slot[i]`` when request ``i`` has no live block in the current arena.
NO_SLOT = -1
#: Iteration number of blocks outside any iteration's plan.
OUTSIDE = -1
#: Iteration number of blocks watched while looking for a repeating loop.
WATCHED = -3

try:
    import cython

    COMPILED: bool = cython.compiled
except ImportError:  # Cython is a build dependency only
    COMPILED = False

# frees.py's and schedule.py's constants and the allocation unit, as C integers when
# compiled (handout.pxd).
_ARENA, _STOCK, _EXACT, _KEPT = ARENA, STOCK, EXACT, KEPT
_SOURCE_BITS, _KEY_BIAS, _KEY_LOW, _APART = SOURCE_BITS, KEY_BIAS, KEY_LOW, APART
_ROUND_UP, _ROUND_MASK = ALIGNMENT - 1, -ALIGNMENT
_CAP: Final = CAP
_OFFSET: Final = OFFSET
_DUE: Final = DUE

#: Larger requests always take the slow path (they cannot fit a C integer, or a device).
INLINE_MAX = 1 << 62

#: What the owner thread's requests are right now (``HotPath.kind``, set by the engine).
SLOW = 0  # only the engine's slow path knows (watching for a loop, a shape to pick...)
PLANNED = 1  # numbered, answered from the schedule
RECORDED = 2  # numbered and logged, each in memory of its own (warm-up, profiling, departed)
FALLBACK = 3  # not numbered: interrupted, or between iterations: CuPy's stock pool

#: ``log_arrays[1][i]`` of a request not freed (yet).
NOT_FREED = -1


def _new_slots(n: int) -> array.array:
    """``_slot`` for ``n`` requests, none live (a C array of 64-bit integers)."""
    return array.array("q", [NO_SLOT]) * n


def _new_log(n: int) -> tuple[array.array, array.array, array.array]:
    """Empty log arrays (lowers, uppers, sizes: :meth:`.Trace.columns`' order) for ``n`` requests."""
    return _ZERO * n, _UNFREED * n, _ZERO * n


_ZERO = array.array("q", [0])  # (one each: a new log at every boundary repeats them)
_UNFREED = array.array("q", [NOT_FREED])


def _unconnected(*args: Any) -> Any:
    """A source or callback before the engine connects its own (never called)."""
    raise RuntimeError("the hot path is not connected to an engine")


def _release(inbox: Inbox, index: int, iteration: int, size: int, arena: Arena | None,
             keep: Any, source: int) -> Release:
    """A new :class:`Release` (without ``__init__``: compiled, this is a plain C allocation)."""
    owner = Release.__new__(Release)
    owner.inbox = inbox
    owner.index = index
    owner.iteration = iteration
    owner.size = size
    owner.arena = arena
    owner.keep = keep
    owner.source = source
    owner.on_free = None
    owner.armed = False  # armed by the hand-out's commit (see "Commits" in frees.py)
    return owner


class HotPath:
    """The state every allocation touches, and the code that hands blocks out.

    Read by the engine (read-only when compiled): ``kind``, what the owner's
    next request is; ``owner`` and ``ctx``, the thread and device/stream the
    plan serves; ``solo``/``busy``, the lock-free protocol (see
    :meth:`malloc`); ``iteration`` and ``n``, the current iteration and its
    requests numbered so far; ``arena``; ``used``/``peak_used``, live bytes;
    ``counts``, requests served (:class:`~.frees.Counts`); ``log_arrays``,
    the iteration's log (see :mod:`.profiles`); ``watched_frees``; ``inbox``.

    Its own: the rows of the plan in use (:data:`~.schedule.Row`), each
    row's address, which planned blocks live in the arena (``_slot``), the
    memory sources (``_exact(rs)``, ``_kept(rs)``, ``_stock``, from
    :mod:`.memory`), the engine's callbacks, the event clock.
    """

    def __init__(self, memory_type: Callable[..., Any], pointer_type: Callable[[Any, int], Any],
                 device_id: int, slow: Callable[[Any], Any],
                 on_departure: Callable[[int, int], None],
                 on_late_free: Callable[[int], None]):
        """``slow(size)``: the engine's slow path; ``on_departure(i, rs)``: request ``i``
        (``rs`` bytes) is larger than planned or beyond the planned count, the engine
        leaves the plan; ``on_late_free(iteration)``: a block of ``iteration``, freed later
        than planned, lies where the request was planned.

        The engine passes (each through a weak reference) ``slow`` =
        ``Engine._serve_checked``, ``on_departure`` = ``Engine._depart`` and
        ``on_late_free`` = ``Engine._freed_late`` (:mod:`.core`)."""
        self.inbox = Inbox()
        self._memory_type = memory_type
        self._pointer_type = pointer_type
        self._device_id = device_id
        self._slow = slow
        self._on_departure = on_departure
        self._on_late_free = on_late_free
        self._on_arena_idle: Callable[[Arena], None] = _unconnected  # an old arena went idle
        self._stock: Any = None  # the sources (connect)
        self._exact: Callable[[int], Any] = _unconnected
        self._kept: Callable[[int], Any] = _unconnected
        self._reuse: Callable[[int], Any] = _unconnected
        self._between: Callable[[int], Any] = _unconnected  # the owner's, between iterations
        self._between_source = _STOCK
        self._device: Callable[[], int] | None = None  # the current device, or None: unchecked
        self._placer: Placer | None = None  # off-plan requests in the arena's gaps
        self._limited = False  # stock requests take the slow path, which keeps the limit
        self._context: Callable[[], Any] | None = None  # names the device/stream, or None
        self.ctx: Any = None  # the iteration's device/stream
        # the thread running the hot loop (PyThread_get_thread_ident: see the module's top)
        self.owner = PyThread_get_thread_ident()  # type: ignore[name-defined]
        self._owner_hooks: Any = None  # the owner thread's memory hooks (a dict), if any
        self.kind = SLOW
        self.solo = True  # only the owner has used the engine so far
        self.busy = False  # the owner is inside the inline path
        self._in_iter = False
        self._planned_iter = False  # the iteration started with the schedule in use
        self._rows: list[Row] = [SENTINEL]
        self._addresses: list[int] = [0]  # arena.ptr + offset, per row (see _aim)
        self._slot = _new_slots(0)
        self.arena: Arena | None = None
        self.iteration = 0  # number of the current (or last) iteration
        self._logging_frees = False  # frees of this iteration's blocks tick the clock
        self.n = 0  # requests numbered in this iteration
        self._max_n = 1 << 62  # a detected iteration's length
        self._tick = 0  # the event clock
        # The iteration's log (see .profiles): per request its alloc tick, free
        # tick (NOT_FREED until freed) and rounded size (0: as planned), in C
        # arrays so that logging creates no Python objects.
        self._obs_lowers = self._obs_uppers = self._obs_sizes = _new_log(0)[0]
        self._open_log(0)
        self._live_slots = 0  # entries of _slot that are not NO_SLOT
        self.watched_frees = 0  # frees of blocks watched for a repeating loop
        self.used = 0  # bytes of live blocks, every source
        self._source_used = array.array("q", [0, 0, 0, 0])  # per source, but arena_used()
        self.peak_used = 0
        self.counts = Counts()

    # ------------------------------------------------------- the engine's calls
    def connect(self, stock: Any, exact: Callable[[int], Any], kept: Callable[[int], Any],
                reuse: Callable[[int], Any], context: Callable[[], Any] | None,
                on_arena_idle: Callable[[Arena], None], between: Callable[[int], Any],
                between_source: int, device: Callable[[], int] | None = None) -> None:
        """The memory sources, the request's device/stream, who hears an old arena go idle;
        ``between(rs)`` serves the owner's requests between iterations, from
        ``between_source``, when ``device()`` is the pool's (else the stock pool, which
        serves the current device: the pool's own memory is its device's only).

        The engine passes ``stock`` = CuPy's stock pool (``Backend.fallback``) and, from
        :class:`~.memory.DeviceMemory`, ``exact`` = ``exact``, ``kept`` = ``lend_kept``,
        ``reuse`` = ``reuse``, ``on_arena_idle`` = ``released`` and ``between`` =
        ``between_iterations()``'s; ``context`` and ``device`` are the backend's."""
        self._device = device
        self._stock = stock
        self._exact = exact
        self._kept = kept
        self._reuse = reuse
        self._context = context
        self._on_arena_idle = on_arena_idle
        self._between = between
        self._between_source = between_source

    def share(self) -> None:
        """Another thread came in: from now on the owner takes the engine's lock too."""
        self.solo = False

    def set_limited(self, limited: bool) -> None:
        self._limited = limited

    def set_placer(self, placer: Placer | None) -> None:
        self._placer = placer

    def set_owner_hooks(self, owner_hooks: Any) -> None:
        """The owner thread's memory hooks (a mapping; its requests with hooks take the slow
        path, which reports them)."""
        self._owner_hooks = owner_hooks

    def set_kind(self, kind: int, in_iter: bool) -> None:
        self.kind, self._in_iter = kind, in_iter

    def begin(self, owner: int, owner_hooks: Any, ctx: Any, planned: bool, max_n: int,
              log_size: int) -> None:
        """Start the next iteration: numbering and the clock restart, a fresh log (its requests
        are unnumbered until the engine's :meth:`set_kind`)."""
        lowers, uppers, sizes = _new_log(log_size)
        # one line (see "Commits" in frees.py)
        self.iteration += 1; self.owner = owner; self._owner_hooks = owner_hooks; self.ctx = ctx; self.n = 0; self._tick = 0; self._logging_frees = True; self._planned_iter = planned; self._max_n = max_n; self._placer = None; self._obs_lowers = lowers; self._obs_uppers = uppers; self._obs_sizes = sizes; self.log_arrays = (lowers, uppers, sizes)  # noqa: E501,E702

    def end(self) -> None:
        """The iteration is over: frees no longer tick its clock, no more placing, and the
        owner's requests are not numbered (unnumbered until the engine's :meth:`set_kind`)."""
        self._logging_frees = False; self._placer = None; self.kind = FALLBACK; self._in_iter = False  # noqa: E501,E702

    def install(self, rows: list[Row] | None, addresses: list[int] | None = None) -> None:
        """Answer from these rows from now on (a new plan; no slot is live); None: no plan.

        ``addresses``: each row's address in the current arena, when the engine
        has them already (:meth:`addresses_for`)."""
        if rows is None:
            rows = [SENTINEL]
        slots = _new_slots(len(rows) - 1)
        if addresses is None:
            addresses = self.addresses_for(rows)
        # one line (see "Commits" in frees.py): rows, slots and addresses always agree
        self._rows = rows; self._slot = slots; self._live_slots = 0; self._addresses = addresses  # noqa: E501,E702

    def addresses_for(self, rows: list[Row]) -> list[int]:
        """Each row's address in the current arena (0 for a survivor's)."""
        arena = self.arena
        base = arena.ptr if arena is not None else 0
        return [base + row[_OFFSET] if row[_OFFSET] >= 0 else 0 for row in rows]

    def set_arena(self, arena: Arena | None) -> None:
        self.arena = arena
        self._aim()

    def retire(self) -> None:
        """Live blocks of the current plan are no longer accounted for: overdue."""
        arena = self.arena
        if not self._live_slots or arena is None:  # live slots are the arena's
            return
        rows = self._rows
        overdue = arena.overdue
        for j in range(len(self._slot)):
            it = self._slot[j]
            if it != NO_SLOT:
                o = rows[j][_OFFSET]
                span = (o, o + rows[j][_CAP], it)
                # one line (see "Commits" in frees.py): listed overdue before the slot is let go
                overdue[(it << 32) | j] = span; self._slot[j] = NO_SLOT; self._live_slots -= 1  # noqa: E702

    def reset_peak(self) -> None:
        self.peak_used = self.used

    def arena_used(self) -> int:  # the only source not counted block by block
        used = self._source_used
        return self.used - used[_STOCK] - used[_EXACT] - used[_KEPT]

    def source_bytes(self, source: int) -> int:
        """Live bytes from ``source`` (:data:`~.frees.STOCK`, ``EXACT`` or ``KEPT``)."""
        return self._source_used[source]

    def arena_idle(self, arena: Arena) -> bool:
        """Whether no block lives in ``arena``."""
        return not arena.overdue and (arena is not self.arena or not self._live_slots)

    def live_spans(self, arena: Arena) -> list[tuple[int, int]]:
        """``(start, end)`` of every block alive in ``arena``: overdue, or in its planned slot."""
        spans = [(span[0], span[1]) for span in arena.overdue.values()]
        if arena is self.arena and self._live_slots:  # none live: no scan of the slots
            rows = self._rows
            for j in range(len(self._slot)):
                if self._slot[j] != NO_SLOT:
                    o = rows[j][_OFFSET]
                    spans.append((o, o + rows[j][_CAP]))
        return spans

    def null_block(self) -> Any:
        """What a request of 0 bytes gets: a null memory object, as in CuPy; not a request."""
        return self._pointer_type(self._memory_type(0, 0, None, self._device_id), 0)

    # ------------------------------------------------------------------ malloc
    def malloc(self, size: Any) -> Any:
        """Allocate ``size`` bytes: inline for the owner's usual requests, else the slow path.

        With memory hooks registered the slow path serves (and reports).  The
        inline path runs without the lock while only the owner has used the
        engine: it publishes ``busy`` and re-checks ``solo``; another thread
        clears ``solo`` under the lock, then waits for ``busy`` to drop.
        """
        kind = self.kind
        if (kind != SLOW and self.solo
                and PyThread_get_thread_ident() == self.owner  # type: ignore[name-defined]
                and type(size) is int and 0 < size < INLINE_MAX
                and not self._owner_hooks):  # others: the slow path checks and reports
            self.busy = True
            try:
                if self.solo:
                    inbox = self.inbox
                    if inbox.count or inbox.items:
                        self.drain()
                    n = size  # a C integer when compiled
                    rs = (n + _ROUND_UP) & _ROUND_MASK
                    if kind == FALLBACK:
                        result = self._serve_unnumbered(size, rs)
                    elif self.n < self._max_n and (self._context is None
                                                    or self._context() == self.ctx):
                        result = self.serve_numbered(rs)
                    else:  # a detected iteration's end, another device or stream
                        result = None
                    if result is not None:
                        return result
            except MemoryError:
                pass  # the slow path makes room and tries again
            finally:
                self.busy = False
        return self._slow(size)

    def _serve_unnumbered(self, size: int, rs: int) -> Any:
        """The owner's request outside an iteration's plan (interrupted: CuPy's stock pool;
        between iterations: ``_between``); None when a limit is set (the slow path keeps
        it)."""
        if self._limited:
            return None
        if self._in_iter or (self._device is not None and self._device() != self._device_id):
            return self.serve_outside(self._stock.malloc(size), rs, _STOCK, False, -1, OUTSIDE)
        return self.serve_outside(self._between(rs), rs, self._between_source, False, -1,
                                  OUTSIDE)

    def serve_numbered(self, rs: int) -> Any:
        """Request ``n`` of the iteration (``rs`` bytes, rounded): **the one hand-out decision**.

        Off plan (``kind`` RECORDED): in an arena gap or memory of its own.  On
        plan, from its row (:data:`~.schedule.Row`):

        * larger than planned, or beyond the planned count (the sentinel's cap
          is -1): a departure, the engine leaves the plan (``on_departure``)
          and the rest of the iteration is served off plan, this request first;
        * blocks planned dead by now that live on become overdue;
        * a survivor (offset -1): its kept buffer;
        * an overdue block in its planned range (freed later than planned):
          memory of its own, the plan goes on (``on_late_free``);
        * else its planned place in the arena.

        The caller holds the engine or is its solo owner.  A MemoryError of a
        source leaves the decision made (a departure stays one).
        """
        if self.kind != PLANNED:
            return self._serve_unplanned(rs)
        i = self.n
        row = self._rows[i]
        cap = row[_CAP]
        if rs > cap:
            self._on_departure(i, rs)
            return self._serve_unplanned(rs)
        due = row[_DUE]
        if due:
            self._check_due(due)
        o = row[_OFFSET]
        if o < 0:
            return self._serve_off_plan(self._kept(rs), rs, True, _KEPT)
        arena = self.arena
        assert arena is not None  # a planned offset: the engine follows plans its arena holds
        if arena.overdue:
            late = self._overdue_in(arena, o, o + cap)
            if late is not None:
                block = self._exact(rs)
                self._on_late_free(late[2])
                return self._serve_off_plan(block, rs, False, _EXACT)
        return self._serve_planned(arena, row[_CAP] if rs == cap else rs, rs)

    def serve_outside(self, block: Any, rs: int, source: int, foreign: bool, index: int,
                      iteration: int) -> Any:
        """A request outside any iteration's plan (not numbered), in ``block`` from ``source``.

        Counted as ``foreign`` (another thread, device or stream in an
        iteration), else interrupted (in an iteration) or outside (between
        iterations).  ``index``/``iteration``: the block's number in its free
        (a request watched for a repeating loop), else -1 and :data:`OUTSIDE`.
        """
        owner = _release(self.inbox, index, iteration, rs, None, block, source)
        pointer = self._pointer_type(self._memory_type(block.ptr, rs, owner, self._device_id), 0)
        # the commit, one line (see "Commits" in frees.py)
        self._source_used[source] += rs; self.used += rs; owner.armed = True  # noqa: E702
        if self.used > self.peak_used:
            self.peak_used = self.used
        if foreign:
            self.counts.foreign += 1
        elif self._in_iter:
            self.counts.interrupted += 1
        else:
            self.counts.outside += 1
        return pointer

    def _aim(self) -> None:
        """Compute each planned request's address; after the rows or the arena change."""
        self._addresses = self.addresses_for(self._rows)

    def _open_log(self, n: int) -> None:
        """A fresh log with room for ``n`` requests (it grows when needed)."""
        lowers, uppers, sizes = _new_log(n)
        # one line: the arrays are swapped together (the same arrays, for Python readers too)
        self._obs_lowers = lowers; self._obs_uppers = uppers; self._obs_sizes = sizes; self.log_arrays = (lowers, uppers, sizes)  # noqa: E501,E702

    def _room_in_log(self, i: int) -> None:
        """Make room for request ``i`` in the log (doubling it, copying what is there)."""
        if i >= len(self._obs_sizes):
            lowers, uppers, sizes = _new_log(2 * i + 16)
            for k in range(i):
                lowers[k] = self._obs_lowers[k]
                uppers[k] = self._obs_uppers[k]
                sizes[k] = self._obs_sizes[k]
            # one line: the arrays are swapped together
            self._obs_lowers = lowers; self._obs_uppers = uppers; self._obs_sizes = sizes; self.log_arrays = (lowers, uppers, sizes)  # noqa: E501,E702

    def _overdue_in(self, arena: Arena, lo: int, hi: int) -> tuple[int, int, int] | None:
        """An overdue block in ``[lo, hi)`` of ``arena`` (``(start, end, iteration)``), or None."""
        for span in arena.overdue.values():
            if intervals_overlap(span[0], span[1], lo, hi):
                return span
        return None

    # --------------------------------------------------------------- hand-outs
    # What serving a request does, written once for the inline and the slow path.
    def _serve_planned(self, arena: Arena, size: int, rs: int) -> Any:
        """The next request at its planned place, checked free; ``size``: ``rs`` as an object.

        Logs its alloc tick (its size stays 0: as planned).
        """
        i = self.n
        it = self.iteration
        t = self._tick
        owner = _release(self.inbox, i, it, rs, arena, None, _ARENA)
        pointer = self._pointer_type(self._memory_type(self._addresses[i], size, owner,
                                                       self._device_id), 0)
        # the commit, one line (see "Commits" in frees.py): live in its slot, counted,
        # numbered, logged, and its owner's death is its free from now on
        self._slot[i] = it; self._live_slots += 1; self.used += rs; self.n = i + 1; self._tick = t + 1; self._obs_lowers[i] = t; owner.armed = True  # noqa: E501,E702
        if self.used > self.peak_used:
            self.peak_used = self.used
        self.counts.planned += 1
        return pointer

    def _serve_unplanned(self, rs: int) -> Any:
        """Off plan: in an arena gap while a placer is on, else memory of its own; logged."""
        placer = self._placer
        if placer is not None:
            self._placer = None  # taken while it works: one cut short is not used again
            lo = placer.place(rs)
            self._placer = placer
            if lo >= 0:
                arena = self.arena
                assert arena is not None  # the placer places in it
                return self._serve_placed(arena, lo, rs)
            if lo == _APART:  # the size of a survivor
                return self._serve_recorded(self._kept(rs), rs, _KEPT)
        block = self._reuse(rs)  # the stock pool's idle memory first
        if block is not None:
            return self._serve_recorded(block, rs, _STOCK)
        return self._serve_recorded(self._exact(rs), rs, _EXACT)

    def _serve_placed(self, arena: Arena, lo: int, rs: int) -> Any:
        """The next request in the gap at ``lo``; checked by address, as overdue blocks are."""
        i = self.n
        it = self.iteration
        t = self._tick
        self._room_in_log(i)
        span = (lo, lo + rs, it)
        owner = _release(self.inbox, i, it, rs, arena, None, _ARENA)
        pointer = self._pointer_type(self._memory_type(arena.ptr + lo, rs, owner,
                                                       self._device_id), 0)
        # the commit, one line (see "Commits" in frees.py)
        arena.overdue[(it << 32) | i] = span; self.used += rs; self.n = i + 1; self._tick = t + 1; self._obs_sizes[i] = rs; self._obs_lowers[i] = t; owner.armed = True  # noqa: E501,E702
        if self.used > self.peak_used:
            self.peak_used = self.used
        self.counts.departed += 1
        return pointer

    def _serve_off_plan(self, block: Any, rs: int, pinned: bool, source: int) -> Any:
        """The next request of a planned iteration in ``block``, not the arena.

        ``pinned``: the plan keeps it apart (a survivor); else it departs.
        """
        i = self.n
        t = self._tick
        owner = _release(self.inbox, i, self.iteration, rs, None, block, source)
        pointer = self._pointer_type(self._memory_type(block.ptr, rs, owner, self._device_id), 0)
        # the commit, one line (see "Commits" in frees.py)
        self._source_used[source] += rs; self.used += rs; self.n = i + 1; self._tick = t + 1; self._obs_lowers[i] = t; self._obs_sizes[i] = rs; owner.armed = True  # noqa: E501,E702
        if self.used > self.peak_used:
            self.peak_used = self.used
        if pinned:
            self.counts.pinned += 1
        else:
            self.counts.departed += 1
        return pointer

    def _serve_recorded(self, block: Any, rs: int, source: int) -> Any:
        """The next request of an iteration not served by the plan, in ``block``, logged.

        The log is the profile (warm-up, profiling) or goes into the next plan
        (after a departure).
        """
        i = self.n
        t = self._tick
        self._room_in_log(i)
        owner = _release(self.inbox, i, self.iteration, rs, None, block, source)
        pointer = self._pointer_type(self._memory_type(block.ptr, rs, owner, self._device_id), 0)
        # the commit, one line (see "Commits" in frees.py)
        self._source_used[source] += rs; self.used += rs; self.n = i + 1; self._tick = t + 1; self._obs_sizes[i] = rs; self._obs_lowers[i] = t; owner.armed = True  # noqa: E501,E702
        if self.used > self.peak_used:
            self.peak_used = self.used
        if self._planned_iter:
            self.counts.departed += 1
        else:
            self.counts.profiled += 1
        return pointer

    def _check_due(self, due: tuple[int, ...]) -> None:
        """Blocks planned to be freed by now that are still alive become overdue."""
        rows = self._rows
        arena = self.arena
        assert arena is not None  # a block planned dead by now lived in it
        overdue = arena.overdue
        for j in due:
            it = self._slot[j]
            if it != NO_SLOT:
                row = rows[j]
                o = row[_OFFSET]
                span = (o, o + row[_CAP], it)
                # one line (see "Commits" in frees.py): listed overdue before the slot is let go
                overdue[(it << 32) | j] = span; self._slot[j] = NO_SLOT; self._live_slots -= 1  # noqa: E702

    # ------------------------------------------------------------------- frees
    def drain(self) -> None:
        """Apply queued frees in the order they happened (the engine is held).

        Each free is applied exactly once, also when an exception (a Ctrl-C)
        cuts a drain short: its entry is cleared in the same line as its
        books (see "Commits" in frees.py), and a later drain skips cleared
        entries."""
        inbox = self.inbox
        m = inbox.count
        if m:
            keys, sizes, arenas = inbox.keys, inbox.sizes, inbox.arenas
            for k in range(m):  # frees recorded meanwhile land after m, for the next drain
                packed = sizes[k]
                if packed:  # 0: applied by a drain cut short
                    key = keys[k]
                    self._apply_free((key & _KEY_LOW) - 1, (key >> 32) - _KEY_BIAS,
                                     packed & _ROUND_MASK, arenas[k], packed & _SOURCE_BITS,
                                     sizes, k, 0)
                arenas[k] = None  # an old arena may go here: its frees land after m
            inbox.consumed(m)
        items = inbox.items
        m = len(items)
        if m:
            for k in range(m):  # frees queued meanwhile land after m, for the next drain
                owner = items[k]
                if owner is not None:  # None: applied by a drain cut short
                    self._apply_free(owner.index, owner.iteration, owner.size, owner.arena,
                                     owner.source, items, k, None)
            if len(items) == m:
                items.clear()
            else:
                del items[:m]

    def _apply_free(self, index: int, it: int, rs: int, arena: Arena | None, source: int,
                    entries: list, k: int, cleared: Any) -> None:
        """One free, in its turn: the bytes, the slot or overdue entry, the clock; its inbox
        entry (``entries[k]``) becomes ``cleared`` in the same line as its books."""
        logged = it == self.iteration and self._logging_frees
        t = self._tick
        if arena is not None:
            if arena is self.arena and index < len(self._slot) and self._slot[index] == it:
                # one line (see "Commits" in frees.py)
                self._slot[index] = NO_SLOT; self._live_slots -= 1; self.used -= rs; entries[k] = cleared; self._tick = t + logged  # noqa: E501,E702
                if logged:
                    self._obs_uppers[index] = t
                placer = self._placer
                if placer is not None:
                    row = self._rows[index]
                    self._placer = None  # taken while it works (see _serve_unplanned)
                    placer.release(row[_OFFSET], row[_OFFSET] + row[_CAP])
                    self._placer = placer
                return
            overdue = arena.overdue
            key = (it << 32) | index
            span = overdue[key]
            # one line (see "Commits" in frees.py)
            del overdue[key]; self.used -= rs; entries[k] = cleared; self._tick = t + logged  # noqa: E702
            if logged:
                self._obs_uppers[index] = t
            placer = self._placer
            if placer is not None and arena is self.arena:
                self._placer = None  # taken while it works (see _serve_unplanned)
                placer.release(span[0], span[1])
                self._placer = placer
            if not overdue and arena is not self.arena:
                self._on_arena_idle(arena)
            return
        # arena bytes are the rest: used - the other sources (see arena_used); one line
        self._source_used[source] -= rs; self.used -= rs; entries[k] = cleared; self._tick = t + logged  # noqa: E501,E702
        if logged:
            self._obs_uppers[index] = t
        elif it == WATCHED:
            self.watched_frees += 1
