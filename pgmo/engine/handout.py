"""Where every block is handed out, and where its free comes back: the hot path.

Plain Python, or compiled by Cython when pgmo was installed with a C compiler
(types in ``handout.pxd``; :data:`COMPILED` says which; tests run both).

A handed-out block is a memory object ``memory_type(ptr, size, owner,
device_id)`` (CuPy's ``UnownedMemory``, each at offset 0, as Chainer's
``F.as_strided`` needs) whose *owner* is a :class:`~.frees.Release`, whose
death is the block's free (see :mod:`.frees`); the engine applies queued
frees in order at its next call (:meth:`HotPath.drain`).  A block's *source*
says where its memory comes from (:mod:`.memory` obtains and releases all).

:meth:`HotPath.serve_inline` answers the owner thread's usual requests;
the rare ones go to the engine's slow path (``HotPath.slow``, see
:mod:`.core`), which only decides: both hand out through the ``serve_*``
methods, where a request is numbered, logged and counted.  The engine
changes this object only through its methods: its fields are its own.
"""

from __future__ import annotations

import array
import logging
import threading

from pgmo.units import ALIGNMENT

from .frees import (APART, ARENA, EXACT, KEPT, KEY_BIAS, KEY_LOW, SOURCE_BITS, STOCK, Counts,
                    Inbox, Release)

__all__ = ["HotPath", "COMPILED", "NO_SLOT", "NOT_FREED", "new_slots", "new_log", "OUTSIDE",
           "WATCHED", "SLOW", "PLANNED", "RECORDED", "FALLBACK", "INLINE_MAX"]

log = logging.getLogger("pgmo.pool")

# The calling thread's id: compiled, the C function ``handout.pxd`` binds; as plain
# Python, threading's (through globals(): Cython sees no assignment to its C name).
globals().setdefault("PyThread_get_thread_ident", threading.get_ident)

#: ``HotPath.slot[i]`` when request ``i`` has no live block in the current arena.
NO_SLOT = -1
#: Iteration number of blocks outside any iteration's plan.
OUTSIDE = -1
#: Iteration number of blocks watched while looking for a repeating loop.
WATCHED = -3

try:
    import cython

    COMPILED = cython.compiled
except ImportError:  # Cython is a build dependency only
    COMPILED = False

# frees.py's constants and the allocation unit, as C integers when compiled (handout.pxd).
_ARENA, _STOCK, _EXACT, _KEPT = ARENA, STOCK, EXACT, KEPT
_SOURCE_BITS, _KEY_BIAS, _KEY_LOW, _APART = SOURCE_BITS, KEY_BIAS, KEY_LOW, APART
_ROUND_UP, _ROUND_MASK = ALIGNMENT - 1, -ALIGNMENT

#: Larger requests always take the slow path (they cannot fit a C integer, or a device).
INLINE_MAX = 1 << 62

#: What the owner thread's requests are right now (``HotPath.kind``, set by the engine).
SLOW = 0  # only the engine's slow path knows (watching for a loop, a boundary due...)
PLANNED = 1  # numbered, answered from the schedule
RECORDED = 2  # numbered and logged, each in memory of its own (warm-up, profiling, departed)
FALLBACK = 3  # not numbered: interrupted, or between iterations: CuPy's stock pool

#: ``obs_uppers[i]`` of a request not freed (yet).
NOT_FREED = -1


def new_slots(n):
    """``slot`` for ``n`` requests, none live (a C array of 64-bit integers)."""
    return array.array("q", [NO_SLOT]) * n


def new_log(n):
    """Empty log arrays (lowers, uppers, sizes: :meth:`.Trace.columns`' order) for ``n`` requests."""
    return (array.array("q", [0]) * n, array.array("q", [NOT_FREED]) * n,
            array.array("q", [0]) * n)


def _release(inbox, index, iteration, size, arena, keep, source):
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
    return owner


class HotPath:
    """The state every allocation touches, and the code that hands blocks out.

    ``kind``: what the owner's next request is.  ``rows[i] = (cap, offset,
    due)`` per planned request, then the sentinel ``(-1, -1, ())``: planned
    size, offset (-1: a survivor, kept apart), requests planned dead by then.
    ``slot[i]``: the iteration whose block ``i`` lives in the arena under this
    plan, else :data:`NO_SLOT`.  ``max_n``: a detected iteration's length.
    ``exact(rs)``, ``kept(rs)``, ``stock``: the other sources (:mod:`.memory`);
    ``limited``: stock requests take the slow path, which keeps the limit.
    ``used``/``source_used``: live bytes; ``counts``: requests served.
    """

    def __init__(self, memory_type, pointer_type, device_id, slow):
        self.inbox = Inbox()
        self.memory_type = memory_type
        self.pointer_type = pointer_type
        self.device_id = device_id
        self.slow = slow  # the engine's slow path: slow(size) -> pointer
        self.on_arena_idle = None  # an old arena's last block was freed
        self.stock = self.exact = self.kept = self.reuse = None  # the sources (connect)
        self.between = None  # serves the owner's requests between iterations (connect)
        self.between_source = _STOCK
        self.placer = None  # places off-plan requests in the arena's gaps (see .placement)
        self.limited = False
        self.context = None  # callable naming the device/stream, or None
        self.ctx = None  # the iteration's context
        self.owner = PyThread_get_thread_ident()  # the thread running the hot loop
        self.kind = SLOW
        self.solo = True  # only the owner has used the engine so far
        self.busy = False  # the owner is inside the inline path
        self.in_iter = False
        self.planned_iter = False  # the iteration started with the schedule in use
        self.rows = [(-1, -1, ())]
        self.addresses = [0]  # arena.ptr + offset, per row (see aim)
        self.slot = new_slots(0)
        self.arena = None
        self.iteration = 0  # number of the current (or last) iteration
        self.logging_frees = False  # frees of this iteration's blocks tick the clock
        self.n = 0  # requests numbered in this iteration
        self.max_n = 1 << 62
        self.tick = 0  # the event clock
        # The iteration's log (see .recording): per request its alloc tick, free
        # tick (NOT_FREED until freed) and rounded size (0: as planned), in C
        # arrays so that logging creates no Python objects.
        self.obs_lowers = self.obs_uppers = self.obs_sizes = new_log(0)[0]
        self.open_log(0)
        self.thread_hooks = None  # callable: the calling thread's memory hooks (CuPy)
        self.owner_hooks = None  # the owner thread's memory hooks (a dict), if any
        self.hooked = None  # serves a request while reporting it to the hooks
        self.live_slots = 0  # entries of slot that are not NO_SLOT
        self.watched_frees = 0  # frees of blocks watched for a repeating loop
        self.used = 0  # bytes of live blocks, every source
        self.source_used = array.array("q", [0, 0, 0, 0])  # per source, but arena_used()
        self.peak_used = 0
        self.counts = Counts()

    # ------------------------------------------------------- the engine's calls
    def connect(self, stock, exact, kept, reuse, context, on_arena_idle, between,
                between_source):
        """The memory sources, the request's device/stream, who hears an old arena go idle;
        ``between(rs)`` serves the owner's requests between iterations, from
        ``between_source``."""
        self.stock = stock
        self.exact = exact
        self.kept = kept
        self.reuse = reuse
        self.context = context
        self.on_arena_idle = on_arena_idle
        self.between = between
        self.between_source = between_source

    def share(self):
        """Another thread came in: from now on the owner takes the engine's lock too."""
        self.solo = False

    def set_limited(self, limited):
        self.limited = limited

    def set_placer(self, placer):
        self.placer = placer

    def connect_hooks(self, thread_hooks, hooked, owner_hooks):
        self.thread_hooks = thread_hooks
        self.hooked = hooked
        self.owner_hooks = owner_hooks

    def set_kind(self, kind, in_iter):
        self.kind, self.in_iter = kind, in_iter

    def begin(self, owner, owner_hooks, ctx, planned, max_n, log_size):
        """Start the next iteration: numbering and the clock restart, a fresh log."""
        self.iteration += 1
        self.owner = owner
        self.owner_hooks = owner_hooks
        self.ctx = ctx
        self.n = 0
        self.tick = 0
        self.logging_frees = True
        self.planned_iter = planned
        self.max_n = max_n
        self.placer = None
        self.open_log(log_size)

    def end(self):
        """The iteration is over: frees no longer tick its clock; no more placing."""
        self.logging_frees = False
        self.placer = None

    def install(self, rows, addresses=None):
        """Answer from these rows from now on (a new plan; no slot is live); ``addresses``:
        each row's address in the current arena, when the engine has them already."""
        self.rows = rows
        self.slot = new_slots(len(rows) - 1)
        self.live_slots = 0
        if addresses is None:
            self.aim()
        else:
            self.addresses = addresses

    def set_arena(self, arena):
        self.arena = arena
        self.aim()

    def retire(self):
        """Live blocks of the current plan are no longer accounted for: overdue."""
        if not self.live_slots:
            return
        rows = self.rows
        overdue = self.arena.overdue
        for j in range(len(self.slot)):
            it = self.slot[j]
            if it != NO_SLOT:
                self.slot[j] = NO_SLOT
                o = rows[j][1]
                overdue[(it << 32) | j] = (o, o + rows[j][0], it)
        self.live_slots = 0

    def reset_peak(self):
        self.peak_used = self.used

    def arena_used(self):  # the only source not counted block by block
        used = self.source_used
        return self.used - used[_STOCK] - used[_EXACT] - used[_KEPT]

    def arena_idle(self, arena):
        """Whether no block lives in ``arena``."""
        return not arena.overdue and (arena is not self.arena or not self.live_slots)

    # ------------------------------------------------------------------ malloc
    def malloc(self, size):
        """Allocate ``size`` bytes: inline for the owner's usual requests, else the slow path.

        With memory hooks registered the slow path serves (and reports).  The
        inline path runs without the lock while only the owner has used the
        engine: it publishes ``busy`` and re-checks ``solo``; another thread
        clears ``solo`` under the lock, then waits for ``busy`` to drop.
        """
        kind = self.kind
        if kind != SLOW and self.solo and PyThread_get_thread_ident() == self.owner \
                and type(size) is int and 0 < size < INLINE_MAX \
                and not self.owner_hooks:  # others: the slow path checks and reports
            self.busy = True
            try:
                if self.solo:
                    inbox = self.inbox
                    if inbox.count or inbox.items:
                        self.drain()
                    result = self.serve_inline(size, kind)
                    if result is not None:
                        return result
            except MemoryError:
                pass  # the slow path makes room and tries again
            finally:
                self.busy = False
        return self.slow(size)

    def serve_inline(self, size, kind):
        """Serve a request of the usual ``kind``; None (nothing changed) when the engine must decide.

        A MemoryError of a source changes nothing either.  The caller holds
        the engine or is its solo owner.
        """
        rs = (size + _ROUND_UP) & _ROUND_MASK
        if kind == FALLBACK:
            if self.limited:
                return None
            if self.in_iter:  # interrupted: CuPy's stock pool
                pointer = self.outside_block(self.stock.malloc(size), rs, -1, OUTSIDE, _STOCK)
                self.counts.interrupted += 1
            else:
                pointer = self.outside_block(self.between(rs), rs, -1, OUTSIDE,
                                             self.between_source)
                self.counts.outside += 1
            return pointer
        i = self.n
        if i >= self.max_n:
            return None
        if self.context is not None and self.context() != self.ctx:
            return None
        if kind == PLANNED:
            row = self.rows[i]  # the sentinel sends request n on
            cap = row[0]
            o = row[1]
            due = row[2]
            if rs > cap:
                return None
            if due:
                self.check_due(due)
            if o < 0:  # a survivor: its kept buffer
                return self.serve_off_plan(self.kept(rs), rs, True, _KEPT)
            arena = self.arena
            if arena.overdue:
                return None
            return self.serve_planned(arena, row[0] if rs == cap else rs, rs)
        return self.serve_unplanned(rs)

    def aim(self):
        """Compute each planned request's address; after the rows or the arena change."""
        arena = self.arena
        base = arena.ptr if arena is not None else 0
        self.addresses = [base + row[1] if row[1] >= 0 else 0 for row in self.rows]

    def open_log(self, n):
        """A fresh log with room for ``n`` requests (it grows when needed)."""
        lowers, uppers, sizes = new_log(n)
        self.obs_lowers = lowers
        self.obs_uppers = uppers
        self.obs_sizes = sizes
        self.log_arrays = (lowers, uppers, sizes)  # the same arrays, for Python readers

    def record(self, i, tick, rs):
        """Log request ``i`` (not served by the plan) on the event clock."""
        if i >= len(self.obs_sizes):  # double the room, copying what is there
            lowers, uppers, sizes = new_log(2 * i + 16)
            for k in range(i):
                lowers[k] = self.obs_lowers[k]
                uppers[k] = self.obs_uppers[k]
                sizes[k] = self.obs_sizes[k]
            self.obs_lowers = lowers
            self.obs_uppers = uppers
            self.obs_sizes = sizes
            self.log_arrays = (lowers, uppers, sizes)
        self.obs_sizes[i] = rs
        self.obs_lowers[i] = tick

    # --------------------------------------------------------------- hand-outs
    # What serving a request does, written once for the inline and the slow path.
    def serve_planned(self, arena, size, rs):
        """The next request at its planned place, checked free; ``size``: ``rs`` as an object.

        Logs its alloc tick (its size stays 0: as planned).
        """
        i = self.n
        it = self.iteration
        owner = _release(self.inbox, i, it, rs, arena, None, _ARENA)
        self.slot[i] = it
        self.live_slots += 1
        used = self.used + rs
        self.used = used
        if used > self.peak_used:
            self.peak_used = used
        self.counts.planned += 1
        pointer = self.pointer_type(self.memory_type(self.addresses[i], size, owner,
                                                     self.device_id), 0)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.obs_lowers[i] = t
        return pointer

    def serve_unplanned(self, rs):
        """Off plan: in an arena gap while a placer is on, else memory of its own; logged."""
        placer = self.placer
        if placer is not None:
            lo = placer.place(rs)
            if lo >= 0:
                return self.serve_placed(self.arena, lo, rs)
            if lo == _APART:  # the size of a survivor
                return self.serve_recorded(self.kept(rs), rs, _KEPT)
        block = self.reuse(rs)  # the stock pool's idle memory first
        if block is not None:
            return self.serve_recorded(block, rs, _STOCK)
        return self.serve_recorded(self.exact(rs), rs, _EXACT)

    def serve_placed(self, arena, lo, rs):
        """The next request in the gap at ``lo``; checked by address, as overdue blocks are."""
        i = self.n
        it = self.iteration
        owner = _release(self.inbox, i, it, rs, arena, None, _ARENA)
        arena.overdue[(it << 32) | i] = (lo, lo + rs, it)
        used = self.used + rs
        self.used = used
        if used > self.peak_used:
            self.peak_used = used
        pointer = self.pointer_type(self.memory_type(arena.ptr + lo, rs, owner, self.device_id),
                                    0)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.record(i, t, rs)
        self.counts.departed += 1
        return pointer

    def serve_off_plan(self, block, rs, pinned, source):
        """The next request of a planned iteration in ``block``, not the arena.

        ``pinned``: the plan keeps it apart (a survivor); else it departs.
        """
        i = self.n
        pointer = self.outside_block(block, rs, i, self.iteration, source)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.obs_lowers[i] = t
        self.obs_sizes[i] = rs
        if pinned:
            self.counts.pinned += 1
        else:
            self.counts.departed += 1
        return pointer

    def serve_recorded(self, block, rs, source):
        """The next request of an iteration not served by the plan, in ``block``, logged.

        The log is the profile (warm-up, profiling) or goes into the next plan
        (after a departure).
        """
        i = self.n
        pointer = self.outside_block(block, rs, i, self.iteration, source)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.record(i, t, rs)
        if self.planned_iter:
            self.counts.departed += 1
        else:
            self.counts.profiled += 1
        return pointer

    def outside_block(self, block, rs, index, iteration, source):
        """Hand out ``block`` (not the arena's); its memory goes back where it came from."""
        owner = _release(self.inbox, index, iteration, rs, None, block, source)
        self.source_used[source] += rs
        used = self.used + rs
        self.used = used
        if used > self.peak_used:
            self.peak_used = used
        return self.pointer_type(self.memory_type(block.ptr, rs, owner, self.device_id), 0)

    def check_due(self, due):
        """Blocks planned to be freed by now that are still alive become overdue."""
        rows = self.rows
        overdue = self.arena.overdue
        for j in due:
            it = self.slot[j]
            if it != NO_SLOT:
                self.slot[j] = NO_SLOT
                self.live_slots -= 1
                row = rows[j]
                o = row[1]
                overdue[(it << 32) | j] = (o, o + row[0], it)

    # ------------------------------------------------------------------- frees
    def drain(self):
        """Apply queued frees in the order they happened (the engine is held)."""
        inbox = self.inbox
        m = inbox.count
        if m:
            keys, sizes, arenas = inbox.keys, inbox.sizes, inbox.arenas
            for k in range(m):  # frees recorded meanwhile land after m, for the next drain
                key = keys[k]
                arena = arenas[k]
                arenas[k] = None  # an old arena may go here: its frees land after m
                packed = sizes[k]
                self.apply_free((key & _KEY_LOW) - 1, (key >> 32) - _KEY_BIAS,
                                packed & _ROUND_MASK, arena, packed & _SOURCE_BITS)
            inbox.consumed(m)
        items = inbox.items
        m = len(items)
        if m:
            for k in range(m):  # frees queued meanwhile land after m, for the next drain
                owner = items[k]
                self.apply_free(owner.index, owner.iteration, owner.size, owner.arena,
                                owner.source)
            if len(items) == m:
                items.clear()
            else:
                del items[:m]

    def apply_free(self, index, it, rs, arena, source):
        """One free, in its turn: the bytes, the slot or overdue entry, the clock."""
        self.used -= rs
        if arena is not None:
            if arena is self.arena and index < len(self.slot) and self.slot[index] == it:
                self.slot[index] = NO_SLOT
                self.live_slots -= 1
                if self.placer is not None:
                    row = self.rows[index]
                    self.placer.release(row[1], row[1] + row[0])
            else:
                overdue = arena.overdue
                span = overdue.pop((it << 32) | index)
                if self.placer is not None and arena is self.arena:
                    self.placer.release(span[0], span[1])
                if not overdue and arena is not self.arena:
                    self.on_arena_idle(arena)
        else:  # arena bytes are the rest: used - the other sources (see arena_used)
            self.source_used[source] -= rs
        if it == self.iteration and self.logging_frees:
            self.obs_uppers[index] = self.tick
            self.tick += 1
        elif it == WATCHED:
            self.watched_frees += 1
