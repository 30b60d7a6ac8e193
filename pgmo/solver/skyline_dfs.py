"""Backtracking skyline search: is there a packing under a given capacity?

The paper's best-fit makes one choice per step (the longest block that fits
the lowest line, else lift the line).  Here every step is a branch point:
any block fitting the lowest line, in priority order, then lifting.  Depth
first, the first leaf reached is exactly the paper's greedy packing; when a
step cannot be completed under ``capacity`` the search backs up and tries
the next choice.

Pruning (why it can work at capacity = lower bound): every unplaced block
will sit on or above the skyline over its lifetime, so at each time section
``skyline + unplaced load <= capacity`` must hold.  Placing a block leaves
that sum unchanged over its span; only a lift (wasted space) raises it, so
a lift is allowed only while the sum stays within capacity.  Identical
blocks are tried once per branch point.

Time is kept as compressed sections (between consecutive distinct ticks);
the skyline and the unplaced load are per-section numpy arrays, so a step
costs a few vector operations over the horizon.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from typing import Sequence

import numpy as np

from ..trace import packing_peak
from .budget import WALL_CLOCK, Budget, Clock

__all__ = ["skyline_dfs", "probe", "capacity_search"]

#: Step budget of one randomised try (at least 4 steps per block): small, so a
#: bad early choice costs little before the next restart.
STEPS_PER_TRY = 1000


def skyline_dfs(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
                capacity: int, priority: Sequence[int], deadline: float | None = None,
                max_steps: int | None = None, leftmost_first: bool = True,
                spent: list[int] | None = None, clock: Clock = WALL_CLOCK) -> list[int] | None:
    """Offsets with peak <= ``capacity``, or None if none was found by ``deadline`` (on ``clock``).

    ``spent`` (a one-element list), if given, gets the steps taken added.

    ``priority`` lists block indices, preferred first (tried first at a branch).
    With ``leftmost_first`` the blocks starting at the line's left end are
    tried before the others: a block starting further right leaves a sliver
    of the line at the old height, which often ends up wasted.
    None does not prove infeasibility unless the deadline was not reached;
    callers treat it as "not found".
    """
    n = len(sizes)
    if n == 0:
        return []
    times = sorted(set(lowers) | set(uppers))
    index = {t: k for k, t in enumerate(times)}
    sections = len(times) - 1
    first = [index[x] for x in lowers]
    last = [index[x] for x in uppers]  # exclusive section bound
    # numpy keeps each step's scans (lowest line, load bound) cheap on long horizons.
    delta = np.zeros(sections + 1, dtype=np.int64)
    np.add.at(delta, first, sizes)
    np.subtract.at(delta, last, sizes)
    load = np.cumsum(delta[:-1])  # unplaced bytes live in each section
    if int(load.max()) > capacity:
        return None
    rank = [0] * n
    for r, i in enumerate(priority):
        rank[i] = r
    by_first = sorted(range(n), key=lambda i: (first[i], rank[i]))
    first_sorted = [first[i] for i in by_first]
    height = np.zeros(sections, dtype=np.int64)
    placed = [False] * n
    offsets = [0] * n
    remaining = n

    def options():
        """Choices at the lowest line: fitting blocks, then the lift (-1)."""
        ls = int(height.argmin())
        h = int(height[ls])
        higher = np.flatnonzero(height[ls:] != h)
        le = ls + int(higher[0]) if higher.size else sections
        found = [i for i in by_first[bisect_left(first_sorted, ls):bisect_left(first_sorted, le)]
                 if not placed[i] and last[i] <= le]
        if leftmost_first:
            found.sort(key=lambda i: (first[i] != ls, rank[i]))
        else:
            found.sort(key=rank.__getitem__)
        seen = set()
        choices = []
        for i in found:
            key = (first[i], last[i], sizes[i])
            if key not in seen:
                seen.add(key)
                choices.append(i)
        lift_to = capacity + 1
        if ls > 0 and height[ls - 1] < lift_to:
            lift_to = int(height[ls - 1])
        if le < sections and height[le] < lift_to:
            lift_to = int(height[le])
        if lift_to <= capacity and int(load[ls:le].max()) + lift_to <= capacity:
            choices.append(-1)
        return [choices, 0, h, ls, le, lift_to, -2]

    if deadline is None:
        deadline = float("inf")
    # Each frame: [choices, next choice index, h, ls, le, lift_to, applied choice]
    stack = [options()]
    steps = 0
    try:
        while stack:
            frame = stack[-1]
            choices, nxt, h, ls, le, lift_to, applied = frame
            # Undo the choice this frame applied last time.
            if applied == -1:
                height[ls:le] = h
            elif applied >= 0:
                placed[applied] = False
                remaining += 1
                height[first[applied]:last[applied]] = h
                load[first[applied]:last[applied]] += sizes[applied]
            frame[6] = -2
            if nxt >= len(choices):
                stack.pop()
                continue
            steps += 1
            if steps & 15 == 0 and clock() > deadline:
                return None
            if max_steps is not None and steps > max_steps:
                return None
            choice = choices[nxt]
            frame[1] = nxt + 1
            if choice >= 0 and h + sizes[choice] > capacity:
                continue  # cannot happen while the load bound holds; kept for safety
            frame[6] = choice
            if choice == -1:
                height[ls:le] = lift_to
            else:
                placed[choice] = True
                remaining -= 1
                offsets[choice] = h
                height[first[choice]:last[choice]] = h + sizes[choice]
                load[first[choice]:last[choice]] -= sizes[choice]
                if remaining == 0:
                    return offsets
            stack.append(options())
        return None
    finally:
        if spent is not None:
            spent[0] += steps


#: Seconds per block of one try's set-up (sorting, arrays), before one is timed.
SETUP_SECONDS_PER_BLOCK = 1e-5


def probe(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int], capacity: int,
          budget: Budget, rng: random.Random, noise: float = 0.5) -> list[int] | None:
    """Randomised restarts of :func:`skyline_dfs` at ``capacity`` until ``budget`` runs out.

    Deep chronological backtracking rarely repairs an early mistake, so each
    try gets a small step budget and the next one perturbs the priority
    (lifetime times a random factor in [1, 1 + noise]); the first two tries
    use the paper's exact priority.  Tries alternate between branching on
    leftmost blocks first and on priority alone: each wins on some instances.
    A try's set-up cannot stop halfway (a fraction of a second on 20 000
    blocks), so a try starts only when the last one's time still fits.
    """
    n = len(sizes)
    max_steps = max(STEPS_PER_TRY, 4 * n)
    tries = 0
    try_seconds = SETUP_SECONDS_PER_BLOCK * n
    while not budget.expired() and budget.fits(try_seconds):
        started = budget.clock()
        factor = (lambda i: 1.0) if tries < 2 else (lambda i: 1.0 + noise * rng.random())
        priority = sorted(range(n), key=lambda i: ((lowers[i] - uppers[i]) * factor(i), -sizes[i], i))
        tries += 1
        spent = [0]
        offsets = skyline_dfs(lowers, uppers, sizes, capacity, priority, budget.deadline,
                              budget.limit(max_steps), leftmost_first=tries % 2 == 1,
                              spent=spent, clock=budget.clock)
        budget.spend(max(1, spent[0]))
        try_seconds = budget.clock() - started
        if offsets is not None:
            return offsets
    return None


def capacity_search(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
                    lower_bound: int, known_peak: int, budget: Budget,
                    seed: int = 0) -> tuple[list[int] | None, int, list[tuple[int, bool]]]:
    """Look for packings below ``known_peak``, tightest capacities first.

    Probes the lower bound first, with half the budget (many real and
    benchmark instances are solvable there, and the later phases improve on
    a higher packing better than these probes do), then climbs in eighths of the gap to ``known_peak`` until a probe
    succeeds, then bisects between the last failed capacity and the peak
    found.  Each later probe gets an eighth of what is left.  A failed probe
    proves nothing; it only steers the next one.  Steps are counted in
    ``budget``.  Returns (best offsets found or None, their peak or
    ``known_peak``, the probes as (capacity, found)).
    """
    rng = random.Random(seed)
    gap = known_peak - lower_bound
    best, best_peak = None, known_peak
    probes: list[tuple[int, bool]] = []
    failed_below = lower_bound - 1  # highest capacity that failed
    capacity, share = lower_bound, 1 / 2
    while failed_below < best_peak - 1 and not budget.expired():
        part = budget.share(share)
        offsets = probe(lowers, uppers, sizes, capacity, part, rng)
        budget.spend(part.used)
        probes.append((capacity, offsets is not None))
        if offsets is not None:
            best = offsets
            best_peak = packing_peak(offsets, sizes)
        else:
            failed_below = capacity
        share = 1 / 8
        if best is None:  # still climbing
            capacity = lower_bound + gap * len(probes) // 8
            if capacity >= known_peak:
                break
        else:
            capacity = (failed_below + best_peak) // 2
    return best, best_peak, probes
