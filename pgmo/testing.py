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
import contextlib
import ctypes
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Protocol, cast

import numpy as np

from .host_device import DRIVER_PAGE, HostAsyncPool, HostMemory, HostStockPool
from .trace import Trace, events
from .units import round_size

if TYPE_CHECKING:
    from .engine import Backend, Engine
    from .engine.options import StockPool
    from .pool import ProfileGuidedMemoryPool
    from .runs import Run
    from .stats import PoolStats

__all__ = ["HostMemory", "HostStockPool", "HostFallback", "host_pool", "host_engine", "host_backend", "replay",
           "Checker", "events", "replay_run", "host_device_of", "TEST_DEFAULTS", "WRITES", "STAMP"]

#: What the host backends use unless told otherwise: plans made at the
#: boundary (deterministic) by the fast paper's best-fit.  The pool's own
#: defaults (``replan="background", method="best"``) and every other mode are
#: covered by ``tests/test_pool_properties.py``.
TEST_DEFAULTS = {"replan": "sync", "method": "bestfit"}


#: What :class:`Checker` may write into each block (see there).
WRITES = (True, "all", "ends", False)
#: Bytes stamped at each end of a block when only its ends carry the pattern.
STAMP = 8


#: The stock pool the host backends fall back on (the name scripts use).
HostFallback = HostStockPool


class Allocator(Protocol):
    """What :func:`replay_run` drives: anything with CuPy's ``malloc`` (a pgmo pool or
    engine, CuPy's stock pool); with ``begin_iteration``/``end_iteration`` it marks
    iterations too."""

    def malloc(self, size: int) -> Any: ...


class IteratingAllocator(Allocator, Protocol):
    """What :func:`replay` drives: a pgmo pool or engine."""

    @property
    def mode(self) -> str: ...

    def iteration(self) -> ContextManager[object]: ...

    def interrupted(self) -> ContextManager[object]: ...

    def stats(self) -> PoolStats: ...


def _cupy_out_of_memory() -> type[MemoryError]:
    from cupy.cuda.memory import OutOfMemoryError

    return OutOfMemoryError



def device_sources(memory: HostMemory, vmm: bool = True, stream_pool: bool = True,
                   pool_chunk: int | None = None) -> dict:
    """The host analogues of the device layer, as :class:`~pgmo.engine.Backend` fields:
    ``reserve`` (virtual memory: :class:`~pgmo.host_device.HostRange`) unless ``vmm`` is
    false, ``heap`` (the driver's stream-ordered pool:
    :class:`~pgmo.host_device.HostAsyncPool`) unless ``stream_pool`` is false, and the
    device's size.  ``pool_chunk``: the step in which the driver's pool grows and trims
    (None: one page; :data:`~pgmo.host_device.DRIVER_POOL_CHUNK`: 32 MiB, as documented).
    Which heap the pool uses is its ``heap`` option (pgmo's own by default)."""
    reasons = {}
    if not vmm:
        reasons["arena"] = "the device has no virtual memory management"
    if not stream_pool:
        reasons["heap"] = "the device has no stream-ordered memory pools"
    return {"reserve": memory.reserve if vmm else None,
            "heap": (lambda: HostAsyncPool(memory, chunk=pool_chunk))
            if stream_pool else None,
            "device_memory": memory.capacity or 0, "reasons": reasons}


def host_backend(capacity: int | None = None, cupy_objects: bool = False, *, vmm: bool = True,
                 stream_pool: bool = True, page: int | None = DRIVER_PAGE,
                 pool_chunk: int | None = None) -> Backend:
    """A :class:`~pgmo.engine.Backend` on host memory of ``capacity`` bytes (None: unbounded).

    With ``cupy_objects`` the blocks are CuPy ``UnownedMemory`` / ``MemoryPointer``
    objects, as the pool hands out; otherwise plain memory objects (no CuPy needed).
    ``vmm``/``stream_pool``: whether the device has virtual memory management and
    stream-ordered pools (both, as an H100 does, by default); ``page``: the driver's page;
    ``pool_chunk``: the stream-ordered pool's step (see :func:`device_sources`).
    """
    from .engine import Backend

    memory = HostMemory(capacity, page)
    sources = device_sources(memory, vmm, stream_pool, pool_chunk=pool_chunk)
    # (casts: the host pool's blocks declare ptr and size in __slots__ only, unseen by mypy)
    if not cupy_objects:
        return Backend(allocate=memory, fallback=cast("StockPool", HostStockPool(memory)),
                       **sources)
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    oom = _cupy_out_of_memory()
    return Backend(allocate=memory, fallback=cast("StockPool", HostStockPool(memory, oom)),
                   memory_type=UnownedMemory,
                   pointer_type=MemoryPointer, oom_error=oom, **sources)


def host_engine(capacity: int | None = None, *, vmm: bool = True, stream_pool: bool = True,
                page: int | None = DRIVER_PAGE, pool_chunk: int | None = None,
                hot_path: type | None = None, **options: Any) -> Engine:
    """A pgmo :class:`~pgmo.engine.Engine` on host memory, without CuPy.

    Keywords are pool options (``warmup``, ``replan``, ``method``...);
    :data:`TEST_DEFAULTS` apply unless given.  ``vmm``/``stream_pool``/``pool_chunk``: see
    :func:`host_backend`; ``hot_path``: a :class:`~pgmo.engine.handout.HotPath` class
    (the plain-Python one is ``pgmo.engine.reference_handout().HotPath``; default: the
    engine's own choice).
    """
    from .engine import Engine, pool_options

    backend = host_backend(capacity, vmm=vmm, stream_pool=stream_pool, page=page,
                           pool_chunk=pool_chunk)
    engine = Engine(backend, pool_options(**{**TEST_DEFAULTS, **options}), hot_path=hot_path)
    memory = backend.allocate
    assert isinstance(memory, HostMemory)  # host_backend's
    # what replay() reads (through getattr: an engine has no such fields of its own)
    setattr(engine, "host_memory", True)  # noqa: B010
    setattr(engine, "host_device", memory)  # noqa: B010
    _watch_raw(memory, engine)
    return engine


def _watch_raw(memory: HostMemory, engine: Engine) -> None:
    from .engine.memory import RawListener

    listener = RawListener()
    listener.connect(engine.memory)
    memory.on_allocate = listener


def host_pool(capacity: int | None = None, *, vmm: bool = True, stream_pool: bool = True,
              page: int | None = DRIVER_PAGE,
              pool_chunk: int | None = None, **options: Any) -> ProfileGuidedMemoryPool:
    """A :class:`~pgmo.pool.ProfileGuidedMemoryPool` on host memory (needs CuPy, no GPU).

    ``capacity`` plays the device's memory size (None: unbounded); ``vmm`` and
    ``stream_pool`` say whether the device has virtual memory management and
    stream-ordered pools (both by default, as an H100); ``page`` is the driver's
    page and mapping granule (2 MiB; a small one, 512, makes byte counts exact
    for tests that check them); ``pool_chunk``: the model of the driver's pool (see
    :func:`device_sources`); other keywords go to the
    pool (``warmup``, ``replan``, ``method``, ``plan_path``...);
    :data:`TEST_DEFAULTS` apply unless given (pass ``replan="background",
    method="best"`` for the pool's own defaults).
    """
    from .pool import ProfileGuidedMemoryPool

    memory = HostMemory(capacity, page)
    stock = cast("StockPool", HostStockPool(memory, _cupy_out_of_memory()))  # see host_backend
    pool = ProfileGuidedMemoryPool(memory, fallback=stock,
                                   device_id=0,
                                   context=None, total_memory=capacity or 2 ** 40,
                                   device_layer=device_sources(memory, vmm, stream_pool,
                                                               pool_chunk),
                                   **{**TEST_DEFAULTS, **options})
    pool.host_memory = True
    pool.host_device = memory
    _watch_raw(memory, pool.engine)
    return pool


# ------------------------------------------------------------------- checks
class Checker:
    """Writes a pattern unique to each block and verifies it at free.

    Also tracks live address ranges to count overlaps directly, and the
    rounded bytes of the blocks it handed out that are live now
    (``live_bytes``): a count kept apart from the pool's, for tests to
    compare with ``used_bytes``.  Works on host pointers (numpy over the
    address) and, for a CUDA pool, on device memory through CuPy.  Given the
    host ``device`` (a :class:`~pgmo.host_device.HostMemory`), it also checks
    at malloc and at free that each block lies in memory the device still
    lends (a block whose memory was given back while live counts as
    corrupted).

    ``write`` says which bytes carry the pattern: ``True`` (or ``"all"``)
    every byte; ``"ends"`` the first and last :data:`STAMP` bytes of each
    block (every byte of a smaller one), which catches a neighbour running
    into either end, or memory reused behind the pool's back, at a cost
    independent of the block's size (hundreds of MiB stay cheap); ``False``
    none: every byte is then checked by address alone (no two live blocks
    share one, and each lies in held memory).
    """

    def __init__(self, host: bool, device: HostMemory | None = None,
                 write: bool | str = True):
        if write not in WRITES:
            raise ValueError(f"write must be one of {', '.join(map(repr, WRITES))}, "
                             f"got {write!r}")
        self.host = host
        self.device = device
        self.write = "all" if write is True else write
        self.serial = 0
        self.corrupted = 0
        self.overlaps = 0
        self.checked_bytes = 0
        self.live_bytes = 0  # rounded bytes of the blocks it handed out, not freed yet
        self.peak_bytes = 0  # the most of them at once
        self._starts: list[tuple[int, int]] = []  # (ptr, serial), sorted
        self._ends: dict[int, int] = {}  # serial -> end address

    def alloc(self, pool: Allocator, size: int) -> tuple[Any, int, int]:
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
            if self.device is not None and not self.device.holds(ptr, end - ptr):
                self.corrupted += 1  # handed out in memory the pool does not hold: never touched
            elif self.write:
                self._write(memptr, size, serial)
            self.live_bytes += round_size(size)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return memptr, size, serial

    def free(self, handle: tuple[Any, int, int]) -> bool:
        """Verify and drop the caller's reference; False when corrupted."""
        memptr, size, serial = handle
        ok = True
        if size > 0:
            if self.device is not None and not self.device.holds(memptr.ptr, size):
                ok = False  # its memory went back to the device while it lived: not read
            elif self.write:
                ok = self._verify(memptr, size, serial)
            if not ok:
                self.corrupted += 1
            self.checked_bytes += size
            k = bisect.bisect_left(self._starts, (memptr.ptr, serial))
            del self._starts[k]
            del self._ends[serial]
            self.live_bytes -= round_size(size)
        return ok

    def intact(self, handle: tuple[Any, int, int]) -> bool:
        """Whether a live block (what :meth:`alloc` returned) still holds its pattern and lies in
        memory the device lends; it stays live."""
        memptr, size, serial = handle
        if size <= 0:
            return True
        if self.device is not None and not self.device.holds(memptr.ptr, size):
            return False
        return not self.write or self._verify(memptr, size, serial)

    def _regions(self, size: int) -> tuple[tuple[int, int], ...]:
        """The (start, length) byte ranges of a block of ``size`` that carry its pattern."""
        if self.write == "ends" and size > 2 * STAMP:
            return (0, STAMP), (size - STAMP, STAMP)
        return ((0, size),)

    def _views(self, memptr: Any, start: int, length: int) -> tuple[Any, Any]:
        """The block's bytes ``[start, start + length)`` as whole 32-bit words and the rest
        (NumPy arrays over host memory, CuPy arrays over device memory)."""
        words = length // 4
        if self.host:
            raw = np.frombuffer(memoryview((ctypes.c_uint8 * length).from_address(
                memptr.ptr + start)), np.uint8)
            return raw[:words * 4].view(np.uint32), raw[words * 4:]
        import cupy  # a pool on the device: check through CuPy

        raw = cupy.ndarray((start + length,), cupy.uint8, memptr=memptr)[start:]
        return raw[:words * 4].view(cupy.uint32), raw[words * 4:]

    def _write(self, memptr: Any, size: int, serial: int) -> None:
        for start, length in self._regions(size):
            words, tail = self._views(memptr, start, length)
            words.fill(serial & 0xFFFFFFFF)
            tail.fill(serial & 0xFF)

    def _verify(self, memptr: Any, size: int, serial: int) -> bool:
        for start, length in self._regions(size):
            words, tail = self._views(memptr, start, length)
            if (words != (serial & 0xFFFFFFFF)).any() or (tail != (serial & 0xFF)).any():
                return False
        return True


def host_device_of(pool: object) -> HostMemory | None:
    """The host device behind ``pool`` (a :class:`~pgmo.host_device.HostMemory`), else None."""
    device = getattr(pool, "host_device", None) or getattr(pool, "memory", None)
    return device if isinstance(device, HostMemory) else None


def replay(traces: Trace | Iterable[Trace], pool: IteratingAllocator, *,
           interrupted: bool = False, check: bool = True, write: bool | str = True,
           on_event: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Drive ``pool`` through one iteration per trace, checking every block.

    Each trace becomes an alloc/free event sequence (sorted by tick, frees
    first at a tick); mallocs go to ``pool.malloc`` and frees drop the last
    reference.  With ``interrupted`` every iteration runs inside
    ``pool.interrupted()`` (fallback mode).  ``write``: which bytes carry
    the pattern (see :class:`Checker`).  Returns ``corrupted`` (blocks whose
    pattern changed, or whose memory the host device took back while they
    lived), ``overlaps`` (live blocks sharing addresses),
    ``iterations``, ``requests``, ``checked_bytes``, ``peak_bytes`` (the most
    rounded bytes of its blocks live at once), ``modes`` (the pool mode in each
    iteration) and ``stats`` (``pool.stats()`` at the end).  ``on_event(k)`` is
    called after the ``k``-th alloc or free (a progress bar, say).
    """
    if isinstance(traces, Trace):
        traces = [traces]
    checker = Checker(host=getattr(pool, "host_memory", False), device=host_device_of(pool),
                      write=write)
    modes = []
    requests = done = 0
    for trace in traces:
        blocks = trace.blocks
        live: dict[int, tuple] = {}
        handle: tuple | None
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
                    if on_event is not None:
                        on_event(done)
                    done += 1
        for handle in live.values():  # blocks without a free in the trace
            if check:
                checker.free(handle)
        handle = None  # the loop variable must not keep the last block alive
        live.clear()
    return {"corrupted": checker.corrupted, "overlaps": checker.overlaps,
            "iterations": len(modes), "requests": requests,
            "checked_bytes": checker.checked_bytes, "peak_bytes": checker.peak_bytes,
            "modes": modes, "stats": pool.stats()}


def replay_run(run: Run, pool: Allocator, *, write: bool | str = "ends",
               on_event: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Drive ``pool`` through a whole :class:`~pgmo.runs.Run`, checking every block.

    Iteration marks become ``pool.begin_iteration()``/``end_iteration()``
    (a pool without them, CuPy's stock pool say, just serves the requests);
    blocks still live at the end are checked and dropped.  ``write``: which
    bytes carry the pattern (see :class:`Checker`; by default both ends of
    each block, so that whole runs of GiB stay fast; False: by address only).  ``on_event(k)`` is
    called after the ``k``-th event.  A pool that runs out of memory raises
    as it would (OutOfMemoryError); nothing else is caught.  Returns what
    :func:`replay` does, less ``modes``.
    """
    checker = Checker(host=getattr(pool, "host_memory", True), device=host_device_of(pool),
                      write=write)
    begin = getattr(pool, "begin_iteration", None)  # None: the pool marks no iteration
    end = getattr(pool, "end_iteration", None)
    blocks = run.trace.blocks
    live: dict[int, tuple] = {}
    handle: tuple | None
    requests = iterations = 0
    try:
        for k, (kind, i) in enumerate(run.events()):
            if kind == "alloc":
                live[i] = checker.alloc(pool, blocks[i].size)
                requests += 1
            elif kind == "free":
                checker.free(live.pop(i))
            elif kind == "begin":
                if begin is not None:
                    begin()
            else:
                iterations += 1
                if end is not None:
                    end()
            if on_event is not None:
                on_event(k)
    finally:
        for handle in live.values():
            checker.free(handle)
        handle = None  # the loop variable must not keep the last block alive
        live.clear()
    stats = pool.stats() if hasattr(pool, "stats") else None
    return {"corrupted": checker.corrupted, "overlaps": checker.overlaps,
            "iterations": iterations, "requests": requests,
            "checked_bytes": checker.checked_bytes, "peak_bytes": checker.peak_bytes,
            "stats": stats}
