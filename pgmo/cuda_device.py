"""The CUDA side of pgmo's device layer: a reserved virtual range, and a private stream-ordered pool.

:mod:`pgmo.engine.memory` decides what is taken and given back; this module
only speaks to the GPU, through two optional APIs:

* **CUDA virtual memory management** (``cuMemAddressReserve``,
  ``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``, ``cuMemUnmap``), which
  CuPy 14 does not expose: through ``cuda-bindings``
  (``cuda.bindings.driver``; the ``cuda12``/``cuda13`` extras install it).
  :class:`CudaRange` reserves address space once and backs it with physical
  memory on demand, so the arena grows in place and its end is trimmed.
* **A private stream-ordered pool** (``cudaMemPoolCreate``,
  ``cudaMallocFromPoolAsync``, ``cudaFreeAsync``, ``cudaMemPoolTrimTo``),
  which CuPy's runtime module has: :class:`CudaAsyncPool` serves the
  requests no plan covers without a device sync per free.

:func:`device_layer` checks what the device supports (its attributes) and
returns the :class:`~pgmo.engine.Backend` fields; where a piece is missing it
is None and the engine uses cudaMalloc instead, saying so in ``stats()``.
Both classes take their driver and runtime modules as arguments, so that the
tests run them against stand-ins (``tests/cuda_standins.py``).

The host analogues, used by every CPU test and benchmark, are
:class:`pgmo.host_device.HostRange` and :class:`pgmo.host_device.HostAsyncPool`.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

__all__ = ["CudaRange", "CudaAsyncPool", "device_layer", "vmm_granularity"]

log = logging.getLogger("pgmo.pool")

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY / cudaErrorMemoryAllocation


def _driver() -> Any:
    from cuda.bindings import driver  # an optional dependency (pgmo[cuda13])

    return driver


def _check(driver: Any, result: Any, what: str) -> Any:
    """``cuda.bindings`` calls return ``(CUresult, value...)``: the value, or an error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        if int(err) == _OUT_OF_MEMORY:
            raise MemoryError(f"{what}: out of device memory")
        raise RuntimeError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)


def _allocation_prop(driver: Any, device_id: int) -> Any:
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_id
    return prop


def vmm_granularity(device_id: int, driver: Any = None) -> int:
    """The device's mapping granularity (bytes), or 0 without virtual memory management."""
    driver = driver or _driver()
    _check(driver, driver.cuInit(0), "cuInit")
    device = _check(driver, driver.cuDeviceGet(device_id), "cuDeviceGet")
    attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    if not _check(driver, driver.cuDeviceGetAttribute(attribute, device), "cuDeviceGetAttribute"):
        return 0
    flag = driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return int(_check(driver, driver.cuMemGetAllocationGranularity(
        _allocation_prop(driver, device_id), flag), "cuMemGetAllocationGranularity"))


class CudaRange:
    """Reserved device address space, mapped granule by granule as the arena grows.

    ``map(offset, nbytes)`` is one mapping (``cuMemCreate`` + ``cuMemMap`` +
    ``cuMemSetAccess``; the handle is released at once, so that unmapping
    frees the memory); ``unmap(offset, nbytes)`` gives back whole mappings
    (``cuMemUnmap`` each, as the driver requires), after :meth:`synchronize`
    has waited for the stream.  Neither waits for the device otherwise.
    """

    def __init__(self, size: int, device_id: int, granule: int, driver: Any = None,
                 synchronize: Any = None):
        """``synchronize()`` waits for the stream that uses the arena (CuPy's current one)."""
        self.driver = driver = driver or _driver()
        self.device_id = device_id
        self.granule = granule
        self.size = -(-size // granule) * granule
        self.ptr = int(_check(driver, driver.cuMemAddressReserve(self.size, granule, 0, 0),
                              "cuMemAddressReserve"))
        self.mapped = 0
        self._prop = _allocation_prop(driver, device_id)
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device_id
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        self._synchronize = synchronize
        self._offsets: list[int] = []
        self._lengths: dict[int, int] = {}
        self._closed = False

    def __del__(self):  # the arena's last block and the pool are gone
        try:
            self.close()
        except Exception:  # at interpreter exit the driver may be gone already
            pass

    def map(self, offset: int, nbytes: int) -> None:
        d = self.driver
        if offset % self.granule or nbytes % self.granule or offset + nbytes > self.size:
            raise ValueError(f"[{offset:,}, {offset + nbytes:,}) is not whole granules of "
                             f"{self.granule:,} bytes inside the reservation")
        handle = _check(d, d.cuMemCreate(nbytes, self._prop, 0), "cuMemCreate")
        try:
            _check(d, d.cuMemMap(self.ptr + offset, nbytes, 0, handle, 0), "cuMemMap")
            try:
                _check(d, d.cuMemSetAccess(self.ptr + offset, nbytes, [self._access], 1),
                       "cuMemSetAccess")
            except BaseException:
                d.cuMemUnmap(self.ptr + offset, nbytes)
                raise
        finally:
            d.cuMemRelease(handle)  # the mapping keeps the memory until it is unmapped
        bisect.insort(self._offsets, offset)
        self._lengths[offset] = nbytes
        self.mapped += nbytes

    def unmap(self, offset: int, nbytes: int) -> None:
        d = self.driver
        k = bisect.bisect_left(self._offsets, offset)
        pos, j = offset, k
        while pos < offset + nbytes:
            if j == len(self._offsets) or self._offsets[j] != pos:
                raise ValueError(f"[{offset:,}, {offset + nbytes:,}) is not a run of whole "
                                 f"mappings")
            pos += self._lengths[self._offsets[j]]
            j += 1
        if pos != offset + nbytes:
            raise ValueError(f"[{offset:,}, {offset + nbytes:,}) ends inside a mapping")
        for start in self._offsets[k:j]:
            length = self._lengths.pop(start)
            _check(d, d.cuMemUnmap(self.ptr + start, length), "cuMemUnmap")
            self.mapped -= length
        del self._offsets[k:j]

    def mappings(self) -> list[tuple[int, int]]:
        return [(o, self._lengths[o]) for o in self._offsets]

    def synchronize(self) -> None:
        if self._synchronize is not None:
            self._synchronize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        d = self.driver
        for start in self._offsets:
            d.cuMemUnmap(self.ptr + start, self._lengths[start])
        self._offsets.clear()
        self._lengths.clear()
        self.mapped = 0
        d.cuMemAddressFree(self.ptr, self.size)


class _PoolBlock:
    """A block of a :class:`CudaAsyncPool`; its death is its ``cudaFreeAsync`` on the stream
    it was allocated on (whatever thread it dies in: the stream orders the reuse)."""

    __slots__ = ("ptr", "size", "_pool", "_stream")
    ptr: int
    size: int
    _pool: "CudaAsyncPool"
    _stream: int

    def __del__(self):
        pool = self._pool
        try:
            pool.runtime.freeAsync(self.ptr, self._stream)
        except Exception:  # at interpreter exit, or a broken context: nothing to do
            return
        pool.used -= self.size  # an int's update: atomic enough for a statistic


class CudaAsyncPool:
    """A private stream-ordered pool (the release threshold at its maximum: memory stays for
    reuse until :meth:`trim`).  Blocks are allocated and freed on CuPy's current stream."""

    def __init__(self, device_id: int, runtime: Any = None, stream: Any = None):
        """``runtime``: CuPy's ``cupy.cuda.runtime``; ``stream()``: the current stream's handle."""
        if runtime is None:
            from cupy.cuda import runtime as cupy_runtime

            runtime = cupy_runtime
        if stream is None:
            import cupy

            def stream() -> int:
                return cupy.cuda.get_current_stream().ptr
        self.runtime = runtime
        self.stream = stream
        props = runtime.MemPoolProps(runtime.cudaMemAllocationTypePinned,
                                     runtime.cudaMemHandleTypeNone,
                                     runtime.cudaMemLocationTypeDevice, device_id)
        self.handle = runtime.memPoolCreate(props)
        runtime.memPoolSetAttribute(self.handle, runtime.cudaMemPoolAttrReleaseThreshold,
                                    2 ** 64 - 1)
        self.used = 0

    def __del__(self):  # blocks keep their pool: none is outstanding now
        try:
            self.runtime.memPoolDestroy(self.handle)
        except Exception:  # at interpreter exit the runtime may be gone already
            pass

    @property
    def held(self) -> int:
        rt = self.runtime
        return int(rt.memPoolGetAttribute(self.handle, rt.cudaMemPoolAttrReservedMemCurrent))

    def malloc(self, size: int) -> _PoolBlock:
        stream = self.stream()
        try:
            ptr = self.runtime.mallocFromPoolAsync(size, self.handle, stream)
        except Exception as e:  # CUDARuntimeError: cudaErrorMemoryAllocation
            if getattr(e, "status", None) == _OUT_OF_MEMORY:
                raise MemoryError(str(e)) from e
            raise
        block = _PoolBlock()
        block.ptr, block.size, block._pool, block._stream = ptr, size, self, stream
        self.used += size
        return block

    def synchronize(self) -> None:
        self.runtime.streamSynchronize(self.stream())

    def trim(self) -> None:
        self.runtime.memPoolTrimTo(self.handle, 0)


def _current_stream() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def device_layer(device_id: int, total_memory: int, *, driver: Any = None, runtime: Any = None,
                 stream: Any = None) -> tuple[dict, dict[str, str]]:
    """What the device supports, as :class:`~pgmo.engine.Backend` fields, and why not.

    Returns ``({"reserve": ..., "heap": ..., "device_memory": ...}, reasons)``;
    ``reserve`` / ``heap`` are None where unsupported, and ``reasons`` says why
    (shown in ``memory_summary()``).  ``driver``, ``runtime`` and ``stream()``
    default to ``cuda.bindings.driver``, ``cupy.cuda.runtime`` and CuPy's
    current stream (tests pass stand-ins).
    """
    reasons: dict[str, str] = {}
    fields: dict[str, Any] = {"reserve": None, "heap": None, "device_memory": total_memory}
    stream = stream or _current_stream
    try:
        if runtime is None:
            from cupy.cuda import runtime as cupy_runtime

            runtime = cupy_runtime
    except ImportError as e:  # pragma: no cover - the pool imports CuPy first
        reasons["arena"] = reasons["heap"] = f"CuPy's runtime is missing ({e})"
        return fields, reasons
    try:
        granule = vmm_granularity(device_id, driver)
        if granule:
            def reserve(size: int) -> CudaRange:
                return CudaRange(size, device_id, granule, driver=driver,
                                 synchronize=lambda: runtime.streamSynchronize(stream()))

            fields["reserve"] = reserve
        else:
            reasons["arena"] = "the device has no virtual memory management"
    except ImportError:
        reasons["arena"] = "cuda-bindings is not installed (pip install 'pgmo[cuda13]')"
    except Exception as e:  # no driver, an old driver...
        reasons["arena"] = f"virtual memory management unavailable ({e})"
    try:
        if runtime.deviceGetAttribute(runtime.cudaDevAttrMemoryPoolsSupported, device_id):
            fields["heap"] = lambda: CudaAsyncPool(device_id, runtime=runtime, stream=stream)
        else:
            reasons["heap"] = "the device has no stream-ordered memory pools"
    except Exception as e:
        reasons["heap"] = f"stream-ordered pools unavailable ({e})"
    for part, why in reasons.items():
        log.info("pgmo's %s uses cudaMalloc: %s", part, why)
    return fields, reasons
