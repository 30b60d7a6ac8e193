"""Real traces: pack the blocks around the peak exactly, then fill in the rest.

On real traces the max load is reached at one instant or a few, and the load
elsewhere is well below it (on pangu_2.6B it exceeds 99 % of the peak in one
section of 20 000).  Greedy packings lose there: at the peak every byte must
be used, and a greedy order leaves gaps.  So:

1. take the blocks live in a window of ticks around the max-load instant,
   their lifetimes clipped to the window (a few hundred to a few thousand
   blocks), and pack them under capacity = lower bound with the canonical
   search (:mod:`.canonical_search`), which is strong exactly there;
2. keep those offsets for the whole lifetimes of those blocks and place every
   other block around them, first fit in size order (:func:`.greedy.gap_fit_offsets`);
   away from the peak there is room to spare.

Clipping only drops conflicts, so step 1 never rejects a packing that exists;
step 2 may still end above the capacity, then a wider window is tried.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..trace import packing_peak
from .budget import Budget, OutOfTime
from .canonical_search import FOUND, ORDER_RULES, CanonicalSearch, searchable, sections_of
from .greedy import ORDERS, gap_fit_offsets

__all__ = ["core_packings", "WINDOWS", "peak_tick"]

#: Half-widths (in ticks of the trace's clock) of the windows tried, narrow first.
WINDOWS = (50, 200, 10)
#: Nodes for one core search, per block in the core.
NODES_PER_BLOCK = 8


def peak_tick(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int]) -> int:
    """The first tick at which the load is the max load."""
    ticks = np.unique(np.concatenate([np.asarray(lowers), np.asarray(uppers)]))
    delta = np.zeros(len(ticks) + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(ticks, lowers), sizes)
    np.subtract.at(delta, np.searchsorted(ticks, uppers), sizes)
    return int(ticks[int(np.cumsum(delta)[:-1].argmax())])


def core_packings(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
                  capacity: int, budget: Budget, fill_seconds: float = 0.0,
                  stats: dict | None = None) -> Iterator[tuple[str, list[int]]]:
    """Yield ``(name, offsets)`` for every window whose core packs under ``capacity``.

    ``fill_seconds`` estimates one fill (step 2): it is only started when
    that much time is left, and abandoned at the deadline.  ``stats`` (if
    given) collects ``nodes`` and ``restarts`` (core searches).
    """
    stats = stats if stats is not None else {}
    stats.setdefault("nodes", 0)
    stats.setdefault("restarts", 0)
    lo = np.asarray(lowers, dtype=np.int64)
    up = np.asarray(uppers, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64)
    center = peak_tick(lowers, uppers, sizes)
    size_order = ORDERS["size"](lowers, uppers, sizes)
    for half in WINDOWS:
        if budget.expired():
            return
        start, end = center - half, center + half + 1
        inside = np.flatnonzero((lo < end) & (up > start))
        c_lo = np.maximum(lo[inside], start).tolist()
        c_up = np.minimum(up[inside], end).tolist()
        c_size = size[inside].tolist()
        if not searchable(len(inside), sections_of(c_lo, c_up)[2]):
            continue
        for rule in ORDER_RULES:
            if budget.expired():
                return
            search = CanonicalSearch(c_lo, c_up, c_size, rule)
            status, offsets = search.run(capacity, budget.limit(NODES_PER_BLOCK * len(inside)),
                                         budget.deadline, clock=budget.clock)
            budget.spend(search.nodes)
            stats["nodes"] += search.nodes
            stats["restarts"] += 1
            if status != FOUND or offsets is None:  # FOUND carries the offsets
                continue
            # The fill is the core's payoff: it may use the whole search's time left (a
            # core found under the capacity is worth more than the phases after this one).
            whole = budget.whole
            if not whole.fits(fill_seconds):
                return
            fixed = {int(i): o for i, o in zip(inside, offsets)}
            try:
                packed = gap_fit_offsets(lowers, uppers, sizes, size_order, "first", fixed,
                                         whole)
            except OutOfTime:
                return
            yield f"peak-core/{half}/{rule}", packed
            if packing_peak(packed, sizes) <= capacity:
                return
            break
