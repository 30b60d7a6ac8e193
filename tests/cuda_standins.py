"""Stand-ins for the CUDA calls pgmo's device layer makes, backed by host memory.

``FakeDriver`` answers the ``cuda.bindings.driver`` calls of
:class:`pgmo.cuda_device.CudaRange` (results as ``(CUresult, value...)``
tuples, as cuda-bindings returns them) and ``FakeRuntime`` the
``cupy.cuda.runtime`` stream-ordered pool calls of
:class:`pgmo.cuda_device.CudaAsyncPool`.  Both keep their memory in a
:class:`pgmo.host_device.HostMemory`, so a pool built on them hands out real
addresses that the replay checker can write and verify: the CUDA classes run
their real code, only the driver underneath is the host's.  Every call is
logged in ``calls`` so that tests can check what was asked of the driver.
"""

from __future__ import annotations

import enum
import types

from pgmo.host_device import DRIVER_PAGE, HostAsyncPool, HostMemory

SUCCESS, OUT_OF_MEMORY, INVALID_VALUE = 0, 2, 1


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
    def __init__(self, size: int):
        self.size = size
        self.released = False


class FakeDriver:
    """``cuda.bindings.driver``'s virtual memory calls over host memory."""

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
                 fail: dict[str, int] | None = None):
        """``fail``: call name -> result code it returns from now on (a broken driver)."""
        self.memory = memory if memory is not None else HostMemory()
        self.vmm = vmm
        self.fail = dict(fail or {})
        self.calls: list[tuple] = []
        self.ranges: dict[int, object] = {}  # reservation base -> HostRange
        self.handles: list[_Handle] = []

    def _result(self, name: str, *args, value=None):
        self.calls.append((name, *args))
        code = self.fail.get(name, SUCCESS)
        if code != SUCCESS:
            return (code,) if value is None else (code, None)
        return (SUCCESS,) if value is None else (SUCCESS, value)

    def cuInit(self, flags):
        return self._result("cuInit", flags)

    def cuDeviceGet(self, ordinal):
        return self._result("cuDeviceGet", ordinal, value=ordinal)

    def cuDeviceGetAttribute(self, attribute, device):
        return self._result("cuDeviceGetAttribute", int(attribute), device,
                            value=int(self.vmm))

    def cuMemGetAllocationGranularity(self, prop, flag):
        return self._result("cuMemGetAllocationGranularity", value=self.memory.granule)

    def cuMemAddressReserve(self, size, alignment, addr, flags):
        rng = self.memory.reserve(size)
        self.ranges[rng.ptr] = rng
        return self._result("cuMemAddressReserve", size, alignment, value=rng.ptr)

    def cuMemAddressFree(self, ptr, size):
        self.ranges.pop(ptr).close()
        return self._result("cuMemAddressFree", ptr, size)

    def cuMemCreate(self, size, prop, flags):
        memory = self.memory
        if memory.capacity is not None and memory.in_use + size > memory.capacity:
            self.calls.append(("cuMemCreate", size))
            return (OUT_OF_MEMORY, None)
        handle = _Handle(size)
        self.handles.append(handle)
        return self._result("cuMemCreate", size, value=handle)

    def _range(self, ptr):
        for base, rng in self.ranges.items():
            if base <= ptr < base + rng.size:
                return rng
        raise AssertionError(f"{ptr:#x} is in no reservation")

    def cuMemMap(self, ptr, size, offset, handle, flags):
        result = self._result("cuMemMap", ptr, size)
        if result[0] == SUCCESS:
            assert not handle.released and handle.size == size
            rng = self._range(ptr)
            rng.map(ptr - rng.ptr, size)
        return result

    def cuMemSetAccess(self, ptr, size, descs, count):
        assert count == len(descs) == 1
        return self._result("cuMemSetAccess", ptr, size)

    def cuMemRelease(self, handle):
        handle.released = True
        return self._result("cuMemRelease")

    def cuMemUnmap(self, ptr, size):
        rng = self._range(ptr)
        rng.unmap(ptr - rng.ptr, size)
        return self._result("cuMemUnmap", ptr, size)


class FakeRuntime:
    """``cupy.cuda.runtime``'s stream-ordered pool calls over host memory."""

    cudaMemAllocationTypePinned = 1
    cudaMemHandleTypeNone = 0
    cudaMemLocationTypeDevice = 1
    cudaMemPoolAttrReleaseThreshold = 4
    cudaMemPoolAttrReservedMemCurrent = 5
    cudaDevAttrMemoryPoolsSupported = 115

    def __init__(self, memory: HostMemory | None = None, pools: bool = True):
        self.memory = memory if memory is not None else HostMemory()
        self.pools = pools
        self.calls: list[tuple] = []
        self._pools: dict[int, HostAsyncPool] = {}
        self._blocks: dict[int, object] = {}
        self.attributes: dict[tuple[int, int], int] = {}

    @staticmethod
    def MemPoolProps(alloc_type, handle_type, location_type, device):
        return types.SimpleNamespace(alloc_type=alloc_type, device=device)

    def memPoolCreate(self, props):
        pool = HostAsyncPool(self.memory)
        self._pools[id(pool)] = pool
        self.calls.append(("memPoolCreate", props.device))
        return id(pool)

    def memPoolDestroy(self, handle):
        self.calls.append(("memPoolDestroy",))
        self._pools.pop(handle).close()

    def memPoolSetAttribute(self, handle, attribute, value):
        self.attributes[handle, attribute] = value

    def memPoolGetAttribute(self, handle, attribute):
        assert attribute == self.cudaMemPoolAttrReservedMemCurrent
        return self._pools[handle].held

    def mallocFromPoolAsync(self, size, handle, stream):
        block = self._pools[handle].malloc(size)
        self._blocks[block.ptr] = block
        return block.ptr

    def freeAsync(self, ptr, stream):
        self.calls.append(("freeAsync", stream))
        del self._blocks[ptr]  # no device sync: the pool keeps the memory

    def memPoolTrimTo(self, handle, keep):
        self.calls.append(("memPoolTrimTo", keep))
        self._pools[handle].trim()

    def streamSynchronize(self, stream):
        self.calls.append(("streamSynchronize", stream))
        self.memory.synchronize()

    def deviceGetAttribute(self, attribute, device):
        assert attribute == self.cudaDevAttrMemoryPoolsSupported
        return int(self.pools)


__all__ = ["FakeDriver", "FakeRuntime", "DRIVER_PAGE"]
