"""A block's free, from its owner's death to the engine's inbox; arenas; request counts.

The other half of :mod:`.handout` (compiled with it by Cython, types in
``frees.pxd``; plain Python otherwise).  A handed-out block's owner is a
:class:`Release`: CuPy drops it when the memory object dies, so its
destructor is the block's free, from any thread, the garbage collector, or
after the pool is gone.  It only queues the free in the engine's
:class:`Inbox` (and lets the block's own memory go at once); the hot path
applies queued frees in order at its next call.

:class:`Release`, :class:`Inbox` and :class:`Counts` are the hot path's own
(:mod:`.handout` makes and changes them; others read them); :class:`Arena` is
the record :mod:`.memory` makes of each arena.

**Commits.**  An exception can be raised at any line of plain Python (a
Ctrl-C, ``KeyboardInterrupt``, arrives between two lines), so every change
of the books that must happen together with another is made in **one
line**: a hand-out first builds its :class:`Release` (unarmed) and the
user's memory object, which may fail, then counts, numbers, logs the block
and arms its Release in one line; an exception lands before that line
(the unarmed Release dies and records nothing) or after it (the armed
Release's death is the block's free).  A free clears its inbox entry in
the same line as its books, so that a drain cut short never applies a free
twice.  Compiled, these lines are C, which no signal interrupts.  (Python
drops an exception raised inside a destructor: the plain-Python free is
queued in the destructor's first line.)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from pgmo.placement import APART

__all__ = ["Arena", "APART", "ARENA", "STOCK", "EXACT", "KEPT", "SOURCE_BITS", "KEY_BIAS",
           "KEY_LOW"]

log = logging.getLogger("pgmo.pool")

try:
    import cython

    _COMPILED = cython.compiled
except ImportError:  # Cython is a build dependency only: its decorators do nothing here
    from pgmo import _cython_shim as cython

    _COMPILED = False

#: Where a block's memory comes from (``Release.source``; see :mod:`.memory`).
ARENA = 0  # carved from the plan's arena
STOCK = 1  # CuPy's stock pool: interrupted, outside iterations, other threads or streams
EXACT = 2  # a device allocation of its own, given back at its free
KEPT = 3  # a survivor's buffer, kept for the same request of the next iteration
# APART (pgmo.placement): what a placer answers for a request of a survivor's size: a kept
# buffer, not the arena.
#: A rounded size is a multiple of 512: in the inbox its low bits carry the source.
SOURCE_BITS = 3

#: Iterations are >= -3 and requests >= -1: ``Inbox.record`` packs both in one key.
KEY_BIAS = 8
KEY_LOW = 0xFFFFFFFF
_KEY_BIAS = KEY_BIAS  # a C integer when compiled (see frees.pxd)
_INBOX_KEEP = 4096  # pending-free slots kept between drains


@cython.no_gc_clear  # see frees.pxd
@cython.cclass
class Arena:
    """One raw allocation that planned blocks are carved from.

    ``overdue``: ``(iteration << 32) | request`` -> ``(lo, hi, iteration)`` of the
    live blocks the current plan does not account for (with its live slots:
    all the arena's live blocks).
    """

    def __init__(self, buffer: Any, size: int):
        self.buffer = buffer  # keeps the raw memory alive
        self.ptr = int(buffer.ptr)
        self.size = size
        self.overdue: dict[int, tuple[int, int, int]] = {}


class Counts:
    """Requests served, one counter per kind; each request is counted in exactly one
    (by the hot path, as it hands the request out).

    ``planned``: from the arena; ``profiled``: recorded while warming up,
    profiling or waiting for a plan; ``departed``: in a planned iteration,
    after it left its plan; ``pinned``: survivors the plan keeps apart;
    ``interrupted``: between ``interrupt()`` and ``resume()``;
    ``outside``: between iterations (or before any was marked or found);
    ``foreign``: another thread, device or stream during an iteration.
    """

    def __init__(self) -> None:
        self.planned = 0
        self.profiled = 0
        self.departed = 0
        self.pinned = 0
        self.interrupted = 0
        self.outside = 0
        self.foreign = 0

    def total(self) -> int:
        return (self.planned + self.profiled + self.departed + self.pinned + self.interrupted
                + self.outside + self.foreign)


@cython.no_gc_clear  # see frees.pxd
@cython.cclass
class Inbox:
    """Frees not yet applied, in the order they happened; closed when the engine is gone.

    Compiled, a :class:`Release`'s C destructor calls :meth:`record`, which may
    run inside any allocation (the cycle collector frees there): it only
    stores integers and an arena into lists it keeps between drains, so no
    collection and no second free can start inside it.  As plain Python a
    Release queues itself in ``items`` (one atomic append).
    """

    def __init__(self) -> None:
        self.items: list[Release] = []  # Releases queued by __del__ (plain Python)
        # frees recorded by record() (compiled): pack(request, iteration), rounded size |
        # source, and arena (None: not an arena block, or a slot already applied)
        self.keys: list[int] = []
        self.sizes: list[int] = []
        self.arenas: list[Arena | None] = []
        self.count = 0
        self.closed = False

    def record(self, index: int, iteration: int, size: int, arena: Arena | None) -> None:
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

    def consumed(self, m: int) -> None:
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

    def close(self) -> None:
        """The engine is gone: later frees release their memory and queue nothing."""
        self.closed = True
        self.count = 0
        del self.items[:], self.keys[:], self.sizes[:], self.arenas[:]


@cython.no_gc_clear  # see frees.pxd
@cython.cclass
class Release:
    """The owner of one handed-out memory object: its death is the block's free.

    ``arena`` (an arena block) or ``keep`` (the block's own memory, let go at
    once) keep the memory alive; ``source`` says where it came from;
    ``on_free`` (memory hooks) runs in the freeing thread.  Made by the hot
    path without ``__init__`` (``handout._release``), unarmed: its death
    records a free only once ``armed`` is set, in the hand-out's commit.
    """

    inbox: Inbox
    index: int
    iteration: int
    size: int
    arena: Arena | None
    keep: Any
    source: int
    on_free: Callable[[], None] | None
    armed: bool

    def __dealloc__(self) -> None:  # compiled only; plain Python gets __del__ below
        if not self.armed:  # never handed out: nothing was counted
            return
        if self.on_free is not None:
            self.report_free()
        inbox = self.inbox
        if not inbox.closed:
            inbox.record(self.index, self.iteration, self.size | self.source, self.arena)

    def report_free(self) -> None:
        on_free = self.on_free
        self.on_free = None
        if on_free is None:
            return
        try:
            on_free()
        except Exception:  # a hook must never break a free
            log.exception("memory hook failed on free")


def _queue_free(self: Release) -> None:
    """``Release.__del__`` as plain Python: queue the Release (resurrected until drained).

    The free is queued in the first line, before anything that could be cut
    short; an unarmed Release was never handed out (nothing to queue)."""
    if self.armed and not self.inbox.closed: self.inbox.items.append(self)  # noqa: E701
    if not self.armed:
        return
    if self.inbox.closed:
        self.arena = None  # the engine is gone
    if self.on_free is not None:
        self.report_free()
    self.keep = None  # the block's own memory goes back at once


if not _COMPILED:
    Release.__del__ = _queue_free  # type: ignore[attr-defined]
    Release.armed = False  # until the hand-out's commit


