"""What a process took from the device, seen from outside its pool: one measurement for every pool.

A pool's own count (``total_bytes``) leaves out what it does not allocate
itself (the CUDA context, cuBLAS workspaces, other pools) and is only as
honest as the pool's bookkeeping; read at iteration ends it also misses what
a pool holds inside an iteration.  :class:`OutsideView` samples readers that
look from outside every pool (``cudaMemGetInfo``'s used bytes, NVML's count
for the process) on a thread, every ``interval`` seconds and at each
:meth:`~OutsideView.mark`, from :meth:`~OutsideView.start` to
:meth:`~OutsideView.stop`: the whole run, warm-up, profiling and re-plans
included, the same way whichever pool serves.  ``start()`` takes each
reader's baseline (call it once the CUDA context exists and before the pool
takes anything): *taken* is the peak less that baseline.

A reader is any callable returning bytes (or None when it cannot tell); one
that raises is counted in ``errors`` and sampling goes on.
"""

from __future__ import annotations

import threading
from typing import Callable

Reader = Callable[[], "int | None"]

#: Seconds between two samples.  The 2026-11-25 H100 probe sampled NVML every 10 ms.
INTERVAL = 0.005


def mem_info_reader(runtime, device_id: int) -> Reader:
    """Device memory in use by everyone (total minus free, ``cudaMemGetInfo``) on ``device_id``.

    ``runtime``: ``cupy.cuda.runtime`` (or a stand-in with the same calls).
    The device is made current first: the sampling thread has none of its own.
    """
    def read() -> int:
        if runtime.getDevice() != device_id:
            runtime.setDevice(device_id)
        free, total = runtime.memGetInfo()
        return int(total) - int(free)

    return read


class OutsideView:
    """Peaks of several outside readings over a whole run and per interval between marks."""

    def __init__(self, readers: dict[str, Reader], interval: float = INTERVAL):
        self.readers = dict(readers)
        self.interval = interval
        self.baseline: dict[str, int | None] = {}
        self.samples = 0
        self.errors = 0
        self._peaks: dict[str, int] = {}
        self._since_mark: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- sampling
    def _read(self) -> dict[str, int]:
        values = {}
        for name, read in self.readers.items():
            try:
                value = read()
            except Exception:  # noqa: BLE001 - a failing read must not stop the measured run
                with self._lock:
                    self.errors += 1
                continue
            if value is not None:
                values[name] = int(value)
        return values

    def sample(self) -> None:
        """One reading of every reader, kept in the whole-run and the interval peaks."""
        values = self._read()
        with self._lock:
            self.samples += 1
            for name, value in values.items():
                for peaks in (self._peaks, self._since_mark):
                    peaks[name] = max(peaks.get(name, value), value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    # --------------------------------------------------------------- lifecycle
    def start(self) -> "OutsideView":
        """Take the baseline (one reading of each) and start sampling on a daemon thread."""
        self.baseline = {name: None for name in self.readers}
        self.baseline.update(self._read())
        self.sample()
        if self.readers:
            self._thread = threading.Thread(target=self._run, name="outside-view", daemon=True)
            self._thread.start()
        return self

    def mark(self) -> dict[str, int | None]:
        """Sample now; the peak of each reading since the last mark (or the start)."""
        self.sample()
        with self._lock:
            out = {name: self._since_mark.get(name) for name in self.readers}
            self._since_mark = {}
        return out

    def peak(self, name: str) -> int | None:
        with self._lock:
            return self._peaks.get(name)

    def taken(self, name: str) -> int | None:
        """The peak less the baseline: what the run took, the context left out."""
        peak, base = self.peak(name), self.baseline.get(name)
        return None if peak is None or base is None else max(0, peak - base)

    def stop(self) -> dict:
        """End sampling; :meth:`summary`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()
        return self.summary()

    def summary(self) -> dict:
        """Per reader ``baseline_bytes``, ``peak_bytes``, ``taken_bytes``; and the sampling."""
        out = {name: {"baseline_bytes": self.baseline.get(name), "peak_bytes": self.peak(name),
                      "taken_bytes": self.taken(name)} for name in self.readers}
        return {"readings": out, "samples": self.samples, "errors": self.errors,
                "interval_ms": round(self.interval * 1e3, 3)}
