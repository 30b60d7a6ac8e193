"""From iteration logs to schedules: the profile's owner, planning now or in a worker process.

The engine hands the planner each log that changes the profile (the
profiled iteration, or a planned one that departed from its plan) and, at
every iteration boundary, asks for a schedule ready to install.  The mode
(:data:`REPLAN_MODES`, the ``replan`` option) decides where the work happens:

``background`` (default)
    Training never waits for a plan, and no planning runs on the training
    process's interpreter: a planning process (:mod:`.worker`, started with
    the pool) folds each log into the profile, plans it with the paper's
    best-fit, then with the full method (``best`` by default), and checks
    and compiles each plan into the hot path's rows.  The training process
    sends the log (a thread of the planner writes it to the worker's pipe)
    and, when rows come back, a thread of the planner wraps them for the
    engine, which installs them at its next boundary (the full method's
    plan if it needs less memory than the best-fit one in use).  A newer
    profile supersedes a running search: the worker stops it and plans the
    newest profile.  Recurring shapes' plans (:mod:`.shapes`) are made there
    too.  A worker that dies or stops answering (past its time limits plus
    :data:`WORKER_GRACE`) costs the plans it was making, never a wait: it is
    counted, warned about once, the pool keeps its current plan, and the
    next profile starts a new worker.
``sync``
    Everything happens at the boundary, in the training process, with the
    full method: the behaviour to use for tests and reproducible runs.
``bestfit``
    Only the paper's best-fit, at the boundary.

A plan made by the worker is the one the same method makes at the boundary
(same profile, options and seed; with a step budget and no time limit, the
same offsets).

No orphan worker: :meth:`Planner.shutdown` (called when the pool goes away)
stops it, the worker exits when its input closes or its parent dies, an idle
worker is stopped by ``free_all_blocks``, a forked child forgets its
parent's worker, and interpreter exit stops every worker.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable

from ..plan import Plan
from ..solver import SolverOptions, solve
from ..trace import Trace
from .profiles import Log, absorb, to_profile
from .schedule import Schedule, compile_schedule
from .wire import receive, send

__all__ = ["Planner", "REPLAN_MODES", "WORKER_GRACE"]

log = logging.getLogger("pgmo.pool")

#: Where plans are computed (the ``replan`` option, checked by
#: :class:`~.options.PoolOptions`).
REPLAN_MODES = ("background", "sync", "bestfit")
#: Seconds a worker may take beyond a request's solve time limits (start-up, best-fit).
WORKER_GRACE = 20.0

_planners: "weakref.WeakSet[Planner]" = weakref.WeakSet()

#: How a worker starts: deaf to Ctrl-C (the training process's to handle), at the lowest CPU
#: priority (nice 19), both set before its imports (which take a tenth of a second of CPU):
#: on a core training also wants, it gets about 1.5 % of the time; on an idle core, all of it.
_LAUNCH = """
import os
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes our input
try:
    os.nice(19)
except (AttributeError, OSError):
    pass
import runpy
runpy.run_module("pgmo.engine.worker", run_name="__main__", alter_sys=True)
"""

#: A worker's answer (see :mod:`.worker`); None: the worker is gone.
Message = dict[str, Any]
#: What a recurring shape's plan is handed to (None: no plan).
ShapeDone = Callable[[Schedule | None], None]


class _Worker:
    """One planning process, a thread that writes its requests and one that reads its answers.

    The training process never writes to the pipe itself: a worker that is
    stopped (its pipe full) would block the writer, which is this thread.
    """

    def __init__(self, on_message: Callable[[_Worker, Message | None], None]):
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
        self.deadline = float("inf")  # when the request at the head must be answered
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

    def _read(self, on_message: Callable[[_Worker, Message | None], None]) -> None:
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
            self.deadline = time.monotonic() + seconds
        self.pending[job] = seconds
        self._outbox.put(request)

    def finished(self, job: int) -> None:
        """``job`` is answered: the clock starts for the next one."""
        self.pending.pop(job, None)
        head = next(iter(self.pending.values()), None)
        self.deadline = float("inf") if head is None else time.monotonic() + head

    @property
    def idle(self) -> bool:
        return not self.pending

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


class Planner:
    """Owns the pool's profile and produces the schedules the engine installs.

    The training thread never waits for a lock here, nor holds one: a
    Ctrl-C (or any exception) that lands in the middle of a call leaves no
    lock taken.  What it hands to the planner thread goes through a queue;
    what the planner thread hands back (the profile, a schedule) is one
    reference stored at once; the rest is read as it is.
    """

    def __init__(self, options: SolverOptions, mode: str = "background"):
        """``mode``: one of :data:`REPLAN_MODES` (the pool's options checked it).

        In ``background`` mode the worker starts now, in the background, so
        that it is ready when the first profile is.
        """
        self.options = options
        self.mode = mode
        self.replans = 0  # departures that changed the profile
        self.varying = 0  # departures whose iteration differed in shape from the profile
        self.solve_failures = 0  # solves that raised (the plan stays as it was)
        self.background_solves = 0  # plans of the full method made by the worker
        self.worker_failures = 0  # worker crashed or overran its time
        self._warned = False
        #: Numbers generations and requests, increasing (``next`` is atomic).
        self._numbers = itertools.count(1)
        self._init_threading()
        _planners.add(self)
        if mode == "background":
            self.later(self._start_worker)

    def _init_threading(self) -> None:
        # The current profile is the newer (by generation) of two heads: the one set here by
        # the engine's thread (sync solves, reset, adopt, optimize) and the one the planner
        # thread sets from the worker's answers.  Each is one tuple, stored at once.
        self._own: tuple[int, Trace | None] = (0, None)
        self._answered: tuple[int, Trace | None] = (0, None)
        self._epoch = 0  # the worker's answers to requests numbered below it are forgotten
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # everything for the planner thread
        self._recorded = 0  # logs handed over (engine's thread)
        self._forget_below = 0  # logs handed over before this count are dropped (reset, adopt)
        self._taken = 0  # logs the planner thread took from the inbox
        self._in_flight: set[int] = set()  # logs sent to the worker, not answered to the end
        self._slot: dict[str, Schedule] = {}  # "ready": a schedule for take_ready (popped)
        self._stale_taken = 0  # stale plans found by take_ready (engine's thread)
        self._stale_answers = 0  # stale plans and stopped searches (planner thread)
        self._shapes: dict[int, tuple[Log, ShapeDone]] = {}  # shape requests sent
        self._thread: threading.Thread | None = None
        self._worker: _Worker | None = None
        self._worker_gen = -1  # the generation of the profile the worker holds (-1: none)
        self._arena: tuple[Trace, Trace] | None = None  # (profile, its closed blocks)
        self._stop = False
        self._starting = threading.Lock()  # one planner thread at a time
        self._pid = os.getpid()

    # ------------------------------------------------------------ the profile
    @property
    def profile(self) -> Trace | None:
        """The current profile (the newest: the engine's own, or the worker's answer)."""
        own, answered = self._own, self._answered
        return (own if own[0] >= answered[0] else answered)[1]

    @property
    def generation(self) -> int:
        """Which profile is current: plans carry the generation they were made for."""
        return max(self._own[0], self._answered[0])

    @property
    def stale_plans(self) -> int:
        """Plans dropped, and searches stopped, because a newer profile came."""
        return self._stale_taken + self._stale_answers

    # ----------------------------------------------------------------- engine
    def record(self, run_log: Log, kind: str) -> Schedule | None:
        """A log that changes the profile (``kind``: "profile" or "merge").

        Returns a schedule to install at once (``sync``, ``bestfit``), or None
        while the work goes on in the worker (``background``).
        """
        if self.mode != "background":
            before = self.profile
            profile = self._apply(kind, run_log)
            if profile is before:
                return None  # the profile did not change: the plan in use stays
            method = "bestfit" if self.mode == "bestfit" else self.options.method
            return self._solve_now(profile, self.options.replace(method=method))
        self._post(("fold", self._recorded, kind, run_log))
        self._recorded += 1
        return None

    def later(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the planner thread, off the training loop."""
        self._post(("chore", fn))

    def optimize(self, last_log: Log | None) -> Schedule:
        """Solve the profile (else ``last_log``) now, with the full method; errors propagate.

        The caller asked to wait for it: it runs here, in every mode.
        """
        profile = self.profile
        if profile is not None:
            self._set_own(profile)  # background work on it is superseded
        else:
            if last_log is None or not last_log.sizes:
                raise RuntimeError("nothing to optimize yet: run at least one iteration "
                                   "with allocations first")
            profile = self._apply("profile", last_log)
        plan = solve(profile.without_open(), self.options)
        return compile_schedule(profile, plan, self.generation, check=True)

    def adopt(self, profile: Trace, plan: Plan) -> Schedule:
        """Use a plan made elsewhere (a saved file) for ``profile``; it is checked first."""
        generation = next(self._numbers)
        schedule = compile_schedule(profile, plan, generation, check=True)
        self._forget_below = self._recorded  # logs of iterations before it
        self._set_own(profile, generation)
        return schedule

    def plan_now(self, profile: Trace) -> Schedule | None:
        """A schedule for a profile other than the pool's, made here: the full method in
        ``sync`` mode, best-fit otherwise; None when the solve fails."""
        method = self.options.method if self.mode == "sync" else "bestfit"
        return self._solve_now(profile, self.options.replace(method=method), generation=-1)

    def plan_shape(self, run_log: Log, done: ShapeDone) -> None:
        """Plan a recurring shape's iteration (``run_log``, filled) and hand the schedule (or
        None) to ``done``: at once in ``sync`` and ``bestfit`` mode (as :meth:`plan_now`),
        later and from another thread in ``background`` mode (best-fit, in the worker)."""
        if self.mode != "background":
            done(self.plan_now(to_profile(run_log)))
            return
        self._post(("shape", run_log, done))

    def arena_bound(self, profile: Trace) -> int:
        """The lower bound of ``profile``'s closed blocks (what its arena must hold): the
        worker's answer for a profile it made, else computed."""
        cached = self._arena
        if cached is not None and cached[0] is profile:
            return cached[1].lower_bound()
        return profile.without_open().lower_bound()

    def take_ready(self, installed: Schedule | None) -> Schedule | None:
        """A background schedule for the current profile that beats ``installed``."""
        ready = self._slot.pop("ready", None)  # one step: the planner thread may store anew
        if ready is None:
            return None
        if ready.generation != self.generation:
            self._stale_taken += 1
            return None
        if installed is not None and installed.generation == ready.generation \
                and ready.plan.peak >= installed.plan.peak:
            return None  # no better than what is in use
        return ready

    def reset(self) -> None:
        """Forget the profile (and any work on it)."""
        self._forget_below = self._recorded
        self._set_own(None)

    @property
    def busy(self) -> bool:
        """Work on the current profile is still going on in the background."""
        if self._recorded > max(self._taken, self._forget_below):
            return True  # a log waits for the planner thread
        return max(self._in_flight, default=-1) >= self._epoch

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background work is queued, running, or awaited from the worker
        (its start included).

        For tests and benchmarks that need a background plan to arrive at a
        known boundary: what is ready then is installed at the next one.
        Returns False when ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop:
            # Everything handed over before this marker is done once the planner thread
            # runs it (it takes its work in order); then only the worker may still be busy.
            marker = threading.Event()
            self.later(marker.set)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 or not marker.wait(left):
                return False
            if self._worker_idle():
                return True
            time.sleep(0.005)
        return True

    def _worker_idle(self) -> bool:
        """The worker (if any) is ready and has answered everything, answers handled."""
        worker = self._worker
        return not self._in_flight and not self._shapes and (
            worker is None or (worker.idle and worker.ready))

    # -------------------------------------------------------------- lifecycle
    def stop_idle_worker(self) -> None:
        """Stop the worker if it has nothing to do (a later profile starts another)."""
        worker = self._worker
        if worker is None or not worker.idle or self._recorded > self._taken \
                or not self._inbox.empty():
            return
        self._worker = None
        worker.stop()

    def shutdown(self) -> None:
        """Stop the thread and the worker (the pool is going away)."""
        if self._pid != os.getpid():
            return  # a forked child: those belong to the parent
        self._stop = True
        worker, self._worker = self._worker, None
        self._inbox.put(None)  # wakes the planner thread, which ends
        if worker is not None:
            worker.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _after_fork_in_child(self) -> None:
        """Threads do not survive fork and the worker is the parent's: start afresh."""
        self._init_threading()

    # ------------------------------------------------ in this process (sync)
    def _set_own(self, profile: Trace | None, generation: int | None = None) -> int:
        """Make ``profile`` the current one, set by the engine's thread (one store): the
        worker's answers to earlier requests no longer count."""
        generation = next(self._numbers) if generation is None else generation
        self._epoch = generation
        self._own = (generation, profile)
        return generation

    def _apply(self, kind: str, run_log: Log) -> Trace:
        """The profile after this log (``sync``, ``bestfit``, :meth:`optimize`), published
        with a new generation if it changed."""
        base = self.profile
        if kind == "profile" or base is None:
            profile = to_profile(run_log)
        else:
            profile, varying = absorb(base, run_log)
            self.varying += varying
            if profile is base:
                return base
            self.replans += 1
        self._set_own(profile)
        return profile

    def _solve_now(self, profile: Trace, options: SolverOptions,
                   generation: int | None = None) -> Schedule | None:
        try:
            plan = solve(profile.without_open(), options)
            return compile_schedule(profile, plan,
                                    self.generation if generation is None else generation,
                                    check=True)
        except Exception:
            self.solve_failures += 1
            log.warning("pgmo could not solve the profile; the plan in use stays",
                        exc_info=True)
            return None

    # ---------------------------------------------------- the planner thread
    def _post(self, item: tuple) -> None:
        """Hand ``item`` to the planner thread (started if need be)."""
        self._inbox.put(item)
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._starting:  # only while there is no thread: never on a hot path
                thread = self._thread
                if thread is None or not thread.is_alive():
                    self._stop = False
                    thread = threading.Thread(target=self._run, name="pgmo-planner",
                                              daemon=True)
                    self._thread = thread
                    thread.start()

    def _on_message(self, worker: _Worker, message: Message | None) -> None:
        self._inbox.put(("message", worker, message))

    def _take(self) -> list[tuple]:
        """Wait for work (or the worker's deadline), then take all there is."""
        worker = self._worker
        timeout = None if worker is None or worker.idle else \
            max(0.0, worker.deadline - time.monotonic())
        items = []
        try:
            items.append(self._inbox.get(timeout=timeout))
        except queue.Empty:
            return items
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _run(self) -> None:
        while not self._stop:
            for item in self._take():  # in the order they were handed over
                if item is None or self._stop:
                    return
                job = None
                try:
                    if item[0] == "fold":
                        # in flight before it counts as taken: busy never reads false between
                        job = next(self._numbers)
                        self._in_flight.add(job)
                        self._taken = max(self._taken, item[1] + 1)
                        self._send_fold(job, *item[1:])
                    elif item[0] == "chore":
                        item[1]()
                    elif item[0] == "message":
                        self._handle(item[1], item[2])
                    elif item[0] == "shape":
                        self._send_shape(item[1], item[2])
                except Exception:  # never let the thread die silently
                    worker = self._worker
                    if job is not None and (worker is None or job not in worker.pending):
                        self._in_flight.discard(job)  # a log it did not send is not awaited
                    self._worker_failed(None, "the planner thread failed")
                    log.debug("planner thread error", exc_info=True)
            worker = self._worker
            if worker is not None and not worker.idle and time.monotonic() > worker.deadline:
                self._worker_failed(worker, "it took longer than its time limit")

    def _start_worker(self) -> None:
        self._ensure_worker()

    def _ensure_worker(self) -> _Worker | None:
        """The worker, started if need be (only this thread starts workers)."""
        worker = self._worker
        if worker is not None:
            return worker
        try:
            worker = _Worker(self._on_message)
        except OSError as exc:
            self._worker_failed(None, f"it could not be started ({exc})")
            return None
        if self._stop:
            worker.stop()
            return None
        self._worker = worker
        self._worker_gen = -1  # it holds no profile yet
        return worker

    def _stages(self, method: str) -> list[dict[str, Any]]:
        stages = [self.options.replace(method="bestfit", progress=False)]
        if method != "bestfit":
            stages.append(self.options.replace(method=method, progress=False))
        return [dataclasses.asdict(s) for s in stages]

    def _seconds(self, stages: list[dict[str, Any]]) -> float:
        return sum((s["time_limit"] or 0.0) * 1.05 for s in stages) + WORKER_GRACE

    def _send_fold(self, job: int, index: int, kind: str, run_log: Log) -> None:
        """Hand a log to the worker, with the profile to fold it into if it lacks it."""
        if index < self._forget_below:  # a reset or an adopted plan came after it
            self._in_flight.discard(job)
            return
        worker = self._ensure_worker()
        if worker is None:
            self._in_flight.discard(job)  # this log's plan is lost
            return
        base = None
        generation, profile = self.generation, self.profile
        if kind == "merge" and self._worker_gen != generation:
            # the worker does not hold the current profile: it gets it with the log
            if profile is None:
                kind = "profile"
            else:
                base = tuple(list(c) for c in zip(*((b.lower, b.upper, b.size)
                                                    for b in profile.blocks)))
                self._worker_gen = generation
        stages = self._stages(self.options.method)
        worker.submit(job, {"op": "fold", "job": job, "kind": kind, "log": tuple(run_log),
                            "base": base, "stages": stages}, self._seconds(stages))

    def _send_shape(self, run_log: Log, done: ShapeDone) -> None:
        worker = self._ensure_worker()
        if worker is None:
            done(None)
            return
        job = next(self._numbers)
        self._shapes[job] = (run_log, done)
        stages = self._stages("bestfit")
        worker.submit(job, {"op": "solve", "job": job, "columns": tuple(run_log),
                            "stages": stages}, self._seconds(stages))

    # ------------------------------------------------------ the worker's answers
    def _handle(self, worker: _Worker, message: Message | None) -> None:
        if message is None:  # the worker is gone: what it was making is lost
            self._in_flight.difference_update(worker.pending)
            if worker is self._worker:
                self._worker_failed(worker, f"it exited with status {worker.proc.poll()}")
            return
        if worker is not self._worker:
            return  # a worker stopped or replaced: what it says no longer counts
        op, job = message.get("op"), int(message.get("job", -1))
        if op == "ready":
            worker.ready = True
        elif op == "done":
            worker.finished(job)
            self._in_flight.discard(job)
            if message.get("cancelled"):
                self._stale_answers += 1
            shape = self._shapes.pop(job, None)
            if shape is not None:  # answered without a plan
                shape[1](None)
        elif op == "profile":
            self._on_profile(message)
        elif op == "plan":
            shape = self._shapes.pop(job, None)
            if shape is not None:
                self._on_shape_plan(shape, message)
            else:
                self._on_plan(message)
        else:
            self._worker_failed(worker, f"it sent an unknown answer {op!r}")

    def _on_profile(self, message: Message) -> None:
        """The worker folded a log: the new profile, if it changed, is the current one."""
        job = message["job"]
        if "error" in message:
            self.solve_failures += 1
            log.warning("pgmo's planner could not fold an iteration into the profile (%s); "
                        "keeping the current plan", message["error"])
            return
        if message["changed"]:
            self._worker_gen = job  # what the worker holds now, current or not
        if job < self._epoch:
            return  # made before a reset or an adopted plan: forgotten
        self.varying += bool(message["varying"])
        if not message["changed"]:
            return
        metadata: dict[str, Any] = {"recorded_by": "pgmo"}
        if message["kind"] == "merge" and not message["varying"]:
            metadata["merged"] = True
        lowers, uppers, sizes = message["columns"]
        profile = Trace.from_columns(lowers, uppers, sizes, metadata)
        _knows(profile, "_lower_bound", message["lower_bound"])
        arena = profile.without_open()
        if arena is not profile:
            _knows(arena, "_lower_bound", message["arena_lower_bound"])
        self._arena = (profile, arena)
        self._answered = (job, profile)  # current unless the engine's thread set a newer one
        if message["kind"] == "merge":
            self.replans += 1

    def _plan_of(self, profile: Trace, message: Message) -> Plan:
        cached = self._arena
        arena = cached[1] if cached is not None and cached[0] is profile else \
            profile.without_open()
        plan = Plan(arena, tuple(message["offsets"]), method=message["method"],
                    seconds=message["seconds"], optimal=message["optimal"],
                    info=message["info"])
        _knows(plan, "_peak", message["peak"])  # what Plan.peak computes, by the worker
        return plan

    def _on_plan(self, message: Message) -> None:
        job = message["job"]
        answered = self._answered
        if job != answered[0] or job != self.generation or answered[1] is None:
            self._stale_answers += 1
            return
        if "error" in message:
            self.solve_failures += 1
            log.warning("pgmo's background solve failed (%s); keeping the current plan",
                        message["error"])
            return
        profile = answered[1]
        plan = self._plan_of(profile, message)
        if plan.method != "bestfit":
            self.background_solves += 1
        schedule = Schedule(profile, plan, message["rows"], frozenset(message["pinned"]), job)
        ready = self._slot.get("ready")
        if ready is None or ready.generation != job or plan.peak < ready.plan.peak:
            self._slot["ready"] = schedule  # one store: take_ready pops it whole

    def _on_shape_plan(self, shape: tuple[Log, ShapeDone], message: Message) -> None:
        run_log, done = shape
        if "error" in message:
            self.solve_failures += 1
            log.warning("pgmo could not plan a recurring shape (%s)", message["error"])
            done(None)
            return
        profile = to_profile(run_log)
        done(Schedule(profile, self._plan_of(profile, message), message["rows"],
                      frozenset(message["pinned"]), -1))

    def _worker_failed(self, worker: _Worker | None, why: str) -> None:
        """Count and warn (once); a worker is stopped, and what it was making is lost."""
        if worker is not None:
            if self._worker is worker:
                self._worker = None
            self._in_flight.difference_update(worker.pending)
            worker.stop()
            shapes, self._shapes = self._shapes, {}
            for _, done in shapes.values():
                done(None)
        self.worker_failures += 1
        if not self._warned:
            self._warned = True
            log.warning("pgmo's background planner failed: %s. The pool keeps serving with "
                        "its current plan (counted in stats().planner_failures).", why)


def _knows(thing: Trace | Plan, cache: str, value: int) -> None:
    """Fill the cache a :class:`~pgmo.trace.Trace` or :class:`~pgmo.plan.Plan` keeps for a
    fact (``_lower_bound``, ``_peak``) with the worker's answer, so that the training
    process never computes it again."""
    object.__setattr__(thing, cache, value)


def _after_fork_in_child() -> None:
    for planner in list(_planners):
        planner._after_fork_in_child()


def _shutdown_all() -> None:
    for planner in list(_planners):
        planner.shutdown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
