"""The arena on a reserved address range: reserved once, trimmed at its end, closed for good.

Where the device has virtual memory management the arena is one reserved
range per pool (rule 3 of :mod:`.memory`): taken at the first arena, grown by
mapping (:meth:`.memory.DeviceMemory._grow_range`, where rule 3 sizes the
mappings), trimmed by unmapping whole mappings at its end (rule 4's one release
per boundary), and given up for cudaMalloc arenas when the driver refuses it
(rule 7).  When the device is full inside an iteration that left its plan, the
free mappings of its middle are unmapped too (rule 6): *holes*, in which no
block is placed, mapped again before a plan is followed in the arena.  Part of :class:`~.memory.DeviceMemory` (a mixin over
:class:`~.accounts.MemoryAccounts`).  Tested in ``tests/test_memory.py``,
``tests/test_footprint.py`` and ``tests/test_cuda_device.py``.
"""

from __future__ import annotations

from bisect import bisect_right

from ..errors import DeviceError
from ..placement import Placer
from .accounts import NOT_GIVEN_BACK, MemoryAccounts
from .frees import Arena

__all__ = ["ReservedArena", "RANGE", "CUDA_MALLOC", "NO_ARENA"]

#: What ``stats().arena_kind`` says.
RANGE, CUDA_MALLOC, NO_ARENA = "reserved range", "cudaMalloc", "none"


class ReservedArena(MemoryAccounts):
    """The reserved range's arena (see the module's docstring)."""

    @property
    def arena_kind(self) -> str:
        """What holds the current arena: ``"reserved range"``, ``"cudaMalloc"``, or
        ``"none"`` (no arena now)."""
        arena = self.hot.arena
        if arena is None:
            return NO_ARENA
        return RANGE if self._on_range(arena) else CUDA_MALLOC

    def _range_off(self, why: str) -> None:
        """Rule 7: cudaMalloc arenas from now on.  An arena on the range serves on as a
        fixed-size arena until a plan needs another size (then it is dropped like a cudaMalloc
        arena, and the range closed once its last block is freed)."""
        self._reserve = None
        self._fall_back("arena", why)
        if self.range is not None and not any(self._on_range(a) for a in self.arenas):
            self._close_range()

    def _close_range(self) -> None:
        self.holes.clear()
        rng, self.range = self.range, None
        if rng is None:
            return
        try:
            rng.close()  # a device sync, then every mapping and the address space go back
        except NOT_GIVEN_BACK as e:
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

    def _trim_range(self, arena: Arena, keep: int, budget: bool = True) -> bool:
        """Unmap the arena's whole mappings beyond ``keep`` bytes (one device sync, one
        release); False when none lies wholly beyond it, or when this boundary has had its
        release (``budget``, rule 4).  A refused unmap leaves what stays mapped counted and
        the arena at the end of its usable memory (rule 7)."""
        rng = self.range
        assert rng is not None  # only the reserved arena is trimmed
        arena.size = self._usable_end()  # (a growth or trim cut short may have left it behind)
        holes = self.holes
        pieces = rng.mappings()
        if holes:
            pieces = sorted(pieces + list(holes.items()))
        cut = arena.size
        for start, _ in reversed(pieces):
            if start >= arena.size:  # beyond the usable end: left by a refused call (rule 7)
                continue
            if start < keep:
                break
            cut = start
        if cut >= arena.size:
            return False
        runs = _runs([(s, n) for s, n in pieces if cut <= s < arena.size and s not in holes])
        if runs and ((budget and not self._may_release()) or not self._sync()):
            return False
        arena.size = cut  # first: nothing lies beyond it for the pool, whatever comes next
        try:
            for start, nbytes in reversed(runs):  # the highest first, as the driver's calls go
                rng.unmap(start, nbytes)
            self._cleared("unmap")
        except NOT_GIVEN_BACK as e:
            self._trouble("unmap", "pgmo could not unmap its arena's end (%s); it stays "
                          "counted", e)
        finally:
            if holes:  # holes beyond the last mapping left are none: the arena ends before
                last = max((s + n for s, n in rng.mappings() if s < arena.size), default=0)
                for start in [s for s in holes if s >= last]:
                    del holes[start]
            arena.size = min(arena.size, self._usable_end())
        return True

    def _clear(self, lo: int, hi: int) -> bool:
        """Make sure nothing is mapped in ``[lo, hi)``, which the arena is about to map (its
        end, or a hole): a mapping left there by a call the driver refused half-way (rule 7)
        is unmapped, after a device sync.  False when it stays (nothing may be mapped
        there then)."""
        rng = self.range
        assert rng is not None
        left = [(s, n) for s, n in rng.mappings() if s < hi and s + n > lo]
        if not left:
            return True
        if not self._sync():
            return False
        try:
            for start, nbytes in reversed(left):
                rng.unmap(start, nbytes)
        except NOT_GIVEN_BACK as e:
            self._trouble("unmap", "pgmo could not unmap what a refused call left mapped (%s); "
                          "it stays counted", e)
            return False
        return True

    def _usable_end(self) -> int:
        """The end of the arena's usable memory: the run of usable mappings from offset 0,
        across its holes."""
        rng = self.range
        assert rng is not None
        end = pos = rng.usable_end()
        holes = self.holes
        while pos in holes:  # across holes, as far as usable memory follows them
            pos += holes[pos]
            after = rng.usable_end(pos)
            if after > pos:
                end = pos = after
        return end

    def _map_end(self, arena: Arena, end: int, piece: int) -> bool:
        """Map ``[arena.size, end)`` (whole granules) in mappings of ``piece`` bytes at most,
        access granted once.  No device sync: a mapping waits for nothing.  False, with the
        arena as it was, when the limit or the device refuses (or the driver refuses the
        range: rule 7)."""
        rng = self.range
        assert rng is not None  # only the reserved arena grows in place
        arena.size = self._usable_end()  # (a growth or trim cut short may have left it behind)
        if arena.size >= end:
            return True
        if end > rng.size or \
                (self.limit and self.total_bytes() + end - arena.size > self.limit) \
                or not self._clear(arena.size, end):
            return False
        try:
            rng.map(arena.size, end - arena.size, piece)
        except MemoryError:
            return False
        except DeviceError as e:
            self._range_off(f"{e}")
            return False
        finally:
            arena.size = self._usable_end()
        self.note_reserved()
        return True

    def _give_back_middle(self, arena: Arena, placer: Placer) -> None:
        """Rule 6 inside a departed iteration: the placer's range ends where the arena does
        now, and the mappings wholly in its gaps are withheld from it and unmapped (not
        those of the gap at its end, which a growth extends)."""
        placer.cut(arena.size)
        self._punch(arena, placer, [gap for gap in placer.free_spans() if gap[1] < placer.size])

    def _punch(self, arena: Arena, placer: Placer, free: list[tuple[int, int]]) -> None:
        """Unmap the arena's mappings that lie wholly in the free spans ``free`` (``(lo, hi)``,
        in address order), after one device sync: holes from now on (rule 6), each
        withheld from ``placer`` and listed before it is unmapped (a Ctrl-C in between
        leaves a hole still mapped, never memory placed in that is gone); a mapping the
        driver does not give back is placed in again, and none after it is tried."""
        rng = self.range
        assert rng is not None
        starts = [lo for lo, _ in free]
        doomed = []
        for start, nbytes in rng.mappings():
            if start + nbytes > arena.size:
                break
            k = bisect_right(starts, start) - 1
            if k >= 0 and start + nbytes <= free[k][1]:
                doomed.append((start, nbytes))
        if not doomed or not self._sync():
            return
        for start, nbytes in reversed(doomed):
            placer.withhold(start, start + nbytes)
            self.holes[start] = nbytes
            try:
                rng.unmap(start, nbytes)
            except NOT_GIVEN_BACK as e:
                self._trouble("unmap", "pgmo could not unmap its arena's free middle (%s); it "
                              "stays counted", e)
                del self.holes[start]
                placer.release(start, start + nbytes)
                return

    def _refill(self) -> bool:
        """Map the arena's holes again (a run of adjacent holes in one call, in mappings of
        the sizes they had); True when none is left.  A hole the limit or the device
        refuses stays a hole; a driver that refuses the range turns it off (rule 7)."""
        rng = self.range
        holes = self.holes
        if rng is None:
            holes.clear()
            return True
        for start, nbytes in _runs(sorted(holes.items())):
            if (self.limit and self.total_bytes() + nbytes > self.limit) \
                    or not self._clear(start, start + nbytes):
                return False
            try:
                rng.map(start, nbytes, holes[start])
            except MemoryError:
                return False
            except DeviceError as e:
                self._range_off(f"{e}")
                return False
            for hole in [s for s in holes if start <= s < start + nbytes]:
                del holes[hole]
            self.note_reserved()
        return True

    def keeps(self, size: int) -> bool:
        """Whether the arena keeps its first ``size`` bytes mapped until the next boundary,
        whatever is given back inside an iteration (rule 4: a reserved arena is trimmed
        to the plans its boundary fitted, ``planned``; a cudaMalloc arena is not changed
        inside an iteration)."""
        arena = self.hot.arena
        return arena is not None and (not self._on_range(arena) or size <= self.planned)

    def _starts_in(self, lo: int, hi: int) -> bool:
        """Whether a mapping of the range starts in ``[lo, hi)`` (one bisection of its books;
        a range of the user's own backend without ``starts_in``: its mappings read)."""
        rng = self.range
        assert rng is not None
        starts_in = getattr(rng, "starts_in", None)
        if starts_in is not None:
            return bool(starts_in(lo, hi))
        return any(lo <= start < hi for start, _ in rng.mappings())

    def _live_end(self, arena: Arena) -> int:
        return max((end for _, end in self.hot.live_spans(arena)), default=0)


def _runs(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent ``(start, nbytes)`` pieces (in address order) joined into runs."""
    runs: list[tuple[int, int]] = []
    for start, nbytes in pieces:
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + nbytes)
        else:
            runs.append((start, nbytes))
    return runs
