"""Pattern-checked replays of whole runs on a device, measured from outside the pool.

The quick check replays two workloads through pgmo and through CuPy's pool,
on the GPU (or on the stand-ins of :mod:`scripts.gpu_stand_ins`):

* *repeating*: a real trace recorded on the H100 (AlexNet training at batch
  128), made into a run (:func:`pgmo.runs.run_from_iteration`: weights and
  momentum of its gradients' sizes, the iteration repeated);
* *variable*: an encoder-decoder LSTM with random lengths
  (:func:`pgmo.workloads.lstm_random`), a small one.

:func:`replay` drives a pool through a run with :class:`pgmo.measure.replay.Checker`:
a pattern written into each block at its malloc and verified at its free (on
the device through CuPy, or in host memory on the stand-ins), live blocks
checked for shared addresses.  It can also make some requests under a second
stream and queue kernels there that read blocks after the host dropped them,
the way a training loop's work outlives its arrays.  :func:`outside_view`
samples ``cudaMemGetInfo`` and NVML's count for the process the same way for
every pool (the readers ``scripts.bench_memory`` uses).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from pgmo import bundled, workloads
from pgmo.runs import Run, run_from_iteration
from pgmo.measure.replay import Checker

from . import examples, nvml_probe

#: The repeating workload: a trace recorded on the H100, repeated.
REPEATING_TRACE = "h100-alexnet-train-b128"
MEMINFO, NVML = "cudaMemGetInfo", "NVML"


def repeating(iterations: int) -> Run:
    """The real AlexNet b128 iteration, repeated; weights and momentum of its gradients'
    sizes (as ``scripts.bench_footprint`` makes runs of the bundled traces)."""
    trace = bundled.load(REPEATING_TRACE)
    grads = [b.size for b in trace.blocks if b.upper is None]
    return run_from_iteration(trace, iterations, setup=grads, state=grads,
                              workload=f"{REPEATING_TRACE}, {iterations} iterations")


def variable(iterations: int, scale: float) -> Run:
    """A seq2seq LSTM with random lengths (batch 64, 3x512 units at ``scale`` 1)."""
    return workloads.lstm_random(0, iterations=iterations, scale=scale)


def make(name: str, iterations: int, scale: float = 1.0) -> Run:
    if name == "repeating":
        return repeating(iterations)
    if name == "variable":
        return variable(iterations, scale)
    raise ValueError(f"no workload {name!r} (repeating, variable)")


def describe(name: str, iterations: int, scale: float = 1.0) -> str:
    if name == "repeating":
        return f"{REPEATING_TRACE} (real H100 trace), {iterations} iterations"
    return f"lstm-random, {iterations} iterations at scale {scale:g}"


# ------------------------------------------------------------------ measured from outside
def outside_view(gpu) -> tuple[Any, str]:
    """An ``OutsideView`` of the device (``cudaMemGetInfo``, and NVML where it starts),
    started now (the baseline: call it once the CUDA context exists); and why NVML is
    not read ("" when it is)."""
    view_module = examples.load("outside_view")
    readers = {MEMINFO: view_module.mem_info_reader(gpu.runtime, gpu.device_id)}
    readers[MEMINFO]()  # the context exists from here on
    why = gpu.nvml_why if gpu.nvml is None else ""
    if gpu.nvml is not None:
        readers[NVML] = nvml_probe.NvmlReader(gpu.nvml, gpu.device_id)
    return view_module.OutsideView(readers).start(), why


def taken(summary: dict) -> dict:
    """``{"cudaMemGetInfo": bytes, "NVML": bytes}`` taken over the run (peak less the
    baseline), from an ``OutsideView`` summary."""
    return {name: reading["taken_bytes"] for name, reading in summary["readings"].items()}


# ------------------------------------------------------------------ the replay
def replay(gpu, run: Run, pool: Any, *, other: Any = None, other_every: int = 0,
           touch_every: int = 0, touch_ms: float = 0.2, sync_each: bool = True,
           view: Any = None) -> dict:
    """Drive ``pool`` through ``run``, every block pattern-checked.

    ``other``: a second stream; every ``other_every``-th request is made (and
    freed) with it current, and every ``touch_every``-th block is read by a
    kernel queued on it (``touch_ms`` long) that may still run when the host
    drops the block.  ``sync_each``: a device sync at each iteration's end (the
    iteration's time then includes its kernels).  A pool that runs out of
    memory stops the replay: ``oom`` says at which request, every block still
    live is then checked and dropped.  Returns the checker's counts
    (``corrupted``, ``overlaps``), ``requests``, ``iterations``, ``laps_ms``
    (per iteration), ``peak_live_bytes``, ``pending_at_ends`` (iteration ends at
    which the other stream still had work queued) and ``oom``.
    """
    checker = Checker(host=gpu.host, device=gpu.memory, write="ends")
    blocks = run.trace.blocks
    live: dict[int, tuple] = {}
    on_other: set[int] = set()
    begin = getattr(pool, "begin_iteration", None)
    end = getattr(pool, "end_iteration", None)
    laps: list[float] = []
    out: dict[str, Any] = {"requests": 0, "iterations": 0, "oom": None, "pending_at_ends": 0,
                           "touches": 0}
    started = time.perf_counter()
    handle: tuple | None = None
    inside = False
    try:
        for kind, i in run.events():
            if kind == "alloc":
                n = out["requests"]
                elsewhere = other is not None and other_every and n % other_every == 0
                with other if elsewhere else contextlib.nullcontext():
                    try:
                        live[i] = checker.alloc(pool, blocks[i].size)
                    except MemoryError as error:
                        out["oom"] = {"request": n, "iteration": out["iterations"],
                                      "error": f"{type(error).__name__}: {error}"[:300]}
                        break
                if elsewhere:
                    on_other.add(i)
                out["requests"] = n + 1
                if other is not None and touch_every and n % touch_every == 0 \
                        and blocks[i].size:
                    gpu.touch(live[i][0].ptr, blocks[i].size, touch_ms, other)
                    out["touches"] += 1
            elif kind == "free":
                handle = live.pop(i)
                with other if i in on_other else contextlib.nullcontext():
                    checker.free(handle)
                on_other.discard(i)
                handle = None
            elif kind == "begin":
                started = time.perf_counter()
                inside = True
                if begin is not None:
                    begin()
            else:
                inside = False
                if end is not None:
                    end()
                if other is not None and gpu.runtime.streamQuery(other.ptr) != 0:
                    out["pending_at_ends"] += 1
                if sync_each:
                    gpu.runtime.deviceSynchronize()
                laps.append(round((time.perf_counter() - started) * 1e3, 3))
                out["iterations"] += 1
                if view is not None:
                    view.mark()
    finally:
        for i, handle in list(live.items()):
            with other if i in on_other else contextlib.nullcontext():
                checker.free(handle)
        handle = None  # the loop variable must not keep the last block alive
        live.clear()
        if inside and end is not None:  # stopped inside an iteration: it ends here
            end()
    out.update(corrupted=checker.corrupted, overlaps=checker.overlaps,
               checked_bytes=checker.checked_bytes, peak_live_bytes=checker.peak_bytes,
               laps_ms=laps)
    return out
