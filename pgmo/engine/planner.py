"""From iteration logs to schedules: the profile's owner, planning now or in the background.

The engine hands the planner each log that changes the profile (the
profiled iteration, or a planned one that departed from its plan) and, at
every iteration boundary, asks for a schedule ready to install.  The mode
(:data:`REPLAN_MODES`, the ``replan`` option) decides where the work happens:

``background`` (default)
    Training never waits for a solver.  A small profile (up to
    :data:`SYNC_BLOCKS` requests) gets the paper's best-fit plan at once,
    which takes milliseconds; a larger one is merged, solved with best-fit
    and validated by a planner thread while the iterations go on (each
    request in memory of its own, or placed in the arena's gaps).  The
    full method (``best`` by default) then runs in a worker process (see
    :mod:`.worker`; a thread would hold the GIL for seconds) and its plan is
    validated and compiled by the planner thread, to be swapped in at a later
    boundary if it needs less memory.  A newer profile supersedes a running
    solve: its answer is dropped, and the newest profile is solved next.  A
    worker that crashes or overruns its time is counted, warned about once,
    and the pool keeps its current plan.
``sync``
    Everything happens at the boundary, with the full method: the behaviour
    to use for tests and reproducible runs.
``bestfit``
    Only the paper's best-fit, at the boundary.

No orphan worker: :meth:`Planner.shutdown` (called when the pool goes away)
stops it, the worker exits when its input closes or its parent dies, an idle
worker is stopped by ``free_all_blocks``, a forked child forgets its
parent's worker, and interpreter exit stops every worker.

Tested in ``tests/test_planner.py`` and ``tests/test_variable_workloads.py``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from ..plan import Plan
from ..solver import SolverOptions, solve
from ..trace import Trace
from .profiles import Log, absorb, to_profile
from .schedule import Schedule, compile_schedule

if TYPE_CHECKING:  # imported where a worker starts: see _submit_wanted
    from .worker import Message, Worker

__all__ = ["Planner", "REPLAN_MODES", "SYNC_BLOCKS"]

log = logging.getLogger("pgmo.pool")

#: Where plans are computed (the ``replan`` option, checked by
#: :class:`~.options.PoolOptions`).
REPLAN_MODES = ("background", "sync", "bestfit")
#: In background mode, profiles up to this many requests are planned with
#: best-fit at the boundary (about 10 us per request: a few milliseconds).
SYNC_BLOCKS = 256

_planners: "weakref.WeakSet[Planner]" = weakref.WeakSet()

#: Work for the planner thread: a log to fold into the profile ("profile", "merge"), or a
#: profile to solve ("solve"), and whether its best-fit plan is made already.
Job = tuple[str, "Log | Trace", bool]


class Planner:
    """Owns the pool's profile and produces the schedules the engine installs."""

    def __init__(self, options: SolverOptions, mode: str = "background",
                 sync_blocks: int = SYNC_BLOCKS):
        """``mode``: one of :data:`REPLAN_MODES` (the pool's options checked it)."""
        self.options = options
        self.mode = mode
        self.sync_blocks = sync_blocks
        self.profile: Trace | None = None
        self.generation = 0
        self.replans = 0  # departures that changed the profile
        self.varying = 0  # departures whose iteration differed in shape from the profile
        self.solve_failures = 0  # solves that raised (the plan stays as it was)
        self.background_solves = 0  # jobs given to the worker
        self.stale_plans = 0  # background plans discarded: a newer profile came
        self.worker_failures = 0  # worker crashed or overran its time
        self._warned = False
        self._init_threading()
        _planners.add(self)

    def _init_threading(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: list[Job] = []
        self._messages: list[tuple[Worker, Message | None]] = []
        self._chores: list[Callable[[], None]] = []  # work handed over (see later())
        self._ready: Schedule | None = None
        self._thread: threading.Thread | None = None
        self._worker: Worker | None = None
        self._stop = False
        self._active = False  # the planner thread is folding logs or solving
        self._working = False  # the planner thread is doing anything it took (see wait_idle)
        self._wanted: tuple[int, Trace] | None = None  # the profile to solve next
        self._pid = os.getpid()

    # ----------------------------------------------------------------- engine
    def record(self, run_log: Log, kind: str) -> Schedule | None:
        """A log that changes the profile (``kind``: "profile" or "merge").

        Returns a schedule to install at once, or None while the work goes
        on in the background.
        """
        if self.mode != "background":
            before = self.profile
            profile = self._apply(kind, run_log)
            if profile is before:
                return None  # the profile did not change: the plan in use stays
            method = "bestfit" if self.mode == "bestfit" else self.options.method
            return self._solve_now(profile, self.options.replace(method=method))
        with self._cond:
            inline = not (self._jobs or self._active) and len(run_log.sizes) <= self.sync_blocks
            if not inline:
                self._jobs.append((kind, run_log, False))
                self._ensure_thread()
                self._cond.notify_all()
                return None
        before = self.profile
        profile = self._apply(kind, run_log)
        if profile is before:
            return None
        schedule = self._solve_now(profile, self.options.replace(method="bestfit"))
        if self.options.method != "bestfit" and not _optimal(schedule):
            with self._cond:
                self._jobs.append(("solve", profile, True))
                self._ensure_thread()
                self._cond.notify_all()
        return schedule

    def later(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the planner thread, off the training loop."""
        with self._cond:
            self._chores.append(fn)
            self._ensure_thread()
            self._cond.notify_all()

    def optimize(self, last_log: Log | None) -> Schedule:
        """Solve the profile (else ``last_log``) now, with the full method; errors propagate."""
        with self._cond:
            profile = self.profile
            if profile is not None:
                self.generation += 1  # background work on it is superseded
                self._ready = None
        if profile is None:
            if last_log is None or not last_log.sizes:
                raise RuntimeError("nothing to optimize yet: run at least one iteration "
                                   "with allocations first")
            profile = self._apply("profile", last_log)
        plan = solve(profile.without_open(), self.options)
        return compile_schedule(profile, plan, self.generation, check=True)

    def adopt(self, profile: Trace, plan: Plan) -> Schedule:
        """Use a plan made elsewhere (a saved file) for ``profile``; it is checked first."""
        schedule = compile_schedule(profile, plan, self.generation + 1, check=True)
        with self._cond:
            self.generation += 1
            self.profile = profile
            self._ready = None
        return schedule

    def plan_now(self, profile: Trace) -> Schedule | None:
        """A schedule for a profile other than the pool's (a recurring shape's, see
        :mod:`.shapes`): the full method in ``sync`` mode, best-fit otherwise (it runs on
        the planner thread in ``background`` mode); None when the solve fails."""
        method = self.options.method if self.mode == "sync" else "bestfit"
        return self._solve_now(profile, self.options.replace(method=method), generation=-1)

    def take_ready(self, installed: Schedule | None) -> Schedule | None:
        """A background schedule for the current profile that beats ``installed``."""
        with self._cond:
            ready = self._ready
            if ready is None:
                return None
            self._ready = None
            if ready.generation != self.generation:
                self.stale_plans += 1
                return None
            if installed is not None and installed.generation == ready.generation \
                    and ready.plan.peak >= installed.plan.peak:
                return None  # no better than what is in use
            return ready

    def reset(self) -> None:
        """Forget the profile (and any work on it)."""
        with self._cond:
            self.profile = None
            self.generation += 1
            self._jobs.clear()
            self._ready = None
            self._wanted = None

    @property
    def busy(self) -> bool:
        """Work on the current profile is still going on in the background."""
        with self._cond:
            worker = self._worker
            return bool(self._jobs) or self._active or self._wanted is not None or (
                worker is not None and worker.job == self.generation)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background work is queued, running, or awaited from the worker.

        For tests and benchmarks that need a background plan to arrive at a
        known boundary: what is ready then is installed at the next one.
        Returns False when ``timeout`` seconds passed first.
        """
        with self._cond:
            return self._cond.wait_for(self._idle, timeout)

    def _idle(self) -> bool:
        """Nothing left to do in the background (lock held)."""
        worker = self._worker
        return self._stop or not (self._jobs or self._messages or self._chores or self._working
                                  or self._wanted is not None
                                  or (worker is not None and not worker.idle))

    # -------------------------------------------------------------- lifecycle
    def stop_idle_worker(self) -> None:
        with self._cond:
            worker = self._worker
            if worker is None or not worker.idle:
                return
            self._worker = None
        worker.stop()

    def shutdown(self) -> None:
        """Stop the thread and the worker (the pool is going away)."""
        if self._pid != os.getpid():
            return  # a forked child: those belong to the parent
        with self._cond:
            self._stop = True
            worker, self._worker = self._worker, None
            self._cond.notify_all()
        if worker is not None:
            worker.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _after_fork_in_child(self) -> None:
        """Threads do not survive fork and the worker is the parent's: start afresh."""
        self._init_threading()

    # ---------------------------------------------------------------- helpers
    def _apply(self, kind: str, run_log: Log) -> Trace:
        """The profile after this log, published with a new generation if it changed.

        Iterations that depart the same way while their new plan is being made
        merge into the same profile: they start no new solve.
        """
        base = self.profile
        if kind == "profile" or base is None:
            profile = to_profile(run_log)
        else:
            profile, varying = absorb(base, run_log)
            self.varying += varying
            if profile is base:
                return base
            self.replans += 1
        with self._cond:
            self.profile = profile
            self.generation += 1
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

    def _ensure_thread(self) -> None:
        """Start the planner thread (lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="pgmo-planner", daemon=True)
            self._thread.start()

    def _on_message(self, worker: Worker, message: Message | None) -> None:
        with self._cond:
            self._messages.append((worker, message))
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._jobs or self._messages or self._chores or self._stop):
                    worker = self._worker
                    timeout = None if worker is None or worker.idle else \
                        max(0.0, worker.deadline - time.monotonic())
                    if timeout == 0.0:
                        break
                    self._cond.wait(timeout)
                if self._stop:
                    return
                jobs, self._jobs = self._jobs, []
                messages, self._messages = self._messages, []
                chores, self._chores = self._chores, []
                worker = self._worker
                self._active = bool(jobs)
                self._working = True
            try:
                for chore in chores:
                    chore()
                if worker is not None and not worker.idle and time.monotonic() > worker.deadline:
                    self._worker_failed(worker, "it took longer than its time limit")
                for worker, message in messages:
                    self._handle(worker, message)
                if jobs:
                    self._start(jobs)
            except Exception:  # never let the thread die silently
                self._worker_failed(None, "the planner thread failed")
                log.debug("planner thread error", exc_info=True)
            finally:
                with self._cond:
                    self._active = self._working = False
                    self._cond.notify_all()  # for wait_idle

    def _start(self, jobs: list[Job]) -> None:
        """Fold the logs into the profile, plan it with best-fit, then solve it fully."""
        profile: Trace | None = None
        bestfit_done = False
        for kind, item, done in jobs:
            if isinstance(item, Trace):  # "solve"
                profile, bestfit_done = item, done
            else:
                before = self.profile
                folded = self._apply(kind, item)
                if folded is not before or profile is None and kind == "profile":
                    profile, bestfit_done = folded, False
        if profile is None:
            return  # the logs changed nothing: the plan in use stays
        generation = self.generation
        if not bestfit_done:  # milliseconds to a second, here: no worker start-up to wait for
            schedule = self._solve_now(profile, self.options.replace(method="bestfit"))
            if schedule is not None:
                self._publish(schedule)
            if _optimal(schedule):
                return  # at the lower bound: nothing to search for
        if self.options.method == "bestfit":
            return
        with self._cond:
            self._wanted = (generation, profile)
        self._submit_wanted()

    def _submit_wanted(self) -> None:
        """Give the newest profile to the worker once it is free (started if need be).

        A worker busy with a superseded profile is let finish (its time limit
        bounds that) and its answer dropped: stopping and starting processes
        would cost more than it saves.
        """
        with self._cond:
            wanted, worker = self._wanted, self._worker
            if wanted is None or self._stop or (worker is not None and not worker.idle):
                return
            self._wanted = None
        generation, profile = wanted
        try:
            if worker is None:  # only this thread starts workers: no race
                # imported here, not at the top: ``python -m pgmo.engine.worker`` imports
                # this package first, and must not find its own module imported already
                from .worker import Worker
                worker = Worker(on_message=self._on_message)  # a process start: not under the lock
                with self._cond:
                    if self._stop:
                        worker.stop()
                        return
                    self._worker = worker
            worker.submit(generation, profile.without_open(), [self.options])
            self.background_solves += 1
        except OSError as exc:
            self._worker_failed(worker, f"it could not be started ({exc})")

    def _handle(self, worker: Worker, message: Message | None) -> None:
        if message is None:
            if not worker.stopping:
                with self._cond:
                    if self._worker is worker:
                        self._worker = None
                self._worker_failed(None, f"it exited with status {worker.proc.poll()}")
            return
        worker.stages_left -= 1
        if worker.stages_left <= 0:
            worker.job = None
            self._submit_wanted()  # a newer profile waited for the worker
        if message["job"] != self.generation:
            self.stale_plans += 1
            return
        if "error" in message:
            self.solve_failures += 1
            log.warning("pgmo's background solve failed (%s); keeping the current plan",
                        message["error"])
            return
        profile = self.profile
        if profile is None:  # forgotten meanwhile (reset): nothing to plan for
            self.stale_plans += 1
            return
        try:
            plan = Plan(profile.without_open(), tuple(message["offsets"]),
                        method=message["method"], seconds=message["seconds"],
                        optimal=message["optimal"], info=message["info"])
            schedule = compile_schedule(profile, plan, message["job"], check=True)
        except Exception as exc:  # an invalid answer is never installed
            self._worker_failed(None, f"it returned an unusable plan ({exc})")
            return
        self._publish(schedule)

    def _publish(self, schedule: Schedule) -> None:
        with self._cond:
            if schedule.generation != self.generation:
                self.stale_plans += 1
                return
            ready = self._ready
            if ready is None or ready.generation != schedule.generation \
                    or schedule.plan.peak < ready.plan.peak:
                self._ready = schedule

    def _worker_failed(self, worker: Worker | None, why: str) -> None:
        if worker is not None:
            with self._cond:
                if self._worker is worker:
                    self._worker = None
            worker.stop()
        self.worker_failures += 1
        if not self._warned:
            self._warned = True
            log.warning("pgmo's background solver failed: %s. The pool keeps serving with "
                        "its current plan (counted in stats().planner_failures).", why)


def _optimal(schedule: Schedule | None) -> bool:
    return schedule is not None and schedule.plan.peak == schedule.plan.lower_bound


def _after_fork_in_child() -> None:
    for planner in list(_planners):
        planner._after_fork_in_child()


def _shutdown_all() -> None:
    for planner in list(_planners):
        planner.shutdown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
