"""Stand-ins for the GPU modules the quick check calls: its dry run runs every line on a CPU.

``python -m scripts.gpu_quick_check --dry-run`` (and ``scripts.bench_memory``'s
children it starts, with ``"stand_ins": true``) take their modules from
:func:`modules` instead of ``cupy.cuda.runtime``, ``pynvml`` and
``cuda.bindings.driver``.  Each stand-in has the real names, argument order
and return shapes (the driver's functions return tuples ``(CUresult,
value...)``; CuPy's runtime returns values and raises on errors; NVML returns
objects with ``used``, ``pid``, ``usedGpuMemory``), and models only what the
check looks at, as a stand-in, never as a measurement:

* one device of 80 GiB with a 512 MiB context, whose bytes in use are the
  context, what was allocated through these calls, and what the pools of a
  dry-run child hold on the host (:meth:`Device.track`), in 2 MiB pages;
* queued kernels as a clock (``spin(ms)`` queues ``ms`` of work); the calls
  taken to synchronize (``cudaFree``, ``cuMemUnmap``, the synchronize calls)
  sleep until the queue is empty, and every call costs ``CALL_US``.

Which real calls synchronize is what the quick check measures on a GPU; the
model here only lets the dry run show that the check can tell.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from types import SimpleNamespace
from typing import Callable

GiB, MiB = 2**30, 2**20
TOTAL = 80 * GiB
CONTEXT = 512 * MiB
PAGE = 2 * MiB
CALL_US = 20  # every stand-in call costs this many microseconds


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


class Device:
    """The stand-in device: bytes in use and a clock of queued work."""

    def __init__(self, total: int = TOTAL):
        self.total = total
        self.context = 0  # taken at the first runtime call, as a CUDA context is
        self.allocated: dict[int, int] = {}  # address or handle -> bytes
        self.trackers: list[Callable[[], int]] = []
        self.busy_until = 0.0
        self._addresses = itertools.count(0x7F00_0000_0000, 0x1_0000_0000)
        self._lock = threading.Lock()

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
        with self._lock:
            return self.context + sum(self.allocated.values()) + tracked

    def track(self, count: Callable[[], int]) -> None:
        """Count what ``count()`` says a pool of this process holds (a dry-run child's pool)."""
        self.trackers.append(count)

    def take(self, size: int) -> int | None:
        """An address for ``size`` bytes, or None when the device is full."""
        if self.used() + _pages(size) > self.total:
            return None
        address = next(self._addresses)
        with self._lock:
            self.allocated[address] = _pages(size)
        return address

    def give(self, address: int) -> None:
        with self._lock:
            self.allocated.pop(address, None)

    def queue(self, seconds: float) -> None:
        now = time.perf_counter()
        self.busy_until = max(self.busy_until, now) + seconds

    def idle(self) -> bool:
        return time.perf_counter() >= self.busy_until

    def drain(self) -> None:
        """Wait for the queued work: what a synchronizing call does."""
        wait = self.busy_until - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


class CUDARuntimeError(RuntimeError):
    """As ``cupy_backends.cuda.api.runtime.CUDARuntimeError``: carries ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (stand-in)")
        self.status = status


class Runtime:
    """``cupy.cuda.runtime``: the calls the quick check and the memory sampler make."""

    cudaMemPoolAttrReleaseThreshold = 4
    cudaMemPoolAttrReservedMemCurrent = 5
    cudaMemAllocationTypePinned = 1
    cudaMemHandleTypeNone = 0
    cudaMemLocationTypeDevice = 1
    cudaDevAttrMemoryPoolsSupported = 115
    errorMemoryAllocation = 2

    def __init__(self, device: Device):
        self.device = device
        self._current = 0
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
        return 13020

    def getDeviceProperties(self, device: int) -> dict:
        return {"name": b"stand-in GPU (dry run)", "totalGlobalMem": self.device.total}

    def deviceGetAttribute(self, attrib: int, device: int) -> int:
        return 1

    # -- cudaMalloc / cudaFree
    def malloc(self, size: int) -> int:
        self.device.touch()
        address = self.device.take(size)
        if address is None:
            raise CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory")
        return address

    def free(self, ptr: int) -> None:
        self.device.touch()
        self.device.drain()  # modelled as the documented implicit device synchronization
        self.device.give(ptr)

    def deviceSynchronize(self) -> None:
        self.device.drain()

    def streamSynchronize(self, stream: int) -> None:
        self.device.drain()

    def streamQuery(self, stream: int) -> int:
        return 0 if self.device.idle() else 600  # cudaErrorNotReady

    # -- a private stream-ordered pool
    def MemPoolProps(self, allocType: int, handleType: int, locationType: int,  # noqa: N802
                     devId: int):
        return SimpleNamespace(allocType=allocType, handleType=handleType,
                               locationType=locationType, devId=devId)

    def memPoolCreate(self, props) -> int:
        self.device.touch()
        pool = next(self._pool_ids)
        self._pools[pool] = {"threshold": 0, "free": [], "blocks": {}}
        return pool

    def memPoolDestroy(self, pool: int) -> None:
        for address in self._pools.pop(pool)["blocks"]:
            self.device.give(address)

    def memPoolSetAttribute(self, pool: int, attr: int, value) -> None:
        if attr == self.cudaMemPoolAttrReleaseThreshold:
            self._pools[pool]["threshold"] = int(value)

    def memPoolGetAttribute(self, pool: int, attr: int):
        state = self._pools[pool]
        if attr == self.cudaMemPoolAttrReleaseThreshold:
            return state["threshold"]
        return sum(state["blocks"].values())

    def mallocFromPoolAsync(self, size: int, pool: int, stream: int) -> int:
        self.device.touch()
        state = self._pools[pool]
        for k, (address, held) in enumerate(state["free"]):
            if held >= size:
                del state["free"][k]
                return address
        address = self.device.take(size)
        if address is None:
            raise CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory")
        state["blocks"][address] = _pages(size)
        return address

    def freeAsync(self, ptr: int, stream: int) -> None:
        self.device.touch()
        for state in self._pools.values():
            if ptr in state["blocks"]:
                state["free"].append((ptr, state["blocks"][ptr]))
                return

    def memPoolTrimTo(self, pool: int, size: int) -> None:
        self.device.touch()
        state = self._pools[pool]
        while state["free"] and sum(state["blocks"].values()) > size:
            address, _ = state["free"].pop()
            del state["blocks"][address]
            self.device.give(address)


# ------------------------------------------------------------------ the driver
class _Enum(SimpleNamespace):
    pass


class _Struct:
    """A driver structure: attributes set by the caller."""

    def __init__(self):
        self.location = SimpleNamespace(type=0, id=0)


class Driver:
    """``cuda.bindings.driver``: the virtual-memory calls, each returning ``(CUresult, ...)``."""

    CUresult = _Enum(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1, CUDA_ERROR_OUT_OF_MEMORY=2,
                     CUDA_ERROR_NOT_SUPPORTED=801)
    CUmemAllocationType = _Enum(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = _Enum(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAccess_flags = _Enum(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
    CUmemAllocationGranularity_flags = _Enum(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0,
                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)
    CUdevice_attribute = _Enum(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=102)

    def __init__(self, device: Device):
        self.device = device
        self._reserved: dict[int, int] = {}
        self._mapped: dict[int, int] = {}  # address -> handle

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

    def cuInit(self, Flags: int):  # noqa: N802, N803
        return self._ok()

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
        address = next(self.device._addresses)
        self._reserved[address] = size
        return self._ok(address)

    def cuMemAddressFree(self, ptr, size: int):  # noqa: N802
        self._reserved.pop(int(ptr), None)
        return self._ok()

    def cuMemCreate(self, size: int, prop, flags: int):  # noqa: N802
        self.device.touch()
        if size % PAGE:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, 0)
        handle = self.device.take(size)
        if handle is None:
            return (self.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0)
        return self._ok(handle)

    def cuMemRelease(self, handle):  # noqa: N802
        self.device.touch()
        self.device.give(int(handle))
        return self._ok()

    def cuMemMap(self, ptr, size: int, offset: int, handle, flags: int):  # noqa: N802
        self.device.touch()
        self._mapped[int(ptr)] = int(handle)
        return self._ok()

    def cuMemSetAccess(self, ptr, size: int, desc, count: int):  # noqa: N802
        self.device.touch()
        return self._ok()

    def cuMemUnmap(self, ptr, size: int):  # noqa: N802
        self.device.touch()
        self.device.drain()  # modelled as synchronizing, as unmapping is expected to
        self._mapped.pop(int(ptr), None)
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


def modules(device: Device | None = None) -> SimpleNamespace:
    """One stand-in device with its ``runtime``, ``driver``, ``nvml`` and ``spin(ms)``."""
    device = device or Device()
    return SimpleNamespace(device=device, runtime=Runtime(device), driver=Driver(device),
                           driver_why="", nvml=Nvml(device),
                           spin=lambda ms: device.queue(ms / 1e3), stream=0, device_id=0,
                           name="stand-in GPU (dry run)", stand_in=True)
