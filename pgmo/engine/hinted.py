"""A plan from an earlier run as a hint: the first iteration starts on it, its warm-up included.

A pool given ``hints`` (the plan cache, :mod:`pgmo.plan_cache`) asks them
once, at the first iteration's first request, for a plan made for a workload
whose first request had that size.  The answer holds the steady plan and a
plan per warm-up iteration; the warm-up's long-lived blocks (parameters,
optimizer state: open blocks of its profile) are kept apart, as a steady
plan's survivors are, so the steady plan finds them where it expects them:
outside its arena.  The arena is taken for the larger plan right there (no
arena existed yet: nothing moves) and the iteration is answered from its
plan from that request on.

A hint is never trusted: every request is checked as any plan's are
(:mod:`.schedule`'s safety rule; a larger or extra request departs, a block
freed late sends the request planned on it to memory of its own).  A warm-up
iteration that departs from its hinted plan drops the hint: the pool forgets
both plans and profiles afresh, as if no hint had come.  The first steady
iteration that departs is judged by what it needed: the lower bound of its
blocks freed within it (its requests that held the plan at their planned
sizes) against the hinted plan's arena.  Within :data:`HINT_NEAR` (1.10x)
of each other, it is this workload's iteration of another shape, as a
varying run's iterations are: the hint stays and is a plan like any other
(the departure was placed in the arena's gaps; its log is merged and
re-planned).  Otherwise the hint is dropped and the run profiles afresh.
Dropping it for a near iteration cost more than the profile: the recorded
seq2seq run (every iteration within 7% of the largest) departs from its
cached plan within its first 80 requests in every iteration, yet the cached
arena holds each one; profiled afresh, its second run held 1.058x its limit
(sync, best-fit, on the CPU model: the fresh profile's survivors on 388 MiB
of heap pages beside the new arena, and later iterations outgrowing the
smaller plans made from it), kept, 1.001x (in background mode 1.021x ->
1.001x).  Keeping every departed hint instead (merging it as any departure)
keeps the earlier run's largest iteration in every later plan: LSTM runs of
varying lengths, whose first steady iteration needs 0.05-0.8x the hinted
arena, then held 1.05-1.07x their limit, as their shorter iterations placed
in its gaps outgrew it, against 1.00-1.01x profiled afresh.  Planning from
the departed iteration's own log instead was measured too (seq2seq 1.022x,
LSTM runs 1.016-1.054x): the hot path does not log a planned request's size,
so the log's requests up to the departure carry the hint's sizes.  Once a
steady iteration has held, or a near one has departed, the plan is one like
any other: a departure takes the existing path (merged, re-planned).  A hint
that is damaged, does not fit its profile or needs an arena the device
refuses costs nothing but the warm-up it would have planned.

The warm-up iterations' profiles are kept (:attr:`HintedStart.opening_profiles`)
so that the plan cache can store them beside the steady plan.

Part of :class:`~.core.Engine` (a mixin, run under the engine's lock); tested in
``tests/test_plan_cache.py`` with the replay checker.
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol, Sequence

from ..errors import PlanError
from ..plan import Plan
from ..trace import Trace, max_load
from .parts import EngineParts
from .profiles import Log, log_of, to_profile
from .schedule import Schedule, compile_schedule

__all__ = ["Hint", "HintedStart", "HINT_NEAR"]

log = logging.getLogger("pgmo.pool")

#: A first steady iteration that departs from the hinted plan keeps it where what it needed
#: and the hinted arena are within this factor of each other (see the module's docstring;
#: the factor a first plan may hold over the heap, :data:`.plan_choice.PLAN_OVER_HEAP`).
HINT_NEAR = 1.10


class Hint(Protocol):
    """What ``hints(first_size)`` answers (a :class:`pgmo.plan_cache.CachedPlan`): the
    steady ``profile`` and ``plan``, and ``(profile, plan)`` per warm-up iteration."""

    @property
    def profile(self) -> Trace: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def warmup(self) -> Sequence[tuple[Trace, Plan]]: ...


class HintedStart(EngineParts):
    """The engine's start from a hint (see the module's docstring)."""

    #: ``hints(first_size)``: a plan for a workload whose first request was that size, or
    #: None; asked once, at the first iteration's first request (None: never).
    hints: Callable[[int], Hint | None] | None
    #: The warm-up iterations' profiles, and their plans where a hint gave them.
    opening_profiles: list[tuple[Trace, Plan | None]]
    _hinting: bool  # the open iteration's first request is to ask the hints
    _hinted: bool  # a hint is followed, and no steady iteration has run on it yet
    _openings: list[Schedule]  # the hint's warm-up plans, by iteration

    def _init_hints(self) -> None:
        self.hints = None
        self.opening_profiles = []
        self._hinting = self._hinted = False
        self._openings = []

    def _hint_wanted(self) -> bool:
        """At an iteration's start: its first request is to ask the hints (the first
        iteration of a pool with none of its own plans)."""
        self._hinting = (self.hints is not None and self.completed == 0
                         and self.schedule is None and self._pending is None
                         and self.planner.profile is None)
        return self._hinting

    def _opening(self) -> Schedule | None:
        """This warm-up iteration's hinted plan, where the arena holds it."""
        k = self.completed
        if k >= self.warmup or k >= len(self._openings):
            return None
        schedule = self._openings[k]
        arena = self.hot.arena
        if schedule.arena_size and (arena is None or arena.size < schedule.arena_size):
            return None
        return schedule

    def _openings_arena(self) -> int:
        """The arena the hinted warm-up plans still to come need."""
        openings = self._openings
        if not openings or self.completed >= self.warmup:
            return 0
        return max((s.arena_size for s in openings[self.completed:self.warmup]), default=0)

    def _choose_hint(self, rs: int) -> None:
        """The first iteration's first request (``rs`` bytes): follow a hinted plan from it
        on, if one comes and fits."""
        state = self.state
        state.choosing = self._hinting = False
        first = self._take_hint(rs)
        if first is not None:
            self._follow(first)
            # the log first, sized for the plan: a Ctrl-C between the two leaves an
            # iteration recorded (in a log that grows), never one planned in a log too short
            self._start_hot(True, first)
            state.begin(self._next_mode(), True)  # planned from this, its first request
        self._refresh_kind()

    def _take_hint(self, rs: int) -> Schedule | None:
        """Adopt the hint for ``rs``: the plan this iteration follows (None: none, or the
        arena cannot hold it; the steady plan may still be in place for later)."""
        try:
            hint = self.hints(rs) if self.hints is not None else None
        except Exception as e:  # a hint is a hint: what goes wrong costs a profile
            log.warning("pgmo could not read a cached plan, profiling instead: %s", e)
            hint = None
        if hint is None:
            return None
        try:
            openings = [compile_schedule(p, q, -1, check=True)
                        for p, q in list(hint.warmup)[:self.warmup]]
            schedule = self.planner.adopt(hint.profile, hint.plan)
        except (PlanError, ValueError) as e:
            log.warning("ignoring a cached plan that does not fit its profile, profiling "
                        "instead: %s", e)
            self.planner.reset()
            return None
        self.memory.fit(max([schedule.arena_size, *(s.arena_size for s in openings)]))
        self.schedule, self._openings, self._hinted = schedule, openings, True
        if not self._plan_ready():  # the device refused its arena: no plan to wait for
            log.info("pgmo: the device cannot hold the cached plan's arena; profiling")
            self._reset_plan()
            return None
        self.opening_profiles = [(p, q) for p, q in list(hint.warmup)[:self.warmup]]
        if self.warmup:
            return self._opening()
        return schedule if self._plan_ready() else None

    def _keep_opening(self, run_log: Log) -> None:
        """An unplanned iteration ended (its log): a warm-up's is kept for the plan cache."""
        if self.completed <= self.warmup and not self._openings:
            self.opening_profiles.append((to_profile(run_log), None))

    def _hinted_end(self, departed: bool) -> bool:
        """A planned iteration ended: True when it departed from a hinted plan, which is
        then dropped (the next iteration after the warm-up is profiled afresh): a warm-up,
        or the first steady iteration when what it needed is not near the hinted arena
        (:meth:`_near_hint`).  A steady iteration that held, or departed near it, confirms
        the hint: from then on the plan is one like any other (a departure is merged and
        re-planned)."""
        if not self._hinted:
            return False
        if not departed:
            if self.current is self.schedule:
                self._hinted = False
            return False
        k = self.completed - 1  # this iteration's number
        if k >= self.warmup and self.current is self.schedule and self._near_hint():
            self._hinted = False  # a plan like any other: the caller merges and re-plans
            return False
        log.info("pgmo: the cached plan does not fit this run; profiling afresh")
        if k < self.warmup and self.current is not None:  # its own log, as it ran
            run_log = log_of(self.hot, self.hot.n, self.current.profile)
            self.opening_profiles[k:] = [(to_profile(run_log), None)]
        self._reset_plan()
        self._at_boundary()
        return True

    def _near_hint(self) -> bool:
        """The first steady iteration departed from the hinted plan: whether what it needed
        (the lower bound of its blocks freed within it, planned requests at their planned
        sizes) and the hinted plan's arena are within :data:`HINT_NEAR` of each other.
        Once per run, at that boundary (about 15 ms for seq2seq's 12,500 requests)."""
        schedule = self.schedule
        assert schedule is not None  # a hinted steady plan is followed
        closed = [(lo, up, size) for lo, up, size in zip(*log_of(self.hot, self.hot.n,
                                                                  schedule.profile))
                  if up is not None]
        need = max_load(*zip(*closed)) if closed else 0
        arena = schedule.arena_size
        return max(need, arena) <= HINT_NEAR * min(need, arena)

    def _forget_hint(self) -> None:
        """The plan is reset: no hinted plan remains."""
        self._hinted = False
        self._openings = []
