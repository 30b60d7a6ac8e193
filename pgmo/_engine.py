"""The pool's state machine, free of CuPy so that it runs and is tested on the CPU.

Modes (per hot iteration, between :meth:`Engine.begin_iteration` and
:meth:`Engine.end_iteration`):

``profiling``
    Requests are served by the injected *fallback* (CuPy's stock pool on a
    GPU) and logged on the event clock: one tick per alloc and per free of the
    iteration's blocks.  Request ``i`` is the i-th non-empty malloc of the
    iteration.  At the end of the first iteration after warm-up the log is
    solved into a :class:`~pgmo.plan.Plan` and an arena of its peak is taken
    from the injected *arena allocator*.
``optimized``
    Request ``i`` gets ``arena + offset[i]`` when it is safe, otherwise the
    fallback.  Every iteration is still logged (cheaply), so a departure can
    be re-solved at the next boundary.
``fallback``
    Between ``interrupt()`` and ``resume()``: the fallback, outside the plan.

Safety argument (why no address in use is ever handed out twice):

* Arena memory is only handed out for request ``k`` of the iteration that
  owns the plan (same thread, same device/stream context) and only while the
  iteration has not diverged (a request larger than planned or beyond the
  planned count diverges the rest of the iteration to the fallback).
* The plan is valid: blocks whose planned lifetimes overlap have disjoint
  addresses.  For ``j < k``, block ``j`` is planned live at request ``k``
  exactly when ``upper[j] > lower[k]``; those blocks are address-disjoint from
  ``k``.  Every other ``j < k`` of this iteration appears in ``due[m]`` for
  one ``m <= k`` and is checked at request ``m``: if still alive it is moved to
  its arena's *overdue* list.
* Blocks of earlier iterations and of earlier plans in the same arena are
  moved to the overdue list at each boundary and at each new plan.
* A request whose address range meets any overdue block goes to the fallback.

So every live arena block is either planned live and disjoint, or overdue and
checked by address.  Frees only append to a deque (safe from any thread, from
garbage collection and after the pool is gone); the deque is drained by the
next engine call, in the order the frees happened, which is also when their
ticks are logged.

Departures and re-optimization: a block alive at the end of its iteration
(a loss kept for logging) is *pinned*: its request is always served by the
fallback.  A late free in the iteration, a bigger request, more requests, or
a new survivor mark the iteration; at its end the profile is merged with the
iteration's log (per request: largest size, earliest alloc, latest free) and
re-solved.  The merged lifetimes contain every pattern seen so far, so a
workload that repeats itself stops causing re-solves.  Requests from another
thread, device or stream, and those between ``interrupt()`` and ``resume()``,
are outside the plan: the fallback serves them and they take no request index.
"""

from __future__ import annotations

import bisect
import collections
import gc
import logging
import threading
import time
import weakref
from typing import Any, Callable, Sequence

from .plan import Plan
from .trace import Trace
from .units import ALIGNMENT, round_size

__all__ = ["Engine", "PlainMemory", "lease_types", "ALIGNMENT", "round_size"]

log = logging.getLogger("pgmo.pool")

_MASK = -ALIGNMENT

_get_ident = threading.get_ident


class PlainMemory:
    """Stand-in for CuPy's ``UnownedMemory`` when the engine runs without CuPy."""

    __slots__ = ("ptr", "size", "device_id")

    def __init__(self, ptr: int, size: int, owner: Any, device_id: int):
        self.ptr, self.size, self.device_id = ptr, size, device_id


def lease_types(memory_type: type, pending: collections.deque) -> tuple[type, type]:
    """Memory-object classes whose death is the free event, for one engine.

    A lease *is* the memory object handed to the user (a subclass of CuPy's
    ``UnownedMemory``, or :class:`PlainMemory`), so CuPy dropping its last
    reference frees it at once, from any thread or the garbage collector.
    ``__del__`` only appends to the engine's deque (resurrecting the lease
    until the engine drains it); when the engine is gone, :func:`_orphan`
    turns that append into a no-op.
    An arena lease keeps its arena alive, so an old arena outlives its blocks.
    """

    class ArenaLease(memory_type):
        __slots__ = ("arena", "index", "iteration", "on_free")
        _append = pending.append  # a builtin method: not bound to the lease

        def __del__(self) -> None:
            on_free = self.on_free
            if on_free is not None:
                self.on_free = None
                try:
                    on_free(self)
                except Exception:  # a hook must never break a free
                    log.exception("memory hook failed on free")
            self._append(self)

    class FallbackLease(ArenaLease):
        __slots__ = ("keep",)

        def __del__(self) -> None:
            self.keep = None  # give the fallback block back at once
            ArenaLease.__del__(self)

    return ArenaLease, FallbackLease


def _orphan(arena_lease: type, pending: collections.deque) -> None:
    """The engine is gone: later frees do nothing, pending ones are dropped."""
    arena_lease._append = id  # any harmless one-argument builtin
    pending.clear()


class _Arena:
    """One raw allocation the plan carves blocks from."""

    __slots__ = ("buffer", "ptr", "size", "overdue")

    def __init__(self, buffer: Any, size: int):
        self.buffer = buffer  # keeps the raw memory alive
        self.ptr = int(buffer.ptr)
        self.size = size
        # Live blocks the current plan does not account for:
        # key(iteration, index) -> (lo, hi, iteration).  With the current
        # plan's live slots, these are all of the arena's live blocks.
        self.overdue: dict[int, tuple[int, int, int]] = {}


class Engine:
    """Profiling / optimized / fallback state machine over injected memory sources.

    ``arena_allocator(nbytes)`` returns an object with ``.ptr`` that owns raw
    memory until dropped, or raises MemoryError.  ``fallback`` is a caching
    pool: ``malloc(size)`` returns an object with ``.ptr`` owning the block
    until dropped, plus ``used_bytes``, ``free_bytes``, ``total_bytes``,
    ``n_free_blocks``, ``free_all_blocks`` and ``set_limit(size=)``.
    ``memory_type(ptr, size, owner, device_id)`` is the memory class leases
    derive from (CuPy's ``UnownedMemory``) and ``pointer_type(memory, 0)``
    builds what the user gets (CuPy's ``MemoryPointer``).
    ``context()`` names the device/stream (None when irrelevant); requests
    made under another context than the iteration's own are outside the plan.
    """

    def __init__(self, arena_allocator: Callable[[int], Any], fallback: Any, *,
                 memory_type: type = PlainMemory, pointer_type: Callable[[Any, int], Any] = None,
                 device_id: int = 0, warmup: int = 1, method: str = "best",
                 time_limit: float | None = 10.0, context: Callable[[], Any] | None = None,
                 oom_error: Callable[[int, int, int], BaseException] | None = None,
                 hooks_active: Callable[[], bool] | None = None,
                 on_hooks: Callable[[int], Any] | None = None,
                 on_plan: Callable[[Plan], None] | None = None):
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        from .solver import METHODS

        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        self._arena_allocator = arena_allocator
        self.fallback = fallback
        self._pointer = pointer_type if pointer_type is not None else _bare_memory
        self._device_id = device_id
        self._context = context
        self._oom_error = oom_error or _default_oom
        self._on_plan = on_plan
        self.warmup = int(warmup)
        self.method = method
        self.time_limit = time_limit

        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()
        self._solo = True  # only the owner thread has used the engine so far
        self._busy = False  # the owner is in malloc without the lock
        self._fast = False  # see _refresh_fast
        self.ArenaLease, self.FallbackLease = lease_types(memory_type, self._pending)
        weakref.finalize(self, _orphan, self.ArenaLease, self._pending)
        self._memory_type = memory_type
        self._hooks_active = hooks_active if hooks_active is not None else bool
        self._on_hooks = on_hooks

        # iteration state
        self._in_iter = False
        self._interrupts = 0
        self._recording = False  # in an iteration and not interrupted
        self._owner = _get_ident()  # the thread running the hot loop
        self._ctx: Any = None
        self._iteration = 0  # id of the current (or last) iteration
        self.completed = 0  # iterations ended
        self._n = 0
        self._tick = 0
        self._obs_sizes: list[int] = []
        self._obs_lowers: list[int] = []
        self._obs_uppers: list[int | None] = []
        self._last_obs: tuple[list, list, list] | None = None
        self._use_plan = False  # this iteration answers from the plan
        self._planned_iter = False  # this iteration started with the plan in use
        self._departed = False  # re-solve at the next boundary
        self._tainted = False  # a plan was installed mid-iteration

        # profile and plan
        self.profile: Trace | None = None
        self._prof: tuple[list[int], list[int], list[int | None]] | None = None
        self.plan: Plan | None = None
        self._off: list[int] = []
        self._rows: list[tuple[int, int, tuple[int, ...]]] = [(-1, -1, ())]
        self._cap: list[int] = []
        self._due: list[tuple[int, ...]] = []
        self._slot: list[int | None] = []  # iteration of request i's live arena block
        self._n_planned = 0
        self._pinned: frozenset[int] = frozenset()
        self._arena: _Arena | None = None
        self._arenas: set[_Arena] = set()  # current arena and old ones with live blocks
        self._arena_blocked = False  # last arena allocation failed; wait for memory to free up
        self._limit = 0

        # counters
        self._used = 0  # bytes of live leases (arena and fallback)
        self._fb_used = 0  # bytes of live fallback leases
        self.peak_used = 0
        self._other_requests = 0  # outside iterations; foreign while profiling
        self.profiled_requests = 0
        self.planned_requests = 0
        self.fallback_requests = 0
        self.interrupted_requests = 0
        self.foreign_requests = 0
        self.departures = 0
        self.reoptimizations = 0
        self.solve_failures = 0
        self.arena_failures = 0

    # ------------------------------------------------------------ exclusivity
    def __enter__(self) -> None:
        """Exclusive access for every entry but the owner's inline malloc.

        The first time another thread comes in, the owner loses its lock-free
        path; the newcomer waits until the owner has left it (see malloc).
        """
        self._lock.acquire()
        if self._solo and _get_ident() != self._owner:
            self._solo = False  # from now on the owner takes the lock too
            self._fast = False
            while self._busy:
                time.sleep(0)

    def __exit__(self, *exc) -> None:
        self._lock.release()

    # ------------------------------------------------------------------ malloc
    def malloc(self, size: int, _hooks: bool = True) -> Any:
        """Serve one request (size 0 gets a null memory object, as in CuPy).

        When ``hooks_active()`` says memory hooks may be registered, the
        request goes to ``on_hooks(size)``, which reports it and comes back
        with ``_hooks=False``.

        The common case, a planned request of a hot iteration with nothing
        overdue, runs inline without the lock while only the owner thread has
        ever used the engine: the owner publishes ``_busy`` and re-checks
        ``_fast``; another thread clears ``_fast`` (and ``_solo``) under the
        lock and then waits for ``_busy`` to drop, so the two never run engine
        code at once (the GIL orders these reads and writes).  Everything
        else goes through :meth:`_serve`.
        """
        if _hooks and self._hooks_active() and self._on_hooks is not None:
            return self._on_hooks(size)
        if self._fast and _get_ident() == self._owner:
            self._busy = True
            try:
                if self._fast:
                    if self._pending:
                        self._drain()
                    rs = (size + 511) & _MASK
                    i = self._n
                    cap, o, due = self._rows[i]  # a sentinel row follows the last request
                    ctx = self._context
                    if 0 < rs <= cap and o >= 0 and (ctx is None or ctx() == self._ctx):
                        if due:
                            self._check_due(due)
                        arena = self._arena
                        if not arena.overdue:
                            t = self._tick
                            self._n = i + 1
                            self._tick = t + 1
                            self._obs_lowers[i] = t
                            return self._hand_out(arena, o, rs, i)
                    return self._serve(size)
            finally:
                self._busy = False
        with self:
            return self._serve(size)

    def _hand_out(self, arena: _Arena, o: int, rs: int, i: int) -> Any:
        """Give request ``i`` its planned block ``arena + o`` (already checked safe)."""
        lease = self.ArenaLease(arena.ptr + o, rs, None, self._device_id)
        lease.arena = arena
        lease.index = i
        lease.iteration = it = self._iteration
        lease.on_free = None
        self._slot[i] = it  # never the lease: it must be free to die
        used = self._used + rs
        self._used = used
        if used > self.peak_used:
            self.peak_used = used
        self.planned_requests += 1
        return self._pointer(lease, 0)

    def _refresh_fast(self) -> None:
        """Whether :meth:`malloc` may take its inline path (see there)."""
        self._fast = self._solo and self._recording and self._use_plan

    def _serve(self, size: int) -> Any:
        """The allocation itself; the caller holds the engine exclusively."""
        if self._pending:
            self._drain()
        if size <= 0:
            return self._pointer(self._memory_type(0, 0, None, self._device_id), 0)
        rs = (size + 511) & _MASK
        if self._recording and _get_ident() == self._owner and (
                self._context is None or self._context() == self._ctx):
            i = self._n
            self._n = i + 1
            t = self._tick
            self._tick = t + 1
            if self._use_plan:
                # Planned requests log only their alloc tick: their size is at
                # most the planned one, which a re-solve keeps anyway.
                self._obs_lowers[i] = t
                if rs <= self._cap[i]:
                    due = self._due[i]
                    if due:
                        self._check_due(due)
                    o = self._off[i]
                    if o >= 0:
                        arena = self._arena
                        if not arena.overdue or self._clear(arena, o, o + rs):
                            return self._hand_out(arena, o, rs, i)
                    self._obs_sizes[i] = rs
                else:
                    self._obs_sizes[i] = rs
                    self._diverge(i, rs)
                self.fallback_requests += 1
                return self._from_fallback(size, rs, i, self._iteration)
            self._record(i, t, rs)
            if self._planned_iter:
                self.fallback_requests += 1
            else:
                self.profiled_requests += 1
            return self._from_fallback(size, rs, i, self._iteration)
        # outside the plan's scope
        if self._in_iter and self._interrupts:
            self.interrupted_requests += 1
        elif self._in_iter:
            self.foreign_requests += 1
            if self._planned_iter:
                self.fallback_requests += 1
            else:
                self._other_requests += 1
        else:
            self._other_requests += 1
        return self._from_fallback(size, rs, -1, -1)

    def _record(self, i: int, tick: int, rs: int) -> None:
        """Log request ``i`` (not served by the plan) on the event clock."""
        if i < len(self._obs_sizes):
            self._obs_sizes[i] = rs
            self._obs_lowers[i] = tick
        else:
            self._obs_sizes.append(rs)
            self._obs_lowers.append(tick)
            self._obs_uppers.append(None)

    def _from_fallback(self, size: int, rs: int, index: int, iteration: int) -> Any:
        fallback = self.fallback
        try:
            block = fallback.malloc(size)
        except MemoryError:
            # Give back what can be given back, then try once more.
            gc.collect()
            self._drain()
            fallback.free_all_blocks()
            try:
                block = fallback.malloc(size)
            except MemoryError:
                raise self._oom_error(rs, self.total_bytes(), self._limit) from None
        lease = self.FallbackLease(block.ptr, rs, None, self._device_id)
        lease.arena = None
        lease.index = index
        lease.iteration = iteration
        lease.on_free = None
        lease.keep = block
        self._fb_used += rs
        used = self._used + rs
        self._used = used
        if used > self.peak_used:
            self.peak_used = used
        return self._pointer(lease, 0)

    def _check_due(self, due: Sequence[int]) -> None:
        """Blocks planned to be freed by now that are still alive become overdue."""
        slot = self._slot
        for j in due:
            it = slot[j]
            if it is not None:
                slot[j] = None
                o = self._off[j]
                self._arena.overdue[(it << 32) | j] = (o, o + self._cap[j], it)

    def _clear(self, arena: _Arena, lo: int, hi: int) -> bool:
        """True when ``[lo, hi)`` meets no overdue block; a hit is a departure."""
        for start, end, iteration in arena.overdue.values():
            if start < hi and lo < end:
                self.departures += 1
                if iteration == self._iteration:
                    # Freed later than planned in this very iteration: re-solve.
                    self._departed = True
                return False
        return True

    def _diverge(self, i: int, rs: int) -> None:
        """Bigger or more requests than planned: the fallback for the rest of the iteration."""
        why = "beyond the planned count" if i >= self._n_planned else "larger than planned"
        log.debug("request %d (%d bytes) is %s; fallback until the iteration ends", i, rs, why)
        self.departures += 1
        self._use_plan = False
        self._refresh_fast()
        self._departed = True

    # ------------------------------------------------------------------- frees
    def _drain(self) -> None:
        """Apply pending frees in the order they happened (engine held)."""
        pending = self._pending
        slot = self._slot
        current = self._arena
        it = self._iteration if self._in_iter else -2
        while pending:
            lease = pending.popleft()
            rs = lease.size
            self._used -= rs
            arena = lease.arena
            index = lease.index
            if arena is None:
                self._fb_used -= rs
            else:
                lease.arena = None
                if arena is current and index < len(slot) and slot[index] == lease.iteration:
                    slot[index] = None
                else:
                    del arena.overdue[(lease.iteration << 32) | index]
                    if not arena.overdue and arena is not current:
                        self._arenas.discard(arena)  # its last block: release it
                        self._sync_fallback_limit()
            if lease.iteration == it:
                self._obs_uppers[index] = self._tick
                self._tick += 1

    def drain(self) -> None:
        with self:
            self._drain()

    # -------------------------------------------------------------- iterations
    def begin_iteration(self) -> None:
        with self:
            self._drain()
            if self._in_iter:
                raise RuntimeError("begin_iteration() inside an iteration: call "
                                   "end_iteration() first")
            self._retire_slots()  # blocks of the last iteration, still alive
            self._iteration += 1
            self._in_iter = True
            self._recording = self._interrupts == 0
            self._owner = _get_ident()
            self._ctx = self._context() if self._context is not None else None
            self._n = 0
            self._tick = 0
            self._departed = False
            self._tainted = False
            if self.plan is not None and self._arena is None and self.plan.peak > 0 \
                    and not self._arena_blocked:
                self._arena = self._new_arena(round_size(self.plan.peak))
            self._use_plan = self._plan_ready() and self.completed >= self.warmup
            self._planned_iter = self._use_plan
            # Planned iterations log into lists sized for the plan (+1 for the
            # request that goes beyond it); others append.
            m = self._n_planned + 1 if self._use_plan else 0
            self._obs_sizes, self._obs_lowers, self._obs_uppers = [0] * m, [0] * m, [None] * m
            self._refresh_fast()

    def end_iteration(self, aborted: bool = False) -> None:
        """Close the iteration; profile, solve or re-solve as needed.

        ``aborted`` (an exception escaped the iteration) closes it without
        using its log: a half iteration is no profile.
        """
        with self:
            self._drain()
            if not self._in_iter:
                raise RuntimeError("end_iteration() without begin_iteration()")
            self._in_iter = False
            self._recording = False
            self._refresh_fast()
            self.completed += 1
            n = self._n
            obs = (self._obs_sizes[:n], self._obs_lowers[:n], self._obs_uppers[:n])
            if aborted or self._tainted:
                return
            self._last_obs = obs
            survivors = {i for i, u in enumerate(obs[2]) if u is None}
            if self._planned_iter:
                if not survivors <= self._pinned:
                    self._departed = True  # planned blocks outlived the iteration
                if not self._departed:
                    return
                self.reoptimizations += 1
                arrays = _merge(self._prof, obs)
            elif self.completed > self.warmup and self.plan is None and obs[0]:
                arrays = obs
            else:
                return
            profile = _to_trace(arrays)
        plan = self._solve(profile)
        with self:
            self._prof, self.profile = arrays, profile
            if plan is not None:
                self._install(plan)
        if plan is not None and self._on_plan is not None:
            self._on_plan(plan)

    def interrupt(self) -> None:
        with self:
            self._drain()
            self._interrupts += 1
            self._recording = False
            self._refresh_fast()

    def resume(self) -> None:
        with self:
            self._drain()
            if not self._interrupts:
                raise RuntimeError("resume() without interrupt()")
            self._interrupts -= 1
            self._recording = self._in_iter and not self._interrupts
            self._refresh_fast()

    # ----------------------------------------------------------------- plans
    def optimize(self) -> Plan:
        """Solve the profile (or the last iteration's log) now and use it from now on."""
        with self:
            self._drain()
            arrays = self._prof
            if arrays is None:
                arrays = self._last_obs
            if arrays is None or not arrays[0]:
                raise RuntimeError("nothing to optimize yet: run at least one iteration "
                                   "with allocations first")
            profile = _to_trace(arrays)
        plan = self._solve(profile, raise_errors=True)
        with self:
            self._prof, self.profile = arrays, profile
            self._install(plan)
            self.warmup = min(self.warmup, self.completed)
        if self._on_plan is not None:
            self._on_plan(plan)
        return plan

    def set_plan(self, arrays: tuple[list, list, list], plan: Plan) -> None:
        """Use a plan solved elsewhere (a loaded file) for ``arrays`` (the profile)."""
        _check_plan_matches(arrays, plan)
        with self:
            self._drain()
            self._prof, self.profile = arrays, _to_trace(arrays)
            self._install(plan)

    def reset(self) -> None:
        """Forget profile and plan; the next iteration after warm-up is profiled again."""
        with self:
            self._drain()
            self._prof = self.profile = self.plan = None
            self._retire_slots()
            self._off, self._cap, self._due, self._slot = [], [], [], []
            self._rows = [(-1, -1, ())]
            self._n_planned = 0
            self._pinned = frozenset()
            self._use_plan = False
            self._refresh_fast()
            self._drop_arena()

    def profile_arrays(self) -> tuple[list[int], list[int], list[int | None]] | None:
        return self._prof

    def _solve(self, profile: Trace, raise_errors: bool = False) -> Plan | None:
        from .solver import solve

        planned = _planned_trace(profile)
        try:
            return solve(planned, method=self.method, time_limit=self.time_limit)
        except Exception:
            if raise_errors:
                raise
            self.solve_failures += 1
            log.warning("pgmo could not solve the profile; serving from the fallback",
                        exc_info=True)
            return None

    def _install(self, plan: Plan) -> None:
        """Switch to ``plan`` (lock held); reuse the arena when it is big enough."""
        n = len(self._prof[0])
        off = [-1] * n  # -1: pinned to the fallback (outlived its iteration)
        cap = [1 << 62] * n  # pinned requests of any size go to the fallback quietly
        for block, o in zip(plan.trace.blocks, plan.offsets):
            off[block.id] = o
            cap[block.id] = block.size
        pinned = frozenset(i for i in range(n) if off[i] < 0)
        lowers, uppers = self._prof[1], self._prof[2]
        due: list[list[int]] = [[] for _ in range(n)]
        for j in range(n):
            u = uppers[j]
            if off[j] >= 0 and u is not None:
                k = bisect.bisect_left(lowers, u)  # first request planned after j's free
                if k < n:
                    due[k].append(j)
        self._retire_slots()
        need = round_size(plan.peak)
        arena = self._arena
        if arena is None or arena.size < need or need == 0:
            self._drop_arena()
            self._arena_blocked = False
            if need:
                self._arena = self._new_arena(need)
        self.plan = plan
        # The sentinel after the last request sends request n to _diverge.
        self._off, self._cap = off, cap + [-1]
        self._rows = [(c, o, tuple(d)) for c, o, d in zip(cap, off, due)] + [(-1, -1, ())]
        self._due = [tuple(d) for d in due]
        self._slot = [None] * n
        self._n_planned = n
        self._pinned = pinned
        self._use_plan = False  # takes effect at the next boundary
        if self._in_iter:
            # Installed mid-iteration: the rest of this iteration's log does
            # not fit either plan, so it is used for nothing.
            self._planned_iter = False
            self._tainted = True
        self._refresh_fast()

    def _plan_ready(self) -> bool:
        return self.plan is not None and (self._arena is not None or self.plan.peak == 0)

    def _retire_slots(self) -> None:
        """Live blocks of the previous iteration/plan are no longer accounted: overdue."""
        slot = self._slot
        arena = self._arena
        for j, it in enumerate(slot):
            if it is not None:
                slot[j] = None
                o = self._off[j]
                arena.overdue[(it << 32) | j] = (o, o + self._cap[j], it)

    def _drop_arena(self) -> None:
        """Forget the current arena; it lives on while it has blocks (overdue now)."""
        self._retire_slots()
        arena = self._arena
        self._arena = None
        if arena is not None and not arena.overdue:
            self._arenas.discard(arena)
        self._sync_fallback_limit()

    def _arena_idle(self, arena: _Arena) -> bool:
        return not arena.overdue and (arena is not self._arena
                                      or all(it is None for it in self._slot))

    def _new_arena(self, size: int) -> _Arena | None:
        """Take ``size`` bytes from the raw allocator, making room first.

        The fallback's cached blocks (from warm-up and profiling) are what the
        arena replaces: they are released first, or pgmo would hold more than
        the stock pool it improves on.
        """
        self.fallback.free_all_blocks()
        if self._limit and self.total_bytes() + size > self._limit:
            return self._arena_failed(size, "it would exceed the memory limit")
        try:
            buffer = self._arena_allocator(size)
        except MemoryError:
            gc.collect()
            self._drain()
            self.fallback.free_all_blocks()
            try:
                buffer = self._arena_allocator(size)
            except MemoryError:
                return self._arena_failed(size, "the raw allocator is out of memory")
        arena = _Arena(buffer, size)
        self._arenas.add(arena)
        self._sync_fallback_limit()
        return arena

    def _arena_failed(self, size: int, why: str) -> None:
        self.arena_failures += 1
        self._arena_blocked = True
        log.warning("pgmo cannot allocate a %d-byte arena (%s); serving from the fallback",
                    size, why)
        return None

    # ----------------------------------------------------------------- memory
    def set_limit(self, size: int) -> None:
        with self:
            self._drain()
            self._limit = int(size)
            self._arena_blocked = False
            self._sync_fallback_limit()

    def get_limit(self) -> int:
        return self._limit

    def _sync_fallback_limit(self) -> None:
        """The fallback may use what the limit leaves after the arenas."""
        if self._limit == 0:
            self.fallback.set_limit(size=0)
        else:
            self.fallback.set_limit(size=max(1, self._limit - self.arena_total()))

    def arena_total(self) -> int:
        return sum(a.size for a in self._arenas)

    def used_bytes(self) -> int:
        with self:
            self._drain()
            return self._used - self._fb_used + self.fallback.used_bytes()

    def free_bytes(self) -> int:
        with self:
            self._drain()
            return (self.arena_total() - (self._used - self._fb_used)
                    + self.fallback.free_bytes())

    def total_bytes(self) -> int:
        return self.arena_total() + self.fallback.total_bytes()

    def n_free_blocks(self) -> int:
        """Free gaps in the arenas plus the fallback's cached blocks."""
        with self:
            self._drain()
            gaps = 0
            for arena in self._arenas:
                spans = list(arena.overdue.values())
                if arena is self._arena:
                    spans += [(self._off[j], self._off[j] + self._cap[j], 0)
                              for j, it in enumerate(self._slot) if it is not None]
                spans.sort()
                pos = 0
                for start, end, _ in spans:
                    if start > pos:
                        gaps += 1
                    pos = max(pos, end)
                if pos < arena.size:
                    gaps += 1
            return gaps + self.fallback.n_free_blocks()

    def free_all_blocks(self) -> None:
        """Release cached fallback blocks, and an idle arena between iterations."""
        with self:
            self._drain()
            self.fallback.free_all_blocks()
            if not self._in_iter and self._arena is not None and self._arena_idle(self._arena):
                self._drop_arena()
            self._arena_blocked = False

    # ------------------------------------------------------------------ views
    @property
    def mode(self) -> str:
        if self._interrupts:
            return "fallback"
        if self._in_iter:
            return "optimized" if self._use_plan or self._planned_iter else "profiling"
        return "optimized" if self._plan_ready() and self.completed >= self.warmup \
            else "profiling"

    @property
    def in_iteration(self) -> bool:
        return self._in_iter

    def arena_bytes(self) -> int:
        return self._arena.size if self._arena is not None else 0

    def snapshot(self) -> dict[str, int | str]:
        """Counters for :mod:`pgmo.stats` (drains first, so they are current)."""
        with self:
            self._drain()
            arena_used = self._used - self._fb_used
            arena_total = self.arena_total()
            fb = self.fallback
            fb_used, fb_total = fb.used_bytes(), fb.total_bytes()
            plan = self.plan
            return {
                "mode": self.mode,
                "iterations": self.completed,
                "requests": (self.profiled_requests + self.planned_requests
                             + self.fallback_requests + self.interrupted_requests
                             + self._other_requests),
                "profiled_requests": self.profiled_requests,
                "planned_requests": self.planned_requests,
                "fallback_requests": self.fallback_requests,
                "interrupted_requests": self.interrupted_requests,
                "foreign_requests": self.foreign_requests,
                "departures": self.departures,
                "reoptimizations": self.reoptimizations,
                "solve_failures": self.solve_failures,
                "arena_failures": self.arena_failures,
                "arena_bytes": self.arena_bytes(),
                "old_arena_bytes": arena_total - self.arena_bytes(),
                "planned_peak": plan.peak if plan is not None else 0,
                "lower_bound": plan.lower_bound if plan is not None else 0,
                "planned_blocks": len(plan.trace) if plan is not None else 0,
                "pinned_blocks": len(self._pinned),
                "peak_used": self.peak_used,
                "live_bytes": self._used,
                "used_bytes": arena_used + fb_used,
                "free_bytes": arena_total - arena_used + (fb_total - fb_used),
                "total_bytes": arena_total + fb_total,
                "limit": self._limit,
            }


def _bare_memory(memory: Any, offset: int) -> Any:
    """Without CuPy, the user gets the memory object itself."""
    return memory


def _default_oom(size: int, total: int, limit: int) -> MemoryError:
    msg = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes"
    msg += f", limit set to: {limit:,} bytes)." if limit else ")."
    return MemoryError(msg)


# ---------------------------------------------------------------- profiles
Arrays = tuple[list[int], list[int], list["int | None"]]


def _merge(prof: Arrays, obs: Arrays) -> Arrays:
    """Per request index: max size, earliest alloc, latest free, survivor if ever.

    Lowers stay strictly increasing (element-wise min of increasing lists),
    and any pattern already seen fits the merged lifetimes, so re-solving
    converges as a variable workload repeats itself.
    """
    ps, pl, pu = prof
    os_, ol, ou = obs
    n = max(len(ps), len(os_))
    sizes, lowers, uppers = [], [], []
    for i in range(n):
        if i < len(ps) and i < len(os_):
            sizes.append(max(ps[i], os_[i]))
            lowers.append(min(pl[i], ol[i]))
            uppers.append(None if pu[i] is None or ou[i] is None else max(pu[i], ou[i]))
        else:
            s, lo, up = (ps, pl, pu) if i < len(ps) else (os_, ol, ou)
            sizes.append(s[i])
            lowers.append(lo[i])
            uppers.append(up[i])
    return sizes, lowers, uppers


def _to_trace(arrays: Arrays) -> Trace:
    """The recorded profile as a Trace; survivors are open blocks."""
    sizes, lowers, uppers = arrays
    return Trace.from_columns(lowers, uppers, sizes, {"recorded_by": "pgmo"})


def _planned_trace(profile: Trace) -> Trace:
    """The blocks the arena serves: all but those alive past the iteration's end."""
    return profile.without_open()


def _check_plan_matches(arrays: Arrays, plan: Plan) -> None:
    """A plan must place exactly the profile's non-survivor blocks, validly."""
    sizes, lowers, uppers = arrays
    for i in range(1, len(lowers)):
        if lowers[i] <= lowers[i - 1]:
            raise ValueError(f"profile request {i} is not after request {i - 1}")
    plan.check_fits(_to_trace(arrays))
