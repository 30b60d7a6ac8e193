"""The pool's state machine: iterations, modes, departures; free of CuPy, so it runs on the CPU.

Modes (``pool.mode``: what the current iteration does, or the next one;
:data:`~.state.MODES`): ``warmup`` (the first ``warmup`` iterations) and
``profiling`` (the next one, logged on the event clock: a tick per alloc and
per free; its log is the profile) serve each request in memory of its own
(the heap, see :mod:`.memory`), as does ``planning`` (while a plan is made
in the background).  ``optimized``: request ``i`` gets ``arena +
offset[i]`` when that is safe.  A request larger than planned, or beyond the
planned count, departs: the rest of the iteration is placed in the arena's
gaps (or memory of its own), and its log is merged and planned again
(:mod:`.planner`) for a later boundary; a block freed later than planned
sends only the request planned on it to memory of its own.  ``fallback``:
between ``interrupt()`` and ``resume()`` (CuPy's stock pool), with no arena
to be had (memory of its own), or while no iteration is marked or found (the
heap, else the stock pool).

Who does what: :mod:`.handout` hands blocks out and takes frees back, and
decides, from the plan's row, what a request of an iteration gets
(:meth:`~.handout.HotPath.serve_numbered`); :mod:`.memory` obtains and
releases every byte (the footprint policy); :mod:`.profiles`,
:mod:`.planner`, :mod:`.shapes` and :mod:`.schedule` turn logs into
profiles, plans and rows; :mod:`.loop_watch` watches for iterations nobody
marks; :mod:`.report` gathers ``stats()``.  This module decides whose a
request is (the owner's, another thread's, one between iterations), what
happens when a request departs from its plan, and, at each boundary, which
plan to follow; it alone begins and ends iterations (its
:class:`~.state.IterationState` says where it is).  It also answers CuPy's
pool queries (bytes, the limit, giving memory back).

Safety: arena memory is only handed out for request ``k`` of the iteration
that owns the schedule (same thread, same device/stream context), only
while the iteration follows it, and only when every block planned dead by
then is dead (see :mod:`.schedule`); blocks of earlier iterations and plans
are checked by address.  Requests from another thread, device or stream, and
those between ``interrupt()`` and ``resume()``, are outside the plan and
take no request index.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from ..plan import Plan
from ..stats import PoolStats
from ..trace import Trace
from ..units import round_size
from .frees import STOCK, Inbox
from .handout import FALLBACK, INLINE_MAX, OUTSIDE, SLOW, WATCHED, HotPath
from .hot_path_choice import default_hot_path
from .memory import DeviceMemory
from .options import Backend, PoolOptions
from .planner import Planner
from .profiles import Log, absorb, log_of, survivors_of
from .report import pool_stats
from .schedule import Schedule
from .shapes import ShapeBook
from .state import IterationState
from .loop_watch import LoopWatch

__all__ = ["Engine", "IterationScope", "InterruptedScope"]

log = logging.getLogger("pgmo.pool")

_get_ident = threading.get_ident
_MAX_SIZE = 1 << 64  # CuPy takes sizes as size_t
_NO_LIMIT = 1 << 62  # requests per iteration, when no detected length applies
_CLOSE_TRIES = 5  # Ctrl-Cs an iteration's closing survives (each interrupts it anew)


def _weak(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
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
    """The pool's state machine over a :class:`~.options.Backend`, and CuPy's pool face.

    Its public methods, all of them:

    * allocation: :attr:`malloc` (the hot path's), :meth:`serve_unhooked`
      (what the pool's hook reporting serves through), :meth:`report_to_hooks`;
    * iterations: :meth:`begin_iteration`, :meth:`end_iteration`,
      :meth:`iteration`, :meth:`interrupt`, :meth:`resume`, :meth:`interrupted`;
    * plans: :meth:`optimize`, :meth:`adopt`, :meth:`reset`, :meth:`close`,
      :attr:`plan`, :attr:`profile`, :attr:`latest_schedule`;
    * CuPy's pool queries: :meth:`used_bytes`, :meth:`free_bytes`,
      :meth:`total_bytes`, :meth:`n_free_blocks`, :meth:`free_all_blocks`,
      :meth:`set_limit`, :meth:`get_limit`, :meth:`reset_peak_stats`,
      :meth:`stats`;
    * views: :attr:`mode`, :attr:`in_iteration`, :attr:`iteration_source`.

    Its parts, read by tests and the pool: ``hot`` (:class:`~.handout.HotPath`),
    ``memory`` (:class:`~.memory.DeviceMemory`), ``planner``, ``state``,
    ``watch`` (:class:`~.loop_watch.LoopWatch`), ``shapes``
    (:class:`~.shapes.ShapeBook`), ``schedule`` and ``current``.
    """

    def __init__(self, backend: Backend, options: PoolOptions | None = None,
                 hot_path: type[HotPath] | None = None):
        """``hot_path``: a :class:`~.handout.HotPath` class (default: the compiled one if built)."""
        self.backend = backend
        self.options = options = options if options is not None else PoolOptions()
        self._lock = threading.Lock()
        hot_path = hot_path if hot_path is not None else default_hot_path()
        # The hot path calls back weakly: no cycle keeps a dropped pool (and its
        # arena) alive until the garbage collector runs.
        self.hot = hot = hot_path(backend.memory_type, backend.pointer_type, backend.device_id,
                                 _weak(self._serve_checked), _weak(self._depart),
                                 _weak(self._freed_late))
        self.planner = Planner(options.solver, options.replan)
        self.memory = memory = DeviceMemory(hot, backend.allocate, backend.fallback,
                                            backend.oom_error, backend.reserve, backend.heap,
                                            backend.device_memory, dict(backend.reasons),
                                            own_heap=options.heap == "own",
                                            stream=backend.context)
        self._context = backend.context
        self._device = backend.device
        between, self._between_source = memory.between_iterations()
        self._between = _weak(between) if hasattr(between, "__self__") else between
        hot.connect(backend.fallback, _weak(memory.exact), _weak(memory.lend_kept),
                    _weak(memory.reuse), backend.context, _weak(memory.released),
                    self._between, self._between_source, backend.device)
        weakref.finalize(self, _shut_down, hot.inbox, self.planner)
        #: The allocation entry point (what ``set_allocator`` gets).
        self.malloc: Callable[[Any], Any] = hot.malloc
        #: Called with each schedule when it is installed (the pool saves it).
        self.on_install: Callable[[Schedule], None] | None = None
        self._thread_hooks: Callable[[], Mapping[Any, Any]] | None = None  # see report_to_hooks
        self._hooked: Callable[[Any], Any] | None = None

        self.state = IterationState()
        self.completed = 0  # iterations ended
        #: Iterations served from memory of their own before plans are used: the
        #: ``warmup`` option, until optimize() asks for a plan sooner.
        self.warmup = options.warmup
        self._last_log: Log | None = None
        self._unplanned_varied = False  # the last two unplanned iterations differed
        self.schedule: Schedule | None = None  # installed: the main plan
        self.current: Schedule | None = None  # the plan this iteration follows (main or a shape's)
        self._first_request = 0  # its size, once seen (0: not looked at)
        #: Plans of the recurring iteration shapes (buckets, batch sizes, resolutions).
        self.shapes = ShapeBook(self.planner.plan_shape)
        # id(schedule) -> (arena ptr, its rows' addresses there, the schedule)
        self._addresses: dict[int, tuple[int, list[int], Schedule]] = {}
        self._pending: Schedule | None = None  # to install at the next boundary
        #: Where iterations come from (marked, detected or none yet).
        self.watch = LoopWatch(options.detect_iterations, options.warn_after)
        self.departures = 0
        self._awaited: tuple[Trace, int] | None = None  # (profile, its arena's least size)
        self._deferred: Schedule | None = None  # a plan whose arena the device refused
        self._opener: Callable[[], object] | None = None  # the open iteration's scope, weakly

    # ------------------------------------------------------------ exclusivity
    # Every entry but the owner's inline malloc runs as ``with self._lock: self._admit()``:
    # a ``with`` over the lock itself releases it whatever is raised after it was taken
    # (a Ctrl-C included), where a Python ``__enter__`` could be interrupted after taking it.
    def _admit(self) -> None:
        """Exclusive access, the lock held: when another thread first comes in, the owner loses
        its lock-free path; the newcomer waits until the owner has left it (see
        ``HotPath.malloc``)."""
        hot = self.hot
        if hot.solo and _get_ident() != hot.owner:
            hot.share()
            while hot.busy:
                time.sleep(0)
        opener = self._opener
        if opener is not None and opener() is None and self.state.inside:
            # the ``with engine.iteration()`` that opened it is gone without closing it (a
            # Ctrl-C landed in its exit's first line): it ends here, unused
            self._end(aborted=True)

    def report_to_hooks(self, thread_hooks: Callable[[], Mapping[Any, Any]],
                        hooked: Callable[[Any], Any]) -> None:
        """Report requests to memory hooks: ``thread_hooks()`` is the calling thread's
        registered hooks (a mapping), ``hooked(size)`` serves and reports one request."""
        self._thread_hooks, self._hooked = thread_hooks, hooked
        if _get_ident() == self.hot.owner:
            self.hot.set_owner_hooks(thread_hooks())

    def _refresh_kind(self) -> None:
        """Tell the hot path what the owner thread's requests are now."""
        self.hot.set_kind(self.state.hot_kind(self.watch.marked), self.state.inside)

    # ------------------------------------------------------------------ malloc
    def _serve_checked(self, size: Any) -> Any:
        """The slow path: memory hooks, CuPy's errors for bad sizes, :meth:`serve` under the lock."""
        if self._hooked is not None and self._thread_hooks is not None and self._thread_hooks():
            return self._hooked(size)
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
        with self._lock:
            self._admit()
            if size >= INLINE_MAX:  # no device has it; the hot path's C integers cannot hold it
                memory = self.memory
                raise memory.oom_error(size, memory.total_bytes(), memory.limit)
            return self.serve(size)

    def serve(self, size: int) -> Any:
        """Serve one request of a valid size (the engine is held): whose request it is.

        The owner thread's usual requests are served inline by the hot path,
        without the lock; this decides the rest: a request watched for a
        repeating loop (or the one that starts a detected iteration), one
        between iterations or interrupted, another thread's, device's or
        stream's, and an iteration's first request when its shape picks the
        plan.  A request of the iteration then gets the hot path's one
        hand-out decision (:meth:`~.handout.HotPath.serve_numbered`).
        """
        hot = self.hot
        hot.drain()
        if size == 0:  # a null memory object, as in CuPy; not a request
            return hot.null_block()
        rs = round_size(size)
        watch, state = self.watch, self.state
        if watch.period is not None and state.inside and hot.n >= watch.period \
                and state.recording and _get_ident() == hot.owner:
            self._detected_boundary()  # a dropped period: this request is watched again
        if hot.kind == SLOW and not state.inside:  # no iteration marked or found yet
            if not watch.request(rs, hot.watched_frees):
                watch.unmarked()
                return self._outside(size, rs, index=watch.index, iteration=WATCHED)
            self._begin(auto=True)
        if hot.kind == FALLBACK:
            return self._outside(size, rs)
        if not self._is_owner():  # another thread, device or stream: outside the plan
            return self._outside(size, rs, foreign=True)
        if state.choosing:
            self._choose(rs)
        return hot.serve_numbered(rs)

    def _outside(self, size: int, rs: int, foreign: bool = False, index: int = -1,
                 iteration: int = OUTSIDE) -> Any:
        """A block for a request outside any iteration's plan (not numbered): the owner's
        between iterations from the heap (where there is a stream-ordered pool), the rest
        (interrupted, another thread or stream) from CuPy's stock pool."""
        hot = self.hot
        if not self.state.inside and self._between_source != STOCK and \
                _get_ident() == hot.owner and self._on_own_device():
            block, source = self._between(rs), self._between_source
        else:
            block, source = self.memory.from_stock(size, rs), STOCK
        return hot.serve_outside(block, rs, source, foreign, index, iteration)

    def _on_own_device(self) -> bool:
        """The current device is the pool's: its arena and heap are that device's memory
        only (peer access does not cover virtual-memory mappings)."""
        return self._device is None or self._device() == self.backend.device_id

    def _is_owner(self) -> bool:
        """The request comes from the thread, device and stream the iteration's plan serves."""
        hot = self.hot
        return _get_ident() == hot.owner and (self._context is None or
                                              self._context() == hot.ctx)

    # ------------------------------------------------------------- departures
    def _depart(self, i: int, rs: int) -> None:
        """Request ``i`` is larger than planned or beyond the planned count: the rest of the
        iteration is off the plan (placed in the arena's gaps) and its log is planned again.

        Called by the hot path's hand-out decision, which then serves the request off plan.
        """
        current, schedule = self.current, self.schedule
        assert current is not None and schedule is not None  # only a planned request departs
        why = "beyond the planned count" if i >= current.n else "larger than planned"
        log.debug("request %d (%d bytes) is %s; off the plan until the iteration ends", i, rs,
                  why)
        self.departures += 1
        self.state.depart()
        self.memory.start_placing(current.pinned_sizes | schedule.pinned_sizes)
        self._refresh_kind()

    def _freed_late(self, iteration: int) -> None:
        """A block of ``iteration``, freed later than planned, lies where a request was
        planned: that request gets memory of its own; this iteration's log goes to the
        planner when the block is its own (the plan goes on)."""
        self.departures += 1
        if iteration == self.hot.iteration:
            self.state.departed = True

    # -------------------------------------------------------------- iterations
    def begin_iteration(self, opener: object = None) -> None:
        """Start an iteration; ``opener``: the :class:`IterationScope` that will end it (an
        iteration whose opener is gone unended is ended at the engine's next call)."""
        with self._lock:
            self._admit()
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
            self._begin(auto=False, opener=opener)

    def _detected_boundary(self) -> None:
        """End a detected iteration and start the next one, or drop the period and its plan."""
        departed = self._end(aborted=False)
        if self.watch.keep_period(departed):
            self._begin(auto=True)
        else:
            self._reset_plan()

    def _begin(self, auto: bool, opener: object = None) -> None:
        hot, state = self.hot, self.state
        hot.drain()
        hot.retire()  # blocks of the last iteration, still alive
        self.memory.release_cached()  # what is idle goes back before an arena is taken
        self._at_boundary()
        elsewhere = not self._on_own_device()  # its requests go to CuPy's pool for its device
        on_plan = self._plan_ready() and self.completed >= self.warmup and not elsewhere
        # A varying workload's first request names the iteration's shape (it goes to the
        # slow path, once per iteration): its plan, if the shape recurs.
        choosing = on_plan and self.options.shape_plans and (
            len(self.shapes) > 0 or self.planner.varying > 0)
        self._opener = weakref.ref(opener) if opener is not None else None
        state.begin("fallback" if elsewhere else self._next_mode(), on_plan, choosing,
                    elsewhere)
        self._first_request = 0
        if on_plan:
            self._follow(None if choosing else self.schedule)
        # Planned iterations log into arrays sized for the plan (+1 for the
        # request that goes beyond it); others grow theirs as they go.
        period = self.watch.period  # a detected iteration's length (auto: it has one)
        hot.begin(_get_ident(), self._thread_hooks() if self._thread_hooks is not None else None,
                  self._context() if self._context is not None else None, on_plan,
                  period if auto and period is not None else _NO_LIMIT,
                  max(self.schedule.n, self.shapes.most_requests()) + 1
                  if on_plan and self.schedule is not None else max(64, hot.n))
        self._refresh_kind()

    def end_iteration(self, aborted: bool = False) -> None:
        """Close the iteration; profile or re-plan as needed.

        ``aborted`` (an exception escaped the iteration) closes it without
        using its log: half an iteration is no profile.
        """
        with self._lock:
            self._admit()
            if not self.state.inside:
                raise RuntimeError("end_iteration() without begin_iteration()")
            self._end(aborted)

    def _end(self, aborted: bool) -> bool:
        """Close the iteration; True when it departed from its plan (merged into the profile).

        The iteration is closed first, whatever is raised in between (a
        Ctrl-C): profiling and planning come after, and an exception there
        costs a profile or a plan, never an open iteration."""
        hot, state = self.hot, self.state
        try:
            hot.drain()
        finally:
            # one line (see "Commits" in frees.py): no longer inside, no longer numbered
            state.end(); hot.end(); self.completed += 1  # noqa: E702
        self.memory.stop_placing()
        self._refresh_kind()
        n = hot.n
        if aborted or not n or state.plan_dropped:
            self._at_boundary()
            return False
        departed = False
        if state.planned:
            current = self.current
            assert current is not None  # a planned iteration with requests follows a plan
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
            previous = self._last_log if self.completed > self.warmup + 1 else None
            run_log = self._last_log = log_of(hot, n)
            # Unplanned iterations after the warm-up that differ from one another: the next
            # may not fit the memory the heap holds the way this one did (_at_boundary).
            self._unplanned_varied = previous is not None and previous.sizes != run_log.sizes
            if self._pending is None and self.schedule is None:
                # a plan that became ready during this (planning) iteration is the one to
                # install: profiling the iteration again would supersede it
                self._pending = self.planner.take_ready(None)
            if not (self.completed > self.warmup and self.schedule is None
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
        with self._lock:
            self._admit()
            self.hot.drain()
            self.state.interrupts += 1
            self._refresh_kind()

    def resume(self) -> None:
        with self._lock:
            self._admit()
            self.hot.drain()
            if not self.state.interrupts:
                raise RuntimeError("resume() without interrupt()")
            self.state.interrupts -= 1
            self._refresh_kind()

    def iteration(self, result: Any = None) -> "IterationScope":
        """One hot iteration (``with engine.iteration():``); an exception inside discards it
        as a profile.  ``as`` gives ``result`` (the engine by default).

        Whatever is raised (a Ctrl-C included: inside, while it begins or
        while it ends), the iteration it opened is closed on the way out."""
        return IterationScope(self, self if result is None else result)

    def _abandon(self) -> None:
        """Close an iteration an exception left open, without using its log; a second Ctrl-C
        while it closes does not leave it open (it is raised once it is closed)."""
        second: KeyboardInterrupt | None = None
        for _ in range(_CLOSE_TRIES):
            try:
                with self._lock:
                    self._admit()
                    if self.state.inside:
                        self._end(aborted=True)
                break
            except KeyboardInterrupt as e:  # closed first, raised after
                second = e
        if second is not None:
            raise second

    def interrupted(self, result: Any = None) -> "InterruptedScope":
        """``interrupt()`` ... ``resume()`` (``with engine.interrupted():``), resumed whatever
        is raised; ``as`` gives ``result`` (the engine by default)."""
        return InterruptedScope(self, self if result is None else result)

    # ------------------------------------------------------------------- plans
    def _at_boundary(self) -> None:
        """Between two iterations: install a plan that is ready (or one whose arena the
        device refused before), or take the arena back."""
        ready = self._pending or self.planner.take_ready(self.schedule) or self._deferred
        self._pending = self._deferred = None
        varied, self._unplanned_varied = self._unplanned_varied, False
        if ready is not None:
            self._install(ready)
        elif self.schedule is not None:
            self.memory.fit(max(self.schedule.arena_size, self._awaited_size(),
                                self.shapes.arena_size()), self.planner.varying > 0)
        elif varied:
            # No plan yet, and the iterations waiting for it vary: what the heap holds idle
            # goes back, so that a late plan costs no more than they need.  (Iterations that
            # repeat reuse the heap's memory as it lies: trimming it would cost them more.)
            self.memory.trim_heap()

    # ------------------------------------------------------------------ shapes
    def _main_key(self) -> int:
        """The main plan's shape: its first request's size."""
        blocks = self.schedule.profile.blocks if self.schedule is not None else ()
        return blocks[0].size if blocks else -1

    def _choose(self, rs: int) -> None:
        """The iteration's first request (``rs`` bytes) names its shape: follow its plan."""
        self.state.choosing = False
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
        self._refresh_kind()

    def _follow(self, schedule: Schedule | None) -> None:
        """Answer this iteration from ``schedule`` (None: no plan until the first request
        names the iteration's shape, see :meth:`_choose`)."""
        hot = self.hot
        if schedule is None:
            hot.install(None)
            self.current = None
            return
        if self.current is schedule:
            return
        arena = hot.arena
        ptr = arena.ptr if arena is not None else 0
        cached = self._addresses.get(id(schedule))
        if cached is None or cached[0] != ptr or cached[2] is not schedule:
            cached = (ptr, hot.addresses_for(schedule.rows), schedule)
            self._addresses[id(schedule)] = cached
        hot.install(schedule.rows, cached[1])
        self.current = schedule  # after: cut short before, the next call installs it

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
        if current is not self.schedule:  # it left its shape's plan
            if self.shapes.forget(key):
                profile, _ = absorb(current.profile, run_log)
                self.shapes.observe(key, Log(*profile.columns()), again=True)
        else:
            self.shapes.observe(key, run_log)

    def _awaited_size(self) -> int:
        """The least arena a profile still being planned needs (its lower bound): the arena
        keeps that much rather than give back memory the next plan takes again."""
        profile = self.planner.profile
        if profile is None or self.schedule is None or profile is self.schedule.profile:
            return 0
        cached = self._awaited
        if cached is None or cached[0] is not profile:
            cached = self._awaited = (profile, round_size(self.planner.arena_bound(profile)))
        return cached[1]

    def _install(self, schedule: Schedule) -> None:
        """Use ``schedule`` from this boundary on; the arena grows or shrinks here only."""
        hot = self.hot
        hot.retire()
        self.memory.fit(max(schedule.arena_size, self.shapes.arena_size()),
                        self.planner.varying > 0)
        old = self.schedule
        arena = hot.arena
        if old is not None and old is not schedule and arena is not None \
                and arena.size < schedule.arena_size and arena.size >= old.arena_size:
            # The device refused the larger arena: keep the plan the arena holds (its
            # iterations leave it and are placed in its gaps) rather than strand it, and
            # try the larger one again at the next boundary.
            self._deferred = schedule
            return
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
        with self._lock:
            self._admit()
            self.hot.drain()
        schedule = self.planner.optimize(self._last_log)
        with self._lock:
            self._admit()
            self._pending = schedule
            if not self.state.inside:
                self._at_boundary()
            self.warmup = min(self.warmup, self.completed)  # the plan is wanted now
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
        with self._lock:
            self._admit()
            self.hot.drain()
            self._pending = schedule
            if not self.state.inside:
                self._at_boundary()

    def reset(self) -> None:
        """Forget profile and plan; the next iteration after warm-up is profiled again."""
        with self._lock:
            self._admit()
            self.hot.drain()
            self._reset_plan()

    def _reset_plan(self) -> None:
        # An iteration that began planned and lost its plan half-way logged
        # only part of its requests: it is no profile.
        state = self.state
        state.plan_dropped = state.inside and state.planned
        self.planner.reset()
        self.hot.retire()
        self.schedule = self._pending = self.current = self._deferred = None
        self.shapes.clear()
        self._addresses.clear()
        state.choosing = False
        self.hot.install(None)
        state.on_plan = False
        self._refresh_kind()
        self.memory.drop()

    def close(self) -> None:
        """Stop background work now (also done when the engine is garbage collected)."""
        self.planner.shutdown()

    # --------------------------------------------------- CuPy's pool queries
    # Each takes the lock and applies pending frees first, so that what it reports is
    # current; the numbers come from the device memory and the hot path's counters.
    def set_limit(self, size: int) -> None:
        with self._lock:
            self._admit()
            self.hot.drain()
            self.memory.set_limit(size)

    def get_limit(self) -> int:
        return self.memory.limit

    def used_bytes(self) -> int:
        with self._lock:
            self._admit()
            hot = self.hot
            hot.drain()
            return hot.used

    def free_bytes(self) -> int:
        with self._lock:
            self._admit()
            self.hot.drain()
            return self.memory.own_free_bytes() + self.memory.stock.free_bytes()

    def total_bytes(self) -> int:
        with self._lock:
            self._admit()
            self.hot.drain()
            return self.memory.total_bytes()

    def n_free_blocks(self) -> int:
        """Free gaps in the arenas, idle kept buffers, and the stock pool's cached blocks."""
        with self._lock:
            self._admit()
            self.hot.drain()
            return self.memory.free_gaps() + self.memory.stock.n_free_blocks()

    def free_all_blocks(self) -> None:
        """Give back every idle byte: the stock pool's cache, idle survivors' buffers, the
        arena between iterations, an idle worker.

        The plan stays: its arena is taken again at the next iteration.
        """
        with self._lock:
            self._admit()
            self.memory.release_idle(arena_too=not self.state.inside)
        self.planner.stop_idle_worker()

    def reset_peak_stats(self) -> None:
        """Peaks start again from what is in use and held now (PyTorch's reset_peak_memory_stats)."""
        with self._lock:
            self._admit()
            self.hot.drain()
            self.hot.reset_peak()
            self.memory.peak_total = self.memory.total_bytes()

    def stats(self) -> PoolStats:
        """Every counter at once (frees applied first, so they are current)."""
        with self._lock:
            self._admit()
            self.hot.drain()
            return pool_stats(self)

    # ------------------------------------------------------------------- views
    @property
    def in_iteration(self) -> bool:
        with self._lock:
            self._admit()
            return self.state.inside

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

    @property
    def mode(self) -> str:
        return self.state.mode(self._next_mode(), self.watch.unplanned)

    def _next_mode(self) -> str:
        """What an iteration starting now does."""
        if self.state.interrupts:
            return "fallback"
        if self.completed < self.warmup:
            return "warmup"
        if self.schedule is not None or self._pending is not None:
            if self.memory.blocked and self.schedule is not None and not self._plan_ready():
                return "fallback"
            return "optimized"
        if self.planner.busy:
            return "planning"
        return "profiling"


class IterationScope:
    """``with engine.iteration():`` (a class, not a generator: one that is garbage collected
    unfinished closes nothing, where a generator's finalizer would take the engine's lock
    wherever the collector runs, the engine's own code included)."""

    __slots__ = ("_engine", "_result", "_nested", "__weakref__")

    def __init__(self, engine: Engine, result: Any):
        self._engine, self._result, self._nested = engine, result, False

    def __enter__(self) -> Any:
        engine = self._engine
        self._nested = engine.state.inside and engine.watch.period is None  # refused below
        try:
            engine.begin_iteration(self)
            return self._result
        except BaseException:
            if not self._nested:
                engine._abandon()
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        engine = self._engine
        if kind is not None:
            engine._abandon()
            return
        try:
            engine.end_iteration()
        except BaseException:
            engine._abandon()
            raise


class InterruptedScope:
    """``with engine.interrupted():`` (a class, see :class:`IterationScope`)."""

    __slots__ = ("_engine", "_result", "_before")

    def __init__(self, engine: Engine, result: Any):
        self._engine, self._result, self._before = engine, result, 0

    def __enter__(self) -> Any:
        engine = self._engine
        self._before = engine.state.interrupts
        try:
            engine.interrupt()
            return self._result
        except BaseException:
            if engine.state.interrupts > self._before:
                engine.resume()
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if self._engine.state.interrupts > self._before:
            self._engine.resume()
