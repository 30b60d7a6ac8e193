"""How the driver's stream-ordered pool and cudaMalloc take device memory: the steps the host model assumes.

pgmo's heap is a private stream-ordered pool (``cudaMemPoolCreate``), and its
host model (:class:`pgmo.device.host_async_pool.HostAsyncPool`) grows and trims in
chunks: CuPy documents the driver's pool as reserving 32 MiB multiples and
trimming in 32 MiB steps, while ``cudaMemPoolTrimTo`` cannot release memory
that backs a live allocation.  :func:`probe` reads the pool's
``cudaMemPoolAttrReservedMemCurrent`` where it tells those steps apart:

* ``fresh``: after one request of 512 B, 1 MiB, 3 MiB and 40 MiB, each on a
  pool of its own (what the first block costs), then after its free and a
  trim;
* ``in_turn``: after each of those requests in turn on one pool (whether
  small blocks share a chunk), and after freeing them all and a trim;
* ``one_live_per_growth``: 128 blocks of 1 MiB on one pool, grouped by the
  growth of the reservation they came with; one block of each group stays
  live and the others are freed, then the pool is trimmed: what stays
  reserved per group is the step a trim works in (the whole growth, or
  less);
* ``cudaMalloc``: the device's used bytes (``cudaMemGetInfo``) after each of
  a few ``cudaMalloc`` calls held at once: the page cudaMalloc takes.

``gpu`` is the quick check's namespace of modules (real or stand-ins); every
call runs on its stream, synchronized before each reading.
"""

from __future__ import annotations

from . import allocator_costs

KiB, MiB = 2**10, 2**20
REQUESTS = (512, MiB, 3 * MiB, 40 * MiB)
GROWTH_BLOCK = MiB
GROWTH_BLOCKS = 128
#: cudaMalloc sizes held at once: two small ones (do they share a page?), one just over
#: 1 MiB, one of 3 MiB.
MALLOC_SIZES = (512, 512, MiB + 512, 3 * MiB)


class PoolReader:
    """One private pool (release threshold at its maximum) and its attributes."""

    def __init__(self, gpu):
        self.gpu = gpu
        self.rt = gpu.runtime
        self.handle = allocator_costs.new_pool(gpu)

    def malloc(self, size: int) -> int:
        ptr = self.rt.mallocFromPoolAsync(size, self.handle, self.gpu.stream)
        self.rt.streamSynchronize(self.gpu.stream)
        return ptr

    def free(self, ptr: int) -> None:
        self.rt.freeAsync(ptr, self.gpu.stream)

    def trim(self) -> None:
        self.rt.deviceSynchronize()  # a trim does not wait for queued work
        self.rt.memPoolTrimTo(self.handle, 0)

    def reserved(self) -> int:
        self.rt.streamSynchronize(self.gpu.stream)
        return int(self.rt.memPoolGetAttribute(self.handle,
                                               self.rt.cudaMemPoolAttrReservedMemCurrent))

    def used(self) -> int:
        return int(self.rt.memPoolGetAttribute(self.handle,
                                               self.rt.cudaMemPoolAttrUsedMemCurrent))

    def close(self) -> None:
        self.rt.deviceSynchronize()
        self.rt.memPoolDestroy(self.handle)


def fresh(gpu) -> list[dict]:
    rows = []
    for size in REQUESTS:
        pool = PoolReader(gpu)
        try:
            ptr = pool.malloc(size)
            row = {"size": size, "reserved": pool.reserved(), "used": pool.used()}
            pool.free(ptr)
            row["reserved_after_free"] = pool.reserved()
            pool.trim()
            row["reserved_after_trim"] = pool.reserved()
        finally:
            pool.close()
        rows.append(row)
    return rows


def in_turn(gpu) -> dict:
    pool = PoolReader(gpu)
    try:
        held, rows = [], []
        for size in REQUESTS:
            held.append(pool.malloc(size))
            rows.append({"size": size, "reserved": pool.reserved(), "used": pool.used()})
        for ptr in held:
            pool.free(ptr)
        pool.trim()
        return {"requests": rows, "reserved_after_trim": pool.reserved()}
    finally:
        pool.close()


def one_live_per_growth(gpu, block: int = GROWTH_BLOCK, count: int = GROWTH_BLOCKS) -> dict:
    pool = PoolReader(gpu)
    try:
        groups: list[list[int]] = []
        growths: list[int] = []  # the reservation after each growth
        last = 0
        for _ in range(count):
            ptr = pool.malloc(block)
            reserved = pool.reserved()
            if reserved > last or not groups:
                groups.append([])
                growths.append(reserved - last)
                last = reserved
            groups[-1].append(ptr)
        kept = [group[0] for group in groups]
        for group in groups:
            for ptr in group[1:]:
                pool.free(ptr)
        pool.trim()
        out = {"block": block, "blocks": count, "reserved_before": last,
               "growths": growths, "kept": len(kept), "reserved_after_trim": pool.reserved(),
               "used_after_trim": pool.used()}
        for ptr in kept:
            pool.free(ptr)
        pool.trim()
        out["reserved_at_end"] = pool.reserved()
        return out
    finally:
        pool.close()


def malloc_pages(gpu) -> list[dict]:
    """The device's used bytes after each cudaMalloc (all held until the end)."""
    rt = gpu.runtime
    rt.deviceSynchronize()

    def used() -> int:
        free, total = rt.memGetInfo()
        return int(total) - int(free)

    rows, held = [], []
    before = used()
    try:
        for size in MALLOC_SIZES:
            held.append(rt.malloc(size))
            now = used()
            rows.append({"size": size, "used_grew": now - before})
            before = now
    finally:
        for ptr in held:
            rt.free(ptr)
    return rows


def probe(gpu) -> dict:
    """Every reading above (see the module); a part that fails says why, the others run."""
    out: dict = {"requests": list(REQUESTS), "problems": []}
    for name, part in (("fresh", fresh), ("in_turn", in_turn),
                       ("one_live_per_growth", one_live_per_growth),
                       ("cudaMalloc", malloc_pages)):
        try:
            out[name] = part(gpu)
        except Exception as error:  # noqa: BLE001 - one refused call: the others still run
            out["problems"].append(f"{name}: {type(error).__name__}: {error}"[:300])
            gpu.runtime.deviceSynchronize()
    return out
