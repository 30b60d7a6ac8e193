"""The planner's background half: the thread that talks to the planning process.

In ``background`` mode (:mod:`.planner`) the training thread only hands work
over, through one queue; a thread of the planner takes it in order, sends
each log (with the profile to fold it into, if the worker lacks it) and each
recurring shape to the worker (:mod:`.worker`), and makes the worker's
answers into what the training thread reads at its boundaries: the current
profile (one tuple, stored at once) and a ready schedule (popped whole).  A
worker that exits, breaks the protocol or overruns its time is stopped,
counted and warned about once; what it was making is lost, never waited for.

Part of :class:`~.planner.Planner` (a mixin: its methods run on the planner
thread and read the planner's state); tested through the planner, in
``tests/test_planner.py`` and ``tests/test_planner_failures.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..plan import Plan
from ..solver import SolverOptions
from ..trace import Trace
from .profiles import Log, to_profile
from .schedule import Schedule

if TYPE_CHECKING:  # imported where a worker starts, see _ensure_worker
    from .worker import Message, Worker

__all__ = ["BackgroundPlanning", "ShapeDone", "KEEP_SECONDS", "KEEP_WAIT"]

log = logging.getLogger("pgmo.pool")

#: Seconds the worker may take to keep a plan in the plan cache (warm-up plans, the write).
KEEP_SECONDS = 30.0
#: Seconds a pool going away waits for the plans it handed over to be kept.
KEEP_WAIT = 10.0

#: What a recurring shape's plan is handed to (None: no plan).
ShapeDone = Callable[[Schedule | None], None]


class BackgroundPlanning:
    """The planner thread's work (see the module's docstring)."""

    # The planner's state (set in Planner._init_threading), read and written here.
    options: SolverOptions

    @property
    def generation(self) -> int:
        raise NotImplementedError  # Planner.generation

    @property
    def profile(self) -> Trace | None:
        raise NotImplementedError  # Planner.profile

    replans: int
    varying: int
    solve_failures: int
    background_solves: int
    worker_failures: int
    _warned: bool
    _numbers: itertools.count
    _own: tuple[int, Trace | None]
    _answered: tuple[int, Trace | None]
    _epoch: int
    _inbox: queue.SimpleQueue
    _taken: int
    _forget_below: int
    _in_flight: set[int]
    _unfolded: set[int]
    _slot: dict[str, Schedule]
    _stale_answers: int
    _shapes: dict[int, tuple[Log, ShapeDone]]
    _keeps: set[int]
    _keep_next: tuple[int, Callable[[], dict[str, Any]], Callable[[], None]] | None
    _keep_lock: threading.Lock
    _thread: threading.Thread | None
    _worker: Worker | None
    _worker_gen: int
    _arena: tuple[Trace, Trace] | None
    _stop: bool
    _starting: threading.Lock

    # ---------------------------------------------------- the planner thread
    def _post(self, item: tuple) -> None:
        """Hand ``item`` to the planner thread (started if need be).

        The thread is started before the item is queued: a Ctrl-C between the
        two then costs this item only, where the other order could leave an
        item queued with no thread to run it (and ``wait_idle`` waiting)."""
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
        self._inbox.put(item)

    def keep(self, request: Callable[[], dict[str, Any]], here: Callable[[], None]) -> None:
        """Keep an installed plan in the plan cache from the worker: ``request()`` (made on
        the planner thread) is :meth:`pgmo.plan_cache.PlanCache.keep_request`'s; ``here()``
        keeps it on the planner thread where no worker can be had.  Not stopped by a newer
        profile, but replaced by a newer plan to keep while it waits (the newer plan
        supersedes it); :meth:`~.planner.Planner.shutdown` waits for it (see
        :data:`KEEP_WAIT`).

        One store hands it over; the queued item only wakes the planner thread, so a
        Ctrl-C between the two leaves the plan waiting where the next hand-over, or
        shutdown, sends it (never a job that nobody clears)."""
        job = next(self._numbers)
        with self._keep_lock:
            self._keep_next = (job, request, here)
        self._post(("keep",))

    def _send_keep(self) -> None:
        """Send the newest plan to keep, if one waits (a newer plan supersedes one that has
        not left yet)."""
        with self._keep_lock:  # listed before it stops waiting: shutdown always sees one
            newest = self._keep_next
            if newest is None:
                return
            job, request, here = newest
            self._keeps.add(job)
            self._keep_next = None
        try:
            worker = self._ensure_worker()
            if worker is None:
                here()
                self._keeps.discard(job)
                return
            worker.submit(job, {**request(), "op": "keep", "job": job}, KEEP_SECONDS)
        except BaseException:
            worker = self._worker
            if worker is None or job not in worker.pending:
                self._keeps.discard(job)
            raise

    def _keeping(self) -> bool:
        """Whether a plan handed over to be kept is not kept yet."""
        return bool(self._keeps) or self._keep_next is not None

    def _finish_keeps(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) for the plans handed over to be kept; the
        worker's searches are stopped meanwhile (the pool is going away)."""
        if not self._keeping() or threading.current_thread() is self._thread:
            return
        if self._keep_next is not None:  # one a Ctrl-C left unqueued: sent after the rest
            self._post(("keep",))
        worker = self._worker
        if worker is not None:
            worker.finish()
        deadline = time.monotonic() + timeout
        while self._keeping() and time.monotonic() < deadline and not self._stop:
            time.sleep(0.005)

    def _on_message(self, worker: Worker, message: Message | None) -> None:
        self._inbox.put(("message", worker, message))

    def _take(self) -> list[tuple]:
        """Wait for work (or the worker's deadline), then take all there is."""
        worker = self._worker
        timeout = None if worker is None or worker.idle else worker.next_check()
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
                        known = item[4]  # folded and planned with best-fit already
                        job = next(self._numbers) if known is None else known[0]
                        self._in_flight.add(job)
                        self._unfolded.add(job)
                        self._taken = max(self._taken, item[1] + 1)
                        self._send_fold(job, *item[1:])
                    elif item[0] == "chore":
                        item[1]()
                    elif item[0] == "message":
                        self._handle(item[1], item[2])
                    elif item[0] == "shape":
                        self._send_shape(item[1], item[2])
                    elif item[0] == "keep":
                        self._send_keep()
                except Exception:  # never let the thread die silently
                    worker = self._worker
                    if job is not None and (worker is None or job not in worker.pending):
                        self._in_flight.discard(job)  # a log it did not send is not awaited
                        self._unfolded.discard(job)
                        self._keeps.discard(job)
                    self._worker_failed(None, "the planner thread failed")
                    log.debug("planner thread error", exc_info=True)
            worker = self._worker
            if worker is not None and worker.overdue():
                self._worker_failed(worker, "it took longer than its time limit")

    def _start_worker(self) -> None:
        self._ensure_worker()

    def _ensure_worker(self) -> Worker | None:
        """The worker, started if need be (only this thread starts workers)."""
        worker = self._worker
        if worker is not None:
            return worker
        try:
            # imported here, not at the top: ``python -m pgmo.engine.worker`` imports
            # this package first, and must not find its own module imported already
            from .worker import Worker
            worker = Worker(on_message=self._on_message)
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
        from .worker import budget  # imported here: see _ensure_worker
        return budget(stages)

    def _send_fold(self, job: int, index: int, kind: str, run_log: Log,
                   known: tuple[int, int, Trace | None] | None) -> None:
        """Hand a log to the worker, with the profile to fold it into if it lacks it.

        ``known``: the training thread folded it already, into the profile of
        ``(job, generation, profile)`` (and made the best-fit plan): the
        worker folds it into the same profile and makes the full method's plan
        only, for ``job`` (the folded profile's generation)."""
        if index < self._forget_below:  # a reset or an adopted plan came after it
            self._in_flight.discard(job)
            return
        worker = self._ensure_worker()
        if worker is None:
            self._in_flight.discard(job)  # this log's plan is lost
            self._unfolded.discard(job)
            return
        base = None
        generation, profile = (self.generation, self.profile) if known is None else known[1:]
        if kind == "merge" and self._worker_gen != generation:
            # the worker does not hold the current profile: it gets it with the log
            if profile is None:
                kind = "profile"
            else:
                base = profile.log_columns()
                self._worker_gen = generation
        stages = self._stages(self.options.method)[0 if known is None else 1:]
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
    def _handle(self, worker: Worker, message: Message | None) -> None:
        if message is None:  # the worker is gone: what it was making is lost
            self._in_flight.difference_update(worker.pending)
            self._unfolded.difference_update(worker.pending)
            self._keeps.difference_update(worker.pending)
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
            self._unfolded.discard(job)
            self._keeps.discard(job)
            if message.get("cancelled"):
                self._stale_answers += 1
            shape = self._shapes.pop(job, None)
            if shape is not None:  # answered without a plan
                shape[1](None)
        elif op == "log":  # the worker's warning, logged here (see the worker's module)
            logging.getLogger(str(message.get("logger", "pgmo"))).log(
                int(message.get("level", logging.WARNING)), "%s", message.get("message"))
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
        self._unfolded.discard(job)
        if "error" in message:
            self.solve_failures += 1
            log.warning("pgmo's planner could not fold an iteration into the profile (%s); "
                        "keeping the current plan", message["error"])
            return
        if message["changed"]:
            self._worker_gen = job  # what the worker holds now, current or not
        if job < self._epoch:
            return  # made before a reset or an adopted plan: forgotten
        folded_here = job == self._own[0]  # the training thread folded and counted it
        if not folded_here:
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
        if message["kind"] == "merge" and not folded_here:
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

    def _worker_failed(self, worker: Worker | None, why: str) -> None:
        """Count and warn (once); a worker is stopped, and what it was making is lost."""
        if worker is not None:
            if self._worker is worker:
                self._worker = None
            self._in_flight.difference_update(worker.pending)
            self._unfolded.difference_update(worker.pending)
            self._keeps.difference_update(worker.pending)
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
