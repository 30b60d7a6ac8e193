"""The pool's CuPy face on the host backend: what CuPy users rely on, without a GPU."""

from __future__ import annotations

import dataclasses
import gc
import re
from pathlib import Path

import pytest

cupy = pytest.importorskip("cupy")

from cupy.cuda import memory_hook  # noqa: E402
from cupy.cuda.memory import MemoryPointer, OutOfMemoryError  # noqa: E402

import pgmo  # noqa: E402
from pgmo.stats import PoolStats  # noqa: E402
from pgmo.testing import host_pool as _host_pool  # noqa: E402


def host_pool(*args, **kwargs):
    """A host pool on a device of 512-byte pages: the byte counts these tests check are exact
    (the driver's 2 MiB pages are tested in test_host_device and test_footprint)."""
    return _host_pool(*args, **{"page": 512, **kwargs})

HOT = [(0, 0, 2, 1000), (1, 1, 4, 2000), (2, 3, 6, 3000), (3, 5, 7, 500)]


def hot_trace():
    return pgmo.Trace.from_tuples(HOT)


def run(pool, trace=None, n=1):
    return pgmo.replay([trace or hot_trace()] * n, pool)


def assert_byte_invariants(pool, used: int):
    """CuPy's counters agree with each other and with the stats, and ``used`` is in use."""
    assert pool.used_bytes() == used
    free, total = pool.free_bytes(), pool.total_bytes()
    assert free >= 0 and used + free == total
    st = pool.stats()
    assert (st.used_bytes, st.free_bytes, st.total_bytes) == (used, free, total)
    assert st.peak_used_bytes >= used and st.peak_total_bytes >= total


def test_is_a_cupy_memory_pool_whose_stats_count_what_happened():
    pool = host_pool(warmup=1)
    assert isinstance(pool, cupy.cuda.MemoryPool)
    assert isinstance(pool, pgmo.ProfileGuidedMemoryPool)
    run(pool, n=3)  # warm-up, profiled, optimized
    st = pool.stats()
    assert isinstance(st, PoolStats)
    assert (st.mode, st.iterations, st.iteration_source, st.replan) == \
        ("optimized", 3, "marked", "sync")
    assert (st.requests, st.profiled_requests, st.planned_requests) == (12, 8, 4)
    assert st.departed_requests == st.departures == st.reoptimizations == 0
    assert st.planned_peak == st.lower_bound == 2048 + 3072 and st.planned_blocks == 4
    assert st.arena_bytes == 5120 and st.used_bytes == 0
    assert st.total_bytes == st.free_bytes == st.arena_bytes  # cached blocks were released
    assert st.peak_used_bytes == 5120 and st.plan_method == "bestfit"
    assert pool.memory_summary().startswith("pgmo memory summary")
    assert "5.00 KiB" in pool.memory_summary()


def test_every_stat_is_documented_for_users():
    """Each field has a comment in the dataclass, and the module says what CuPy and PyTorch call it."""
    source = Path(pgmo.stats.__file__).read_text()
    for field in dataclasses.fields(PoolStats):
        assert re.search(rf"^    {field.name}: \w+(  # .+)?$", source, re.M), field.name
    for name in ("used_bytes", "total_bytes", "peak_used_bytes", "peak_total_bytes",
                 "max_memory_allocated", "max_memory_reserved", "reset_peak_stats"):
        assert name in pgmo.stats.__doc__, name


def test_every_public_method_and_the_stats_say_what_a_user_may_rely_on():
    """The docstrings are the API reference: none of the pool's public methods without one."""
    for name, member in vars(pgmo.ProfileGuidedMemoryPool).items():
        if not name.startswith("_") and callable(getattr(member, "fget", member)):
            assert (getattr(member, "__doc__", None) or "").strip(), name
    assert "stock pool" in pgmo.ProfileGuidedMemoryPool.interrupted.__doc__
    assert "exactly one" in PoolStats.__doc__ and "frozen" in PoolStats.__doc__


def test_without_a_gpu_the_pool_names_the_cause_and_the_host_pool():
    """One pgmo error, not CuPy's driver traceback: on any machine, with no GPU visible."""
    import subprocess
    import sys

    code = ("import pgmo\n"
            "try:\n"
            "    pgmo.ProfileGuidedMemoryPool()\n"
            "except pgmo.NoGPUError as e:\n"
            "    print(type(e.__cause__).__name__, e.__suppress_context__)\n"
            "    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ,
                                            "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    suppressed, message = done.stdout.splitlines()
    assert suppressed == "NoneType True"  # one error in the traceback: CuPy's is its context
    assert message.startswith("ProfileGuidedMemoryPool needs a GPU that CuPy can use, and "
                              "CuPy sees none (")
    assert message.endswith("without a GPU, pgmo.testing.host_pool() runs the same pool on "
                            "host memory")


def test_each_request_gets_its_own_memory_object_rounded_like_cupy():
    pool = host_pool(warmup=0)
    run(pool, n=1)
    assert pool.mode == "optimized"
    with pool.iteration():
        a = pool.malloc(1000)
        b = pool.malloc(2000)
        assert isinstance(a, MemoryPointer)
        assert a.mem is not b.mem
        assert a.mem.size == 1024 and b.mem.size == 2048
        assert a.ptr % 512 == 0 and b.ptr % 512 == 0
        base = pool.engine.hot.arena.ptr
        assert a.ptr == base + pool.plan.offsets[0]
        del a
        c = pool.malloc(3000)
        del b
        d = pool.malloc(500)
        del c, d
    st = pool.stats()
    assert st.planned_requests == 4 and st.departed_requests == 0


def test_size_zero_is_a_null_pointer_and_not_a_request():
    pool = host_pool()
    with pool.iteration():
        p = pool.malloc(0)
        assert p.ptr == 0 and p.mem.size == 0
    assert pool.stats().requests == 0


def test_byte_counters_hold_in_every_mode():
    pool = host_pool(warmup=1)
    assert_byte_invariants(pool, 0)
    with pool.iteration():  # warm-up
        held = pool.malloc(4096)
        assert_byte_invariants(pool, 4096)
    run(pool)  # profiled
    assert pool.mode == "optimized"
    with pool.iteration():
        a = pool.malloc(1000)
        assert a.ptr == pool.engine.hot.arena.ptr + pool.plan.offsets[0]
        assert_byte_invariants(pool, 4096 + 1024)
        with pool.interrupted():
            assert pool.mode == "fallback"
            x = pool.malloc(10_000)
            assert_byte_invariants(pool, 4096 + 1024 + 10_240)
        del a, x
    assert_byte_invariants(pool, 4096)
    assert pool.stats().peak_used_bytes == 4096 + 1024 + 10_240
    del held
    assert pool.used_bytes() == 0
    assert pool.total_bytes() == pool.free_bytes() > 0
    assert pool.n_free_blocks() >= 1
    pool.free_all_blocks()
    assert pool.used_bytes() == 0
    assert pool.total_bytes() == pool.free_bytes() == 0  # idle arena released too
    assert pool.n_free_blocks() == 0
    run(pool, n=2)  # the arena comes back on the next iteration
    assert pool.stats().arena_bytes > 0 and pool.stats().departed_requests == 0


def test_peaks_of_memory_held_count_every_raw_allocation():
    """max_memory_reserved: what was held at the worst moment, even after it is given back."""
    pool = host_pool(warmup=1)
    with pool.iteration():  # warm-up: the stock pool grows to 30 KiB
        blocks = [pool.malloc(10_240) for _ in range(3)]
    assert pool.total_bytes() == 30_720
    del blocks
    pool.free_all_blocks()
    st = pool.stats()
    assert st.total_bytes == 0 and st.peak_total_bytes == 30_720
    pool.reset_peak_stats()
    assert pool.stats().peak_total_bytes == 0
    with pool.iteration():
        a = pool.malloc(10_240)
    assert pool.stats().peak_total_bytes == 10_240
    del a


def test_set_limit_get_limit_like_cupy(monkeypatch):
    pool = host_pool(capacity=1 << 20)
    assert pool.get_limit() == 0
    pool.set_limit(size=4096)
    assert pool.get_limit() == 4096
    pool.set_limit(fraction=0.5)
    assert pool.get_limit() == 1 << 19
    pool.set_limit()
    assert pool.get_limit() == 0
    with pytest.raises(ValueError, match="fraction out of range"):
        pool.set_limit(fraction=1.5)
    with pytest.raises(ValueError, match="cannot be specified at one time"):
        pool.set_limit(size=1, fraction=0.5)
    with pytest.raises(ValueError, match="size out of range"):
        pool.set_limit(size=-1)
    monkeypatch.setenv("CUPY_GPU_MEMORY_LIMIT", "123456")
    assert host_pool().get_limit() == 123456
    monkeypatch.setenv("CUPY_GPU_MEMORY_LIMIT", "25%")
    assert host_pool(capacity=1 << 20).get_limit() == 1 << 18


def test_limit_caps_arena_plus_fallback_and_raises_out_of_memory():
    pool = host_pool()
    pool.set_limit(size=8192)
    a = pool.malloc(4096)
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating 8,192 bytes.*"
                                               r"limit set to: 8,192 bytes"):
        pool.malloc(8000)
    del a
    b = pool.malloc(8000)  # the cached 4096-byte block is released, then it fits
    assert pool.total_bytes() <= 8192
    del b


def test_out_of_memory_after_releasing_cached_fallback_blocks():
    pool = host_pool(capacity=16384)
    blocks = [pool.malloc(4096) for _ in range(4)]
    del blocks
    assert pool.free_bytes() == 16384
    big = pool.malloc(16384)  # needs the cached blocks released first
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating 512 bytes "
                                               r"\(allocated so far: 16,384 bytes\)"):
        pool.malloc(1)
    del big


def test_a_size_no_device_has_is_cupys_out_of_memory_in_every_mode():
    pool = host_pool(warmup=1)
    seen = []
    for _ in range(3):
        with pool.iteration():
            seen.append(pool.mode)
            with pytest.raises(OutOfMemoryError):
                pool.malloc(1 << 63)
            block = pool.malloc(1000)  # and the pool goes on serving
            del block
    with pytest.raises(OutOfMemoryError):
        pool.malloc(1 << 63)  # outside iterations: CuPy's stock pool says the same
    assert seen == ["warmup", "profiling", "optimized"]
    assert pool.stats().planned_requests == 1 and pool.mode == "optimized"


def test_arena_respects_the_limit_and_falls_back():
    pool = host_pool(warmup=0)
    pool.set_limit(size=6000)
    res = run(pool, n=3)
    assert res["corrupted"] == 0
    st = pool.stats()
    assert st.total_bytes <= 6000


class Recorder(memory_hook.MemoryHook):
    name = "pgmo-test-recorder"

    def __init__(self):
        self.calls = []

    def malloc_postprocess(self, **kw):
        self.calls.append(("malloc", kw["mem_size"], kw["mem_ptr"]))

    def free_postprocess(self, **kw):
        self.calls.append(("free", kw["mem_size"], kw["mem_ptr"]))

    def alloc_postprocess(self, **kw):
        self.calls.append(("alloc", kw["mem_size"], kw["mem_ptr"]))


def test_memory_hooks_see_pgmo_allocations_and_frees():
    pool = host_pool(warmup=0)
    run(pool)
    hook = Recorder()
    with hook:
        with pool.iteration():
            a = pool.malloc(1000)
            ptr = a.ptr
            del a
            with pool.interrupted():
                x = pool.malloc(5000)
                xptr = x.ptr
                del x
    assert ("malloc", 1024, ptr) in hook.calls
    assert ("free", 1024, ptr) in hook.calls
    assert ("malloc", 5120, xptr) in hook.calls and ("free", 5120, xptr) in hook.calls
    assert hook.calls.index(("malloc", 1024, ptr)) < hook.calls.index(("free", 1024, ptr))


def test_a_failed_arena_allocation_still_reaches_the_post_hooks():
    """As in CuPy, alloc_postprocess runs when the allocation fails, with mem_ptr=0 (on a
    device without virtual memory management, where the arena is a cudaMalloc)."""
    pool = host_pool(capacity=8192, warmup=0, vmm=False, stream_pool=False)
    hook = Recorder()
    with hook:
        with pool.iteration():  # profiled: 4 KiB at most; the plan wants a 4 KiB arena
            a, b = pool.malloc(2048), pool.malloc(2048)
            del a, b
            with pool.interrupted():
                x = pool.malloc(6144)  # still held when the arena is taken: no room
    assert ("alloc", 4096, 0) in hook.calls
    assert pool.stats().arena_failures == 1 and pool.mode == "fallback"
    del x


def test_debug_print_hook_runs_on_pgmo_blocks():
    import io

    from cupy.cuda.memory_hooks import DebugPrintHook

    pool = host_pool(warmup=0)
    run(pool)
    buf = io.StringIO()
    with DebugPrintHook(file=buf):
        with pool.iteration():
            a = pool.malloc(1000)
            del a
    out = buf.getvalue()
    assert '"hook":"malloc"' in out and '"hook":"free"' in out


def test_install_uninstall_and_context_manager_restore_the_allocator():
    before = cupy.cuda.get_allocator()
    pool = host_pool()
    pool.install()
    assert cupy.cuda.get_allocator() == pool.malloc
    mem = cupy.cuda.memory.alloc(100)
    assert isinstance(mem, MemoryPointer) and pool.used_bytes() == 512
    del mem
    pool.uninstall()
    assert cupy.cuda.get_allocator() is before
    with pool:
        assert cupy.cuda.get_allocator() == pool.malloc
    assert cupy.cuda.get_allocator() is before
    with pytest.raises(RuntimeError, match="uninstall"):
        pool.uninstall()


def test_using_allocator_routes_to_the_pool():
    pool = host_pool()
    with cupy.cuda.using_allocator(pool.malloc):
        mem = cupy.cuda.memory.alloc(3000)
        assert pool.used_bytes() == 3072
        del mem
    assert pool.used_bytes() == 0


def test_exception_inside_iteration_is_not_used_as_profile():
    pool = host_pool(warmup=0)
    with pytest.raises(KeyError):
        with pool.iteration():
            a = pool.malloc(1000)
            raise KeyError("boom")
    del a
    assert pool.plan is None and pool.mode == "profiling"
    run(pool)
    assert pool.plan is not None


def test_blocks_outlive_the_pool_and_keep_only_their_arena():
    gc.collect()
    gc.disable()  # the pool must not need the cycle collector to go away
    try:
        pool = host_pool(warmup=0)
        run(pool, n=2)
        with pool.iteration():
            kept = pool.malloc(1000)
            kept_fb = None
            with pool.interrupted():
                kept_fb = pool.malloc(7000)
        memory = pool.host_device
        arena_bytes = pool.stats().arena_bytes
        del pool
        assert memory.in_use == arena_bytes + 7168  # the arena and the fallback block
        kept.mem.ptr  # still a valid object
        del kept, kept_fb  # late frees: harmless, and they release the memory
        assert memory.in_use == 0
    finally:
        gc.enable()


def test_line_profile_hook_counts_pgmo_bytes():
    import io

    from cupy.cuda.memory_hooks import LineProfileHook

    pool = host_pool(warmup=0)
    run(pool)
    hook = LineProfileHook()
    with hook:
        with pool.iteration():
            a = pool.malloc(1000)  # from the arena
            b = pool.malloc(2000)
            del a, b
    out = io.StringIO()
    hook.print_report(file=out)
    assert "3.00KB" in out.getvalue()  # 1024 + 2048 bytes reported as used


def test_optimize_and_explicit_iteration_calls():
    pool = host_pool(warmup=3)
    trace = hot_trace()
    pgmo.replay([trace], pool)  # one warm-up iteration only
    assert pool.plan is None and pool.mode == "warmup"
    plan = pool.optimize()  # solve what was recorded, use it from the next iteration
    assert pool.plan is plan and pool.mode == "optimized"
    assert plan.peak >= plan.lower_bound == pool.stats().lower_bound > 0
    assert [b.size for b in pool.profile] == [1024, 2048, 3072, 512]
    pool.begin_iteration()
    a = pool.malloc(1000)
    assert a.ptr == pool.engine.hot.arena.ptr + plan.offsets[0]
    del a
    pool.end_iteration()
    assert pool.stats().iterations == 2


def test_request_counters_add_up():
    pool = host_pool(warmup=1)
    res = pgmo.replay([hot_trace()] * 3, pool)
    assert res["corrupted"] == 0
    st = res["stats"]
    assert st.requests == 12
    assert st.profiled_requests + st.planned_requests + st.departed_requests == 12
    assert st.planned_peak <= st.arena_bytes
    assert st.peak_used_bytes >= st.planned_peak


def test_taking_the_arena_releases_blocks_cached_while_profiling():
    pool = host_pool(warmup=1)
    run(pool, n=2)  # warm-up and profiled iterations, served and cached by the fallback
    assert pool.mode == "optimized"
    arena = pool.stats().arena_bytes
    assert arena > 0
    # Only the arena is held: the fallback's cached blocks were given back.
    assert pool.total_bytes() == arena
    assert pool.used_bytes() == 0


def test_a_request_makes_one_cuda_call_as_cupys_own_pool_does():
    """On a GPU each request names its device and stream.  CuPy's pool makes one runtime
    call per malloc (cudaGetDevice; the stream pointer is a thread-local read); pgmo's
    context must make no more, on every path (counted with stand-ins for the runtime)."""
    from pgmo.host_device import HostMemory, HostStockPool
    from pgmo.pool import ProfileGuidedMemoryPool, cuda_context

    calls = {"cudaGetDevice": 0, "stream lookups": 0}

    class Null:
        ptr = 0

    def get_device():
        calls["cudaGetDevice"] += 1
        return 0

    def get_stream(device=-1):
        if device < 0:  # as cupy.cuda.get_current_stream() does without a device
            calls["cudaGetDevice"] += 1
        calls["stream lookups"] += 1
        return Null

    memory = HostMemory()
    pool = ProfileGuidedMemoryPool(memory, fallback=HostStockPool(memory, OutOfMemoryError),
                                   device_id=0, context=cuda_context(get_device, get_stream),
                                   total_memory=2 ** 40, replan="sync", method="bestfit")
    pool.host_memory = True
    run(pool, n=3)  # warm-up, profiling, the first planned iteration
    assert pool.mode == "optimized"
    for key in calls:
        calls[key] = 0
    result = run(pool)
    assert result["stats"].planned_requests == 2 * len(HOT)
    # one per request, and one as the iteration starts (it notes its device and stream)
    assert calls == {"cudaGetDevice": len(HOT) + 1, "stream lookups": len(HOT) + 1}
    pool.close()
