"""Large neighbourhood search: lower a packing's peak by re-packing slabs of it.

A search over whole packings under a capacity (:mod:`.canonical_search`)
settles early choices badly on some instances (MiniMalloc's E and I are not
packed under +4 % of the lower bound in 20 000 nodes), while it packs a
hundred blocks or so between pinned neighbours well.  So, from a packing of
peak ``P``, each move:

1. picks a block that reaches above ``P - step`` (seeded), and takes the
   ``k`` blocks that live during its lifetime (widened at random) and reach
   highest: the *slab*; blocks above ``P - step`` whose lifetimes meet the
   slab's join it (they must come down too);
2. pins every other block that meets the slab in time and address above the
   slab's lowest offset (clipped to that part), and runs the canonical search
   on the slab under ``P - step`` with a small node limit;
3. on success, moves the slab: fewer blocks above ``P - step``, and once none
   is left the peak is lower.  On failure, sometimes (seeded) the slab is
   re-packed under ``P`` instead, a sideways move accepted when it leaves no
   more blocks above ``P - step``: it shakes the packing out of a dead end.

Steps are the canonical search's nodes, so a step budget gives the same
packing on every machine.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

from ..trace import intervals_overlap
from .budget import Budget
from .canonical_search import FOUND, ORDER_RULES, CanonicalSearch, searchable, sections_of

__all__ = ["NeighbourhoodSearch", "SLAB_SIZES", "NODES_PER_SLAB_BLOCK"]

#: Smallest and largest number of blocks in a slab (before the blocks that must come
#: down).  Slabs of 8 to 48 blocks did not lower MiniMalloc's E at all in our trials.
SLAB_SIZES = (48, 160)
#: Node limit of one slab search, per block in the slab (pinned blocks included).
NODES_PER_SLAB_BLOCK = 30
#: Chance that a failed move is followed by a sideways re-pack under the current peak.
SIDEWAYS = 0.3


class NeighbourhoodSearch:
    """Slab moves on one trace; :meth:`run` improves a packing until the budget runs out."""

    def __init__(self, lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
                 seed: int = 0):
        self.lowers, self.uppers, self.sizes = list(lowers), list(uppers), list(sizes)
        self.n = len(sizes)
        self.step = math.gcd(*sizes) if sizes else 1
        self.rng = random.Random(seed)
        self.moves = 0
        self.improvements = 0

    def run(self, offsets: Sequence[int], budget: Budget, target: int) -> list[int]:
        """A packing no higher than ``offsets``, lower when a move found one, by ``budget``.

        Stops early once the peak is at most ``target`` (the lower bound).
        """
        sizes, n = self.sizes, self.n
        offsets = list(offsets)
        tops = [o + s for o, s in zip(offsets, sizes)]
        peak = max(tops, default=0)
        slowest = 0.0  # seconds of the slowest move: the next one starts only if it fits
        while n > 1 and peak > target and not budget.expired() \
                and budget.time_left() > slowest:
            started = budget.clock()
            level = peak - self.step  # blocks reaching above it must come down
            over = [i for i in range(n) if tops[i] > level]
            slab = self._slab(offsets, tops, over, level)
            moved = self._repack(offsets, slab, level, budget)
            if moved is None and self.rng.random() < SIDEWAYS and not budget.expired():
                moved = self._repack(offsets, slab, peak, budget)
                if moved is not None and self._above(moved, offsets, level) > self._above(
                        {i: offsets[i] for i in moved}, offsets, level):
                    moved = None
            self.moves += 1
            slowest = max(slowest, budget.clock() - started)
            if moved is None:
                continue
            for i, o in moved.items():
                offsets[i] = o
                tops[i] = o + sizes[i]
            new_peak = max(tops)
            if new_peak < peak:
                self.improvements += 1
                peak = new_peak
        return offsets

    def _above(self, moved: dict[int, int], offsets, level: int) -> int:
        """How many of the moved blocks reach above ``level`` at their offsets in ``moved``."""
        return sum(o + self.sizes[i] > level for i, o in moved.items())

    def _slab(self, offsets, tops, over, level) -> list[int]:
        """The blocks to re-pack: the highest ones around a random block above ``level``."""
        lowers, uppers, rng = self.lowers, self.uppers, self.rng
        centre = rng.choice(over)
        width = uppers[centre] - lowers[centre]
        start = lowers[centre] - int(width * rng.random())
        end = uppers[centre] + int(width * rng.random())
        around = [i for i in range(self.n)
                  if intervals_overlap(lowers[i], uppers[i], start, end)]
        around.sort(key=lambda i: (-tops[i], i))
        slab = set(around[:rng.randint(*SLAB_SIZES)])
        slab.add(centre)
        lo = min(lowers[i] for i in slab)
        up = max(uppers[i] for i in slab)
        slab.update(i for i in over if intervals_overlap(lowers[i], uppers[i], lo, up))
        return sorted(slab)

    def _repack(self, offsets, slab, capacity, budget) -> dict[int, int] | None:
        """New offsets for ``slab`` under ``capacity`` with the rest pinned, or None."""
        lowers, uppers, sizes = self.lowers, self.uppers, self.sizes
        base = min(offsets[i] for i in slab)
        lo = min(lowers[i] for i in slab)
        up = max(uppers[i] for i in slab)
        inside = set(slab)
        # Pinned: the rest of the packing where it meets the slab's span above ``base``,
        # clipped to that part (clipping drops only conflicts the slab cannot have).
        rows_lo, rows_up, rows_size, pinned = [], [], [], {}
        for i in slab:
            rows_lo.append(lowers[i])
            rows_up.append(uppers[i])
            rows_size.append(sizes[i])
        for i in range(self.n):
            if i in inside or not intervals_overlap(lowers[i], uppers[i], lo, up):
                continue
            top = offsets[i] + sizes[i]
            if top <= base:
                continue
            bottom = max(offsets[i], base)
            pinned[len(rows_size)] = bottom - base
            rows_lo.append(max(lowers[i], lo))
            rows_up.append(min(uppers[i], up))
            rows_size.append(top - bottom)
        if not searchable(len(rows_size), sections_of(rows_lo, rows_up)[2]):
            return None  # too big a search for one move
        rule = ORDER_RULES[self.rng.randrange(len(ORDER_RULES))]
        search = CanonicalSearch(rows_lo, rows_up, rows_size, rule, self.rng.randrange(1 << 30))
        nodes = budget.limit(NODES_PER_SLAB_BLOCK * len(rows_size))
        status, found = search.run(capacity - base, nodes, budget.deadline, pinned, budget.clock)
        budget.spend(max(1, min(search.nodes, nodes)))  # the node past the limit is not expanded
        if status != FOUND or found is None:  # FOUND carries the offsets
            return None
        return {i: base + found[k] for k, i in enumerate(slab)}
