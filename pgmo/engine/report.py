"""The engine's counters gathered into one :class:`~pgmo.stats.PoolStats`.

Kept out of :mod:`.core` so that the state machine holds only decisions: this
module reads what the hot path, the device memory, the planner and the stock
pool count, and adds nothing of its own.
"""

from __future__ import annotations

from typing import Protocol

from ..stats import PoolStats
from .handout import HotPath
from .memory import DeviceMemory
from .planner import Planner
from .schedule import Schedule
from .shapes import ShapeBook

__all__ = ["pool_stats", "Counted"]


class Counted(Protocol):
    """What this module reads of an :class:`~.core.Engine` (which imports it)."""

    hot: HotPath
    memory: DeviceMemory
    planner: Planner
    shapes: ShapeBook
    completed: int
    departures: int

    @property
    def mode(self) -> str: ...

    @property
    def iteration_source(self) -> str: ...

    @property
    def latest_schedule(self) -> Schedule | None: ...


def pool_stats(engine: Counted) -> PoolStats:
    """Every counter of ``engine`` (an :class:`~.core.Engine`) at once.

    The caller holds the engine and has applied pending frees, so the byte
    counts agree with each other.
    """
    hot, memory, planner = engine.hot, engine.memory, engine.planner
    counts = hot.counts
    parts = memory.parts()
    stock = memory.stock
    schedule = engine.latest_schedule
    plan = schedule.plan if schedule is not None else None
    total = memory.total_bytes()
    return PoolStats(
        mode=engine.mode,
        replan=planner.mode,
        iteration_source=engine.iteration_source,
        iterations=engine.completed,
        requests=counts.total(),
        profiled_requests=counts.profiled,
        planned_requests=counts.planned,
        departed_requests=counts.departed,
        pinned_requests=counts.pinned,
        interrupted_requests=counts.interrupted,
        outside_requests=counts.outside,
        foreign_requests=counts.foreign,
        departures=engine.departures,
        reoptimizations=planner.replans,
        plan_method=plan.method if plan is not None else "",
        planned_peak=plan.peak if plan is not None else 0,
        lower_bound=plan.lower_bound if plan is not None else 0,
        planned_blocks=len(plan.trace) if plan is not None else 0,
        pinned_blocks=len(schedule.pinned) if schedule is not None else 0,
        background_solves=planner.background_solves,
        stale_plans=planner.stale_plans,
        planner_failures=planner.worker_failures,
        solve_failures=planner.solve_failures,
        arena_failures=memory.failures,
        arena_bytes=parts["arena"],
        old_arena_bytes=parts["old_arenas"],
        exact_bytes=parts["exact"],
        kept_bytes=parts["kept"],
        stock_bytes=parts["stock"],
        live_bytes=hot.used,
        used_bytes=hot.used,
        free_bytes=total - hot.used,
        total_bytes=total,
        n_free_blocks=memory.free_gaps() + stock.n_free_blocks(),
        peak_used_bytes=hot.peak_used,
        peak_total_bytes=max(memory.peak_total, total),
        limit=memory.limit,
        arena_kind=memory.arena_kind,
        heap_kind=memory.heap_kind,
        boundary_releases=memory.releases,
        shape_plans=engine.shapes.planned,
        shape_iterations=engine.shapes.switches,
        device_reasons=memory.troubles(),
    )
