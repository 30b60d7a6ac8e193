"""The engine's counters gathered into one :class:`~pgmo.stats.PoolStats`.

Kept out of :mod:`.core` so that the state machine holds only decisions: this
module reads what the hot path, the arenas, the planner and the fallback
count, and adds nothing of its own.
"""

from __future__ import annotations

from typing import Any

from ..stats import PoolStats

__all__ = ["pool_stats"]


def pool_stats(engine: Any) -> PoolStats:
    """Every counter of ``engine`` (an :class:`~.core.Engine`) at once.

    The caller holds the engine and has applied pending frees, so the byte
    counts agree with each other.
    """
    hot = engine.hot
    arenas = engine.arenas
    arena_used = hot.used - hot.fb_used
    arena_total = arenas.arena_total()
    arena_bytes = hot.arena.size if hot.arena is not None else 0
    fb = engine.fallback
    fb_used, fb_total = fb.used_bytes(), fb.total_bytes()
    schedule = engine.latest_schedule
    plan = schedule.plan if schedule is not None else None
    planner = engine.planner
    return PoolStats(
        mode=engine.mode,
        replan=planner.mode,
        iteration_source=engine.iteration_source,
        iterations=engine.completed,
        requests=(hot.profiled_requests + hot.planned_requests
                  + hot.fallback_requests + hot.pinned_requests
                  + hot.interrupted_requests
                  + hot.other_requests),
        profiled_requests=hot.profiled_requests,
        planned_requests=hot.planned_requests,
        fallback_requests=hot.fallback_requests,
        pinned_requests=hot.pinned_requests,
        interrupted_requests=hot.interrupted_requests,
        foreign_requests=engine.foreign_requests,
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
        arena_failures=arenas.failures,
        arena_bytes=arena_bytes,
        old_arena_bytes=arena_total - arena_bytes,
        live_bytes=hot.used,
        used_bytes=arena_used + fb_used,
        free_bytes=arena_total - arena_used + (fb_total - fb_used),
        total_bytes=arena_total + fb_total,
        n_free_blocks=arenas.free_gaps() + fb.n_free_blocks(),
        peak_used_bytes=hot.peak_used,
        peak_total_bytes=max(arenas.peak_total, arena_total + fb_total),
        limit=arenas.limit,
    )
