"""The arena on a reserved address range: reserved once, trimmed at its end, closed for good.

Where the device has virtual memory management the arena is one reserved
range per pool (rule 3 of :mod:`.memory`): taken at the first arena, grown by
mapping (:meth:`.memory.DeviceMemory._grow_range`, where rule 3 sizes the
mappings), trimmed by unmapping whole mappings at its end (rule 4's one release
per boundary), and given up for cudaMalloc arenas when the driver refuses it
(rule 7).  Part of :class:`~.memory.DeviceMemory` (a mixin over
:class:`~.accounts.MemoryAccounts`).  Tested in ``tests/test_memory.py``,
``tests/test_footprint.py`` and ``tests/test_cuda_device.py``.
"""

from __future__ import annotations

from ..errors import DeviceError
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
        except NOT_GIVEN_BACK as e:
            self._trouble("unmap", "pgmo could not unmap its arena's end (%s); it stays "
                          "counted", e)
        finally:
            arena.size = min(arena.size, rng.usable_end())
        return True

    def _live_end(self, arena: Arena) -> int:
        return max((end for _, end in self.hot.live_spans(arena)), default=0)
