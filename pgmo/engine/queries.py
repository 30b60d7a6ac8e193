"""What the engine answers: CuPy's pool queries (bytes, the limit, giving memory
back), ``stats()``, and its plan and profile.

A mixin of :class:`~.core.Engine`: each byte query takes the engine's lock
and applies pending frees first, so that what it reports is current; the
numbers come from :mod:`.memory` and the hot path's counters.
"""

from __future__ import annotations

from ..plan import Plan
from ..stats import PoolStats
from ..trace import Trace
from .report import pool_stats
from .schedule import Schedule

__all__ = ["PoolQueries"]


class PoolQueries:
    """``used_bytes``, ``free_bytes``, ``total_bytes``, ``n_free_blocks``,
    ``free_all_blocks``, ``set_limit``/``get_limit``, ``reset_peak_stats``, ``stats``,
    ``plan``, ``profile``, ``iteration_source``, ``in_iteration``."""

    def set_limit(self, size: int) -> None:
        with self:
            self.hot.drain()
            self.memory.set_limit(size)

    def get_limit(self) -> int:
        return self.memory.limit

    def used_bytes(self) -> int:
        with self:
            hot = self.hot
            hot.drain()
            return hot.used

    def free_bytes(self) -> int:
        with self:
            self.hot.drain()
            return self.memory.own_free_bytes() + self.fallback.free_bytes()

    def total_bytes(self) -> int:
        with self:
            self.hot.drain()
            return self.memory.total_bytes()

    def n_free_blocks(self) -> int:
        """Free gaps in the arenas, idle kept buffers, and the stock pool's cached blocks."""
        with self:
            self.hot.drain()
            return self.memory.free_gaps() + self.fallback.n_free_blocks()

    def free_all_blocks(self) -> None:
        """Give back every idle byte: the stock pool's cache, idle survivors' buffers, the
        arena between iterations, an idle worker.

        The plan stays: its arena is taken again at the next iteration.
        """
        with self:
            self.memory.release_idle(arena_too=not self.state.inside)
        self.planner.stop_idle_worker()

    def reset_peak_stats(self) -> None:
        """Peaks start again from what is in use and held now (PyTorch's reset_peak_memory_stats)."""
        with self:
            self.hot.drain()
            self.hot.reset_peak()
            self.memory.peak_total = self.memory.total_bytes()

    def stats(self) -> PoolStats:
        """Every counter at once (frees applied first, so they are current)."""
        with self:
            self.hot.drain()
            return pool_stats(self)

    @property
    def in_iteration(self) -> bool:
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
