"""Run and check the pool without a GPU: a host-memory backend and ``replay``.

:func:`host_pool` builds a :class:`~pgmo.pool.ProfileGuidedMemoryPool` whose
arena and fallback are real host memory, so pointers are real addresses that
tests can write to; :func:`host_engine` builds the same engine without CuPy
at all (its blocks are plain memory objects).  :func:`replay` drives any pool
or engine through traces, writes a
distinct pattern into every block at malloc and checks it at free: a block
that another block overwrote (the one failure a pool must never have) shows
up as ``corrupted``.  It also checks directly that no two live blocks share
an address (``overlaps``).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import gc
import threading
from typing import Any, Iterable

import numpy as np

from .trace import Trace, events
from .units import ALIGNMENT as _ALIGN, round_size

__all__ = ["HostMemory", "HostFallback", "host_pool", "host_engine", "host_backend", "replay",
           "Checker", "events", "TEST_DEFAULTS"]

#: What the host backends use unless told otherwise: plans made at the
#: boundary (deterministic) by the fast paper's best-fit.
TEST_DEFAULTS = {"replan": "sync", "method": "bestfit"}


def _cupy_out_of_memory():
    from cupy.cuda.memory import OutOfMemoryError

    return OutOfMemoryError



class _HostBuffer:
    """Raw host memory, 512-byte aligned; its death returns it to its HostMemory."""

    __slots__ = ("ptr", "size", "_array", "_memory")

    def __init__(self, memory: "HostMemory", size: int):
        try:
            self._array = np.empty(size + _ALIGN, np.uint8)
        except (ValueError, MemoryError):  # NumPy's "maximum size exceeded" too
            raise MemoryError(f"host memory: cannot allocate {size} bytes") from None
        base = self._array.ctypes.data
        self.ptr = (base + _ALIGN - 1) // _ALIGN * _ALIGN
        self.size = size
        self._memory = memory

    def __del__(self):
        memory = getattr(self, "_memory", None)  # unset when the allocation failed
        if memory is not None:
            memory._give_back(self.size)


class HostMemory:
    """A pretend device: raw allocations of host memory, up to ``capacity`` bytes.

    Raises MemoryError past the capacity, as cudaMalloc fails when the GPU
    is full; that is how OutOfMemoryError paths are tested on the CPU.
    """

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.in_use = 0
        self.allocations = 0
        self.on_allocate = None  # called after each allocation (the engine's peak of held bytes)
        self._lock = threading.Lock()

    def __call__(self, size: int) -> _HostBuffer:
        with self._lock:
            if self.capacity is not None and self.in_use + size > self.capacity:
                raise MemoryError(f"host device full: {size} bytes requested, "
                                  f"{self.capacity - self.in_use} left")
            self.in_use += size
            self.allocations += 1
        try:
            buffer = _HostBuffer(self, size)
        except BaseException:
            self._give_back(size)
            raise
        if self.on_allocate is not None:
            self.on_allocate()
        return buffer

    def _give_back(self, size: int) -> None:
        with self._lock:
            self.in_use -= size


class _FallbackBlock:
    """A block lent by HostFallback; dropping it caches the buffer again."""

    __slots__ = ("ptr", "size", "_buffer", "_returned")

    def __del__(self):
        self._returned.append(self._buffer)


class HostFallback:
    """A caching pool over :class:`HostMemory`, standing in for CuPy's stock pool.

    It keeps freed buffers by size and reuses exact matches; on a limit or a
    full device it frees its cache and retries, then raises CuPy's
    ``OutOfMemoryError`` (as CuPy's pool does).  Frees only append to a deque,
    so they are safe from any thread and from garbage collection.
    """

    def __init__(self, memory: HostMemory, oom_error=None):
        """``oom_error(size, total, limit)`` makes the error of a full device (CuPy's, say)."""
        from .engine.options import default_oom

        self.memory = memory
        self.oom_error = oom_error or default_oom
        self._cache: dict[int, list[_HostBuffer]] = collections.defaultdict(list)
        self._returned: collections.deque[_HostBuffer] = collections.deque()
        self._used = 0
        self._free = 0
        self._limit = 0
        self._lock = threading.RLock()

    def _collect(self) -> None:
        while self._returned:
            buffer = self._returned.popleft()
            self._cache[buffer.size].append(buffer)
            self._used -= buffer.size
            self._free += buffer.size

    def malloc(self, size: int) -> _FallbackBlock:
        rs = round_size(size)
        with self._lock:
            self._collect()
            cached = self._cache.get(rs)
            if cached:
                buffer = cached.pop()
                self._free -= rs
                self._used += rs
            else:
                buffer = self._new_buffer(rs)
        block = _FallbackBlock()
        block.ptr, block.size, block._buffer, block._returned = (
            buffer.ptr, rs, buffer, self._returned)
        return block

    def _new_buffer(self, rs: int) -> _HostBuffer:
        for attempt in range(3):
            if attempt:
                if attempt == 2:
                    gc.collect()
                    self._collect()
                self._release_cache()
            if self._limit and self.total_bytes() + rs > self._limit:
                continue
            # Counted before the raw allocation, as CuPy's pool does: its
            # listener (the engine's peak of memory held) then sees the new total.
            self._used += rs
            try:
                return self.memory(rs)
            except MemoryError:
                self._used -= rs
                continue
            except BaseException:
                self._used -= rs
                raise
        raise self.oom_error(rs, self.total_bytes(), self._limit)

    def _release_cache(self) -> None:
        self._cache.clear()
        self._free = 0

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
            return self._used + self._free

    def n_free_blocks(self) -> int:
        with self._lock:
            self._collect()
            return sum(len(v) for v in self._cache.values())

    def free_all_blocks(self, stream=None) -> None:
        with self._lock:
            self._collect()
            cache = self._cache
            self._cache = collections.defaultdict(list)
            self._free = 0
        cache.clear()  # the buffers go back to the device outside the lock

    def set_limit(self, size=None, fraction=None) -> None:
        self._limit = int(size or 0)

    def get_limit(self) -> int:
        return self._limit


def host_backend(capacity: int | None = None, cupy_objects: bool = False):
    """A :class:`~pgmo.engine.Backend` on host memory of ``capacity`` bytes (None: unbounded).

    With ``cupy_objects`` the blocks are CuPy ``UnownedMemory`` / ``MemoryPointer``
    objects, as the pool hands out; otherwise plain memory objects (no CuPy needed).
    """
    from .engine import Backend

    memory = HostMemory(capacity)
    if not cupy_objects:
        return Backend(allocate=memory, fallback=HostFallback(memory))
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    oom = _cupy_out_of_memory()
    return Backend(allocate=memory, fallback=HostFallback(memory, oom), memory_type=UnownedMemory,
                   pointer_type=MemoryPointer, oom_error=oom)


def host_engine(capacity: int | None = None, **options: Any):
    """A pgmo :class:`~pgmo.engine.Engine` on host memory, without CuPy.

    Keywords are pool options (``warmup``, ``replan``, ``method``...);
    :data:`TEST_DEFAULTS` apply unless given.
    """
    from .engine import Engine, pool_options

    backend = host_backend(capacity)
    engine = Engine(backend, pool_options(**{**TEST_DEFAULTS, **options}))
    engine.host_memory = True
    _watch_raw(backend.allocate, engine)
    return engine


def _watch_raw(memory: "HostMemory", engine) -> None:
    from .engine.arenas import RawListener

    listener = RawListener()
    listener.connect(engine.arenas)
    memory.on_allocate = listener


def host_pool(capacity: int | None = None, **options: Any):
    """A :class:`~pgmo.pool.ProfileGuidedMemoryPool` on host memory (needs CuPy, no GPU).

    ``capacity`` plays the device's memory size (None: unbounded); other
    keywords go to the pool (``warmup``, ``replan``, ``method``, ``plan_path``...);
    :data:`TEST_DEFAULTS` apply unless given (pass ``replan="background",
    method="best"`` for the pool's own defaults).
    """
    from .pool import ProfileGuidedMemoryPool

    memory = HostMemory(capacity)
    pool = ProfileGuidedMemoryPool(memory, fallback=HostFallback(memory, _cupy_out_of_memory()),
                                   device_id=0,
                                   context=None, total_memory=capacity or 2 ** 40,
                                   **{**TEST_DEFAULTS, **options})
    pool.host_memory = True
    _watch_raw(memory, pool.engine)
    return pool


# ------------------------------------------------------------------- checks
class Checker:
    """Writes a unique 32-bit pattern into each block and verifies it at free.

    Also tracks live address ranges to count overlaps directly.  Works on
    host pointers (numpy over the address) and, for a CUDA pool, on device
    memory through CuPy.
    """

    def __init__(self, host: bool):
        self.host = host
        self.serial = 0
        self.corrupted = 0
        self.overlaps = 0
        self.checked_bytes = 0
        self.live_bytes = 0  # rounded bytes of the blocks it handed out, not freed yet
        self.peak_bytes = 0  # the most of them at once
        self._starts: list[tuple[int, int]] = []  # (ptr, serial), sorted
        self._ends: dict[int, int] = {}  # serial -> end address

    def alloc(self, pool, size: int) -> tuple[Any, int, int]:
        memptr = pool.malloc(size)
        self.serial += 1
        serial = self.serial
        if size > 0:
            ptr = memptr.ptr
            end = ptr + max(size, getattr(memptr, "mem", memptr).size)
            key = (ptr, serial)
            k = bisect.bisect_left(self._starts, key)
            if k and self._ends[self._starts[k - 1][1]] > ptr:
                self.overlaps += 1
            if k < len(self._starts) and self._starts[k][0] < end:
                self.overlaps += 1
            self._starts.insert(k, key)
            self._ends[serial] = end
            self._write(memptr, size, serial)
            self.live_bytes += round_size(size)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return memptr, size, serial

    def free(self, handle: tuple[Any, int, int]) -> bool:
        """Verify and drop the caller's reference; False when corrupted."""
        memptr, size, serial = handle
        ok = True
        if size > 0:
            ok = self._verify(memptr, size, serial)
            if not ok:
                self.corrupted += 1
            self.checked_bytes += size
            k = bisect.bisect_left(self._starts, (memptr.ptr, serial))
            del self._starts[k]
            del self._ends[serial]
            self.live_bytes -= round_size(size)
        return ok

    def _views(self, memptr, size: int):
        words = size // 4
        if self.host:
            raw = np.frombuffer((ctypes.c_uint8 * size).from_address(memptr.ptr), np.uint8)
            return raw[:words * 4].view(np.uint32), raw[words * 4:]
        import cupy  # a pool on the device: check through CuPy

        raw = cupy.ndarray((size,), cupy.uint8, memptr=memptr)
        return raw[:words * 4].view(cupy.uint32), raw[words * 4:]

    def _write(self, memptr, size: int, serial: int) -> None:
        words, tail = self._views(memptr, size)
        words.fill(serial & 0xFFFFFFFF)
        tail.fill(serial & 0xFF)

    def _verify(self, memptr, size: int, serial: int) -> bool:
        words, tail = self._views(memptr, size)
        bad = (words != (serial & 0xFFFFFFFF)).any() or (tail != (serial & 0xFF)).any()
        return not bool(bad)


def replay(traces: Trace | Iterable[Trace], pool, *, interrupted: bool = False,
           check: bool = True) -> dict:
    """Drive ``pool`` through one iteration per trace, checking every block.

    Each trace becomes an alloc/free event sequence (sorted by tick, frees
    first at a tick); mallocs go to ``pool.malloc`` and frees drop the last
    reference.  With ``interrupted`` every iteration runs inside
    ``pool.interrupted()`` (fallback mode).  Returns ``corrupted`` (blocks
    whose pattern changed), ``overlaps`` (live blocks sharing addresses),
    ``iterations``, ``requests``, ``checked_bytes``, ``peak_bytes`` (the most
    rounded bytes of its blocks live at once), ``modes`` (the pool mode in each
    iteration) and ``stats`` (``pool.stats()`` at the end).
    """
    if isinstance(traces, Trace):
        traces = [traces]
    checker = Checker(host=getattr(pool, "host_memory", False))
    modes = []
    requests = 0
    for trace in traces:
        blocks = trace.blocks
        live: dict[int, tuple] = {}
        with pool.iteration():
            with pool.interrupted() if interrupted else contextlib.nullcontext():
                modes.append(pool.mode)
                for _, kind, i in events(blocks):
                    if kind:
                        if check:
                            live[i] = checker.alloc(pool, blocks[i].size)
                        else:
                            live[i] = (pool.malloc(blocks[i].size),)
                        requests += 1
                    else:
                        handle = live.pop(i)
                        if check:
                            checker.free(handle)
                        del handle
        for handle in live.values():  # blocks without a free in the trace
            if check:
                checker.free(handle)
        live.clear()
    return {"corrupted": checker.corrupted, "overlaps": checker.overlaps,
            "iterations": len(modes), "requests": requests,
            "checked_bytes": checker.checked_bytes, "peak_bytes": checker.peak_bytes,
            "modes": modes, "stats": pool.stats()}
