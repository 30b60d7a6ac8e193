"""Checked calls into the CUDA driver (``cuda.bindings``) and CuPy's runtime, for :mod:`.cuda`.

A driver call returns ``(CUresult, value...)`` and a runtime call raises
CuPy's ``CUDARuntimeError``; both become one of two errors here: a
MemoryError for a full device (which the pool answers as CuPy does), a
:class:`~pgmo.errors.DeviceError` naming the call otherwise (which the
device layer answers by falling back).  Tested, with :mod:`.cuda`, by
``tests/test_cuda_device.py``.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import DeviceError

__all__ = ["vmm_granularity"]

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY / cudaErrorMemoryAllocation


def _driver() -> Any:
    from cuda.bindings import driver  # an optional dependency (pgmo[cuda13])

    return driver


def _name(err: Any) -> str:
    name = getattr(err, "name", "")
    return name if isinstance(name, str) else ""


def _check(result: Any, what: str) -> Any:
    """``cuda.bindings`` calls return ``(CUresult, value...)``: the value, or an error
    (MemoryError for a full device, :class:`~pgmo.errors.DeviceError` otherwise)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    code = int(err)
    if code != 0:
        if code == _OUT_OF_MEMORY:
            raise MemoryError(f"{what}: out of device memory")
        raise DeviceError(what, code, _name(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _code(result: Any) -> int:
    """A driver call's CUresult as a number, where the caller looks at it without raising
    (``cuda.bindings`` returns a tuple)."""
    return int(result[0] if isinstance(result, tuple) else result)


def _runtime(what: str, call: Callable[..., Any], *args: Any) -> Any:
    """A ``cupy.cuda.runtime`` call: its CUDARuntimeError as MemoryError or DeviceError."""
    try:
        return call(*args)
    except MemoryError:
        raise
    except Exception as e:
        status = getattr(e, "status", None)
        if status is None:
            raise
        if int(status) == _OUT_OF_MEMORY:
            raise MemoryError(f"{what}: out of device memory") from e
        raise DeviceError(what, int(status), str(e)) from e


def _allocation_prop(driver: Any, device_id: int) -> Any:
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_id
    return prop


def vmm_granularity(device_id: int, driver: Any = None) -> int:
    """The device's mapping granularity (bytes), or 0 without virtual memory management."""
    driver = driver or _driver()
    _check(driver.cuInit(0), "cuInit")
    device = _check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    if not _check(driver.cuDeviceGetAttribute(attribute, device), "cuDeviceGetAttribute"):
        return 0
    flag = driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return int(_check(driver.cuMemGetAllocationGranularity(_allocation_prop(driver, device_id),
                                                           flag),
                      "cuMemGetAllocationGranularity"))
