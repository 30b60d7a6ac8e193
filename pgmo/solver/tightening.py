"""Anytime peak minimisation with the canonical search: probe capacities, restart often.

One long depth-first search gets stuck below an early bad choice, so (as
MiniMalloc does) the search restarts with a node limit that doubles every
round and rotates between block orders (:data:`.canonical_search.ORDER_RULES`).
Each round probes, for every order:

1. the proven lower bound (the max load at first): success there is optimal;
2. three capacities drawn (seeded) from the upper half of the gap between the
   bounds, with fewer nodes.  Whether a probe succeeds jumps erratically with
   the capacity (on MiniMalloc's D: found at +4.6 % and +5.5 % over the
   lower bound in a few thousand nodes, not at +5 % and +6 % in 50 000), and
   a search under a capacity above the optimum often ends well below it, so
   many different capacities beat one capacity tried hard.

A probe that runs out of choices is a proof that nothing fits under that
capacity, which raises the proven lower bound.  Capacities are multiples of
the sizes' gcd (every canonical peak is a sum of sizes), so proofs move the
bound by whole steps.  The node counts are deterministic, so a step budget
gives the same result on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..trace import packing_peak
from .budget import Budget
from .canonical_search import FOUND, INFEASIBLE, ORDER_RULES, CanonicalSearch

__all__ = ["tighten", "Tightening", "MIDDLE_SHARE"]

#: A probe between the bounds gets 1/MIDDLE_SHARE of the nodes of a probe at
#: the lower bound: on tight instances the lower bound is where it pays off
#: (MiniMalloc's E is packed at it within 10 s with 6, not with 4; D's peak
#: within 10 s is worse with 8).
MIDDLE_SHARE = 6
#: Probes between the bounds per block order and round: where the optimum is
#: above the lower bound (MiniMalloc's D and J) these probes are what finds
#: lower peaks, and three of them still leave the lower bound half the nodes.
SAMPLES = 3


@dataclass
class Tightening:
    """What :func:`tighten` found and did."""

    offsets: list[int] | None  # a packing below the starting peak, or None
    peak: int  # its peak (or the starting peak)
    proven_bound: int  # no packing has a lower peak
    nodes: int = 0
    restarts: int = 0
    probes: list[tuple[int, str]] = field(default_factory=list)  # (capacity, outcome)


def tighten(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
            lower_bound: int, known_peak: int, budget: Budget, seed: int = 0,
            on_improve: Callable[[int], None] | None = None) -> Tightening:
    """Search packings with a peak below ``known_peak`` until ``budget`` runs out."""
    n = len(sizes)
    step = math.gcd(*sizes) if n else 1
    result = Tightening(None, known_peak, -(-lower_bound // step) * step)
    if n == 0 or known_peak <= result.proven_bound:
        return result
    searches = [CanonicalSearch(lowers, uppers, sizes, rule, None if seed == 0 else seed + k)
                for k, rule in enumerate(ORDER_RULES)]
    limit = max(n, 16)

    def probe(search: CanonicalSearch, capacity: int, nodes: int) -> str:
        status, offsets = search.run(capacity, budget.limit(nodes), budget.deadline)
        budget.spend(search.nodes)
        result.nodes += search.nodes
        result.restarts += 1
        result.probes.append((capacity, status))
        if status == FOUND:
            peak = packing_peak(offsets, sizes)
            if peak < result.peak:
                result.offsets, result.peak = offsets, peak
                if on_improve is not None:
                    on_improve(peak)
        elif status == INFEASIBLE:
            result.proven_bound = max(result.proven_bound, capacity + step)
        return status

    rng = random.Random(seed)
    while result.peak > result.proven_bound and not budget.expired():
        limit *= 2
        for search in searches:
            if result.peak <= result.proven_bound or budget.expired():
                break
            if probe(search, result.proven_bound, limit) == FOUND:
                break
            for _ in range(SAMPLES):
                steps_between = (result.peak - result.proven_bound) // step
                if steps_between < 2 or budget.expired():
                    break
                # The upper half: a search under a capacity above the optimum
                # often ends well below it, so the peak walks down in strides.
                below = result.peak - step * rng.randrange(1, max(2, (steps_between + 1) // 2))
                probe(search, below, max(n, limit // MIDDLE_SHARE))
    return result
