"""Stand-ins for the GPU modules the quick check calls: its dry run runs every line on a CPU.

``python -m scripts.gpu_quick_check --dry-run`` takes its modules from
:func:`modules` instead of ``cupy.cuda.runtime``, ``pynvml`` and
``cuda.bindings.driver`` (the real ones: :func:`scripts.gpu_modules.real_modules`,
the same names).  Each stand-in has the real names, argument order and return
shapes (the driver's functions return tuples ``(CUresult, value...)``; CuPy's
runtime returns values and raises on errors; NVML returns objects with
``used``, ``pid``, ``usedGpuMemory``), and models only what the check looks
at, as a stand-in, never as a measurement:

* **Memory.**  One device of 80 GiB with a 512 MiB context, whose memory is
  real host memory (:class:`pgmo.device.host_memory.HostMemory`, 2 MiB pages):
  cudaMalloc is a host buffer, a reserved range is a
  :class:`~pgmo.device.host_range.HostRange` (mapped granules, access granted,
  whole mappings unmapped), a stream-ordered pool is a
  :class:`~pgmo.device.host_async_pool.HostAsyncPool` growing and trimming in
  ``pool_chunk`` steps (32 MiB, as CuPy documents the driver's pool).  So
  pgmo's own device layer (:mod:`pgmo.device.cuda`) runs its real code on
  them, and the replays' checker writes and verifies real bytes.  The bytes
  in use (``cudaMemGetInfo``, NVML) are the context plus the pages held.
* **Queued work** per stream, as a clock: ``spin(ms, stream)`` queues ``ms``
  of work, ``touch(ptr, size, ms, stream)`` work that reads
  ``[ptr, ptr + size)`` until it is done.  A device sync waits for every
  stream, a stream sync for its own; ``cudaFree`` waits for the device (as
  documented); unmapping, trimming a pool, freeing a range or a block
  while work that reads it is still queued is recorded in ``violations``
  as the illegal-address fault it would be on a GPU, and the next sync
  raises it (``cudaErrorIllegalAddress``, sticky), as CUDA does.
* **Streams and threads.**  Handle 0 (and 1) is the legacy stream, 2
  (``cudaStreamPerThread``) the *calling* thread's stream; with
  ``per_thread`` (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``) a thread's
  current stream is its own.  ``cudaFreeAsync`` of a block on one stream
  while another stream's queued work reads it is a violation.
* Every call costs ``CALL_US``.

Which real calls wait for queued work, how the driver's pool reserves and
what each call costs is what the quick check measures on a GPU; the models
here only let the dry run show that the check can tell.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable

from pgmo.device.host_async_pool import DRIVER_POOL_CHUNK, HostAsyncPool
from pgmo.device.host_memory import DRIVER_PAGE, HostMemory

GiB, MiB = 2**30, 2**20
TOTAL = 80 * GiB
CONTEXT = 512 * MiB
PAGE = DRIVER_PAGE
CALL_US = 20  # every stand-in call costs this many microseconds
LEGACY, PER_THREAD = 0, 2  # stream handles: the legacy default stream, cudaStreamPerThread
NOT_READY, ILLEGAL_ADDRESS = 600, 700  # cudaErrorNotReady, cudaErrorIllegalAddress
NAME = "stand-in GPU (dry run)"


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


class Stream:
    """A stand-in stream: its handle (``ptr``, as CuPy's ``Stream``), its queued work, and
    ``with stream:`` making it the thread's current one (as in CuPy)."""

    def __init__(self, device: "Device", ptr: int, thread: int | None = None):
        self.device = device
        self.ptr = ptr
        self.thread = thread  # a per-thread default stream's thread
        self.busy_until = 0.0
        self.work: list[tuple[int, int, float]] = []  # (ptr, size, done at) read by kernels
        self._previous: list[Any] = []

    def __enter__(self) -> "Stream":
        self._previous.append(getattr(self.device._local, "stream", None))
        self.device._local.stream = self
        return self

    def __exit__(self, *exc) -> None:
        self.device._local.stream = self._previous.pop()

    def synchronize(self) -> None:
        self.device.drain(self)

    def __repr__(self) -> str:
        return f"<stand-in stream {self.ptr:#x}>"


class Device:
    """The stand-in device: host memory, streams with clocks of queued work, rules broken."""

    def __init__(self, total: int = TOTAL, pool_chunk: int = DRIVER_POOL_CHUNK,
                 per_thread: bool = False):
        self.total = total
        self.pool_chunk = pool_chunk
        self.per_thread = per_thread
        self.memory = HostMemory(total - CONTEXT, PAGE)
        self.context = 0  # taken at the first runtime call, as a CUDA context is
        self.trackers: list[Callable[[], int]] = []
        self.violations: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles = itertools.count(0x1000, 0x10)
        self.legacy = Stream(self, LEGACY)
        self.streams: dict[int, Stream] = {}  # user streams by handle
        self._per_thread: dict[int, Stream] = {}  # thread id -> its default stream

    # ---------------------------------------------------------------- memory
    def touch(self) -> None:
        """Any call starts the context (and costs a little)."""
        if not self.context:
            self.context = CONTEXT
        time.sleep(CALL_US * 1e-6)

    def used(self) -> int:
        tracked = 0
        for tracker in list(self.trackers):
            try:
                tracked += _pages(int(tracker()))
            except Exception:  # noqa: BLE001 - a pool being torn down counts nothing
                pass
        return self.context + self.memory.in_use + tracked

    def track(self, count: Callable[[], int]) -> None:
        """Count what ``count()`` says a pool of this process holds on memory of its own (a
        ``scripts.bench_memory`` dry-run child's pool)."""
        self.trackers.append(count)

    # ---------------------------------------------------------------- streams
    def current_stream(self) -> Stream:
        """The calling thread's current stream (CuPy's ``get_current_stream()``)."""
        stream = getattr(self._local, "stream", None)
        if stream is not None:
            return stream
        return self.resolve(PER_THREAD) if self.per_thread else self.legacy

    def new_stream(self) -> Stream:
        with self._lock:
            stream = Stream(self, next(self._handles))
            self.streams[stream.ptr] = stream
        return stream

    def resolve(self, handle: int) -> Stream:
        """The stream a handle means to the calling thread."""
        if handle == PER_THREAD:
            me = threading.get_ident()
            with self._lock:
                if me not in self._per_thread:
                    self._per_thread[me] = Stream(self, PER_THREAD, me)
                return self._per_thread[me]
        if handle in (LEGACY, 1):
            return self.legacy
        try:
            return self.streams[handle]
        except KeyError:
            raise CUDARuntimeError(400, f"cudaErrorInvalidResourceHandle: no stream "
                                        f"{handle:#x}") from None

    def _all(self) -> list[Stream]:
        with self._lock:
            return [self.legacy, *self.streams.values(), *self._per_thread.values()]

    def queue(self, stream: Stream, seconds: float, ptr: int = 0, size: int = 0) -> None:
        """Queue ``seconds`` of work on ``stream``, reading ``[ptr, ptr + size)`` if any."""
        with self._lock:
            stream.busy_until = max(stream.busy_until, time.perf_counter()) + seconds
            if size:
                stream.work.append((ptr, size, stream.busy_until))

    def idle(self, stream: Stream | None = None) -> bool:
        now = time.perf_counter()
        return all(s.busy_until <= now for s in ([stream] if stream else self._all()))

    def drain(self, stream: Stream | None = None) -> None:
        """Wait for the queued work of ``stream`` (None: every stream): what a sync does."""
        streams = [stream] if stream else self._all()
        wait = max(s.busy_until for s in streams) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        with self._lock:
            for s in streams:
                s.work.clear()

    def readers(self, ptr: int, size: int, but: Stream | None = None) -> list[Stream]:
        """Streams (other than ``but``) whose queued, unfinished work reads the range."""
        now = time.perf_counter()
        with self._lock:
            return [s for s in [self.legacy, *self.streams.values(),
                                *self._per_thread.values()]
                    if s is not but and any(p < ptr + size and ptr < p + n and until > now
                                            for p, n, until in s.work)]

    def released(self, what: str, ptr: int, size: int) -> None:
        """Memory goes back: a kernel still reading it faults (recorded, raised at the next
        sync)."""
        users = self.readers(ptr, size)
        if users:
            self.violations.append(f"{what} of [{ptr:#x}, +{size:,}) while a kernel on "
                                   f"{users[0]} still reads it: illegal address")

    def check(self) -> None:
        """A fault is sticky: every later sync reports it."""
        if self.violations:
            raise CUDARuntimeError(ILLEGAL_ADDRESS, "cudaErrorIllegalAddress: an illegal "
                                                    "memory access was encountered")


class CUDARuntimeError(RuntimeError):
    """As ``cupy_backends.cuda.api.runtime.CUDARuntimeError``: carries ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (stand-in)")
        self.status = status


class Runtime:
    """``cupy.cuda.runtime``: the calls the quick check, its probes and pgmo's device layer
    make."""

    cudaMemPoolAttrReleaseThreshold = 4
    cudaMemPoolAttrReservedMemCurrent = 5
    cudaMemPoolAttrReservedMemHigh = 6
    cudaMemPoolAttrUsedMemCurrent = 7
    cudaMemAllocationTypePinned = 1
    cudaMemHandleTypeNone = 0
    cudaMemLocationTypeDevice = 1
    cudaDevAttrMemoryPoolsSupported = 115
    errorMemoryAllocation = 2
    streamNonBlocking = 1
    streamPerThread = PER_THREAD

    def __init__(self, device: Device):
        self.device = device
        self._current = 0
        self._buffers: dict[int, Any] = {}  # cudaMalloc'd: address -> host buffer
        self._pools: dict[int, dict] = {}
        self._pool_ids = itertools.count(1)

    # -- device and memory info
    def getDevice(self) -> int:
        return self._current

    def setDevice(self, device: int) -> None:
        self._current = device

    def memGetInfo(self) -> tuple[int, int]:
        self.device.touch()
        return self.device.total - self.device.used(), self.device.total

    def runtimeGetVersion(self) -> int:
        return 13020

    def driverGetVersion(self) -> int:
        return 13000

    def getDeviceProperties(self, device: int) -> dict:
        return {"name": NAME.encode(), "totalGlobalMem": self.device.total,
                "major": 9, "minor": 0}

    def deviceGetAttribute(self, attrib: int, device: int) -> int:
        return 1

    # -- cudaMalloc / cudaFree
    def malloc(self, size: int) -> int:
        self.device.touch()
        try:
            buffer = self.device.memory(size)
        except MemoryError:
            raise CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory") from None
        self._buffers[buffer.ptr] = buffer
        return buffer.ptr

    def free(self, ptr: int) -> None:
        self.device.touch()
        self.device.drain()  # the documented implicit device synchronization
        self.device.check()
        self._buffers.pop(ptr, None)

    # -- synchronization and streams
    def deviceSynchronize(self) -> None:
        self.device.drain()
        self.device.check()

    def streamSynchronize(self, stream: int) -> None:
        self.device.drain(self.device.resolve(stream))
        self.device.check()

    def streamQuery(self, stream: int) -> int:
        return 0 if self.device.idle(self.device.resolve(stream)) else NOT_READY

    def streamCreateWithFlags(self, flags: int) -> int:
        self.device.touch()
        return self.device.new_stream().ptr

    def streamDestroy(self, stream: int) -> None:
        self.device.drain(self.device.resolve(stream))
        self.device.streams.pop(stream, None)

    # -- a private stream-ordered pool
    def MemPoolProps(self, allocType: int, handleType: int, locationType: int,  # noqa: N802
                     devId: int):
        return SimpleNamespace(allocType=allocType, handleType=handleType,
                               locationType=locationType, devId=devId)

    def memPoolCreate(self, props) -> int:
        self.device.touch()
        pool = next(self._pool_ids)
        self._pools[pool] = {"pool": HostAsyncPool(self.device.memory,
                                                   chunk=self.device.pool_chunk),
                             "threshold": 0, "blocks": {}, "high": 0}
        return pool

    def memPoolDestroy(self, pool: int) -> None:
        """As documented: with blocks outstanding, the pool goes once the last is freed."""
        state = self._pools[pool]
        state["destroyed"] = True
        self._gone(pool)

    def _gone(self, pool: int) -> None:
        state = self._pools[pool]
        if state.get("destroyed") and not state["blocks"]:
            del self._pools[pool]
            state["pool"].close()

    def memPoolSetAttribute(self, pool: int, attr: int, value) -> None:
        if attr == self.cudaMemPoolAttrReleaseThreshold:
            self._pools[pool]["threshold"] = int(value)

    def memPoolGetAttribute(self, pool: int, attr: int):
        state = self._pools[pool]
        return {self.cudaMemPoolAttrReleaseThreshold: state["threshold"],
                self.cudaMemPoolAttrReservedMemCurrent: state["pool"].held,
                self.cudaMemPoolAttrReservedMemHigh: state["high"],
                self.cudaMemPoolAttrUsedMemCurrent: state["pool"].used}[attr]

    def mallocFromPoolAsync(self, size: int, pool: int, stream: int) -> int:
        self.device.touch()
        own = self.device.resolve(stream)
        state = self._pools[pool]
        try:
            block = state["pool"].malloc(size)
        except MemoryError:
            raise CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory") from None
        state["blocks"][block.ptr] = (block, own)
        state["high"] = max(state["high"], state["pool"].held)
        return block.ptr

    def freeAsync(self, ptr: int, stream: int) -> None:
        """The memory is reusable once ``stream``'s work so far is done: freed on another
        stream than the block's own while its own still has work queued, it may be reused
        under that work (what pgmo must never do; a kernel of a third stream still reading
        it is the user's to order, as with CuPy's own pool)."""
        self.device.touch()
        target = self.device.resolve(stream)
        for pool, state in list(self._pools.items()):
            block, own = state["blocks"].pop(ptr, (None, None))
            if block is not None:
                if target is not own and not self.device.idle(own):
                    self.device.violations.append(
                        f"cudaFreeAsync of {ptr:#x} ordered on {target} while its own stream "
                        f"{own} still has work queued (freed on the wrong stream or thread)")
                del block
                self._gone(pool)
                return
        raise CUDARuntimeError(1, f"cudaErrorInvalidValue: {ptr:#x} is no block of a pool")

    def memPoolTrimTo(self, pool: int, size: int) -> None:
        """Gives back every wholly free chunk (``size`` is taken as 0)."""
        self.device.touch()
        host_pool = self._pools[pool]["pool"]
        self.device.released("cudaMemPoolTrimTo", host_pool.range.ptr, host_pool.range.size)
        host_pool.trim()


# ------------------------------------------------------------------ the driver
class _Enum(SimpleNamespace):
    pass


class _Struct:
    """A driver structure: attributes set by the caller."""

    def __init__(self):
        self.location = SimpleNamespace(type=0, id=0)


class _Handle:
    """What ``cuMemCreate`` returns: the memory is taken when it is mapped.  A granule's
    handle is a page of the host range it is first mapped in, which the driver maps at
    as many addresses as asked (pgmo's page heap maps a page again before its old
    mapping is dropped), its bytes shared."""

    def __init__(self, size: int):
        self.size = size
        self.mapped = self.released = False
        self.page = self.range = None


class Driver:
    """``cuda.bindings.driver``: the virtual-memory calls, each returning ``(CUresult, ...)``.

    A reservation is a :class:`~pgmo.device.host_range.HostRange` of the device's
    host memory; ``fail={"cuMemSetAccess": 801}`` makes a call answer that
    code (what a driver under a container or vGPU may say)."""

    CUresult = _Enum(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1, CUDA_ERROR_OUT_OF_MEMORY=2,
                     CUDA_ERROR_ILLEGAL_ADDRESS=700, CUDA_ERROR_NOT_PERMITTED=800,
                     CUDA_ERROR_NOT_SUPPORTED=801)
    CUmemAllocationType = _Enum(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = _Enum(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAccess_flags = _Enum(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
    CUmemAllocationGranularity_flags = _Enum(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0,
                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)
    CUdevice_attribute = _Enum(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=102)

    def __init__(self, device: Device, fail: dict[str, int] | None = None):
        self.device = device
        self.fail = dict(fail or {})
        self._ranges: dict[int, Any] = {}  # base address -> HostRange

    class CUmemAllocationProp(_Struct):
        def __init__(self):
            super().__init__()
            self.type = 0
            self.requestedHandleTypes = 0

    class CUmemAccessDesc(_Struct):
        def __init__(self):
            super().__init__()
            self.flags = 0

    def _ok(self, *values):
        return (self.CUresult.CUDA_SUCCESS, *values)

    def _refused(self, name: str, value: bool = True):
        """The injected answer of call ``name``, or None (it goes ahead)."""
        code = self.fail.get(name)
        if code is None:
            return None
        return (code, None) if value else (code,)

    def _range(self, ptr):
        for base, rng in self._ranges.items():
            if base <= ptr < base + rng.size:
                return rng
        return None

    def cuInit(self, Flags: int):  # noqa: N802, N803
        return self._ok()

    def cuDriverGetVersion(self):  # noqa: N802
        return self._ok(13000)

    def cuDeviceGet(self, ordinal: int):  # noqa: N802
        return self._ok(ordinal)

    def cuDeviceGetAttribute(self, attrib, dev):  # noqa: N802
        return self._ok(1)

    def cuGetErrorString(self, error):  # noqa: N802
        return self._ok(f"stand-in error {error}".encode())

    def cuMemGetAllocationGranularity(self, prop, option):  # noqa: N802
        return self._ok(PAGE)

    def cuMemAddressReserve(self, size: int, alignment: int, addr, flags: int):  # noqa: N802
        self.device.touch()
        refused = self._refused("cuMemAddressReserve")
        if refused:
            return refused
        rng = self.device.memory.reserve(size)
        self._ranges[rng.ptr] = rng
        return self._ok(rng.ptr)

    def cuMemAddressFree(self, ptr, size: int):  # noqa: N802
        rng = self._ranges.get(int(ptr))
        if rng is None or rng.mappings():
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.device.released("cuMemAddressFree", rng.ptr, rng.size)
        del self._ranges[int(ptr)]
        rng.close()
        return self._ok()

    def cuMemCreate(self, size: int, prop, flags: int):  # noqa: N802
        self.device.touch()
        refused = self._refused("cuMemCreate")
        if refused:
            return refused
        memory = self.device.memory
        if size % PAGE:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, None)
        if memory.capacity is not None and memory.in_use + size > memory.capacity:
            return (self.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        return self._ok(_Handle(size))

    def cuMemRelease(self, handle):  # noqa: N802
        self.device.touch()
        if handle.released:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        handle.released = True
        if handle.page is not None:  # its memory goes back once it is mapped nowhere
            handle.range.release_page(handle.page)
        return self._ok()

    def cuMemMap(self, ptr, size: int, offset: int, handle, flags: int):  # noqa: N802
        self.device.touch()
        refused = self._refused("cuMemMap", value=False)
        if refused:
            return refused
        rng = self._range(int(ptr))
        page = rng is not None and size == PAGE == handle.size and not handle.released \
            and handle.range in (None, rng)  # a granule's handle: mapped at any address
        if not page and (rng is None or handle.mapped or handle.released
                         or handle.size != size):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        try:
            if not page:
                rng.map_one(int(ptr) - rng.ptr, size)
            else:
                if handle.page is None:
                    handle.page, handle.range = rng.create_page(), rng
                rng.map_page(int(ptr) - rng.ptr, handle.page, grant=False)
        except ValueError:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        except MemoryError:
            return (self.CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
        handle.mapped = True
        return self._ok()

    def cuMemSetAccess(self, ptr, size: int, desc, count: int):  # noqa: N802
        self.device.touch()
        refused = self._refused("cuMemSetAccess", value=False)
        if refused:
            return refused
        rng = self._range(int(ptr))
        try:
            rng.grant(int(ptr) - rng.ptr, size)
        except (AttributeError, ValueError):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return self._ok()

    def cuMemUnmap(self, ptr, size: int):  # noqa: N802
        """Does not wait for queued work (the driver's documentation; the quick check
        measures it): a kernel still reading the memory faults."""
        self.device.touch()
        refused = self._refused("cuMemUnmap", value=False)
        if refused:
            return refused
        rng = self._range(int(ptr))
        if rng is None:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.device.released("cuMemUnmap", int(ptr), size)
        try:
            rng.unmap_one(int(ptr) - rng.ptr, size)
        except (ValueError, KeyError):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        except OSError:  # the host range went first, with the stand-in's other objects
            pass
        return self._ok()


# ------------------------------------------------------------------ NVML
class Nvml:
    """``pynvml``: this process's memory is the device's (one process on the stand-in)."""

    def __init__(self, device: Device):
        self.device = device

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "stand-in"

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        return ("stand-in device", index)

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        used = self.device.used()
        return SimpleNamespace(used=used, free=self.device.total - used, total=self.device.total)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        if not self.device.context:
            return []
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.device.used())]


# ------------------------------------------------------------------ pools on the stand-in
def _pgmo_pool(gpu: SimpleNamespace, **options: Any):
    """A :class:`pgmo.ProfileGuidedMemoryPool` on the stand-in device: its device layer is
    :func:`pgmo.device.cuda.device_layer` over the stand-in driver and runtime (pgmo's real
    CUDA code), its raw memory and stock pool the device's host memory."""
    from cupy.cuda.memory import OutOfMemoryError

    from pgmo.device.cuda import device_layer
    from pgmo.device.host_stock_pool import HostStockPool
    from pgmo.pool import ProfileGuidedMemoryPool

    device: Device = gpu.device
    fields, _ = device_layer(0, device.total, driver=gpu.driver, runtime=gpu.runtime,
                             stream=device.current_stream)
    pool = ProfileGuidedMemoryPool(
        device.memory, fallback=HostStockPool(device.memory, OutOfMemoryError),
        device_id=0, context=lambda: (0, device.current_stream().ptr),
        total_memory=device.total, device_layer=fields,
        **{"plan_cache": False, **options})  # a cold pool, as on the GPU (gpu_modules)
    pool.host_memory = True
    pool.host_device = device.memory
    return pool


def _stock_pool(gpu: SimpleNamespace):
    """CuPy's stock pool on the stand-in device (its model, :class:`HostStockPool`)."""
    from cupy.cuda.memory import OutOfMemoryError

    from pgmo.device.host_stock_pool import HostStockPool

    return HostStockPool(gpu.device.memory, OutOfMemoryError)


def modules(device: Device | None = None, *, pool_chunk: int = DRIVER_POOL_CHUNK,
            per_thread: bool | None = None, fail: dict[str, int] | None = None
            ) -> SimpleNamespace:
    """One stand-in device with the names of :func:`scripts.gpu_modules.real_modules`:
    ``runtime``, ``driver``, ``nvml``, ``spin(ms, stream)``, ``touch(ptr, size, ms,
    stream)``, ``new_stream()``, ``current_stream()``, ``pgmo_pool(**options)``,
    ``stock_pool()``, ``last_error()``, ``versions()``.

    ``per_thread`` defaults to ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` in the
    environment, as in CuPy; ``fail``: driver calls that answer an error code."""
    if per_thread is None:
        per_thread = os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM") == "1"
    device = device or Device(pool_chunk=pool_chunk, per_thread=per_thread)
    gpu = SimpleNamespace(device=device, runtime=Runtime(device),
                          driver=Driver(device, fail), driver_why="", nvml=Nvml(device),
                          nvml_why="", stream=LEGACY, device_id=0, name=NAME,
                          stand_in=True, host=True, memory=device.memory)

    def stream_of(stream: Stream | None) -> Stream:
        return device.current_stream() if stream is None else stream

    gpu.spin = lambda ms, stream=None: device.queue(stream_of(stream), ms / 1e3)
    gpu.touch = lambda ptr, size, ms, stream=None: device.queue(stream_of(stream), ms / 1e3,
                                                                ptr, size)
    gpu.new_stream = device.new_stream
    gpu.current_stream = device.current_stream
    gpu.pgmo_pool = lambda **options: _pgmo_pool(gpu, **options)
    gpu.stock_pool = lambda: _stock_pool(gpu)
    gpu.last_error = lambda: ILLEGAL_ADDRESS if device.violations else 0
    gpu.versions = lambda: {"device": NAME, "device memory": f"{device.total / GiB:.0f} GiB",
                            "CUDA driver": 13000, "CUDA runtime": 13020,
                            "cuDriverGetVersion": gpu.driver.cuDriverGetVersion()[1],
                            "cuda-bindings": "stand-in", "NVML driver": "stand-in"}
    return gpu
