"""How long a search may run: a step budget, a deadline, or both, on one clock.

Search steps (nodes of a backtracking search, moves of a local search) are
counted, so that a step budget gives the same plan on every machine; the
deadline keeps the time limit.  Whichever runs out first stops the search.
A phase of the search gets a :meth:`Budget.share` of what is left and
reports back what it spent.

Every time check reads the budget's :data:`Clock` (``time.perf_counter`` by
default), never the time module directly: a test injects a fake clock and
sees every place that keeps the limit.  Work that cannot return a partial
result checks with :meth:`Budget.check`, which raises :class:`OutOfTime`.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Budget", "Clock", "OutOfTime", "WALL_CLOCK"]

#: Seconds, monotonic: what a deadline is measured on.
Clock = Callable[[], float]
WALL_CLOCK: Clock = time.perf_counter


class OutOfTime(Exception):
    """The deadline passed inside a step that has no partial result to give."""


class Budget:
    """Steps left (None: unlimited) and a deadline on ``clock`` (None: none)."""

    def __init__(self, steps: int | None = None, deadline: float | None = None,
                 clock: Clock = WALL_CLOCK):
        self.steps = steps
        self.deadline = deadline
        self.clock = clock
        self.used = 0
        #: The budget this one is a share of (None: the whole search's own).
        self.outer: Budget | None = None

    @property
    def whole(self) -> "Budget":
        """The whole search's budget: for work that is a phase's only payoff, which a
        phase may finish past its share (the phases after it get less)."""
        budget = self
        while budget.outer is not None:
            budget = budget.outer
        return budget

    @property
    def steps_left(self) -> int | None:
        return None if self.steps is None else max(0, self.steps - self.used)

    def spend(self, steps: int) -> None:
        self.used += steps

    def time_left(self) -> float:
        if self.deadline is None:
            return float("inf")
        return self.deadline - self.clock()

    def fits(self, seconds: float) -> bool:
        """Whether a step estimated to take ``seconds`` ends before the deadline."""
        return self.time_left() > seconds

    def expired(self) -> bool:
        """True once the steps are spent or the deadline has passed."""
        left = self.steps_left
        return (left is not None and left <= 0) or (
            self.deadline is not None and self.clock() >= self.deadline)

    def check(self) -> None:
        """Raise :class:`OutOfTime` once the deadline has passed."""
        if self.deadline is not None and self.clock() >= self.deadline:
            raise OutOfTime

    def share(self, fraction: float) -> "Budget":
        """A budget for one phase: ``fraction`` of the steps and of the time left."""
        left = self.steps_left
        steps = None if left is None else max(1, int(left * fraction))
        deadline = None
        if self.deadline is not None:
            now = self.clock()
            deadline = now + max(0.0, self.deadline - now) * fraction
        part = Budget(steps, deadline, self.clock)
        part.outer = self
        return part

    def limit(self, steps: int) -> int:
        """``steps``, or fewer when fewer are left."""
        left = self.steps_left
        return steps if left is None else min(steps, left)
