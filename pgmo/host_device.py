"""Host stand-ins for a GPU's memory: the driver's pages, cudaMalloc, reserved ranges, and pools.

pgmo is developed without a GPU, so its footprint is measured against these
models.  They are calibrated on the H100 run of 2026-11-25
(``tests/test_host_device.py``): replaying the DenseNet-BC traces that CuPy's
pool recorded there reproduces the ``reserved_peak`` it reported.

:class:`HostMemory` plays the device: real host memory (so the bytes can be
written and checked), a capacity past which it fails as a full device does,
and the driver's accounting.  What it models, and what it leaves out:

* **Pages.**  The driver backs memory in 2 MiB pages (:data:`DRIVER_PAGE`),
  and NVML counts whole pages.  A cudaMalloc of more than 1 MiB (half a
  page) takes whole pages of its own; smaller ones are packed into shared
  pages, and a shared
  page is given back only when the last allocation in it is freed.  The
  packing counts bytes only (an allocation goes to the first shared page
  with room for it; no fragmentation inside a page): a simple model, not
  the driver's undocumented sub-allocator.  ``in_use`` and ``peak`` count
  pages held; ``bytes_in_use`` the bytes as asked.  ``page=None`` counts
  bytes as asked (no pages), as CuPy's own counters do.
* **Synchronizing calls and release calls.**  cudaFree waits for the whole
  device (every queued kernel), as does a device or stream sync;
  ``sync_calls`` counts them.  Giving memory back otherwise
  (``cuMemUnmap``, one per mapping, and ``cudaMemPoolTrimTo``) is counted
  in ``release_calls``: pgmo makes those calls right after a device sync
  (counted), since they do not wait for queued work by themselves (PyTorch
  found that unmapping does not always synchronize; the GPU quick check
  measures what they cost).  Nothing here takes time: a benchmark reads the
  counts.
* **Virtual memory** (:meth:`HostMemory.reserve`): the analogue of
  ``cuMemAddressReserve`` / ``cuMemCreate`` + ``cuMemMap`` / ``cuMemUnmap``
  is an ``mmap(PROT_NONE)`` reservation whose granules are committed
  (``mprotect``) and released (``madvise(MADV_DONTNEED)`` + ``PROT_NONE``):
  a stale access to an unmapped granule faults, as on a GPU.
* **A stream-ordered pool** (:class:`HostAsyncPool`, the analogue of
  ``cudaMemPoolCreate`` + ``cudaMallocFromPoolAsync``/``cudaFreeAsync``):
  best fit in a range of its own, granules mapped as blocks need them, freed
  memory kept for reuse (release threshold at its maximum) until
  :meth:`HostAsyncPool.trim` gives every wholly free granule back in one
  call.  The driver's own placement is not public; this one is a model.
* Not modelled: the CUDA context and libraries' memory (about 0.6 GiB on the
  H100), time, streams other than one, and the driver's own fragmentation.

:class:`HostStockPool` behaves like CuPy 14's ``SingleDeviceMemoryPool``
(``cupy/cuda/memory.pyx``), on one stream:

* sizes are rounded up to 512 bytes;
* free chunks are binned by exact size; a request takes a chunk from the
  smallest bin at least as large and splits off the rest, which goes back
  to its own bin (CuPy takes an arbitrary member of the bin, ``set.pop()``;
  this model takes the chunk freed last, which is deterministic);
* a freed chunk merges with the free chunks next to it in the same
  allocation;
* ``free_all_blocks`` releases the free chunks that are whole allocations
  (never split);
* a new allocation is counted first; past the pool's limit it fails at once
  with ``OutOfMemoryError``; when the device is full it releases its free
  blocks and retries, then collects garbage and retries once more.

Frees arrive from the blocks' destructors, possibly in the middle of another
allocation; they only append to a deque, and the pool applies them in order
at its next call, as CuPy's lock-and-no-GC section would have serialized them.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import gc
import mmap
import threading
import weakref
from typing import Any, Callable

import numpy as np

from .mappings import MappingLedger
from .placement import PagedSpace
from .units import ALIGNMENT, round_size

__all__ = ["HostMemory", "HostStockPool", "HostRange", "HostAsyncPool", "DRIVER_PAGE",
           "SMALL_MAX", "DRIVER_POOL_CHUNK"]

#: The driver's page: what cudaMalloc and virtual-memory mappings are backed in.
DRIVER_PAGE = 2 << 20
#: cudaMalloc requests up to this size share pages; larger ones take pages of their own.
SMALL_MAX = 1 << 20
#: The step in which the driver's stream-ordered pool grows and trims, as documented.
DRIVER_POOL_CHUNK = 32 << 20

#: From this size on a host buffer is pages of its own (``mmap``), given back to
#: the system at its death, as cudaMalloc's memory is.  Through ``malloc`` it
#: would come from glibc's heap, where NumPy asks for huge pages (from 4 MiB)
#: and the chunk headers glibc writes fault them in: 2 MiB zeroed per
#: allocation, a cost (0.5 ms each) no device allocation has.
OWN_PAGES = 4 << 20

#: Address space a reservation takes when the device has no capacity set.
UNBOUNDED_RESERVATION = 256 << 30


class _HostBuffer:
    """Raw host memory, 512-byte aligned; its death returns it to its HostMemory."""

    __slots__ = ("ptr", "size", "page", "_array", "_memory")

    def __init__(self, memory: "HostMemory", size: int):
        try:
            if size >= OWN_PAGES:  # page-aligned
                self._array = np.frombuffer(mmap.mmap(-1, size), np.uint8)
            else:
                self._array = np.empty(size + ALIGNMENT, np.uint8)
        except (ValueError, MemoryError, OSError, OverflowError):  # "maximum size exceeded" too
            raise MemoryError(f"host memory: cannot allocate {size} bytes") from None
        base = self._array.ctypes.data
        self.ptr = (base + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self.size = size
        self.page = -1  # the shared page it was packed into (-1: pages of its own)
        self._memory = memory

    def __del__(self):
        memory = getattr(self, "_memory", None)  # unset when the allocation failed
        if memory is not None:
            memory._give_back(self.size, ptr=self.ptr, page=self.page)


class HostMemory:
    """A pretend device: cudaMalloc, reservations and pools of host memory, up to ``capacity``.

    ``in_use`` is every byte held now in the driver's pages (``page``; None:
    bytes as asked), ``peak`` the most held at once (:meth:`reset_peak`
    restarts it from ``in_use``); ``bytes_in_use`` counts the bytes as asked.
    ``allocations`` and ``releases`` count cudaMalloc and cudaFree calls,
    ``maps`` and ``unmaps`` the virtual-memory calls, ``sync_calls`` every
    call that waits for the device (cudaFree, a device or stream sync),
    ``release_calls`` every other call that gives memory back (an unmap, a
    pool's trim).  Past the capacity it raises
    MemoryError, as the driver fails when the GPU is full.  ``on_allocate``
    is called after each cudaMalloc.
    """

    def __init__(self, capacity: int | None = None, page: int | None = DRIVER_PAGE):
        self.capacity = capacity
        self.page = page
        self.in_use = 0
        self.bytes_in_use = 0
        self.peak = 0
        self.allocations = 0
        self.releases = 0
        self.maps = 0
        self.unmaps = 0
        self.sync_calls = 0
        self.release_calls = 0
        self.on_allocate: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._starts: list[int] = []  # addresses of the buffers held, sorted
        self._ends: dict[int, int] = {}  # address -> end of its buffer
        self._shared: list[list[int]] = []  # per shared page: [bytes free, allocations]
        self._ranges: "weakref.WeakSet[HostRange]" = weakref.WeakSet()

    # ------------------------------------------------------------- cudaMalloc
    def __call__(self, size: int) -> _HostBuffer:
        with self._lock:
            page = self._take(size)
            self.allocations += 1
        try:
            buffer = _HostBuffer(self, size)
        except BaseException:
            self._give_back(size, counted=False, page=page)
            raise
        buffer.page = page
        with self._lock:
            bisect.insort(self._starts, buffer.ptr)
            self._ends[buffer.ptr] = buffer.ptr + size
        if self.on_allocate is not None:
            self.on_allocate()
        return buffer

    def _take(self, size: int) -> int:
        """Count a cudaMalloc of ``size`` (lock held); the shared page it went to, or -1."""
        page = self.page
        shared = -1
        if page is None:
            grow = size
        elif size > min(SMALL_MAX, page // 2):
            grow = -(-size // page) * page
        else:
            grow = page
            for k, slot in enumerate(self._shared):
                if slot[0] >= size and slot[1] >= 0:
                    grow, shared = 0, k
                    break
        self._charge(grow, f"{size:,} bytes requested")
        if page is not None and size <= min(SMALL_MAX, page // 2):
            if shared < 0:
                for k, slot in enumerate(self._shared):  # reuse a released slot
                    if slot[1] < 0:
                        shared = k
                        break
                else:
                    self._shared.append([0, 0])
                    shared = len(self._shared) - 1
                self._shared[shared] = [page, 0]
            slot = self._shared[shared]
            slot[0] -= size
            slot[1] += 1
        self.bytes_in_use += size
        return shared

    def _charge(self, grow: int, what: str) -> None:
        """Hold ``grow`` more bytes of pages, within the capacity (lock held)."""
        if self.capacity is not None and self.in_use + grow > self.capacity:
            raise MemoryError(f"host device full: {what}, "
                              f"{self.capacity - self.in_use:,} left")
        self.in_use += grow
        if self.in_use > self.peak:
            self.peak = self.in_use

    def _give_back(self, size: int, counted: bool = True, ptr: int | None = None,
                   page: int = -1, _index=bisect.bisect_left) -> None:
        # _index bound here: buffers may die at interpreter exit, after module globals
        with self._lock:
            self.bytes_in_use -= size
            if self.page is None:
                self.in_use -= size
            elif page >= 0:
                slot = self._shared[page]
                slot[0] += size
                slot[1] -= 1
                if slot[1] == 0:  # its last allocation: the page goes back
                    slot[1] = -1
                    self.in_use -= self.page
            else:
                self.in_use -= -(-size // self.page) * self.page
            if counted:
                self.releases += 1
                self.sync_calls += 1  # cudaFree waits for the device
            if ptr is not None and self._ends.pop(ptr, None) is not None:
                del self._starts[_index(self._starts, ptr)]

    # -------------------------------------------------------- virtual memory
    @property
    def granule(self) -> int:
        """What a mapping is made of (``cuMemGetAllocationGranularity``)."""
        return self.page or DRIVER_PAGE

    def reserve(self, size: int | None = None) -> "HostRange":
        """Reserve address space, no memory (``cuMemAddressReserve``); twice the capacity
        by default (an arena and what grows beside it both fit)."""
        if size is None:
            size = 2 * self.capacity if self.capacity else \
                min(UNBOUNDED_RESERVATION, self.granule << 21)
        return HostRange(self, size)

    def _map(self, nbytes: int, calls: int = 1) -> None:
        with self._lock:
            self._charge(nbytes, f"mapping {nbytes:,} bytes")
            self.maps += calls

    def _unmap(self, nbytes: int, calls: int = 1) -> None:
        with self._lock:
            self.in_use -= nbytes
            self.unmaps += calls
            self.release_calls += calls

    def synchronize(self) -> None:
        """Wait for every queued kernel (before unmapping or trimming what they may use)."""
        self.count_sync()

    def count_sync(self, calls: int = 1) -> None:
        """``calls`` more calls that waited for the device."""
        with self._lock:
            self.sync_calls += calls

    def count_release(self, calls: int = 1) -> None:
        """``calls`` more calls that gave memory back without a wait of their own."""
        with self._lock:
            self.release_calls += calls

    # ----------------------------------------------------------------- views
    def holds(self, ptr: int, size: int) -> bool:
        """Whether ``[ptr, ptr + size)`` lies in one buffer held now, or in mapped granules."""
        with self._lock:
            k = bisect.bisect_right(self._starts, ptr)
            if k and ptr + size <= self._ends[self._starts[k - 1]]:
                return True
        return any(r.holds(ptr, size) for r in list(self._ranges))

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.in_use


# --------------------------------------------------------------- libc calls
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    for name in ("mprotect", "madvise"):
        getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc()


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: errno {err}")


def _release_reservation(memory: "HostMemory", mapped: list, base: int, size: int) -> None:
    """A range is gone (closed, or its last user died): its memory and address space go back."""
    if mapped[0]:
        memory._unmap(mapped[0], calls=0)  # nothing can use it any more: no sync to wait for
        mapped[0] = 0
    _LIBC.munmap(base, size)


class HostRange:
    """Reserved address space whose granules are mapped on demand: CUDA's virtual memory, on
    the host.

    The driver's calls, with its rules (the books are a
    :class:`~pgmo.mappings.MappingLedger`, as :class:`~pgmo.cuda_device.CudaRange`'s):
    :meth:`map` backs ``[offset, offset + nbytes)`` with mappings of ``piece``
    bytes at most (``cuMemCreate`` + ``cuMemMap`` each) and then grants access to
    all of them (one ``cuMemSetAccess``), all or nothing; :meth:`unmap` gives
    back whole mappings (one ``cuMemUnmap`` each, the highest first, never part
    of one) after the caller's :meth:`synchronize`.  Memory that is not mapped,
    or mapped without access, faults when touched.  :meth:`map_one`,
    :meth:`grant` and :meth:`unmap_one` are the single calls (what the CUDA
    stand-ins drive); :meth:`commit` and :meth:`decommit` back memory without
    the mapping rules and the call counts: what a driver's own pool does
    inside one call.
    """

    def __init__(self, memory: HostMemory, size: int):
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
        self._state = [0]  # bytes backed by memory, shared with the finalizer
        self._backed = bytearray(size // granule)  # 1: the granule is backed by memory
        self._open = bytearray(size // granule)  # 1: and access to it was granted
        self._books = MappingLedger()
        self._finalizer = weakref.finalize(self, _release_reservation, memory, self._state, raw,
                                           size + granule)
        memory._ranges.add(self)

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

    def grant(self, offset: int, nbytes: int) -> None:
        """Access to ``[offset, offset + nbytes)`` (``cuMemSetAccess``): it must be mapped
        throughout."""
        self._aligned(offset, nbytes)
        g = self.granule
        if 0 in self._backed[offset // g:(offset + nbytes) // g]:
            raise ValueError(f"access to [{offset:,}, {offset + nbytes:,}), which is not "
                             f"mapped throughout")
        self._open_granules(offset, nbytes)
        self._books.make_usable([s for s, n in self._books.mappings()
                                 if offset <= s and s + n <= offset + nbytes])

    def unmap_one(self, start: int, nbytes: int) -> None:
        """Give back exactly one mapping (``cuMemUnmap``); ValueError for anything else."""
        self._books.run(start, nbytes)
        if self._books.length(start) != nbytes:
            raise ValueError(f"[{start:,}, {start + nbytes:,}) is not one whole mapping")
        self._books.remove(start)
        self.decommit(start, nbytes, calls=1)

    def map(self, offset: int, nbytes: int, piece: int | None = None) -> None:
        """Back ``[offset, offset + nbytes)`` with mappings of ``piece`` bytes at most, then
        grant access over all of it; all or nothing (MemoryError when the device is full)."""
        self._aligned(offset, nbytes)
        piece = piece or nbytes
        if piece % self.granule:
            raise ValueError(f"mappings of {piece:,} bytes are not whole granules")
        if self._books.overlaps(offset, nbytes):
            raise ValueError(f"range [{offset:,}, {offset + nbytes:,}) is already mapped in part")
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
        """Give back the whole mappings that make up ``[offset, offset + nbytes)``, the highest
        first (one call each, after :meth:`synchronize`); the range faults from now on."""
        self._aligned(offset, nbytes)
        for start in reversed(self._books.run(offset, nbytes)):
            self.unmap_one(start, self._books.length(start))

    def mappings(self) -> list[tuple[int, int]]:
        """``(offset, nbytes)`` of each mapping, in address order."""
        return self._books.mappings()

    def usable_end(self) -> int:
        """The end of the usable memory from offset 0 (what an arena on this range may use)."""
        return self._books.usable_end()

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
        """Unmap everything (after a sync) and give the address space back."""
        if self._state[0]:
            self.synchronize()
            self.memory._unmap(self._state[0], calls=len(self._books.mappings()))
            self._books.clear()
            self._backed[:] = bytes(len(self._backed))
            self._open[:] = bytes(len(self._open))
            self._state[0] = 0
        self._finalizer()


class _AsyncBlock:
    """A block of a :class:`HostAsyncPool`; its death is its ``cudaFreeAsync``.  It keeps
    its pool (and so the pool's memory) alive, as the driver keeps a pool with
    outstanding allocations."""

    __slots__ = ("ptr", "size", "_lo", "_pool")
    ptr: int
    size: int
    _lo: int
    _pool: "HostAsyncPool"

    def __del__(self) -> None:
        self._pool._returned.append((self._lo, self.size))


class HostAsyncPool:
    """A private stream-ordered pool (cudaMallocFromPoolAsync / cudaFreeAsync), on the host.

    Blocks are placed best fit (the smallest free range that holds them, at
    its start) in a reserved range of their own; the chunks a block touches
    are backed when it is made.  A freed block's memory stays in the pool for
    the next request (no call waits for the device: the release threshold is
    at its maximum) until :meth:`trim`, which gives back every wholly free
    chunk in one call (``cudaMemPoolTrimTo(pool, 0)``, after a device sync);
    a chunk that backs a live block stays.  ``held`` is the memory backed now.

    ``chunk``: the step in which the pool grows and trims.  The driver's pool
    is documented (CuPy's ``MemoryAsyncPool``) to reserve 32 MiB multiples
    (:data:`DRIVER_POOL_CHUNK`: its first block, however small, holds 32 MiB)
    and to trim in 32 MiB steps; a chunk of one page (2 MiB) is the
    optimistic model, best fit with page-granular trims.  The driver's own
    placement is not public: best fit is a model of it, not a copy.
    """

    def __init__(self, memory: HostMemory, size: int | None = None, chunk: int | None = None):
        """``chunk``: bytes, a multiple of the device's granule (None: one granule)."""
        self.memory = memory
        self.range = memory.reserve(size)
        self.granule = chunk or self.range.granule
        if self.granule % self.range.granule:
            raise ValueError(f"a chunk of {self.granule:,} bytes is not whole granules of "
                             f"{self.range.granule:,}")
        self._space = PagedSpace(self.range.size, self.granule)  # free ranges; chunks backed
        self._returned: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._used = 0
        self.trims = 0
        self.maps = 0

    @property
    def held(self) -> int:
        return self.range.mapped

    @property
    def used(self) -> int:
        """Bytes of live blocks (frees that arrived are applied first)."""
        with self._lock:
            self._collect()
            return self._used

    def malloc(self, size: int) -> _AsyncBlock:
        rs = round_size(size)
        g = self.granule
        with self._lock:
            self._collect()
            lo = self._space.place(rs)
            if lo < 0:
                raise MemoryError(f"stream-ordered pool: no room for {rs:,} bytes in its "
                                  f"{self.range.size:,}-byte range")
            done: list[tuple[int, int]] = []
            try:
                for first, stop in self._space.unbacked(lo, lo + rs):
                    self.range.commit(first * g, (stop - first) * g)
                    self._space.set_backed(first, stop, True)
                    done.append((first, stop))
                    self.maps += 1
            except MemoryError:  # what this call backed goes back: the device is full
                for first, stop in done:
                    self.range.decommit(first * g, (stop - first) * g)
                    self._space.set_backed(first, stop, False)
                self._space.free.release(lo, lo + rs)
                raise
            self._used += rs
        block = _AsyncBlock()
        block.ptr, block.size, block._lo, block._pool = self.range.ptr + lo, rs, lo, self
        return block

    def _collect(self) -> None:
        returned = self._returned
        while returned:
            lo, rs = returned.popleft()
            self._space.free.release(lo, lo + rs)
            self._used -= rs

    def trim(self) -> int:
        """Give back every wholly free chunk: one call (after the caller's device sync),
        however many chunks; returns the bytes released."""
        with self._lock:
            self._collect()
            g = self.granule
            released = 0
            for first, stop in self._space.idle_pages():
                self.range.decommit(first * g, (stop - first) * g)  # inside the one trim call
                self._space.set_backed(first, stop, False)
                released += (stop - first) * g
            if released:
                self.memory.count_release()
            self.trims += 1
            return released

    def synchronize(self) -> None:
        """Wait for the stream (before :meth:`trim`, as for ``cudaMemPoolTrimTo``)."""
        self.memory.synchronize()

    def close(self) -> None:
        self.range.close()


class _Chunk:
    """A piece of one raw allocation: free or lent, linked to its neighbours."""

    __slots__ = ("buffer", "offset", "size", "prev", "next", "free")

    def __init__(self, buffer: Any, offset: int, size: int):
        self.buffer, self.offset, self.size = buffer, offset, size
        self.prev: _Chunk | None = None
        self.next: _Chunk | None = None
        self.free = False


class _PooledBlock:
    """A block lent by :class:`HostStockPool`; its death gives the chunk back."""

    __slots__ = ("ptr", "size", "_chunk", "_returned")
    ptr: int
    size: int
    _chunk: "_Chunk"
    _returned: "collections.deque[_Chunk]"

    def __del__(self):
        self._returned.append(self._chunk)


def _default_oom(size: int, total: int, limit: int) -> MemoryError:
    from .engine.options import default_oom

    return default_oom(size, total, limit)


class HostStockPool:
    """CuPy 14's stock memory pool (one device, one stream) over :class:`HostMemory`.

    Same methods as ``cupy.cuda.MemoryPool``: ``malloc``, ``used_bytes``,
    ``free_bytes``, ``total_bytes``, ``n_free_blocks``, ``free_all_blocks``,
    ``set_limit``/``get_limit``; ``malloc`` returns an object with ``ptr``
    and ``size`` that owns the block until it is dropped.
    """

    def __init__(self, memory: HostMemory, oom_error: Callable[[int, int, int],
                                                              BaseException] | None = None):
        """``oom_error(size, total, limit)`` makes the error of a full device (CuPy's, say)."""
        self.memory = memory
        self.oom_error = oom_error or _default_oom
        self._bins: dict[int, list[_Chunk]] = {}  # size -> free chunks, freed last at the end
        self._sizes: list[int] = []  # sizes with free chunks, sorted
        self._returned: collections.deque[_Chunk] = collections.deque()
        self._total = 0
        self._used = 0
        self._free = 0
        self._nfree = 0
        self._limit = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------ free lists
    def _push(self, chunk: _Chunk) -> None:
        chunk.free = True
        bin_ = self._bins.get(chunk.size)
        if bin_ is None:
            self._bins[chunk.size] = bin_ = []
            bisect.insort(self._sizes, chunk.size)
        bin_.append(chunk)
        self._free += chunk.size
        self._nfree += 1

    def _remove(self, chunk: _Chunk) -> None:
        bin_ = self._bins[chunk.size]
        bin_.remove(chunk)
        if not bin_:
            self._drop_bin(chunk.size)
        chunk.free = False
        self._free -= chunk.size
        self._nfree -= 1

    def _drop_bin(self, size: int) -> None:
        del self._bins[size]
        del self._sizes[bisect.bisect_left(self._sizes, size)]

    def _collect(self) -> None:
        """Apply the frees that arrived since the last call, in order."""
        returned = self._returned
        while returned:
            chunk = returned.popleft()
            self._used -= chunk.size
            nxt = chunk.next
            if nxt is not None and nxt.free:
                self._remove(nxt)
                chunk.size += nxt.size
                chunk.next = nxt.next
                if nxt.next is not None:
                    nxt.next.prev = chunk
            prev = chunk.prev
            if prev is not None and prev.free:
                self._remove(prev)
                prev.size += chunk.size
                prev.next = chunk.next
                if chunk.next is not None:
                    chunk.next.prev = prev
                chunk = prev
            self._push(chunk)

    # ----------------------------------------------------------------- malloc
    def malloc(self, size: int) -> _PooledBlock:
        rs = round_size(size)
        with self._lock:
            self._collect()
            chunk = self._take_cached(rs)
            if chunk is None:
                chunk = _Chunk(self._new_buffer(rs), 0, rs)
            self._used += rs
        block = _PooledBlock()
        block.ptr = chunk.buffer.ptr + chunk.offset
        block.size = rs
        block._chunk = chunk
        block._returned = self._returned
        return block

    def _take_cached(self, rs: int) -> _Chunk | None:
        """The last-freed chunk of the smallest bin that fits, split to ``rs``."""
        sizes = self._sizes
        k = bisect.bisect_left(sizes, rs)
        if k == len(sizes):
            return None
        size = sizes[k]
        bin_ = self._bins[size]
        chunk = bin_.pop()
        if not bin_:
            self._drop_bin(size)
        chunk.free = False
        self._free -= size
        self._nfree -= 1
        if size > rs:  # split: the head is lent, the rest stays free
            rest = _Chunk(chunk.buffer, chunk.offset + rs, size - rs)
            rest.prev, rest.next = chunk, chunk.next
            if chunk.next is not None:
                chunk.next.prev = rest
            chunk.next = rest
            chunk.size = rs
            self._push(rest)
        return chunk

    def _new_buffer(self, rs: int) -> Any:
        if self._limit and self._total + rs > self._limit:
            raise self.oom_error(rs, self._total, self._limit)
        # Counted before the raw allocation, as CuPy's pool does: a listener on
        # the raw allocator (the engine's peak of memory held) sees the new total.
        self._total += rs
        try:
            for attempt in range(3):
                if attempt == 1:
                    self._release_unsplit()
                elif attempt == 2:
                    gc.collect()
                    self._collect()
                    self._release_unsplit()
                try:
                    return self.memory(rs)
                except MemoryError:
                    continue
        except BaseException:
            self._total -= rs
            raise
        self._total -= rs
        raise self.oom_error(rs, self._total, self._limit)

    def _release_unsplit(self) -> None:
        """Give the device back every free chunk that is a whole allocation."""
        for size in list(self._sizes):
            bin_ = self._bins[size]
            keep = [c for c in bin_ if c.prev is not None or c.next is not None]
            gone = len(bin_) - len(keep)
            if not gone:
                continue
            self._total -= gone * size
            self._free -= gone * size
            self._nfree -= gone
            for c in bin_:
                if c.prev is None and c.next is None:
                    c.buffer = None
            if keep:
                self._bins[size] = keep
            else:
                self._drop_bin(size)

    # ---------------------------------------------------------- CuPy's queries
    def used_bytes(self) -> int:
        with self._lock:
            self._collect()
            return self._used

    def free_bytes(self) -> int:
        with self._lock:
            self._collect()
            return self._free

    def total_bytes(self) -> int:
        with self._lock:
            self._collect()
            return self._total

    def n_free_blocks(self) -> int:
        with self._lock:
            self._collect()
            return self._nfree

    def free_all_blocks(self, stream=None) -> None:
        with self._lock:
            self._collect()
            self._release_unsplit()

    def set_limit(self, size=None, fraction=None) -> None:
        self._limit = int(size or 0)

    def get_limit(self) -> int:
        return self._limit
