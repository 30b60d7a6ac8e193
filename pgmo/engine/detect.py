"""Find iterations in a stream of requests when the user marks none.

With only ``cupy.cuda.set_allocator(pool.malloc)`` and no ``pool.iteration()``,
the pool still sees a training loop as a request sequence that repeats.
:class:`IterationDetector` watches the rounded sizes of the requests made
outside any iteration and looks for the smallest period ``P`` that the last
three repetitions share exactly, with as many of the watched blocks live at
the same point of each (a training loop frees what it allocates; building a
model, whose layers repeat their parameters' sizes, keeps every block and is
no loop).  It then picks the phase where the fewest of the watched blocks
are live (a real iteration boundary frees almost everything), so that the
engine can open an iteration every ``P`` requests from there.

This is safe whatever it finds: the engine never trusts a plan blindly (a
request larger than planned, an extra request, or a block still in use all
get memory elsewhere), so a wrong period costs memory savings, never data.
:class:`~.loop_watch.LoopWatch` gives up on a period whose iterations keep
departing from their plan; this module only finds periods.

Tested in ``tests/test_unmarked.py`` and ``tests/test_engine_detection.py``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IterationDetector", "Found"]

#: Repetitions of the period that must match before it is trusted.
REPEATS = 3
#: Fewest requests a detected iteration may have.
MIN_PERIOD = 2
#: Requests kept for the search (the longest detectable iteration is a third).
WINDOW = 1 << 17
#: Candidate periods checked per search after the cheap filter.
MAX_CANDIDATES = 64


class Found:
    """A detected period and the request number at which an iteration starts."""

    __slots__ = ("period", "start")

    def __init__(self, period: int, start: int):
        self.period, self.start = period, start

    def __repr__(self) -> str:
        return f"Found(period={self.period}, start={self.start})"


class IterationDetector:
    """Records requests outside iterations; :meth:`search` finds a repeating iteration."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.sizes: list[int] = []
        self.live: list[int] = []  # watched blocks live just before each request
        self.allocs = 0  # every request seen (its sequence number is its index)
        self.frees = 0  # of the watched blocks (the engine counts them: LoopWatch sets it)
        self.offset = 0  # sequence number of sizes[0]
        self._next_search = 64

    def request(self, rounded_size: int) -> int:
        """Note one request; returns its sequence number (the block's index)."""
        self.sizes.append(rounded_size)
        self.live.append(self.allocs - self.frees)
        k = self.allocs
        self.allocs += 1
        if len(self.sizes) > 2 * self.window:
            drop = len(self.sizes) - self.window
            del self.sizes[:drop], self.live[:drop]
            self.offset += drop
        return k

    def due(self) -> bool:
        """Whether enough new requests arrived to search again (doubling, then steady)."""
        return self.allocs >= self._next_search

    def search(self) -> Found | None:
        """The smallest period repeated :data:`REPEATS` times at the end, with its phase."""
        self._next_search = self.allocs + min(max(self.allocs, 64), 8192)
        s = np.asarray(self.sizes[-self.window:], dtype=np.int64)
        n = len(s)
        max_period = n // REPEATS
        if max_period < MIN_PERIOD:
            return None
        # Candidate periods p: s[n-1-p] == s[n-1]; then keep those matching on
        # more and more of the tail, a cheap filter before the full check.
        p = np.arange(MIN_PERIOD, max_period + 1)
        p = p[s[n - 1 - p] == s[-1]]
        for back in range(1, min(32, n)):
            if p.size <= MAX_CANDIDATES:
                break
            ok = n - 1 - back - p >= 0
            p = p[ok]
            p = p[s[n - 1 - back - p] == s[n - 1 - back]]
        live = np.asarray(self.live[-self.window:], dtype=np.int64)
        for period in p[:MAX_CANDIDATES].tolist():
            span = REPEATS * period
            tail, held = s[n - span:], live[n - span:]
            if np.array_equal(tail[period:], tail[:-period]) \
                    and np.array_equal(held[period:], held[:-period]):  # a steady state
                return Found(period, self._phase(period, n))
        return None

    def _phase(self, period: int, n: int) -> int:
        """Sequence number of the next request that starts an iteration."""
        live = np.asarray(self.live[-REPEATS * period:], dtype=np.int64)
        per_position = live.reshape(REPEATS, period).sum(axis=0)
        phase = int(per_position.argmin())  # position in the last periods
        first = self.offset + (len(self.sizes) - REPEATS * period) + phase
        # The next request is number self.allocs: the next start at or after it.
        periods_ahead = -(-(self.allocs - first) // period)
        return first + periods_ahead * period
