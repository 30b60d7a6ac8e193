"""The default method: greedy packings first, then searches, keeping the lowest peak.

No single rule wins everywhere, so ``best`` runs phases (:mod:`.phases`)
while its budget lasts and until a packing reaches the proven lower bound
(then it is optimal).  :func:`plan_for` chooses them by the trace's size:

- small traces: every greedy candidate (:mod:`.greedy`, :mod:`.bestfit`),
  then the canonical search under the lower bound and probes above it
  (:mod:`.tightening`), and with what is left the large neighbourhood search
  (:mod:`.neighbourhood`);
- traces of :data:`CORE_MIN_N` blocks or more: the paper's best-fit and one
  other skyline candidate (:data:`.phases.LEADING_SKYLINES`; where best-fit
  would not finish in the time left, the lanes of :mod:`.lanes` come first
  and best-fit is given up at the deadline), then the peak
  core (:mod:`.peak_core`: the blocks around the max-load instant packed
  exactly, the rest fitted around them; exact on pangu and BERT, most of the
  budget), then the other skyline candidates, then the gap-fit candidates
  (seconds each on 20 000 blocks), then the canonical search where the
  trace is small enough for it (:func:`.canonical_search.searchable`), else
  briefly the skyline backtracking search under capacity
  (:mod:`.skyline_dfs`), and with what is left the neighbourhood search or,
  on the largest traces, local search over skyline priorities
  (:mod:`.skyline_search`).

Each phase gets a share of the budget left when it starts.  The budget
(:class:`.budget.Budget`) counts search steps and keeps the deadline on one
clock: with a step budget and no time limit the plan is the same on every
machine.  :class:`BestInfo` reports the winning strategy, every strategy's
peak, every phase (when it started, how long it took, its steps), the proven
lower bound and why the search stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from ..trace import Trace
from .budget import WALL_CLOCK, Budget, Clock
from .canonical_search import MAX_BLOCKS, searchable, sections_of
from .options import SolverOptions
from .packing import Packing
from .phases import (Incumbent, Phase, PhaseReport, capacity_search, gap_greedies, greedy,
                     leading_skylines, other_skylines, peak_core, priority_moves, slab_moves,
                     tightening)

__all__ = ["solve", "best_offsets", "plan_for", "BestInfo", "Step", "CORE_MIN_N",
           "NEIGHBOURHOOD_MAX_N", "SHARES"]

log = logging.getLogger(__name__)

#: Smallest trace given the peak-core strategy (smaller ones get the whole
#: canonical search instead).
CORE_MIN_N = 1000
#: Largest trace given the large neighbourhood search (a move re-reads the
#: trace and builds a search over the slab and its pinned neighbours).
NEIGHBOURHOOD_MAX_N = 2000
#: Share of the budget left when each search phase starts (the last phase
#: gets all that is left).
SHARES = {"peak-core": 0.8, "capacity-search": 0.06, "tightening": 0.9}


@dataclass(frozen=True)
class Step:
    """One phase of the plan and its share of the budget left when it starts."""

    name: str
    phase: Phase
    share: float = 1.0


def plan_for(lowers: list[int], uppers: list[int]) -> list[Step]:
    """The phases ``best`` runs on a trace with these lifetimes, in order."""
    n = len(lowers)
    canonical = 1 < n <= MAX_BLOCKS and searchable(n, sections_of(lowers, uppers)[2])
    steps = []
    if n >= CORE_MIN_N:
        steps += [Step("skyline", leading_skylines),
                  Step("peak-core", peak_core, SHARES["peak-core"]),
                  Step("skyline-more", other_skylines), Step("gap", gap_greedies)]
    else:
        steps.append(Step("greedy", greedy))
    if n > 1 and not canonical:
        steps.append(Step("capacity-search", capacity_search, SHARES["capacity-search"]))
    if canonical:
        steps.append(Step("tightening", tightening, SHARES["tightening"]))
    if canonical and n <= NEIGHBOURHOOD_MAX_N:
        steps.append(Step("neighbourhood", slab_moves))
    elif n > 1:
        steps.append(Step("local-search", priority_moves))
    return steps


@dataclass
class BestInfo:
    """What ``best`` found and did (``Plan.info`` holds :meth:`as_dict`)."""

    strategy: str  # the phase's strategy that found the packing kept
    peak: int
    lower_bound: int  # the trace's max load
    proven_bound: int  # no packing has a lower peak
    nodes: int  # search steps, all phases together
    stopped_by: str  # "optimum", "time limit", "budget" or "search finished"
    peaks: dict[str, int]  # the lowest peak of every strategy tried
    phases: list[PhaseReport]

    @property
    def proved_optimal(self) -> bool:
        return self.peak <= self.proven_bound

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the background worker pickles it), with the totals over phases."""
        phases = self.phases
        probes = [[c, s] for p in phases for c, s in p.probes]
        return {
            "strategy": self.strategy,
            "nodes": self.nodes,
            "restarts": sum(p.restarts for p in phases),
            "proved_optimal": self.proved_optimal,
            "proven_bound": self.proven_bound,
            "gap": self.peak / self.lower_bound - 1 if self.lower_bound else 0.0,
            "gap_bytes": self.peak - self.lower_bound,
            "stopped_by": self.stopped_by,
            "peaks": dict(self.peaks),
            "skipped": [name for p in phases for name in p.skipped],
            "capacity_probes": probes,
            "local_search_moves": sum(p.moves for p in phases if p.name == "local-search"),
            "neighbourhood_moves": sum(p.moves for p in phases if p.name == "neighbourhood"),
            "reached_lower_bound": self.peak == self.lower_bound,
            "phases": [{k: v for k, v in dataclasses.asdict(p).items() if k != "probes"}
                       for p in phases],
        }


def solve(trace: Trace, options: SolverOptions, deadline: float | None,
          clock: Clock = WALL_CLOCK) -> Packing:
    """The ``best`` method behind :func:`pgmo.solve`."""
    if deadline is None and options.budget is None:
        raise ValueError("method 'best' without a time limit needs a step budget")
    offsets, info = best_offsets(trace, Budget(options.budget, deadline, clock),
                                 progress=options.progress, seed=options.seed)
    return Packing(offsets, info.proved_optimal, info.as_dict())


def best_offsets(trace: Trace, budget: Budget, progress: bool = False,
                 seed: int = 0) -> tuple[list[int], BestInfo]:
    """The lowest packing found within ``budget``: (offsets, :class:`BestInfo`)."""
    started = budget.clock()
    lowers, uppers, sizes = trace.columns()
    best = Incumbent(lowers, uppers, sizes, trace.lower_bound())
    steps = plan_for(lowers, uppers)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(steps), desc="pgmo best", unit="phase", leave=False)
    reports: list[PhaseReport] = []
    try:
        for step in steps:
            if best.peak is not None and (not best.open or budget.expired()):
                break  # the first phase always runs: it makes the plan of last resort
            part = budget.share(step.share)
            begun = budget.clock()
            report = step.phase(best, part, seed)
            report.started, report.seconds = begun - started, budget.clock() - begun
            budget.spend(part.used)
            reports.append(report)
            log.debug("best: %s took %.3f s, %d steps; peak %d", step.name, report.seconds,
                      report.nodes, best.peak)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(peak_over_lb=f"{best.packing[2] / best.lower_bound:.4f}")
    finally:
        if bar is not None:
            bar.close()
    name, offsets, peak = best.packing
    info = BestInfo(name, peak, best.lower_bound, best.bound, budget.used,
                    _stop_reason(best, budget, reports, started), best.peaks, reports)
    return offsets, info


def _stop_reason(best: Incumbent, budget: Budget, reports: list[PhaseReport],
                 started: float) -> str:
    """Why the search ended, for the report."""
    if not best.open:
        return "optimum"
    # The phases stop a little early rather than late.
    if budget.deadline is not None and (any(r.out_of_time for r in reports) or budget.time_left()
                                        <= 0.05 + 0.02 * (budget.deadline - started)):
        return "time limit"
    left = budget.steps_left
    if left is not None and left < max(16, best.n):  # too few for another probe or move
        return "budget"
    return "search finished"
