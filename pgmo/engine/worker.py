"""The solver process behind background re-planning: ``python -m pgmo.engine.worker``.

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
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import BinaryIO

from .wire import receive, send

__all__ = ["main"]

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
