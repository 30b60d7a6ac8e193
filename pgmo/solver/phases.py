"""The phases of the ``best`` method, each a function that reports what it did.

Every phase takes the :class:`Incumbent` (the lowest packing so far, and
the proven lower bound) and a :class:`~.budget.Budget` of its own, improves
the incumbent while the budget lasts, and returns a :class:`PhaseReport`.
:mod:`.best` decides their order and their shares of the budget.

A phase keeps the deadline by itself: its loops look at the budget's clock,
and a step that cannot stop halfway is started only when its estimated cost
fits in the time left (and abandoned at the deadline all the same, by
:class:`~.budget.OutOfTime`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..trace import packing_peak
from .bestfit import paper_priority, runs_compiled, skyline_offsets
from .budget import Budget, OutOfTime
from .greedy import ORDERS, gap_fit_offsets
from .lanes import lane_offsets
from .skyline_search import SkylineSearch
from .neighbourhood import NeighbourhoodSearch
from .peak_core import core_packings
from .skyline_dfs import capacity_search as skyline_capacity_search
from .tightening import tighten

__all__ = ["Incumbent", "PhaseReport", "Phase", "Candidate", "CANDIDATES", "LAST_RESORT",
           "greedy", "skyline_greedies", "leading_skylines", "other_skylines", "LEADING_SKYLINES",
           "gap_greedies", "peak_core", "capacity_search", "tightening",
           "slab_moves", "priority_moves"]

# A priori cost of one greedy run, in seconds, before one of its kind has been timed.
_GAP_COST_PER_BLOCK = 2e-5
_GAP_COST_PER_PAIR_OF_BLOCKS = 1.5e-9
_SKYLINE_COST_PER_BLOCK = 3e-5
#: The same, compiled (:func:`.bestfit.runs_compiled`): Y_1's 62,185 blocks take 0.055 s and
#: the paper's priority 0.05 s more; twice that, for a core shared with training.
_COMPILED_SKYLINE_COST_PER_BLOCK = 3e-6


class Incumbent:
    """The lowest-peak packing found so far, each strategy's peak, and the proven bound."""

    def __init__(self, lowers: list[int], uppers: list[int], sizes: list[int], lower_bound: int):
        self.cols = (lowers, uppers, sizes)
        self.n = len(sizes)
        self.lower_bound = lower_bound
        self.bound = lower_bound  # no packing has a lower peak (raised by proofs)
        self.name: str | None = None
        self.offsets: list[int] | None = None
        self.peak: int | None = None
        self.peaks: dict[str, int] = {}  # the lowest peak of every strategy tried
        #: The skyline priority of the best skyline run: where a priority search starts.
        self.priority: list[int] | None = None
        self.priority_peak: int | None = None
        #: Seconds one run of each greedy kind took (the last one timed).
        self.cost: dict[str, float] = {}

    def consider(self, name: str, offsets: list[int]) -> bool:
        """Keep ``offsets`` if they beat the incumbent; True when they did."""
        peak = packing_peak(offsets, self.cols[2])
        self.peaks[name] = min(peak, self.peaks.get(name, peak))
        if self.peak is None or peak < self.peak:
            self.name, self.offsets, self.peak = name, offsets, peak
            return True
        return False

    @property
    def packing(self) -> tuple[str, list[int], int]:
        """The incumbent: its strategy, offsets and peak (the first phase always finds one)."""
        assert self.name is not None and self.offsets is not None and self.peak is not None
        return self.name, self.offsets, self.peak

    @property
    def open(self) -> bool:
        """Whether a lower packing may exist (the incumbent is above the proven bound)."""
        return self.peak is None or self.peak > self.bound


@dataclass
class PhaseReport:
    """What one phase did: its steps, restarts and moves, and when it ran."""

    name: str
    started: float = 0.0  # seconds since the solve began
    seconds: float = 0.0
    nodes: int = 0  # search steps charged to the budget
    restarts: int = 0
    moves: int = 0
    improved: bool = False  # whether it lowered the incumbent's peak
    out_of_time: bool = False  # whether the deadline cut it short
    skipped: list[str] = field(default_factory=list)  # strategies it did not start
    probes: list[tuple[int, str]] = field(default_factory=list)  # (capacity, outcome)


# -- greedy candidates ------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One greedy packing: a skyline run under a priority, or a gap-fit run in an order."""

    name: str
    kind: str  # "skyline", "gap" or "lanes" (:mod:`.lanes`)
    order: str  # "paper" (the paper's priority) or a name in :data:`.greedy.ORDERS`
    rule: str = "best"  # the gap rule

    def estimate(self, n: int, cost: dict[str, float]) -> float:
        if self.kind in cost:
            return cost[self.kind]
        if self.kind == "skyline":
            return n * (_COMPILED_SKYLINE_COST_PER_BLOCK if runs_compiled()
                        else _SKYLINE_COST_PER_BLOCK)
        return n * (_GAP_COST_PER_BLOCK + n * _GAP_COST_PER_PAIR_OF_BLOCKS)

    def run(self, cols: tuple[list[int], list[int], list[int]],
            budget: Budget | None) -> tuple[list[int], list[int] | None]:
        """(offsets, the skyline priority or None)."""
        lowers, uppers, sizes = cols
        if self.kind == "lanes":
            return lane_offsets(lowers, uppers, sizes), None
        if self.order == "paper":
            order = paper_priority(lowers, uppers, sizes)
        else:
            order = ORDERS[self.order](lowers, uppers, sizes)
        if self.kind == "skyline":
            return skyline_offsets(lowers, uppers, sizes, order, budget), order
        return gap_fit_offsets(lowers, uppers, sizes, order, self.rule, budget=budget), None


#: Greedy candidates, the paper's best-fit first (it is always run: the plan of last resort).
CANDIDATES = (
    Candidate("bestfit", "skyline", "paper"),
    Candidate("skyline/size-lifetime", "skyline", "size-lifetime"),
    Candidate("skyline/area", "skyline", "area"),
    Candidate("gap-best/size", "gap", "size"),
    Candidate("gap-best/size-lifetime", "gap", "size-lifetime"),
    Candidate("gap-best/lifetime-size", "gap", "lifetime-size"),
    Candidate("gap-best/area", "gap", "area"),
    Candidate("gap-first/size", "gap", "size", "first"),
)
#: The plan of last resort where the first candidate's estimated cost does not fit in the time
#: left (best-fit on 60 000 blocks under a 1 s limit): a tenth of best-fit's time.
LAST_RESORT = Candidate("lanes", "lanes", "size")


def greedy(best: Incumbent, budget: Budget, seed: int = 0,
           candidates: tuple[Candidate, ...] = CANDIDATES, name: str = "greedy") -> PhaseReport:
    """Run ``candidates`` in turn; one whose estimated cost does not fit is skipped.

    Without an incumbent the first runs whatever the clock says: ``best``
    must return a plan.  When its estimated cost does not fit in the time
    left, :data:`LAST_RESORT` runs first, and the first candidate after it all
    the same (estimates are rough: best-fit takes 0.4 s on S_1's 28 526
    blocks, 1.4 s on Y_1's 62 185), given up at the deadline.  (Greedy runs
    are not randomised: ``seed`` is unused.)
    """
    report = PhaseReport(name)
    leading = None  # the candidate that runs whatever its estimate
    if best.offsets is None and candidates:
        leading = candidates[0]
        if not budget.fits(leading.estimate(best.n, best.cost)):
            candidates = (LAST_RESORT,) + tuple(candidates)
    for candidate in candidates:
        if best.peak is not None and (not best.open or budget.expired()):
            break
        if (candidate is not leading and best.offsets is not None
                and not budget.fits(candidate.estimate(best.n, best.cost))):
            report.skipped.append(candidate.name)
            continue
        started = budget.clock()
        try:
            offsets, priority = candidate.run(best.cols, budget if best.offsets else None)
        except OutOfTime:
            report.out_of_time = True
            report.skipped.append(candidate.name)
            break
        best.cost[candidate.kind] = budget.clock() - started
        if priority is not None:
            peak = packing_peak(offsets, best.cols[2])
            if best.priority_peak is None or peak < best.priority_peak:
                best.priority, best.priority_peak = priority, peak
        report.improved |= best.consider(candidate.name, offsets)
    return report


# -- searches ------------------------------------------------------------------------
#: The skyline candidates a large trace gets before the peak core: the paper's best-fit (the
#: plan of last resort) and the one that packs S_1 at 1.0018 x its lower bound (the gap-fit
#: ones: 1.016) and bert_large at 1.0154; a run takes a third of a second on 20 000 blocks.
LEADING_SKYLINES = ("bestfit", "skyline/area")


def skyline_greedies(best: Incumbent, budget: Budget, seed: int = 0) -> PhaseReport:
    """The skyline candidates, the paper's best-fit first: the cheapest on large traces."""
    return greedy(best, budget, seed, tuple(c for c in CANDIDATES if c.kind == "skyline"),
                  "skyline")


def leading_skylines(best: Incumbent, budget: Budget, seed: int = 0) -> PhaseReport:
    """The skyline candidates of :data:`LEADING_SKYLINES`, in that order."""
    return greedy(best, budget, seed,
                  tuple(c for name in LEADING_SKYLINES for c in CANDIDATES if c.name == name),
                  "skyline")


def other_skylines(best: Incumbent, budget: Budget, seed: int = 0) -> PhaseReport:
    """The skyline candidates not in :data:`LEADING_SKYLINES`."""
    return greedy(best, budget, seed, tuple(c for c in CANDIDATES if c.kind == "skyline"
                                            and c.name not in LEADING_SKYLINES),
                  "skyline-more")


def gap_greedies(best: Incumbent, budget: Budget, seed: int = 0) -> PhaseReport:
    """The gap-fit candidates: seconds each on 20 000 blocks, so after the peak core there."""
    return greedy(best, budget, seed, tuple(c for c in CANDIDATES if c.kind == "gap"), "gap")


def peak_core(best: Incumbent, budget: Budget, seed: int = 0) -> PhaseReport:
    """Pack the blocks around the max-load instant exactly, the rest around them.

    Skipped where the whole search's time left does not fit one fill of the
    rest (its estimate): a core packing gives nothing without one, and
    setting the core up takes seconds on 60 000 blocks.  A core found is
    filled within the whole search's time, past this phase's share if need be
    (the phases after it then get less).  (Its block orders are fixed:
    ``seed`` is unused.)
    """
    report = PhaseReport("peak-core")
    stats: dict = {}
    fill = best.cost.get("gap", _GAP_COST_PER_BLOCK * best.n)
    if not budget.whole.fits(fill):
        report.skipped.append("peak-core")
        return report
    for name, offsets in core_packings(*best.cols, best.lower_bound, budget,
                                       fill_seconds=fill, stats=stats):
        report.improved |= best.consider(name, offsets)
    report.nodes, report.restarts = stats["nodes"], stats["restarts"]
    return report


def capacity_search(best: Incumbent, budget: Budget, seed: int) -> PhaseReport:
    """Skyline backtracking under shrinking capacities (:mod:`.skyline_dfs`)."""
    report = PhaseReport("capacity-search")
    offsets, _, probes = skyline_capacity_search(*best.cols, best.bound, best.packing[2],
                                                 budget, seed)
    report.nodes, report.restarts = budget.used, len(probes)
    report.probes = [(c, "found" if ok else "stopped") for c, ok in probes]
    if offsets is not None:
        report.improved = best.consider("capacity-search", offsets)
    return report


def tightening(best: Incumbent, budget: Budget, seed: int) -> PhaseReport:
    """The canonical search under the lower bound and probes above it (:mod:`.tightening`)."""
    report = PhaseReport("tightening")
    found = tighten(*best.cols, best.bound, best.packing[2], budget, seed)
    report.nodes, report.restarts, report.probes = found.nodes, found.restarts, found.probes
    best.bound = max(best.bound, found.proven_bound)
    if found.offsets is not None:
        report.improved = best.consider("canonical-search", found.offsets)
    return report


def slab_moves(best: Incumbent, budget: Budget, seed: int) -> PhaseReport:
    """Re-pack slabs of the incumbent with the rest pinned (:mod:`.neighbourhood`)."""
    report = PhaseReport("neighbourhood")
    search = NeighbourhoodSearch(*best.cols, seed)
    before = budget.used
    offsets = search.run(best.packing[1], budget, best.bound)
    report.nodes, report.moves = budget.used - before, search.moves
    report.improved = best.consider("neighbourhood", offsets)
    return report


def priority_moves(best: Incumbent, budget: Budget, seed: int) -> PhaseReport:
    """Local search over the best skyline priority (:mod:`.skyline_search`)."""
    report = PhaseReport("local-search")
    if best.priority is None or not budget.fits(2 * best.cost.get("skyline", 0.0)):
        report.skipped.append("local-search")
        return report
    search = SkylineSearch(*best.cols, seed=seed)
    before = budget.used
    try:
        offsets, _, moves = search.run(best.priority, budget, best.bound)
    except OutOfTime:
        report.out_of_time = True
        return report
    report.nodes, report.moves = budget.used - before, moves
    report.improved = best.consider("local-search", offsets)
    return report


#: A phase as :mod:`.best` runs it: (incumbent, its budget, seed) -> report.
Phase = Callable[[Incumbent, Budget, int], PhaseReport]
