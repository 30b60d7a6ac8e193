"""The CUDA device layer (pgmo.cuda_device) against stand-in driver and runtime modules.

The stand-ins (tests/cuda_standins.py) keep their memory on the host, so a
pool built on the CUDA classes runs the engine's real path and every block
is checked; what the tests add is what the driver is asked, and what
happens when it refuses or is missing.
"""

from __future__ import annotations

import pytest

from pgmo.cuda_device import CudaAsyncPool, CudaRange, device_layer
from pgmo.host_device import HostMemory

from .cuda_standins import OUT_OF_MEMORY, FakeDriver, FakeRuntime

MiB = 1 << 20


def test_a_range_maps_granules_with_access_and_releases_each_handle():
    driver = FakeDriver()
    r = CudaRange(64 * MiB, device_id=0, granule=2 * MiB, driver=driver)
    r.map(0, 4 * MiB)
    names = [c[0] for c in driver.calls]
    assert names == ["cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                     "cuMemRelease"]
    assert all(h.released for h in driver.handles)  # unmapping frees the memory
    assert r.mapped == driver.memory.in_use == 4 * MiB
    r.map(4 * MiB, 2 * MiB)
    r.unmap(0, 6 * MiB)  # two mappings: one cuMemUnmap each
    assert [c[0] for c in driver.calls].count("cuMemUnmap") == 2
    assert r.mapped == driver.memory.in_use == 0
    with pytest.raises(ValueError, match="whole granules"):
        r.map(1000, 2 * MiB)
    r.close()
    assert driver.calls[-1][0] == "cuMemAddressFree"


def test_a_full_device_is_a_memory_error_and_nothing_stays_mapped():
    driver = FakeDriver(HostMemory(capacity=4 * MiB))
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    r.map(0, 2 * MiB)
    with pytest.raises(MemoryError, match="cuMemCreate: out of device memory"):
        r.map(2 * MiB, 4 * MiB)
    assert r.mappings() == [(0, 2 * MiB)]


def test_a_failed_map_releases_its_handle():
    driver = FakeDriver(fail={"cuMemMap": 1})
    r = CudaRange(64 * MiB, 0, 2 * MiB, driver=driver)
    with pytest.raises(RuntimeError, match="cuMemMap failed"):
        r.map(0, 2 * MiB)
    assert driver.handles[-1].released and r.mapped == 0


def test_a_pool_block_is_freed_on_the_stream_it_was_allocated_on():
    runtime = FakeRuntime()
    current = [5]
    pool = CudaAsyncPool(0, runtime=runtime, stream=lambda: current[0])
    block = pool.malloc(MiB)
    current[0] = 9  # another stream is current when the block dies
    del block
    assert ("freeAsync", 5) in runtime.calls and ("freeAsync", 9) not in runtime.calls


def test_the_stream_ordered_pool_frees_without_a_sync_and_trims_after_one():
    runtime = FakeRuntime()
    pool = CudaAsyncPool(0, runtime=runtime, stream=lambda: 7)
    assert runtime.attributes[pool.handle, runtime.cudaMemPoolAttrReleaseThreshold] == 2 ** 64 - 1
    blocks = [pool.malloc(MiB) for _ in range(4)]
    assert pool.held == 4 * MiB and pool.used == 4 * MiB
    del blocks
    assert runtime.memory.sync_calls == 0 and pool.used == 0
    pool.synchronize()
    pool.trim()
    assert pool.held == 0 and ("streamSynchronize", 7) in runtime.calls
    assert runtime.memory.sync_calls == 2


def test_the_device_layer_says_why_a_part_uses_cudamalloc():
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(vmm=False),
                                   runtime=FakeRuntime(pools=False), stream=lambda: 0)
    assert fields["reserve"] is None and fields["heap"] is None
    assert reasons == {"arena": "the device has no virtual memory management",
                       "heap": "the device has no stream-ordered memory pools"}
    fields, reasons = device_layer(0, 8 << 30, driver=FakeDriver(fail={"cuInit": 3}),
                                   runtime=FakeRuntime(), stream=lambda: 0)
    assert fields["reserve"] is None and "unavailable" in reasons["arena"]
    assert fields["heap"] is not None and "heap" not in reasons


def test_missing_bindings_leave_the_cudamalloc_arena(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    fields, reasons = device_layer(0, 8 << 30, runtime=FakeRuntime(), stream=lambda: 0)
    assert fields["reserve"] is None and "cuda-bindings is not installed" in reasons["arena"]


def test_a_pool_on_the_cuda_layer_runs_the_real_path_with_every_block_checked():
    """The engine on CudaRange and CudaAsyncPool (stand-in driver): same footprint and the same
    synchronizing calls as on the host analogues, and no address handed out twice."""
    pytest.importorskip("cupy")
    import pgmo
    from pgmo import footprint
    from pgmo.host_device import HostStockPool
    from pgmo.runs import run_from_iteration

    trace = pgmo.bundled.load("h100-alexnet-train-b32")
    grads = [b.size for b in trace.blocks if b.upper is None]
    run = run_from_iteration(trace, 5, setup=grads, state=grads)
    results = {}
    for kind in ("cuda", "host"):
        memory = HostMemory()
        if kind == "cuda":
            layer, reasons = device_layer(0, 64 << 30, driver=FakeDriver(memory),
                                          runtime=FakeRuntime(memory), stream=lambda: 0)
            assert not reasons
        else:
            layer = pgmo.testing.device_sources(memory)
        pool = pgmo.ProfileGuidedMemoryPool(memory, fallback=HostStockPool(memory),
                                            device_id=0, context=None, device_layer=layer,
                                            total_memory=1 << 40, replan="sync",
                                            method="bestfit")
        pool.host_memory, pool.host_device = True, memory
        result = footprint.measure(run, pool)
        assert result.completed and result.corrupted == 0
        assert pool.stats().arena_kind == "reserved range"
        assert pool.stats().heap_kind == "stream-ordered pool"
        results[kind] = (result.peak, memory.sync_calls, result.most_syncs_inside())
        pool.close()
    assert results["cuda"] == results["host"]
    assert results["cuda"][2] == 0  # nothing waits for the device inside an iteration


def test_a_refused_map_is_cupys_out_of_memory_with_the_numbers():
    pytest.importorskip("cupy")
    import pgmo
    from cupy.cuda.memory import OutOfMemoryError
    from pgmo.host_device import HostStockPool
    from pgmo.runs import run_from_iteration

    trace = pgmo.bundled.load("h100-alexnet-train-b32")
    run = run_from_iteration(trace, 3)
    memory = HostMemory(capacity=run.lower_bound_rounded() // 2)
    layer, _ = device_layer(0, memory.capacity, driver=FakeDriver(memory),
                            runtime=FakeRuntime(memory), stream=lambda: 0)
    pool = pgmo.ProfileGuidedMemoryPool(memory, fallback=HostStockPool(memory), device_id=0,
                                        context=None, device_layer=layer,
                                        total_memory=memory.capacity, replan="sync",
                                        method="bestfit")
    pool.host_memory, pool.host_device = True, memory
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating [\d,]+ bytes"):
        pgmo.testing.replay_run(run, pool, write=False)
    assert OUT_OF_MEMORY == 2


def test_memory_summary_says_why_the_arena_is_a_cudamalloc():
    pytest.importorskip("cupy")
    import pgmo
    from pgmo.host_device import HostStockPool

    memory = HostMemory()
    layer, reasons = device_layer(0, 1 << 34, driver=FakeDriver(memory, vmm=False),
                                  runtime=FakeRuntime(memory), stream=lambda: 0)
    pool = pgmo.ProfileGuidedMemoryPool(memory, fallback=HostStockPool(memory), device_id=0,
                                        context=None, device_layer=layer, total_memory=1 << 34)
    pool.device_layer_reasons = reasons  # as the pool's own default layer sets them
    summary = pool.memory_summary()
    assert "arena uses cudaMalloc: the device has no virtual memory management" in summary
    assert pool.stats().arena_kind == "cudaMalloc"
    assert pool.stats().heap_kind == "stream-ordered pool"
    pool.close()
