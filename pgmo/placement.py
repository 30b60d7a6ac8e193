"""Best-fit placement in a range's free space: the arena's off-plan requests, and paged heaps.

Neutral (it depends on nothing of the engine): the engine places a departed
iteration's requests in the arena's gaps, and pgmo's own heap and the host
model of the driver's stream-ordered pool place blocks in pages
(:class:`PagedSpace`).

When an iteration leaves its plan (a request larger than planned, or more
requests: a variable-length batch), the rest of it still fits in the arena
most of the time: the arena was sized for the largest iteration seen, and
what is live now leaves gaps.  A :class:`Placer` knows those gaps (the
arena minus every block live in it) and gives each request the smallest gap
that holds it, at the gap's start; a freed block's range merges back with
its neighbours.  When no gap holds a request, an arena on a reserved range
grows at its end (``grow``, :mod:`.memory`: a mapping, no device sync);
otherwise the request gets memory of its own and the arena grows at the
next boundary.

This is what lets a variable-length workload live in one arena close to
its largest iteration's lower bound, instead of a merged plan of every
iteration (which grows without bound) or a caching pool's chunks (which
cannot merge across allocations).
"""

from __future__ import annotations

import functools
from bisect import bisect_left, insort
from typing import Any, Callable, Iterable, Iterator

__all__ = ["Placer", "PagedSpace", "APART"]

#: What :meth:`Placer.place` answers for a size kept apart (a survivor's, in the arena).
APART = -2


def _guarded(method: Callable) -> Callable:
    """A change of a :class:`Placer`'s three indexes is several statements: a Ctrl-C (any
    exception) inside one leaves them split, and the next call rebuilds them first from the
    gaps' ends (:meth:`Placer.mend`).  Those list only free space at every step, a gap's
    rest before the gap goes, a joined gap before its parts go, so what they cover is
    the free space: a change cut short gives nothing twice and loses at most the block
    being placed."""
    @functools.wraps(method)
    def guarded(self: "Placer", *args: Any) -> Any:
        if self._broken:
            self.mend()
        try:
            return method(self, *args)
        except BaseException:
            self._broken = True
            raise
    return guarded


class Placer:
    """The free ranges of one arena of ``size`` bytes, around the ``live`` ones ``(lo, hi)``.

    ``apart``: sizes to keep out of the arena (:data:`APART`): those of the
    blocks the profile saw outlive their iteration.  Off plan, request ``i``
    is another tensor each time, but a gradient still has its parameter's
    size; placed in the arena it would outlive the iteration there and keep
    the arena from being replaced when it must grow.
    """

    def __init__(self, size: int, live: Iterable[tuple[int, int]],
                 apart: frozenset = frozenset(), grow: Callable[[int], int] | None = None,
                 snug: bool = False):
        """``grow(extra)``: make the range at least ``extra`` bytes longer at its end if it
        can; returns its size now (None: the range cannot grow).  ``snug``: a block that
        fills an eighth of its gap or more goes to the gap's end (see :meth:`place`)."""
        self.size = size
        self.apart = apart
        self.grow = grow
        self.snug = snug
        self._gaps: list[tuple[int, int]] = []  # (length, start), sorted: best fit by bisection
        self._ends: dict[int, int] = {}  # start -> end of each gap
        self._starts: dict[int, int] = {}  # end -> start of each gap
        self._broken = False  # a change was cut short: rebuild before the next (_guarded)
        self.placed = self.overflowed = 0  # requests placed, and those no gap held
        pos = 0
        for lo, hi in sorted(live):
            if lo > pos:
                self._add(pos, lo)
            pos = max(pos, hi)
        if pos < size:
            self._add(pos, size)

    @_guarded
    def place(self, nbytes: int) -> int:
        """The offset of the smallest gap holding ``nbytes`` (now taken); -1 when none does,
        :data:`APART` for a size to keep apart.

        At the gap's start, or (``snug``) at its end when the block fills an eighth of
        the gap or more and the gap is not the range's last: what is left of the gap then
        borders the block below it.  Off plan, the arena holds a chain of activations
        (each freed soon after the next is made); a large block at the end of its gap
        leaves the free rest beside memory that is freed next, so that the two merge
        (an inference run's first iteration, best fit: 1.39x its live bytes at the gap's
        start, 1.03x this way; training runs unchanged within 1-2 %).
        """
        if nbytes in self.apart:
            return APART
        gaps = self._gaps
        k = bisect_left(gaps, (nbytes, -1))
        if k == len(gaps) and self.grow is not None:
            tail = self._starts.get(self.size)  # the free gap at the end, if any
            size = self.grow(nbytes - (self.size - tail if tail is not None else 0))
            if size > self.size:  # the size first: a Ctrl-C before the release loses the
                old, self.size = self.size, size  # new span, never lists it free twice
                self.release(old, size)
            # (a full device may have cut the range or withheld gaps meanwhile: look again)
            k = bisect_left(gaps, (nbytes, -1))
        if k == len(gaps):
            self.overflowed += 1
            return -1
        length, lo = gaps[k]
        hi = lo + length
        at = hi - nbytes if self.snug and length > nbytes and nbytes * 8 >= length \
            and hi != self.size else lo
        self._carve(lo, hi, at, at + nbytes)
        self.placed += 1
        return at

    def gaps_from(self, nbytes: int) -> Iterator[tuple[int, int]]:
        """The gaps that hold ``nbytes``, smallest first: ``(start, length)``."""
        if self._broken:
            self.mend()
        gaps = self._gaps
        for k in range(bisect_left(gaps, (nbytes, -1)), len(gaps)):
            length, lo = gaps[k]
            yield lo, length

    def gap_at(self, start: int) -> int:
        """The length of the gap that begins at ``start`` (0: none does)."""
        if self._broken:
            self.mend()
        end = self._ends.get(start)
        return 0 if end is None else end - start

    def largest(self) -> tuple[int, int]:
        """The largest gap: ``(start, length)``; ``(-1, 0)`` when none is left."""
        if self._broken:
            self.mend()
        if not self._gaps:
            return -1, 0
        length, lo = self._gaps[-1]
        return lo, length

    @_guarded
    def take(self, start: int, lo: int, nbytes: int) -> None:
        """Take ``[lo, lo + nbytes)`` from inside the gap that begins at ``start`` (the rest
        of the gap stays free)."""
        end = self._ends.get(start)
        if end is None or not start <= lo or lo + nbytes > end:
            raise ValueError(f"[{lo:,}, {lo + nbytes:,}) is not inside a gap starting at "
                             f"{start:,}")
        self._carve(start, end, lo, lo + nbytes)
        self.placed += 1

    @_guarded
    def withhold(self, lo: int, hi: int) -> None:
        """Take ``[lo, hi)``, which lies inside one gap, out of the free space without placing
        anything there (memory given back under the arena): it is placed in no more, and
        only :meth:`release` returns it."""
        for start, end in self._ends.items():
            if start <= lo and hi <= end:
                break
        else:
            raise ValueError(f"[{lo:,}, {hi:,}) is not inside one gap")
        self._carve(start, end, lo, hi)

    @_guarded
    def cut(self, size: int) -> None:
        """The range ends at ``size`` now (its free end was given back): no gap lies beyond."""
        if size >= self.size:
            return
        for lo, hi in [gap for gap in self._ends.items() if gap[1] > size]:
            if lo < size:
                self._carve(lo, hi, size, hi)
            else:
                self._carve(lo, hi, lo, hi)
        self.size = size

    def free_spans(self) -> list[tuple[int, int]]:
        """Every gap as ``(lo, hi)``, in address order."""
        if self._broken:
            self.mend()
        return sorted(self._ends.items())

    def mend(self) -> None:
        """The indexes rebuilt from what the gaps' ends cover (after a change cut short, see
        :func:`_guarded`: gaps listed there may overlap or touch, and are joined)."""
        joined: list[list[int]] = []
        for start, end in sorted(self._ends.items()):
            if joined and start <= joined[-1][1]:
                joined[-1][1] = max(joined[-1][1], end)
            else:
                joined.append([start, end])
        self._ends = {start: end for start, end in joined}
        self._gaps = sorted((end - start, start) for start, end in joined)
        self._starts = {end: start for start, end in joined}
        self._broken = False

    @_guarded
    def release(self, lo: int, hi: int) -> None:
        """``[lo, hi)`` is free again: one gap with its free neighbours."""
        if lo >= hi:
            return
        ends, starts = self._ends, self._starts
        end = ends.get(hi)  # the gap right after it
        start = starts.get(lo)  # the gap right before it
        first, last = lo if start is None else start, hi if end is None else end
        ends[first] = last  # the joined gap is listed before its parts go (see _guarded)
        if end is not None:
            del ends[hi], starts[end]
            self._drop((end - hi, hi))
        if start is not None:
            del starts[lo]
            self._drop((lo - start, start))
        insort(self._gaps, (last - first, first))
        starts[last] = first

    @_guarded
    def release_many(self, spans: list[tuple[int, int]]) -> None:
        """Each ``[lo, hi)`` of ``spans`` (disjoint, each taken) is free again: as many
        :meth:`release` calls, with spans that touch joined first (a heap applies a whole
        iteration's frees at its boundary: thousands, most of them side by side)."""
        if not spans:
            return
        release = Placer.release.__wrapped__  # type: ignore[attr-defined]  # (one guard)
        spans = sorted(spans)
        lo, hi = spans[0]
        for start, end in spans[1:]:
            if start == hi:
                hi = end
                continue
            release(self, lo, hi)
            lo, hi = start, end
        release(self, lo, hi)

    def free_bytes(self) -> int:
        if self._broken:
            self.mend()
        return sum(end - start for start, end in self._ends.items())

    def _carve(self, start: int, end: int, lo: int, hi: int) -> None:
        """Cut ``[lo, hi)`` out of the gap ``[start, end)``; what is left of it stays free.
        The gap's ends change first, one statement each, the rest listed before the gap
        goes (see :func:`_guarded`)."""
        if lo >= hi:
            return
        ends = self._ends
        if hi < end:
            ends[hi] = end  # the rest after it (the gap still listed: they overlap)
        if start < lo:
            ends[start] = lo  # the rest before it: the gap, shortened, in one statement
        else:
            del ends[start]
        self._drop((end - start, start))
        del self._starts[end]
        if start < lo:
            insort(self._gaps, (lo - start, start))
            self._starts[lo] = start
        if hi < end:
            insort(self._gaps, (end - hi, hi))
            self._starts[end] = hi

    def _drop(self, gap: tuple[int, int]) -> None:
        gaps = self._gaps
        del gaps[bisect_left(gaps, gap)]

    def _add(self, lo: int, hi: int) -> None:
        insort(self._gaps, (hi - lo, lo))
        self._ends[lo] = hi
        self._starts[hi] = lo


class PagedSpace:
    """Free space in a range of ``size`` bytes backed by memory in ``page``-byte pages.

    Best fit among the free memory already backed first (a heap uses what it
    holds before it asks for more), else the smallest gap; which pages a
    block needs backed (:meth:`unbacked`), and which backed pages lie wholly
    in free space (:meth:`idle_pages`) for a trim.  Used by pgmo's own heap
    and by the host model of the driver's stream-ordered pool: the two place
    alike and differ in how pages are backed and given back.
    """

    def __init__(self, size: int, page: int):
        self.page = page
        self.free = Placer(size - size % page, [])
        self.backed = bytearray(size // page)  # 1: the page is backed
        self.backed_pages = 0  # how many are (counted as they change: no scan at a boundary)
        self.high = 0  # pages from here on were never backed

    def place(self, nbytes: int) -> int:
        """The offset of ``nbytes`` now taken (backed memory first); -1 when none."""
        lo = self._in_backed(nbytes)
        return lo if lo >= 0 else self.free.place(nbytes)

    def _in_backed(self, nbytes: int) -> int:
        g, backed, high = self.page, self.backed, self.high * self.page
        for start, length in self.free.gaps_from(nbytes):
            if start >= high:
                continue
            end = min(start + length, high)
            pos = start
            while pos + nbytes <= end:  # the backed runs inside the gap, in order
                k = backed.find(1, pos // g, -(-end // g))
                if k < 0:
                    break
                pos = max(pos, k * g)
                stop = backed.find(0, k, -(-end // g))
                run_end = end if stop < 0 else min(end, stop * g)
                if run_end - pos >= nbytes:
                    self.free.take(start, pos, nbytes)
                    return pos
                pos = run_end
        return -1

    def unbacked(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The runs of pages ``[first, stop)`` that ``[lo, hi)`` touches and are not backed."""
        runs = []
        backed = self.backed
        k, last = lo // self.page, (hi - 1) // self.page + 1
        while k < last:
            k = backed.find(0, k, last)
            if k < 0:
                break
            stop = backed.find(1, k, last)
            stop = last if stop < 0 else stop
            runs.append((k, stop))
            k = stop
        return runs

    def set_backed(self, first: int, stop: int, backed: bool) -> None:
        changed = self.backed.count(0 if backed else 1, first, stop)
        self.backed_pages += changed if backed else -changed
        self.backed[first:stop] = (b"\x01" if backed else b"\x00") * (stop - first)
        if backed:
            self.high = max(self.high, stop)

    def take_idle(self, n: int) -> list[int]:
        """Up to ``n`` backed pages lying wholly in free space, taken out of it and no longer
        counted backed (a heap maps their memory elsewhere): their numbers.  From the
        smallest gaps first, the least useful to the blocks placed here."""
        g, backed = self.page, self.backed
        if self.free._broken:
            self.free.mend()
        taken: list[int] = []
        while len(taken) < n:
            for length, start in self.free._gaps:
                k, last = -(-start // g), min(self.high, (start + length) // g)
                k = backed.find(1, k, last) if k < last else -1
                if k >= 0:
                    stop = backed.find(0, k, last)
                    stop = min(last if stop < 0 else stop, k + n - len(taken))
                    self.free.take(start, k * g, (stop - k) * g)
                    self.set_backed(k, stop, False)
                    taken.extend(range(k, stop))
                    break
            else:
                break
        return taken

    def idle_pages(self) -> list[tuple[int, int]]:
        """The runs of backed pages ``[first, stop)`` that lie wholly in free space."""
        g, backed = self.page, self.backed
        if self.free._broken:
            self.free.mend()
        runs = []
        for length, start in list(self.free._gaps):
            k, last = -(-start // g), min(self.high, (start + length) // g)
            while k < last:
                k = backed.find(1, k, last)
                if k < 0:
                    break
                stop = backed.find(0, k, last)
                stop = last if stop < 0 else stop
                runs.append((k, stop))
                k = stop
        return runs
