"""The mappings of a reserved address range, as the driver sees them: one ledger for both ranges.

CUDA's virtual memory gives memory back only by whole mappings
(``cuMemUnmap`` over exactly what one ``cuMemMap`` mapped), and memory is
usable only once access to it was granted (``cuMemSetAccess``).  A range
that grows and trims at its end must therefore know where each mapping
starts, how long it is and whether it is usable.
:class:`pgmo.device.cuda.CudaRange` (the GPU) and
:class:`pgmo.device.host_range.HostRange` (its host model) keep the same books
here, so that the engine sees one behaviour (tested through both, by
``tests/test_cuda_device.py`` and ``tests/test_host_device.py``).

What the books promise after any call, failed or not: a mapping is listed
exactly when the driver holds it (``mapped`` counts its bytes), and
:meth:`MappingLedger.usable_end` is the end of the run of usable mappings
from offset 0, the only memory an arena may hand out.

A mapping may also name the physical page (``handle``) it maps: the driver
lets one ``cuMemCreate`` handle be mapped at several addresses at once (the
page heap maps a recycled page at fresh addresses before its old mapping is
dropped), so the books are by address, and count each handle's mappings
(:meth:`MappingLedger.maps_of`): its memory goes back once it is released and
no mapping of it is left.
"""

from __future__ import annotations

import bisect

__all__ = ["MappingLedger"]


class MappingLedger:
    """Whole mappings ``(offset, nbytes)`` in address order, each usable or not yet."""

    def __init__(self) -> None:
        self._starts: list[int] = []  # sorted
        self._lengths: dict[int, int] = {}  # start -> bytes
        self._unusable: set[int] = set()  # starts of mappings without access (yet)
        self._handles: dict[int, object] = {}  # start -> the physical page mapped there
        self._maps_of: dict[object, int] = {}  # handle -> its mappings listed
        self.mapped = 0  # bytes of every listed mapping
        self._end0: int | None = None  # usable_end() from 0, until the books change

    def add(self, start: int, nbytes: int, usable: bool = True, handle: object = None) -> None:
        """A new mapping ``[start, start + nbytes)`` (of the physical page ``handle``, when
        named); it must not overlap any listed one."""
        if nbytes <= 0 or self.overlaps(start, nbytes):
            raise ValueError(f"[{start:,}, {start + nbytes:,}) overlaps a mapping, or is empty")
        self._lengths[start] = nbytes
        self._end0 = None
        bisect.insort(self._starts, start)
        if not usable:
            self._unusable.add(start)
        if handle is not None:
            self._handles[start] = handle
            self._maps_of[handle] = self._maps_of.get(handle, 0) + 1
        self.mapped += nbytes

    def handle(self, start: int) -> object:
        """The physical page the mapping at ``start`` maps (None: not named)."""
        return self._handles.get(start)

    def maps_of(self, handle: object) -> int:
        """How many listed mappings map the physical page ``handle``."""
        return self._maps_of.get(handle, 0)

    def make_usable(self, starts: list[int]) -> None:
        """Access was granted to these mappings."""
        self._unusable.difference_update(starts)
        self._end0 = None

    def remove(self, start: int) -> int:
        """The mapping at ``start`` went back to the driver; its length."""
        return self.remove_run(start, self._lengths[start])[0][1]

    def remove_run(self, offset: int, nbytes: int) -> list[tuple[int, int, object]]:
        """The mappings that make up ``[offset, offset + nbytes)`` exactly went back to the
        driver (one call): ``(start, nbytes, handle)`` of each, in address order.  One
        slice of the books, not one removal each (a boundary may drop thousands).
        ValueError, with nothing changed, as :meth:`run`."""
        starts = self.run(offset, nbytes)
        k = bisect.bisect_left(self._starts, offset)
        del self._starts[k:k + len(starts)]
        self._end0 = None
        gone = []
        maps_of, handles = self._maps_of, self._handles
        for start in starts:
            length = self._lengths.pop(start)
            self._unusable.discard(start)
            handle = handles.pop(start, None)
            if handle is not None:
                left = maps_of.pop(handle) - 1
                if left:
                    maps_of[handle] = left
            gone.append((start, length, handle))
        self.mapped -= nbytes
        return gone

    def length(self, start: int) -> int:
        return self._lengths[start]

    def run(self, offset: int, nbytes: int) -> list[int]:
        """The starts of the mappings that make up ``[offset, offset + nbytes)`` exactly.

        Raises ValueError when the range is not a run of whole mappings (the
        driver unmaps nothing less)."""
        starts, lengths = self._starts, self._lengths
        end = offset + nbytes
        k = bisect.bisect_left(starts, offset)
        j = bisect.bisect_left(starts, end)
        if k < j and starts[k] == offset and starts[j - 1] + lengths[starts[j - 1]] == end \
                and sum(map(lengths.__getitem__, starts[k:j])) == nbytes:
            # disjoint mappings inside [offset, end), from its start to its end, as long as
            # it: they cover it whole (one sum in C: a boundary's run may be thousands)
            return starts[k:j]
        # not a run: the walk below says where it breaks
        starts = []
        pos, end = offset, offset + nbytes
        while pos < end:
            if k == len(self._starts) or self._starts[k] != pos:
                raise ValueError(f"[{offset:,}, {end:,}) is not a run of whole mappings "
                                 f"(nothing is mapped at {pos:,}, or a mapping starts before "
                                 f"it)")
            starts.append(pos)
            pos += self._lengths[pos]
            k += 1
        if pos != end:
            raise ValueError(f"[{offset:,}, {end:,}) ends inside a mapping")
        return starts

    def overlaps(self, offset: int, nbytes: int) -> bool:
        """Whether any mapping shares a byte with ``[offset, offset + nbytes)``."""
        k = bisect.bisect_right(self._starts, offset)
        if k and self._starts[k - 1] + self._lengths[self._starts[k - 1]] > offset:
            return True
        return k < len(self._starts) and self._starts[k] < offset + nbytes

    def check_new(self, offset: int, nbytes: int, piece: int, granule: int, size: int) -> None:
        """Refuse what the driver refuses before mapping ``[offset, offset + nbytes)`` in
        mappings of ``piece`` bytes inside a ``size``-byte reservation: anything not whole
        granules, outside the reservation, or sharing a byte with a mapping (ValueError
        naming the range).  One rule for both ranges."""
        if offset % granule or nbytes % granule or nbytes <= 0 or offset < 0 \
                or offset + nbytes > size:
            raise ValueError(f"range [{offset:,}, {offset + nbytes:,}) is not whole granules of "
                             f"{granule:,} bytes inside the {size:,}-byte reservation")
        if piece % granule:
            raise ValueError(f"mappings of {piece:,} bytes are not whole granules")
        if self.overlaps(offset, nbytes):
            raise ValueError(f"range [{offset:,}, {offset + nbytes:,}) is already mapped in part")

    def mappings(self) -> list[tuple[int, int]]:
        """``(offset, nbytes)`` of each mapping, in address order."""
        return [(s, self._lengths[s]) for s in self._starts]

    def inside(self, lo: int, hi: int) -> list[int]:
        """The starts of the mappings lying wholly in ``[lo, hi)``, in address order (found
        by bisection: a grant over a few pages does not scan thousands of mappings)."""
        starts, lengths = self._starts, self._lengths
        k, stop = bisect.bisect_left(starts, lo), bisect.bisect_left(starts, hi)
        return [s for s in starts[k:stop] if s + lengths[s] <= hi]

    def starts_in(self, lo: int, hi: int) -> bool:
        """Whether a mapping starts in ``[lo, hi)`` (a trim to ``lo`` would unmap one)."""
        k = bisect.bisect_left(self._starts, lo)
        return k < len(self._starts) and self._starts[k] < hi

    def usable_end(self, start: int = 0) -> int:
        """The end of the unbroken run of usable mappings that starts at ``start`` (``start``
        itself when no usable mapping begins there)."""
        if start == 0 and self._end0 is not None:  # (asked at every boundary: kept)
            return self._end0
        end = start
        starts = self._starts
        for k in range(bisect.bisect_left(starts, start), len(starts)):
            at = starts[k]
            if at != end or at in self._unusable:
                break
            end += self._lengths[at]
        if start == 0:
            self._end0 = end
        return end

    def usable(self, offset: int, nbytes: int) -> bool:
        """Whether ``[offset, offset + nbytes)`` lies in usable mappings only."""
        pos, end = offset, offset + nbytes
        k = bisect.bisect_right(self._starts, pos) - 1
        while pos < end:
            if k < 0 or k >= len(self._starts):
                return False
            start = self._starts[k]
            stop = start + self._lengths[start]
            if not start <= pos < stop or start in self._unusable:
                return False
            pos = stop
            k += 1
        return True

    def clear(self) -> None:
        self._end0 = None
        self._starts.clear()
        self._lengths.clear()
        self._unusable.clear()
        self._handles.clear()
        self._maps_of.clear()
        self.mapped = 0
