"""CuPy's pool queries and the engine's views, answered from its parts.

``cupy.cuda.MemoryPool``'s interface (:meth:`~PoolQueries.used_bytes`,
:meth:`~PoolQueries.free_bytes`, :meth:`~PoolQueries.total_bytes`, the limit,
``free_all_blocks``...) and what the pool reads of the engine
(:attr:`~PoolQueries.mode`, :attr:`~PoolQueries.plan`...): none of it changes
what the engine does next, but ``free_all_blocks`` (what is idle goes back)
and ``set_limit``.  The numbers come from :mod:`.memory` and the hot path's
counters.

Part of :class:`~.core.Engine` (a mixin: its methods run on the engine and
take its lock); tested in ``tests/test_engine_queries.py`` and
``tests/test_pool.py``.
"""

from __future__ import annotations

from ..plan import Plan
from ..stats import PoolStats
from ..trace import Trace
from .report import pool_stats
from .parts import EngineParts
from .schedule import Schedule

__all__ = ["PoolQueries"]


class PoolQueries(EngineParts):
    """CuPy's pool queries and the engine's views (see the module's docstring)."""

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
    def served_by_plan(self) -> bool:
        """Whether a plan served the open iteration so far, else the one that ended last.

        True when it began following a plan (the main plan, its shape's plan or an
        earlier run's) and has kept to it: no request placed off plan, no planned
        block outliving it, the plan not dropped while it ran.  False for the
        iterations before a plan landed (warm-up, profiling, planning), for those that
        departed from their plan (a shape no plan covered) and before the first
        iteration.  Read after ``end_iteration()`` it tells what the iteration just
        ended was: a measurement tells the planned iterations from the others by it.
        """
        with self._lock:
            self._admit()
            state = self.state
            return state.planned and not state.departed and not state.plan_dropped

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
