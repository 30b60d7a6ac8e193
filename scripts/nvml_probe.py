"""A process's device memory seen from outside the pool: NVML, as a reader of ``OutsideView``.

What a pool reports (its ``total_bytes``) leaves out what it does not
allocate itself: the CUDA context, cuBLAS workspaces, other pools, and
memory held only between two readings of the pool.  NVML (the driver's
management library, through ``nvidia-ml-py``'s ``pynvml``) reports what the
driver gives the process.  :class:`NvmlReader` is one reading of it, which
``examples/outside_view.OutsideView`` samples on its thread beside
``cudaMemGetInfo``, the same way for every pool:

* ``process``: this process's ``usedGpuMemory`` on the device, when the
  driver lists it (``nvmlDeviceGetComputeRunningProcesses``);
* ``device``: otherwise (a container that hides process ids), the device's
  used memory; the view's baseline (taken once the CUDA context exists)
  leaves the context and other processes out.

The source is chosen at the first reading (the baseline) and kept, so that
a peak and its baseline are always of one source.  NVML is optional:
without ``nvidia-ml-py``, or when NVML cannot start (no driver, no device),
:func:`load_nvml` says why and no reader is made.
"""

from __future__ import annotations

import os
from typing import Any

#: Seconds between two samples of the 2026-11-25 H100 session's outside probe.
INTERVAL = 0.01


def load_nvml() -> tuple[Any | None, str]:
    """``(pynvml, "")`` with NVML started, or ``(None, why not)``."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError: no driver, no device, no permission
        return None, f"NVML did not start: {error}"
    return pynvml, ""


class NvmlReader:
    """One device's memory for one process, read through NVML (a callable returning bytes).

    ``nvml``: the ``pynvml`` module, started (:func:`load_nvml`), or a stand-in
    with the same calls.  ``source`` is ``"process"`` or ``"device"`` once read.
    """

    def __init__(self, nvml: Any, device_index: int = 0, pid: int | None = None):
        self.nvml = nvml
        self.pid = os.getpid() if pid is None else pid
        self.source: str | None = None
        self._handle = nvml.nvmlDeviceGetHandleByIndex(device_index)

    def _process_bytes(self) -> int | None:
        for process in self.nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if process.pid == self.pid and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
        return None

    def __call__(self) -> int | None:
        if self.source != "device":
            mine = self._process_bytes()
            if self.source is None:
                self.source = "device" if mine is None else "process"
            if self.source == "process":
                return mine
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
