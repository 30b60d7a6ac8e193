"""Record a live CuPy program's allocations into a pgmo trace: :class:`TraceRecorder`.

A CuPy memory hook (``cupy.cuda.MemoryHook``) hears every request that a
memory pool serves: CuPy's stock pool, pgmo's pool, any pool that calls
hooks.  Wrap one iteration::

    with pgmo.TraceRecorder() as recorder:
        train_step()
    recorder.save("step.json")          # then: pgmo analyze step.json

Hook signatures followed: CuPy 14, ``cupy/cuda/memory_hook.pyx``:
``malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id)``,
``free_preprocess(device_id, mem_size, mem_ptr, pmem_id)``,
``alloc_postprocess(device_id, mem_size, mem_ptr)``.  Each request is logged
with the size asked for (``size``; the pool rounds it to ``mem_size``) and
its lifetime runs from the pool handing the memory out to the pool taking it
back.  Requests pair with frees by pointer, checked against the pooled
memory's id: a pointer is reused once freed, and a request at a pointer
whose free was not heard (freed in another thread: CuPy's hooks are
per-thread) ends the old block there.  Frees of memory allocated before the
``with`` block are kept as blocks live from the start, blocks still live at
the end as open blocks (see :mod:`pgmo.formats.allocation_log`).

A whole run (:mod:`pgmo.runs`: weights, warm-up and every iteration on one
event clock) is recorded the same way: install the recorder before the model
is built, mark each iteration with :meth:`TraceRecorder.begin` and
:meth:`~TraceRecorder.end`, and take :meth:`~TraceRecorder.run`.

The hooks only append to a list (they run inside CuPy's allocator, and a
free may come from garbage collection in the middle of anything); the trace
is built when asked for.  This module imports CuPy; the rest of pgmo does not.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from cupy.cuda import memory_hook

from .formats import write_trace
from .formats.allocation_log import AllocationLog
from .runs import Run, RunRecorder
from .trace import Trace

__all__ = ["TraceRecorder"]

_MALLOC, _FREE, _DEVICE_ALLOC, _BEGIN, _END = range(5)


class TraceRecorder(memory_hook.MemoryHook):
    """A CuPy memory hook that records every malloc and free into a pgmo trace.

    ``pool``: optional, the pool being recorded (e.g.
    ``cupy.get_default_memory_pool()``); with it the trace also records what
    the pool reserved (``total_bytes()`` at the start plus what it took from
    the device while recording), which ``pgmo analyze`` compares with; when
    the pool gave memory back meanwhile (which hooks do not hear), a note
    says that this is an upper bound.
    Each ``with`` block starts a new recording.
    """

    name = "pgmo.TraceRecorder"

    def __init__(self, pool: Any = None) -> None:
        self.pool = pool
        self._log: list[tuple] = []
        self._reserved_at_start: int | None = None
        self._reserved_at_end: int | None = None

    # -- the context manager --------------------------------------------------
    def __enter__(self) -> "TraceRecorder":
        self._log = []
        self._reserved_at_start = int(self.pool.total_bytes()) if self.pool is not None else None
        self._reserved_at_end = None
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.pool is not None:
            self._reserved_at_end = int(self.pool.total_bytes())

    # -- CuPy's hook points: append only ----------------------------------------
    def malloc_postprocess(self, device_id: int = 0, size: int = 0, mem_size: int = 0,
                           mem_ptr: int = 0, pmem_id: int = 0, **kwargs: Any) -> None:
        self._log.append((_MALLOC, device_id, mem_ptr, size, mem_size, pmem_id))

    def free_preprocess(self, device_id: int = 0, mem_size: int = 0, mem_ptr: int = 0,
                        pmem_id: int = 0, **kwargs: Any) -> None:
        self._log.append((_FREE, device_id, mem_ptr, mem_size, mem_size, pmem_id))

    def alloc_postprocess(self, device_id: int = 0, mem_size: int = 0, mem_ptr: int = 0,
                          **kwargs: Any) -> None:
        if mem_ptr:  # 0: the device allocation failed
            self._log.append((_DEVICE_ALLOC, device_id, mem_ptr, mem_size, mem_size, 0))

    # -- iterations of a whole run -------------------------------------------------
    def begin(self) -> None:
        """An iteration starts now (a mark for :meth:`run`; :meth:`trace` ignores it)."""
        self._log.append((_BEGIN, None, 0, 0, 0, 0))

    def end(self) -> None:
        """The iteration begun last ends now."""
        self._log.append((_END, None, 0, 0, 0, 0))

    # -- results ----------------------------------------------------------------
    def __len__(self) -> int:
        """Events heard so far (mallocs, frees, device allocations and iteration marks)."""
        return len(self._log)

    def trace(self, device: int | None = None) -> Trace:
        """The recording as a trace of one device (default: the one with the most events)."""
        log = [e for e in list(self._log) if e[0] <= _DEVICE_ALLOC]  # a snapshot, no marks
        device = self._device(log, device)
        counts = Counter(e[1] for e in log if e[0] != _DEVICE_ALLOC)
        pairing = AllocationLog()
        pooled_id: dict[int, int] = {}
        zero_size = failed = failed_bytes = unheard = 0
        grown = 0
        for kind, dev, ptr, size, mem_size, pmem_id in log:
            if dev != device:
                continue
            if kind == _DEVICE_ALLOC:
                grown += mem_size
            elif kind == _MALLOC:
                if size <= 0:
                    zero_size += size == 0
                    continue
                if not ptr:  # malloc failed (CuPy reports pointer 0)
                    failed += 1
                    failed_bytes += size
                    continue
                if pairing.live_block(ptr) is not None:  # its free was not heard
                    pairing.free(ptr)
                    unheard += 1
                pairing.alloc(ptr, size)
                pooled_id[ptr] = pmem_id
            elif mem_size > 0:
                if pairing.live_block(ptr) is not None and pooled_id.get(ptr) == pmem_id:
                    pairing.free(ptr)
                elif pairing.live_block(ptr) is None:
                    pairing.free_allocated_before(mem_size)
                # else: the free of another pooled memory at this address, whose
                # malloc was not heard; the live block keeps its address.
        report = {**pairing.report(), "device": device, "devices": sorted(counts),
                  "events": len(log), "zero_size_requests": zero_size,
                  "failed_requests": {"count": failed, "bytes": failed_bytes},
                  "frees_not_heard": unheard}
        metadata: dict[str, Any] = {"source_format": "cupy-memory-hook",
                                    "recorded_by": "pgmo.TraceRecorder", "import": report}
        if self._reserved_at_start is not None:
            peak = self._reserved_at_start + grown
            metadata["reserved_peak"] = peak
            metadata["reserved_by"] = "the CuPy pool"
            end = self._reserved_at_end
            if end is not None and end < peak:  # hooks do not hear memory given back
                metadata["reserved_note"] = (
                    f"the pool gave memory back while recording (it held {end:,} bytes at "
                    f"the end): the reservation shown is an upper bound, its memory at the "
                    f"start plus every device allocation heard")
        return pairing.trace(**metadata)

    @staticmethod
    def _device(log: list[tuple], device: int | None) -> int:
        """``device``, or by default the device with the most mallocs and frees."""
        if device is not None:
            return device
        counts = Counter(e[1] for e in log if e[0] in (_MALLOC, _FREE))
        return min(counts, key=lambda d: (-counts[d], d)) if counts else 0

    def run(self, device: int | None = None, /, **metadata: Any) -> Run:
        """Everything heard on one device, with the iterations marked, as a whole :class:`Run`.

        ``device`` (the id, given by position): as for :meth:`trace`.
        ``metadata`` (provenance, which may name the device too:
        ``device="NVIDIA H100"``) goes into the run's metadata, with
        ``heard``: the events of the device, frees not heard (a request at an
        address still live: its free came from another thread), frees of
        memory allocated before the recorder was installed (left out: the run
        starts with the recorder) and blocks still live at the end (open).
        An iteration still open ends now.
        """
        log = list(self._log)
        device = self._device(log, device)
        recorder = RunRecorder()
        live: dict[int, tuple[int, int]] = {}  # address -> (handle, pooled memory id)
        events = not_heard = before = 0
        for kind, dev, ptr, size, mem_size, pmem_id in log:
            if kind == _BEGIN:
                recorder.begin()
            elif kind == _END:
                recorder.end()
            elif dev != device:
                continue
            elif kind == _MALLOC:
                if size <= 0 or not ptr:  # zero-size or failed: no memory handed out
                    continue
                if ptr in live:  # its free came from another thread
                    recorder.free(live.pop(ptr)[0])
                    not_heard += 1
                live[ptr] = (recorder.alloc(size), pmem_id)
            elif kind == _FREE:
                if ptr in live and live[ptr][1] == pmem_id:
                    recorder.free(live.pop(ptr)[0])
                elif ptr not in live:
                    before += 1  # allocated before the recorder was installed
            else:
                continue  # the pool taking device memory: not a request
            events += 1
        heard = {"device": device, "events": events, "frees_not_heard": not_heard,
                 "frees_of_memory_from_before": before, "live_at_end": len(live)}
        return recorder.run(**{"recorded_by": "pgmo.TraceRecorder", **metadata,
                               "heard": heard})

    def save(self, path: str | os.PathLike, device: int | None = None) -> Trace:
        """Write the trace (pgmo JSON for ``.json``/``.json.gz``, else CSV); returns it."""
        trace = self.trace(device)
        write_trace(trace, path)
        return trace
