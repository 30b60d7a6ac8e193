"""Where every block is handed out, and where its free comes back.

This module is the pool's hot path.  The same source runs as plain Python
and, when pgmo was installed with a C compiler, compiled by Cython (with the
types in ``handout.pxd``); :data:`COMPILED` says which one is loaded.  The
tests replay the same traces through both and compare every address.

A handed-out block is a memory object built by ``memory_type(ptr, size,
owner, device_id)`` (CuPy's ``UnownedMemory`` in the pool) whose *owner* is a
:class:`Release`.  CuPy drops the owner when the memory object dies, so the
owner's ``__del__`` is the block's free: it happens exactly when the user's
last array on the block goes away, from any thread, from the garbage
collector, or after the pool itself is gone.  ``__del__`` only queues the
Release in the engine's :class:`Inbox`; the engine applies queued frees, in
the order they happened, at its next call (:meth:`HotPath.drain`).  Each
request gets its own memory object at offset 0, which is what Chainer's
``F.as_strided`` needs.

:meth:`HotPath.serve_inline` answers the owner thread's usual requests: a
planned request whose block is free by the plan's schedule, a request
recorded while warming up or profiling, an interrupted one.  The rare events
(a request larger than planned, a block kept past its planned free, another
thread or stream, a full device, finding iterations nobody marked) go to the
engine's slow path (``HotPath.slow``, see :mod:`.core`), which only decides:
both hand out a numbered request through the same ``serve_*`` methods, where
it is numbered, logged and counted.
"""

from __future__ import annotations

import array
import logging
import threading

from ..units import ALIGNMENT

__all__ = ["Arena", "Inbox", "Release", "HotPath", "COMPILED", "NO_SLOT", "NOT_FREED",
           "new_slots", "new_log", "OUTSIDE", "WATCHED",
           "SLOW", "PLANNED", "RECORDED", "FALLBACK"]

log = logging.getLogger("pgmo.pool")

# The calling thread's id.  Compiled, ``handout.pxd`` binds this name to the C
# function of the same name; as plain Python it is threading's (set through
# globals() so that Cython sees no assignment to its C name).
globals().setdefault("PyThread_get_thread_ident", threading.get_ident)

#: ``HotPath.slot[i]`` when request ``i`` has no live block in the current arena.
NO_SLOT = -1
#: Iteration number of blocks outside any iteration's plan (fallback only).
OUTSIDE = -1
#: Iteration number of blocks watched while looking for a repeating loop.
WATCHED = -3

try:
    import cython

    COMPILED = cython.compiled
except ImportError:  # Cython is a build dependency only
    COMPILED = False


class Arena:
    """One raw allocation that planned blocks are carved from.

    ``overdue`` maps ``(iteration << 32) | request`` to ``(lo, hi, iteration)``
    for the live blocks the current plan does not account for (kept past
    their planned free, or left from an earlier iteration or plan).  With the
    current plan's live slots, these are all of the arena's live blocks.
    """

    def __init__(self, buffer, size):
        self.buffer = buffer  # keeps the raw memory alive
        self.ptr = int(buffer.ptr)
        self.size = size
        self.overdue = {}


#: Iterations are >= WATCHED and requests >= -1: ``record`` packs both in one key.
_KEY_BIAS = 8
_INBOX_KEEP = 4096  # pending-free slots kept between drains
_KEY_LOW = 0xFFFFFFFF  # typed when compiled: a literal this wide would be a Python int


class Inbox:
    """Frees not yet applied, in the order they happened; closed when the engine is gone.

    Compiled, a :class:`Release` records its free here from its C destructor
    (:meth:`record`).  A destructor can run in the middle of any allocation
    (the cycle collector frees things there), so :meth:`record` only stores
    integers and an arena into lists: it allocates no object the collector
    tracks, so no collection, and no second free, can start inside it.  The
    first ``count`` entries are pending; the lists keep their length between
    drains, so a steady loop stores into slots it already has.  As plain
    Python a Release queues itself in ``items`` from ``__del__``: one list
    append, atomic even when two threads free at once.
    """

    def __init__(self):
        self.items = []  # Releases queued by __del__ (plain Python)
        self.keys = []  # frees recorded by record() (compiled): pack(request, iteration),
        self.sizes = []  # rounded size,
        self.arenas = []  # and arena (None: a fallback block, or a slot already applied)
        self.count = 0
        self.closed = False

    def record(self, index, iteration, size, arena):
        """Note one free (compiled only: called from a destructor, holding the GIL)."""
        key = ((iteration + _KEY_BIAS) << 32) | (index + 1)
        n = self.count
        if n < len(self.keys):
            self.keys[n] = key
            self.sizes[n] = size
            self.arenas[n] = arena  # the slot held None: no destructor runs here
        else:
            self.keys.append(key)
            self.sizes.append(size)
            self.arenas.append(arena)
        self.count = n + 1

    def consumed(self, m):
        """The first ``m`` entries are applied: move later ones to the front."""
        keys, sizes, arenas = self.keys, self.sizes, self.arenas
        n = self.count
        for k in range(m, n):  # frees recorded while the first m were applied
            keys[k - m] = keys[k]
            sizes[k - m] = sizes[k]
            arenas[k - m] = arenas[k]
            arenas[k] = None
        self.count = n - m
        if self.count == 0 and len(keys) > _INBOX_KEEP:  # after a burst: give the room back
            del keys[:], sizes[:], arenas[:]

    def close(self):
        """The engine is gone: later frees release their memory and queue nothing."""
        self.closed = True
        self.count = 0
        del self.items[:], self.keys[:], self.sizes[:], self.arenas[:]


class Release:
    """The owner of one handed-out memory object: its death is the block's free.

    ``arena`` keeps the arena's memory alive as long as the block; ``keep``
    holds the fallback pool's block, given back at once on free.  ``on_free``
    (memory hooks) is called in the freeing thread.  Made by :func:`_release`.
    """

    def __dealloc__(self):
        # Compiled: the C destructor, run as the memory object lets go of its
        # owner.  (Plain Python never calls it; it gets __del__ below.)
        if self.on_free is not None:
            self.report_free()
        inbox = self.inbox
        if not inbox.closed:
            inbox.record(self.index, self.iteration, self.size, self.arena)

    def report_free(self):
        on_free = self.on_free
        self.on_free = None
        try:
            on_free()
        except Exception:  # a hook must never break a free
            log.exception("memory hook failed on free")


def _queue_free(self):
    """``Release.__del__`` as plain Python: queue the Release (resurrected until drained)."""
    if self.on_free is not None:
        self.report_free()
    self.keep = None  # give the fallback block back at once
    inbox = self.inbox
    if inbox.closed:
        self.arena = None
    else:
        inbox.items.append(self)


if not COMPILED:
    Release.__del__ = _queue_free


# The allocation unit, as C integers when compiled (see handout.pxd).
_ROUND_UP = ALIGNMENT - 1
_ROUND_MASK = -ALIGNMENT

#: Larger requests always take the slow path (they cannot fit a C integer, or a device).
INLINE_MAX = 1 << 62

#: What the owner thread's requests are right now (``HotPath.kind``, set by the engine).
SLOW = 0  # only the engine's slow path knows (watching for a loop, a boundary due...)
PLANNED = 1  # numbered, answered from the schedule
RECORDED = 2  # numbered and logged, served by the fallback (warm-up, profiling, diverged)
FALLBACK = 3  # not numbered: interrupted, or outside iterations


#: ``obs_uppers[i]`` of a request not freed (yet).
NOT_FREED = -1


def new_slots(n):
    """``slot`` for ``n`` requests, none live (a C array of 64-bit integers)."""
    return array.array("q", [NO_SLOT]) * n


def new_log(n):
    """Empty log arrays (lowers, uppers, sizes: :meth:`.Trace.columns`' order) for ``n`` requests."""
    return (array.array("q", [0]) * n, array.array("q", [NOT_FREED]) * n,
            array.array("q", [0]) * n)


def _release(inbox, index, iteration, size, arena, keep):
    """A new :class:`Release` (without ``__init__``: compiled, this is a plain C allocation)."""
    owner = Release.__new__(Release)
    owner.inbox = inbox
    owner.index = index
    owner.iteration = iteration
    owner.size = size
    owner.arena = arena
    owner.keep = keep
    owner.on_free = None
    return owner


class HotPath:
    """The state every allocation touches, and the code that hands blocks out.

    The engine (:mod:`.core`) owns this object and sets its fields at
    iteration boundaries and state changes; between them only
    :meth:`malloc`, the slow path and :meth:`drain` change it.  Fields:

    * ``kind``: what the owner thread's next request is (:data:`PLANNED`,
      :data:`RECORDED`, :data:`FALLBACK`, or :data:`SLOW` for the engine).
    * ``rows[i] = (cap, offset, due)`` for each planned request, then a
      sentinel ``(-1, -1, ())``: the planned (rounded) size, the offset in
      the arena (-1: pinned to the fallback), and the requests planned to be
      freed by request ``i``'s allocation.
    * ``slot[i]``: the iteration whose block ``i`` is live in the current
      arena under the current plan, else :data:`NO_SLOT`.
    * ``arena``: the current :class:`Arena`.
    * ``max_n``: requests after which the engine must see the next one (a
      detected iteration's length).
    """

    def __init__(self, memory_type, pointer_type, device_id, slow, on_arena_idle):
        self.inbox = Inbox()
        self.memory_type = memory_type
        self.pointer_type = pointer_type
        self.device_id = device_id
        self.slow = slow  # the engine's slow path: slow(size) -> pointer
        self.on_arena_idle = on_arena_idle  # an old arena's last block was freed
        self.fallback = None  # the pool serving what the plan does not
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
        self.used = 0  # bytes of live blocks (arena and fallback)
        self.fb_used = 0  # bytes of live fallback blocks
        self.peak_used = 0
        self.planned_requests = 0
        self.profiled_requests = 0
        self.fallback_requests = 0
        self.pinned_requests = 0
        self.interrupted_requests = 0
        self.other_requests = 0

    # ------------------------------------------------------------------ malloc
    def malloc(self, size):
        """Allocate ``size`` bytes: inline for the owner's usual requests, else the slow path.

        Requests made while memory hooks are registered take the slow path,
        which reports them.  The inline path runs without the engine's lock
        while only the owner thread has used the engine: the owner publishes ``busy`` and
        re-checks ``solo``; another thread clears ``solo`` under the lock and
        then waits for ``busy`` to drop (see ``Engine.__enter__``), so the two
        never run engine code at once.
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
        """Serve a request of the usual ``kind``; None when the engine must decide.

        Returns None before changing anything (checking due blocks is
        idempotent); a MemoryError of the fallback leaves everything as it
        was too.  The caller holds the engine or is its solo owner.
        """
        rs = (size + _ROUND_UP) & _ROUND_MASK
        if kind == FALLBACK:
            pointer = self.fallback_block(self.fallback.malloc(size), rs, -1, OUTSIDE)
            if self.in_iter:
                self.interrupted_requests += 1
            else:
                self.other_requests += 1
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
            if o < 0:  # pinned: it outlived its iteration when profiled
                return self.serve_off_plan(self.fallback.malloc(size), rs, True)
            arena = self.arena
            if arena.overdue:
                return None
            # The row's boxed size: no new integer object on the hot path.
            return self.serve_planned(arena, row[0] if rs == cap else rs, rs)
        return self.serve_recorded(self.fallback.malloc(size), rs)

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

    def log_columns(self, n):
        """The first ``n`` requests of the log as lists (lowers, uppers, sizes); open: None."""
        lowers = [self.obs_lowers[i] for i in range(n)]
        uppers = [None if self.obs_uppers[i] == NOT_FREED else self.obs_uppers[i]
                  for i in range(n)]
        sizes = [self.obs_sizes[i] for i in range(n)]
        return lowers, uppers, sizes

    def survivors(self, n):
        """The first ``n`` requests whose block is still live (not freed in the log)."""
        return [i for i in range(n) if self.obs_uppers[i] == NOT_FREED]

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
        self.obs_sizes[i] = rs
        self.obs_lowers[i] = tick

    # --------------------------------------------------------------- hand-outs
    # What serving a request does to the pool's state, written once: the
    # inline path above and the engine's slow path (which decides where a
    # request goes when this path cannot) both hand out through these.
    def serve_planned(self, arena, size, rs):
        """The next request at its planned place in ``arena``, already checked to be free.

        ``size`` is ``rs`` (the rounded size) as a Python integer.  Numbers the
        request and logs its alloc tick (its size stays 0: as planned).
        """
        i = self.n
        it = self.iteration
        owner = _release(self.inbox, i, it, rs, arena, None)
        self.slot[i] = it
        self.live_slots += 1
        used = self.used + rs
        self.used = used
        if used > self.peak_used:
            self.peak_used = used
        self.planned_requests += 1
        # The precomputed address: no new integer object either.
        pointer = self.pointer_type(self.memory_type(self.addresses[i], size, owner,
                                                     self.device_id), 0)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.obs_lowers[i] = t
        return pointer

    def serve_off_plan(self, block, rs, pinned):
        """The next request of a planned iteration, served by the fallback's ``block``.

        ``pinned``: the plan sends it there (it outlived its iteration when
        profiled); else it departs from the plan.  Logs its tick and size.
        """
        i = self.n
        pointer = self.fallback_block(block, rs, i, self.iteration)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.obs_lowers[i] = t
        self.obs_sizes[i] = rs
        if pinned:
            self.pinned_requests += 1
        else:
            self.fallback_requests += 1
        return pointer

    def serve_recorded(self, block, rs):
        """The next request of an iteration not served by the plan, from the fallback's ``block``.

        Logged for the profile (warm-up, profiling) or the next plan (the
        rest of a planned iteration after a departure).
        """
        i = self.n
        pointer = self.fallback_block(block, rs, i, self.iteration)
        t = self.tick
        self.n = i + 1
        self.tick = t + 1
        self.record(i, t, rs)
        if self.planned_iter:
            self.fallback_requests += 1
        else:
            self.profiled_requests += 1
        return pointer

    def fallback_block(self, block, rs, index, iteration):
        """Wrap a block of the fallback pool; it goes back there when freed."""
        owner = _release(self.inbox, index, iteration, rs, None, block)
        self.fb_used += rs
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
                self.apply_free((key & _KEY_LOW) - 1, (key >> 32) - _KEY_BIAS, sizes[k], arena)
            inbox.consumed(m)
        items = inbox.items
        m = len(items)
        if m:
            for k in range(m):  # frees queued meanwhile land after m, for the next drain
                owner = items[k]
                self.apply_free(owner.index, owner.iteration, owner.size, owner.arena)
            if len(items) == m:
                items.clear()
            else:
                del items[:m]

    def apply_free(self, index, it, rs, arena):
        """One free, in its turn: the bytes, the slot or overdue entry, the clock."""
        self.used -= rs
        if arena is None:
            self.fb_used -= rs
        else:
            if arena is self.arena and index < len(self.slot) and self.slot[index] == it:
                self.slot[index] = NO_SLOT
                self.live_slots -= 1
            else:
                overdue = arena.overdue
                del overdue[(it << 32) | index]
                if not overdue and arena is not self.arena:
                    self.on_arena_idle(arena)
        if it == self.iteration and self.logging_frees:
            self.obs_uppers[index] = self.tick
            self.tick += 1
        elif it == WATCHED:
            self.watched_frees += 1
