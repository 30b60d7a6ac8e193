"""The CUDA device layer (pgmo.device.cuda) against strict stand-ins of the driver and runtime.

The stand-ins (tests/cuda_standins.py) keep their memory on the host and
enforce what a real GPU enforces: no unmap, trim or free while queued work
on any stream may use the memory, a pool and its streams on one device,
``cudaStreamPerThread`` per thread, whole mappings, access before use, and
failed calls that change nothing.  Every breach is a line in
``gpu.violations``; every test expects none.  A pool built on the CUDA
classes runs the engine's real path with every block checked.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from pathlib import Path

import pytest

from pgmo.device import cuda, cuda_calls
from pgmo.device.cuda import CudaAsyncPool, CudaRange, device_layer
from pgmo.engine import Backend, Engine, pool_options
from pgmo.errors import DeviceError
from pgmo.device.host_async_pool import DRIVER_POOL_CHUNK
from pgmo.device.host_memory import HostMemory
from pgmo.device.host_stock_pool import HostStockPool
from pgmo.testing import TEST_DEFAULTS, Checker

from .cuda_standins import (NOT_PERMITTED, NOT_SUPPORTED, OUT_OF_MEMORY, PER_THREAD,
                            FakeDriver, FakeGPU, FakeRuntime)
from .interrupts import Injector
from .threads import CheckedThread

MiB = 1 << 20


def names(gpu):
    return [c[0] for c in gpu.log]


# ------------------------------------------------------------------ the range
def test_a_growth_maps_its_pieces_and_grants_access_once():
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu)
    r = CudaRange(64 * MiB, device_id=0, granule=2 * MiB, driver=driver)
    r.map(0, 8 * MiB, piece=2 * MiB)
    calls = names(gpu)
    assert calls.count("cuMemCreate") == calls.count("cuMemMap") == 4
    assert calls.count("cuMemRelease") == 4 and calls.count("cuMemSetAccess") == 1
    assert all(h.released for h in driver.handles)  # unmapping frees the memory
    assert r.mapped == gpu.memory.in_use == 8 * MiB and r.usable_end() == 8 * MiB
    assert gpu.memory.holds(r.ptr, 8 * MiB)
    with pytest.raises(ValueError, match="whole granules"):
        r.map(9 * MiB, 2 * MiB)
    r.close()
    assert names(gpu)[-1] == "cuMemAddressFree" and gpu.memory.in_use == 0
    assert gpu.violations == []


def test_a_refused_unmap_keeps_the_books_of_what_stays_mapped():
    """The refused mapping and those below it stay listed and counted; the rest went back
    (highest first, so what stays is one run from offset 0)."""
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu, fail={"cuMemUnmap": (NOT_SUPPORTED, 1)})
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    r.map(0, 6 * MiB, piece=2 * MiB)
    with pytest.raises(DeviceError, match="cuMemUnmap failed.*801"):
        r.unmap(0, 6 * MiB)
    assert r.mappings() == [(0, 2 * MiB), (2 * MiB, 2 * MiB)]
    assert r.mapped == gpu.memory.in_use == 4 * MiB and r.usable_end() == 4 * MiB
    driver.fail.clear()
    r.unmap(0, 4 * MiB)  # the books are right: a later unmap gives the rest back
    assert r.mapped == gpu.memory.in_use == 0


@pytest.mark.parametrize("call", ["cuMemCreate", "cuMemMap", "cuMemSetAccess"])
def test_a_growth_the_driver_refuses_half_way_gives_back_what_it_mapped(call):
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu, fail={call: (NOT_SUPPORTED, 1 if call != "cuMemSetAccess"
                                              else 0)})
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    with pytest.raises(DeviceError, match=call):
        r.map(0, 6 * MiB, piece=2 * MiB)
    assert r.mappings() == [] and r.mapped == gpu.memory.in_use == 0
    assert all(h.released for h in driver.handles) and gpu.violations == []


def test_pages_mapped_together_get_access_in_one_grant():
    """The page heap maps a run of pages with one ``cuMemSetAccess`` over all of them (about
    55 us on the H100 fit, a ``cuMemMap`` 2 us): usable together, unmapped one by one."""
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu)
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    pages = [r.create_page() for _ in range(3)]
    before = len(gpu.log)
    r.map_pages(4 * MiB, pages)
    calls = [c[0] for c in gpu.log[before:]]
    assert calls == ["cuMemMap"] * 3 + ["cuMemSetAccess"]
    assert r.mappings() == [(4 * MiB + k * 2 * MiB, 2 * MiB) for k in range(3)]
    assert gpu.memory.holds(r.ptr + 4 * MiB, 6 * MiB) and r.pages_held == 6 * MiB
    with pytest.raises(ValueError):
        r.map_pages(8 * MiB, [r.create_page()])  # the last of the three is there
    r.synchronize()
    for k in range(3):
        r.unmap_page(4 * MiB + k * 2 * MiB)
    for handle in pages:
        r.release_page(handle)
    r.close()
    assert gpu.memory.in_use == 0 and gpu.violations == []


@pytest.mark.parametrize("call, use", [("cuMemMap", 1), ("cuMemSetAccess", 0)])
def test_pages_the_driver_refuses_half_way_are_mapped_nowhere(call, use):
    """All or nothing: a map refused half-way, or the grant, unmaps what the call mapped (no
    kernel can have used it: no sync); the pages stay the caller's, to map again."""
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu, fail={call: (NOT_SUPPORTED, use)})
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    pages = [r.create_page() for _ in range(3)]
    syncs = gpu.syncs if hasattr(gpu, "syncs") else None
    with pytest.raises(DeviceError, match=call):
        r.map_pages(0, pages)
    assert r.mappings() == [] == _driver_truth(driver, r) and gpu.violations == []
    assert syncs is None or gpu.syncs == syncs
    driver.fail.clear()
    r.map_pages(0, pages)
    assert r.usable_end() == 6 * MiB
    r.close()
    assert gpu.memory.in_use == 0 and gpu.violations == []


def test_a_full_device_is_a_memory_error_and_nothing_stays_mapped():
    gpu = FakeGPU(HostMemory(capacity=4 * MiB))
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=FakeDriver(gpu=gpu))
    r.map(0, 2 * MiB)
    with pytest.raises(MemoryError, match="cuMemCreate: out of device memory"):
        r.map(2 * MiB, 4 * MiB, piece=2 * MiB)
    assert r.mappings() == [(0, 2 * MiB)] and gpu.memory.in_use == 2 * MiB


def test_closing_a_range_waits_for_work_on_every_stream():
    gpu = FakeGPU()
    runtime = FakeRuntime(gpu=gpu)
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=FakeDriver(gpu=gpu),
                  synchronize=runtime.deviceSynchronize)
    r.map(0, 4 * MiB)
    gpu.launch(r.ptr + MiB, MiB, stream=gpu.create_stream())  # a kernel on another stream
    del r  # the arena's last block and the pool are gone: collected
    gc.collect()
    assert gpu.violations == [] and gpu.memory.in_use == 0
    calls = names(gpu)
    assert calls.index("deviceSynchronize") < calls.index("cuMemUnmap")


# -------------------------------------------------------- the stream-ordered pool
def test_a_block_is_freed_on_the_stream_it_was_allocated_on():
    gpu = FakeGPU()
    runtime = FakeRuntime(gpu=gpu)
    s1, s2 = gpu.create_stream(), gpu.create_stream()
    pool = CudaAsyncPool(0, runtime=runtime, stream=gpu.current_stream)
    gpu.use_stream(s1)
    block = pool.malloc(MiB)
    gpu.launch(block.ptr, MiB)
    gpu.use_stream(s2)  # another stream is current when the block dies
    del block
    assert ("freeAsync", s1.ptr) in gpu.log and gpu.violations == []


def test_a_block_that_dies_on_another_thread_waits_for_its_own_thread():
    """With per-thread default streams, handle 2 means the calling thread's stream: a free
    from another thread (a loader, the collector) must not be ordered there."""
    gpu = FakeGPU()
    runtime = FakeRuntime(gpu=gpu)
    pool = CudaAsyncPool(0, runtime=runtime, stream=gpu.per_thread_stream)
    block = pool.malloc(MiB)
    gpu.launch(block.ptr, MiB, stream=gpu.per_thread_stream())
    box = [block]
    del block

    def drop():
        box.clear()

    t = CheckedThread(target=drop)
    t.start()
    t.join(30)
    assert gpu.violations == [] and pool.pending_frees() == 1 and pool.used == MiB
    again = pool.malloc(MiB)  # the owner's next call frees it, on its own stream
    assert pool.pending_frees() == 0 and pool.used == MiB and gpu.violations == []
    assert ("freeAsync", PER_THREAD) in gpu.log
    del again


def test_a_destroyed_stream_leaves_the_free_to_the_current_stream():
    gpu = FakeGPU()
    runtime = FakeRuntime(gpu=gpu)
    pool = CudaAsyncPool(0, runtime=runtime, stream=gpu.current_stream)
    s1 = gpu.create_stream()
    gpu.use_stream(s1)
    block = pool.malloc(MiB)
    gpu.use_stream(None)
    gpu._streams.pop(s1.ptr).destroyed = True
    del s1
    gc.collect()
    del block
    assert ("freeAsync", 0) in gpu.log and gpu.violations == []


def test_the_pool_trims_after_a_device_sync():
    gpu = FakeGPU()
    runtime = FakeRuntime(gpu=gpu)
    pool = CudaAsyncPool(0, runtime=runtime, stream=gpu.current_stream)
    assert runtime.attributes[pool.handle, runtime.cudaMemPoolAttrReleaseThreshold] == \
        2 ** 64 - 1
    other = gpu.create_stream()
    gpu.use_stream(other)
    blocks = [pool.malloc(MiB) for _ in range(4)]
    for b in blocks:
        gpu.launch(b.ptr, MiB)
    del blocks, b
    assert gpu.memory.sync_calls == 0 and pool.used == 0 and pool.held > 0
    gpu.use_stream(None)
    pool.synchronize()
    pool.trim()
    assert pool.held == 0 and gpu.violations == []


# ------------------------------------------------------------- the probe
def test_the_device_layer_says_why_a_part_uses_cudamalloc():
    gpu = FakeGPU()
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(gpu=gpu, vmm=False),
                                   runtime=FakeRuntime(gpu=gpu, pools=False),
                                   stream=gpu.current_stream)
    assert fields["reserve"] is None and fields["heap"] is None
    assert reasons == {"arena": "the device has no virtual memory management",
                       "heap": "the device has no stream-ordered memory pools"}
    assert fields["reasons"] is reasons
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(gpu=gpu, fail={"cuInit": 3}),
                                   runtime=FakeRuntime(gpu=gpu), stream=gpu.current_stream)
    assert fields["reserve"] is None and "cuInit failed" in reasons["arena"]
    assert fields["heap"] is not None and "heap" not in reasons


@pytest.mark.parametrize("code", [NOT_PERMITTED, NOT_SUPPORTED])
@pytest.mark.parametrize("call", ["cuMemAddressReserve", "cuMemCreate", "cuMemMap",
                                  "cuMemSetAccess", "cuMemUnmap", "cuMemAddressFree"])
def test_a_driver_that_says_no_is_found_by_the_probe(call, code):
    gpu = FakeGPU()
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(gpu=gpu, fail={call: code}),
                                   runtime=FakeRuntime(gpu=gpu), stream=gpu.current_stream)
    assert fields["reserve"] is None and fields["heap"] is not None
    assert reasons["arena"].startswith("the driver refused virtual memory management")
    assert call in reasons["arena"] and str(code) in reasons["arena"]


@pytest.mark.parametrize("call", ["memPoolCreate", "memPoolSetAttribute",
                                  "mallocFromPoolAsync", "freeAsync", "memPoolTrimTo"])
def test_a_runtime_that_refuses_its_pool_is_found_by_the_probe(call):
    gpu = FakeGPU()
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(gpu=gpu),
                                   runtime=FakeRuntime(gpu=gpu, fail={call: NOT_SUPPORTED}),
                                   stream=gpu.current_stream)
    assert fields["heap"] is None and fields["reserve"] is not None
    assert reasons["heap"].startswith("the driver refused a stream-ordered pool")


def test_missing_bindings_leave_the_cudamalloc_arena(monkeypatch):
    import sys

    gpu = FakeGPU()
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    fields, reasons = device_layer(0, 8 << 30, runtime=FakeRuntime(gpu=gpu),
                                   stream=gpu.current_stream)
    assert fields["reserve"] is None and "cuda-bindings is not installed" in reasons["arena"]


# ---------------------------------------------------- the engine on the layer
def cuda_engine(gpu, *, vmm=True, pools=True, driver_fail=None, runtime_fail=None,
                chunk=None, stream=None, **options):
    """An engine on the CUDA classes over the stand-ins (the pool's own Backend, without
    CuPy: the stock pool is the host model of CuPy's)."""
    driver = FakeDriver(gpu=gpu, vmm=vmm, fail=driver_fail)
    runtime = FakeRuntime(gpu=gpu, pools=pools, fail=runtime_fail, chunk=chunk)
    layer, _ = device_layer(0, gpu.memory.capacity or 1 << 40, driver=driver, runtime=runtime,
                            stream=stream or gpu.current_stream)
    backend = Backend(allocate=gpu.memory, fallback=HostStockPool(gpu.memory), device_id=0,
                      device=runtime.getDevice, **layer)
    engine = Engine(backend, pool_options(**{**TEST_DEFAULTS, **options}))
    engine.host_memory, engine.host_device = True, gpu.memory
    return engine, driver, runtime


SIZES = [3 * MiB, 5 * MiB + 512, MiB, 7 * MiB, 2 * MiB, 600_000]


def drive(engine, gpu, checker, iterations=9, second=None):
    """Iterations that grow (departures), shrink (trims), carry a survivor, an interruption
    and requests between iterations; every block's bytes checked.  With ``second``, blocks
    of the arena are also used by a kernel on that stream before they are freed."""
    survivor = None
    for it in range(iterations):
        scale = 2 if it in (5, 6) else 1
        with engine.iteration():
            live = []
            for k, size in enumerate(SIZES):
                handle = checker.alloc(engine, size * scale)
                gpu.launch(handle[0].ptr, size * scale)
                arena = engine.hot.arena
                if second is not None and arena is not None and \
                        arena.ptr <= handle[0].ptr < arena.ptr + arena.size:
                    gpu.launch(handle[0].ptr, size * scale, stream=second)
                live.append(handle)
                if k % 2:
                    assert checker.free(live.pop(0))
            with engine.interrupted():
                handle = checker.alloc(engine, 700_000)
                assert checker.free(handle)
            new_survivor = checker.alloc(engine, MiB + 4096)
            gpu.launch(new_survivor[0].ptr, MiB + 4096)
            for handle in live:
                assert checker.intact(handle)
                assert checker.free(handle)
            live.clear()
            handle = None
        if survivor is not None:
            assert checker.free(survivor)
        survivor = new_survivor
        between = checker.alloc(engine, 300_000)  # model weights, a logged value...
        assert checker.free(between)
        between = None
    checker.free(survivor)


def books_add_up(engine, checker):
    stats = engine.stats()
    parts = stats.arena_bytes + stats.old_arena_bytes + stats.exact_bytes + \
        stats.kept_bytes + stats.stock_bytes
    assert parts == stats.total_bytes == engine.total_bytes()
    assert stats.used_bytes == checker.live_bytes
    assert stats.used_bytes + stats.free_bytes == stats.total_bytes and stats.free_bytes >= 0


HEAP_KINDS = {"own": "own heap (reserved range)", "driver": "stream-ordered pool",
              "pages": "page heap (recycled pages)"}


@pytest.mark.parametrize("heap", HEAP_KINDS)
@pytest.mark.parametrize("replan", ["sync", "bestfit"])
def test_the_engine_on_the_cuda_layer_is_checked_block_by_block(replan, heap):
    gpu = FakeGPU()
    engine, _, _ = cuda_engine(gpu, replan=replan, heap=heap)
    checker = Checker(host=True, device=gpu.memory)
    drive(engine, gpu, checker)
    assert checker.corrupted == 0 and checker.overlaps == 0 and gpu.violations == []
    books_add_up(engine, checker)
    stats = engine.stats()
    assert stats.arena_kind == "reserved range" and stats.heap_kind == HEAP_KINDS[heap]
    assert stats.device_reasons == {} and stats.planned_requests > 0


@pytest.mark.parametrize("heap", HEAP_KINDS)
def test_unmapping_at_a_boundary_waits_for_work_on_every_stream(heap):
    """An array of the arena used by a kernel on another stream, freed, then the arena's end
    trimmed: the unmap must follow a device-wide sync (a sync of CuPy's current stream
    leaves the other stream's kernel running on unmapped memory)."""
    gpu = FakeGPU()
    engine, _, _ = cuda_engine(gpu, heap=heap)
    checker = Checker(host=True, device=gpu.memory)
    drive(engine, gpu, checker, second=gpu.create_stream())
    engine.free_all_blocks()  # the arena's idle end goes back between iterations
    assert gpu.violations == [] and checker.corrupted == 0
    assert gpu.calls["cuMemUnmap"] > 0


@pytest.mark.parametrize("heap", HEAP_KINDS)
def test_the_cuda_layer_and_its_host_model_hold_the_same(heap):
    """The engine on CudaRange and CudaAsyncPool and on their host analogues: same footprint,
    same calls that wait for the device, none inside an iteration."""
    pytest.importorskip("cupy")
    import pgmo
    from pgmo.measure import footprint
    from pgmo.runs import run_from_iteration

    trace = pgmo.bundled.load("h100-alexnet-train-b32")
    grads = [b.size for b in trace.blocks if b.upper is None]
    run = run_from_iteration(trace, 5, setup=grads, state=grads)
    results = {}
    for kind in ("cuda", "host"):
        memory = HostMemory()
        if kind == "cuda":
            gpu = FakeGPU(memory)
            layer, reasons = device_layer(0, 64 << 30, driver=FakeDriver(gpu=gpu),
                                          runtime=FakeRuntime(gpu=gpu),
                                          stream=gpu.current_stream)
            assert not reasons
            memory.reset_peak()
            memory.sync_calls = 0  # the probe's
        else:
            layer = pgmo.testing.device_sources(memory)
        pool = pgmo.ProfileGuidedMemoryPool(memory, fallback=HostStockPool(memory),
                                            device_id=0, context=None, device_layer=layer,
                                            total_memory=1 << 40, replan="sync",
                                            method="bestfit", heap=heap,
                                            plan_cache=False)  # both runs cold, compared
        pool.host_memory, pool.host_device = True, memory
        result = footprint.measure(run, pool)
        assert result.completed and result.corrupted == 0
        assert pool.stats().arena_kind == "reserved range"
        assert pool.stats().heap_kind == HEAP_KINDS[heap]
        results[kind] = (result.peak, memory.sync_calls, result.most_syncs_inside())
        pool.close()
    assert results["cuda"] == results["host"]
    assert results["cuda"][2] == 0  # nothing waits for the device inside an iteration


def test_a_refused_map_is_cupys_out_of_memory_with_the_numbers():
    pytest.importorskip("cupy")
    import pgmo
    from cupy.cuda.memory import OutOfMemoryError
    from pgmo.runs import run_from_iteration

    trace = pgmo.bundled.load("h100-alexnet-train-b32")
    run = run_from_iteration(trace, 3)
    gpu = FakeGPU(HostMemory(capacity=run.lower_bound_rounded() // 2))
    layer, _ = device_layer(0, gpu.memory.capacity, driver=FakeDriver(gpu=gpu),
                            runtime=FakeRuntime(gpu=gpu), stream=gpu.current_stream)
    pool = pgmo.ProfileGuidedMemoryPool(gpu.memory, fallback=HostStockPool(gpu.memory),
                                        device_id=0, context=None, device_layer=layer,
                                        total_memory=gpu.memory.capacity, replan="sync",
                                        method="bestfit")
    pool.host_memory, pool.host_device = True, gpu.memory
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating [\d,]+ bytes"):
        pgmo.testing.replay_run(run, pool, write=False)


def test_memory_summary_says_why_the_arena_is_a_cudamalloc():
    pytest.importorskip("cupy")
    import pgmo

    gpu = FakeGPU()
    layer, _ = device_layer(0, 1 << 34, driver=FakeDriver(gpu=gpu, vmm=False),
                            runtime=FakeRuntime(gpu=gpu), stream=gpu.current_stream)
    pool = pgmo.ProfileGuidedMemoryPool(gpu.memory, fallback=HostStockPool(gpu.memory),
                                        device_id=0, context=None, device_layer=layer,
                                        total_memory=1 << 34)
    pool.host_memory, pool.host_device = True, gpu.memory
    summary = pool.memory_summary()
    assert "arena" in summary and "the device has no virtual memory management" in summary
    assert pool.stats().device_reasons == {
        "arena": "the device has no virtual memory management"}
    trace = pgmo.Trace.from_tuples([(0, 0, 2, 4 * MiB)])
    pgmo.testing.replay([trace] * 2, pool)  # warm-up and profile: the plan is being made
    assert pool.engine.planner.wait_idle(60)
    pgmo.testing.replay(trace, pool)  # installed at this boundary
    assert pool.stats().arena_kind == "cudaMalloc"
    assert pool.stats().heap_kind == "stream-ordered pool"
    pool.close()


# ------------------------------------------------------------ another device
class DeviceAwareStock(HostStockPool):
    """CuPy's stock pool serves the current device: record which device each block is for."""

    def __init__(self, memory, gpu):
        super().__init__(memory)
        self.gpu = gpu
        self.devices: list[int] = []

    def malloc(self, size):
        self.devices.append(self.gpu.device)
        return super().malloc(size)


def test_requests_under_another_device_go_to_cupys_pool_for_that_device():
    gpu = FakeGPU(devices=2)
    driver, runtime = FakeDriver(gpu=gpu), FakeRuntime(gpu=gpu)
    layer, _ = device_layer(0, 1 << 40, driver=driver, runtime=runtime,
                            stream=gpu.current_stream)
    stock = DeviceAwareStock(gpu.memory, gpu)
    engine = Engine(Backend(allocate=gpu.memory, fallback=stock, device_id=0,
                            device=runtime.getDevice, **layer),
                    pool_options(**TEST_DEFAULTS))
    engine.host_memory, engine.host_device = True, gpu.memory
    checker = Checker(host=True, device=gpu.memory)
    drive(engine, gpu, checker, iterations=4)  # planned on device 0
    heap_calls = gpu.calls["mallocFromPoolAsync"]
    gpu.set_device(1)
    before = len(stock.devices)
    between = checker.alloc(engine, 300_000)  # between iterations, under device 1
    with engine.iteration():
        assert engine.mode == "fallback"
        blocks = [checker.alloc(engine, s) for s in SIZES]
    assert stock.devices[before:] == [1] * (1 + len(SIZES))
    assert gpu.calls["mallocFromPoolAsync"] == heap_calls and gpu.violations == []
    for handle in blocks + [between]:
        checker.free(handle)
    del blocks, between, handle
    gpu.set_device(0)
    with engine.iteration():
        assert engine.mode == "optimized"
    assert checker.corrupted == 0 and checker.overlaps == 0


# ------------------------------------------------------------- fault injection
DRIVER_CALLS = ["cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                "cuMemRelease", "cuMemUnmap", "cuMemAddressFree"]
RUNTIME_CALLS = ["memPoolCreate", "memPoolSetAttribute", "memPoolGetAttribute",
                 "mallocFromPoolAsync", "freeAsync", "memPoolTrimTo", "memPoolDestroy",
                 "deviceSynchronize"]
#: Calls whose failure for good may leave memory the driver never takes back.
GIVING_BACK = {"cuMemUnmap", "cuMemAddressFree", "freeAsync", "memPoolTrimTo",
               "memPoolDestroy", "deviceSynchronize"}


@pytest.mark.parametrize("heap", HEAP_KINDS)
@pytest.mark.parametrize("code", [OUT_OF_MEMORY, NOT_SUPPORTED], ids=["oom", "not-supported"])
@pytest.mark.parametrize("start", [0, 2], ids=["from-the-first-use", "later"])
@pytest.mark.parametrize("call", DRIVER_CALLS + RUNTIME_CALLS)
def test_every_cuda_call_failing_costs_no_block_lent_twice(call, start, code, heap, caplog):
    """Every CUDA call of the device layer fails, from its first use (the probe's) or later
    (in the run), with out-of-memory or with another code: the run completes (a part falls
    back) or stops with CuPy's out-of-memory error at a request; no block is lent twice, the
    books add up, and once the pool and its blocks are gone the device holds nothing (but
    what a call that gives memory back, failing for good, could not give back)."""
    caplog.set_level(logging.ERROR, logger="pgmo.pool")
    gpu = FakeGPU(HostMemory(capacity=1 << 30))
    fail = {call: (code, start)}
    engine, _, _ = cuda_engine(gpu, driver_fail=fail if call in DRIVER_CALLS else None,
                               runtime_fail=fail if call in RUNTIME_CALLS else None, heap=heap)
    checker = Checker(host=True, device=gpu.memory)
    try:
        drive(engine, gpu, checker, second=gpu.create_stream())
        stopped = False
    except MemoryError:
        assert code == OUT_OF_MEMORY  # CuPy's error, at the request: only for a full device
        stopped = True
    assert checker.corrupted == 0 and checker.overlaps == 0 and gpu.violations == []
    gc.collect()
    if stopped:  # the blocks went with the stopped run's frames, unchecked
        checker.live_bytes = 0
    books_add_up(engine, checker)
    engine.free_all_blocks()
    if call not in GIVING_BACK:
        del engine
        gc.collect()
        assert gpu.memory.in_use == 0


def test_a_range_the_driver_will_not_close_keeps_no_caller_alive(caplog):
    """A range that dies where the driver refuses its unmaps logs one warning; the frame it
    died in, and the arrays that frame holds, go at once (no cycle through the error's
    traceback for the collector to find later: a block would stay counted in use)."""
    import weakref

    PAGE = 2 << 20  # the stand-in driver's granule
    gpu = FakeGPU()
    rng = CudaRange(2 * PAGE, 0, PAGE, driver=FakeDriver(gpu=gpu, fail={"cuMemUnmap": 801}),
                    synchronize=lambda: None)
    rng.map(0, PAGE)

    class Array:  # what the caller's frame holds
        pass

    held = Array()
    alive = weakref.ref(held)

    def drops_the_range(array):
        nonlocal rng
        rng = None  # its __del__ runs here: close() is refused

    gc.disable()
    try:
        drops_the_range(held)
        del held
        assert alive() is None
    finally:
        gc.enable()
    assert "could not give its reserved range back" in caplog.text


@pytest.mark.parametrize("joins", [True, False])
def test_the_probe_finds_whether_one_unmap_gives_back_several_mappings(joins):
    """One ``cuMemUnmap`` over a run of whole mappings where the driver takes it (NVIDIA's
    samples do it), else one call per mapping; a page heap's stale pages likewise."""
    PAGE = 2 << 20
    gpu = FakeGPU(HostMemory(joins_unmaps=joins))
    driver = FakeDriver(gpu=gpu)
    fields, reasons = device_layer(0, 1 << 40, driver=driver, runtime=FakeRuntime(gpu=gpu),
                                   stream=gpu.current_stream)
    assert reasons == {} and fields["reserve"].joins_unmaps is joins
    rng = fields["reserve"](16 * PAGE)
    assert rng.joins_unmaps is joins
    rng.map(0, 4 * PAGE, PAGE)
    before = gpu.calls["cuMemUnmap"]
    rng.synchronize()
    rng.unmap(PAGE, 3 * PAGE)  # three mappings
    assert gpu.calls["cuMemUnmap"] - before == (1 if joins else 3)
    assert rng.mappings() == [(0, PAGE)] and gpu.violations == []
    pages = [rng.create_page() for _ in range(3)]
    for k, handle in enumerate(pages):
        rng.map_page((8 + k) * PAGE, handle)
    before = gpu.calls["cuMemUnmap"]
    if joins:
        rng.unmap_pages(8 * PAGE, 3)
    else:
        with pytest.raises(ValueError, match="one mapping per call"):
            rng.unmap_pages(8 * PAGE, 3)
        assert gpu.calls["cuMemUnmap"] == before  # refused before the driver was asked
        for k in range(3):
            rng.unmap_page((8 + k) * PAGE)
    assert gpu.calls["cuMemUnmap"] - before == (1 if joins else 3)
    for handle in pages:
        rng.release_page(handle)
    assert rng.pages_held == 0 and gpu.violations == []
    rng.unmap(0, PAGE)
    rng.close()


@pytest.mark.parametrize("heap", HEAP_KINDS)
def test_the_engine_on_a_driver_that_unmaps_one_mapping_per_call(heap):
    gpu = FakeGPU(HostMemory(joins_unmaps=False))
    engine, _, _ = cuda_engine(gpu, replan="sync", heap=heap)
    checker = Checker(host=True, device=gpu.memory)
    drive(engine, gpu, checker)
    assert checker.corrupted == 0 and checker.overlaps == 0 and gpu.violations == []
    books_add_up(engine, checker)
    assert engine.stats().device_reasons == {}


# ------------------------------------------------ a Ctrl-C inside the range's calls
#: Where a real Ctrl-C lands (``Injector(real=True)``: a SIGINT just before the line): any
#: line of the range's own code, its checked calls included.
RANGE_FILES = tuple(str(Path(module.__file__).resolve()) for module in (cuda, cuda_calls))


def _pages_range(joins):
    gpu = FakeGPU()
    driver = FakeDriver(gpu=gpu)
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver, synchronize=gpu.sync_device)
    r.joins_unmaps = gpu.memory.joins_unmaps = joins
    return gpu, driver, r


def _grown(r):
    r.map(0, 6 * MiB, piece=2 * MiB)


def _paged(r):
    pages = [r.create_page() for _ in range(3)]
    for k, page in enumerate(pages):
        r.map_page(16 * MiB + k * 2 * MiB, page)
    r.release_page(pages[0])
    return pages


RANGE_STEPS = {
    "map": (lambda r: None, lambda r, _: r.map(0, 8 * MiB, piece=2 * MiB)),
    "unmap": (_grown, lambda r, _: r.unmap(0, 6 * MiB)),
    "unmap the top": (_grown, lambda r, _: r.unmap(4 * MiB, 2 * MiB)),
    "create a page": (lambda r: None, lambda r, _: r.create_page()),
    "map a page": (lambda r: r.create_page(), lambda r, page: r.map_page(0, page)),
    "map pages": (lambda r: [r.create_page() for _ in range(3)],
                  lambda r, pages: r.map_pages(0, pages)),
    "unmap pages": (_paged, lambda r, _: r.unmap_pages(16 * MiB, 3 if r.joins_unmaps else 1)),
    "release a page": (_paged, lambda r, pages: r.release_page(pages[1])),
    "close": (_paged, lambda r, _: r.close()),
}


def _driver_truth(driver, r):
    """The mappings the driver holds in the range."""
    host = driver.ranges.get(r.ptr)
    return sorted(host.mappings()) if host is not None else []


@pytest.mark.parametrize("joins", [True, False], ids=["joined unmaps", "one per mapping"])
@pytest.mark.parametrize("step", RANGE_STEPS)
def test_a_ctrl_c_anywhere_in_a_range_call_leaves_the_books_true(step, joins):
    """A Ctrl-C at any line of the range's calls: the call happens wholly or not at all as
    far as the books can tell, so they keep saying what the driver holds (a mapping the
    books call gone may be handed out again; one they call mapped may be used), and the
    range closes with nothing left on the device."""
    prepare, act = RANGE_STEPS[step]
    landed = 0
    # The collector finalizes nothing while the signals land: a range from an earlier step
    # finalized then would take the Ctrl-C in its destructor (where Python drops it).
    gc.collect()
    gc.disable()
    try:
        for at in range(1, 400):
            gpu, driver, r = _pages_range(joins)
            made = prepare(r)
            ctrl_c = Injector(at=at, traced=RANGE_FILES, real=True)
            try:
                with ctrl_c:
                    act(r, made)
            except KeyboardInterrupt:
                landed += 1
            if not ctrl_c.fired:
                break
            where = f"{step}, Ctrl-C at its line {at}"
            if not r._closed:
                assert sorted(r.mappings()) == _driver_truth(driver, r), where
                assert r.mapped == sum(n for _, n in _driver_truth(driver, r)), where
            r.close()
            assert gpu.memory.in_use == 0 and driver.ranges == {}, where
            assert all(h.released for h in driver.handles), where
            assert gpu.violations == [], where
        else:
            pytest.fail("the call never ended")
    finally:
        gc.enable()
        gc.collect()
    assert landed > 3  # the sweep reached the call's lines
