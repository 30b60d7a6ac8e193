"""Where the engine is: inside an iteration or between two, interrupted or not, on plan or not.

One record, from which both what the user is told (:meth:`IterationState.mode`)
and what the hot path does with the owner's next request
(:meth:`IterationState.hot_kind`) are derived, so that the two never disagree.
"""

from __future__ import annotations

from .handout import FALLBACK, PLANNED, RECORDED, SLOW

__all__ = ["IterationState", "MODES"]

#: What an iteration does (``pool.mode``; the re-planning modes are
#: :data:`~.planner.REPLAN_MODES`).
MODES = ("warmup", "profiling", "planning", "optimized", "fallback")


class IterationState:
    """The engine's iteration state.

    ``inside``: an iteration is open; ``interrupts``: nested ``interrupt()``
    calls; ``mode``: what the open iteration does (one of :data:`MODES`,
    decided when it began); ``on_plan``: its requests are answered from the
    schedule (false from its first departure on); ``planned``: it began on
    plan; ``choosing``: its first request is still to name its shape, which
    picks the plan it follows (:mod:`.shapes`); ``departed``: it left its
    plan, so its log goes to the planner; ``plan_dropped``: the plan went
    away while it ran (its log is no profile); ``elsewhere``: it began under another
    device than the pool's, so all its requests go to CuPy's pool for that device.
    """

    __slots__ = ("inside", "interrupts", "iteration_mode", "on_plan", "planned", "choosing",
                 "departed", "plan_dropped", "elsewhere")

    def __init__(self) -> None:
        self.inside = False
        self.interrupts = 0
        self.iteration_mode = "warmup"
        self.on_plan = False
        self.planned = False
        self.choosing = False
        self.departed = False
        self.plan_dropped = False
        self.elsewhere = False

    @property
    def recording(self) -> bool:
        """The owner's requests are numbered and logged (in an iteration of the pool's device,
        not interrupted)."""
        return self.inside and not self.interrupts and not self.elsewhere

    def begin(self, mode: str, on_plan: bool, choosing: bool = False,
              elsewhere: bool = False) -> None:
        self.elsewhere = elsewhere
        self.inside = True
        self.iteration_mode = mode
        self.on_plan = self.planned = on_plan
        self.choosing = choosing
        self.departed = False
        self.plan_dropped = False

    def end(self) -> None:
        self.inside = False

    def depart(self) -> None:
        """A request left the plan: the rest of the iteration is recorded, then re-planned."""
        self.on_plan = False
        self.departed = True

    def hot_kind(self, marked: bool) -> int:
        """What the owner's next request is, for :class:`~.handout.HotPath` (``marked``: the
        user marks iterations)."""
        if self.interrupts:
            return FALLBACK
        if self.inside:
            if self.elsewhere:
                return FALLBACK
            if self.choosing:  # the engine picks the plan first
                return SLOW
            return PLANNED if self.on_plan else RECORDED
        return FALLBACK if marked else SLOW

    def mode(self, next_mode: str, unplanned: bool) -> str:
        """``pool.mode``: the open iteration's, else what the next one would do.

        ``next_mode``: what an iteration starting now does; ``unplanned``:
        requests came and no iteration was marked or found, so nothing is
        optimized.
        """
        if self.interrupts:
            return "fallback"
        if self.inside:
            return self.iteration_mode
        return "fallback" if unplanned else next_mode
