"""The host model of the driver's stream-ordered pool (``cudaMallocFromPoolAsync``).

The analogue of ``cudaMemPoolCreate`` + ``cudaMallocFromPoolAsync`` /
``cudaFreeAsync``: best fit in a range of its own, granules mapped as blocks
need them, freed memory kept for reuse (release threshold at its maximum)
until :meth:`HostAsyncPool.trim` gives every wholly free granule back in one
call.  The driver's own placement is not public; this one is a model.
Tested by ``tests/test_host_device.py``.
"""

from __future__ import annotations

import collections
import threading

from ..placement import PagedSpace
from ..units import round_size
from .host_memory import HostMemory

__all__ = ["HostAsyncPool", "DRIVER_POOL_CHUNK"]

#: The step in which the driver's stream-ordered pool grows and trims, as documented.
DRIVER_POOL_CHUNK = 32 << 20


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
