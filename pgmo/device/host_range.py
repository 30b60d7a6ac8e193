"""The host model of CUDA's virtual memory: reserved address space, mapped on demand.

The analogue of ``cuMemAddressReserve`` / ``cuMemCreate`` + ``cuMemMap`` /
``cuMemUnmap`` is an ``mmap(PROT_NONE)`` reservation whose granules are
committed (``mprotect``) and released (``madvise(MADV_DONTNEED)`` +
``PROT_NONE``): a stale access to an unmapped granule faults, as on a GPU.
Physical pages of their own (``cuMemCreate`` handles, which the driver maps at
several addresses at once) are pages of a ``memfd`` file, each mapped
``MAP_SHARED`` where it is mapped: bytes written through one address are read
through the other, as on a GPU (:meth:`HostRange.create_page`).
A :class:`~pgmo.device.host_memory.HostMemory` makes one
(:meth:`~pgmo.device.host_memory.HostMemory.reserve`) and counts its
memory and calls.  Tested by ``tests/test_host_device.py`` and
``tests/test_own_heap.py``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from typing import Any, Protocol, Sequence

from .mappings import MappingLedger

__all__ = ["HostRange"]


class _Device(Protocol):
    """What a range asks of the device it reserves on (a ``HostMemory``)."""

    maps: int

    @property
    def granule(self) -> int: ...

    def charge(self, call: str, nbytes: int = 0, mappings: int = 1) -> None: ...

    def _map(self, nbytes: int, calls: int = 1) -> None: ...

    def _unmap(self, nbytes: int, calls: int = 1) -> None: ...

    def synchronize(self) -> None: ...


# --------------------------------------------------------------- libc calls
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value
_MAP_FIXED = 0x10  # Linux's value
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    for name in ("mprotect", "madvise"):
        getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return libc


_LIBC = _libc()


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: errno {err}")


def _flags(n: int) -> mmap.mmap:
    """``n`` zero bytes, one per granule, in private anonymous memory that the OS backs only
    where one is written (reading zeros takes none; ``madvise(MADV_DONTNEED)`` zeroes them
    again): a page heap reserves 32x the device, 2**28 granules of a 512-byte test device,
    and touches a few (a bytearray would be gigabytes, zeroed at once)."""
    return mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | _MAP_NORESERVE)


def _release_reservation(memory: _Device, mapped: list, base: int, size: int) -> None:
    """A range is gone (closed, or its last user died): its memory and address space go back
    (``mapped``: bytes mapped, bytes of physical pages, the pages' file or -1)."""
    if mapped[0] + mapped[1]:
        # nothing can use it any more: no sync to wait for
        memory._unmap(mapped[0] + mapped[1], calls=0)
        mapped[0] = mapped[1] = 0
    _LIBC.munmap(base, size)
    if mapped[2] >= 0:
        os.close(mapped[2])
        mapped[2] = -1


class HostRange:
    """Reserved address space whose granules are mapped on demand: CUDA's virtual memory, on
    the host.

    The driver's calls, with its rules (the books are a
    :class:`~pgmo.device.mappings.MappingLedger`, as :class:`~pgmo.device.cuda.CudaRange`'s):
    :meth:`map` backs ``[offset, offset + nbytes)`` with mappings of ``piece``
    bytes at most (``cuMemCreate`` + ``cuMemMap`` each) and then grants access to
    all of them (one ``cuMemSetAccess``), all or nothing; :meth:`unmap` gives
    back whole mappings (one ``cuMemUnmap`` for the run where the device joins
    unmaps, else one each, the highest first; never part of one) after the
    caller's :meth:`synchronize`.  Memory that is not mapped,
    or mapped without access, faults when touched.  :meth:`map_one`,
    :meth:`grant` and :meth:`unmap_one` are the single calls (what the CUDA
    stand-ins drive); :meth:`commit` and :meth:`decommit` back memory without
    the mapping rules and the call counts: what a driver's own pool does
    inside one call.
    """

    def __init__(self, memory: _Device, size: int):
        granule = memory.granule
        size = -(-size // granule) * granule
        # Granules smaller than the OS's page (a 512-byte device, for byte-exact tests) cannot
        # be protected one by one: the range is then readable throughout, and only the
        # accounting (and the checker's ``holds``) knows what is mapped.
        self._protect = granule % mmap.PAGESIZE == 0
        raw = _LIBC.mmap(None, size + granule, _PROT_NONE if self._protect else _PROT_RW,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if raw in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"host range: cannot reserve {size:,} bytes of address space")
        self.memory = memory
        self.granule = granule
        self.ptr = -(-raw // granule) * granule  # granule-aligned, as the driver's
        self.size = size
        # bytes backed by memory, bytes of physical pages, the pages' file (shared with the
        # finalizer)
        self._state = [0, 0, -1]
        self._backed = _flags(size // granule)  # 1: the granule is backed by memory
        self._open = _flags(size // granule)  # 1: and access to it was granted
        self._books = MappingLedger()
        self._slots: set[int] = set()  # the pages' file: free page slots (handles)
        self._slot_count = 0  # page slots the file has
        self._released: set[int] = set()  # released pages still mapped somewhere
        self._finalizer = weakref.finalize(self, _release_reservation, memory, self._state, raw,
                                           size + granule)

    @property
    def mapped(self) -> int:
        return self._state[0]

    def _aligned(self, offset: int, nbytes: int) -> None:
        g = self.granule
        if offset % g or nbytes % g or nbytes <= 0 or offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"range [{offset:,}, {offset + nbytes:,}) is not whole granules of "
                             f"{g:,} bytes inside the {self.size:,}-byte reservation")

    # ------------------------------------------------- backing, without the rules
    def commit(self, offset: int, nbytes: int, grant: bool = True) -> None:
        """Back unmapped granules ``[offset, offset + nbytes)`` (MemoryError when full),
        usable at once unless ``grant`` is false (see :meth:`grant`)."""
        self.memory._map(nbytes, calls=0)
        g = self.granule
        self._backed[offset // g:(offset + nbytes) // g] = b"\x01" * (nbytes // g)
        self._state[0] += nbytes
        if grant:
            self._open_granules(offset, nbytes)

    def _open_granules(self, offset: int, nbytes: int) -> None:
        if self._protect:
            _check(_LIBC.mprotect(self.ptr + offset, nbytes, _PROT_RW), "mprotect")
        g = self.granule
        self._open[offset // g:(offset + nbytes) // g] = b"\x01" * (nbytes // g)

    def decommit(self, offset: int, nbytes: int, calls: int = 0) -> None:
        """Give back the memory of granules ``[offset, offset + nbytes)``; they fault now."""
        if not self._finalizer.alive:  # the whole reservation went back already
            return
        if self._protect:
            base = self.ptr + offset
            _check(_LIBC.madvise(base, nbytes, mmap.MADV_DONTNEED), "madvise")
            _check(_LIBC.mprotect(base, nbytes, _PROT_NONE), "mprotect")
        g = self.granule
        self._backed[offset // g:(offset + nbytes) // g] = bytes(nbytes // g)
        self._open[offset // g:(offset + nbytes) // g] = bytes(nbytes // g)
        self._state[0] -= nbytes
        self.memory._unmap(nbytes, calls=calls)

    # ------------------------------------------------------- the driver's calls
    def map_one(self, offset: int, nbytes: int) -> None:
        """One mapping (``cuMemCreate`` + ``cuMemMap``), without access yet; MemoryError when
        the device is full, ValueError where something is mapped already."""
        self._aligned(offset, nbytes)
        if self._books.overlaps(offset, nbytes):
            raise ValueError(f"range [{offset:,}, {offset + nbytes:,}) is already mapped in part")
        self.commit(offset, nbytes, grant=False)
        self._books.add(offset, nbytes, usable=False)
        self.memory.maps += 1
        for call in ("cuMemCreate", "cuMemMap"):
            self.memory.charge(call, nbytes)
        self.memory.charge("cuMemRelease")  # the handle, at once: the mapping keeps the memory

    def grant(self, offset: int, nbytes: int) -> None:
        """Access to ``[offset, offset + nbytes)`` (``cuMemSetAccess``): it must be mapped
        throughout."""
        self._aligned(offset, nbytes)
        g = self.granule
        if 0 in self._backed[offset // g:(offset + nbytes) // g]:
            raise ValueError(f"access to [{offset:,}, {offset + nbytes:,}), which is not "
                             f"mapped throughout")
        self._open_granules(offset, nbytes)
        end = offset + nbytes
        granted = self._books.inside(offset, end)
        self._books.make_usable(granted)
        self.memory.charge("cuMemSetAccess", nbytes, len(granted))

    def unmap_one(self, start: int, nbytes: int) -> None:
        """One ``cuMemUnmap`` over ``[start, start + nbytes)``: one whole mapping, or a run of
        adjacent whole mappings where the device joins them (:attr:`joins_unmaps`);
        ValueError for anything else, with nothing changed."""
        starts = self._books.run(start, nbytes)
        if len(starts) > 1 and not self.joins_unmaps:
            raise ValueError(f"[{start:,}, {start + nbytes:,}) is not one whole mapping")
        self._fault(start, nbytes)
        self._forget(start, nbytes)
        self.memory._unmap(0, calls=1)
        self.memory.charge("cuMemUnmap", nbytes, len(starts))

    def _fault(self, offset: int, nbytes: int) -> None:
        """``[offset, offset + nbytes)`` reserved again, no memory, faulting when touched: one
        ``mmap`` however many mappings it held (an anonymous granule's memory or a page's
        view of its file), as one ``cuMemUnmap`` is one call."""
        if not self._protect or not self._finalizer.alive:
            return
        addr = self.ptr + offset
        got = _LIBC.mmap(addr, nbytes, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                         | _MAP_FIXED | _MAP_NORESERVE, -1, 0)
        if got != addr:
            raise OSError(f"host range: cannot unmap [{offset:,}, {offset + nbytes:,})")

    def _forget(self, start: int, nbytes: int) -> None:
        """The books after the mappings of ``[start, start + nbytes)`` went (:meth:`_fault`
        made it fault): their own memory back, released pages mapped nowhere freed."""
        gone = self._books.remove_run(start, nbytes)
        g = self.granule
        self._backed[start // g:(start + nbytes) // g] = bytes(nbytes // g)
        self._open[start // g:(start + nbytes) // g] = bytes(nbytes // g)
        if not self._finalizer.alive:  # the whole reservation went back already (at exit)
            return
        own = sum(length for _, length, handle in gone if handle is None)
        if own:
            self._state[0] -= own
            self.memory._unmap(own, calls=0)
        for _, _, handle in gone:
            if handle is not None and handle in self._released \
                    and not self._books.maps_of(handle):
                self._free_page(handle)

    @property
    def joins_unmaps(self) -> bool:
        """Whether one ``cuMemUnmap`` may cover several adjacent whole mappings (the
        device's ``joins_unmaps``; NVIDIA's own samples unmap a range of several mappings
        in one call, and :func:`pgmo.device.cuda.device_layer` probes it)."""
        return bool(getattr(self.memory, "joins_unmaps", False))

    def map(self, offset: int, nbytes: int, piece: int | None = None) -> None:
        """Back ``[offset, offset + nbytes)`` with mappings of ``piece`` bytes at most, then
        grant access over all of it; all or nothing (MemoryError when the device is full)."""
        piece = piece or nbytes
        self._books.check_new(offset, nbytes, piece, self.granule, self.size)
        made: list[int] = []
        try:
            pos, end = offset, offset + nbytes
            while pos < end:
                step = min(piece, end - pos)
                self.map_one(pos, step)
                made.append(pos)
                pos += step
            self.grant(offset, nbytes)
        except BaseException:  # what this call mapped goes back (never used: no sync)
            for start in reversed(made):
                nbytes = self._books.remove(start)
                self.decommit(start, nbytes, calls=0)
            raise

    def unmap(self, offset: int, nbytes: int) -> None:
        """Give back the whole mappings that make up ``[offset, offset + nbytes)`` (after
        :meth:`synchronize`): one call where the device joins unmaps, else one each, the
        highest first; the range faults from now on."""
        self._aligned(offset, nbytes)
        if self.joins_unmaps:
            self.unmap_one(offset, nbytes)
            return
        for start in reversed(self._books.run(offset, nbytes)):
            self.unmap_one(start, self._books.length(start))

    # ----------------------------------------------------- physical pages of their own
    @property
    def pages_held(self) -> int:
        """Bytes of the physical pages made (:meth:`create_page`) and not given back yet."""
        return self._state[1]

    def create_page(self) -> int:
        """One granule of physical memory, mapped nowhere yet (``cuMemCreate``); its handle.
        MemoryError when the device is full."""
        g = self.granule
        self.memory._map(g, calls=0)  # counted first: the capacity refuses before the file
        self._state[1] += g
        try:
            if self._state[2] < 0:
                self._state[2] = os.memfd_create("pgmo-pages")
            if not self._slots:
                os.ftruncate(self._state[2], (self._slot_count + 1) * g)
                self._slots.add(self._slot_count)
                self._slot_count += 1
        except OSError as e:
            self._state[1] -= g
            self.memory._unmap(g, calls=0)
            raise MemoryError(f"host range: cannot make a page ({e})") from None
        self.memory.charge("cuMemCreate", g)
        return self._slots.pop()

    def map_page(self, offset: int, handle: int, grant: bool = True) -> None:
        """Map the physical page ``handle`` at ``offset`` (``cuMemMap``) and grant access to
        it (``cuMemSetAccess``; ``grant`` false: later, by :meth:`grant`); ValueError where
        something is mapped already."""
        g = self.granule
        self._books.check_new(offset, g, g, g, self.size)
        if handle in self._released or not 0 <= handle < self._slot_count \
                or handle in self._slots:
            raise ValueError(f"page {handle} was released, or never made")
        if self._protect:
            addr = self.ptr + offset
            got = _LIBC.mmap(addr, g, _PROT_RW if grant else _PROT_NONE,
                             mmap.MAP_SHARED | _MAP_FIXED, self._state[2], handle * g)
            if got != addr:
                raise MemoryError(f"host range: cannot map page {handle} at {offset:,}")
        self._books.add(offset, g, usable=grant, handle=handle)
        self._backed[offset // g] = 1
        self._open[offset // g] = int(grant)
        self.memory.maps += 1
        self.memory.charge("cuMemMap", g)
        if grant:
            self.memory.charge("cuMemSetAccess", g)

    def map_pages(self, offset: int, handles: Sequence[int]) -> None:
        """Map the pages ``handles`` at consecutive granules from ``offset`` (a ``cuMemMap``
        each), then grant access over all of them at once (one ``cuMemSetAccess``): all or
        nothing, as :meth:`pgmo.device.cuda.CudaRange.map_pages`."""
        g = self.granule
        self._books.check_new(offset, g * len(handles), g, g, self.size)
        made = 0
        try:
            for handle in handles:
                self.map_page(offset + made * g, handle, grant=False)
                made += 1
            self.grant(offset, made * g)
        except BaseException:  # never usable, so never used: unmapped without a sync
            for k in reversed(range(made)):
                self.unmap_page(offset + k * g)
            raise

    def unmap_page(self, offset: int) -> None:
        """Drop the page mapping at ``offset`` (``cuMemUnmap``, after the caller's
        :meth:`synchronize`): it faults from now on; the page's memory stays its handle's
        (given back once released and mapped nowhere)."""
        self.unmap_pages(offset, 1)

    def unmap_pages(self, offset: int, count: int) -> None:
        """Drop the ``count`` adjacent page mappings from ``offset`` in one ``cuMemUnmap``
        (only where the device joins unmaps, :attr:`joins_unmaps`; after the caller's
        :meth:`synchronize`).  ValueError, with nothing changed, where any is not a page's
        mapping."""
        g = self.granule
        for k in range(count):
            at = offset + k * g
            if self._books.handle(at) is None or self._books.length(at) != g:
                raise ValueError(f"no page is mapped at {at:,}")
        if count > 1 and not self.joins_unmaps:
            raise ValueError(f"{count} pages in one call: this device unmaps one mapping "
                             f"per call")
        self._fault(offset, count * g)
        self._forget(offset, count * g)
        self.memory._unmap(0, calls=1)
        self.memory.charge("cuMemUnmap", count * g, count)

    def release_page(self, handle: int) -> None:
        """Give the page ``handle`` up (``cuMemRelease``): its memory goes back now, or once
        its last mapping is dropped."""
        if handle in self._released or handle in self._slots or \
                not 0 <= handle < self._slot_count:
            raise ValueError(f"page {handle} released twice, or never made")
        self.memory.charge("cuMemRelease", 0 if self._books.maps_of(handle) else self.granule)
        if self._books.maps_of(handle):
            self._released.add(handle)
        else:
            self._free_page(handle)

    def _free_page(self, handle: int) -> None:
        g = self.granule
        self._released.discard(handle)
        if not self._finalizer.alive:  # the whole reservation went back already (at exit)
            return
        _check(_LIBC.fallocate(self._state[2], _FALLOC_PUNCH, handle * g, g), "fallocate")
        self._slots.add(handle)
        self._state[1] -= g
        self.memory._unmap(g, calls=0)

    def mappings(self) -> list[tuple[int, int]]:
        """``(offset, nbytes)`` of each mapping, in address order."""
        return self._books.mappings()

    def page_at(self, offset: int) -> Any:
        """The physical page (a :meth:`create_page` handle) mapped at ``offset``; None where
        none is (what a call cut short mapped, as the books say)."""
        return self._books.handle(offset)

    def starts_in(self, lo: int, hi: int) -> bool:
        """Whether a mapping starts in ``[lo, hi)``."""
        return self._books.starts_in(lo, hi)

    def usable_end(self, start: int = 0) -> int:
        """The end of the usable memory from ``start`` (from offset 0: what an arena on this
        range may use)."""
        return self._books.usable_end(start)

    def synchronize(self) -> None:
        self.memory.synchronize()

    def holds(self, ptr: int, size: int) -> bool:
        """Whether ``[ptr, ptr + size)`` lies in mapped granules of this range, access granted."""
        lo = ptr - self.ptr
        if lo < 0 or lo + size > self.size or size <= 0:
            return False
        g = self.granule
        return 0 not in self._open[lo // g:(lo + size - 1) // g + 1]

    def close(self) -> None:
        """Unmap everything (after a sync), give the pages and the address space back."""
        if self._state[0] or self._state[1] or self._books.mappings():
            self.synchronize()
            self.memory._unmap(self._state[0] + self._state[1],
                               calls=len(self._books.mappings()))
            self._books.clear()
            for flags in (self._backed, self._open):
                flags.madvise(mmap.MADV_DONTNEED)  # all zero again, their memory given back
            self._state[0] = self._state[1] = 0
        self._finalizer()
