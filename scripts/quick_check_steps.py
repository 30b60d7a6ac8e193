"""The quick check's steps, each run in a process of its own on the device (or its stand-ins).

Each step is a function ``(gpu, options) -> result`` (a JSON-able dict):
``gpu`` is :func:`scripts.gpu_modules.real_modules` or
:func:`scripts.gpu_stand_ins.modules`, ``options`` what
:mod:`scripts.gpu_quick_check` gives it (sizes: the GPU's or the dry run's).
A step measures and reports; whether a result passes is decided by
:mod:`scripts.quick_check_report`, from the file, so that the same
judgement applies to a result read back later.

* ``device``: the versions, what :func:`pgmo.device.cuda.device_layer` probes
  and why a part fell back, and what a pgmo pool chose after a short run
  (``stats()``: ``arena_kind``, ``heap_kind``, ``device_reasons``);
* ``driver-pool``: :mod:`scripts.driver_pool_probe`;
* ``costs``: :mod:`scripts.allocator_costs`;
* ``replay``: one workload through one pool, pattern-checked, the memory it
  took seen from outside (``cudaMemGetInfo`` and NVML's count for the
  process);
* ``second-stream``: a pgmo pool with some requests under a second stream and
  kernels there still reading blocks the host dropped, across boundaries;
* ``per-thread-stream``: the same under ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``
  (set by the parent), blocks dropped on another thread while their kernels run;
* ``set-limit``: ``set_limit`` at 1.25x and at 0.5x the run's physical limit;
* ``teardown``: kernels still reading the arena when the pool is dropped, then a
  device sync, ``cudaGetLastError`` and the device's memory against its
  baseline.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Callable

from . import allocator_costs, device_replays, driver_pool_probe

#: Fields of ``stats()`` each result keeps.
STATS = ("mode", "iterations", "requests", "planned_requests", "profiled_requests",
         "departed_requests", "foreign_requests", "outside_requests", "reoptimizations",
         "arena_kind", "heap_kind", "device_reasons", "peak_total_bytes", "peak_used_bytes",
         "lower_bound", "planned_peak", "arena_bytes", "total_bytes", "boundary_releases",
         "limit", "arena_failures")
#: set_limit: a limit the run must fit, and one it cannot (x its physical limit).
LIMIT_FITS, LIMIT_TOO_SMALL = 1.25, 0.5


def stats_of(pool: Any) -> dict | None:
    """The ``stats()`` fields a result keeps (None for CuPy's pool, which has none)."""
    stats = getattr(pool, "stats", None)
    if stats is None:
        return None
    fields = stats().as_dict()
    return {k: fields[k] for k in STATS}


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:400]


def _sync(gpu) -> str | None:
    """A device sync: None, or the error it raised (a fault from earlier, say)."""
    try:
        gpu.runtime.deviceSynchronize()
    except Exception as error:  # noqa: BLE001 - the error is the finding
        return _error(error)
    return None


def _end(gpu, result: dict) -> dict:
    """What every step with kernels reports last: the device sync, ``cudaGetLastError`` and,
    on the stand-ins, the rules broken."""
    result["sync_error"] = _sync(gpu)
    result["last_error"] = gpu.last_error()
    if gpu.stand_in:
        result["violations"] = list(gpu.device.violations)[:10]
    return result


def _run(options: dict, name: str = "repeating"):
    it = options["iterations"]
    return device_replays.make(name, it, options.get("scale", 1.0))


# ------------------------------------------------------------------ device layer
def device(gpu, options: dict) -> dict:
    """The versions, the device layer's probe, and what a pool chose after a short run."""
    from pgmo.device.cuda import device_layer

    out: dict[str, Any] = {"versions": gpu.versions()}
    props = gpu.runtime.getDeviceProperties(gpu.device_id)
    fields, reasons = device_layer(gpu.device_id, int(props["totalGlobalMem"]),
                                   driver=gpu.driver, runtime=gpu.runtime,
                                   stream=gpu.current_stream)
    out["probe"] = {"arena": fields["reserve"] is not None, "heap": fields["heap"] is not None,
                    "reasons": dict(reasons),
                    "joins_unmaps": getattr(fields["reserve"], "joins_unmaps", None)}
    del fields
    run = _run(options)
    pool = gpu.pgmo_pool(replan="sync", method="bestfit")
    try:
        out["replay"] = device_replays.replay(gpu, run, pool)
        out["stats"] = stats_of(pool)
        out["summary"] = pool.memory_summary()
    finally:
        pool.close()
    return _end(gpu, out)


def driver_pool(gpu, options: dict) -> dict:
    return driver_pool_probe.probe(gpu)


def costs(gpu, options: dict) -> dict:
    return allocator_costs.measure(gpu, sizes=tuple(options["sizes"]),
                                   repeats=options["repeats"], behind_ms=options["behind_ms"],
                                   seconds=options["seconds"])


# ------------------------------------------------------------------ replays
def replay(gpu, options: dict) -> dict:
    """One workload through one pool (``options["pool"]``: "pgmo" or "stock"), measured from
    outside the pool."""
    run = _run(options, options["workload"])
    view, why = device_replays.outside_view(gpu)
    pool = gpu.pgmo_pool() if options["pool"] == "pgmo" else gpu.stock_pool()
    try:
        out = device_replays.replay(gpu, run, pool, view=view)
        out["stats"] = stats_of(pool)
        out["own_total_bytes"] = int(pool.total_bytes())  # the pool's own count, at the end
    finally:
        outside = view.stop()
        if hasattr(pool, "close"):
            pool.close()
    bounds = run.bounds()
    out.update(workload=device_replays.describe(options["workload"], options["iterations"],
                                                options.get("scale", 1.0)),
               pool=options["pool"], physical_limit=bounds.physical,
               target_limit=max(bounds.largest + bounds.long_lived, bounds.physical),
               taken=device_replays.taken(outside), outside=outside, nvml_why=why)
    return _end(gpu, out)


def second_stream(gpu, options: dict) -> dict:
    """Requests under a second stream (outside pgmo's plan), and kernels there reading blocks
    after the host dropped them, across iteration boundaries (where pgmo trims and unmaps)."""
    run = _run(options)
    other = gpu.new_stream()
    pool = gpu.pgmo_pool()
    try:
        out = device_replays.replay(gpu, run, pool, other=other, other_every=8, touch_every=4,
                                    touch_ms=options["touch_ms"], sync_each=False)
        out["stats"] = stats_of(pool)
    finally:
        pool.close()
    return _end(gpu, out)


def per_thread_stream(gpu, options: dict) -> dict:
    """Under a per-thread default stream: blocks dropped on another thread while a kernel
    on the owner's stream still reads them, in every mode of the pool (warm-up's heap,
    the plan's arena).  pgmo must defer those frees to the owner (``pending``).
    ``options["heap"]``: the pool's heap option (default: the pool's own default)."""
    run = _run(options)
    pool = gpu.pgmo_pool(**({"heap": options["heap"]} if options.get("heap") else {}))
    handed: list[Any] = []
    pending: list[int] = []
    busy: list[bool] = []  # the owner's stream still working at each drop
    stream = gpu.current_stream()
    out: dict[str, Any] = {"stream": int(stream.ptr), "dropped_elsewhere": 0}

    def heap():
        return getattr(pool.engine.memory, "heap", None)

    def drop_elsewhere() -> None:
        """Drop the handed blocks on a thread of their own, as a loader or the collector
        would."""
        blocks = handed[:]
        handed.clear()
        busy.append(gpu.runtime.streamQuery(stream.ptr) != 0)
        worker = threading.Thread(target=blocks.clear, name="drops-blocks")
        worker.start()
        worker.join()
        waiting = heap()
        pending.append(waiting.pending_frees() if hasattr(waiting, "pending_frees") else 0)
        out["dropped_elsewhere"] += 1

    class HandingPool:
        """The pool as the replay sees it; every 5th block is read by a kernel and handed to
        another thread for its last reference."""

        def __init__(self) -> None:
            self.n = 0

        def malloc(self, size: int):
            memptr = pool.malloc(size)
            self.n += 1
            if self.n % 5 == 0 and size:
                gpu.touch(memptr.ptr, size, options["touch_ms"])
                handed.append(memptr)
            return memptr

        def begin_iteration(self) -> None:
            pool.begin_iteration()

        def end_iteration(self) -> None:
            drop_elsewhere()
            pool.end_iteration()

    try:
        out.update(device_replays.replay(gpu, run, HandingPool(), sync_each=False))
        handed.clear()
        out["pending_after_drops"] = pending
        out["busy_at_drops"] = sum(busy)
        request = pool.malloc(512)  # the owner's next request frees what waits for it
        waiting = heap()
        out["pending_after_owner"] = waiting.pending_frees() \
            if hasattr(waiting, "pending_frees") else None
        del request
        out["stats"] = stats_of(pool)
    finally:
        pool.close()
    return _end(gpu, out)


def set_limit(gpu, options: dict) -> dict:
    """``set_limit`` at 1.25x the run's physical limit (it must complete, pgmo and CuPy's
    pool alike) and at 0.5x (pgmo must raise CuPy's OutOfMemoryError cleanly, and serve
    again once memory is back)."""
    run = _run(options)
    limit = run.bounds().physical
    out: dict[str, Any] = {"physical_limit": limit}
    for name, factor, make in (("pgmo fits", LIMIT_FITS, gpu.pgmo_pool),
                               ("stock fits", LIMIT_FITS, gpu.stock_pool),
                               ("pgmo too small", LIMIT_TOO_SMALL, gpu.pgmo_pool)):
        pool = make()
        try:
            pool.set_limit(size=int(limit * factor))
            result = device_replays.replay(gpu, run, pool)
            result["limit"] = int(limit * factor)
            result["stats"] = stats_of(pool)
            if result["oom"] is not None:
                try:
                    pool.malloc(512)  # memory is back: the pool serves again
                    result["serves_after"] = True
                except Exception as error:  # noqa: BLE001 - the finding
                    result["serves_after"] = _error(error)
            out[name] = result
        finally:
            if hasattr(pool, "close"):
                pool.close()
            del pool
    return _end(gpu, out)


def teardown(gpu, options: dict) -> dict:
    """The pool dropped while kernels on a second stream still read its memory: it must
    wait for them before it unmaps.  After the run, one more iteration's first blocks are
    read by long kernels and dropped, the iteration ends (a boundary: pgmo may give memory
    back) and the pool is dropped; then a device sync, ``cudaGetLastError``, and the
    device's used memory against what it was before the pool.  The long kernels take
    ``last_touch_ms`` (default: ten touches' time)."""
    run = _run(options)
    other = gpu.new_stream()
    gc.collect()
    _sync(gpu)
    free, total = gpu.runtime.memGetInfo()
    before = int(total) - int(free)
    pool = gpu.pgmo_pool()
    out = device_replays.replay(gpu, run, pool, other=other, touch_every=4,
                                touch_ms=options["touch_ms"], sync_each=False)
    pool.begin_iteration()
    sizes = [b.size for b in run.trace.blocks[:8] if b.size]
    last = [pool.malloc(size) for size in sizes]
    for memptr, size in zip(last, sizes):
        gpu.touch(memptr.ptr, size, options.get("last_touch_ms", 10 * options["touch_ms"]),
                  other)
    del last, memptr
    out["pending_at_boundary"] = gpu.runtime.streamQuery(other.ptr) != 0
    pool.end_iteration()
    out["stats"] = stats_of(pool)
    out["pending_at_drop"] = gpu.runtime.streamQuery(other.ptr) != 0
    started = time.perf_counter()
    pool.close()
    del pool
    gc.collect()
    out["drop_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    _end(gpu, out)
    _release_cupy_cache(gpu)
    free, total = gpu.runtime.memGetInfo()
    out["left_bytes"] = int(total) - int(free) - before
    return out


def _release_cupy_cache(gpu) -> None:
    """CuPy's default pool holds the checker's temporaries: give them back before the device's
    memory is compared with its baseline."""
    if gpu.stand_in:
        return
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


#: Every step's function, by the name the parent gives its child.
CHECKS: dict[str, Callable[[Any, dict], dict]] = {
    "device": device, "driver-pool": driver_pool, "costs": costs, "replay": replay,
    "second-stream": second_stream, "per-thread-stream": per_thread_stream,
    "set-limit": set_limit, "teardown": teardown,
}
