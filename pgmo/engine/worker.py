"""The planning process behind background re-planning, both ends: ``python -m pgmo.engine.worker``.

Planning is pure Python: on a thread of the training process it would share
the interpreter lock with training, and every millisecond it held the lock
would be one the training loop could not launch work in.  So in background
mode every step of planning happens here, in a plain child process (not
``multiprocessing``: its "spawn" start method re-runs the user's main script
in the child): folding each iteration's log into the profile, the paper's
best-fit, the full method, and the plan's check and compilation into the
hot path's rows.  The training process only sends logs and installs the
rows it gets back, at an iteration boundary.

The two talk over the worker's standard input and output with
length-prefixed pickles of plain data (:mod:`.wire`).  Requests, answered
in order:

``{"op": "fold", "job": j, "kind": "profile" | "merge", "log": (lowers, uppers, sizes),
"base": None | (lowers, uppers, sizes), "stages": [options dict, ...]}``
    Fold a log into the profile this process keeps (``"profile"``: the log
    is the new profile; ``base``: start from this profile, one the planner
    got elsewhere), as :func:`.profiles.absorb` does.  Answer ``{"op":
    "profile", "job": j, "changed": bool, "varying": bool, "kind": ...,
    "columns": ..., "lower_bound": ..., "arena_lower_bound": ...}``; if it
    changed, plan it stage by stage (best-fit first, then the full method,
    stopping at the lower bound) and answer each stage with a ``"plan"``.
``{"op": "solve", "job": j, "columns": (lowers, uppers, sizes), "stages": [...]}``
    Plan a profile of its own (a recurring shape's), stage by stage.
``{"op": "finish"}``
    The pool is going away: searches stop (their requests end ``cancelled``),
    what is queued is answered, plans to keep are kept.
``{"op": "keep", "job": j, ...}``
    Keep an installed plan in the plan cache (:func:`pgmo.plan_cache.keep_from_request`:
    the warm-up plans are made, and the entry written, here); answered with ``done``
    alone.  Not stopped by ``finish``; one that a newer keep follows in the queue is
    dropped (a pool's newer plan supersedes its older ones).

A ``"plan"`` answer is ``{"op": "plan", "job": j, "stage": k, "offsets": [...],
"method": ..., "seconds": s, "optimal": ..., "info": {...}, "rows": [...],
"pinned": [...]}`` or ``{"op": "plan", "job": j, "stage": k, "error": "..."}``;
every request ends with ``{"op": "done", "job": j, "cancelled": bool}``.  Once
started and ready to plan, the worker says ``{"op": "ready"}``.  What it logs at
warning level or above goes to the planner as ``{"op": "log", "logger": name,
"level": n, "message": text}``, logged there (a folder the plan cache cannot
write, say).  A
fold that arrives while an older one is being searched stops that search
(its remaining stages are dropped): the newer profile is the one to plan.
The same log again, after it was folded without change, is answered at once
(no fold): a plan that lands late is departed from the same way at every
iteration, and the planner sends at most a few logs ahead of the folds
(:data:`~.planner.FOLDS_WAITING`).

It exits when its input closes (the pool is gone) and, on Linux, when its
parent dies.  It never imports CuPy.

Both ends live here, so that the protocol is read in one place: :class:`Worker`
is the parent's (the planner starts it, and writes its requests and reads its
answers on two threads), :class:`_Planning` and :func:`main` the child's.
Tested in ``tests/test_planner.py`` and ``tests/test_planner_failures.py``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable

from .wire import receive, send

__all__ = ["Worker", "Message", "WORKER_GRACE", "WALL_FACTOR", "CANCELLED_CLOCK_JUMP", "budget",
           "cpu_seconds", "main"]

#: Seconds a worker may take beyond a request's solve time limits (start-up, best-fit).
WORKER_GRACE = 20.0
#: Seconds a cancelled search's clock jumps ahead: every deadline it keeps has passed.
CANCELLED_CLOCK_JUMP = 1e9


#: A worker silent this many times its budget in wall-clock time is stopped, whatever CPU it
#: got (a process stopped, or starved for minutes); within it, it is judged by its CPU time.
WALL_FACTOR = 10.0


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) process ``pid`` has used, from ``/proc``; None where the
    system has no ``/proc`` (the planner then judges its worker by the wall clock)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after the name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    except (OSError, ValueError, IndexError, ZeroDivisionError):
        return None


try:
    _TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - no sysconf: no /proc
    _TICKS = 100.0


def budget(stages: list[dict[str, Any]]) -> float:
    """Seconds a worker may take to answer a request of these stages (options dicts) to the
    end: their time limits, and :data:`WORKER_GRACE`."""
    return sum((s["time_limit"] or 0.0) * 1.05 for s in stages) + WORKER_GRACE


# ------------------------------------------------------------- the parent's end
#: The worker's CPU priority (its nice value), set as it starts.  On an idle core it gets all of
#: it whatever the value; on a core the training loop or another process also wants it gets
#: about 10 % of the time at 10 (the kernel's weights: 110 against 1,024).  At 19 (1.5 %) a
#: machine whose cores were all busy starved it: with one core kept busy beside the replay
#: on 2 cores, DenseNet-BC's first plan landed after 95 iterations (3.8 s) against 16 (0.7
#: s) at 10, and the LSTM run's never did (its worker was stopped as silent).
WORKER_NICE = 10

#: How a worker starts: deaf to Ctrl-C (the training process's to handle), at
#: :data:`WORKER_NICE`, both set before its imports (which take a tenth of a second of CPU).
_LAUNCH = f"""
import os
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes our input
try:
    os.nice({WORKER_NICE})
except (AttributeError, OSError):
    pass
import runpy
runpy.run_module("pgmo.engine.worker", run_name="__main__", alter_sys=True)
"""

#: A worker's answer; None: the worker is gone.
Message = dict[str, Any]


class Worker:
    """One planning process, a thread that writes its requests and one that reads its answers.

    The training process never writes to the pipe itself: a worker that is
    stopped (its pipe full) would block the writer, which is this thread.
    ``on_message(worker, message)`` hears each answer, None when the worker is
    gone (the planner passes ``Planner._on_message``, which queues it for the
    planner thread).
    """

    def __init__(self, on_message: Callable[[Worker, Message | None], None]):
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCH],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # pipes
        self._input: IO[bytes] = self.proc.stdin
        self._output: IO[bytes] = self.proc.stdout
        self._outbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        #: Requests sent and not answered to the end, in order, with the seconds each may take.
        self.pending: dict[int, float] = {}
        # The request at the head must be answered within ``_allowed`` seconds of the CPU
        # time the worker gets from ``_cpu_start`` on (a worker at low priority on a loaded
        # machine gets little: it is not judged by the wall clock), and by ``deadline``
        # (wall clock: the budget, or WALL_FACTOR times it where the CPU time is known).
        self.deadline = float("inf")
        self._allowed = float("inf")
        self._cpu_start: float | None = None
        self.ready = False  # it said it is ready to plan
        self.stopping = False
        for target, args, name in ((self._write, (), "pgmo-planner-writer"),
                                   (self._read, (on_message,), "pgmo-planner-reader")):
            threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _write(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                send(self._input, message)
            except (OSError, ValueError):  # the worker is gone: its reader reports it
                return

    def _read(self, on_message: Callable[[Worker, Message | None], None]) -> None:
        while True:
            try:
                message = receive(self._output)
            except Exception:  # a torn message: the worker is broken
                message = None
            on_message(self, message)
            if message is None:
                try:
                    self._output.close()
                except OSError:  # pragma: no cover - closing a read end does not fail
                    pass
                return

    def submit(self, job: int, request: Message, seconds: float) -> None:
        """Send ``request``; the worker must answer it to the end within ``seconds`` once it
        is at the head of the queue."""
        if not self.pending:
            self._start_clock(seconds)
        self.pending[job] = seconds
        self._outbox.put(request)

    def finished(self, job: int) -> None:
        """``job`` is answered: the clock starts for the next one."""
        self.pending.pop(job, None)
        head = next(iter(self.pending.values()), None)
        if head is None:
            self.deadline, self._allowed = float("inf"), float("inf")
        else:
            self._start_clock(head)

    def _start_clock(self, seconds: float) -> None:
        self._cpu_start = cpu_seconds(self.proc.pid)
        self._allowed = seconds
        factor = 1.0 if self._cpu_start is None else WALL_FACTOR
        self.deadline = time.monotonic() + seconds * factor

    def overdue(self) -> bool:
        """The request at the head took longer than it may: more CPU time than its budget,
        or (a stopped or starved worker) past the wall-clock deadline."""
        if not self.pending:
            return False
        if time.monotonic() > self.deadline:
            return True
        start = self._cpu_start
        used = None if start is None else cpu_seconds(self.proc.pid)
        return used is not None and start is not None and used - start > self._allowed

    def next_check(self) -> float:
        """Seconds until :meth:`overdue` is next to be asked: at the wall-clock deadline, and
        at least each second while the CPU time is watched."""
        if not self.pending:
            return float("inf")
        left = self.deadline - time.monotonic()
        return max(0.0, min(left, 1.0) if self._cpu_start is not None else left)

    @property
    def idle(self) -> bool:
        return not self.pending

    def finish(self) -> None:
        """Ask the worker to stop its searches and answer what is queued (the pool is going
        away: plans to keep are still kept)."""
        self._outbox.put({"op": "finish"})

    def stop(self) -> None:
        self.stopping = True
        self._outbox.put(None)
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self._input.close()
        except (OSError, ValueError):
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

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:  # best effort: the closed input stream also ends the worker
        pass


class _Planning:
    """The profile this process keeps, and the requests it answers.

    Logs are folded as they arrive, by the thread that reads them, so that a
    log that changes the profile stops the search for the older one at once,
    and a log that changes nothing (an iteration that departed the same way
    while its plan is being made) stops nothing.  Plans are made one after
    the other by the main thread.
    """

    def __init__(self, out: BinaryIO):
        self.out = out
        self._send_lock = threading.Lock()
        self.profile: Any = None  # a Trace: the profile the planner's logs fold into
        self.newest: int | None = None  # the job that made the profile
        self.closed = False  # the planner is gone: whatever runs may stop
        self.plans: queue.SimpleQueue = queue.SimpleQueue()  # work for the main thread
        self.caches: dict = {}  # the plan caches written to, by (folder, device)
        self.newest_keep: int | None = None  # the newest plan to keep that arrived
        #: (profile, log, varying): the last log folded into ``profile`` without changing it.
        #: The same log again (a plan that lands late is departed from the same way each
        #: iteration) is answered at once: comparing lists costs microseconds where a fold of
        #: a few thousand requests costs milliseconds, and the logs would queue up.
        self._same: tuple[Any, Any, bool] | None = None

    def send(self, message: dict) -> None:
        with self._send_lock:
            send(self.out, message)

    def take(self, request: dict) -> None:
        """A request, as read (on the reader thread)."""
        op = request.get("op")
        if op == "fold":
            self._fold(request)
        elif op == "keep":
            self.newest_keep = request.get("job")  # an older one still queued is dropped
            self.plans.put(request)
        elif op == "solve":
            self.plans.put(request)
        elif op == "finish":  # the pool is going away: searches stop, plans are kept
            self.closed = True
        else:
            self.send({"op": "done", "job": request.get("job"), "cancelled": False,
                       "error": f"unknown request {op!r}"})

    def _fold(self, request: dict) -> None:
        from ..trace import Trace
        from .profiles import Log, absorb, to_profile

        job = request["job"]
        try:
            base = request.get("base")
            if base is not None:
                lowers, uppers, sizes = base
                self.profile = Trace.from_columns(lowers, uppers, sizes, {"recorded_by": "pgmo"})
            log = Log(*request["log"])
            before = self.profile
            same = self._same
            if request["kind"] == "profile" or before is None:
                profile, varying = to_profile(log), False
            elif same is not None and same[0] is before and same[1] == log:
                profile, varying = before, same[2]  # folded already: it changes nothing
            else:
                profile, varying = absorb(before, log)
                if profile is before:
                    self._same = (before, log, varying)
        except Exception as exc:  # a log this process cannot fold: reported, nothing planned
            self.send({"op": "profile", "job": job, "error": f"{type(exc).__name__}: {exc}"})
            self.send({"op": "done", "job": job, "cancelled": False})
            return
        changed = profile is not before
        answer: dict = {"op": "profile", "job": job, "changed": changed, "varying": varying,
                        "kind": request["kind"]}
        if changed:
            answer["columns"] = profile.log_columns()
            answer["lower_bound"] = profile.lower_bound()
            answer["arena_lower_bound"] = profile.without_open().lower_bound()
            self.profile, self.newest = profile, job  # an older search stops now
        self.send(answer)
        if changed:
            self.plans.put({"op": "plan", "job": job, "profile": profile,
                            "stages": request["stages"]})
        else:
            self.send({"op": "done", "job": job, "cancelled": False})

    def run(self) -> None:
        """Make the plans asked for, in order, until the planner is gone."""
        from ..trace import Trace

        while True:
            request = self.plans.get()
            if request is None:
                return
            job = request["job"]
            if request["op"] == "plan":
                self._plan(job, request["profile"], request["stages"],
                           lambda: self.closed or self.newest != job)
                continue
            if request["op"] == "keep":
                if job == self.newest_keep:  # else a newer plan replaces it in the entry
                    self._keep(job, request)
                else:
                    self.send({"op": "done", "job": job, "cancelled": False})
                continue
            try:
                lowers, uppers, sizes = request["columns"]
                profile = Trace.from_columns(lowers, uppers, sizes, {"recorded_by": "pgmo"})
            except Exception as exc:  # reported; the pool keeps serving
                self.send({"op": "plan", "job": job, "stage": 0,
                           "error": f"{type(exc).__name__}: {exc}"})
                self.send({"op": "done", "job": job, "cancelled": False})
                continue
            self._plan(job, profile, request["stages"], lambda: self.closed)

    def _keep(self, job: int, request: dict) -> None:
        """Keep a plan in the plan cache (what goes wrong is logged, hence reported)."""
        from ..plan_cache import keep_from_request

        try:
            keep_from_request(request, self.caches)
        except Exception as exc:  # a plan not kept costs the next run its profile only
            logging.getLogger("pgmo.cache").warning("cannot keep the plan in the plan "
                                                    "cache: %s: %s", type(exc).__name__, exc)
        self.send({"op": "done", "job": job, "cancelled": False})

    def _plan(self, job: int, profile: Any, stages: list[dict],
              cancelled: Callable[[], bool]) -> None:
        """Plan ``profile`` stage by stage; a stage at the lower bound ends the request."""
        from ..plan import Plan
        from ..solver import SolverOptions, solve
        from .schedule import compile_schedule

        arena = profile.without_open()
        perf = time.perf_counter

        def clock() -> float:
            return perf() + (CANCELLED_CLOCK_JUMP if cancelled() else 0.0)

        stopped = False
        for k, fields in enumerate(stages):
            if cancelled():
                stopped = True
                break
            started = perf()
            try:
                plan: Plan = solve(arena, SolverOptions(**fields), clock=clock)
                if cancelled():  # its answer is for a profile no longer wanted
                    stopped = True
                    break
                schedule = compile_schedule(profile, plan, job, check=True)
                reply = {"op": "plan", "job": job, "stage": k, "offsets": list(plan.offsets),
                         "optimal": plan.optimal, "info": plan.info, "method": plan.method,
                         "seconds": perf() - started, "peak": plan.peak,
                         "rows": schedule.rows, "pinned": sorted(schedule.pinned)}
            except Exception as exc:  # reported to the pool, which keeps serving
                self.send({"op": "plan", "job": job, "stage": k,
                           "error": f"{type(exc).__name__}: {exc}"})
                continue
            self.send(reply)
            if plan.peak <= arena.lower_bound():
                break  # at the lower bound: nothing left to search for
        self.send({"op": "done", "job": job, "cancelled": stopped})


class _ToPlanner(logging.Handler):
    """Sends this process's warnings to the planner, which logs them (see the module)."""

    def __init__(self, planning: _Planning):
        super().__init__(logging.WARNING)
        self.planning = planning

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.planning.send({"op": "log", "logger": record.name,
                                "level": record.levelno, "message": record.getMessage()})
        except Exception:  # the planner is gone: nobody to tell
            pass


def main() -> int:
    """Answer the planner on standard input and output until it is gone.  (The planner
    starts this process at the lowest CPU priority, see :data:`_LAUNCH`.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes our input
    _die_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but messages goes to the parent's pipe
    planning = _Planning(stdout)
    logging.getLogger("pgmo").addHandler(_ToPlanner(planning))
    # Import what planning needs now, so that the first plan does not wait for it, and
    # say so: a planner waiting for its worker to be idle waits for this too.
    from ..solver import best, bestfit  # noqa: F401
    from .profiles import absorb  # noqa: F401
    from .schedule import compile_schedule  # noqa: F401

    planning.send({"op": "ready"})

    def read() -> None:
        """Read and fold requests as they come; end the planning when the input ends."""
        try:
            while True:
                try:
                    request = receive(stdin)
                except Exception:  # a torn request: the planner is gone or broken
                    request = None
                if request is None:
                    return
                planning.take(request)
        except OSError:  # the planner is gone
            pass
        finally:
            planning.closed = True
            planning.plans.put(None)

    threading.Thread(target=read, name="pgmo-worker-reader", daemon=True).start()
    try:
        planning.run()
    except OSError:  # the planner is gone
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
