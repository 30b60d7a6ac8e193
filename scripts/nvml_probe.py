"""A process's peak device memory, seen from outside the pool: NVML sampled on a thread.

What a pool reports (its ``total_bytes``) leaves out what it does not
allocate itself: the CUDA context, cuBLAS workspaces, other pools, and
memory held only between two samples of the pool.  NVML (the driver's
management library, through ``nvidia-ml-py``'s ``pynvml``) reports what the
driver gives the process.  :class:`NvmlPeak` polls it every ``interval``
seconds from a daemon thread and keeps the largest value:

* ``process``: this process's ``usedGpuMemory`` on the device, when the
  driver lists it (``nvmlDeviceGetComputeRunningProcesses``);
* ``device minus idle``: otherwise (a container that hides process ids),
  the device's used memory less what was used when sampling started.

NVML is optional: without ``nvidia-ml-py``, or when NVML cannot start (no
driver, no device), :func:`load_nvml` says why and every measure is None.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("nvml_probe")

#: Seconds between two samples: 10 ms, as the probe of the 2026-11-25 H100 session.
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


class NvmlPeak:
    """Samples one device's memory for one process on a thread; keeps the peak.

    ``nvml``: the ``pynvml`` module, started (:func:`load_nvml`); None makes
    every measure None.  ``start()`` takes the idle reading and starts the
    thread; ``interval_peak()`` returns the peak since its last call (per
    iteration, say); ``stop()`` ends sampling and returns :meth:`summary`.
    """

    def __init__(self, nvml: Any | None, device_index: int = 0, interval: float = INTERVAL,
                 pid: int | None = None):
        self.nvml = nvml
        self.device_index = device_index
        self.interval = interval
        self.pid = os.getpid() if pid is None else pid
        self.idle: int | None = None
        self.samples = 0
        # the most seen, per source; and since the last interval_peak()
        self._peaks: dict[str, int] = {}
        self._since_mark: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None

    # ---------------------------------------------------------------- sampling
    def _process_bytes(self) -> int | None:
        """This process's memory on the device, if the driver lists it."""
        for process in self.nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if process.pid == self.pid and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
        return None

    def sample(self) -> None:
        """One reading of both sources (what the thread does every interval)."""
        if self.nvml is None:
            return
        readings = {"device minus idle": max(0, int(self.nvml.nvmlDeviceGetMemoryInfo(
            self._handle).used) - (self.idle or 0))}
        mine = self._process_bytes()
        if mine is not None:
            readings["process"] = mine
        with self._lock:
            self.samples += 1
            for source, value in readings.items():
                for peaks in (self._peaks, self._since_mark):
                    peaks[source] = max(peaks.get(source, 0), value)

    @property
    def source(self) -> str | None:
        """Which reading the peaks are: the process's own when the driver ever listed it."""
        with self._lock:
            return "process" if "process" in self._peaks else next(iter(self._peaks), None)

    @property
    def peak(self) -> int | None:
        source = self.source
        with self._lock:
            return self._peaks.get(source) if source else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a failing read must not kill the measured run
                log.debug("NVML sample failed", exc_info=True)

    # --------------------------------------------------------------- lifecycle
    def start(self) -> "NvmlPeak":
        if self.nvml is None:
            return self
        self._handle = self.nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        self.idle = int(self.nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        self._thread = threading.Thread(target=self._run, name="nvml-probe", daemon=True)
        self._thread.start()
        return self

    def interval_peak(self) -> int | None:
        """The peak since the last call (or the start), and start a new interval."""
        if self.nvml is None:
            return None
        self.sample()
        source = self.source
        with self._lock:
            value = self._since_mark.get(source)
            self._since_mark = {}
        return value

    def stop(self) -> dict | None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()
        return self.summary()

    def summary(self) -> dict | None:
        """``peak_bytes``, ``source``, ``idle_bytes``, ``samples``, ``interval_ms``; None without NVML."""
        if self.nvml is None:
            return None
        return {"peak_bytes": self.peak, "source": self.source, "idle_bytes": self.idle,
                "samples": self.samples, "interval_ms": round(self.interval * 1e3, 3)}
