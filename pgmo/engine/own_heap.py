"""Memory of a block's own in a reserved range of pgmo's own, mapped and trimmed page by page.

The heap serves what no plan covers: the warm-up and profiled iterations, an
iteration waiting for its plan, survivors' buffers (see :mod:`.memory`).  On
a device with virtual memory management it is this one (``heap="own"``), or
the page heap (:mod:`.page_heap`, the default), rather than the driver's
stream-ordered pool: the driver's pool grows and trims in
32 MiB steps (CuPy documents it), so that a small model's first iterations
hold whole chunks of idle memory (on the CPU model, GoogLeNet inference
1.48x its limit, AlexNet inference 1.08x: ``python -m
scripts.bench_footprint``).  Here every page (the device's granule, 2 MiB)
is one mapping, made while a block needs it (access granted once per run of
new pages) and given back once wholly free, after a device sync, at a
boundary: one ``cuMemUnmap`` per run of adjacent free pages where the driver
takes a run of mappings in one call (NVIDIA's samples do; the device layer
probes it), else one per page (the profiled iteration's heap of ResNet-50:
1,777 calls, about 30 us each on the H100).  Mappings of several pages
would pin more memory, since a live block keeps its whole mapping: on the
same model, mappings of 1/32 of the heap (64 MiB at most) cost DenseNet-BC
1.083x its limit against 1.045x.

Placement is best fit, in the memory the heap holds before memory it must
map (:class:`pgmo.placement.PagedSpace`, as the host model of the driver's
pool places).  A freed block's range is reused at
once, which is safe on the stream its block was used on (the stream orders
the old kernels before the new ones, as in CuPy's own pool): the heap
serves one stream at a time.  A block that dies after the heap moved to
another stream waits, quarantined, for the next device sync; the heap's
first request on a new stream makes one (a stream change is rare: a phase
of the program, not a request).

Never lent twice, whatever is raised: the live blocks are listed
(``live``), and a call an exception cut short makes the next one rebuild the
free list from that list.  A block's death only queues ``(offset, size,
stream)`` (any thread, the garbage collector's too).

Tested in ``tests/test_own_heap.py``.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from ..placement import PagedSpace, Placer
from ..units import round_size
from .options import ReservedRange

__all__ = ["OwnHeap"]


class _OwnBlock:
    """A block of an :class:`OwnHeap`; its death returns its range (see the module)."""

    __slots__ = ("ptr", "size", "_lo", "_stream", "_returned", "_heap")
    ptr: int
    size: int
    _lo: int
    _stream: Any
    _returned: "collections.deque[tuple[int, int, Any]]"
    _heap: "OwnHeap"  # kept alive (its range mapped) while a block lives

    def __del__(self) -> None:
        returned = getattr(self, "_returned", None)  # None: never handed out
        if returned is not None:
            returned.append((self._lo, self.size, self._stream))


class OwnHeap:
    """Best fit in a reserved range of its own, page by page (the
    :class:`~.options.StreamHeap` protocol: ``held``, ``used``, ``malloc``, ``trim``,
    ``synchronize``).

    ``stream()`` names the current stream (None: one stream is assumed).
    """

    kind = "own heap (reserved range)"

    def __init__(self, rng: ReservedRange, stream: Callable[[], Any] | None = None):
        self.range = rng
        self.page = rng.granule
        self._stream = stream
        self._current: Any = None  # the stream the heap serves now
        self._space = PagedSpace(rng.size, self.page)  # free ranges; pages mapped
        self.live: dict[int, int] = {}  # offset -> bytes of every live block
        self._returned: collections.deque = collections.deque()  # (offset, bytes, stream)
        self._quarantine: list[tuple[int, int]] = []  # freed after a stream change
        self._suspect = False  # a call was cut short: rebuild the free list first
        self._used: int | None = None  # bytes of ``live``, None: to be summed

    @property
    def held(self) -> int:
        return self.range.mapped

    @property
    def used(self) -> int:
        """Bytes of live blocks (frees that arrived are applied first)."""
        self._collect()
        used = self._used
        if used is None:  # summed again after any change (asked at every boundary)
            used = self._used = sum(self.live.values())
        return used

    # ----------------------------------------------------------------- blocks
    def malloc(self, size: int) -> _OwnBlock:
        rs = round_size(size)
        stream = self._stream() if self._stream is not None else None
        if stream != self._current:
            if self._current is not None:  # the old stream's kernels may use freed ranges
                self.synchronize()
                self._release_quarantine()
            self._current = stream
        block = _OwnBlock()
        self._used = None  # (first: the sum is never older than ``live``)
        # Suspect from the placement to the commit: a Ctrl-C anywhere in between leaves a
        # range neither free nor live, and the rebuild from ``live`` frees it.
        try:
            self._collect()
            lo = self._space.place(rs)
            if lo < 0:
                raise MemoryError(f"pgmo's heap: no room for {rs:,} bytes in its "
                                  f"{self.range.size:,}-byte range")
            try:
                self._map_for(lo, lo + rs)
            except BaseException:
                self._space.free.release(lo, lo + rs)
                raise
            block.ptr, block.size, block._lo, block._stream, block._heap = \
                self.range.ptr + lo, rs, lo, stream, self
            # one line: listed live and armed together (see "Commits" in frees.py)
            self.live[lo] = rs; block._returned = self._returned  # noqa: E702
        except BaseException:
            self._suspect = True  # the free list may be half changed: rebuilt next time
            raise
        return block

    def pending_frees(self) -> int:
        """Blocks that died (on any thread) and wait for the owner's next call to be reused."""
        return len(self._returned)

    def _collect(self) -> None:
        """Apply the frees that arrived: back to the free list, or quarantined (another
        stream than the heap's now)."""
        if self._suspect:
            self._rebuild()
        returned = self._returned
        if not returned:
            return
        # suspect until the frees are applied: a Ctrl-C in between rebuilds the free list
        # from the live blocks (those taken off ``live`` below are free there)
        self._suspect = True
        self._used = None
        live, current, spans = self.live, self._current, []
        while returned:
            lo, rs, stream = returned[0]
            # one line: unlisted and dequeued together
            live.pop(lo, None); returned.popleft()  # noqa: E702
            if stream != current:
                self._quarantine.append((lo, rs))
            else:
                spans.append((lo, lo + rs))
        self._space.free.release_many(spans)  # a boundary's thousands, side by side joined
        self._suspect = False

    def _release_quarantine(self) -> None:
        """After a device sync: what other streams freed may be reused."""
        self._suspect = True  # (a Ctrl-C below: rebuilt from the live blocks, see _collect)
        quarantine, self._quarantine = self._quarantine, []
        self._space.free.release_many([(lo, lo + rs) for lo, rs in quarantine])
        self._suspect = False

    def _rebuild(self) -> None:
        """The free list from the live blocks and the quarantine, the mapped pages from the
        range's mappings (a call was cut short)."""
        taken = [(lo, lo + rs) for lo, rs in self.live.items()]
        taken += [(lo, lo + rs) for lo, rs in self._quarantine]
        # A free whose block left ``live`` but not yet the queue (a signal lands between
        # the two calls of :meth:`_collect`'s line): its range is released when the queue
        # is applied, so it stays taken until then (else it would be released twice).
        live = self.live
        taken += [(lo, lo + rs) for lo, rs, _ in self._returned.copy() if lo not in live]
        space = PagedSpace(self.range.size, self.page)
        space.free = Placer(space.free.size, taken)
        for start, nbytes in self.range.mappings():
            space.set_backed(start // self.page, (start + nbytes) // self.page, True)
        self._space = space
        self._suspect = False

    # ----------------------------------------------------------------- pages
    def _map_for(self, lo: int, hi: int) -> None:
        """Map the pages ``[lo, hi)`` touches that are not mapped: a mapping per page, access
        granted once per run."""
        g = self.page
        for first, stop in self._space.unbacked(lo, hi):
            self.range.map(first * g, (stop - first) * g, g)
            self._space.set_backed(first, stop, True)

    def trim(self) -> int:
        """Unmap every wholly free page (after the caller's device sync: one ``cuMemUnmap``
        per run of them, or one each, as the range unmaps); returns the bytes given back.
        What a refusal leaves stays mapped, and counted."""
        self._collect()
        self._release_quarantine()  # the caller synchronized the device
        g = self.page
        released = 0
        try:
            for first, stop in self._space.idle_pages():
                self.range.unmap(first * g, (stop - first) * g)
                self._space.set_backed(first, stop, False)
                released += (stop - first) * g
        except BaseException:  # the pages read back from the range at the next call
            self._suspect = True
            raise
        return released

    def synchronize(self) -> None:
        """Wait for the whole device (before :meth:`trim`, or a change of stream)."""
        self.range.synchronize()

    def close(self) -> None:
        self.range.close()
