"""A background planner held between the points a test names: plans arrive deterministically.

A background planner works while the test runs, so a plan may be ready at one
boundary in one run and at the next in another, and Hypothesis would see a
flaky test.  :class:`HeldPlanner` parks the planner thread on a gate (a
chore it runs, :meth:`~pgmo.engine.planner.Planner.later`); the work handed
to it queues up meanwhile.  :meth:`HeldPlanner.settle` lets it do all of
that work and waits until it is idle
(:meth:`~pgmo.engine.planner.Planner.wait_idle`): whatever plan it made is
then installed at the pool's next boundary, in every run.  For the other
re-planning modes (no thread) it does nothing.

Its own calls to the planner are the test's, not the engine's run: a test
that injects interrupts into the engine's lines (``tests/interrupts.py``)
injects none into them (one that landed between queuing the gate and waking
the thread would leave the planner asleep, and the test waiting).
"""

from __future__ import annotations

import contextlib
import sys
import threading

#: Seconds a settle may take (a worker start and a budgeted solve take about one).
SETTLE_TIMEOUT = 120.0


class HeldPlanner:
    """Use as a context manager around everything the test does with ``pool``."""

    def __init__(self, pool):
        self.planner = getattr(pool, "engine", pool).planner
        self.background = self.planner.mode == "background"
        self._gate = threading.Event()

    def __enter__(self) -> "HeldPlanner":
        self._hold()
        return self

    def __exit__(self, *exc) -> None:
        self._gate.set()  # never leave the planner thread parked

    def _hold(self) -> None:
        if self.background:
            self._gate.clear()
            with _untraced():
                self.planner.later(lambda: self._gate.wait(SETTLE_TIMEOUT))

    def settle(self) -> None:
        """Let the planner finish everything handed to it so far, then hold it again."""
        if not self.background:
            return
        self._gate.set()
        with _untraced():
            idle = self.planner.wait_idle(SETTLE_TIMEOUT)
        assert idle, "the background planner never went idle"
        self._hold()


@contextlib.contextmanager
def _untraced():
    """No trace function (no injected interrupt) in the harness's own calls."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        yield
    finally:
        sys.settrace(tracer)
