"""The canonical search's work per node: its choices, and placing one block.

:mod:`.canonical_search` walks the tree; this module does what each node and
each child costs, on the search's arrays, in one of two ways that give the
same answers (the same nodes, the same packings):

- :class:`Nodes`: plain loops over the blocks, which Cython compiles (with
  the C types in ``search_nodes.pxd``) into C when pgmo is built with a
  compiler (see ``setup.py``); then a node costs a few hundred nanoseconds
  instead of the dozen NumPy calls (about a microsecond each) of
- :class:`.numpy_nodes.NumpyNodes`: the same steps as NumPy calls, the
  fastest way in plain Python.  The search uses it when this module is not
  compiled (or is older than its source), or when ``PGMO_PURE_PYTHON=1`` is
  set (to debug, or to compare).

Tested in ``tests/test_canonical_search.py`` (both kinds, and :class:`Nodes`
run as plain Python, against the search's pinned nodes and packings).
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any

import numpy as np

from .compiled import older_than_source, plain_copy
from .numpy_nodes import NumpyNodes

try:
    import cython

    COMPILED: bool = cython.compiled
except ImportError:  # Cython is a build dependency only
    COMPILED = False

__all__ = ["Nodes", "COMPILED", "default_kind", "plain_module"]


#: A placed block's floor (as :mod:`.canonical_search`'s).
BIG = 1 << 62
#: ``need & LOW`` maps a section with no unplaced block to 0 (see :mod:`.canonical_search`).
LOW = (1 << 62) - 1


def default_kind() -> type[Nodes] | type[NumpyNodes]:
    """The compiled loops when this module is compiled (unless ``PGMO_PURE_PYTHON``), else NumPy.

    A compiled module older than its source (edited, not rebuilt) is not
    trusted: NumPy then, with a warning.
    """
    if not COMPILED or os.environ.get("PGMO_PURE_PYTHON") or _stale():
        return NumpyNodes
    return Nodes


@functools.cache
def plain_module() -> types.ModuleType:
    """This module's source run as plain Python (this very module where it is not compiled)."""
    return plain_copy(__name__, __file__) if COMPILED else sys.modules[__name__]


@functools.cache
def _stale() -> bool:
    return older_than_source(__name__, __file__, "search")


class Nodes:
    """A search's per-node work as loops (compiled to C when built).

    It shares the search's arrays (floor, rank, load, ...): what one changes,
    the other sees.  Placing pushes what it changed on a stack that
    :meth:`unplace` pops, so calls must nest (the search is depth-first).
    """

    def __init__(self, search: Any):  # a CanonicalSearch (which imports this module)
        n = search.n
        self.n, self.capacity, self.any_pinned = n, search.capacity, search.any_pinned
        self.floor, self.rank, self.load = search.floor, search.rank, search.load
        self.size, self.cuts = search.size, search.cuts
        self.members, self.starts = search.members, search.starts
        self.pinned = search.pinned.view(np.uint8)
        self.first, self.last = search.first_arr, search.last_arr
        reach = np.array(search.reach, dtype=np.int64).reshape(n, 2)
        self.reach_lo, self.reach_hi = reach[:, 0].copy(), reach[:, 1].copy()
        # Block k's neighbours: near[near_start[k]:near_start[k + 1]].
        counts = np.array([len(near) for near in search.neighbours], dtype=np.int64)
        near_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=near_start[1:])
        self.near_start = near_start
        self.near = (np.concatenate(search.neighbours).astype(np.int64) if n
                     else np.zeros(0, dtype=np.int64))
        # Each placement pushes (block, old floor) per raised block, then their count.
        self.saved = np.zeros(2 * int(counts.sum()) + n + 1, dtype=np.int64)
        self.depth = 0
        # The rule's keys: key l of block k is rule_ranks[l * n + k], or its peak load (T).
        rule = search.rule
        self.n_keys = len(rule)
        rule_ranks = np.zeros((len(rule), n), dtype=np.int64)
        is_peak = np.zeros(len(rule), dtype=np.uint8)
        for l, c in enumerate(rule):
            if c == "T":
                is_peak[l] = 1
            else:
                rule_ranks[l] = search.key_ranks[c]
        self.rule_ranks, self.is_peak = rule_ranks.ravel(), is_peak

    def choices(self, part: np.ndarray, s_lo: int, s_hi: int, last_offset: int,
                last_block: int) -> list[tuple[int, int]] | None:
        """The children of a node: ``(floor * n + rank, block)`` in the order to try them.

        None: every block of ``part`` is placed.  Only the unplaced blocks
        below the lowest top, after the last block placed (in that key), not
        above a pinned block, and low enough that the load of sections
        ``[s_lo, s_hi)`` fits on them under the capacity.  An empty list: none.
        """
        floor, size, rank, pinned = self.floor, self.size, self.rank, self.pinned
        n, m = self.n, len(part)
        lowest_top = BIG
        pin_min = BIG
        for j in range(m):
            i = part[j]
            top = floor[i] + size[i]
            if top < lowest_top:
                lowest_top = top
            if pinned[i] and floor[i] < pin_min:
                pin_min = floor[i]
        if lowest_top >= BIG:
            return None
        if pin_min < BIG and pin_min < last_offset:
            return []  # a pinned block was passed: it can never be placed
        max_load = 0
        for c in range(s_lo, s_hi):
            if self.load[c] > max_load:
                max_load = self.load[c]
        last_key = last_offset * n + (rank[last_block] if last_block >= 0 else n - 1)
        highest = min(pin_min, self.capacity - max_load)  # the later choices start no lower
        found = []
        for j in range(m):
            i = part[j]
            f = floor[i]
            if f < lowest_top and f <= highest:
                key = f * n + rank[i]
                if key > last_key:
                    found.append((int(key), int(i)))
        found.sort()
        return found

    def place(self, b: int, o: int, s_lo: int, s_hi: int) -> int:
        """Place block ``b`` at ``o``, raising its neighbours' floors: 1 when the bound holds.

        0: placed, but some section of ``[s_lo, s_hi)`` can no longer fit
        under the capacity.  -1: it would push a pinned block up; nothing
        changed.  After 0 or 1, :meth:`unplace` undoes it.
        """
        floor, near, pinned, saved = self.floor, self.near, self.pinned, self.saved
        top = o + self.size[b]
        lo, hi = self.near_start[b], self.near_start[b + 1]
        if self.any_pinned:
            for j in range(lo, hi):
                k = near[j]
                if floor[k] < top and pinned[k]:
                    return -1
        depth = self.depth
        raised = 0
        for j in range(lo, hi):
            k = near[j]
            if floor[k] < top:  # placed neighbours have floor BIG
                saved[depth] = k
                saved[depth + 1] = floor[k]
                depth += 2
                floor[k] = top
                raised += 1
        saved[depth] = raised
        self.depth = depth + 1
        floor[b] = BIG
        s = self.size[b]
        for c in range(self.first[b], self.last[b]):
            self.load[c] -= s
        # Only sections where a block was placed or raised can break the bound.
        c_lo, c_hi = max(self.reach_lo[b], s_lo), min(self.reach_hi[b], s_hi)
        members, starts, load = self.members, self.starts, self.load
        for c in range(c_lo, c_hi):
            lowest = BIG
            for j in range(starts[c], starts[c + 1]):
                if floor[members[j]] < lowest:
                    lowest = floor[members[j]]
            if (lowest + load[c]) & LOW > self.capacity:
                return 0
        return 1

    def unplace(self, b: int, o: int) -> None:
        """Undo the last :meth:`place` (of block ``b`` at ``o``)."""
        floor, saved = self.floor, self.saved
        depth = self.depth - 1
        count = saved[depth]
        while count > 0:
            count -= 1
            depth -= 2
            floor[saved[depth]] = saved[depth + 1]
        self.depth = depth
        s = self.size[b]
        for c in range(self.first[b], self.last[b]):
            self.load[c] += s
        floor[b] = o


    def cut(self, b: int) -> list[int]:
        """Block ``b`` is placed: the sections ``c`` it no longer ties to ``c + 1``, if last.

        Each ``c`` in its span (but its last section) that no other unplaced
        block spans to ``c + 1`` either; :meth:`uncut` undoes it.
        """
        cuts = self.cuts
        zero = []
        for c in range(self.first[b], self.last[b] - 1):
            cuts[c] -= 1
            if cuts[c] == 0:
                zero.append(c)
        return zero

    def uncut(self, b: int) -> None:
        """Undo :meth:`cut` (of block ``b``)."""
        cuts = self.cuts
        for c in range(self.first[b], self.last[b] - 1):
            cuts[c] += 1


    def pieces(self, part: np.ndarray,
               bounds: list[int]) -> list[tuple[int, int, np.ndarray]]:
        """The unplaced blocks of ``part`` live in sections ``[a, z)``, for each ``a, z``.

        ``(a, z, blocks)`` for consecutive ``a, z`` in ``bounds`` (increasing),
        where some unplaced block of ``part`` lives (in the order of ``part``).
        """
        floor, first, last = self.floor, self.first, self.last
        m, count = len(part), len(bounds) - 1
        edges_array = np.array(bounds, dtype=np.int64)
        edges = edges_array
        # Piece p's blocks will be flat[starts[p]:starts[p + 1]] (first counted at p + 1).
        starts_array = np.zeros(count + 1, dtype=np.int64)
        starts = starts_array
        # Block j of part is in pieces spans[2j] to spans[2j + 1] - 1 (none if placed).
        spans_array = np.zeros(2 * m, dtype=np.int64)
        spans = spans_array
        for j in range(m):
            i = part[j]
            p = q = 0
            if floor[i] < BIG:
                # The pieces that end after it starts and start before it ends.
                lo, hi = 0, count
                while lo < hi:
                    mid = (lo + hi) // 2
                    if edges[mid + 1] <= first[i]:
                        lo = mid + 1
                    else:
                        hi = mid
                p = q = lo
                while q < count and edges[q] < last[i]:
                    starts[q + 1] += 1
                    q += 1
            spans[2 * j] = p
            spans[2 * j + 1] = q
        for p in range(count):
            starts[p + 1] += starts[p]
        flat_array = np.zeros(starts[count], dtype=np.int64)
        flat = flat_array
        filled_array = starts_array.copy()
        filled = filled_array
        for j in range(m):
            for p in range(spans[2 * j], spans[2 * j + 1]):
                flat[filled[p]] = part[j]
                filled[p] += 1
        found = []
        for p in range(count):
            if starts[p + 1] > starts[p]:
                found.append((bounds[p], bounds[p + 1], flat_array[starts[p]:starts[p + 1]]))
        return found

    def rerank(self, piece: np.ndarray) -> None:
        """Rank ``piece`` by the rule again, with T the load still unplaced (MiniMalloc).

        Once a piece is independent, the loads its blocks live through are
        what is left of it, and the order by those finds packings far sooner
        (MiniMalloc's I: within 2 000 nodes, none in 600 000 with the first
        order).  Each key largest first, then the lowest block; ``rank`` of
        the piece's blocks becomes 0, 1, ... in that order.
        """
        m, width, n = len(piece), self.n_keys, self.n
        rule_ranks, is_peak = self.rule_ranks, self.is_peak
        peaks = self.peak_loads(piece)
        key_array = np.empty(m * width, dtype=np.int64)
        keys = key_array
        for j in range(m):
            for l in range(width):
                keys[j * width + l] = -(peaks[j] if is_peak[l] else rule_ranks[l * n + piece[j]])
        # A merge sort, bottom up, of the positions in piece by (keys, block).
        order_array = np.arange(m, dtype=np.int64)
        order = order_array
        spare_array = np.empty(m, dtype=np.int64)
        spare = spare_array
        run = 1
        while run < m:
            lo = 0
            while lo < m:
                mid, hi = min(lo + run, m), min(lo + 2 * run, m)
                a, b, out = lo, mid, lo
                while a < mid and b < hi:
                    x, y = order[b], order[a]
                    for l in range(width):
                        if keys[x * width + l] != keys[y * width + l]:
                            later_first = keys[x * width + l] < keys[y * width + l]
                            break
                    else:
                        later_first = piece[x] < piece[y]
                    if later_first:
                        spare[out] = x
                        b += 1
                    else:
                        spare[out] = y
                        a += 1
                    out += 1
                while a < mid:
                    spare[out] = order[a]
                    a += 1
                    out += 1
                while b < hi:
                    spare[out] = order[b]
                    b += 1
                    out += 1
                lo = hi
            merged = spare
            spare = order
            order = merged
            run *= 2
        rank = self.rank
        for j in range(m):
            rank[piece[order[j]]] = j

    def peak_loads(self, piece: np.ndarray) -> np.ndarray:
        """The largest load (of the unplaced blocks) each block of ``piece`` lives through."""
        m = len(piece)
        out = np.zeros(m, dtype=np.int64)
        peaks = out
        load, first, last = self.load, self.first, self.last
        for j in range(m):
            i = piece[j]
            if last[i] > first[i]:
                peak = load[first[i]]
                for c in range(first[i] + 1, last[i]):
                    if load[c] > peak:
                        peak = load[c]
                peaks[j] = peak
        return out
