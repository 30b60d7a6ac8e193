"""Anytime peak minimisation with the canonical search: the lower bound and probes above it.

Two kinds of search share the budget, round after round:

1. one search per block order (:data:`.canonical_search.ORDER_RULES`) under
   the proven lower bound, each going on where it paused the round before
   (never restarted: a deterministic search restarted with more nodes only
   repeats its first ones).  Success there is optimal.  The orders get
   :data:`WEIGHTS` of the round's nodes: TWA packs 7 of MiniMalloc's 9
   instances whose optimum is the lower bound, and MiniMalloc's E needs 73 523
   nodes of it;
2. probes: fresh searches under capacities drawn (seeded) from the top
   third of the gap between the bounds, with a few nodes per block each.
   Whether a probe succeeds jumps erratically with the capacity (on
   MiniMalloc's D: found at the best known peak in 4 178 nodes, not at 0.5 %
   above it in 20 000), and a search under a capacity above the optimum
   often ends well below it, so many capacities tried briefly beat one tried
   hard.  Where the optimum is above the lower bound (D, J) these probes
   find every lower peak.  A round's probes together get as many nodes as
   its slice (the lower bound's searches get 2.5 slices).

A search that runs out of choices is a proof that nothing fits under its
capacity, which raises the proven lower bound.  Capacities are multiples of
the sizes' gcd (every canonical peak is a sum of sizes), so proofs move the
bound by whole steps.  Node counts are deterministic, so a step budget gives
the same result on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..trace import packing_peak
from .budget import Budget
from .canonical_search import FOUND, INFEASIBLE, ORDER_RULES, CanonicalSearch

__all__ = ["tighten", "Tightening", "WEIGHTS"]

#: Share of a round's nodes for each order's search under the lower bound,
#: in halves of the round's slice: TWA packs 7 of MiniMalloc's 9 instances
#: whose optimum is the lower bound, and E only after 73 523 nodes.
WEIGHTS = {"TWA": 3, "TAW": 1, "WAT": 1}
#: Nodes of all probes of a round, per node of the round's slice.
PROBE_SHARE = 1.0
#: Nodes of one probe: a sixth of the round's slice, but at least
#: PROBE_MIN and at most PROBE_MAX per block.  A probe succeeds early or not
#: at all (MiniMalloc's D and J pack at their best known peaks within 20
#: nodes per block, when they pack), so later rounds probe more capacities
#: instead of probing longer.
PROBE_MIN, PROBE_MAX = 4, 20
#: The orders of the probes, in turn: on D and J, TAW's probes fail where the
#: others' succeed (it packs B at its lower bound, in the searches there).
PROBE_RULES = ("TWA", "WAT", "TWA", "TAW")
#: Probes are drawn from the top 1/UPPER of the gap between the bounds.
UPPER = 3


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
    searches = {rule: CanonicalSearch(lowers, uppers, sizes, rule, None if seed == 0 else seed + k)
                for k, rule in enumerate(ORDER_RULES)}
    at_bound = [search.fork() for search in searches.values()]
    rng = random.Random(seed)

    def restart_at_bound() -> None:
        for search in at_bound:
            search.start(result.proven_bound)
            result.restarts += 1

    def advance(search: CanonicalSearch, nodes: int) -> str:
        before = search.nodes
        status, offsets = search.advance(budget.limit(nodes), budget.deadline, budget.clock)
        spent = search.nodes - before
        budget.spend(spent)
        result.nodes += spent
        if status == FOUND and offsets is not None:  # FOUND carries the offsets
            peak = packing_peak(offsets, sizes)
            if peak < result.peak:
                result.offsets, result.peak = offsets, peak
                if on_improve is not None:
                    on_improve(peak)
        elif status == INFEASIBLE and search.capacity + step > result.proven_bound:
            result.proven_bound = search.capacity + step
            if result.proven_bound < result.peak:
                restart_at_bound()
        return status

    def probe(search: CanonicalSearch, capacity: int, nodes: int) -> None:
        search.start(capacity)
        result.restarts += 1
        result.probes.append((capacity, advance(search, nodes)))

    def gap_closed() -> bool:
        return result.peak <= result.proven_bound or budget.expired()

    restart_at_bound()
    unit = max(n, 16)
    rounds = probed = 0
    while not gap_closed():
        rounds += 1
        slice_nodes = unit << rounds
        for bounded in at_bound:
            if gap_closed():
                break
            advance(bounded, WEIGHTS[bounded.rule] * slice_nodes // 2)
        probe_nodes = min(max(PROBE_MIN * n, slice_nodes // 6), PROBE_MAX * n)
        for _ in range(max(1, round(PROBE_SHARE * slice_nodes / probe_nodes))):
            steps_between = (result.peak - result.proven_bound) // step
            if steps_between < 2 or gap_closed():
                break
            # The top of the gap: a search under a capacity above the optimum
            # often ends well below it, so the peak walks down in strides.
            below = result.peak - step * rng.randrange(1, max(2, (steps_between + 1) // UPPER))
            probe(searches[PROBE_RULES[probed % len(PROBE_RULES)]], below, probe_nodes)
            probed += 1
    return result
