"""What taking device memory costs each way, idle and behind queued kernels (the quick check's costs).

Three ways a pool can take and give back device memory, each call timed on
the host at several sizes:

* ``cudaMalloc`` / ``cudaFree`` (what pgmo's raw allocations and CuPy's
  pool use);
* a private stream-ordered pool (``cudaMemPoolCreate`` with its release
  threshold at its maximum, ``cudaMallocFromPoolAsync``, ``cudaFreeAsync``,
  ``cudaMemPoolTrimTo(0)``), through CuPy's runtime;
* CUDA virtual memory, one granule-rounded physical allocation mapped into
  a reserved range (``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``,
  ``cuMemUnmap``, ``cuMemRelease``), and one ``cuMemUnmap`` over a run of
  one-granule mappings (what pgmo's heap gives back at a boundary), through
  ``cuda.bindings.driver``
  (``pip install cuda-bindings``; without it that part says why).

Each call is timed idle (nothing queued), right after queueing ``behind_ms``
of kernels on the stream the allocations use, and right after queueing them
on another (non-blocking) stream.  A call that returns only once the queue is
empty, and took at least half of ``behind_ms``, *waited*: it synchronizes,
and in a training loop it costs the CPU/GPU overlap (a call that waits only
for the other stream waits for the whole device).  ``gpu`` is a namespace of
modules: the real ones (:func:`scripts.gpu_modules.real_modules`) or
``gpu_stand_ins.modules()``.
"""

from __future__ import annotations

import statistics
import time

KiB, MiB, GiB = 2**10, 2**20, 2**30
SIZES = (512, 64 * KiB, 2 * MiB, 20 * MiB, 256 * MiB, 4 * GiB)
#: Kernels queued before a call "behind queued kernels": 5 of 1 ms each.
BEHIND_MS = 5.0
KERNELS = 5
MAX_THRESHOLD = (1 << 64) - 1
#: The op name of one ``cuMemUnmap`` over a run of one-granule mappings (the host model
#: times a joined unmap by its fitted line, where a GPU measured it).
RUN_UNMAP = "cuMemUnmap (a run of granules)"
#: And of one ``cuMemSetAccess`` over a run of one-granule mappings (pgmo's page heap grants
#: access to a block's run of pages at once).
RUN_ACCESS = "cuMemSetAccess (a run of granules)"


# ------------------------------------------------------------------ timing one call
def _queue(gpu, behind_ms: float, stream) -> None:
    for _ in range(KERNELS):
        gpu.spin(behind_ms / KERNELS, stream)


def timed(gpu, call, behind_ms: float, stream=None) -> tuple[float, bool, object]:
    """``call()`` timed after a device sync (and ``behind_ms`` of kernels queued when > 0, on
    ``stream``: None for the stream the calls use): (microseconds, whether it waited for the
    queue, what it returned)."""
    gpu.runtime.deviceSynchronize()
    if behind_ms:
        _queue(gpu, behind_ms, stream)
    start = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - start
    done = gpu.runtime.streamQuery(gpu.stream if stream is None else stream.ptr) == 0
    waited = bool(behind_ms) and done and seconds >= behind_ms / 2e3
    return seconds * 1e6, waited, value


class DriverError(RuntimeError):
    pass


def check(driver, name: str, result):
    """A driver call's values, or :class:`DriverError` naming the call and its CUresult."""
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise DriverError(f"{name} returned {result[0]}")
    return result[1] if len(result) == 2 else result[1:]


# ------------------------------------------------------------------ the three ways
def raw_ops(gpu):
    """cudaMalloc and cudaFree: (op name, setup, call, cleanup) for one size."""
    rt = gpu.runtime
    yield ("cudaMalloc", lambda size: None, lambda size, _: rt.malloc(size),
           lambda ptr: rt.free(ptr))
    yield ("cudaFree", lambda size: rt.malloc(size), lambda size, ptr: rt.free(ptr),
           lambda _: None)


def pool_ops(gpu, pool: int):
    rt, stream = gpu.runtime, gpu.stream

    def fresh(size):
        rt.deviceSynchronize()
        rt.memPoolTrimTo(pool, 0)

    def cached(size):
        ptr = rt.mallocFromPoolAsync(size, pool, stream)
        rt.freeAsync(ptr, stream)
        rt.deviceSynchronize()

    def give_back(ptr):
        rt.freeAsync(ptr, stream)
        rt.deviceSynchronize()

    def held(size):
        ptr = rt.mallocFromPoolAsync(size, pool, stream)
        rt.deviceSynchronize()
        return ptr

    take = lambda size, _: rt.mallocFromPoolAsync(size, pool, stream)  # noqa: E731
    yield ("cudaMallocFromPoolAsync (pool grows)", fresh, take, give_back)
    yield ("cudaMallocFromPoolAsync (reused)", cached, take, give_back)
    yield ("cudaFreeAsync", held, lambda size, ptr: rt.freeAsync(ptr, stream),
           lambda _: rt.deviceSynchronize())
    yield ("cudaMemPoolTrimTo(0)", cached, lambda size, _: rt.memPoolTrimTo(pool, 0),
           lambda _: None)


def new_pool(gpu) -> int:
    """A private stream-ordered pool that keeps what is freed (release threshold at its max)."""
    rt = gpu.runtime
    props = rt.MemPoolProps(rt.cudaMemAllocationTypePinned, rt.cudaMemHandleTypeNone,
                            rt.cudaMemLocationTypeDevice, gpu.device_id)
    pool = rt.memPoolCreate(props)
    rt.memPoolSetAttribute(pool, rt.cudaMemPoolAttrReleaseThreshold, MAX_THRESHOLD)
    return pool


class Granules:
    """A reserved virtual range and the driver's structures to back part of it with granules."""

    def __init__(self, gpu, largest: int):
        d = self.driver = gpu.driver
        check(d, "cuInit", d.cuInit(0))
        device = check(d, "cuDeviceGet", d.cuDeviceGet(gpu.device_id))
        attribute = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        self.supported = bool(check(d, "cuDeviceGetAttribute",
                                    d.cuDeviceGetAttribute(attribute, device)))
        self.prop = d.CUmemAllocationProp()
        self.prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = gpu.device_id
        self.access = d.CUmemAccessDesc()
        self.access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = gpu.device_id
        self.access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granularity = int(check(d, "cuMemGetAllocationGranularity",
                                     d.cuMemGetAllocationGranularity(
                                         self.prop, d.CUmemAllocationGranularity_flags
                                         .CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        self.reserved = self.rounded(largest)
        self.base = check(d, "cuMemAddressReserve",
                          d.cuMemAddressReserve(self.reserved, 0, 0, 0))

    def rounded(self, size: int) -> int:
        return -(-size // self.granularity) * self.granularity

    def close(self) -> None:
        check(self.driver, "cuMemAddressFree",
              self.driver.cuMemAddressFree(self.base, self.reserved))

    # one step each, so that each can be timed alone
    def create(self, size):
        return check(self.driver, "cuMemCreate",
                     self.driver.cuMemCreate(self.rounded(size), self.prop, 0))

    def map(self, size, handle, offset: int = 0):
        check(self.driver, "cuMemMap",
              self.driver.cuMemMap(self.base + offset, self.rounded(size), 0, handle, 0))
        return handle

    def set_access(self, size, handle):
        check(self.driver, "cuMemSetAccess",
              self.driver.cuMemSetAccess(self.base, self.rounded(size), [self.access], 1))
        return handle

    def unmap(self, size, handle):
        check(self.driver, "cuMemUnmap", self.driver.cuMemUnmap(self.base, self.rounded(size)))
        return handle

    def release(self, handle):
        check(self.driver, "cuMemRelease", self.driver.cuMemRelease(handle))


def granule_ops(granules: Granules, size_of: dict):
    g = granules

    def mapped(size):
        return g.set_access(size, g.map(size, g.create(size)))

    def unmapped_release(handle):
        g.unmap(size_of["size"], handle)
        g.release(handle)

    yield ("cuMemCreate", lambda size: None, lambda size, _: g.create(size), g.release)
    yield ("cuMemMap", g.create, lambda size, handle: g.map(size, handle), unmapped_release)
    yield ("cuMemSetAccess", lambda size: g.map(size, g.create(size)),
           lambda size, handle: g.set_access(size, handle), unmapped_release)
    yield ("cuMemUnmap", mapped, lambda size, handle: g.unmap(size, handle), g.release)
    yield ("cuMemRelease", lambda size: g.unmap(size, mapped(size)),
           lambda size, handle: g.release(handle), lambda _: None)

    def apart_ungranted(size):
        """``size`` as one mapping per granule, side by side (pgmo's heap's pages), each
        handle released (the mappings keep the memory), no access granted yet."""
        step = g.granularity
        for k in range(g.rounded(size) // step):
            handle = g.create(step)
            try:
                g.map(step, handle, k * step)
            finally:
                g.release(handle)

    def apart(size):
        """:func:`apart_ungranted`, then access granted over all of them."""
        apart_ungranted(size)
        return g.set_access(size, None)

    def unmap_each(_):
        step = g.granularity
        for k in range(g.rounded(size_of["size"]) // step):
            g.driver.cuMemUnmap(g.base + k * step, step)

    def unmap_run(size, _):
        """One ``cuMemUnmap`` over all of them: where the driver refuses, one call each (so
        that the range is empty for the next row), and the refusal is the row's error."""
        result = g.driver.cuMemUnmap(g.base, g.rounded(size))
        if result[0] != g.driver.CUresult.CUDA_SUCCESS:  # as check() reads it
            step = g.granularity
            for k in range(g.rounded(size) // step):
                g.driver.cuMemUnmap(g.base + k * step, step)
            check(g.driver, "cuMemUnmap over several mappings", result)

    yield (RUN_ACCESS, apart_ungranted, lambda size, _: g.set_access(size, None), unmap_each)
    # last: a driver that refuses it leaves nothing mapped for the rows after it
    yield (RUN_UNMAP, apart, unmap_run, lambda _: None)


# ------------------------------------------------------------------ measuring
#: (row key prefix, queued work?, on the other stream?) of each condition a call is timed in.
CONDITIONS = (("idle", False, False), ("behind", True, False), ("other", True, True))


def measure_op(gpu, way: str, name: str, setup, call, cleanup, size: int, repeats: int,
               behind_ms: float, deadline: float, other=None) -> dict:
    """One operation at one size: its median time idle, behind queued kernels on its stream
    (``behind_us``, ``waited``, ``waits``) and behind kernels on the ``other`` stream
    (``other_us``, ``other_waited``, ``other_waits``; when ``other`` is given)."""
    row = {"way": way, "op": name, "size": size}
    for condition, queued, elsewhere in CONDITIONS:
        if elsewhere and other is None:
            continue
        behind = behind_ms if queued else 0.0
        times, waits = [], []
        for _ in range(repeats):
            if time.monotonic() > deadline:
                row["stopped"] = "time budget"
                break
            state = setup(size)
            us, waited, value = timed(gpu, lambda: call(size, state), behind,
                                      other if elsewhere else None)
            cleanup(value if value is not None else state)
            times.append(us)
            waits.append(waited)
        if times:
            row[f"{condition}_us"] = round(statistics.median(times), 2)
            if queued:
                key = "" if condition == "behind" else f"{condition}_"
                row[f"{key}waited"] = sum(waits) * 2 > len(waits)
                row[f"{key}waits"] = f"{sum(waits)}/{len(waits)}"
    return row


def measure(gpu, sizes=SIZES, repeats: int = 5, behind_ms: float = BEHIND_MS,
            seconds: float = 80.0) -> dict:
    """Every operation of the three ways at every size; what could not be measured, and why."""
    deadline = time.monotonic() + seconds
    rows, problems = [], []
    info = {"device": gpu.name, "behind_ms": behind_ms, "kernels": KERNELS, "repeats": repeats,
            "sizes": list(sizes)}
    other = gpu.new_stream()

    def run(way, ops, extra=None):
        for name, setup, call, cleanup in ops:
            for size in sizes:
                if extra is not None:
                    extra["size"] = size
                n = max(2, repeats // 2) if size >= GiB else repeats
                try:
                    rows.append(measure_op(gpu, way, name, setup, call, cleanup, size, n,
                                           behind_ms, deadline, other))
                except Exception as error:  # noqa: BLE001 - one failing call: the others still run
                    rows.append({"way": way, "op": name, "size": size,
                                 "error": f"{type(error).__name__}: {error}"[:200]})
                    gpu.runtime.deviceSynchronize()

    run("cudaMalloc", raw_ops(gpu))
    try:
        pool = new_pool(gpu)
    except Exception as error:  # noqa: BLE001
        problems.append(f"stream-ordered pool: {type(error).__name__}: {error}")
    else:
        run("stream-ordered pool", pool_ops(gpu, pool))
        gpu.runtime.deviceSynchronize()
        gpu.runtime.memPoolDestroy(pool)
    if gpu.driver is None:
        problems.append(f"virtual memory: {gpu.driver_why}")
    else:
        try:
            granules = Granules(gpu, max(sizes))
        except Exception as error:  # noqa: BLE001
            problems.append(f"virtual memory: {type(error).__name__}: {error}")
        else:
            info["granularity"] = granules.granularity
            info["vmm_supported"] = granules.supported
            if granules.supported:
                current: dict = {}  # the size being measured, for the cleanups that unmap
                run("virtual memory", granule_ops(granules, current), current)
            else:
                problems.append("virtual memory: the device does not support it")
            granules.close()
    return {"info": info, "rows": rows, "problems": problems}
