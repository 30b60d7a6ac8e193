"""Deprecated old path of the host model, now in :mod:`pgmo.device`: it goes in the next release.

The host models now live in :mod:`pgmo.device.host_memory`,
:mod:`pgmo.device.host_range`, :mod:`pgmo.device.host_async_pool` and
:mod:`pgmo.device.host_stock_pool`.  Kept so that code importing ``pgmo.host_device``
still runs: it re-exports the same objects and warns once, when first
imported.
"""

import warnings

from .device.host_async_pool import DRIVER_POOL_CHUNK, HostAsyncPool
from .device.host_memory import (DRIVER_PAGE, OWN_PAGES, SMALL_MAX, UNBOUNDED_RESERVATION,
                                 HostMemory)
from .device.host_range import HostRange
from .device.host_stock_pool import HostStockPool

__all__ = ["HostMemory", "HostStockPool", "HostRange", "HostAsyncPool", "DRIVER_PAGE",
           "SMALL_MAX", "DRIVER_POOL_CHUNK", "OWN_PAGES", "UNBOUNDED_RESERVATION"]

warnings.warn("pgmo.host_device moved to pgmo.device (host_memory, host_range, "
              "host_async_pool, host_stock_pool); the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
