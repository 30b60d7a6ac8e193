"""The same guarantees against real CuPy on a CUDA device (skipped without one)."""

from __future__ import annotations

import pytest

import pgmo
from pgmo.testing import replay

pytestmark = pytest.mark.gpu

HOT = [(0, 0, 2, 1000), (1, 1, 4, 2000), (2, 3, 6, 3000), (3, 5, 7, 500)]


@pytest.fixture
def cupy():
    import cupy

    yield cupy
    cupy.cuda.Device().synchronize()


def small_bundled():
    from pgmo import bundled

    name = "synthetic-resnet50-infer-b1"
    return bundled.load(name) if name in bundled.names() else pgmo.Trace.from_tuples(HOT)


def test_replay_on_the_device_in_all_modes(cupy):
    trace = small_bundled()
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    res = replay([trace] * 4, pool)
    assert res["corrupted"] == 0 and res["overlaps"] == 0
    assert res["modes"] == ["warmup", "profiling", "optimized", "optimized"]
    assert res["stats"].planned_requests == 2 * len(trace)
    assert res["stats"].fallback_requests == 0
    fb = replay([trace], pool, interrupted=True)
    assert fb["corrupted"] == 0 and fb["modes"] == ["fallback"]


def test_non_hot_replay_on_the_device(cupy):
    a = pgmo.Trace.from_tuples(HOT)
    b = pgmo.Trace.from_tuples([(0, 0, 5, 9000), (1, 1, 2, 100), (2, 2, 6, 3000)])
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    res = replay([a, a, a, b, a, b, b, a], pool)
    assert res["corrupted"] == 0 and res["overlaps"] == 0


def test_set_allocator_and_array_math_under_the_pool(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    with pool:
        assert cupy.cuda.get_allocator() == pool.malloc
        x = cupy.arange(1 << 16, dtype=cupy.float32)
        results = []
        for _ in range(4):
            with pool.iteration():
                y = (x * 2 + 1).sum()
                z = cupy.sqrt(x + 1) @ cupy.ones_like(x)
                results.append((float(y), float(z)))
        assert pool.mode == "optimized"
        assert all(r == results[0] for r in results)
        assert pool.stats().planned_requests > 0
        del x, y, z
    assert cupy.cuda.get_allocator() != pool.malloc


def test_using_allocator_and_byte_counters(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    with cupy.cuda.using_allocator(pool.malloc):
        a = cupy.empty(1000, dtype=cupy.uint8)
        assert pool.used_bytes() == 1024
        assert pool.used_bytes() + pool.free_bytes() == pool.total_bytes()
        del a
    assert pool.used_bytes() == 0
    assert pool.free_bytes() == pool.total_bytes() == 1024
    assert pool.n_free_blocks() == 1
    pool.free_all_blocks()
    assert pool.total_bytes() == 0 and pool.n_free_blocks() == 0


def test_limit_and_out_of_memory(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    pool.set_limit(size=1 << 20)
    assert pool.get_limit() == 1 << 20
    a = pool.malloc(1 << 19)
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match="limit set to"):
        pool.malloc(1 << 20)
    del a


def test_hooks_on_the_device(cupy):
    from cupy.cuda.memory_hooks import LineProfileHook

    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit", warmup=0)
    replay([pgmo.Trace.from_tuples(HOT)], pool)
    hook = LineProfileHook()
    with hook:
        with pool.iteration():
            a = pool.malloc(1000)
            del a
    import io

    out = io.StringIO()
    hook.print_report(file=out)
    assert "1.00KB" in out.getvalue() or "1024" in out.getvalue()


def test_other_stream_is_outside_the_plan(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit", warmup=0)
    replay([pgmo.Trace.from_tuples(HOT)], pool)
    with pool.iteration():
        with cupy.cuda.Stream():
            a = pool.malloc(1000)
        assert pool.stats().foreign_requests == 1
        del a
