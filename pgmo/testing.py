"""Run and check the pool without a GPU: the pool on host memory and ``replay``.

The names users import from here live in :mod:`pgmo.measure`:
:func:`host_pool`, :func:`host_engine`, :func:`host_backend` and
:func:`device_sources` in :mod:`pgmo.measure.hosts` (the pool and its engine
on host memory), :func:`replay`, :func:`replay_run` and :class:`Checker` in
:mod:`pgmo.measure.replay` (drive a pool and check every block).  This module
keeps the short path ``pgmo.testing`` for them; it is not deprecated.
"""

from __future__ import annotations

from .device.host_memory import HostMemory
from .device.host_stock_pool import HostStockPool
from .measure.hosts import (TEST_DEFAULTS, HostFallback, device_sources, host_backend,
                            host_engine, host_pool)
from .measure.replay import (STAMP, WRITES, Allocator, Checker, IteratingAllocator,
                             host_device_of, replay, replay_run)
from .trace import events

# (device_sources, Allocator and IteratingAllocator import from here as well)
__all__ = ["HostMemory", "HostStockPool", "HostFallback", "host_pool", "host_engine",
           "host_backend", "replay", "Checker", "events", "replay_run", "host_device_of",
           "TEST_DEFAULTS", "WRITES", "STAMP"]
