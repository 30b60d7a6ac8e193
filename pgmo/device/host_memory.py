"""The host model of a GPU's memory: the driver's pages, cudaMalloc, and the calls that wait.

pgmo is developed without a GPU, so its footprint is measured against host
models of the device: this module (the device itself), :mod:`.host_range`
(CUDA's virtual memory), :mod:`.host_async_pool` (the driver's
stream-ordered pool) and :mod:`.host_stock_pool` (CuPy's pool).  They are
calibrated on the H100 run of 2026-11-25 (``tests/test_host_device.py``,
which tests all four): replaying the DenseNet-BC traces that CuPy's pool
recorded there reproduces the ``reserved_peak`` it reported.

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
  (``cuMemUnmap``, one per run of adjacent mappings, and ``cudaMemPoolTrimTo``) is counted
  in ``release_calls``: pgmo makes those calls right after a device sync
  (counted), since they do not wait for queued work by themselves (PyTorch
  found that unmapping does not always synchronize; the GPU quick check
  measures what they cost).  Nothing here takes time: a benchmark reads the
  counts.
* **Virtual memory** (:meth:`HostMemory.reserve`): a
  :class:`~pgmo.device.host_range.HostRange`.
* **The driver's time, modelled** (``driver_us``, ``driver_calls``): each
  virtual-memory call, cudaMalloc and cudaFree adds what it cost on the GPU
  the model was fitted to (:func:`call_cost_us`), so that a benchmark can
  say what a boundary's calls would take there; nothing waits for it.  The
  driver's stream-ordered pool's calls and the device syncs are not in it.
* Not modelled: the CUDA context and libraries' memory (about 0.6 GiB on the
  H100), time itself, streams other than one, and the driver's own
  fragmentation.
"""

from __future__ import annotations

import bisect
import mmap
import threading
import weakref
from typing import Callable

import numpy as np

from ..units import ALIGNMENT
from .host_range import HostRange
from .params import PARAMS

__all__ = ["HostMemory", "DRIVER_PAGE", "SMALL_MAX", "OWN_PAGES", "UNBOUNDED_RESERVATION",
           "call_cost_us"]

#: The driver's page: what cudaMalloc and virtual-memory mappings are backed in.
DRIVER_PAGE = 2 << 20
#: cudaMalloc requests up to this size share pages; larger ones take pages of their own.
SMALL_MAX = 1 << 20

#: From this size on a host buffer is pages of its own (``mmap``), given back to
#: the system at its death, as cudaMalloc's memory is.  Through ``malloc`` it
#: would come from glibc's heap, where NumPy asks for huge pages (from 4 MiB)
#: and the chunk headers glibc writes fault them in: 2 MiB zeroed per
#: allocation, a cost (0.5 ms each) no device allocation has.
OWN_PAGES = 4 << 20

#: Address space a reservation takes when the device has no capacity set.
UNBOUNDED_RESERVATION = 256 << 30

_CALL_US: dict = PARAMS.get("call_us") or {}
#: One ``cuMemUnmap`` over a run of mappings, where a GPU measured it apart (the quick
#: check's costs, ``scripts/allocator_costs.py``); else a run costs what one mapping of its
#: size does.
RUN_UNMAP = "cuMemUnmap (a run of granules)"
#: One ``cuMemSetAccess`` over several mappings: its own fitted line where a GPU timed it
#: (the quick check's row of that name), else a call of that size over one mapping.
RUN_ACCESS = "cuMemSetAccess (a run of granules)"
_RUNS = {"cuMemUnmap": RUN_UNMAP, "cuMemSetAccess": RUN_ACCESS}


def call_cost_us(call: str, nbytes: int = 0) -> float:
    """What one driver call of ``nbytes`` costs on the GPU the host model was fitted to
    (:mod:`pgmo.device.params`: ``fixed + per_gib x size`` microseconds; 0 for a call it
    did not measure)."""
    cost = _CALL_US.get(call)
    if not cost:
        return 0.0
    return float(cost["fixed"]) + float(cost["per_gib"]) * nbytes / (1 << 30)


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
    ``maps`` and ``unmaps`` the virtual-memory calls (``joins_unmaps``: one
    ``cuMemUnmap`` may give back a run of adjacent whole mappings, as the
    driver does; false, one mapping per call), ``sync_calls`` every
    call that waits for the device (cudaFree, a device or stream sync),
    ``release_calls`` every other call that gives memory back (an unmap, a
    pool's trim).  Past the capacity it raises
    MemoryError, as the driver fails when the GPU is full.  ``on_allocate``
    is called after each cudaMalloc.
    """

    def __init__(self, capacity: int | None = None, page: int | None = DRIVER_PAGE,
                 joins_unmaps: bool = True):
        self.capacity = capacity
        self.page = page
        self.joins_unmaps = joins_unmaps
        self.in_use = 0
        self.bytes_in_use = 0
        self.peak = 0
        self.allocations = 0
        self.releases = 0
        self.maps = 0
        self.unmaps = 0
        self.sync_calls = 0
        self.release_calls = 0
        self.driver_us = 0.0  # the modelled time of the driver's calls (see the module)
        self.driver_calls: dict[str, int] = {}
        self.on_allocate: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._starts: list[int] = []  # addresses of the buffers held, sorted
        self._ends: dict[int, int] = {}  # address -> end of its buffer
        self._shared: list[list[int]] = []  # per shared page: [bytes free, allocations]
        self._ranges: "weakref.WeakSet[HostRange]" = weakref.WeakSet()

    # ------------------------------------------------------------- cudaMalloc
    def charge(self, call: str, nbytes: int = 0, mappings: int = 1) -> None:
        """One driver call of ``nbytes`` made (over ``mappings`` mappings): its modelled cost
        added to ``driver_us``."""
        run = _RUNS.get(call, call)
        timed = run if mappings > 1 and run in _CALL_US else call
        self.driver_us += call_cost_us(timed, nbytes)
        self.driver_calls[call] = self.driver_calls.get(call, 0) + 1

    def __call__(self, size: int) -> _HostBuffer:
        with self._lock:
            page = self._take(size)
            self.allocations += 1
            self.charge("cudaMalloc", size)
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
                self.charge("cudaFree", size)
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
        reserved = HostRange(self, size)
        self._ranges.add(reserved)
        return reserved

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
        """Restart the peak from the bytes in use now."""
        with self._lock:
            self.peak = self.in_use
