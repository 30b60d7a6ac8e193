"""The engine's parts, declared once for the mixins that complete :class:`~.core.Engine`.

:class:`~.plan_choice.PlanChoice` and :class:`~.pool_queries.PoolQueries` run
on the engine and read its parts; this names each part, its type and what it
means, so that a reader of either mixin (and the type checker) finds them
without reading ``Engine.__init__``, which sets every one.  Tested with the
engine (``tests/test_engine_*.py``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..trace import Trace
    from .handout import HotPath
    from .loop_watch import LoopWatch
    from .memory import DeviceMemory
    from .planner import Planner
    from .profiles import Log
    from .schedule import Schedule
    from .shapes import ShapeBook
    from .state import IterationState

__all__ = ["EngineParts"]


class EngineParts:
    """What :class:`~.core.Engine` is made of (set in its ``__init__``)."""

    _lock: threading.Lock  # every entry but the owner's inline malloc holds it
    hot: HotPath  # hands blocks out, takes frees back
    memory: DeviceMemory  # every byte obtained and released
    planner: Planner  # the profile's owner: logs -> plans
    state: IterationState  # where the engine is
    watch: LoopWatch  # where iterations come from
    shapes: ShapeBook  # the recurring shapes' plans
    completed: int  # iterations ended
    departures: int  # requests that left their plan (stats)
    warmup: int  # iterations served from memory of their own before plans are used
    schedule: Schedule | None  # installed: the main plan
    current: Schedule | None  # the plan this iteration follows (main or a shape's)
    on_install: Callable[[Schedule], None] | None  # told of each schedule installed
    _pending: Schedule | None  # to install at the next boundary
    _deferred: Schedule | None  # a plan whose arena the device refused
    _awaited: tuple[Trace, int] | None  # (profile being planned, its arena's least size)
    _addresses: dict[int, tuple[int, list[int], Schedule]]  # id(schedule) -> its addresses
    _first_request: int  # the iteration's first request's size, once seen (0: not looked at)
    _last_log: Log | None  # the last unplanned iteration's log
    _unplanned_varied: bool  # the last two unplanned iterations differed

    def _admit(self) -> None:
        """Exclusive access, the lock held (:meth:`.core.Engine._admit`)."""
        raise NotImplementedError

    def _refresh_kind(self) -> None:
        """Tell the hot path what the owner's requests are now
        (:meth:`.core.Engine._refresh_kind`)."""
        raise NotImplementedError

    def _next_mode(self) -> str:
        """What an iteration starting now does (:meth:`.pool_queries.PoolQueries._next_mode`)."""
        raise NotImplementedError

    def _follow(self, schedule: Schedule | None) -> None:
        """Answer this iteration from ``schedule`` (:meth:`.plan_choice.PlanChoice._follow`)."""
        raise NotImplementedError

    def _start_hot(self, on_plan: bool, follow: Schedule | None) -> None:
        """Begin the hot path's iteration (:meth:`.core.Engine._start_hot`)."""
        raise NotImplementedError

    def _reset_plan(self) -> None:
        """Forget profile and plan (:meth:`.plan_choice.PlanChoice._reset_plan`)."""
        raise NotImplementedError

    def _at_boundary(self) -> None:
        """Install a ready plan or fit the arena (:meth:`.plan_choice.PlanChoice._at_boundary`)."""
        raise NotImplementedError

    def _plan_ready(self) -> bool:
        """A plan is installed and its arena holds it
        (:meth:`.plan_choice.PlanChoice._plan_ready`)."""
        raise NotImplementedError
