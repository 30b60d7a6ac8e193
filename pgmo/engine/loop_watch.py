"""Iterations nobody marks (:class:`LoopWatch`): where they come from, and the warning
(:class:`~pgmo.errors.PgmoWarning`) when there are none.

Until the user calls ``pool.iteration()``, requests come outside any
iteration; :class:`LoopWatch` feeds them to an
:class:`~.detect.IterationDetector`, says when a detected iteration starts
and ends, drops a period whose iterations keep departing from their plan,
and warns once when nothing is optimized.  It changes no iteration itself:
the engine asks it, then begins or ends one (see :mod:`.core`).  Kept apart
so that the state machine holds only those decisions.

Tested in ``tests/test_engine_detection.py`` and ``tests/test_unmarked.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from ..errors import PgmoWarning
from .detect import Found, IterationDetector

__all__ = ["LoopWatch", "GIVE_UP"]

log = logging.getLogger("pgmo.pool")

#: Consecutive detected iterations that departed from their plan before the
#: period is dropped as wrong.
GIVE_UP = 3


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, for its caller, that names the first frame outside pgmo.

    The user's call reaches the engine at different depths (the compiled hot
    path has no Python frame, the plain one has; the pool and memory hooks
    add theirs), so no fixed level would name it.
    """
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame.f_back is not None and \
            os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


class LoopWatch:
    """Where iterations come from: marked by the user, detected, or none yet."""

    def __init__(self, detect: bool, warn_after: int):
        """``detect``: look for a repeating loop; ``warn_after``: requests before the warning."""
        self.warn_after = warn_after
        #: The user marks iterations (from the first ``begin_iteration()`` on).
        self.marked = False
        self._detector = IterationDetector() if detect else None
        self._found: Found | None = None
        self._departures = 0  # consecutive detected iterations that departed
        self._unmarked = 0  # requests outside any iteration, before any was marked or found
        self._warned = False

    @property
    def period(self) -> int | None:
        """Requests per detected iteration; None while no period is in use."""
        return self._found.period if self._found is not None else None

    @property
    def index(self) -> int:
        """The last watched request's number (its block's index); -1 when not detecting."""
        return self._detector.allocs - 1 if self._detector is not None else -1

    @property
    def unplanned(self) -> bool:
        """Requests came, and no iteration was marked or found: none was optimized (the
        stock pool, or the heap, served them all)."""
        return bool(self._unmarked) and not self.marked and self._found is None

    @property
    def source(self) -> str:
        """Where iterations come from: "marked", "detected (every n requests)" or "none"."""
        if self.marked:
            return "marked"
        if self._found is not None:
            return f"detected (every {self._found.period} requests)"
        return "none"

    def request(self, rs: int, watched_frees: int) -> bool:
        """A request outside iterations while none was ever marked: look for a loop.

        ``watched_frees`` counts the frees of the watched blocks so far.
        Returns True when this request starts a detected iteration (the
        engine begins it); otherwise the engine serves it outside any
        iteration and calls :meth:`unmarked`.
        """
        detector = self._detector
        if detector is None:
            return False
        detector.frees = watched_frees
        k = detector.request(rs)
        found = self._found
        if found is not None and k >= found.start:
            return True
        if found is None and detector.due():
            found = detector.search()
            if found is not None:
                self._found = found
                log.info("pgmo found a repeating iteration of %d requests; optimizing it "
                         "(mark iterations with pool.iteration() to choose them yourself)",
                         found.period)
        return False

    def unmarked(self) -> None:
        """Count a request served outside any iteration; warn once when nothing is optimized."""
        self._unmarked += 1
        if self._unmarked >= self.warn_after and self._found is None and not self._warned:
            self._warned = True
            why = ("found no repeating loop" if self._detector is not None
                   else "loop detection is off (detect_iterations=False)")
            warnings.warn(
                f"pgmo has served {self._unmarked:,} allocations without an iteration and "
                f"{why}, so it optimizes nothing. Wrap each training step "
                f"in `with pool.iteration():` (or use pgmo.chainer.ProfileGuidedMemory).",
                PgmoWarning, stacklevel=_user_stacklevel())

    def keep_period(self, departed: bool) -> bool:
        """A detected iteration ended (``departed``: from its plan); False drops the period.

        After :data:`GIVE_UP` departing iterations in a row the period is
        taken for wrong: the search starts again, and the engine drops the
        plan made for it.
        """
        self._departures = self._departures + 1 if departed else 0
        if self._departures < GIVE_UP:
            return True
        found = self._found
        assert found is not None  # the engine asks only while a period is in use
        log.info("pgmo: the detected iteration of %d requests keeps departing from its "
                 "plan; looking for another", found.period)
        self._found = None
        self._departures = 0
        self._detector = IterationDetector()
        return False

    def mark(self) -> bool:
        """The user marks iterations from now on; returns whether a detected period makes way."""
        had_period = self._found is not None
        self.marked = True
        self._found = None
        self._detector = None
        return had_period
