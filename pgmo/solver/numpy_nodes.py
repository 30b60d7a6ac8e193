"""The canonical search's work per node as NumPy calls: the fastest way in plain Python.

:class:`NumpyNodes` does what :class:`.search_nodes.Nodes` does (the same
nodes, the same packings), a dozen NumPy calls per node instead of loops:
the search uses it where pgmo was built without a C compiler, or with
``PGMO_PURE_PYTHON=1`` (see :func:`.search_nodes.default_kind`).  This
module is never compiled.

Tested in ``tests/test_canonical_search.py``.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

__all__ = ["NumpyNodes"]

#: A placed block's floor (as :mod:`.canonical_search`'s).
_BIG = np.int64(1 << 62)
#: ``need & _LOW`` maps a section with no unplaced block to 0 (see :mod:`.canonical_search`).
_LOW = np.int64((1 << 62) - 1)
_MIN = np.minimum.reduce  # the ufunc itself: ndarray.min() goes through two wrappers
_MAX = np.maximum.reduce
_MIN_AT = np.minimum.reduceat
_MAX_AT = np.maximum.reduceat


class NumpyNodes:
    """The same work as :class:`Nodes`, as NumPy calls (the fastest way in plain Python)."""

    def __init__(self, search: Any):  # a CanonicalSearch (which imports this module)
        self.search = search
        self.n, self.capacity, self.any_pinned = search.n, search.capacity, search.any_pinned
        self.floor, self.rank, self.load, self.size = (search.floor, search.rank, search.load,
                                                       search.size)
        self.pinned = search.pinned
        self.saved: list[Any] = []

    def choices(self, part: np.ndarray, s_lo: int, s_hi: int, last_offset: int,
                last_block: int) -> list[tuple[int, int]] | None:
        """As :meth:`.search_nodes.Nodes.choices`."""
        floor, rank, n = self.floor, self.rank, self.n
        part_floor = floor[part]
        # Placed blocks have floor _BIG, so their tops are above every unplaced one's.
        lowest_top = _MIN(part_floor + self.size[part])
        if lowest_top >= _BIG:
            return None
        # The key floor * n + rank orders by floor, then rank (ranks are 0..n-1),
        # so "later than the last block placed" is one comparison.
        low = part_floor < lowest_top
        low_blocks = part[low]
        low_floor = part_floor[low]
        key = low_floor * n + rank[low_blocks]
        last_key = last_offset * n + (int(rank[last_block]) if last_block >= 0 else n - 1)
        ok = key > last_key
        if self.any_pinned:
            pinned_floor = part_floor[self.pinned[part] & (part_floor < _BIG)]
            if pinned_floor.size:
                if int(pinned_floor.min()) < last_offset:
                    return []  # a pinned block was passed: it can never be placed
                ok &= low_floor <= pinned_floor.min()
        ok &= low_floor <= self.capacity - int(_MAX(self.load[s_lo:s_hi]))
        choices, keys = low_blocks[ok], key[ok]
        if choices.size > 1:
            by_key = keys.argsort()
            choices, keys = choices[by_key], keys[by_key]
        return list(zip(keys.tolist(), choices.tolist()))

    def place(self, b: int, o: int, s_lo: int, s_hi: int) -> int:
        """As :meth:`.search_nodes.Nodes.place`."""
        search, floor, load = self.search, self.floor, self.load
        s = search.sizes[b]
        top = o + s
        near = search.neighbours[b]
        raised = near[floor[near] < top]  # placed neighbours have floor _BIG
        if self.any_pinned and self.pinned[raised].any():
            return -1
        floor[b] = _BIG
        load[search.first[b]:search.last[b]] -= s
        self.saved.append((raised, floor[raised]))
        floor[raised] = top
        r_lo, r_hi = search.reach[b]  # the raised blocks live in these sections only
        # There, o + load <= capacity (see choices), so the lowest floor of a
        # block live there alone decides.  A section with no unplaced block
        # has floor BIG and load 0 (need & _LOW is 0 there).
        if r_lo >= s_lo and r_hi <= s_hi:
            c_lo, c_hi = r_lo, r_hi
            first_cell, cells = search.reach_cells[b]
        else:
            c_lo, c_hi = max(r_lo, s_lo), min(r_hi, s_hi)
            first_cell = search.starts_list[c_lo] if c_lo < c_hi else 0
            cells = search.starts[c_lo:c_hi] - first_cell
        if c_lo >= c_hi:
            return 1
        need = _MIN_AT(floor[search.members[first_cell:search.starts_list[c_hi]]], cells)
        need += load[c_lo:c_hi]
        need &= _LOW
        return 1 if _MAX(need) <= self.capacity else 0

    def pieces(self, part: np.ndarray,
               bounds: list[int]) -> Iterator[tuple[int, int, np.ndarray]]:
        """As :meth:`.search_nodes.Nodes.pieces` (each piece when the search reaches it)."""
        rest = part[self.floor[part] < _BIG]
        rest_first, rest_last = self.search.first_arr[rest], self.search.last_arr[rest]
        for a, z in zip(bounds[:-1], bounds[1:]):
            piece = rest[(rest_first < z) & (rest_last > a)]
            if piece.size:
                yield a, z, piece

    def rerank(self, piece: np.ndarray) -> None:
        """As :meth:`.search_nodes.Nodes.rerank`."""
        t, ranks = self.peak_loads(piece), self.search.key_ranks
        by_rule = np.lexsort([piece] + [-(t if c == "T" else ranks[c][piece])
                                        for c in reversed(self.search.rule)])
        self.rank[piece[by_rule]] = np.arange(piece.size, dtype=np.int64)

    def peak_loads(self, piece: np.ndarray) -> np.ndarray:
        """As :meth:`.search_nodes.Nodes.peak_loads`."""
        spans = self.search.first_arr[piece], self.search.last_arr[piece]
        # Maxima over [first, last), the ranges between them dropped.
        bounds = np.empty(2 * piece.size, dtype=np.int64)
        bounds[0::2], bounds[1::2] = spans
        peaks = _MAX_AT(np.append(self.load, 0), bounds)[0::2]
        peaks[spans[1] <= spans[0]] = 0
        return peaks

    def cut(self, b: int) -> list[int]:
        """As :meth:`.search_nodes.Nodes.cut`."""
        f, l = self.search.first[b], self.search.last[b]
        cuts = self.search.cuts[f:l - 1]
        cuts -= 1
        return (np.flatnonzero(cuts == 0) + f).tolist()

    def uncut(self, b: int) -> None:
        """As :meth:`.search_nodes.Nodes.uncut`."""
        f, l = self.search.first[b], self.search.last[b]
        self.search.cuts[f:l - 1] += 1

    def unplace(self, b: int, o: int) -> None:
        """As :meth:`.search_nodes.Nodes.unplace`."""
        raised, old_floor = self.saved.pop()
        floor = self.floor
        floor[raised] = old_floor
        s = self.search.sizes[b]
        self.load[self.search.first[b]:self.search.last[b]] += s
        floor[b] = o
