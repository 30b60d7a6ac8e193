"""Deprecated old path of :mod:`pgmo.device.cuda`: it goes in the next release.

Kept so that code importing ``pgmo.cuda_device`` still runs: it re-exports the
same objects and warns once, when first imported.
"""

import warnings

from .device.cuda import (CudaAsyncPool, CudaRange, DeviceError, device_layer,
                           vmm_granularity)

__all__ = ["CudaRange", "CudaAsyncPool", "device_layer", "vmm_granularity", "DeviceError"]

warnings.warn("pgmo.cuda_device moved to pgmo.device.cuda; "
              "the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
