"""Which plan the engine follows: at each boundary, at an iteration's first request, on request.

At each iteration boundary :meth:`PlanChoice._at_boundary` installs a plan
that is ready (the planner's, one the user adopted, or one whose arena the
device refused before) or fits the arena to the plan in use; the arena grows
or shrinks there only.  A first plan that would hold more than the heap did
while it served the iterations before it is searched further, and declined
where that finds nothing better (:meth:`PlanChoice._better_than_heap`).  A
varying workload's iteration names its shape by its first request:
:meth:`PlanChoice._choose` then follows that shape's plan (:mod:`.shapes`)
if the arena holds it, else the main plan, and a departed
iteration's log may give its shape a plan (:meth:`PlanChoice._observe_shape`).
The user's plan calls (``optimize``, ``adopt``, ``reset``, ``close``) end here too.

Part of :class:`~.core.Engine` (a mixin: its methods run on the engine, under its
lock, and read the engine's parts); it is tested through the engine, in
``tests/test_engine_plans.py``, ``tests/test_variable_workloads.py`` and
``tests/test_plan_against_heap.py``.
"""

from __future__ import annotations

import logging

from ..plan import Plan
from ..trace import Trace
from ..units import round_size
from .hinted import HintedStart
from .profiles import Log, absorb
from .schedule import Schedule

__all__ = ["PlanChoice", "PLAN_OVER_HEAP"]

log = logging.getLogger("pgmo.pool")

#: Plans whose addresses in the arena are kept between the iterations that follow them
#: (the main plan and the shape plans, :data:`.shapes.MAX_SHAPES`, with room to spare).
_ADDRESSES_KEPT = 16

#: A first plan is searched further, then declined, when, beside what outlives the iterations,
#: its arena would hold more than this times the most the heap held while it served them (a
#: plan may hold a little more than the heap: it costs no call, no search at a request).
PLAN_OVER_HEAP = 1.10


class PlanChoice(HintedStart):
    """The engine's plan choice and plan calls (see the module's docstring)."""

    #: First plans declined: they would have held more than the heap did
    #: (:meth:`_costs_more_than_heap`).
    plans_declined = 0
    _declined_at: int | None = None  # the most held when a first plan was last declined
    _asked: Schedule | None = None  # the plan the user asked for (optimize, adopt)
    _fitted: tuple = ()  # what the last boundary's fit left (see _at_boundary)

    def _at_boundary(self, beginning: bool = False) -> None:
        """Between two iterations: install a plan that is ready (or one whose arena the
        device refused before), or take the arena back.

        Called as an iteration ends and again as the next begins (``beginning``), for a
        plan that landed in between; the arena is then fitted again only if something
        changed it meanwhile (``free_all_blocks``, a full device) or it was refused."""
        ready = self._pending or self.planner.take_ready(self.schedule) or self._deferred
        self._pending = self._deferred = None
        if ready is None and beginning and not self.memory.blocked \
                and self._fitted == self._arena_now():
            return  # the same boundary, the arena as its end left it
        varied, self._unplanned_varied = self._unplanned_varied, False
        if ready is not None and self._costs_more_than_heap(ready):
            ready = self._better_than_heap(ready)  # None: the heap goes on serving
        if ready is not None:
            self._install(ready)
        elif self.schedule is not None:
            self.memory.fit(max(self.schedule.arena_size, self._awaited_size(),
                                self.shapes.arena_size(), self._openings_arena()),
                            self.planner.varying > 0)
        else:
            self.memory.awaiting_plan(varied)  # rule 4 of memory.py decides what goes back
        self._fitted = self._arena_now()

    def _arena_now(self) -> tuple:
        """What a boundary's fit leaves: the boundary, the plan, the arena and its size."""
        arena = self.hot.arena
        return self.completed, self.schedule, arena, arena.size if arena is not None else 0

    def _costs_more_than_heap(self, schedule: Schedule) -> bool:
        """Whether a first plan would hold more than the heap did while it served the
        iterations so far: what outlives them (weights, say) plus the plan's arena, above
        :data:`PLAN_OVER_HEAP` times the most held yet, where the heap is pgmo's own (a
        cudaMalloc per request would make every iteration wait for the device, and the
        driver's pool is not judged).  Only the move from the heap to a first plan is
        judged (the arena is the workload's from then on), never a plan the user asked
        for (``optimize``, ``adopt``)."""
        memory = self.memory
        if self.schedule is not None or schedule is self._asked or memory.peak_total <= 0 \
                or not memory.own_heap_serves:  # a heap whose frees wait for the device
            return False
        return memory.heap_used() + schedule.arena_size > PLAN_OVER_HEAP * memory.peak_total

    def _better_than_heap(self, schedule: Schedule) -> Schedule | None:
        """A best-fit plan that would hold more than the heap did is searched further, here,
        with the full method (:meth:`~.planner.Planner.improve`: ``best`` where the method
        is best-fit); a plan that still does is declined, and the heap goes on serving, as
        it did, until an iteration makes it hold more (:meth:`heap_serves_on`).  The
        paper's best-fit packs ResNet-50 inference at 1.29x its lower bound: its arena
        beside the weights held 1.23x what the page heap held for the same iterations."""
        better = None
        if schedule.plan.peak > schedule.plan.lower_bound:  # else nothing packs it lower
            better = self.planner.improve(schedule)
        if better is not None and not self._costs_more_than_heap(better):
            return better
        memory = self.memory
        self._declined_at = memory.peak_total
        self.plans_declined += 1
        if self.plans_declined == 1:
            log.info("pgmo keeps serving from its heap: the plan's %d-byte arena would hold "
                     "more than the heap did (%d bytes at most)", schedule.arena_size,
                     memory.peak_total)
        return None

    def heap_serves_on(self) -> bool:
        """A plan was declined (:meth:`_costs_more_than_heap`) and no iteration has made the
        heap hold more since: no new plan is asked for (the same plan would be declined)."""
        return self._declined_at is not None and self.memory.peak_total <= self._declined_at

    # ----------------------------------------------------- an iteration's shape
    def _main_key(self) -> int:
        """The main plan's shape: its first request's size."""
        profile = self.schedule.profile if self.schedule is not None else None
        return profile.size_of(0) if profile is not None and len(profile) else -1

    def _choose(self, rs: int) -> None:
        """The iteration's first request (``rs`` bytes) names its shape: follow its plan
        (the first iteration's may name a plan of an earlier run: :mod:`.hinted`)."""
        if self._hinting:
            self._choose_hint(rs)
            return
        self._first_request = rs
        chosen = None
        if rs != self._main_key():
            hot = self.hot
            chosen = self.shapes.schedule_for(rs)
            arena = hot.arena
            if chosen is not None and (arena is None or chosen.arena_size > arena.size
                                       or not self.memory.keeps(chosen.arena_size)
                                       or chosen.n > len(hot.log_arrays[0])):
                # the arena cannot hold it yet, or it landed (from the background) after
                # the boundary fitted the arena to the plans (a trim inside the iteration
                # could unmap its end) or sized the iteration's log: followed from the
                # next iteration
                chosen = None
        self._follow(chosen or self.schedule)
        if chosen is not None:
            self.shapes.switches += 1
        # after: a choice cut short (a Ctrl-C) is made again at the next request, never
        # served from the rows installed before it
        self.state.choosing = False
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
        addresses = self._addresses
        cached = addresses.get(id(schedule))
        if cached is None or cached[0] != ptr or cached[2] is not schedule:
            if len(addresses) >= _ADDRESSES_KEPT:  # plans no longer followed (shape plans
                main = self.schedule                # replaced or evicted) are not kept
                for key in [k for k, v in addresses.items() if v[2] is not main]:
                    del addresses[key]
            cached = (ptr, hot.addresses_for(schedule.rows), schedule)
            addresses[id(schedule)] = cached
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
        if newest is not None and len(newest) and newest.size_of(0) == key:
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
        self.memory.fit(max(schedule.arena_size, self.shapes.arena_size(),
                            self._openings_arena()), self.planner.varying > 0)
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
            self._pending = self._asked = schedule
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
            self._pending = self._asked = schedule
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
        # Off the plan first, then forget it: a Ctrl-C anywhere below leaves an iteration
        # that no longer follows the plan, never one served from a plan half forgotten.
        state = self.state
        state.plan_dropped = state.inside and state.planned
        state.on_plan = state.choosing = False
        self._refresh_kind()
        self.planner.reset()
        self.hot.retire()
        self.hot.install(None)
        self.schedule = self._pending = self.current = self._deferred = None
        self._declined_at = None  # profiled afresh: a new plan is judged anew
        self.shapes.clear()
        self._forget_hint()
        self._addresses.clear()
        self.memory.drop()

    def close(self) -> None:
        """Stop background work now (also done when the engine is garbage collected)."""
        self.planner.shutdown()
