"""The pool's state machine: iterations, modes, departures; free of CuPy, so it runs on the CPU.

Modes (what the current iteration does, or the next one between iterations):

``warmup``
    The first ``warmup`` iterations (weights and optimizer state are created
    there) are served by the fallback and not recorded.
``profiling``
    The iteration is served by the fallback and logged on the event clock:
    one tick per alloc and per free of its blocks; request ``i`` is the
    i-th non-empty malloc.  Its log becomes the profile.
``planning``
    A plan is being computed in the background; the fallback serves.
``optimized``
    Request ``i`` gets ``arena + offset[i]`` when that is safe, else the
    fallback.  A departure (a request larger than planned, more requests, a
    block freed later than planned) is merged into the profile and planned
    again (:mod:`.planner`); the new plan is installed at a later boundary.
``fallback``
    Between ``interrupt()`` and ``resume()``, when no arena could be
    allocated, or while requests come and no iteration has been marked or
    found (a loop is being looked for, or loop detection is off): the
    fallback, outside any plan.  Before the first request the mode is that of
    the next iteration (``warmup``).

Who does what: :mod:`.handout` hands every block out (numbering, logging and
counting it) and takes its free back; :mod:`.arenas` owns the arenas and
makes room when the device is full; :mod:`.recording` turns logs into
profiles; :mod:`.planner` turns profiles into plans and :mod:`.schedule`
plans into what the hot path reads; :mod:`.unmarked` watches for iterations
nobody marks (with :mod:`.detect`, which finds the period) and warns when
there are none; :mod:`.report` gathers the counters into
:class:`~pgmo.stats.PoolStats`.  This module decides, at each request and
boundary, which of them acts, and alone begins and ends iterations.

Safety: arena memory is only handed out for request ``k`` of the iteration
that owns the schedule (same thread, same device/stream context), only
while the iteration follows it, and only when every block planned dead by
then is dead (see :mod:`.schedule`); blocks of earlier iterations and plans
are checked by address.  Requests from another thread, device or stream, and
those between ``interrupt()`` and ``resume()``, are outside the plan: the
fallback serves them and they take no request index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import threading
import time
import weakref
from typing import Any, Iterator

from ..plan import Plan
from ..stats import PoolStats
from ..trace import Trace, intervals_overlap
from ..units import round_size
from .arenas import ArenaKeeper
from .handout import (FALLBACK, INLINE_MAX, OUTSIDE, PLANNED, RECORDED, SLOW,
                      WATCHED as _WATCHED, Inbox, new_slots)
from .implementation import default_hot_path
from .options import Backend, PoolOptions
from .planner import Planner
from .recording import Log
from .report import pool_stats
from .schedule import Schedule
from .unmarked import LoopWatch, PgmoWarning

__all__ = ["Engine", "PgmoWarning"]  # PgmoWarning: where it was first defined

log = logging.getLogger("pgmo.pool")

_get_ident = threading.get_ident
_MAX_SIZE = 1 << 64  # CuPy takes sizes as size_t
_NO_LIMIT = 1 << 62  # requests per iteration, when no detected length applies


def _weak(method):
    """``method`` called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is None:
            raise RuntimeError("the pgmo pool behind this allocator was deleted")
        return bound(*args)

    return call


def _shut_down(inbox: Inbox, planner: Planner) -> None:
    """The engine is gone: later frees do nothing but release memory; no worker remains."""
    inbox.close()
    planner.shutdown()


class Engine:
    """Profiling / optimized / fallback state machine over a :class:`~.options.Backend`."""

    def __init__(self, backend: Backend, options: PoolOptions | None = None,
                 hot_path: type | None = None):
        """``hot_path``: a :class:`~.handout.HotPath` class (default: the compiled one if built)."""
        self.backend = backend
        self.options = options = options if options is not None else PoolOptions()
        self.fallback = backend.fallback
        self._lock = threading.Lock()
        hot_path = hot_path if hot_path is not None else default_hot_path()
        # The hot path calls back weakly: no cycle keeps a dropped pool (and its
        # arena) alive until the garbage collector runs.
        self.hot = hot = hot_path(backend.memory_type, backend.pointer_type, backend.device_id,
                                 _weak(self._serve_checked), None)
        self.planner = Planner(options.solver, options.replan)
        later = self.planner.later if options.replan == "background" else None
        self.arenas = ArenaKeeper(hot, backend.allocate, backend.fallback, backend.oom_error,
                                  later)
        hot.on_arena_idle = _weak(self.arenas.released)
        hot.context = backend.context
        hot.fallback = backend.fallback
        weakref.finalize(self, _shut_down, hot.inbox, self.planner)
        #: The allocation entry point (what ``set_allocator`` gets).
        self.malloc = hot.malloc
        #: Called with each schedule when it is installed (the pool saves it).
        self.on_install = None

        # iterations
        self._in_iter = False
        self._interrupts = 0
        self._recording = False  # in an iteration and not interrupted
        self._use_plan = False  # this iteration answers from the schedule
        self._planned_iter = False  # it started so
        self._departed = False  # re-plan at the next boundary
        self._plan_dropped = False  # reset() in a planned iteration: its log is no profile
        self._iter_mode = "warmup"
        self.completed = 0  # iterations ended
        self._last_log: Log | None = None
        self.schedule: Schedule | None = None  # installed
        self._pending: Schedule | None = None  # to install at the next boundary

        #: Where iterations come from (marked, detected or none yet).
        self.watch = LoopWatch(options.detect_iterations, options.warn_after)

        # counters
        self.foreign_requests = 0
        self.departures = 0

    # ------------------------------------------------------------ exclusivity
    def __enter__(self) -> None:
        """Exclusive access for every entry but the owner's inline malloc.

        The first time another thread comes in, the owner loses its lock-free
        path; the newcomer waits until the owner has left it (see
        :meth:`~.handout.HotPath.malloc`).
        """
        self._lock.acquire()
        hot = self.hot
        if hot.solo and _get_ident() != hot.owner:
            hot.solo = False  # from now on the owner takes the lock too
            while hot.busy:
                time.sleep(0)

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def report_to_hooks(self, thread_hooks, hooked) -> None:
        """Report requests to memory hooks: ``thread_hooks()`` is the calling thread's
        registered hooks (a mapping), ``hooked(size)`` serves and reports one request."""
        hot = self.hot
        hot.thread_hooks, hot.hooked = thread_hooks, hooked
        if _get_ident() == hot.owner:
            hot.owner_hooks = thread_hooks()

    def _refresh_kind(self) -> None:
        """Tell the hot path what the owner thread's requests are now (see handout.kind)."""
        hot = self.hot
        if self._interrupts:
            kind = FALLBACK
        elif self._in_iter:
            kind = PLANNED if self._use_plan else RECORDED
        elif self.watch.marked:
            kind = FALLBACK
        else:
            kind = SLOW  # watching for a repeating loop
        hot.kind = kind
        hot.in_iter = self._in_iter

    # ------------------------------------------------------------------ malloc
    def _serve_checked(self, size: Any) -> Any:
        """The slow path: memory hooks, CuPy's errors for bad sizes, :meth:`serve` under the lock."""
        hot = self.hot
        if hot.hooked is not None and hot.thread_hooks():
            return hot.hooked(size)
        return self.serve_unhooked(size)

    def serve_unhooked(self, size: Any) -> Any:
        """Serve without reporting to memory hooks (the pool's hook reporting calls this)."""
        try:
            size = operator.index(size)
        except TypeError:
            raise TypeError(f"an integer is required, got {type(size).__name__}") from None
        if size < 0:
            raise OverflowError("can't convert negative value to size_t")
        if size >= _MAX_SIZE:
            raise OverflowError("Python int too large to convert to C unsigned long")
        with self:
            return self.serve(size)

    def serve(self, size: int) -> Any:
        """Serve one request of a valid size (the engine is held): the rare cases.

        The usual ones go through :meth:`~.handout.HotPath.serve_inline`,
        which the owner thread also reaches without the lock.
        """
        hot = self.hot
        hot.drain()
        if size == 0:  # a null memory object, as in CuPy; not a request
            return hot.pointer_type(hot.memory_type(0, 0, None, hot.device_id), 0)
        rs = round_size(size)
        watch = self.watch
        period = watch.period
        if period is not None and self._in_iter and hot.n >= period \
                and self._recording and _get_ident() == hot.owner:
            self._detected_boundary()  # a dropped period: this request is watched again
        if hot.kind == SLOW:
            if watch.request(rs, hot.watched_frees):
                self._begin(auto=True)
            else:
                hot.other_requests += 1
                watch.unmarked()
                return self._outside(size, rs, watch.index, _WATCHED)
        kind = hot.kind
        if kind != FALLBACK and not self._is_owner():
            return self._foreign(size, rs)
        if size < INLINE_MAX:
            try:
                pointer = hot.serve_inline(size, kind)
            except MemoryError:
                pointer = None
            if pointer is not None:
                return pointer
        if kind == FALLBACK:
            if self._in_iter:
                hot.interrupted_requests += 1
            else:
                hot.other_requests += 1
            return self._outside(size, rs)
        return self._serve_numbered(size, rs)

    def _outside(self, size: int, rs: int, index: int = -1, iteration: int = OUTSIDE) -> Any:
        """A fallback block for a request outside any iteration's plan (not numbered)."""
        return self.hot.fallback_block(self.arenas.from_fallback(size, rs), rs, index, iteration)

    def _is_owner(self) -> bool:
        hot = self.hot
        return _get_ident() == hot.owner and (hot.context is None or hot.context() == hot.ctx)

    def _foreign(self, size: int, rs: int) -> Any:
        """Another thread, device or stream during an iteration: outside the plan."""
        self.foreign_requests += 1
        if self._planned_iter:
            self.hot.fallback_requests += 1
        else:
            self.hot.other_requests += 1
        return self._outside(size, rs)

    def _serve_numbered(self, size: int, rs: int) -> Any:
        """A numbered request the inline path left to the engine: a departure or a full device.

        Only decides where it goes; the hot path's ``serve_*`` methods hand it out.
        """
        hot = self.hot
        if not self._use_plan:
            return hot.serve_recorded(self.arenas.from_fallback(size, rs), rs)
        i = hot.n
        cap, o, due = hot.rows[i]
        if rs <= cap:
            if due:
                hot.check_due(due)
            if o >= 0:
                arena = hot.arena
                if not arena.overdue or self._clear(arena, o, o + rs):
                    return hot.serve_planned(arena, rs, rs)
        else:
            self._diverge(i, rs)
        pinned = o < 0 and rs <= cap  # the plan itself sends it to the fallback
        return hot.serve_off_plan(self.arenas.from_fallback(size, rs), rs, pinned)

    def _clear(self, arena, lo: int, hi: int) -> bool:
        """True when ``[lo, hi)`` meets no overdue block; a hit is a departure."""
        for start, end, iteration in arena.overdue.values():
            if intervals_overlap(start, end, lo, hi):
                self.departures += 1
                if iteration == self.hot.iteration:
                    self._departed = True  # freed later than planned in this iteration
                return False
        return True

    def _diverge(self, i: int, rs: int) -> None:
        """Bigger or more requests than planned: the fallback for the rest of the iteration."""
        why = "beyond the planned count" if i >= self.schedule.n else "larger than planned"
        log.debug("request %d (%d bytes) is %s; fallback until the iteration ends", i, rs, why)
        self.departures += 1
        self._use_plan = False
        self._refresh_kind()
        self._departed = True

    # -------------------------------------------------------------- iterations
    def begin_iteration(self) -> None:
        with self:
            watch = self.watch
            if self._in_iter and watch.period is None:
                raise RuntimeError("begin_iteration() inside an iteration: call "
                                   "end_iteration() first")
            if not watch.marked:  # from now on: a detected iteration and its plan make way
                had_period = watch.mark()
                if self._in_iter:
                    self._end(aborted=True)
                if had_period:
                    self._reset_plan()
            self._begin(auto=False)

    def _detected_boundary(self) -> None:
        """End a detected iteration and start the next one, or drop the period and its plan."""
        departed = self._end(aborted=False)
        if self.watch.keep_period(departed):
            self._begin(auto=True)
        else:
            self._reset_plan()

    def _begin(self, auto: bool) -> None:
        hot = self.hot
        hot.drain()
        self.arenas.retire_slots()  # blocks of the last iteration, still alive
        self._at_boundary()
        hot.iteration += 1
        self._in_iter = True
        self._recording = self._interrupts == 0
        hot.owner = _get_ident()
        hot.owner_hooks = hot.thread_hooks() if hot.thread_hooks is not None else None
        hot.ctx = hot.context() if hot.context is not None else None
        hot.n = 0
        hot.tick = 0
        hot.logging_frees = True
        self._departed = False
        self._plan_dropped = False
        self._use_plan = self._plan_ready() and self.completed >= self.options.warmup
        self._planned_iter = hot.planned_iter = self._use_plan
        hot.max_n = self.watch.period if auto else _NO_LIMIT
        self._iter_mode = self._next_mode()
        # Planned iterations log into arrays sized for the plan (+1 for the
        # request that goes beyond it); others grow theirs as they go.
        hot.open_log(self.schedule.n + 1 if self._use_plan else max(64, hot.n))
        self._refresh_kind()

    def end_iteration(self, aborted: bool = False) -> None:
        """Close the iteration; profile or re-plan as needed.

        ``aborted`` (an exception escaped the iteration) closes it without
        using its log: half an iteration is no profile.
        """
        with self:
            if not self._in_iter:
                raise RuntimeError("end_iteration() without begin_iteration()")
            self._end(aborted)

    def _end(self, aborted: bool) -> bool:
        """Close the iteration; True when it departed from its plan (merged into the profile)."""
        hot = self.hot
        hot.drain()
        self._in_iter = False
        self._recording = False
        hot.logging_frees = False
        self._refresh_kind()
        self.completed += 1
        n = hot.n
        if aborted or not n or self._plan_dropped:
            self._at_boundary()
            return False
        departed = False
        if self._planned_iter:
            if not set(hot.survivors(n)) <= self.schedule.pinned:
                self._departed = True  # planned blocks outlived the iteration
            if not self._departed:  # the usual case: its log is not needed
                self._at_boundary()
                return False
            departed = True
            run_log = Log(*hot.log_columns(n))
            kind = "merge"
        else:
            run_log = self._last_log = Log(*hot.log_columns(n))
            if not (self.completed > self.options.warmup and self.schedule is None
                    and self._pending is None and not self.planner.busy):
                self._at_boundary()
                return False
            kind = "profile"
        schedule = self.planner.record(run_log, kind)
        if schedule is not None:
            self._pending = schedule
        self._at_boundary()
        return departed

    def interrupt(self) -> None:
        with self:
            self.hot.drain()
            self._interrupts += 1
            self._recording = False
            self._refresh_kind()

    def resume(self) -> None:
        with self:
            self.hot.drain()
            if not self._interrupts:
                raise RuntimeError("resume() without interrupt()")
            self._interrupts -= 1
            self._recording = self._in_iter and not self._interrupts
            self._refresh_kind()

    @contextlib.contextmanager
    def iteration(self) -> Iterator["Engine"]:
        """One hot iteration; an exception inside discards it as a profile."""
        self.begin_iteration()
        try:
            yield self
        except BaseException:
            self.end_iteration(aborted=True)
            raise
        self.end_iteration()

    @contextlib.contextmanager
    def interrupted(self) -> Iterator["Engine"]:
        self.interrupt()
        try:
            yield self
        finally:
            self.resume()

    # ------------------------------------------------------------------- plans
    def _at_boundary(self) -> None:
        """Between two iterations: install a plan that is ready, or take the arena back."""
        ready = self._pending or self.planner.take_ready(self.schedule)
        self._pending = None
        if ready is not None:
            self._install(ready)
        elif self.schedule is not None and self.arenas.fit(self.schedule.arena_size):
            self.hot.aim()  # a new arena (after free_all_blocks, say)

    def _install(self, schedule: Schedule) -> None:
        """Use ``schedule`` from this boundary on; the arena grows or shrinks here only."""
        self.arenas.retire_slots()
        self.arenas.fit(schedule.arena_size)
        self.schedule = schedule
        self.hot.rows = schedule.rows
        self.hot.slot = new_slots(schedule.n)
        self.hot.aim()
        if self.on_install is not None:
            self.on_install(schedule)

    def _plan_ready(self) -> bool:
        s = self.schedule
        return s is not None and (self.hot.arena is not None or s.arena_size == 0)

    def optimize(self) -> Plan:
        """Solve the profile (or the last iteration's log) now; it is used from the next iteration."""
        with self:
            self.hot.drain()
        schedule = self.planner.optimize(self._last_log)
        with self:
            self._pending = schedule
            if not self._in_iter:
                self._at_boundary()
            self.options = _with_warmup(self.options, min(self.options.warmup, self.completed))
        return schedule.plan

    def adopt(self, profile: Trace, plan: Plan) -> None:
        """Use a plan made elsewhere (a saved file) for ``profile``; checked first.

        Raises :class:`~pgmo.errors.PlanError` when it does not fit; the pool
        then forgets any plan and profiles again.
        """
        try:
            schedule = self.planner.adopt(profile, plan)
        except Exception:
            self.reset()
            raise
        with self:
            self.hot.drain()
            self._pending = schedule
            if not self._in_iter:
                self._at_boundary()

    def reset(self) -> None:
        """Forget profile and plan; the next iteration after warm-up is profiled again."""
        with self:
            self.hot.drain()
            self._reset_plan()

    def _reset_plan(self) -> None:
        # An iteration that began planned and lost its plan half-way logged
        # only part of its requests: it is no profile.
        self._plan_dropped = self._in_iter and self._planned_iter
        self.planner.reset()
        self.arenas.retire_slots()
        self.schedule = self._pending = None
        self.hot.rows = [(-1, -1, ())]
        self.hot.slot = new_slots(0)
        self.hot.aim()
        self._use_plan = False
        self._refresh_kind()
        self.arenas.drop()

    def close(self) -> None:
        """Stop background work now (also done when the engine is garbage collected)."""
        self.planner.shutdown()

    # ------------------------------------------------------------------ memory
    def set_limit(self, size: int) -> None:
        with self:
            self.hot.drain()
            self.arenas.set_limit(size)

    def get_limit(self) -> int:
        return self.arenas.limit

    def used_bytes(self) -> int:
        with self:
            hot = self.hot
            hot.drain()
            return hot.used - hot.fb_used + self.fallback.used_bytes()

    def free_bytes(self) -> int:
        with self:
            hot = self.hot
            hot.drain()
            return (self.arenas.arena_total() - (hot.used - hot.fb_used)
                    + self.fallback.free_bytes())

    def total_bytes(self) -> int:
        with self:
            self.hot.drain()
            return self.arenas.total_bytes()

    def n_free_blocks(self) -> int:
        """Free gaps in the arenas plus the fallback's cached blocks."""
        with self:
            self.hot.drain()
            return self.arenas.free_gaps() + self.fallback.n_free_blocks()

    def free_all_blocks(self) -> None:
        """Release cached fallback blocks, an idle arena between iterations, an idle worker.

        The plan stays: its arena is taken again at the next iteration.
        """
        with self:
            self.hot.drain()
            self.fallback.free_all_blocks()
            arena = self.hot.arena
            if not self._in_iter and arena is not None and self.arenas.idle(arena):
                self.arenas.drop()
            self.arenas.blocked = False
        self.planner.stop_idle_worker()

    def reset_peak_stats(self) -> None:
        """Peaks start again from what is in use and held now (PyTorch's reset_peak_memory_stats)."""
        with self:
            hot = self.hot
            hot.drain()
            hot.peak_used = hot.used
            self.arenas.peak_total = self.arenas.total_bytes()

    # ------------------------------------------------------------------- views
    @property
    def mode(self) -> str:
        if self._interrupts:
            return "fallback"
        if self._in_iter:
            return self._iter_mode
        if self.watch.unplanned:
            return "fallback"  # serving with no iteration to plan: nothing is optimized
        return self._next_mode()

    def _next_mode(self) -> str:
        """What an iteration starting now does."""
        if self._interrupts:
            return "fallback"
        has_plan = self.schedule is not None or self._pending is not None
        if self.completed < self.options.warmup:
            return "warmup"
        if has_plan:
            if self.arenas.blocked and self.hot.arena is None:
                return "fallback"
            return "optimized"
        if self.planner.busy:
            return "planning"
        return "profiling"

    @property
    def in_iteration(self) -> bool:
        return self._in_iter

    @property
    def latest_schedule(self) -> Schedule | None:
        """The schedule in use from the next boundary: the one waiting there, else the installed one."""
        return self._pending or self.schedule

    @property
    def profile(self) -> Trace | None:
        """The profile the installed plan was made for."""
        s = self.latest_schedule
        return s.profile if s is not None else None

    @property
    def plan(self) -> Plan | None:
        s = self.latest_schedule
        return s.plan if s is not None else None

    @property
    def iteration_source(self) -> str:
        """Where iterations come from: "marked", "detected (every n requests)" or "none"."""
        return self.watch.source

    def stats(self) -> PoolStats:
        """Every counter at once (frees applied first, so they are current)."""
        with self:
            self.hot.drain()
            return pool_stats(self)


def _with_warmup(options: PoolOptions, warmup: int) -> PoolOptions:
    return dataclasses.replace(options, warmup=warmup)
