"""From iteration logs to schedules: the profile's owner, planning now or in a worker process.

The engine hands the planner each log that changes the profile (the
profiled iteration, or a planned one that departed from its plan) and, at
every iteration boundary, asks for a schedule ready to install.  The mode
(:data:`REPLAN_MODES`, the ``replan`` option) decides where the work happens:

``background`` (default)
    Training never waits for a plan, and no search runs on the training
    process's interpreter: a planning process (:mod:`.worker`, started with
    the pool) folds each log into the profile, plans it with the paper's
    best-fit, then with the full method (``best`` by default), and checks
    and compiles each plan into the hot path's rows.  The training process
    sends the log (a thread of the planner writes it to the worker's pipe)
    and, when rows come back, a thread of the planner wraps them for the
    engine, which installs them at its next boundary (the full method's
    plan if it needs less memory than the best-fit one in use).  A small
    profile (up to :data:`SYNC_BLOCKS` requests) that finds the worker idle
    gets its best-fit plan at the boundary instead (milliseconds), so that
    short runs are planned from the next iteration on; the worker then
    searches for the better one (a first plan that would hold more than the
    heap did is never searched at the boundary in this mode: the worker's plan
    is awaited, :meth:`Planner.improve`).  A newer profile supersedes a running
    search: the worker stops it and plans the newest profile.  A departed
    iteration's log waits while :data:`FOLDS_WAITING` are still to be folded
    (dropped and counted in ``logs_dropped``: an iteration that departs the
    same way brings it again).  The plans installed go to the plan cache from
    the worker too (:meth:`Planner.keep`).  Recurring
    shapes' plans (:mod:`.shapes`) are made there too.  A worker that dies
    or stops answering (past its time limits plus
    :data:`.worker.WORKER_GRACE` in the CPU time it got, or
    :data:`.worker.WALL_FACTOR` times that in wall-clock time: at its low
    priority, :data:`.worker.WORKER_NICE`, a loaded machine gives it little
    CPU) costs the plans it was making, never a wait: it is counted, warned
    about once, the pool keeps its current plan, and the next profile starts
    a new worker.
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

The planner thread's side (what it sends the worker, what it makes of the
answers) is :mod:`.background`.  Tested in ``tests/test_planner.py`` and
``tests/test_variable_workloads.py``.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from ..plan import Plan
from ..solver import SolverOptions, solve
from ..trace import Trace
from .background import KEEP_WAIT, BackgroundPlanning, ShapeDone
from .profiles import Log, absorb, to_profile
from .schedule import Schedule, compile_schedule

if TYPE_CHECKING:  # imported where a worker starts: see BackgroundPlanning._ensure_worker
    from .worker import Worker

__all__ = ["Planner", "FOLDS_WAITING", "REPLAN_MODES", "SYNC_BLOCKS"]

log = logging.getLogger("pgmo.pool")

#: Where plans are computed (the ``replan`` option, checked by
#: :class:`~.options.PoolOptions`).
REPLAN_MODES = ("background", "sync", "bestfit")
#: In background mode, profiles up to this many requests get best-fit at the boundary
#: (folding, best-fit and the plan's check: about 10 us per request, a few milliseconds,
#: well under a boundary's 20 ms); larger ones are folded and planned by the worker.
SYNC_BLOCKS = 256
#: Background mode: a departed iteration's log is not handed over while this many are still
#: to be folded by the worker (a worker starved of CPU, or iterations far shorter than a
#: fold): the queue stays bounded, and an iteration that departs the same way again brings
#: its log once the worker has caught up.
FOLDS_WAITING = 4
_planners: "weakref.WeakSet[Planner]" = weakref.WeakSet()


class Planner(BackgroundPlanning):
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
        #: Background mode: logs up to this many requests are planned with best-fit at once.
        self.sync_blocks = SYNC_BLOCKS
        self.replans = 0  # departures that changed the profile
        self.varying = 0  # departures whose iteration differed in shape from the profile
        self.solve_failures = 0  # solves that raised (the plan stays as it was)
        self.background_solves = 0  # plans of the full method made by the worker
        self.worker_failures = 0  # worker crashed or overran its time
        #: Departed iterations' logs not handed to the worker, which had :data:`FOLDS_WAITING`
        #: still to fold.
        self.logs_dropped = 0
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
        self._unfolded: set[int] = set()  # logs sent to the worker, not folded yet
        self._slot: dict[str, Schedule] = {}  # "ready": a schedule for take_ready (popped)
        self._stale_taken = 0  # stale plans found by take_ready (engine's thread)
        self._stale_answers = 0  # stale plans and stopped searches (planner thread)
        self._shapes: dict[int, tuple[Log, ShapeDone]] = {}  # shape requests sent
        self._keeps: set[int] = set()  # plans to keep (plan cache), handed over, not done
        self._keep_next = None  # the newest plan to keep, not sent yet: (job, request, here)
        self._keep_lock = threading.Lock()  # _keep_next and _keeps change together
        self._thread: threading.Thread | None = None
        self._worker: Worker | None = None
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
        while the work goes on in the worker (``background``).  In ``background``
        mode a small log (up to :attr:`sync_blocks` requests, and a profile as
        small) that finds the worker idle is folded here and gets the paper's
        best-fit plan at once (milliseconds), so that short runs are planned
        from the next iteration on; the worker then searches for the better
        plan of the same profile.
        """
        if self.mode != "background":
            before = self.profile
            profile = self._apply(kind, run_log)
            if profile is before:
                return None  # the profile did not change: the plan in use stays
            method = "bestfit" if self.mode == "bestfit" else self.options.method
            return self._solve_now(profile, self.options.replace(method=method))
        known = schedule = None
        if kind == "merge" and (self._recorded - self._taken) + len(self._unfolded) \
                >= FOLDS_WAITING:
            self.logs_dropped += 1  # the worker is behind: a later departure brings it again
            return None
        before = self.profile
        if self._recorded <= self._taken and not self._in_flight \
                and len(run_log.sizes) <= self.sync_blocks \
                and (kind == "profile" or before is None or len(before.blocks) <= self.sync_blocks):
            # small, and nothing in the worker's hands: best-fit here, the rest there
            before_gen = self.generation
            profile = self._apply(kind, run_log)
            if profile is before:
                return None  # the profile did not change: the plan in use stays
            schedule = self._solve_now(profile, self.options.replace(method="bestfit"))
            if self.options.method == "bestfit" or schedule is not None \
                    and schedule.plan.peak <= self.arena_bound(profile):
                return schedule  # nothing better to search for
            known = (self.generation, before_gen, before)
        self._post(("fold", self._recorded, kind, run_log, known))
        self._recorded += 1
        return schedule

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

    def improve(self, schedule: Schedule) -> Schedule | None:
        """The full method's plan (``best`` where the method is best-fit) of a best-fit
        ``schedule``'s profile, made here, for a plan that would hold more than the heap
        did (:meth:`.plan_choice.PlanChoice._costs_more_than_heap`); None in ``background``
        mode (the training loop would wait for a search: the worker's plan is awaited, and
        judged in turn, while the heap serves), where a search for it goes on already, or
        when the solve fails."""
        if self.mode == "background" or schedule.plan.method != "bestfit" or self.busy \
                or schedule.generation != self.generation:
            return None
        options = self.options.replace(
            method="best" if self.options.method == "bestfit" else self.options.method)
        return self._solve_now(schedule.profile, options, schedule.generation)

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
        """Stop the thread and the worker (the pool is going away); plans handed over to be
        kept (:meth:`keep`) are written first, for up to :data:`KEEP_WAIT` seconds."""
        if self._pid != os.getpid():
            return  # a forked child: those belong to the parent
        self._finish_keeps(KEEP_WAIT)
        self._stop = True
        worker, self._worker = self._worker, None
        self._inbox.put(None)  # wakes the planner thread, which ends
        if worker is not None:
            worker.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        # What was queued or in the worker is lost: nothing is awaited any more, so a pool
        # used after close() profiles again and plans anew (a new thread and worker)
        # instead of waiting for a plan that cannot come.
        self._forget_below = max(self._forget_below, self._recorded)
        self._in_flight.clear()
        self._unfolded.clear()

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


def _after_fork_in_child() -> None:
    for planner in list(_planners):
        planner._after_fork_in_child()


def _shutdown_all() -> None:
    for planner in list(_planners):
        planner.shutdown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
