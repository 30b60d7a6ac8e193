"""A whole run's requests, heard by a CuPy memory hook from the start of the process.

``pgmo.TraceRecorder`` records one iteration; the CPU models of a pool's
footprint (:mod:`pgmo.footprint`, :mod:`pgmo.host_device`) need what comes
before and between iterations too: weights, optimizer state, the warm-up,
gradients kept across iterations.  :class:`RunHook` is installed before the
model is built and hears every malloc and free of whatever pool serves
them (CuPy's, pgmo's: both call CuPy's hooks); ``begin()``/``end()`` mark
the iterations.  :meth:`RunHook.run` replays what it heard into a
:class:`pgmo.runs.RunRecorder`, so the file is a run file of
:mod:`pgmo.runs` (``read_run``), with the caller's provenance in its metadata.

Hook signatures as in ``pgmo.trace_recorder`` (CuPy 14).  The hook only
appends to a list: it runs inside CuPy's allocator, and a free may come from
garbage collection in the middle of anything.  CuPy's hooks are per thread:
frees in another thread are not heard; a request at an address whose free
was not heard ends the old block there (counted as ``frees_not_heard``).
"""

from __future__ import annotations

from typing import Any

from cupy.cuda import memory_hook

from pgmo.runs import Run, RunRecorder, write_run

_MALLOC, _FREE, _BEGIN, _END = range(4)


class RunHook(memory_hook.MemoryHook):
    """Every malloc and free on one device, with iteration marks, into a :class:`Run`."""

    name = "pgmo.RunHook"

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self._log: list[tuple] = []

    # -- CuPy's hook points: append only ----------------------------------------
    def malloc_postprocess(self, device_id=0, size=0, mem_size=0, mem_ptr=0, pmem_id=0,
                           **kwargs) -> None:
        if device_id == self.device_id and size > 0 and mem_ptr:
            self._log.append((_MALLOC, mem_ptr, size, pmem_id))

    def free_preprocess(self, device_id=0, mem_size=0, mem_ptr=0, pmem_id=0, **kwargs) -> None:
        if device_id == self.device_id:
            self._log.append((_FREE, mem_ptr, mem_size, pmem_id))

    # -- iterations ---------------------------------------------------------------
    def begin(self) -> None:
        self._log.append((_BEGIN, 0, 0, 0))

    def end(self) -> None:
        self._log.append((_END, 0, 0, 0))

    def __len__(self) -> int:
        return len(self._log)

    # -- the run ------------------------------------------------------------------
    def run(self, **metadata: Any) -> Run:
        """The run heard so far; ``metadata`` (provenance) goes into its file."""
        recorder = RunRecorder()
        live: dict[int, tuple[int, int]] = {}  # address -> (handle, pooled memory id)
        not_heard = before = 0
        for kind, ptr, size, pmem_id in list(self._log):
            if kind == _MALLOC:
                if ptr in live:  # its free came from another thread
                    recorder.free(live.pop(ptr)[0])
                    not_heard += 1
                live[ptr] = (recorder.alloc(size), pmem_id)
            elif kind == _FREE:
                if ptr in live and live[ptr][1] == pmem_id:
                    recorder.free(live.pop(ptr)[0])
                elif ptr not in live:
                    before += 1  # allocated before the hook was installed
            elif kind == _BEGIN:
                recorder.begin()
            else:
                recorder.end()
        heard = {"device": self.device_id, "events": len(self._log),
                 "frees_not_heard": not_heard, "frees_of_memory_from_before": before,
                 "live_at_end": len(live)}
        return recorder.run(**{**metadata, "recorded_by": "a CuPy memory hook installed "
                                                          "at process start (scripts/run_hook.py)",
                               "heard": heard})

    def save(self, path, **metadata: Any) -> Run:
        """Write the run file (``.run.json.gz`` by convention); returns the run."""
        run = self.run(**metadata)
        write_run(run, path)
        return run
