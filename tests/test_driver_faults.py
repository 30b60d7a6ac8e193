"""One driver or runtime call failing, at any call: the pool stays safe (rule 7 of memory.py).

Every call pgmo makes to the driver and runtime stand-ins (tests/cuda_standins.py)
is made to fail in turn, once, with a full device's code or another one, while
iterations depart from their plan at a full device, a block outlives its
iteration, an interruption and ``free_all_blocks()`` come in between.  Every
block is checked; no kernel may touch unmapped memory and nothing may be given
back while queued work may use it (``gpu.violations``); a request's error is
CuPy's out-of-memory error or none, and the books add up.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgmo.device.host_memory import HostMemory
from pgmo.measure.replay import Checker
from tests.cuda_standins import INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, FakeGPU
from tests.test_cuda_device import cuda_engine

MiB = 1 << 20


def test_an_old_stream_ordered_pool_is_trimmed_only_after_a_device_sync(caplog):
    """No virtual memory; the driver's pool, with a freed block a kernel still uses, stops
    serving (NOT_SUPPORTED): requests get a cudaMalloc each, the old pool kept for what it
    holds.  At a full device its idle memory goes back (rule 6) after a device sync; the
    old code asked the cudaMalloc heap to sync, which waits for nothing, and trimmed the
    pool under the kernel."""
    caplog.set_level(logging.ERROR, logger="pgmo.pool")
    gpu = FakeGPU(HostMemory(capacity=8 * MiB))
    engine, _, runtime = cuda_engine(gpu, vmm=False, heap="driver")
    checker = Checker(host=True, device=gpu.memory)
    with engine.iteration():
        a = checker.alloc(engine, 2 * MiB)  # from the driver's pool
        gpu.launch(a[0].ptr, 2 * MiB)
        assert checker.free(a)  # freed on its stream: the pool keeps its memory, idle
        a = None
        runtime.fail = {"mallocFromPoolAsync": (NOT_SUPPORTED, 0)}
        b = checker.alloc(engine, 7 * MiB)  # a cudaMalloc: the device is full until the trim
        gpu.launch(b[0].ptr, 7 * MiB)
        assert checker.free(b)
        b = None
    assert gpu.violations == []
    assert "heap" in engine.stats().device_reasons
    assert checker.corrupted == checker.overlaps == 0


#: The driver's and runtime's queries: their failures are the probe's (test_cuda_device.py).
QUERIES = {"cuInit", "cuDeviceGet", "cuDeviceGetAttribute", "cuMemGetAllocationGranularity",
           "deviceGetAttribute", "getDevice", "memPoolGetAttribute"}
HEAPS = {"own": dict(heap="own"), "pages": dict(heap="pages"),
         "driver-no-vmm": dict(heap="driver", vmm=False)}


class OneFailure(dict):
    """The ``k``-th call after :attr:`on` is set fails with ``code`` (``lasting``: and every
    later call of the same name)."""

    def __init__(self, k: int, code: int, lasting: bool):
        super().__init__()
        self.k, self.code, self.lasting = k, code, lasting
        self.n, self.on, self.failed = 0, False, None

    def get(self, name, default=None):
        if not self.on or name in QUERIES:
            return None
        self.n += 1
        if self.n == self.k or (self.lasting and name == self.failed):
            self.failed = name
            return (self.code, 0)
        return None


def departures_with_one_failure(heap: str, k: int, code: int, lasting: bool) -> int:
    """Plan two 2 MiB blocks on an 8 MiB device, then depart from it with the ``k``-th call
    failing; returns the number of calls made after the plan."""
    gpu = FakeGPU(HostMemory(capacity=8 * MiB))
    engine, driver, runtime = cuda_engine(gpu, **HEAPS[heap])
    failure = driver.fail = runtime.fail = OneFailure(k, code, lasting)
    checker = Checker(host=True, device=gpu.memory)

    def alloc(nbytes):
        handle = checker.alloc(engine, nbytes)
        gpu.launch(handle[0].ptr, nbytes)
        return handle

    for _ in range(4):
        with engine.iteration():
            a, b = alloc(2 * MiB), alloc(2 * MiB)
            assert checker.free(a) and checker.free(b)
            a = b = None
    failure.on = True
    survivor = None
    for it, extra in enumerate((5, 7, 0, 3, 5, 0, 1, 0)):
        live = []
        try:
            with engine.iteration():
                live.append(alloc(2 * MiB))  # (one at a time: a handle the checker
                live.append(alloc(2 * MiB))  # lost would be freed unchecked)
                assert checker.free(live.pop(0))
                if extra:
                    live.append(alloc(extra * MiB))  # departs; 2 + 7 MiB: out of memory
                if it == 3:
                    survivor = live.pop()  # outlives the iteration
                if it == 4:
                    with engine.interrupted():
                        live.append(alloc(MiB))
                    engine.free_all_blocks()
                while live:
                    assert checker.free(live.pop())
        except MemoryError as e:  # a request's, and CuPy's kind of error with the numbers
            assert "bytes" in str(e) and any(c.isdigit() for c in str(e)), e
            while live:
                assert checker.free(live.pop())
        if it == 5 and survivor is not None:
            assert checker.free(survivor)
            survivor = None
        assert gpu.violations == [], (it, gpu.violations)
        assert checker.corrupted == checker.overlaps == 0, it
    engine.free_all_blocks()
    stats = engine.stats()
    assert stats.used_bytes == checker.live_bytes == 0
    assert stats.arena_bytes + stats.old_arena_bytes + stats.exact_bytes + stats.kept_bytes \
        + stats.stock_bytes == stats.total_bytes == engine.total_bytes()
    return failure.n


@pytest.mark.parametrize("heap", sorted(HEAPS))
def test_the_departures_make_driver_calls_to_fail(heap):
    """The scenario below does call the driver and runtime after its plan (else failing
    its k-th call would test nothing)."""
    assert departures_with_one_failure(heap, 0, OUT_OF_MEMORY, False) >= 20


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heap=st.sampled_from(sorted(HEAPS)), k=st.integers(1, 80),
       code=st.sampled_from([OUT_OF_MEMORY, NOT_SUPPORTED, INVALID_VALUE]),
       lasting=st.booleans())
@example(heap="driver-no-vmm", k=1, code=NOT_SUPPORTED, lasting=False)  # a trim with no sync
def test_any_one_driver_call_failing_lends_no_block_twice(heap, k, code, lasting):
    """Any one call failing (a full device's code or another), once or from then on: every
    block checked, nothing unmapped or trimmed under queued work, errors are out-of-memory
    errors, and the books add up."""
    caplog_off = logging.getLogger("pgmo.pool")
    level = caplog_off.level
    caplog_off.setLevel(logging.CRITICAL)  # (each fallback says so once: expected here)
    try:
        departures_with_one_failure(heap, k, code, lasting)
    finally:
        caplog_off.setLevel(level)
