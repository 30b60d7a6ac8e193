"""The same guarantees against real CuPy on a CUDA device (skipped without one)."""

from __future__ import annotations

import io
import math
import re

import pytest

import pgmo
from pgmo.measure.replay import replay

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
    nbytes = sum(b.size for b in trace)
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    res = replay([trace] * 4, pool)
    # every block was written and read back: a clean result is not an empty one
    assert res["requests"] == 4 * len(trace) and res["checked_bytes"] == 4 * nbytes
    assert res["corrupted"] == 0 and res["overlaps"] == 0
    assert res["modes"] == ["warmup", "profiling", "optimized", "optimized"]
    stats = res["stats"]
    assert stats.planned_requests == 2 * len(trace)
    assert stats.profiled_requests == 2 * len(trace)
    assert stats.departed_requests == 0
    assert stats.arena_bytes >= stats.planned_peak >= stats.lower_bound == trace.lower_bound()
    fb = replay([trace], pool, interrupted=True)
    assert fb["corrupted"] == 0 and fb["modes"] == ["fallback"]
    assert fb["checked_bytes"] == nbytes and fb["stats"].interrupted_requests == len(trace)


def test_non_hot_replay_on_the_device(cupy):
    a = pgmo.Trace.from_tuples(HOT)
    b = pgmo.Trace.from_tuples([(0, 0, 5, 9000), (1, 1, 2, 100), (2, 2, 6, 3000)])
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    res = replay([a, a, a, b, a, b, b, a], pool)
    assert res["corrupted"] == 0 and res["overlaps"] == 0
    assert res["requests"] == 5 * len(a) + 3 * len(b)
    assert res["checked_bytes"] == 5 * sum(x.size for x in a) + 3 * sum(x.size for x in b)
    assert res["modes"] == ["warmup", "profiling"] + ["optimized"] * 6
    stats = res["stats"]
    assert stats.departures >= 1 and stats.reoptimizations >= 1  # b is not a's plan
    assert stats.planned_requests > 0  # and yet most requests came from an arena
    assert stats.profiled_requests + stats.planned_requests + stats.departed_requests == \
        res["requests"]


def test_set_allocator_and_array_math_under_the_pool(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
    n = 1 << 16
    with pool:
        assert cupy.cuda.get_allocator() == pool.malloc
        x = cupy.arange(n, dtype=cupy.float32)
        results, modes = [], []
        for _ in range(4):
            with pool.iteration():
                modes.append(pool.mode)
                y = (x * 2 + 1).sum()
                z = cupy.sqrt(x + 1) @ cupy.ones_like(x)
                results.append((float(y), float(z)))
        assert modes == ["warmup", "profiling", "optimized", "optimized"]
        assert pool.mode == "optimized"
        assert all(r == results[0] for r in results)  # the arena computes what the stock pool did
        # and that is right (float32 sums: loose tolerances, yet far from garbage)
        assert results[0][0] == pytest.approx(float(n) ** 2, rel=1e-3)  # sum of 2i + 1
        assert results[0][1] == pytest.approx(math.fsum(math.sqrt(i + 1) for i in range(n)),
                                              rel=1e-3)
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
    # What the device holds for it: between iterations the request came from pgmo's heap,
    # which maps whole granules (2 MiB on an H100; CuPy's pool counts the 1,024 B asked,
    # though its cudaMalloc also takes device pages): idle now, one free block.
    assert 0 < pool.free_bytes() == pool.total_bytes() <= 2 << 20
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


def test_line_profile_hook_reports_the_planned_request(cupy):
    """CuPy's ``LineProfileHook`` sees pgmo's 1000-byte request once: 1,024 bytes used
    (CuPy's rounding) and none acquired from the device (the arena exists already).

    Its report is one line per stack frame, ``file:line:function (used, acquired)``
    under ``_root (used, acquired)``; the same as the host-memory pool prints in
    ``tests/test_pool.py::test_line_profile_hook_counts_pgmo_bytes``.
    """
    from cupy.cuda.memory_hooks import LineProfileHook

    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit", warmup=0)
    replay([pgmo.Trace.from_tuples(HOT)], pool)
    assert pool.mode == "optimized"
    planned = pool.stats().planned_requests
    hook = LineProfileHook()
    with hook:
        with pool.iteration():
            a = pool.malloc(1000)
            del a
    assert pool.stats().planned_requests == planned + 1  # served from the arena
    out = io.StringIO()
    hook.print_report(file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "_root (1.00KB, 0.00B)"  # not 2.00KB (reported twice), not 0.00B
    assert all(line.endswith(" (1.00KB, 0.00B)") for line in lines), lines
    assert any(re.fullmatch(r" +\S*test_pool_gpu\.py:\d+:"
                            r"test_line_profile_hook_reports_the_planned_request "
                            r"\(1\.00KB, 0\.00B\)", line) for line in lines), lines
    # reported by pgmo itself (CuPy's own pools report from Cython: no Python frame)
    assert re.fullmatch(r" +\S*pgmo[/\\]hooks\.py:\d+:call_hooks \(1\.00KB, 0\.00B\)",
                        lines[-1]), lines


def test_other_stream_is_outside_the_plan(cupy):
    pool = pgmo.ProfileGuidedMemoryPool(method="bestfit", warmup=0)
    replay([pgmo.Trace.from_tuples(HOT)], pool)
    arena, arena_bytes = pool.engine.hot.arena.ptr, pool.stats().arena_bytes
    assert arena_bytes > 0
    with pool.iteration():
        with cupy.cuda.Stream():
            a = pool.malloc(1000)
        assert pool.stats().foreign_requests == 1
        assert not arena <= a.ptr < arena + arena_bytes  # from the fallback, not the plan
        del a
