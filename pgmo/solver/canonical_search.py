"""Depth-first search over canonical packings: is there one under a capacity?

The idea is MiniMalloc's (Moffitt, ASPLOS 2023); this is our own code.  Any
packing can be pushed down until every block rests on a block below it (or
on 0) without raising the peak.  Placing the blocks of such a packing in
order of offset, each lands on the lowest offset free of the blocks placed
before it (its *floor*).  So the search only has to choose, at every step,
which block comes next; the offset follows.  Pruning:

- monotonic: offsets never decrease along a branch (ties in a fixed block
  order), so every branch is one canonical packing;
- dominance: a block that would leave room below it for another unplaced
  block entirely is not tried (that block should go first);
- section bound: in every *section* (a maximal set of blocks live at one
  time) the unplaced blocks must fit between their lowest floor (at least the
  current offset) and the capacity; this catches wasted space at once;
- a block with no unplaced neighbour is placed without trying alternatives;
- symmetry: two blocks live in exactly the same sections can swap places
  when one rests directly on the other, so only the order with the earlier
  block (in the search order) below is searched;
- when no unplaced block spans a boundary between sections, the two sides are
  independent and are searched one after the other, each in the block order
  computed again from the load still unplaced there (as MiniMalloc does):
  with the first order kept, MiniMalloc's E and I were not packed at their
  lower bound in 600 000 nodes; re-ordered, in 73 523 and 4 750 (TWA).

Blocks can be *pinned* at given offsets (as MiniMalloc's fixed offsets): the
search places one when it reaches its offset and prunes any placement that
would push it up.  The large neighbourhood search (:mod:`.neighbourhood`)
re-packs part of a packing that way, with the rest pinned.

The section bound looks at the blocks live in each section the child can
change (:mod:`.search_nodes` does each node's and each child's work, in C
where pgmo is compiled), so the search is meant for up to a few thousand
blocks (:data:`MAX_CELLS`).  The search
is deterministic: the block order is fixed by a named rule (and a seed for
tie-breaks), and it stops after a node limit, so equal limits give equal
answers on every machine.  Every child
tried counts as a node, also those the bounds prune at once: that keeps a
node limit close to a fixed amount of work.
"""

from __future__ import annotations

import copy
import random
import sys
from contextlib import contextmanager
from typing import Generator, Mapping, Sequence

import numpy as np

from .budget import WALL_CLOCK, Clock
from .numpy_nodes import NumpyNodes
from .search_nodes import Nodes, default_kind

__all__ = ["CanonicalSearch", "FOUND", "INFEASIBLE", "STOPPED", "ORDER_RULES", "MAX_CELLS",
           "MAX_BLOCKS", "sections_of", "searchable"]

FOUND, INFEASIBLE, STOPPED = "found", "infeasible", "stopped"
#: Block orders (ties at equal floors go to the earlier block): each letter a
#: key, largest first.  W: lifetime, A: area, T: the largest load the block
#: lives through, Z: size.  TWA first: at the lower bound it packs 7 of
#: MiniMalloc's 9 instances whose optimum is there within 75 000 nodes
#: (TAW 3, WAT 2).
ORDER_RULES = ("TWA", "TAW", "WAT")
#: Largest blocks x sections the search takes (it keeps the blocks live in each section).
MAX_CELLS = 4_000_000
#: Most blocks the search takes: a paused search is a chain of generators, one
#: or two per placed block, and resuming it recurses in C through all of them
#: (CPython 3.11 crashes near 40 000).
MAX_BLOCKS = 4000
_BIG = np.int64(1 << 62)
#: A search's state while it runs: a generator that yields when it pauses
#: and returns its status.
Walk = Generator[None, None, str]


def sections_of(lowers: Sequence[int], uppers: Sequence[int]) -> tuple[list[int], list[int], int]:
    """Each block's range ``[first, last)`` of sections, and the number of sections.

    A section is the set of blocks live just before a free that follows an
    alloc (frees first at equal ticks: half-open lifetimes).  Every set of
    blocks live at one time is inside one section, so checking sections
    checks every time.
    """
    n = len(lowers)
    events = sorted([(uppers[i], 0, i) for i in range(n)] + [(lowers[i], 1, i) for i in range(n)])
    first, last = [0] * n, [0] * n
    count, opened = 0, False
    for _, kind, i in events:
        if kind:
            first[i] = count
            opened = True
        else:
            if opened:
                count += 1
                opened = False
            last[i] = count
    return first, last, count


def _dense_ranks(values: list[int]) -> np.ndarray:
    """Each value's rank among the distinct values (equal values, equal ranks)."""
    index = {v: r for r, v in enumerate(sorted(set(values)))}
    return np.array([index[v] for v in values], dtype=np.int64)


def searchable(n_blocks: int, n_sections: int) -> bool:
    """Whether the search takes a trace of this size (:data:`MAX_BLOCKS`, :data:`MAX_CELLS`)."""
    return n_blocks <= MAX_BLOCKS and n_blocks * n_sections <= MAX_CELLS


@contextmanager
def _recursion_depth(depth: int):
    old = sys.getrecursionlimit()
    if depth > old:
        sys.setrecursionlimit(depth)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


class CanonicalSearch:
    """The search for one trace and one block order; :meth:`run` probes a capacity."""

    def __init__(self, lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
                 rule: str = "WAT", seed: int | None = None, reorder: bool = True):
        n = len(sizes)
        first, last, n_sections = sections_of(lowers, uppers)
        load = np.zeros(n_sections + 1, dtype=np.int64)
        np.add.at(load, first, sizes)
        np.subtract.at(load, last, sizes)
        load = np.cumsum(load)[:-1]
        peak_load = [int(load[first[i]:last[i]].max()) if last[i] > first[i] else 0
                     for i in range(n)]
        keys = {"W": [u - lo for lo, u in zip(lowers, uppers)], "Z": list(sizes),
                "T": peak_load}
        keys["A"] = [w * s for w, s in zip(keys["W"], sizes)]
        rng = random.Random(seed) if seed is not None else None
        tie = [rng.random() for _ in range(n)] if rng else [0.0] * n
        order = sorted(range(n), key=lambda i: tuple(-keys[c][i] for c in rule) + (tie[i], i))
        self.order = order  # search index k is block order[k]
        self.rule, self.reorder = rule, reorder
        self.width = [keys["W"][i] for i in order]
        # The fixed keys as ranks in search order (int64 whatever the values), for re-ranking.
        self.key_ranks = {c: _dense_ranks([keys[c][i] for i in order]) for c in "WAZ"}
        self.n, self.n_sections = n, n_sections
        self.size = np.array([sizes[i] for i in order], dtype=np.int64)
        self.sizes = self.size.tolist()
        self.first = [first[i] for i in order]
        self.last = [last[i] for i in order]
        self.first_arr = np.array(self.first, dtype=np.int64)
        self.last_arr = np.array(self.last, dtype=np.int64)
        lo = np.array([lowers[i] for i in order], dtype=np.int64)
        up = np.array([uppers[i] for i in order], dtype=np.int64)
        self.neighbours = []
        self.reach = []  # sections that placing block k can change: its neighbours' spans
        for k in range(n):
            near = np.flatnonzero((lo < up[k]) & (up > lo[k]))
            self.reach.append((int(self.first_arr[near].min()), int(self.last_arr[near].max())))
            self.neighbours.append(near[near != k])
        # The same as int bitsets (bit k: block k), for tests on the unplaced ones.
        self.near_bits = []
        row = np.zeros(n, dtype=bool)
        for near in self.neighbours:
            row[near] = True
            self.near_bits.append(int.from_bytes(np.packbits(row, bitorder="little").tobytes(),
                                                 "little"))
            row[near] = False
        self.load0 = load
        cuts = np.zeros(max(n_sections - 1, 0), dtype=np.int64)
        for k in range(n):
            if self.last[k] - 1 > self.first[k]:
                cuts[self.first[k]:self.last[k] - 1] += 1
        self.cuts0 = cuts
        by_span: dict[tuple[int, int], list[int]] = {}
        for k in range(n):
            by_span.setdefault((self.first[k], self.last[k]), []).append(k)
        # Blocks live in exactly the same sections (twins) share a group; -1: no twin.
        self.group = [-1] * n
        for g, members in enumerate(by_span.values()):
            if len(members) > 1:
                for k in members:
                    self.group[k] = g
        # The blocks live in each section, section after section (search indices):
        # section c's are members[starts[c]:starts[c + 1]].
        spans = np.maximum(self.last_arr - self.first_arr, 0)
        blocks = np.repeat(np.arange(n, dtype=np.int64), spans)
        sections = (np.arange(int(spans.sum()), dtype=np.int64)
                    - np.repeat(np.cumsum(spans) - spans, spans) + np.repeat(self.first_arr, spans))
        self.members = blocks[np.argsort(sections, kind="stable")]
        starts = np.zeros(n_sections + 1, dtype=np.int64)
        np.cumsum(np.bincount(sections, minlength=n_sections), out=starts[1:])
        self.starts = starts
        self.starts_list = starts.tolist()
        # Where block k's reach starts in members, and each of its sections' start there.
        self.reach_cells = [(self.starts_list[lo], starts[lo:hi] - starts[lo])
                            for lo, hi in self.reach]
        self.nodes = 0
        #: How the nodes' work is done (:func:`.search_nodes.default_kind`); equal answers.
        self.kernel_kind: type[Nodes] | type[NumpyNodes] = default_kind()
        self.kernel: Nodes | NumpyNodes  # made by start(), on that search's arrays
        self._walk: Walk | None = None  # the search under way, paused
        self.result: tuple[str, list[int] | None] | None = None  # its end, once known

    def fork(self) -> "CanonicalSearch":
        """A second search over the same trace and order (sharing what never changes)."""
        twin = copy.copy(self)
        twin._walk = None
        twin.result = None
        return twin

    # ------------------------------------------------------------------ run
    def run(self, capacity: int, node_limit: int, deadline: float | None = None,
            pinned: Mapping[int, int] | None = None,
            clock: Clock = WALL_CLOCK) -> tuple[str, list[int] | None]:
        """(FOUND, offsets in block order) | (INFEASIBLE, None) | (STOPPED, None).

        ``pinned`` maps blocks (trace indices) to offsets they must keep: the
        search places them when it reaches their offset and prunes any
        placement that would push one up (MiniMalloc's fixed offsets).
        INFEASIBLE is a proof: no packing has a peak <= ``capacity``.
        STOPPED: the node limit or the deadline (on ``clock``) came first;
        :meth:`advance` goes on from there.  ``self.nodes`` tells how many
        nodes were visited.
        """
        self.start(capacity, pinned)
        return self.advance(node_limit, deadline, clock)

    def start(self, capacity: int, pinned: Mapping[int, int] | None = None) -> None:
        """Set up a search under ``capacity``; :meth:`advance` runs it."""
        n = self.n
        if self._walk is not None:
            self._walk.close()  # before the state it would restore is replaced
        self._walk = None
        self.result = None
        self.capacity = capacity
        self.nodes = 0
        # A placed block's floor is _BIG (so "unplaced" is "floor < _BIG"), and
        # self.unplaced has its bit set while it is not placed.
        self.floor = np.zeros(n, dtype=np.int64)
        self.unplaced = (1 << n) - 1
        self.load = self.load0.copy()
        self.cuts = self.cuts0.copy()
        self.offset = [0] * n
        self.solution = [0] * n
        # Placed twins by (group, top): the blocks of a group whose top is there.  (Twins
        # live at the same time, so at most one is there in a valid packing.)
        self.tops: dict[tuple[int, int], list[int]] = {}
        self.pinned = np.zeros(n, dtype=bool)
        self.rank = np.arange(n, dtype=np.int64)  # tie-break among equal floors
        self.any_pinned = bool(pinned)
        if pinned:
            rank = {i: k for k, i in enumerate(self.order)}
            for i, o in pinned.items():
                k = rank[i]
                self.pinned[k] = True
                self.floor[k] = o
                if o + self.sizes[k] > capacity:
                    self.result = (INFEASIBLE, None)
                    return
        if n == 0:
            self.result = (FOUND, [])
        elif int(self.load.max()) > capacity or int(self.size.max()) > capacity:
            self.result = (INFEASIBLE, None)
        else:
            self.kernel = self.kernel_kind(self)
            self._walk = self._search_pieces(np.arange(n), 0, self.n_sections,
                                             np.flatnonzero(self.cuts == 0).tolist())

    def advance(self, nodes: int, deadline: float | None = None,
                clock: Clock = WALL_CLOCK) -> tuple[str, list[int] | None]:
        """Search on for at most ``nodes`` more nodes, until ``deadline`` on ``clock``.

        The search pauses where it stopped (STOPPED) and goes on from there
        at the next call, so a search given its nodes in slices visits the
        same nodes as one given them at once.
        """
        if self.result is not None:
            return self.result
        self.pause_at = self.nodes + nodes
        self.deadline = float("inf") if deadline is None else deadline
        self.clock = clock
        walk = self._walk
        assert walk is not None  # no result yet: the search is under way
        try:
            with _recursion_depth(3 * self.n + 1000):
                next(walk)
            return STOPPED, None
        except StopIteration as done:
            status = done.value
        self._walk = None
        if status != FOUND:
            self.result = (status, None)
            return self.result
        offsets = [0] * self.n
        for k, i in enumerate(self.order):
            offsets[i] = self.solution[k]
        self.result = (FOUND, offsets)
        return self.result

    def _pause(self) -> Walk:
        """Yield (pause) while the node limit is reached or the deadline has passed."""
        while self.nodes >= self.pause_at or self.clock() > self.deadline:
            yield
        return ""

    def _search(self, part: np.ndarray, s_lo: int, s_hi: int, last_offset: int,
                last_block: int) -> Walk:
        """Place the unplaced blocks of ``part`` (sections [s_lo, s_hi)) canonically."""
        # The hot loop: locals instead of attributes; the work per node and per
        # child is the kernel's (:mod:`.search_nodes`).
        if self.nodes >= self.pause_at or self.clock() > self.deadline:
            yield from self._pause()
        self.nodes += 1
        kernel, n = self.kernel, self.n
        # Canonical order and dominance (see the module docstring): only blocks
        # below the lowest top (placed ones are not), later than the last block
        # placed, in the order of their keys floor * n + rank.
        choices = kernel.choices(part, s_lo, s_hi, last_offset, last_block)
        if choices is None:  # every block of the part is placed
            solution, offset = self.solution, self.offset
            for k in part.tolist():
                solution[k] = offset[k]
            return FOUND
        clock = self.clock
        sizes, near_bits = self.sizes, self.near_bits
        offset, group, tops = self.offset, self.group, self.tops
        unplaced = self.unplaced
        for k, b in choices:
            o = k // n  # the floor
            # The child is built and checked: it counts, pruned or not.
            if self.nodes >= self.pause_at or clock() > self.deadline:
                yield from self._pause()
            self.nodes += 1
            g = group[b]
            if g >= 0:
                below = tops.get((g, o))
                if below and max(below) > b:
                    continue  # the same packing with the two swapped is searched instead
            offset[b] = o
            fits = kernel.place(b, o, s_lo, s_hi)
            if fits < 0:
                continue  # it would push a pinned block up
            status = INFEASIBLE
            if fits:
                top = o + sizes[b]
                self.unplaced = unplaced ^ (1 << b)
                if g >= 0:
                    tops.setdefault((g, top), []).append(b)
                status = yield from self._after_placing(part, s_lo, s_hi, b, o)
                if g >= 0:
                    resting = tops[(g, top)]
                    resting.pop()
                    if not resting:
                        del tops[(g, top)]
                self.unplaced = unplaced
            kernel.unplace(b, o)
            if status != INFEASIBLE:
                return status
            if not near_bits[b] & unplaced:
                break  # nothing above it: any other choice here fails the same way
        return INFEASIBLE

    def _after_placing(self, part, s_lo, s_hi, b, o) -> Walk:
        """Recurse, splitting into independent parts when ``b`` was the last link."""
        if self.last[b] - 1 <= self.first[b]:
            return (yield from self._search(part, s_lo, s_hi, o, b))
        kernel = self.kernel
        zero = kernel.cut(b)
        try:
            if not zero:
                return (yield from self._search(part, s_lo, s_hi, o, b))
            return (yield from self._search_pieces(part, s_lo, s_hi, zero))
        finally:
            kernel.uncut(b)

    def _search_pieces(self, part, s_lo, s_hi, cuts_at) -> Walk:
        """Search the unplaced blocks of ``part`` in independent pieces, one after another.

        ``cuts_at`` lists sections ``c`` such that no unplaced block lives in
        both ``c`` and ``c + 1``.  (MiniMalloc splits the whole trace so at
        the start too: without it, a failure on one side backtracks through
        every choice made on the other.)
        """
        bounds = [s_lo] + [c + 1 for c in cuts_at if s_lo <= c < s_hi - 1] + [s_hi]
        for a, z, piece in self.kernel.pieces(part, bounds):
            if self.reorder:
                old_rank = self.rank[piece]
                self.kernel.rerank(piece)  # the order by the load left (MiniMalloc)
            status = yield from self._search(piece, a, z, -1, -1)
            if self.reorder:
                self.rank[piece] = old_rank
            if status != FOUND:
                return status
        for k in part[self.floor[part] >= _BIG].tolist():  # placed before the split
            self.solution[k] = self.offset[k]
        return FOUND
