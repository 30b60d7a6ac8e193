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

from pgmo.device.host_memory import HostMemory
from pgmo.measure.replay import Checker
from tests.cuda_standins import NOT_SUPPORTED, OUT_OF_MEMORY, FakeGPU
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
