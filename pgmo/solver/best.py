"""The default method: greedy packings first, then searches, keeping the lowest peak.

No single rule wins everywhere, so ``best`` runs, while its budget lasts and
until a packing reaches the lower bound (then it is optimal):

1. greedy candidates: the skyline best-fit with several priorities and
   gap-fit placement in several orders (:mod:`.greedy`), each skipped when
   one run would not end before the deadline;
2. on traces of :data:`CORE_MIN_N` blocks or more, the peak core
   (:mod:`.peak_core`): the blocks around the max-load instant packed exactly,
   the rest fitted around them (real traces: exact on pangu, BERT);
3. briefly, the skyline backtracking search under capacity
   (:func:`.skyline_dfs.capacity_search`): cheap, and on some instances it
   reaches the lower bound where the canonical search takes long;
4. on traces small enough for it, anytime tightening with the canonical
   search (:mod:`.tightening`): restarts at the lower bound and between the
   bounds, which also proves lower bounds;
5. with what is left: on traces of up to :data:`NEIGHBOURHOOD_MAX_N` blocks,
   the large neighbourhood search (:class:`.neighbourhood.NeighbourhoodSearch`),
   which re-packs slabs of the best packing with the canonical search; on
   larger ones, local search over skyline priorities
   (:class:`.local_search.SkylineSearch`).

The budget (:class:`.budget.Budget`) counts search steps and keeps the
deadline: with a step budget and no time limit the plan is the same on every
machine.  ``info`` reports the winning strategy, the peak of every candidate,
the steps (``nodes``) and ``restarts`` spent, the proven lower bound and the
gap to it, and whether optimality was proven.
"""

from __future__ import annotations

import time
from typing import Callable

from ..trace import Trace, packing_peak
from .bestfit import paper_priority, skyline_offsets
from .budget import Budget
from .canonical_search import MAX_CELLS, sections_of
from .greedy import ORDERS, gap_fit_offsets
from .local_search import SkylineSearch
from .neighbourhood import NeighbourhoodSearch
from .options import SolverOptions
from .packing import Packing
from .peak_core import core_packings
from .skyline_dfs import capacity_search
from .tightening import tighten

__all__ = ["solve", "best_offsets", "CORE_MIN_N", "TIGHTEN_MAX_N", "NEIGHBOURHOOD_MAX_N",
           "SHARES"]

#: Smallest trace given the peak-core strategy (smaller ones get the whole
#: canonical search instead).
CORE_MIN_N = 1000
#: Largest trace given the canonical search (its blocks x sections matrix
#: must also stay under :data:`.canonical_search.MAX_CELLS`).
TIGHTEN_MAX_N = 20_000
#: Largest trace given the large neighbourhood search (a move re-reads the
#: trace and builds a search over the slab and its pinned neighbours).
NEIGHBOURHOOD_MAX_N = 2000
#: Share of the budget left when each search phase starts (tightening 0.85:
#: MiniMalloc's E needs 600 000 nodes of it to reach its lower bound).
SHARES = {"peak-core": 0.3, "capacity-search": 0.06, "tightening": 0.85}

# Rough cost model of one gap-fit run, in seconds, before one has been timed.
_GAP_COST_PER_BLOCK = 2e-5
_GAP_COST_PER_PAIR_OF_BLOCKS = 1.5e-9
# And of one skyline run.
_SKYLINE_COST_PER_BLOCK = 3e-5


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


def _stop_reason(optimal: bool, budget: Budget, n: int, started: float) -> str:
    """Why the search ended, for the report."""
    if optimal:
        return "optimum"
    # The last phases stop a little early rather than late.
    if budget.deadline is not None and budget.time_left() <= 0.05 + 0.02 * (
            budget.deadline - started):
        return "time limit"
    left = budget.steps_left
    if left is not None and left < max(16, n):  # too few for another probe or move
        return "budget"
    return "search finished"


def solve(trace: Trace, options: SolverOptions, deadline: float | None) -> Packing:
    """The ``best`` method behind :func:`pgmo.solve`."""
    if deadline is None and options.budget is None:
        raise ValueError("method 'best' without a time limit needs a step budget")
    offsets, info = best_offsets(trace, Budget(options.budget, deadline),
                                 progress=options.progress, seed=options.seed)
    return Packing(offsets, info["proved_optimal"], info)


def best_offsets(trace: Trace, budget: Budget | float, progress: bool = False,
                 seed: int = 0) -> tuple[list[int], dict]:
    """Best packing found within ``budget`` (or by a perf_counter deadline); (offsets, info)."""
    started = time.perf_counter()
    if not isinstance(budget, Budget):
        budget = Budget(None, budget)
    lowers, uppers, sizes = trace.columns()
    n, lb = len(sizes), trace.lower_bound()
    strategies = _strategies(lowers, uppers, sizes)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(strategies) + 4, desc="pgmo best", unit="phase", leave=False)

    state = {"name": None, "offsets": None, "peak": None}
    tried: dict[str, int] = {}
    skipped: list[str] = []
    report: dict = {"restarts": 0, "capacity_probes": [], "local_search_moves": 0,
                    "neighbourhood_moves": 0}
    bound = lb  # proven lower bound on the optimal peak

    def consider(name: str, offsets: list[int]) -> None:
        peak = packing_peak(offsets, sizes)
        tried[name] = min(peak, tried.get(name, peak))
        if state["peak"] is None or peak < state["peak"]:
            state.update(name=name, offsets=offsets, peak=peak)
            if bar is not None:
                bar.set_postfix(peak_over_lb=f"{peak / lb:.4f}")

    def open_gap() -> bool:
        return state["peak"] > bound and not budget.expired()

    def step():
        if bar is not None:
            bar.update(1)

    try:
        # 1. greedy candidates
        seed_peak, seed_priority = None, None
        cost = {"skyline": n * _SKYLINE_COST_PER_BLOCK,
                "gap": n * (_GAP_COST_PER_BLOCK + n * _GAP_COST_PER_PAIR_OF_BLOCKS)}
        for name, kind, run in strategies:
            if state["peak"] == lb:
                break
            if state["offsets"] is not None and cost[kind] > budget.time_left():
                skipped.append(name)
                continue
            t0 = time.perf_counter()
            if kind == "gap":
                offsets = run()
            else:
                offsets, priority = run()
                peak = packing_peak(offsets, sizes)
                if seed_peak is None or peak < seed_peak:
                    seed_peak, seed_priority = peak, priority
            cost[kind] = time.perf_counter() - t0
            consider(name, offsets)
            step()

        # 2. peak core (large traces)
        if n >= CORE_MIN_N and open_gap():
            part = budget.share(SHARES["peak-core"])
            stats: dict = {}
            for name, offsets in core_packings(lowers, uppers, sizes, lb, part,
                                               fill_seconds=2 * cost["gap"], stats=stats):
                consider(name, offsets)
            budget.spend(part.used)
            report["restarts"] += stats.get("restarts", 0)
        step()

        # 3. skyline backtracking under capacity
        if 1 < n and open_gap():
            part = budget.share(SHARES["capacity-search"])
            offsets, _, probes = capacity_search(lowers, uppers, sizes, bound, state["peak"],
                                                 part, seed)
            budget.spend(part.used)
            report["restarts"] += len(probes)
            report["capacity_probes"] += [[c, "found" if ok else "stopped"] for c, ok in probes]
            if offsets is not None:
                consider("capacity-search", offsets)
        step()

        # 4. canonical search, tightening the capacity
        canonical = 1 < n <= TIGHTEN_MAX_N and n * sections_of(lowers, uppers)[2] <= MAX_CELLS
        if canonical and open_gap():
            part = budget.share(SHARES["tightening"])
            found = tighten(lowers, uppers, sizes, bound, state["peak"], part, seed)
            budget.spend(part.used)
            report["restarts"] += found.restarts
            report["capacity_probes"] += [[c, s] for c, s in found.probes]
            bound = max(bound, found.proven_bound)
            if found.offsets is not None:
                consider("canonical-search", found.offsets)
        step()

        # 5. the rest: slab re-packing, or local search (its first move re-runs a skyline)
        if canonical and n <= NEIGHBOURHOOD_MAX_N and open_gap():
            search = NeighbourhoodSearch(lowers, uppers, sizes, seed)
            consider("neighbourhood", search.run(state["offsets"], budget, bound))
            report["neighbourhood_moves"] = search.moves
        elif n > 1 and open_gap() and seed_priority is not None \
                and budget.time_left() > 2 * cost["skyline"]:
            search = SkylineSearch(lowers, uppers, sizes, seed=seed)
            offsets, _, moves = search.run(seed_priority, budget, bound)
            report["local_search_moves"] = moves
            consider("local-search", offsets)
        step()
    finally:
        if bar is not None:
            bar.close()

    peak = state["peak"]
    info = {
        "strategy": state["name"],
        "nodes": budget.used,
        "restarts": report["restarts"],
        "proved_optimal": peak <= bound,
        "proven_bound": bound,
        "gap": peak / lb - 1 if lb else 0.0,
        "gap_bytes": peak - lb,
        "stopped_by": _stop_reason(peak <= bound, budget, n, started),
        "peaks": tried,
        "skipped": skipped,
        "capacity_probes": report["capacity_probes"],
        "local_search_moves": report["local_search_moves"],
        "neighbourhood_moves": report["neighbourhood_moves"],
        "reached_lower_bound": peak == lb,
    }
    return state["offsets"], info
