"""The GPU's modules for the quick check, under the names its stand-ins have.

:func:`real_modules` gathers what the quick check's steps call on a GPU:
CuPy's runtime, ``cuda.bindings.driver`` (None, with why, when it is not
installed), NVML (``pynvml``, or None with why), two kernels (``spin``: queued
work that only waits; ``touch``: work that waits, then reads a block), streams,
pgmo's pool and CuPy's pool on the device, ``cudaGetLastError`` and the
versions.  :func:`scripts.gpu_stand_ins.modules` has the same names on the
CPU, so that every step runs unchanged in the dry run.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

#: One thread waits on the global timer for ``ns`` nanoseconds.
SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""
#: Waits ``ns`` nanoseconds, then reads ``n`` bytes at ``p`` into ``sink`` (writes nothing
#: else): work that still uses a block after the host dropped it.
TOUCH_SOURCE = r"""
extern "C" __global__ void touch(const unsigned char* p, unsigned long long n,
                                 unsigned long long ns, unsigned long long* sink) {
    unsigned long long start, now, sum = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) sum += p[i];
    atomicAdd(sink, sum);
}
"""
#: The most bytes one ``touch`` reads.
TOUCH_MAX = 1 << 16


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def real_modules(device_id: int) -> SimpleNamespace:
    """The device's modules and helpers (see the module); makes ``device_id`` current."""
    import cupy
    import numpy

    from . import nvml_probe

    cupy.cuda.Device(device_id).use()
    runtime = cupy.cuda.runtime
    spin_kernel = cupy.RawKernel(SPIN_SOURCE, "spin")
    touch_kernel = cupy.RawKernel(TOUCH_SOURCE, "touch")
    sink = cupy.zeros(1, cupy.uint64)

    def spin(ms: float, stream: Any = None) -> None:
        with stream if stream is not None else cupy.cuda.get_current_stream():
            spin_kernel((1,), (1,), (numpy.uint64(int(ms * 1e6)),))

    def touch(ptr: int, size: int, ms: float, stream: Any = None) -> None:
        with stream if stream is not None else cupy.cuda.get_current_stream():
            touch_kernel((1,), (256,), (numpy.uint64(ptr), numpy.uint64(min(size, TOUCH_MAX)),
                                        numpy.uint64(int(ms * 1e6)), sink))

    spin(0.01)  # compiled and loaded before anything is timed
    touch(sink.data.ptr, 8, 0.01)
    runtime.deviceSynchronize()
    try:
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart
        why = ""
    except ImportError as error:
        driver = cudart = None
        why = f"cuda-bindings is not installed (pip install cuda-bindings): {error}"
    nvml, nvml_why = nvml_probe.load_nvml()
    props = runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def last_error() -> int | None:
        """``cudaGetLastError`` (None without cuda-bindings)."""
        if cudart is None:
            return None
        return int(cudart.cudaGetLastError()[0])

    def versions() -> dict:
        out = {"device": name, "device memory": f"{props['totalGlobalMem'] / 2**30:.1f} GiB",
               "compute capability": f"{props.get('major', '?')}.{props.get('minor', '?')}",
               "CUDA driver": runtime.driverGetVersion(),
               "CUDA runtime": runtime.runtimeGetVersion(),
               "cuda-bindings": _version("cuda-bindings"),
               "cuda-pathfinder": _version("cuda-pathfinder"),
               "nvidia-ml-py": _version("nvidia-ml-py")}
        if driver is not None:
            err, value = driver.cuDriverGetVersion()
            out["cuDriverGetVersion"] = int(value) if int(err) == 0 else f"error {int(err)}"
        if nvml is not None:
            try:
                out["NVML driver"] = str(nvml.nvmlSystemGetDriverVersion())
            except Exception as error:  # noqa: BLE001 - a version is not worth a failure
                out["NVML driver"] = f"unknown ({error})"
        return out

    def pgmo_pool(**options: Any):
        from pgmo import ProfileGuidedMemoryPool

        return ProfileGuidedMemoryPool(**{"plan_cache": False, **options})  # cold: a check

    return SimpleNamespace(
        runtime=runtime, driver=driver, driver_why=why, nvml=nvml, nvml_why=nvml_why,
        spin=spin, touch=touch, new_stream=lambda: cupy.cuda.Stream(non_blocking=True),
        current_stream=cupy.cuda.get_current_stream, stream=0, device_id=device_id,
        name=name, stand_in=False, host=False, memory=None, pgmo_pool=pgmo_pool,
        stock_pool=cupy.cuda.MemoryPool, last_error=last_error, versions=versions)
