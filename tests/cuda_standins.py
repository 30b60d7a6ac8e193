"""Stand-ins for the CUDA calls pgmo's device layer makes, as strict as the driver, on host memory.

``FakeDriver`` answers the ``cuda.bindings.driver`` calls of
:class:`pgmo.device.cuda.CudaRange` (results as ``(CUresult, value...)``
tuples, as cuda-bindings returns them) and ``FakeRuntime`` the
``cupy.cuda.runtime`` calls of :class:`pgmo.device.cuda.CudaAsyncPool` and
the device layer (errors raised as CuPy's ``CUDARuntimeError`` is, with a
``status``).  Both keep their memory in one
:class:`pgmo.device.host_memory.HostMemory`, so a pool built on them hands out real
addresses that the replay checker writes and verifies: the CUDA classes run
their real code, only the GPU underneath is the host's.

They enforce what the real driver enforces, or what it would punish later
with an illegal-address fault (each breach is a line in ``gpu.violations``,
which every test expects empty), and what it refuses (an error code):

* **Queued work.**  ``gpu.launch(ptr, size)`` queues "a kernel" that uses
  memory on the calling thread's current stream; a stream sync clears that
  stream's queue, a device sync every queue.  Unmapping memory
  (``cuMemUnmap``), trimming a pool (``cudaMemPoolTrimTo``) or freeing the
  reservation while queued work may use it is a violation, as is a
  ``cudaFreeAsync`` ordered on another stream than the one whose work uses
  the block.
* **Streams and threads.**  Handle 2 (``cudaStreamPerThread``) means the
  *calling* thread's stream; a stream belongs to a device; a pool serves one
  device.  A block allocated from a pool of another device than its stream's
  or the current one is a violation.
* **Mappings.**  ``cuMemUnmap`` unmaps whole mappings: one, or a run of
  adjacent ones where the device joins unmaps (``HostMemory(joins_unmaps=...)``,
  true by default, as NVIDIA's samples use the driver; false refuses a run
  with INVALID_VALUE, and anything else is a breach);
  ``cuMemSetAccess`` needs memory mapped throughout; memory is usable (the
  checker may touch it) only once access was granted; a handle is mapped at
  most once and must be released; ``cuMemAddressFree`` refuses a range with
  mappings left.
* **Failures.**  ``fail={"cuMemSetAccess": 801}`` makes a call fail from
  now on; ``fail={"cuMemUnmap": (801, 2)}`` from its third use on; a failed
  call changes nothing.  ``gpu.calls`` counts every call by name.
"""

from __future__ import annotations

import collections
import enum
import threading
import types
from typing import Any

from pgmo.device.host_async_pool import HostAsyncPool
from pgmo.device.host_memory import DRIVER_PAGE, HostMemory

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY = 0, 1, 2
NOT_PERMITTED, NOT_SUPPORTED, ILLEGAL_ADDRESS = 800, 801, 700
PER_THREAD = 2  # cudaStreamPerThread
LEGACY = 0  # the legacy default stream


class FakeStream:
    """A stream: its handle (``ptr``, as CuPy's Stream has), its device, its queued work."""

    def __init__(self, ptr: int, device: int, owner_thread: int | None = None):
        self.ptr = ptr
        self.device = device
        self.owner_thread = owner_thread  # a per-thread default stream's thread
        self.work: list[tuple[int, int]] = []  # (ptr, size) used by queued kernels
        self.destroyed = False

    def __repr__(self):
        return f"<stream {self.ptr:#x} of device {self.device}>"


class FakeGPU:
    """What the stand-ins share: devices, the current device and stream per thread, streams with
    queued work, the calls made and the rules broken."""

    def __init__(self, memory: HostMemory | None = None, devices: int = 1):
        self.memory = memory if memory is not None else HostMemory()
        self.devices = devices
        self.calls: collections.Counter = collections.Counter()
        self.log: list[tuple] = []
        self.violations: list[str] = []
        self._local = threading.local()
        self._lock = threading.RLock()
        self._streams: dict[int, FakeStream] = {}  # user streams by handle
        self._next_handle = 0x1000
        self._legacy = {d: FakeStream(LEGACY, d) for d in range(devices)}
        self._per_thread: dict[tuple[int, int], FakeStream] = {}

    # ----------------------------------------------------------- the thread's
    @property
    def device(self) -> int:
        return getattr(self._local, "device", 0)

    def set_device(self, device: int) -> None:
        if not 0 <= device < self.devices:
            raise ValueError(f"no device {device}")
        self._local.device = device

    def current_stream(self) -> FakeStream:
        """The calling thread's current stream (what CuPy's ``get_current_stream()`` gives)."""
        stream = getattr(self._local, "stream", None)
        return stream if stream is not None else self._legacy[self.device]

    def use_stream(self, stream: FakeStream | None) -> None:
        self._local.stream = stream

    def per_thread_stream(self) -> FakeStream:
        """``cudaStreamPerThread`` as the calling thread sees it (CuPy's ``Stream.ptds``: its
        handle is 2 whichever thread holds it)."""
        return self.resolve(PER_THREAD)

    def create_stream(self, device: int | None = None) -> FakeStream:
        with self._lock:
            handle = self._next_handle
            self._next_handle += 0x10
            stream = FakeStream(handle, self.device if device is None else device)
            self._streams[handle] = stream
            return stream

    def resolve(self, handle: int) -> FakeStream:
        """The stream a handle means to the calling thread."""
        if handle == PER_THREAD:
            key = (threading.get_ident(), self.device)
            with self._lock:
                stream = self._per_thread.get(key)
                if stream is None:
                    stream = self._per_thread[key] = FakeStream(PER_THREAD, self.device,
                                                                threading.get_ident())
                return stream
        if handle == LEGACY:
            return self._legacy[self.device]
        stream = self._streams.get(handle)
        if stream is None or stream.destroyed:
            raise KeyError(f"stream {handle:#x} does not exist")
        return stream

    # -------------------------------------------------------------- work
    def launch(self, ptr: int, size: int, stream: FakeStream | None = None) -> None:
        """Queue a kernel that uses ``[ptr, ptr + size)`` on ``stream`` (the current one)."""
        stream = stream or self.current_stream()
        with self._lock:
            if not self.memory.holds(ptr, size):
                self.violations.append(f"a kernel on {stream} uses [{ptr:#x}, +{size:,}), "
                                       f"which is not mapped with access: illegal address")
            stream.work.append((ptr, size))

    def _all_streams(self) -> list[FakeStream]:
        return [*self._legacy.values(), *self._streams.values(), *self._per_thread.values()]

    def users(self, ptr: int, size: int) -> list[FakeStream]:
        """The streams whose queued work touches ``[ptr, ptr + size)``."""
        with self._lock:
            return [s for s in self._all_streams()
                    if any(p < ptr + size and ptr < p + n for p, n in s.work)]

    def sync_stream(self, stream: FakeStream) -> None:
        with self._lock:
            stream.work.clear()

    def sync_device(self) -> None:
        with self._lock:
            for stream in self._all_streams():
                if stream.device == self.device:
                    stream.work.clear()

    def breach(self, message: str) -> None:
        self.violations.append(message)

    # ------------------------------------------------------------ calls
    def call(self, name: str, fail: dict, *args: Any) -> int:
        """Count a call; its injected result code (SUCCESS unless it is made to fail)."""
        with self._lock:
            n = self.calls[name]
            self.calls[name] = n + 1
            self.log.append((name, *args))
        spec = fail.get(name)
        if spec is None:
            return SUCCESS
        code, start = spec if isinstance(spec, tuple) else (spec, 0)
        return code if n >= start else SUCCESS


class _Location:
    def __init__(self):
        self.type = None
        self.id = None


class _Prop:
    def __init__(self):
        self.type = None
        self.location = _Location()


class _Access:
    def __init__(self):
        self.location = _Location()
        self.flags = None


class _Handle:
    def __init__(self, size: int, device: int):
        self.size = size
        self.device = device
        self.released = False
        self.mapped = False
        self.page: Any = None  # a granule's: the host range's page, mapped at each address
        self.range: Any = None
        self.maps = 0


class _Result(enum.IntEnum):
    CUDA_SUCCESS = SUCCESS
    CUDA_ERROR_INVALID_VALUE = INVALID_VALUE
    CUDA_ERROR_OUT_OF_MEMORY = OUT_OF_MEMORY
    CUDA_ERROR_ILLEGAL_ADDRESS = ILLEGAL_ADDRESS
    CUDA_ERROR_NOT_PERMITTED = NOT_PERMITTED
    CUDA_ERROR_NOT_SUPPORTED = NOT_SUPPORTED


def _code(code: int) -> Any:
    try:
        return _Result(code)
    except ValueError:
        return code


class FakeDriver:
    """``cuda.bindings.driver``'s virtual memory calls over host memory (see the module)."""

    CUmemAllocationProp = _Prop
    CUmemAccessDesc = _Access
    CUdevice_attribute = enum.IntEnum("CUdevice_attribute", {
        "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": 102})
    CUmemAllocationType = enum.IntEnum("CUmemAllocationType",
                                       {"CU_MEM_ALLOCATION_TYPE_PINNED": 1})
    CUmemLocationType = enum.IntEnum("CUmemLocationType", {"CU_MEM_LOCATION_TYPE_DEVICE": 1})
    CUmemAccess_flags = enum.IntEnum("CUmemAccess_flags",
                                     {"CU_MEM_ACCESS_FLAGS_PROT_READWRITE": 3})
    CUmemAllocationGranularity_flags = enum.IntEnum(
        "CUmemAllocationGranularity_flags", {"CU_MEM_ALLOC_GRANULARITY_MINIMUM": 0})

    def __init__(self, memory: HostMemory | None = None, vmm: bool = True,
                 fail: dict[str, Any] | None = None, gpu: FakeGPU | None = None):
        """``fail``: call name -> result code from now on, or ``(code, n)``: from its n-th
        use on (0 = the first)."""
        self.gpu = gpu if gpu is not None else FakeGPU(memory)
        self.memory = self.gpu.memory
        self.vmm = vmm
        self.fail = dict(fail or {})
        self.ranges: dict[int, Any] = {}  # reservation base -> HostRange
        self.handles: list[_Handle] = []
        self.page_maps: dict[int, _Handle] = {}  # address -> the granule's handle mapped there

    @property
    def calls(self) -> list[tuple]:
        return self.gpu.log

    def _result(self, name: str, *args, value=None) -> tuple:
        code = self.gpu.call(name, self.fail, *args)
        if code != SUCCESS:
            return (_code(code),) if value is None else (_code(code), None)
        return (_code(SUCCESS),) if value is None else (_code(SUCCESS), value)

    def _refuse(self, code: int, value: bool = False) -> tuple:
        return (_code(code), None) if value else (_code(code),)

    def cuInit(self, flags):
        return self._result("cuInit", flags)

    def cuDeviceGet(self, ordinal):
        if not 0 <= ordinal < self.gpu.devices:
            return self._refuse(INVALID_VALUE, value=True)
        return self._result("cuDeviceGet", ordinal, value=ordinal)

    def cuDeviceGetAttribute(self, attribute, device):
        return self._result("cuDeviceGetAttribute", int(attribute), device,
                            value=int(self.vmm))

    def cuMemGetAllocationGranularity(self, prop, flag):
        return self._result("cuMemGetAllocationGranularity", value=self.memory.granule)

    def cuMemAddressReserve(self, size, alignment, addr, flags):
        result = self._result("cuMemAddressReserve", size, alignment, value=0)
        if result[0] != SUCCESS:
            return result
        rng = self.memory.reserve(size)
        self.ranges[rng.ptr] = rng
        return (_code(SUCCESS), rng.ptr)

    def _range(self, ptr):
        for base, rng in self.ranges.items():
            if base <= ptr < base + rng.size:
                return rng
        return None

    def cuMemAddressFree(self, ptr, size):
        rng = self.ranges.get(ptr)
        if rng is None or rng.size != size:
            return self._refuse(INVALID_VALUE)
        result = self._result("cuMemAddressFree", ptr, size)
        if result[0] != SUCCESS:
            return result
        if rng.mappings():
            self.gpu.breach(f"cuMemAddressFree of a range with {len(rng.mappings())} "
                            f"mappings left")
            return self._refuse(INVALID_VALUE)
        del self.ranges[ptr]
        rng.close()
        return result

    def cuMemCreate(self, size, prop, flags):
        device = prop.location.id
        if device is None or not 0 <= device < self.gpu.devices or size % self.memory.granule:
            return self._refuse(INVALID_VALUE, value=True)
        result = self._result("cuMemCreate", size, value=0)
        if result[0] != SUCCESS:
            return result
        memory = self.memory
        if memory.capacity is not None and memory.in_use + size > memory.capacity:
            return self._refuse(OUT_OF_MEMORY, value=True)
        handle = _Handle(size, device)
        self.handles.append(handle)
        return (_code(SUCCESS), handle)

    def cuMemMap(self, ptr, size, offset, handle, flags):
        rng = self._range(ptr)
        if rng is not None and size == self.memory.granule and not handle.released \
                and handle.size == size and not offset and handle.range in (None, rng):
            return self._map_page(rng, ptr, handle)
        if rng is None or handle.released or handle.mapped or handle.size != size or offset:
            self.gpu.breach(f"cuMemMap of {size:,} bytes at {ptr:#x}: no such reservation, or "
                            f"a handle released, mapped already or of another size")
            return self._refuse(INVALID_VALUE)
        result = self._result("cuMemMap", ptr, size)
        if result[0] != SUCCESS:
            return result
        try:
            rng.map_one(ptr - rng.ptr, size)
        except ValueError:
            return self._refuse(INVALID_VALUE)
        except MemoryError:
            return self._refuse(OUT_OF_MEMORY)
        handle.mapped = True
        return result

    def _map_page(self, rng, ptr, handle):
        """A granule's handle: the driver maps it at as many addresses as asked (the page
        heap remaps a page before its old mapping is dropped), its bytes shared."""
        result = self._result("cuMemMap", ptr, handle.size)
        if result[0] != SUCCESS:
            return result
        try:
            if handle.page is None:
                handle.page, handle.range = rng.create_page(), rng
            rng.map_page(ptr - rng.ptr, handle.page, grant=False)
        except ValueError:
            return self._refuse(INVALID_VALUE)
        except MemoryError:
            return self._refuse(OUT_OF_MEMORY)
        handle.mapped = True
        handle.maps += 1
        self.page_maps[ptr] = handle
        return result

    def cuMemSetAccess(self, ptr, size, descs, count):
        rng = self._range(ptr)
        if rng is None or count != len(descs) or count < 1:
            return self._refuse(INVALID_VALUE)
        for desc in descs:
            if desc.location.id is None or not 0 <= desc.location.id < self.gpu.devices:
                return self._refuse(INVALID_VALUE)
        result = self._result("cuMemSetAccess", ptr, size)
        if result[0] != SUCCESS:
            return result
        try:
            rng.grant(ptr - rng.ptr, size)
        except ValueError:
            self.gpu.breach(f"cuMemSetAccess over [{ptr:#x}, +{size:,}), not mapped "
                            f"throughout")
            return self._refuse(INVALID_VALUE)
        return result

    def cuMemRelease(self, handle):
        if handle.released:
            self.gpu.breach("a handle released twice")
            return self._refuse(INVALID_VALUE)
        result = self._result("cuMemRelease")
        if result[0] == SUCCESS:
            handle.released = True
            if handle.page is not None:  # its memory goes back once it is mapped nowhere
                handle.range.release_page(handle.page)
        return result

    def cuMemUnmap(self, ptr, size):
        rng = self._range(ptr)
        if rng is None:
            return self._refuse(INVALID_VALUE)
        result = self._result("cuMemUnmap", ptr, size)
        if result[0] != SUCCESS:
            return result
        users = self.gpu.users(ptr, size)
        if users:
            self.gpu.breach(f"cuMemUnmap of [{ptr:#x}, +{size:,}) while {users} may still "
                            f"use it (no sync before the unmap)")
        lo = ptr - rng.ptr
        starts = [s for s, n in rng.mappings() if lo <= s < lo + size]
        try:
            rng.unmap_one(lo, size)
        except (ValueError, KeyError):
            joined = len(starts) > 1 and not rng.joins_unmaps and \
                sum(n for s, n in rng.mappings() if lo <= s < lo + size) == size and \
                starts[0] == lo
            if not joined:  # a driver that unmaps one mapping per call refuses a run
                self.gpu.breach(f"cuMemUnmap of [{ptr:#x}, +{size:,}), not whole mappings")
            return self._refuse(INVALID_VALUE)
        for start in starts:
            handle = self.page_maps.pop(rng.ptr + start, None)
            if handle is not None:
                handle.maps -= 1
        return result


class FakeCudaError(RuntimeError):
    """What CuPy's runtime raises (``CUDARuntimeError``): the call's status."""

    def __init__(self, status: int, what: str = ""):
        self.status = status
        super().__init__(f"{what}: cudaError {status}")


class FakeRuntime:
    """``cupy.cuda.runtime``'s calls of the device layer over host memory (see the module)."""

    cudaMemAllocationTypePinned = 1
    cudaMemHandleTypeNone = 0
    cudaMemLocationTypeDevice = 1
    cudaMemPoolAttrReleaseThreshold = 4
    cudaMemPoolAttrReservedMemCurrent = 5
    cudaDevAttrMemoryPoolsSupported = 115

    def __init__(self, memory: HostMemory | None = None, pools: bool = True,
                 fail: dict[str, Any] | None = None, gpu: FakeGPU | None = None,
                 chunk: int | None = None):
        """``chunk``: the step the stream-ordered pool grows and trims in (its host model's
        :class:`~pgmo.device.host_async_pool.HostAsyncPool`); ``fail`` as :class:`FakeDriver`'s."""
        self.gpu = gpu if gpu is not None else FakeGPU(memory)
        self.memory = self.gpu.memory
        self.pools = pools
        self.chunk = chunk
        self.fail = dict(fail or {})
        self._pools: dict[int, tuple[HostAsyncPool, int]] = {}  # handle -> (pool, device)
        self._blocks: dict[int, tuple[Any, int]] = {}  # ptr -> (block, pool handle)
        self.attributes: dict[tuple[int, int], int] = {}

    @property
    def calls(self) -> list[tuple]:
        return self.gpu.log

    def _call(self, name: str, *args: Any) -> None:
        code = self.gpu.call(name, self.fail, *args)
        if code != SUCCESS:
            raise FakeCudaError(code, name)

    @staticmethod
    def MemPoolProps(alloc_type, handle_type, location_type, device):
        return types.SimpleNamespace(alloc_type=alloc_type, device=device)

    def getDevice(self):
        return self.gpu.device

    def deviceSynchronize(self):
        self._call("deviceSynchronize")
        self.memory.synchronize()
        self.gpu.sync_device()

    def streamSynchronize(self, stream):
        self._call("streamSynchronize", stream)
        self.memory.synchronize()
        self.gpu.sync_stream(self.gpu.resolve(stream))

    def deviceGetAttribute(self, attribute, device):
        assert attribute == self.cudaDevAttrMemoryPoolsSupported
        self._call("deviceGetAttribute", attribute, device)
        return int(self.pools)

    def memPoolCreate(self, props):
        if not 0 <= props.device < self.gpu.devices:
            raise FakeCudaError(INVALID_VALUE, "memPoolCreate")
        self._call("memPoolCreate", props.device)
        pool = HostAsyncPool(self.memory, chunk=self.chunk)
        self._pools[id(pool)] = (pool, props.device)
        return id(pool)

    def memPoolDestroy(self, handle):
        self._call("memPoolDestroy")
        pool, _ = self._pools.pop(handle)
        if any(h == handle for _, h in self._blocks.values()):
            return  # legal: its memory goes once its blocks are freed (here: never again)
        pool.close()

    def memPoolSetAttribute(self, handle, attribute, value):
        self._call("memPoolSetAttribute", attribute, value)
        self.attributes[handle, attribute] = value

    def memPoolGetAttribute(self, handle, attribute):
        assert attribute == self.cudaMemPoolAttrReservedMemCurrent
        self._call("memPoolGetAttribute", attribute)
        return self._pools[handle][0].held

    def mallocFromPoolAsync(self, size, handle, stream):
        pool, device = self._pools[handle]
        target = self.gpu.resolve(stream)
        if target.device != device or self.gpu.device != device:
            self.gpu.breach(f"a block of device {device}'s pool allocated on {target} while "
                            f"device {self.gpu.device} is current")
            raise FakeCudaError(INVALID_VALUE, "mallocFromPoolAsync")
        self._call("mallocFromPoolAsync", size, stream)
        try:
            block = pool.malloc(size)
        except MemoryError:
            raise FakeCudaError(OUT_OF_MEMORY, "mallocFromPoolAsync") from None
        self._blocks[block.ptr] = (block, handle)
        return block.ptr

    def freeAsync(self, ptr, stream):
        target = self.gpu.resolve(stream)
        self._call("freeAsync", stream)
        block, _ = self._blocks[ptr]
        others = [s for s in self.gpu.users(ptr, block.size) if s is not target]
        if others:
            self.gpu.breach(f"cudaFreeAsync of {ptr:#x} ordered on {target} while {others} may "
                            f"still use it (freed on the wrong stream or thread)")
        del self._blocks[ptr]  # no device sync: the pool keeps the memory

    def memPoolTrimTo(self, handle, keep):
        pool, _ = self._pools[handle]
        self._call("memPoolTrimTo", keep)
        users = self.gpu.users(pool.range.ptr, pool.range.size)
        if users:
            self.gpu.breach(f"cudaMemPoolTrimTo while {users} may still use the pool's memory "
                            f"(no device sync before the trim)")
        pool.trim()


__all__ = ["FakeGPU", "FakeStream", "FakeDriver", "FakeRuntime", "FakeCudaError", "DRIVER_PAGE",
           "SUCCESS", "INVALID_VALUE", "OUT_OF_MEMORY", "NOT_PERMITTED", "NOT_SUPPORTED",
           "PER_THREAD"]
