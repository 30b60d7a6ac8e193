"""The solver process behind background re-planning, both ends: ``python -m pgmo.engine.worker``.

The solvers are pure Python: run in a thread of the training process they
would hold the GIL for seconds.  So the planner starts this module as a
plain child process (not ``multiprocessing``: its "spawn" start method
re-runs the user's main script in the child) and talks to it over its
standard input and output with length-prefixed pickles of plain data.

Request: ``{"job": id, "lowers": [...], "uppers": [...], "sizes": [...],
"stages": [options dict, ...]}``.  For each stage (say best-fit first, then
``best``) it answers ``{"job": id, "stage": k, "offsets": [...], "optimal":
..., "info": {...}, "seconds": s}`` or ``{"job": id, "stage": k, "error":
"..."}``.  It exits when its input closes (the pool is gone) and, on Linux,
when its parent dies.  It never imports CuPy.

Both ends live here, so that the protocol is read in one place: :class:`Worker`
is the parent's (the planner starts it, sends it work and reads its answers on
a thread), :func:`main` the child's.  Tested in ``tests/test_planner.py``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, Callable

from .wire import receive, send

if TYPE_CHECKING:  # the child imports neither before it solves
    from ..solver import SolverOptions
    from ..trace import Trace

__all__ = ["Worker", "Message", "WORKER_GRACE", "main"]

#: Seconds a worker may take beyond its solve time limits (start-up, best-fit).
WORKER_GRACE = 20.0

#: A worker's answer; None: the worker is gone.
Message = dict[str, Any]


# ------------------------------------------------------------- the parent's end
class Worker:
    """The parent's end: one solver process and the thread that reads its answers
    (``on_message(worker, message)`` hears each answer, None when the worker is gone: the
    planner passes ``Planner._on_message``, which queues it for the planner thread)."""

    def __init__(self, on_message: Callable[[Worker, Message | None], None]):
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "pgmo.engine.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # pipes
        self._input: IO[bytes] = self.proc.stdin
        self._output: IO[bytes] = self.proc.stdout
        self.job: int | None = None  # generation being solved
        self.stages_left = 0
        self.deadline = float("inf")
        self.stopping = False
        self.reader = threading.Thread(target=self._read, args=(on_message,),
                                       name="pgmo-planner-reader", daemon=True)
        self.reader.start()

    def _read(self, on_message: Callable[[Worker, Message | None], None]) -> None:
        while True:
            try:
                message = receive(self._output)
            except Exception:  # a torn message: the worker is broken
                message = None
            if message is None:
                on_message(self, None)
                return
            on_message(self, message)

    def submit(self, generation: int, trace: Trace, stages: list[SolverOptions]) -> None:
        lowers, uppers, sizes = trace.columns()
        self.job, self.stages_left = generation, len(stages)
        budget = sum((s.time_limit or 0.0) * 1.05 for s in stages) + WORKER_GRACE
        self.deadline = time.monotonic() + budget
        send(self._input, {"job": generation, "lowers": lowers, "uppers": uppers,
                               "sizes": sizes,
                               "stages": [dataclasses.asdict(s) for s in stages]})

    @property
    def idle(self) -> bool:
        return self.job is None

    def stop(self) -> None:
        self.stopping = True
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self._input.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kill does not hang
            pass


# -------------------------------------------------------------- the child's end
def _die_with_parent() -> None:
    """Linux: get SIGTERM when the parent dies, so a killed trainer leaves no worker."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:  # best effort: the closed input stream also ends the worker
        pass


def _solve_stages(request: dict, out: BinaryIO) -> None:
    from ..solver import SolverOptions, solve
    from ..trace import Trace

    trace = Trace.from_columns(request["lowers"], request["uppers"], request["sizes"])
    for k, fields in enumerate(request["stages"]):
        started = time.perf_counter()
        try:
            plan = solve(trace, SolverOptions(**fields))
            reply = {"job": request["job"], "stage": k, "offsets": list(plan.offsets),
                     "optimal": plan.optimal, "info": plan.info, "method": plan.method,
                     "seconds": time.perf_counter() - started}
        except Exception as exc:  # reported to the pool, which keeps serving
            reply = {"job": request["job"], "stage": k, "error": f"{type(exc).__name__}: {exc}"}
        send(out, reply)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes our input
    _die_with_parent()
    try:
        os.nice(5)  # the training process comes first
    except OSError:
        pass
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but messages goes to the parent's pipe
    while True:
        request = receive(stdin)
        if request is None:
            return 0
        _solve_stages(request, stdout)


if __name__ == "__main__":
    sys.exit(main())
