"""Memory of a block's own that holds only the pages with live bytes: addresses apart from pages.

The heap serves what no plan covers (the warm-up and profiled iterations, an
iteration waiting for its plan, survivors: see :mod:`.memory`), and a heap
that places blocks at fixed addresses fragments: a block that finds no gap
of its size maps new pages while wholly free ones lie between live blocks.
Here (``heap="pages"``) addresses and memory are apart: the heap reserves
address space of its own and backs it with **physical pages**
(``cuMemCreate`` handles, one granule each); a page no live block uses is
**mapped again where a new block needs memory** (the driver maps one
handle at several addresses at once), and a page is made only when no idle
one is left.  What the device holds is then the pages with live bytes plus
the pages being filled, not a packing.

* Requests of up to ``runs_from`` pages (16: 32 MiB) are placed best fit in
  the memory the heap holds, else where the address space is free
  (:class:`pgmo.placement.PagedSpace`, as :mod:`.own_heap` places); the
  pages they land on are backed with idle pages first.
* Pages mapped together (a block's run, the pages under a small block) get
  access in one grant over all of them (one ``cuMemSetAccess``, the call
  that costs: about 55 us on the H100 fit, against 2 us per ``cuMemMap``).
* Larger ones get **runs** of pages at fresh addresses (the start of the
  largest free range), going on from the last run's last page when the
  addresses after it are free; a dead run is handed out again as it lies
  (no call) to a request of its page count.
* A page mapped elsewhere leaves its old mapping behind (*stale*): it is
  dropped (``cuMemUnmap``, one call per run of adjacent stale pages) at a
  boundary, after one device sync, and its addresses are free again.
  Nothing is unmapped inside an iteration but when the address space runs
  out (one sync, then).

Never lent twice: a page is taken off the idle lists before it is mapped,
listed live after; a run whose mapping fails is mapped nowhere (the range
undoes it), and its pages and addresses go back.  A Ctrl-C that the user
catches may land at any line of a request: what the range's books say is
mapped is booked so (a run mapped as its call returned is idle where it
lies), no list ever holds a page twice, and what is lost is at most the
pages being placed, held until the heap goes.  A boundary's :meth:`PageHeap.trim`
and :meth:`PageHeap.tidy` hold a Ctrl-C until they end
(:func:`~pgmo.device.whole_calls.whole`).  A run left half mapped (a
refused map whose undo is refused too) retires the heap: DeviceError, and
the engine's next heap serves (rule 7 of :mod:`.memory`).
A block that dies on another stream than the heap's now is applied after
the next device sync (as in :mod:`.own_heap`).  ``calls`` counts the
driver's calls (create, map, access grants, unmap, release; ``requests`` the
requests) and
``boundary_calls`` those of the last :meth:`PageHeap.trim` or
:meth:`PageHeap.tidy`.

Tested in ``tests/test_page_heap.py``.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from ..device.whole_calls import whole
from ..errors import DeviceError
from ..placement import PagedSpace, Placer
from ..units import round_size
from .options import PageRange

__all__ = ["PageHeap"]


class _Page:
    """Page ``index`` of the range (its address) and the physical page mapped there."""

    __slots__ = ("index", "handle", "live", "fill")

    def __init__(self, index: int, handle: Any):
        self.index, self.handle = index, handle
        self.live = 0  # live blocks with bytes in it
        self.fill = 0  # bytes handed out from its start (the last run's last page)


class _PageBlock:
    """A block of a :class:`PageHeap`; its death queues ``(pages, offset, bytes, stream)``
    (``pages`` None: a small block)."""

    __slots__ = ("ptr", "size", "_pages", "_lo", "_stream", "_returned", "_heap")
    ptr: int
    size: int
    _pages: list[_Page] | None
    _lo: int
    _stream: Any
    _returned: "collections.deque[tuple[list[_Page] | None, int, int, Any]]"
    _heap: "PageHeap"  # kept alive (its pages mapped) while a block lives

    def __del__(self) -> None:
        returned = getattr(self, "_returned", None)  # None: never handed out
        if returned is not None:
            returned.append((self._pages, self._lo, self.size, self._stream))


class PageHeap:
    """Fresh addresses over recycled pages (see the module; the
    :class:`~.options.StreamHeap` protocol: ``held``, ``used``, ``malloc``, ``trim``,
    ``synchronize``).  ``stream()`` names the current stream (None: one stream)."""

    kind = "page heap (recycled pages)"

    def __init__(self, rng: PageRange, stream: Callable[[], Any] | None = None,
                 runs_from: int = 16):
        """``runs_from``: requests of more than this many pages get runs of their own."""
        self.range = rng
        self.page = g = rng.granule
        self.small_max = runs_from * g  # up to here, best fit in the pages blocks hold
        self._stream = stream
        self._current: Any = None  # the stream the heap serves now
        total = rng.size // g
        self._split = split = total // 4  # pages [0, split): small blocks; the rest: runs
        self._small = PagedSpace(split * g, g)  # small blocks' free space, pages mapped
        self._small_handles: dict[int, Any] = {}  # page -> physical page (small blocks)
        self._addresses = Placer(total, [(0, split)])  # free addresses of runs, in pages
        self._idle: list[_Page] = []  # run pages no block uses, still mapped where they are
        self._dead: dict[int, list[list[_Page]]] = {}  # page count -> dead runs, mapped
        self._loose: list[Any] = []  # physical pages mapped nowhere they could serve
        self._stale: list[int] = []  # pages whose old mapping goes at a boundary
        self._filling: _Page | None = None  # the last run's last page, with room after a block
        self._live_pages = 0  # run pages with live bytes
        self._returned: collections.deque = collections.deque()
        self._quarantine: list[tuple] = []  # deaths on another stream: after a sync
        self.calls: collections.Counter[str] = collections.Counter()  # create/map/access/...
        self.boundary_calls: dict[str, int] = {}  # those of the last trim or tidy
        self.requests = 0
        self._broken: tuple[str, int, str] | None = None  # no block placed any more: why

    @property
    def held(self) -> int:
        return self.range.pages_held

    @property
    def used(self) -> int:
        """Bytes of the pages with live bytes (deaths that arrived applied first)."""
        self._collect()
        small = self._small
        idle = sum(stop - first for first, stop in small.idle_pages())
        return (self._live_pages + small.backed_pages - idle) * self.page

    @property
    def stale(self) -> int:
        """Mappings left behind by remapped pages, dropped at the next boundary."""
        return len(self._stale)

    # ----------------------------------------------------------------- blocks
    def malloc(self, size: int) -> _PageBlock:
        if self._broken is not None:
            raise DeviceError(*self._broken)
        rs = round_size(size)
        stream = self._stream() if self._stream is not None else None
        if stream != self._current:
            if self._current is not None:  # the old stream's kernels may use dead pages
                self.synchronize()
                self._apply_quarantine()
            self._current = stream
        self._collect()
        block = _PageBlock()
        if rs <= self.small_max:
            pages, lo = None, self._place_small(rs)
            ptr = self.range.ptr + lo
        else:
            pages, lo = self._place_large(rs)
            ptr = self.range.ptr + pages[0].index * self.page + lo
        self.requests += 1
        block.ptr, block.size, block._pages, block._lo, block._stream, block._heap = \
            ptr, rs, pages, lo, stream, self
        block._returned = self._returned
        return block

    def _place_small(self, rs: int) -> int:
        """Best fit in the pages small blocks hold, else pages mapped where it lands."""
        small = self._small
        lo = small.place(rs)
        if lo < 0:  # the address range ran out: drop the stale mappings now (one sync)
            self.synchronize()
            self.tidy()
            lo = small.place(rs)
            if lo < 0:
                raise MemoryError(f"pgmo's page heap: no room for {rs:,} bytes of addresses")
        try:
            for first, stop in small.unbacked(lo, lo + rs):
                handles = self._take_pages(stop - first)
                try:
                    self._map_run(first, handles)
                except BaseException:
                    if not self._mapped(first, stop - first):  # the pages not mapped go back
                        self._loose.extend(h for k, h in enumerate(handles, first)
                                           if self.range.page_at(k * self.page) != h)
                    raise
                self._small_handles.update(zip(range(first, stop), handles))
                small.set_backed(first, stop, True)
        except BaseException:
            self._book_mapped(lo, lo + rs)
            small.free.release(lo, lo + rs)  # the pages mapped stay, idle where they are
            raise
        return lo

    def _book_mapped(self, lo: int, hi: int) -> None:
        """A small request cut short (a Ctrl-C after a run's call, a refusal): the pages under
        ``[lo, hi)`` that the range maps are booked as backed, with the page the range says
        is there, so that no later request maps them again."""
        g, small = self.page, self._small
        for first, stop in small.unbacked(lo, hi):
            for k in range(first, stop):
                handle = self.range.page_at(k * g)
                if handle is not None and self._mapped(k, 1):
                    self._small_handles[k] = handle
                    small.set_backed(k, k + 1, True)

    def _place_large(self, rs: int) -> tuple[list[_Page], int]:
        g = self.page
        filling = self._filling
        if filling is not None and not filling.live and rs > g:
            self._filling = None  # first: a Ctrl-C between the two loses it, never lists it
            self._idle.append(filling)  # twice (empty, and too small: an idle page)
            filling = None
        room = g - filling.fill if filling is not None else 0
        more = None
        if filling is not None and room < rs:
            more = self._after(filling, rs - room, -(-rs // g))
        if rs <= room:  # the rest of the last run's last page
            assert filling is not None
            pages, lo = [filling], filling.fill
            filling.fill += rs
        elif more is not None:  # goes on from there into fresh pages after it
            assert filling is not None
            pages, lo = [filling, *more], filling.fill
            self._filling = more[-1]
            more[-1].fill = g - (len(more) * g - (rs - room))
        else:
            pages, lo = self._run(-(-rs // g)), 0
            tail = len(pages) * g - rs
            if tail > room:  # its last page's rest takes the next request that fits there
                self._filling = pages[-1]
                pages[-1].fill = g - tail
        for page in pages:
            if not page.live:
                self._live_pages += 1
            page.live += 1
        return pages, lo

    def _run(self, n: int) -> list[_Page]:
        """``n`` mapped pages at consecutive addresses no block uses: a dead run of ``n`` as
        it lies (or an idle page where it is), else pages remapped at fresh addresses, else
        new ones (MemoryError when the device is full)."""
        if n in self._dead:
            return self._dead_run(n)
        if n == 1 and self._idle:
            return [self._idle.pop()]
        first, length = self._addresses.largest()
        if length < n:  # the address range ran out: drop the stale mappings now (one sync)
            self.synchronize()
            self.tidy()
            first, length = self._addresses.largest()
            if length < n:
                raise MemoryError(f"pgmo's page heap: no {n:,} free pages of addresses in "
                                  f"its {self.range.size:,}-byte range")
        # at the start of the largest gap: what follows stays free, for the next request
        # to go on into from the last run's last page (see _after)
        self._addresses.take(first, first, n)
        return self._map_fresh(first, n)

    def _dead_run(self, n: int) -> list[_Page]:
        """A dead run of ``n`` pages taken off its list, which is never left empty (a Ctrl-C
        between the two steps loses the run, never lists it twice)."""
        runs = self._dead[n]
        run = runs[-1]
        if len(runs) == 1:
            del self._dead[n]
        else:
            runs.pop()
        return run

    def _after(self, filling: _Page, nbytes: int, alone: int) -> list[_Page] | None:
        """Fresh pages right after the last run's last page, for ``nbytes`` more: None when
        those addresses are not free, or when a dead run of ``alone`` pages (what the
        request takes by itself) serves as well without a call."""
        n = -(-nbytes // self.page)
        start = filling.index + 1
        if (n == alone and alone in self._dead) or self._addresses.gap_at(start) < n:
            return None
        self._addresses.take(start, start, n)
        return self._map_fresh(start, n)

    def _map_fresh(self, first: int, n: int) -> list[_Page]:
        """Pages ``[first, first + n)`` (addresses taken) mapped with pages no block uses."""
        try:
            handles = self._take_pages(n)
        except BaseException:
            self._addresses.release(first, first + n)
            raise
        try:
            self._map_run(first, handles)
            return [_Page(first + k, handle) for k, handle in enumerate(handles)]
        except BaseException:
            if self._mapped(first, n):  # a Ctrl-C after the call: idle pages where they lie
                self._idle.extend(_Page(first + k, handle) for k, handle in enumerate(handles))
            elif not self._broken:  # none mapped: the pages and the addresses go back
                self._loose.extend(handles)
                self._addresses.release(first, first + n)
            raise

    def _map_run(self, first: int, handles: list[Any]) -> None:
        """Map ``handles`` at pages ``first, first + 1, ...`` with one grant of access over
        the run (a ``cuMemSetAccess``, 55 us on the H100 fit, against 2 us per
        ``cuMemMap``): all or nothing.

        What the range says decides, not the exception (:meth:`_mapped`): a Ctrl-C held
        through the call (:func:`~pgmo.device.whole_calls.whole`) arrives as it returns,
        the run mapped, and the callers book such a run as mapped.  A run left half
        mapped (a refused map whose undo was refused too) retires the heap (DeviceError:
        the engine's next heap serves from now on), its addresses never handed out
        again."""
        g, n = self.page, len(handles)
        try:
            self.range.map_pages(first * g, handles)
        except BaseException as e:
            if not self._mapped(first, n) and self.range.starts_in(first * g, (first + n) * g):
                self._broken = (getattr(e, "call", "cuMemMap"), getattr(e, "code", 0),
                                f"a refused map left pages mapped ({e})")
                if isinstance(e, Exception):
                    raise DeviceError(*self._broken) from e
            raise
        self.calls["map"] += n
        self.calls["access"] += 1

    def _mapped(self, first: int, n: int) -> bool:
        """Whether pages ``[first, first + n)`` are mapped with access (what a call cut short
        did, as the range's books say)."""
        g = self.page
        return self.range.usable_end(first * g) >= (first + n) * g

    def _take_pages(self, n: int) -> list[Any]:
        """``n`` physical pages no block uses: loose ones, idle ones (their mappings left
        behind), those of dead runs and small blocks' wholly free pages, then new ones."""
        idle = self._idle
        while len(self._loose) + len(idle) < n and self._dead:
            idle.extend(self._dead_run(max(self._dead)))
        taken = [self._loose.pop() for _ in range(min(n, len(self._loose)))]
        while len(taken) < n and idle:
            page = idle.pop()
            self._stale.append(page.index)
            taken.append(page.handle)
        if len(taken) < n:
            for k in self._small.take_idle(n - len(taken)):
                self._stale.append(k)
                taken.append(self._small_handles.pop(k))
        try:
            while len(taken) < n:
                taken.append(self.range.create_page())
                self.calls["create"] += 1
        except BaseException:
            self._loose.extend(taken)
            raise
        return taken

    def pending_frees(self) -> int:
        """Blocks that died and wait for the heap's next call."""
        return len(self._returned)

    def _collect(self) -> None:
        """Apply the deaths that arrived (another stream's wait for a device sync)."""
        returned = self._returned
        while returned:
            death = returned.popleft()
            if death[3] != self._current:
                self._quarantine.append(death)
            else:
                self._died(death)

    def _died(self, death: tuple) -> None:
        pages, lo, rs, _ = death
        if pages is None:
            self._small.free.release(lo, lo + rs)
            return
        freed = []
        for page in pages:
            page.live -= 1
            if not page.live:
                freed.append(page)
        self._live_pages -= len(freed)
        filling = self._filling
        if len(freed) == len(pages) > 1 and filling not in pages:
            self._dead.setdefault(len(pages), []).append(pages)  # a whole run, as it lies
            return
        for page in freed:
            if filling is not None and page is filling:
                filling.fill = 0  # the last run's last page starts again (the stream orders it)
            else:
                self._idle.append(page)

    def _apply_quarantine(self) -> None:
        """After a device sync: deaths on other streams count."""
        while self._quarantine:
            self._died(self._quarantine.pop())

    # ------------------------------------------------------------- boundaries
    @whole
    def tidy(self) -> int:
        """Drop the stale mappings (after the caller's device sync), their addresses free
        again; returns the calls made: one ``cuMemUnmap`` per run of adjacent ones where the
        range joins unmaps (at the first boundary, thousands of pages in a few calls: one
        call costs about 30 us on the H100), else one each.  A refused unmap keeps its
        mappings listed, and raises."""
        made, g = 0, self.page
        stale = self._stale
        stale.sort()
        joins = bool(getattr(self.range, "joins_unmaps", False))
        while stale:
            k = len(stale) - 1
            while joins and k and stale[k - 1] == stale[k] - 1 and \
                    (stale[k - 1] < self._split) == (stale[k] < self._split):
                k -= 1
            first, count = stale[k], len(stale) - k
            if count > 1:
                self.range.unmap_pages(first * g, count)
            else:
                self.range.unmap_page(first * g)
            del stale[k:]
            if first < self._split:
                self._small.free.release(first * g, (first + count) * g)
            else:
                self._addresses.release(first, first + count)
            made += 1
            self.calls["unmap"] += 1
        self.boundary_calls = {"unmap": made}
        return made

    @whole
    def trim(self) -> int:
        """Give back every page no live block uses (after the caller's device sync): their
        mappings dropped, the pages released; returns the bytes given back.  After it, the
        pages held are those with live bytes."""
        before = dict(self.calls)
        self._collect()
        self._apply_quarantine()  # the caller synchronized the device
        held = self.held
        filling = self._filling
        if filling is not None and not filling.live:
            self._filling = None
            self._idle.append(filling)
        dead, self._dead = self._dead, {}
        for runs in dead.values():
            for run in runs:
                self._idle.extend(run)
        while self._idle:
            page = self._idle.pop()
            self._stale.append(page.index)
            self._loose.append(page.handle)
        for k in self._small.take_idle(len(self._small_handles)):
            self._stale.append(k)
            self._loose.append(self._small_handles.pop(k))
        try:
            self.tidy()
        finally:
            while self._loose:
                self.range.release_page(self._loose[-1])
                self._loose.pop()
                self.calls["release"] += 1
            self.boundary_calls = {k: v - before.get(k, 0) for k, v in self.calls.items()}
        return held - self.held

    def synchronize(self) -> None:
        """Wait for the whole device (before :meth:`trim` or :meth:`tidy`, or a change of
        stream)."""
        self.range.synchronize()

    def close(self) -> None:
        self.range.close()
