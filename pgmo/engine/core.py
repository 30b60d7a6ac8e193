"""The pool's state machine: iterations, modes, departures; free of CuPy, so it runs on the CPU.

Modes (``pool.mode``: what the current iteration does, or the next one):
``warmup`` (the first ``warmup`` iterations) and ``profiling`` (the next one,
logged on the event clock: a tick per alloc and per free; its log is the
profile) serve each request in memory of its own, as does ``planning``
(while a plan is made in the background).  ``optimized``: request ``i``
gets ``arena + offset[i]`` when that is safe; a departure (larger or more
requests, a block freed later than planned) sends the rest of the iteration
to memory of its own, and its log is merged and planned again
(:mod:`.planner`) for a later boundary.  ``fallback``: between
``interrupt()`` and ``resume()`` (CuPy's stock pool), with no arena to be had
(memory of its own), or while no iteration is marked or found (the stock
pool).

Who does what: :mod:`.handout` hands blocks out and takes frees back;
:mod:`.memory` obtains and releases every byte (the footprint policy);
:mod:`.recording`, :mod:`.planner` and :mod:`.schedule` turn logs into
profiles, plans and rows; :mod:`.unmarked` watches for iterations nobody
marks; :mod:`.queries` and :mod:`.report` answer CuPy's queries and
``stats()``.  This module decides, at each request and boundary, which of
them acts, and alone begins and ends iterations (its
:class:`~.state.IterationState` says where it is).

Safety: arena memory is only handed out for request ``k`` of the iteration
that owns the schedule (same thread, same device/stream context), only
while the iteration follows it, and only when every block planned dead by
then is dead (see :mod:`.schedule`); blocks of earlier iterations and plans
are checked by address.  Requests from another thread, device or stream, and
those between ``interrupt()`` and ``resume()``, are outside the plan and
take no request index.
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
from ..trace import Trace, intervals_overlap
from ..units import round_size
from .frees import EXACT, KEPT, STOCK, Inbox
from .handout import FALLBACK, INLINE_MAX, OUTSIDE, SLOW, WATCHED
from .implementation import default_hot_path
from .memory import DeviceMemory
from .options import Backend, PoolOptions
from .planner import Planner
from .queries import PoolQueries
from .recording import Log, absorb, log_of, survivors_of
from .schedule import Schedule
from .shapes import ShapeBook
from .state import IterationState
from .unmarked import LoopWatch, PgmoWarning

__all__ = ["Engine", "PgmoWarning"]  # PgmoWarning: where it was first defined

log = logging.getLogger("pgmo.pool")

_get_ident = threading.get_ident
_MAX_SIZE = 1 << 64  # CuPy takes sizes as size_t
_NO_LIMIT = 1 << 62  # requests per iteration, when no detected length applies
_NO_ROWS = [(-1, -1, ())]


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


class Engine(PoolQueries):
    """Profiling / optimized / fallback state machine over a :class:`~.options.Backend`.

    CuPy's pool queries (bytes, limit, ``free_all_blocks``, ``stats``) come from
    :class:`~.queries.PoolQueries`.
    """

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
                                 _weak(self._serve_checked))
        self.planner = Planner(options.solver, options.replan)
        self.memory = memory = DeviceMemory(hot, backend.allocate, backend.fallback,
                                            backend.oom_error, backend.reserve, backend.heap,
                                            backend.device_memory)
        between, between_source = memory.between_iterations()
        hot.connect(backend.fallback, _weak(memory.exact), _weak(memory.kept),
                    _weak(memory.reuse), backend.context, _weak(memory.released),
                    _weak(between) if hasattr(between, "__self__") else between, between_source)
        weakref.finalize(self, _shut_down, hot.inbox, self.planner)
        #: The allocation entry point (what ``set_allocator`` gets).
        self.malloc = hot.malloc
        #: Called with each schedule when it is installed (the pool saves it).
        self.on_install = None

        self.state = IterationState()
        self.completed = 0  # iterations ended
        self._last_log: Log | None = None
        self.schedule: Schedule | None = None  # installed: the main plan
        self.current: Schedule | None = None  # the plan this iteration follows (main or a shape's)
        self._choosing = False  # the iteration's first request picks its shape's plan
        self._first_request = 0  # its size, once seen (0: not looked at)
        #: Plans of the recurring iteration shapes (buckets, batch sizes, resolutions).
        self.shapes = ShapeBook(self.planner.plan_now)
        self._addresses: dict[int, tuple[int, list]] = {}  # id(schedule) -> (arena ptr, addresses)
        self._pending: Schedule | None = None  # to install at the next boundary
        #: Where iterations come from (marked, detected or none yet).
        self.watch = LoopWatch(options.detect_iterations, options.warn_after)
        self.departures = 0
        self._awaited: tuple[Trace, int] | None = None  # (profile, its arena's least size)

    # ------------------------------------------------------------ exclusivity
    def __enter__(self) -> None:
        """Exclusive access for every entry but the owner's inline malloc.

        When another thread first comes in, the owner loses its lock-free path;
        the newcomer waits until the owner has left it (see ``HotPath.malloc``).
        """
        self._lock.acquire()
        hot = self.hot
        if hot.solo and _get_ident() != hot.owner:
            hot.share()
            while hot.busy:
                time.sleep(0)

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def report_to_hooks(self, thread_hooks, hooked) -> None:
        """Report requests to memory hooks: ``thread_hooks()`` is the calling thread's
        registered hooks (a mapping), ``hooked(size)`` serves and reports one request."""
        hot = self.hot
        owner_hooks = thread_hooks() if _get_ident() == hot.owner else hot.owner_hooks
        hot.connect_hooks(thread_hooks, hooked, owner_hooks)

    def _refresh_kind(self) -> None:
        """Tell the hot path what the owner thread's requests are now."""
        self.hot.set_kind(self.state.hot_kind(self.watch.marked), self.state.inside)

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
            if size >= INLINE_MAX:  # no device has it; the hot path's C integers cannot hold it
                memory = self.memory
                raise memory.oom_error(size, memory.total_bytes(), memory.limit)
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
        watch, state = self.watch, self.state
        if watch.period is not None and state.inside and hot.n >= watch.period \
                and state.recording and _get_ident() == hot.owner:
            self._detected_boundary()  # a dropped period: this request is watched again
        if hot.kind == SLOW:
            if watch.request(rs, hot.watched_frees):
                self._begin(auto=True)
            else:
                hot.counts.outside += 1
                watch.unmarked()
                return self._outside(size, rs, watch.index, WATCHED)
        kind = hot.kind
        if kind != FALLBACK and not self._is_owner():
            hot.counts.foreign += 1  # another thread, device or stream: outside the plan
            return self._outside(size, rs)
        if size < INLINE_MAX:
            try:
                pointer = hot.serve_inline(size, kind)
            except MemoryError:
                pointer = None
            if pointer is not None:
                return pointer
        if kind == FALLBACK:
            pointer = self._outside(size, rs)
            if state.inside:
                hot.counts.interrupted += 1
            else:
                hot.counts.outside += 1
            return pointer
        return self._serve_numbered(size, rs)

    def _outside(self, size: int, rs: int, index: int = -1, iteration: int = OUTSIDE) -> Any:
        """A block for a request outside any iteration's plan (not numbered): the owner's
        between iterations from the heap (where there is a stream-ordered pool), the rest
        (interrupted, another thread or stream) from CuPy's stock pool."""
        hot = self.hot
        if not self.state.inside and hot.between_source != STOCK and _get_ident() == hot.owner:
            return hot.outside_block(hot.between(rs), rs, index, iteration, hot.between_source)
        return hot.outside_block(self.memory.from_stock(size, rs), rs, index, iteration, STOCK)

    def _is_owner(self) -> bool:
        hot = self.hot
        return _get_ident() == hot.owner and (hot.context is None or hot.context() == hot.ctx)

    def _serve_numbered(self, size: int, rs: int) -> Any:
        """A numbered request the inline path left to the engine: a departure or a full device.

        Only decides where it goes; the hot path's ``serve_*`` methods hand it out.
        """
        hot, memory = self.hot, self.memory
        if not self.state.on_plan:
            return hot.serve_unplanned(rs)
        if self._choosing:  # the first request: its shape's plan, then as usual
            self._choose(rs)
            if size < INLINE_MAX:
                pointer = hot.serve_inline(size, hot.kind)
                if pointer is not None:
                    return pointer
        i = hot.n
        cap, o, due = hot.rows[i]
        if rs <= cap:
            if due:
                hot.check_due(due)
            if o >= 0:
                arena = hot.arena
                if not arena.overdue or self._clear(arena, o, o + cap):  # its planned range
                    return hot.serve_planned(arena, rs, rs)
            else:  # a survivor: its kept buffer (the inline path ran out of memory)
                return hot.serve_off_plan(memory.kept(rs), rs, True, KEPT)
            return hot.serve_off_plan(memory.exact(rs), rs, False, EXACT)  # a late free
        self._diverge(i, rs)
        return hot.serve_unplanned(rs)

    def _clear(self, arena, lo: int, hi: int) -> bool:
        """True when ``[lo, hi)`` meets no overdue block; a hit is a departure."""
        for start, end, iteration in arena.overdue.values():
            if intervals_overlap(start, end, lo, hi):
                self.departures += 1
                if iteration == self.hot.iteration:
                    self.state.departed = True  # freed later than planned in this iteration
                return False
        return True

    def _diverge(self, i: int, rs: int) -> None:
        """Bigger or more requests than planned: memory of its own for the rest of the iteration."""
        why = "beyond the planned count" if i >= self.current.n else "larger than planned"
        log.debug("request %d (%d bytes) is %s; off the plan until the iteration ends", i, rs,
                  why)
        self.departures += 1
        self.state.depart()
        self.memory.start_placing(self.current.pinned_sizes | self.schedule.pinned_sizes)
        self._refresh_kind()

    # -------------------------------------------------------------- iterations
    def begin_iteration(self) -> None:
        with self:
            watch = self.watch
            if self.state.inside and watch.period is None:
                raise RuntimeError("begin_iteration() inside an iteration: call "
                                   "end_iteration() first")
            if not watch.marked:  # from now on: a detected iteration and its plan make way
                had_period = watch.mark()
                if self.state.inside:
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
        hot, state = self.hot, self.state
        hot.drain()
        hot.retire()  # blocks of the last iteration, still alive
        self.memory.release_cached()  # what is idle goes back before an arena is taken
        self._at_boundary()
        on_plan = self._plan_ready() and self.completed >= self.options.warmup
        state.begin(self._next_mode(), on_plan)
        # A varying workload's first request names the iteration's shape (it goes to the
        # slow path, once per iteration): its plan, if the shape recurs.
        self._choosing = on_plan and self.options.shape_plans and (
            len(self.shapes) > 0 or self.planner.varying > 0)
        self._first_request = 0
        if on_plan:
            self._follow(None if self._choosing else self.schedule)
        # Planned iterations log into arrays sized for the plan (+1 for the
        # request that goes beyond it); others grow theirs as they go.
        hot.begin(_get_ident(), hot.thread_hooks() if hot.thread_hooks is not None else None,
                  hot.context() if hot.context is not None else None, on_plan,
                  self.watch.period if auto else _NO_LIMIT,
                  max(self.schedule.n, self.shapes.most_requests()) + 1 if on_plan
                  else max(64, hot.n))
        self._refresh_kind()

    def end_iteration(self, aborted: bool = False) -> None:
        """Close the iteration; profile or re-plan as needed.

        ``aborted`` (an exception escaped the iteration) closes it without
        using its log: half an iteration is no profile.
        """
        with self:
            if not self.state.inside:
                raise RuntimeError("end_iteration() without begin_iteration()")
            self._end(aborted)

    def _end(self, aborted: bool) -> bool:
        """Close the iteration; True when it departed from its plan (merged into the profile)."""
        hot, state = self.hot, self.state
        hot.drain()
        state.end()
        hot.end()
        self.memory.stop_placing()
        self._refresh_kind()
        self.completed += 1
        n = hot.n
        if aborted or not n or state.plan_dropped:
            self._at_boundary()
            return False
        departed = False
        if state.planned:
            current = self.current
            if not set(survivors_of(hot, n)) <= current.pinned:
                state.departed = True  # planned blocks outlived the iteration
            if not state.departed:  # the usual case: its log is not needed
                self._at_boundary()
                return False
            departed = True
            run_log = log_of(hot, n, current.profile)  # "as planned" sizes: that plan's
            self._observe_shape(run_log, current)
            kind = "merge"
        else:
            run_log = self._last_log = log_of(hot, n)
            if self._pending is None and self.schedule is None:
                # a plan that became ready during this (planning) iteration is the one to
                # install: profiling the iteration again would supersede it
                self._pending = self.planner.take_ready(None)
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
            self.state.interrupts += 1
            self._refresh_kind()

    def resume(self) -> None:
        with self:
            self.hot.drain()
            if not self.state.interrupts:
                raise RuntimeError("resume() without interrupt()")
            self.state.interrupts -= 1
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
        elif self.schedule is not None:
            self.memory.fit(max(self.schedule.arena_size, self._awaited_size(),
                                self.shapes.arena_size()), self.planner.varying > 0)

    # ------------------------------------------------------------------ shapes
    def _main_key(self) -> int:
        blocks = self.schedule.profile.blocks
        return blocks[0].size if blocks else -1

    def _choose(self, rs: int) -> None:
        """The iteration's first request (``rs`` bytes) names its shape: follow its plan."""
        self._choosing = False
        self._first_request = rs
        chosen = None
        if rs != self._main_key():
            chosen = self.shapes.schedule_for(rs)
            arena = self.hot.arena
            if chosen is not None and (arena is None or chosen.arena_size > arena.size):
                chosen = None  # the arena cannot hold it yet
        if chosen is not None:
            self.shapes.switches += 1
        self._follow(chosen or self.schedule)

    def _follow(self, schedule: Schedule | None) -> None:
        """Answer this iteration from ``schedule`` (None: only the first request is known)."""
        hot = self.hot
        if schedule is None:
            self.current = None
            hot.install(_NO_ROWS)  # the first request goes to the slow path: _choose
            return
        if self.current is schedule and hot.rows is schedule.rows:
            return
        self.current = schedule
        arena = hot.arena
        ptr = arena.ptr if arena is not None else 0
        cached = self._addresses.get(id(schedule))
        if cached is None or cached[0] != ptr or cached[2] is not schedule:
            cached = (ptr, [ptr + row[1] if row[1] >= 0 else 0 for row in schedule.rows],
                      schedule)
            self._addresses[id(schedule)] = cached
        hot.install(schedule.rows, cached[1])

    def _observe_shape(self, run_log: Log, current: Schedule) -> None:
        """A departed iteration: a shape seen twice gets its plan; a shape whose own plan it
        left is planned again from the larger of the two."""
        if not run_log.sizes or not self._first_request:
            return  # the shape was not looked at (a repeating workload)
        key = self._first_request
        if key == self._main_key():
            return
        newest = self.planner.profile  # a newer main profile may be this shape already
        if newest is not None and newest.blocks and newest.blocks[0].size == key:
            return  # its plan is on its way: no second plan for the same shape
        later = self.planner.later if self.planner.mode == "background" else None
        if current is not self.schedule:  # it left its shape's plan
            if self.shapes.forget(key):
                profile, _ = absorb(current.profile, run_log)
                self.shapes.observe(key, Log(*profile.columns()), later, again=True)
        else:
            self.shapes.observe(key, run_log, later)

    def _awaited_size(self) -> int:
        """The least arena a profile still being planned needs (its lower bound): the arena
        keeps that much rather than give back memory the next plan takes again."""
        profile = self.planner.profile
        if profile is None or self.schedule is None or profile is self.schedule.profile:
            return 0
        cached = self._awaited
        if cached is None or cached[0] is not profile:
            cached = self._awaited = (profile, round_size(profile.without_open().lower_bound()))
        return cached[1]

    def _install(self, schedule: Schedule) -> None:
        """Use ``schedule`` from this boundary on; the arena grows or shrinks here only."""
        hot = self.hot
        hot.retire()
        self.memory.fit(max(schedule.arena_size, self.shapes.arena_size()),
                        self.planner.varying > 0)
        self.schedule = schedule
        self._addresses.clear()
        self._follow(schedule)
        if self.on_install is not None:
            self.on_install(schedule)

    def _plan_ready(self) -> bool:
        """A plan is installed and its arena holds it (the device may have refused part)."""
        s = self.schedule
        if s is None:
            return False
        arena = self.hot.arena
        return s.arena_size == 0 or (arena is not None and arena.size >= s.arena_size)

    def optimize(self) -> Plan:
        """Solve the profile (or the last iteration's log) now; it is used from the next iteration."""
        with self:
            self.hot.drain()
        schedule = self.planner.optimize(self._last_log)
        with self:
            self._pending = schedule
            if not self.state.inside:
                self._at_boundary()
            self.options = dataclasses.replace(
                self.options, warmup=min(self.options.warmup, self.completed))
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
            if not self.state.inside:
                self._at_boundary()

    def reset(self) -> None:
        """Forget profile and plan; the next iteration after warm-up is profiled again."""
        with self:
            self.hot.drain()
            self._reset_plan()

    def _reset_plan(self) -> None:
        # An iteration that began planned and lost its plan half-way logged
        # only part of its requests: it is no profile.
        state = self.state
        state.plan_dropped = state.inside and state.planned
        self.planner.reset()
        self.hot.retire()
        self.schedule = self._pending = self.current = None
        self.shapes.clear()
        self._addresses.clear()
        self._choosing = False
        self.hot.install(_NO_ROWS)
        state.on_plan = False
        self._refresh_kind()
        self.memory.drop()

    def close(self) -> None:
        """Stop background work now (also done when the engine is garbage collected)."""
        self.planner.shutdown()

    # ------------------------------------------------------------------- views
    @property
    def mode(self) -> str:
        return self.state.mode(self._next_mode(), self.watch.unplanned)

    def _next_mode(self) -> str:
        """What an iteration starting now does."""
        if self.state.interrupts:
            return "fallback"
        if self.completed < self.options.warmup:
            return "warmup"
        if self.schedule is not None or self._pending is not None:
            if self.memory.blocked and self.schedule is not None and not self._plan_ready():
                return "fallback"
            return "optimized"
        if self.planner.busy:
            return "planning"
        return "profiling"
