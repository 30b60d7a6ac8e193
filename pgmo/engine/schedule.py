"""A plan compiled for the hot path: what request ``i`` gets, and what must be free by then.

The safety rule the hot path relies on: request ``k`` may use its planned
addresses only when every block planned to be freed before ``k``'s
allocation has been freed.  The plan is valid, so blocks whose planned
lifetimes overlap ``k``'s have other addresses; the only blocks that could
sit on ``k``'s addresses are those planned dead by then.  Block ``j`` is
listed in ``due[k]`` for the first request ``k`` allocated at or after ``j``'s
planned free; the hot path's hand-out decision
(:meth:`~.handout.HotPath.serve_numbered`) moves it to the arena's overdue
list if it is still alive then, and a request meeting an overdue block by
address gets memory of its own (a departure).

Tested in ``tests/test_engine_departures.py`` (the safety rule, on both hot
paths) and ``tests/test_pool_properties.py``.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Final, cast

import numpy as np

from ..errors import PlanError
from ..plan import Plan
from ..trace import Trace
from ..units import ALIGNMENT, round_size

__all__ = ["Schedule", "compile_schedule", "Row", "CAP", "OFFSET", "DUE", "SENTINEL",
           "PINNED_CAP"]

#: A row, what request ``i`` of an iteration gets: ``(cap, offset, due)``.  ``cap``: its
#: planned size (a larger request departs from the plan); ``offset``: its place in the
#: arena (-1: a survivor, kept apart in a buffer of its own); ``due``: the requests
#: planned dead by then (see the safety rule above).  A plain tuple, so that the compiled
#: hot path reads it as a C tuple; its fields by position, named here only:
Row = tuple[int, int, tuple[int, ...]]
CAP: Final = 0
OFFSET: Final = 1
DUE: Final = 2
#: The row after the last planned request: no request fits it (every one beyond the
#: planned count departs).
SENTINEL: Row = (-1, -1, ())

#: The planned size of a pinned request: any size fits it (a survivor is kept apart).
PINNED_CAP = 1 << 62


@dataclass(frozen=True, eq=False)
class Schedule:
    """Rows for :class:`~.handout.HotPath` and the facts the engine reports."""

    profile: Trace  # block i is request i; open blocks are pinned (kept apart)
    plan: Plan  # places the profile's closed blocks
    rows: list[Row]  # one per request, then the SENTINEL
    pinned: frozenset[int]  # requests that outlived their iteration
    generation: int  # which profile this is (the planner counts them)

    @property
    def n(self) -> int:
        return len(self.rows) - 1

    @property
    def pinned_sizes(self) -> frozenset[int]:
        """The sizes of the requests that outlived their iteration (gradients, a kept loss)."""
        return frozenset(round_size(self.profile.size_of(i)) for i in self.pinned)

    @functools.cached_property
    def kept_apart(self) -> np.ndarray:
        """Per request, whether it is pinned (a bool array: read at every planned boundary)."""
        apart = np.zeros(self.n, dtype=bool)
        apart[list(self.pinned)] = True
        return apart

    @functools.cached_property
    def arena_size(self) -> int:
        """The arena the plan needs (read at every boundary: kept)."""
        return round_size(self.plan.peak)


def compile_schedule(profile: Trace, plan: Plan, generation: int = 0,
                     check: bool = True) -> Schedule:
    """Build the rows; with ``check``, refuse a plan that does not fit the profile.

    A pool profile numbers its requests 0..n-1 in allocation order, so the
    alloc ticks increase strictly; a plan must place exactly its closed blocks.
    """
    blocks = profile.blocks
    n = len(blocks)
    lowers = [b.lower for b in blocks]
    if check:
        for i, b in enumerate(blocks):
            if b.id != i:
                raise PlanError(f"profile block {i} has id {b.id!r}: a pool profile numbers "
                                f"its requests 0..n-1")
            if i and lowers[i] <= lowers[i - 1]:
                raise PlanError(f"profile request {i} is not allocated after request {i - 1}")
        plan.check_fits(profile)
        unaligned = next((o for o in plan.offsets if o % ALIGNMENT), None)
        if unaligned is not None:  # each block's address would be unaligned too
            raise PlanError(f"offset {unaligned} is not a multiple of {ALIGNMENT}")
    off = [-1] * n
    cap = [PINNED_CAP] * n
    for block, o in zip(plan.trace.blocks, plan.offsets):
        i = cast(int, block.id)  # a pool profile's ids are its request numbers
        off[i] = o
        cap[i] = block.size
    due: list[list[int]] = [[] for _ in range(n)]
    for j, b in enumerate(blocks):
        if b.upper is not None:
            k = bisect.bisect_left(lowers, b.upper)  # first request planned after j's free
            if k < n:
                due[k].append(j)
    rows: list[Row] = [(c, o, tuple(d)) for c, o, d in zip(cap, off, due)]
    rows.append(SENTINEL)
    pinned = frozenset(i for i in range(n) if off[i] < 0)
    return Schedule(profile, plan, rows, pinned, generation)
