"""The arenas: taking one of a plan's size, keeping old ones while blocks live in them.

An arena is only ever replaced at an iteration boundary (see
``Engine._install``).  The current plan's live blocks are then *retired*: moved
to the arena's overdue list, so the hot path checks them by address.  An old
arena is released when its last block is freed, never before: a live block's
memory is never given back or reused.  The arena replaces the fallback's
cached warm-up and profiling blocks, which are released once it is taken (off
the boundary with background re-planning; first, when the memory limit or the
device needs the room), or the pool would hold more than the stock pool it
improves on.  When the device is full, the keeper makes room (dead blocks,
the fallback's cache) and tries once more, for an arena and a fallback block
alike: the two compete for the same memory.
"""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Any, Callable

from .handout import NO_SLOT, Arena, HotPath

__all__ = ["ArenaKeeper", "RawListener"]

log = logging.getLogger("pgmo.pool")


class ArenaKeeper:
    """Owns the current arena (``hot.arena``), the old ones, and the memory limit."""

    def __init__(self, hot: HotPath, allocate: Callable[[int], Any], fallback: Any,
                 oom_error: Callable[[int, int, int], BaseException],
                 later: Callable[[Callable[[], Any]], None] | None = None):
        """``oom_error(size, total, limit)`` is the error of a full device (CuPy's,
        in the pool).  ``later(fn)`` runs ``fn`` off the iteration boundary (the
        planner thread): giving the fallback's cache back can take milliseconds."""
        self.hot = hot
        self.later = later
        self.allocate = allocate  # raw allocator: size -> object with .ptr, or MemoryError
        self.fallback = fallback
        self.oom_error = oom_error
        self.arenas: set[Arena] = set()  # the current arena and old ones with live blocks
        self.blocked = False  # the last allocation failed: wait for memory to free up
        self.failures = 0
        self.limit = 0  # 0: none
        self.peak_total = 0  # most bytes held at once (arenas + fallback)

    # ------------------------------------------------------------------ arenas
    def retire_slots(self) -> None:
        """Live blocks of the current plan are no longer accounted for: overdue."""
        hot = self.hot
        if not hot.live_slots:
            return
        slot, rows, arena = hot.slot, hot.rows, hot.arena
        for j, it in enumerate(slot):
            if it != NO_SLOT:
                slot[j] = NO_SLOT
                cap, o, _ = rows[j]
                arena.overdue[(it << 32) | j] = (o, o + cap, it)
        hot.live_slots = 0

    def drop(self) -> None:
        """Forget the current arena; it lives on while it has blocks (overdue now)."""
        self.retire_slots()
        arena, self.hot.arena = self.hot.arena, None
        if arena is not None and not arena.overdue:
            self.arenas.discard(arena)
        self.sync_fallback_limit()

    def fit(self, size: int) -> bool:
        """Make the current arena ``size`` bytes: grow, or shrink when nothing lives in it.

        Returns whether the arena changed (the hot path must re-aim).
        """
        arena = self.hot.arena
        if arena is not None and (arena.size < size or (arena.size > size and not arena.overdue)):
            self.drop()
        if self.hot.arena is None and size > 0 and not self.blocked:
            self.hot.arena = self._take(size)
        return self.hot.arena is not arena

    def idle(self, arena: Arena) -> bool:
        return not arena.overdue and (arena is not self.hot.arena or not self.hot.live_slots)

    def released(self, arena: Arena) -> None:
        """An old arena's last block was freed: let its memory go."""
        self.arenas.discard(arena)
        self.sync_fallback_limit()

    def _take(self, size: int) -> Arena | None:
        if self.limit and self.total_bytes() + size > self.limit:
            self.fallback.free_all_blocks()  # room first: the limit counts them
            if self.total_bytes() + size > self.limit:
                return self._failed(size, "it would exceed the memory limit")
        try:
            buffer = self.allocate(size)
        except MemoryError:
            self._make_room()
            try:
                buffer = self.allocate(size)
            except MemoryError:
                return self._failed(size, "the device is out of memory")
        arena = Arena(buffer, size)
        self.arenas.add(arena)
        self.sync_fallback_limit()
        self.note_reserved()  # the arena and the cache it replaces, held together now
        self._release_cache()
        return arena

    def from_fallback(self, size: int, rs: int) -> Any:
        """A raw fallback block, after making room if the device is full; else ``oom_error``."""
        fallback = self.fallback
        try:
            return fallback.malloc(size)
        except MemoryError:
            self._make_room()
            try:
                return fallback.malloc(size)
            except MemoryError:
                raise self.oom_error(rs, self.total_bytes(), self.limit) from None

    def _make_room(self) -> None:
        """Give back what can be: dead blocks (their frees applied), the fallback's cache."""
        gc.collect()
        self.hot.drain()
        self.fallback.free_all_blocks()

    def _release_cache(self) -> None:
        """The arena replaces the fallback's cached (idle) blocks: give them back."""
        if self.later is not None:
            self.later(self.fallback.free_all_blocks)
        else:
            self.fallback.free_all_blocks()

    def _failed(self, size: int, why: str) -> None:
        self.failures += 1
        self.blocked = True
        log.warning("pgmo cannot allocate a %d-byte arena (%s); serving from the fallback",
                    size, why)
        return None

    # ------------------------------------------------------------------- bytes
    def set_limit(self, size: int) -> None:
        self.limit = int(size)
        self.blocked = False
        self.sync_fallback_limit()

    def sync_fallback_limit(self) -> None:
        """The fallback may use what the limit leaves after the arenas."""
        if self.limit == 0:
            self.fallback.set_limit(size=0)
        else:
            self.fallback.set_limit(size=max(1, self.limit - self.arena_total()))

    def note_reserved(self) -> None:
        """The device memory held may have grown: update its peak."""
        total = self.total_bytes()
        if total > self.peak_total:
            self.peak_total = total

    def arena_total(self) -> int:
        return sum(a.size for a in self.arenas)

    def total_bytes(self) -> int:
        return self.arena_total() + self.fallback.total_bytes()

    def free_gaps(self) -> int:
        """Free address ranges in the arenas (CuPy's free blocks, arena side)."""
        hot = self.hot
        gaps = 0
        for arena in self.arenas:
            spans = list(arena.overdue.values())
            if arena is hot.arena:
                spans += [(hot.rows[j][1], hot.rows[j][1] + hot.rows[j][0], 0)
                          for j, it in enumerate(hot.slot) if it != NO_SLOT]
            spans.sort()
            pos = 0
            for start, end, _ in spans:
                if start > pos:
                    gaps += 1
                pos = max(pos, end)
            if pos < arena.size:
                gaps += 1
        return gaps


class RawListener:
    """Tells an :class:`ArenaKeeper` that a raw allocation happened, without keeping it alive.

    The fallback pool's raw allocator calls it, so the peak of memory held
    is exact without asking the fallback on every request.
    """

    __slots__ = ("_keeper",)

    def __init__(self) -> None:
        self._keeper: Callable[[], ArenaKeeper | None] = lambda: None

    def connect(self, keeper: ArenaKeeper) -> None:
        self._keeper = weakref.ref(keeper)

    def __call__(self) -> None:
        keeper = self._keeper()
        if keeper is not None:
            keeper.note_reserved()
