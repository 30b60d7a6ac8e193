"""How long a search may run: a step budget, a deadline, or both.

Search steps (nodes of a backtracking search, moves of a local search) are
counted, so that a step budget gives the same plan on every machine; the
deadline (a ``time.perf_counter()`` value) keeps the time limit.  Whichever
runs out first stops the search.  A phase of the search gets a
:meth:`Budget.share` of what is left and reports back what it spent.
"""

from __future__ import annotations

import time

__all__ = ["Budget"]


class Budget:
    """Steps left (None: unlimited) and a deadline (None: none)."""

    def __init__(self, steps: int | None = None, deadline: float | None = None):
        self.steps = steps
        self.deadline = deadline
        self.used = 0

    @property
    def steps_left(self) -> int | None:
        return None if self.steps is None else max(0, self.steps - self.used)

    def spend(self, steps: int) -> None:
        self.used += steps

    def time_left(self) -> float:
        if self.deadline is None:
            return float("inf")
        return self.deadline - time.perf_counter()

    def expired(self) -> bool:
        """True once the steps are spent or the deadline has passed."""
        left = self.steps_left
        return (left is not None and left <= 0) or time.perf_counter() >= (
            self.deadline if self.deadline is not None else float("inf"))

    def share(self, fraction: float) -> "Budget":
        """A budget for one phase: ``fraction`` of the steps and of the time left."""
        left = self.steps_left
        steps = None if left is None else max(1, int(left * fraction))
        deadline = None
        if self.deadline is not None:
            now = time.perf_counter()
            deadline = now + max(0.0, self.deadline - now) * fraction
        return Budget(steps, deadline)

    def limit(self, steps: int) -> int:
        """``steps``, or fewer when fewer are left."""
        left = self.steps_left
        return steps if left is None else min(steps, left)
