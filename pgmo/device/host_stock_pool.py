"""The host model of CuPy's pool: ``SingleDeviceMemoryPool``, over the host device.

:class:`HostStockPool` behaves like CuPy 14's ``SingleDeviceMemoryPool``
(``cupy/cuda/memory.pyx``), on one stream, over a
:class:`~pgmo.device.host_memory.HostMemory` (tested by
``tests/test_host_device.py``, which calibrates it on the H100):

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
import gc
import threading
from typing import Any, Callable

from ..errors import out_of_memory
from ..units import round_size
from .host_memory import HostMemory

__all__ = ["HostStockPool"]


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
        self.oom_error = oom_error or out_of_memory
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
