"""The host stand-ins for the device: cudaMalloc's accounting and CuPy 14's stock pool.

The footprint figures pgmo reports on the CPU are only as good as these
models, so the stock pool is checked rule by rule and calibrated on the H100:
replaying the DenseNet-BC iterations that CuPy's pool served on 2026-11-25
must reproduce the ``reserved_peak`` it reported there.
"""

from __future__ import annotations

import gc

import pytest

from pgmo import bundled
from pgmo.device.host_async_pool import HostAsyncPool
from pgmo.device.host_memory import OWN_PAGES, HostMemory
from pgmo.device.host_stock_pool import HostStockPool
from pgmo.runs import run_from_iteration

DENSENET = ["h100-densenet-bc100-k12-train-b64-recompute-off-stock",
            "h100-densenet-bc100-k12-train-b64-recompute-on-stock"]


def drive(pool, run):
    """Replay ``run``'s allocs and frees through ``pool.malloc``; the blocks live meanwhile."""
    blocks, live = run.trace.blocks, {}
    for kind, i in run.events():
        if kind == "alloc":
            live[i] = pool.malloc(blocks[i].size)
        elif kind == "free":
            del live[i]
    return live


@pytest.mark.parametrize("name", DENSENET)
def test_reproduces_what_cupys_pool_reserved_on_the_h100(name):
    """One step on a fresh pool, then the recorded one (as record_traces.py did): within 3%."""
    trace = bundled.load(name)
    assert trace.metadata["pool"] == "stock" and trace.metadata["reserved_by"] == "the CuPy pool"
    memory = HostMemory(page=None)  # bytes as asked: CuPy's own count
    pool = HostStockPool(memory)
    drive(pool, run_from_iteration(trace, 2))
    reserved = trace.metadata["reserved_peak"]
    assert pool.total_bytes() == memory.peak  # a stock pool never gives memory back here
    assert abs(pool.total_bytes() / reserved - 1) <= 0.03, (pool.total_bytes(), reserved)


def test_sizes_round_to_512_and_every_byte_is_counted():
    memory = HostMemory(page=None)
    pool = HostStockPool(memory)
    a = pool.malloc(1)
    b = pool.malloc(513)
    assert (a.size, b.size) == (512, 1024)
    assert pool.used_bytes() == pool.total_bytes() == memory.in_use == 1536
    assert memory.allocations == 2
    del a, b
    assert pool.used_bytes() == 0 and pool.free_bytes() == 1536 == memory.in_use


def test_smallest_fitting_chunk_is_split_and_the_rest_stays_free():
    memory = HostMemory(page=None)
    pool = HostStockPool(memory)
    big, small = pool.malloc(4096), pool.malloc(2048)
    big_ptr = big.ptr
    del big, small
    c = pool.malloc(1024)  # takes the 2048 chunk (smallest that fits), not the 4096 one
    assert c.ptr != big_ptr
    d = pool.malloc(1024)  # the rest of that chunk
    assert pool.total_bytes() == 6144 and memory.allocations == 2
    assert abs(d.ptr - c.ptr) == 1024


def test_a_freed_chunk_merges_with_its_free_neighbours():
    memory = HostMemory(page=None)
    pool = HostStockPool(memory)
    whole = pool.malloc(3 * 512)
    base = whole.ptr
    del whole
    parts = [pool.malloc(512) for _ in range(3)]
    assert sorted(p.ptr - base for p in parts) == [0, 512, 1024]
    assert pool.n_free_blocks() == 0
    del parts[1]
    assert pool.n_free_blocks() == 1
    parts.clear()
    assert pool.n_free_blocks() == 1  # one chunk again
    again = pool.malloc(3 * 512)
    assert again.ptr == base and memory.allocations == 1


def test_free_all_blocks_releases_unsplit_chunks_only():
    memory = HostMemory(page=None)
    pool = HostStockPool(memory)
    a, b = pool.malloc(2048), pool.malloc(1024)
    del a
    pinned = pool.malloc(512)  # splits a's chunk: it cannot go back while pinned lives
    del b
    pool.free_all_blocks()
    assert pool.total_bytes() == 2048 == memory.in_use  # b's whole chunk went back
    del pinned
    pool.free_all_blocks()
    assert pool.total_bytes() == 0 == memory.in_use


def test_a_full_device_releases_the_cache_and_retries():
    memory = HostMemory(capacity=4096, page=None)
    pool = HostStockPool(memory)
    a = pool.malloc(3072)
    del a
    b = pool.malloc(4096)  # 3072 cached + 4096 > capacity: release, then allocate
    assert b.size == 4096 and memory.in_use == 4096
    with pytest.raises(MemoryError, match="4,096"):
        pool.malloc(512)
    assert pool.total_bytes() == 4096  # a failed allocation is not counted


def test_the_retry_collects_garbage_first():
    memory = HostMemory(capacity=2048, page=None)
    pool = HostStockPool(memory)
    cycle = [pool.malloc(2048)]
    cycle.append(cycle)  # only the cycle collector frees it
    del cycle
    gc.disable()
    try:
        assert pool.malloc(2048).size == 2048
    finally:
        gc.enable()


def test_the_limit_fails_at_once_without_releasing_the_cache():
    memory = HostMemory(page=None)
    pool = HostStockPool(memory, oom_error=lambda size, total, limit: MemoryError(
        f"limit {limit} reached with {total} held, asking {size}"))
    pool.set_limit(size=2048)
    a = pool.malloc(1024)
    del a
    with pytest.raises(MemoryError, match="limit 2048 reached with 1024 held, asking 1536"):
        pool.malloc(1536)  # CuPy raises here: the cached 1024 bytes stay
    assert pool.total_bytes() == 1024 and pool.get_limit() == 2048


def test_host_memory_counts_calls_bytes_and_peak():
    memory = HostMemory(capacity=1 << 20, page=None)
    a = memory(1000)
    b = memory(2000)
    assert (memory.in_use, memory.peak, memory.allocations) == (3000, 3000, 2)
    del a
    memory.reset_peak()
    assert (memory.in_use, memory.peak, memory.releases) == (2000, 2000, 1)
    with pytest.raises(MemoryError, match="host device full"):
        memory(1 << 20)
    assert memory.in_use == 2000 and memory.allocations == 2
    del b
    assert memory.in_use == 0


@pytest.mark.parametrize("size", [1000, OWN_PAGES, OWN_PAGES + 4096])
def test_small_and_large_buffers_are_aligned_writable_and_given_back(size):
    """Buffers from 4 MiB on are pages of their own (mmap); both kinds behave the same."""
    import ctypes

    memory = HostMemory()
    buffer = memory(size)
    assert buffer.ptr % 512 == 0 and memory.holds(buffer.ptr, size)
    ctypes.memset(buffer.ptr, 0xAB, size)  # the whole range is ours to write
    assert ctypes.string_at(buffer.ptr + size - 4, 4) == b"\xab" * 4
    ptr = buffer.ptr
    del buffer
    assert memory.in_use == 0 and memory.releases == 1 and not memory.holds(ptr, 1)


def test_a_buffer_larger_than_the_host_can_map_is_a_memory_error():
    memory = HostMemory()
    with pytest.raises(MemoryError, match="cannot allocate"):
        memory(1 << 62)
    assert memory.in_use == 0


# ------------------------------------------------------------ the driver's pages
MiB = 1 << 20
PAGE = 2 * MiB


def test_large_allocations_take_whole_pages_and_small_ones_share_them():
    memory = HostMemory()
    big = memory(3 * MiB)  # > 1 MiB: two pages of its own
    assert memory.in_use == 2 * PAGE and memory.bytes_in_use == 3 * MiB
    small = [memory(300_000) for _ in range(6)]  # 1.8 MB: packed into one shared page
    assert memory.in_use == 3 * PAGE
    small.append(memory(300_000))  # no room left in that page: a second one
    assert memory.in_use == 4 * PAGE
    del small[:6]  # the first page still holds nothing: given back
    assert memory.in_use == 3 * PAGE
    del small, big
    assert memory.in_use == 0 and memory.bytes_in_use == 0


def test_a_page_stays_held_while_any_small_allocation_in_it_lives():
    memory = HostMemory()
    keep = memory(1000)
    others = [memory(100_000) for _ in range(10)]
    del others
    assert memory.in_use == PAGE  # pinned by the one small buffer left
    del keep
    assert memory.in_use == 0


def test_the_capacity_counts_pages_not_bytes():
    memory = HostMemory(capacity=4 * MiB)
    a = memory(1_100_000)  # one page
    b = memory(1_100_000)  # another
    with pytest.raises(MemoryError, match="host device full"):
        memory(1_100_000)  # 3.3 MB of bytes, but 6 MiB of pages
    del a, b


def test_every_cudafree_counts_as_a_synchronizing_call():
    memory = HostMemory()
    buffers = [memory(4096) for _ in range(3)]
    assert memory.sync_calls == 0  # cudaMalloc does not wait for the device here
    del buffers
    assert memory.sync_calls == memory.releases == 3


# ------------------------------------------------------------ virtual memory
@pytest.mark.parametrize("joins", [True, False])
def test_a_reserved_range_is_mapped_and_unmapped_in_whole_mappings(joins):
    memory = HostMemory(capacity=16 * MiB, joins_unmaps=joins)
    r = memory.reserve()
    assert r.size == 32 * MiB and r.ptr % PAGE == 0 and memory.in_use == 0
    r.map(0, 4 * MiB)
    r.map(4 * MiB, 2 * MiB)
    assert memory.in_use == r.mapped == 6 * MiB and memory.maps == 2
    assert memory.holds(r.ptr + 5 * MiB, MiB) and not memory.holds(r.ptr + 6 * MiB, 1)
    with pytest.raises(ValueError, match="ends inside a mapping"):
        r.unmap(0, 2 * MiB)  # the driver never unmaps part of a mapping
    with pytest.raises(ValueError, match="already mapped"):
        r.map(2 * MiB, 2 * MiB)
    with pytest.raises(ValueError, match="whole granules"):
        r.map(6 * MiB, 1000)
    r.synchronize()
    with pytest.raises(ValueError, match="not a run of whole mappings"):
        r.unmap(2 * MiB, 4 * MiB)  # nor a run that starts inside one
    assert memory.in_use == 6 * MiB and len(r.mappings()) == 2
    r.unmap(0, 6 * MiB)  # two mappings: one cuMemUnmap for both where the device joins them
    assert memory.in_use == 0 and memory.sync_calls == 1  # the sync: the unmaps wait on none
    assert memory.unmaps == memory.release_calls == (1 if joins else 2)
    assert r.mappings() == []
    with pytest.raises(MemoryError, match="host device full"):
        r.map(0, 18 * MiB)  # past the capacity, as a full device refuses
    r.close()


def test_mapped_granules_are_writable_and_an_unmapped_one_faults():
    """A stale access after unmapping must fault, as it would on the GPU (run in a child)."""
    import subprocess
    import sys

    code = """if True:
        import ctypes
        from pgmo.device.host_memory import HostMemory
        memory = HostMemory()
        r = memory.reserve(8 << 20)
        r.map(0, 2 << 20)
        ctypes.memset(r.ptr, 7, 2 << 20)
        assert ctypes.string_at(r.ptr + 100, 1) == b"\\x07"
        r.unmap(0, 2 << 20)
        print("unmapped", flush=True)
        ctypes.memset(r.ptr, 7, 16)
        print("no fault")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith("unmapped") and "no fault" not in done.stdout
    assert done.returncode == -11, done.stderr  # SIGSEGV


def test_a_page_mapped_at_two_addresses_shares_its_bytes_and_is_counted_once():
    """cuMemCreate's handle mapped twice (the page heap remaps a recycled page before its
    old mapping is dropped): one page of memory, two mappings in the books."""
    import ctypes

    memory = HostMemory(capacity=4 * PAGE)
    r = memory.reserve(16 * PAGE)
    page = r.create_page()
    r.map_page(0, page)
    r.map_page(5 * PAGE, page)
    assert memory.in_use == r.pages_held == PAGE and memory.maps == 2
    assert r.mapped == 0  # no memory of the range's own (map/unmap) is held
    ctypes.memset(r.ptr, 9, 64)
    assert ctypes.string_at(r.ptr + 5 * PAGE, 4) == b"\x09" * 4
    with pytest.raises(ValueError, match="already mapped"):
        r.map_page(0, r.create_page())
    r.release_page(page)  # released while mapped: its memory waits for the last unmap
    assert memory.in_use == 2 * PAGE
    r.synchronize()
    r.unmap_page(0)
    assert not memory.holds(r.ptr, 1) and memory.holds(r.ptr + 5 * PAGE, PAGE)
    r.unmap_page(5 * PAGE)
    assert memory.in_use == PAGE and memory.unmaps == memory.release_calls == 2
    with pytest.raises(ValueError, match="released"):
        r.map_page(0, page)
    with pytest.raises(ValueError, match="no page"):
        r.unmap_page(0)
    r.close()
    assert memory.in_use == 0


def test_a_full_device_refuses_a_page():
    memory = HostMemory(capacity=2 * PAGE)
    r = memory.reserve(8 * PAGE)
    r.create_page(), r.create_page()
    with pytest.raises(MemoryError, match="host device full"):
        r.create_page()
    assert memory.in_use == r.pages_held == 2 * PAGE
    r.close()
    assert memory.in_use == 0


# ------------------------------------------------------- a stream-ordered pool
def test_a_stream_ordered_pool_reuses_what_it_holds_and_trims_in_one_call():
    memory = HostMemory()
    pool = HostAsyncPool(memory)
    blocks = [pool.malloc(MiB) for _ in range(8)]  # 8 MiB: four granules
    assert pool.held == memory.in_use == 8 * MiB and pool.used == 8 * MiB
    del blocks[2:6]  # frees are stream-ordered: no device sync
    again = pool.malloc(2 * MiB)  # fits in the memory the pool holds: nothing new mapped
    assert pool.held == 8 * MiB and memory.sync_calls == 0
    del again
    pool.synchronize()
    released = pool.trim()  # [2, 6) MiB is free: granule [2, 4) MiB and [4, 6) MiB go back
    assert released == 4 * MiB and pool.held == memory.in_use == 4 * MiB
    assert memory.sync_calls == memory.release_calls == 1  # the device sync, one trim call
    del blocks
    pool.trim()
    assert pool.held == memory.in_use == 0


def test_the_driver_clock_adds_each_calls_fitted_cost():
    """What a boundary's calls would take on the GPU the model was fitted to: one joined
    unmap of three mappings costs one call's fixed part, three calls cost three."""
    from pgmo.device.host_memory import call_cost_us
    from pgmo.device.params import PARAMS

    unmap = PARAMS["call_us"]["cuMemUnmap"]
    assert call_cost_us("cuMemUnmap", 1 << 30) == pytest.approx(unmap["fixed"] + unmap["per_gib"])
    assert call_cost_us("a call never measured") == 0.0
    spent = {}
    for joins in (True, False):
        memory = HostMemory(joins_unmaps=joins)
        r = memory.reserve(16 * PAGE)
        r.map(0, 3 * PAGE, PAGE)
        mapped = memory.driver_us
        assert mapped == pytest.approx(3 * (call_cost_us("cuMemCreate", PAGE)
                                            + call_cost_us("cuMemMap", PAGE)
                                            + call_cost_us("cuMemRelease"))
                                       + call_cost_us("cuMemSetAccess", 3 * PAGE))
        r.synchronize()
        r.unmap(0, 3 * PAGE)
        spent[joins] = memory.driver_us - mapped
        assert memory.driver_calls["cuMemUnmap"] == (1 if joins else 3)
        r.close()
    assert spent[True] == pytest.approx(call_cost_us("cuMemUnmap", 3 * PAGE))
    assert spent[False] == pytest.approx(3 * call_cost_us("cuMemUnmap", PAGE))
    assert spent[False] - spent[True] == pytest.approx(2 * unmap["fixed"])


def test_a_grant_over_several_pages_costs_its_own_fitted_line_where_a_gpu_measured_it(
        monkeypatch):
    from pgmo.device import host_memory

    memory = HostMemory()
    r = memory.reserve(16 * PAGE)
    pages = [r.create_page() for _ in range(4)]
    before = memory.driver_us
    r.map_pages(0, pages[:3])  # not measured: a grant of that size over one mapping
    assert memory.driver_us - before == pytest.approx(
        3 * host_memory.call_cost_us("cuMemMap", PAGE)
        + host_memory.call_cost_us("cuMemSetAccess", 3 * PAGE))
    monkeypatch.setitem(host_memory._CALL_US, host_memory.RUN_ACCESS,
                        {"fixed": 100.0, "per_gib": 0.0})
    before = memory.driver_us
    r.map_pages(8 * PAGE, pages[3:])  # one page: the plain line
    assert memory.driver_us - before == pytest.approx(
        host_memory.call_cost_us("cuMemMap", PAGE)
        + host_memory.call_cost_us("cuMemSetAccess", PAGE))
    r.unmap_pages(0, 3)
    before = memory.driver_us
    r.map_pages(0, pages[:3])  # three pages: the run's line
    assert memory.driver_us - before == pytest.approx(
        3 * host_memory.call_cost_us("cuMemMap", PAGE) + 100.0)
    assert memory.driver_calls["cuMemSetAccess"] == 3 and memory.driver_calls["cuMemMap"] == 7
    r.close()


def test_a_joined_unmap_costs_its_own_fitted_line_where_a_gpu_measured_it(monkeypatch):
    from pgmo.device import host_memory

    line = {"fixed": 100.0, "per_gib": 0.0}
    monkeypatch.setitem(host_memory._CALL_US, host_memory.RUN_UNMAP, line)
    memory = HostMemory()
    r = memory.reserve(16 * PAGE)
    r.map(0, 3 * PAGE, PAGE)
    r.map(3 * PAGE, PAGE)
    r.synchronize()
    before = memory.driver_us
    r.unmap(3 * PAGE, PAGE)  # one mapping: the plain line
    assert memory.driver_us - before == pytest.approx(host_memory.call_cost_us("cuMemUnmap",
                                                                               PAGE))
    before = memory.driver_us
    r.unmap(0, 3 * PAGE)  # three in one call: the run's line
    assert memory.driver_us - before == pytest.approx(100.0)
    assert memory.driver_calls["cuMemUnmap"] == 2
    r.close()


def test_a_closed_range_holds_nothing_and_its_flags_are_zero_again():
    """After ``close`` nothing of the range counts as mapped: the checker sees any use of
    its addresses as a use after free."""
    memory = HostMemory(capacity=64 << 20)
    rng = memory.reserve(16 << 20)
    g = rng.granule
    rng.map(0, 2 * g)
    assert rng.holds(rng.ptr, g) and memory.holds(rng.ptr, g)
    rng.close()
    assert not rng.holds(rng.ptr, g) and not memory.holds(rng.ptr, g)
    assert rng.mapped == 0 and rng._backed[0] == rng._open[0] == 0
