"""The default method: try several greedy packings, keep the lowest, then search.

No single greedy rule wins everywhere: the paper's skyline best-fit is exact
on some real traces where TFLite's greedy-by-size is 0.4 % above the lower
bound, and the reverse happens on others.  So ``best``

1. runs the skyline best-fit with several priorities (cheap, O(n log n));
2. runs gap-fit greedy placement (:mod:`.greedy`) in several orders while the
   time budget allows (each run costs a numpy pass over the placed blocks);
3. on traces of up to :data:`DFS_MAX_N` blocks, spends most of the remaining
   time in :func:`.skyline_dfs.capacity_search`: backtracking skyline
   packing under a capacity, first at the lower bound, then at capacities
   climbing towards the best peak so far and bisecting once one succeeds;
4. spends what is left in :class:`.local_search.SkylineSearch`, searching
   priority orders for the skyline from the best skyline priority of step 1.

It stops as soon as a packing reaches the lower bound (proven optimal) and
always returns the best packing found.  ``info`` names the winning strategy,
the peak of every candidate, the capacity probes and how many local-search
moves were made.
"""

from __future__ import annotations

import time
from typing import Callable

from ..trace import Trace, packing_peak
from .bestfit import paper_priority, skyline_offsets
from .greedy import ORDERS, gap_fit_offsets
from .local_search import SkylineSearch
from .options import SolverOptions
from .packing import Packing
from .skyline_dfs import capacity_search

__all__ = ["solve", "best_offsets", "DFS_MAX_N", "DFS_SHARE"]

#: Largest trace given to the backtracking search (its steps scan the whole
#: horizon with numpy; on the 60k-block traces one descent already takes
#: seconds).
DFS_MAX_N = 100_000
#: Share of the time left after the greedy candidates given to it.
DFS_SHARE = 0.9

# Rough cost model of one gap-fit run, in seconds, before one has been timed.
_GAP_COST_PER_BLOCK = 2e-5
_GAP_COST_PER_PAIR_OF_BLOCKS = 1.5e-9


def _strategies(lowers, uppers, sizes) -> list[tuple[str, str, Callable[[], list[int]]]]:
    """(name, kind, run) for every greedy candidate, cheapest kind first.

    Skyline runs return (offsets, priority) so the search can start from the
    best priority; gap runs return offsets.
    """
    cols = (lowers, uppers, sizes)

    def skyline(priority_of):
        priority = priority_of(*cols)
        return skyline_offsets(*cols, priority), priority

    out = [("bestfit", "skyline", lambda: skyline(paper_priority))]
    for name in ("size-lifetime", "area"):
        out.append((f"skyline/{name}", "skyline", lambda name=name: skyline(ORDERS[name])))
    for name in ("size", "size-lifetime", "lifetime-size", "area"):
        out.append((f"gap-best/{name}", "gap",
                    lambda name=name: gap_fit_offsets(*cols, ORDERS[name](*cols), "best")))
    out.append(("gap-first/size", "gap",
                lambda: gap_fit_offsets(*cols, ORDERS["size"](*cols), "first")))
    return out


def solve(trace: Trace, options: SolverOptions, deadline: float | None) -> Packing:
    """The ``best`` method behind :func:`pgmo.solve`."""
    if deadline is None:
        raise ValueError("method 'best' without a time limit needs a step budget")
    offsets, info = best_offsets(trace, deadline, progress=options.progress, seed=options.seed)
    return Packing(offsets, True if info["reached_lower_bound"] else None, info)


def best_offsets(trace: Trace, deadline: float, progress: bool = False,
                 seed: int = 0) -> tuple[list[int], dict]:
    """Best packing found by ``deadline`` (a perf_counter value); returns (offsets, info)."""
    lowers, uppers, sizes = trace.columns()
    n, lb = len(sizes), trace.lower_bound()

    def peak_of(offsets):
        return packing_peak(offsets, sizes)

    strategies = _strategies(lowers, uppers, sizes)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(strategies) + 1, desc="pgmo best", unit="step", leave=False)

    tried: dict[str, int] = {}
    skipped: list[str] = []
    best_name, best, best_peak = None, None, None
    seed_peak, seed_priority = None, None
    skyline_cost = 0.0
    gap_cost = n * (_GAP_COST_PER_BLOCK + n * _GAP_COST_PER_PAIR_OF_BLOCKS)
    try:
        for name, kind, run in strategies:
            if best_peak == lb:
                break
            remaining = deadline - time.perf_counter()
            if best is not None and (remaining <= 0 or (kind == "gap" and gap_cost > remaining)):
                skipped.append(name)
                continue
            t0 = time.perf_counter()
            if kind == "gap":
                offsets = run()
                gap_cost = time.perf_counter() - t0
            else:
                offsets, priority = run()
                skyline_cost = time.perf_counter() - t0
            peak = peak_of(offsets)
            tried[name] = peak
            if kind == "skyline" and (seed_peak is None or peak < seed_peak):
                seed_peak, seed_priority = peak, priority
            if best_peak is None or peak < best_peak:
                best_name, best, best_peak = name, offsets, peak
            if bar is not None:
                bar.update(1)
                bar.set_postfix(peak_over_lb=f"{best_peak / lb:.4f}")

        probes = []
        if best_peak > lb and 1 < n <= DFS_MAX_N and time.perf_counter() < deadline:
            now = time.perf_counter()
            offsets, peak, probes = capacity_search(lowers, uppers, sizes, lb, best_peak,
                                                    now + DFS_SHARE * (deadline - now), seed)
            tried["capacity-search"] = peak
            if offsets is not None and peak < best_peak:
                best_name, best, best_peak = "capacity-search", offsets, peak
                if bar is not None:
                    bar.set_postfix(peak_over_lb=f"{best_peak / lb:.4f}")

        moves = 0
        # The search's first step re-runs a skyline: only start if two fit.
        if best_peak > lb and n > 1 and time.perf_counter() + 2 * skyline_cost < deadline:
            search = SkylineSearch(lowers, uppers, sizes, seed=seed)

            def improved(peak):
                if bar is not None:
                    bar.set_postfix(peak_over_lb=f"{peak / lb:.4f}")

            offsets, peak, moves = search.run(seed_priority, deadline, lb, improved)
            tried["local-search"] = peak
            if peak < best_peak:
                best_name, best, best_peak = "local-search", offsets, peak
        if bar is not None:
            bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    info = {
        "strategy": best_name,
        "candidates": len(tried),
        "peaks": tried,
        "skipped": skipped,
        "capacity_probes": probes,
        "local_search_moves": moves,
        "reached_lower_bound": best_peak == lb,
    }
    return best, info
