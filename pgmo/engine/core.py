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
request is (the owner's, another thread's, one between iterations) and what
happens when a request departs from its plan; it alone begins and ends
iterations (its :class:`~.state.IterationState` says where it is).  Two
mixins complete :class:`Engine`: :mod:`.plan_choice` (at each boundary and
at an iteration's first request, which plan to follow; ``optimize``,
``adopt``, ``reset``) and :mod:`.pool_queries` (CuPy's pool queries: bytes,
the limit, giving memory back; the views).  :mod:`.scopes` holds the
``with`` blocks.

Safety: arena memory is only handed out for request ``k`` of the iteration
that owns the schedule (same thread, same device/stream context), only
while the iteration follows it, and only when every block planned dead by
then is dead (see :mod:`.schedule`); blocks of earlier iterations and plans
are checked by address.  Requests from another thread, device or stream, and
those between ``interrupt()`` and ``resume()``, are outside the plan and
take no request index.

Tested in ``tests/test_engine_*.py`` (one module per concern: boundaries,
departures, threads, iterations...), and through the pool in
``tests/test_pool*.py``.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from ..trace import Trace
from ..units import round_size
from .frees import STOCK, Inbox
from .handout import FALLBACK, INLINE_MAX, OUTSIDE, SLOW, WATCHED, HotPath
from .hot_path_choice import default_hot_path
from .memory import DeviceMemory
from .options import Backend, PoolOptions
from .plan_choice import PlanChoice
from .planner import Planner
from .pool_queries import PoolQueries
from .profiles import Log, log_of, outlived_its_plan
from .schedule import Schedule
from .scopes import InterruptedScope, IterationScope
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


class Engine(PlanChoice, PoolQueries):
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

    The plan calls come from :class:`~.plan_choice.PlanChoice`, the pool queries
    and views from :class:`~.pool_queries.PoolQueries` (a start from a plan of an earlier
    run, ``hints``: :class:`~.hinted.HintedStart`, which ``PlanChoice`` extends).

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
                                 slow=_weak(self._serve_checked),
                                 on_departure=_weak(self._depart),
                                 on_late_free=_weak(self._freed_late))
        self.planner = Planner(options.solver, options.replan)
        self.memory = memory = DeviceMemory(hot, backend.allocate, backend.fallback,
                                            backend.oom_error, backend.reserve, backend.heap,
                                            backend.device_memory, dict(backend.reasons),
                                            own_heap=options.heap != "driver",
                                            pages=options.heap == "pages",
                                            stream=backend.context)
        self._context = backend.context
        self._device = backend.device
        between, self._between_source = memory.between_iterations()
        self._between = _weak(between) if hasattr(between, "__self__") else between
        hot.connect(stock=backend.fallback, exact=_weak(memory.exact),
                    kept=_weak(memory.lend_kept), reuse=_weak(memory.reuse),
                    context=backend.context, on_arena_idle=_weak(memory.released),
                    between=self._between,  # memory.exact, or the stock pool's malloc
                    between_source=self._between_source, device=backend.device)
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
        self.shapes = ShapeBook(plan=self.planner.plan_shape)
        # id(schedule) -> (arena ptr, its rows' addresses there, the schedule)
        self._addresses: dict[int, tuple[int, list[int], Schedule]] = {}
        self._pending: Schedule | None = None  # to install at the next boundary
        #: Where iterations come from (marked, detected or none yet).
        self.watch = LoopWatch(options.detect_iterations, options.warn_after)
        self.departures = 0
        self._awaited: tuple[Trace, int] | None = None  # (profile, its arena's least size)
        self._deferred: Schedule | None = None  # a plan whose arena the device refused
        self._opener: Callable[[], object] | None = None  # the open iteration's scope, weakly
        self._began_auto = False  # the open iteration was detected (its length is known)
        self._init_hints()  # no plan of an earlier run yet (hinted.py)

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
        # off the plan first: a Ctrl-C the user catches below leaves an iteration served
        # from memory of its own, never from the plan beside a placer that lists its places
        # as gaps (which a trim inside the iteration would unmap)
        self._refresh_kind()
        self.memory.start_placing(current.pinned_sizes | schedule.pinned_sizes)

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
                self._refuse_other_thread("begin_iteration()")
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
        self._at_boundary(beginning=True)
        elsewhere = not self._on_own_device()  # its requests go to CuPy's pool for its device
        # An arena with holes (rule 6 of memory.py) serves no plan until they are mapped again;
        # its iterations are placed in its gaps meanwhile.
        holed = not elsewhere and not self.memory.mend()
        planless = elsewhere or holed
        opening = None if planless else self._opening()  # a hinted warm-up's plan
        on_plan = not planless and (opening is not None or (
            self._plan_ready() and self.completed >= self.warmup))
        # A varying workload's first request names the iteration's shape (it goes to the
        # slow path, once per iteration): its plan, if the shape recurs.  The first
        # iteration's first request may name a plan of an earlier run (hinted.py).
        choosing = (not planless and self._hint_wanted()) or (
            on_plan and opening is None and self.options.shape_plans
            and (self.planner.varying > 0 or len(self.shapes) > 0))
        self._opener = weakref.ref(opener) if opener is not None else None
        state.begin("fallback" if elsewhere else self._next_mode(), on_plan, choosing,
                    elsewhere)
        self._first_request = 0
        follow = opening or (None if choosing else self.schedule)
        if on_plan and follow is not None:  # (choosing: the first request picks the plan, and
            self._follow(follow)             # the one installed stays until then: unused)
        self._began_auto = auto
        self._start_hot(on_plan, follow)
        if holed:
            schedule = self.schedule
            self.memory.start_placing(schedule.pinned_sizes if schedule else frozenset())
        self._refresh_kind()

    def _start_hot(self, on_plan: bool, follow: Schedule | None) -> None:
        """Begin the hot path's iteration; a planned one logs into arrays sized for its plans
        (+1 for the request beyond), others grow theirs as they go."""
        hot, period = self.hot, self.watch.period  # a detected iteration's length
        schedule = self.schedule
        most = max(schedule.n if schedule is not None else 0,
                   follow.n if follow is not None else 0, self.shapes.most_requests())
        hot.begin(_get_ident(), self._thread_hooks() if self._thread_hooks is not None else None,
                  self._context() if self._context is not None else None, on_plan,
                  period if self._began_auto and period is not None else _NO_LIMIT,
                  most + 1 if on_plan else max(64, hot.n))

    def end_iteration(self, aborted: bool = False) -> None:
        """Close the iteration; profile or re-plan as needed.

        ``aborted`` (an exception escaped the iteration) closes it without
        using its log: half an iteration is no profile.
        """
        with self._lock:
            self._admit()
            if not self.state.inside:
                raise RuntimeError("end_iteration() without begin_iteration()")
            if _get_ident() != self.hot.owner:
                self._refuse_other_thread("end_iteration()")
            self._end(aborted)

    def _refuse_other_thread(self, call: str) -> None:
        """An iteration is its thread's (its requests are the plan's): another thread may
        neither end it nor begin one inside it (RuntimeError naming both threads; the
        iteration goes on)."""
        owner = self.hot.owner
        if _get_ident() != owner:
            names = {t.ident: t.name for t in threading.enumerate()}
            raise RuntimeError(f"{call} on thread {threading.current_thread().name!r}, inside "
                               f"the iteration begun by thread {names.get(owner, owner)!r}: "
                               f"an iteration is begun and ended on one thread")

    def _end(self, aborted: bool) -> bool:
        """Close the iteration; True when it departed from its plan (merged into the profile).

        The iteration is closed first, whatever is raised in between (a
        Ctrl-C): profiling and planning come after, and an exception there
        costs a profile or a plan, never an open iteration."""
        hot, state = self.hot, self.state
        try:
            # The iteration's placer places nothing more (only whether it overflowed is read
            # below): the frees drained now need not give their gaps back to it, which was
            # most of a departed iteration's boundary (thousands of frees at its end).
            hot.set_placer(None)
            hot.drain()
        finally:
            # one line (see "Commits" in frees.py): no longer inside, no longer numbered, and
            # no placer that a later trim would trust (its gaps are the next plan's places)
            memory = self.memory
            state.end(); hot.end(); self.completed += 1; placer, memory.placer = memory.placer, None  # noqa: E501,E702
            memory.stop_placing(placer)
        self._refresh_kind()
        n = hot.n
        if aborted or not n or state.plan_dropped:
            self._at_boundary()
            return False
        departed = False
        if state.planned:
            current = self.current
            assert current is not None  # a planned iteration with requests follows a plan
            if not state.departed and outlived_its_plan(hot, n, current):
                state.departed = True  # planned blocks outlived the iteration
            # an earlier run's plan that did not hold
            if self._hinted and self._hinted_end(state.departed):
                return True
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
            self._keep_opening(run_log)
            # Unplanned iterations after the warm-up that differ from one another: the next
            # may not fit the memory the heap holds the way this one did (memory.awaiting_plan).
            self._unplanned_varied = previous is not None and previous.sizes != run_log.sizes
            if self._pending is None and self.schedule is None:
                # a plan that became ready during this (planning) iteration is the one to
                # install: profiling the iteration again would supersede it
                self._pending = self.planner.take_ready(None)
            if not (self.completed > self.warmup and self.schedule is None and self._pending
                    is None and not self.planner.busy and not self.heap_serves_on()):
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
