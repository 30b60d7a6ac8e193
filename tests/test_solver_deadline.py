"""The time limit holds for a whole solve, shown on clocks the test controls.

No test here measures wall time.  The solver reads time only through the
clock it is given (``pgmo.solve(..., clock=...)``), so a fake clock shows
exactly when each phase started and ended, and what the solver does when
time jumps past its deadline (a machine that stalls).  The real clock's
behaviour under load is measured by ``scripts/bench_solver.py``.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgmo
from pgmo import Trace
from pgmo.solver import deadline_for
from pgmo.solver.bestfit import paper_priority, skyline_offsets
from pgmo.solver.budget import Budget, OutOfTime
from pgmo.solver.canonical_search import STOPPED, CanonicalSearch
from pgmo.solver.greedy import ORDERS, gap_fit_offsets
from pgmo.validate import find_conflict

from .strategies import event_traces, traces


class SteppingClock:
    """Each read moves time on by ``tick`` seconds; ``jump`` adds a stall at one read."""

    def __init__(self, tick: float, jump_at: int | None = None, jump: float = 0.0):
        self.now, self.tick, self.reads = 0.0, tick, 0
        self.jump_at, self.jump = jump_at, jump
        self.jumped_to: float | None = None

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        if self.reads == self.jump_at:
            self.now += self.jump
            self.jumped_to = self.now
        return self.now


def hard_instance(n: int = 150, seed: int = 1, width: int = 1000, height: int = 1 << 20) -> Trace:
    """A strip cut into ``n`` rectangles by random guillotine cuts, as blocks.

    Its optimum is its lower bound (``height``), which ``best`` does not
    reach within 20 000 steps (seed 1): the searches run until stopped.
    """
    rng = random.Random(seed)
    pieces = [(0, width, 0, height)]
    while len(pieces) < n:
        k = max(range(len(pieces)), key=lambda i: (pieces[i][1] - pieces[i][0])
                * (pieces[i][3] - pieces[i][2]) * rng.random())
        x0, x1, y0, y1 = pieces.pop(k)
        if (rng.random() < 0.5 and x1 - x0 > 1) or y1 - y0 < 2048:
            cut = rng.randrange(x0 + 1, x1)
            pieces += [(x0, cut, y0, y1), (cut, x1, y0, y1)]
        else:
            cut = y0 + 1024 * rng.randrange(1, (y1 - y0) // 1024)
            pieces += [(x0, x1, y0, cut), (x0, x1, cut, y1)]
    return Trace.from_tuples([(i, x0, x1, y1 - y0) for i, (x0, x1, y0, y1) in enumerate(pieces)])


def phase_times(plan, start: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of every phase on the solve's clock."""
    return [(p["name"], start + p["started"], start + p["started"] + p["seconds"])
            for p in plan.info["phases"]]


@pytest.mark.parametrize("limit", [0.5, 2.0])
def test_every_phase_starts_and_ends_before_the_deadline(limit):
    trace = hard_instance()
    clock = SteppingClock(tick=1e-4)
    plan = pgmo.solve(trace, method="best", time_limit=limit, clock=clock)
    deadline = deadline_for(pgmo.SolverOptions(time_limit=limit), len(trace), clock.tick)
    assert find_conflict(trace.blocks, plan.offsets) is None
    assert plan.info["stopped_by"] == "time limit"
    times = phase_times(plan, clock.tick)
    assert len(times) >= 3  # greedy, then searches that the deadline cut short
    for name, begun, ended in times:
        assert begun < deadline, f"{name} started past the deadline"
        assert ended <= deadline + 10 * clock.tick, f"{name} ran past the deadline"
    assert plan.seconds <= limit  # the whole call, validation included


def test_a_stall_past_the_deadline_stops_the_search_where_it_is():
    trace = hard_instance()
    # Time jumps 100 s, far past the 2 s limit, in the middle of the searches.
    clock = SteppingClock(tick=1e-4, jump_at=3000, jump=100.0)
    plan = pgmo.solve(trace, method="best", time_limit=2.0, clock=clock)
    assert clock.jumped_to is not None
    assert find_conflict(trace.blocks, plan.offsets) is None
    for name, begun, _ in phase_times(plan, clock.tick):
        assert begun < clock.jumped_to, f"{name} started after the deadline had passed"
    # One look at the clock per phase or loop level still open, not a search's worth.
    assert clock.reads - clock.jump_at < 20


def test_without_a_clock_limit_a_budget_gives_the_same_plan_whatever_the_clock():
    trace = hard_instance()
    plans = [pgmo.solve(trace, method="best", time_limit=None, budget=20_000, clock=clock)
             for clock in (SteppingClock(1e-3), SteppingClock(5.0), SteppingClock(0.0))]
    assert plans[0].offsets == plans[1].offsets == plans[2].offsets
    assert plans[0].info["nodes"] == plans[1].info["nodes"] <= 20_000


def test_greedy_decoders_give_up_at_the_deadline():
    trace = hard_instance(n=400)
    cols = trace.columns()
    past = Budget(deadline=1.0, clock=lambda: 2.0)
    with pytest.raises(OutOfTime):
        gap_fit_offsets(*cols, ORDERS["size"](*cols), budget=past)
    with pytest.raises(OutOfTime):
        skyline_offsets(*cols, paper_priority(*cols), budget=past)
    # With time left they finish, and pack as without a budget.
    ample = Budget(deadline=1.0, clock=lambda: 0.0)
    assert skyline_offsets(*cols, paper_priority(*cols), ample) == skyline_offsets(
        *cols, paper_priority(*cols))


def test_a_search_past_its_deadline_pauses_and_goes_on_later():
    trace = hard_instance()
    search = CanonicalSearch(*trace.columns(), "TWA")
    search.start(trace.lower_bound())
    assert search.advance(10**6, deadline=1.0, clock=lambda: 2.0) == (STOPPED, None)
    assert search.nodes <= 1
    whole = CanonicalSearch(*trace.columns(), "TWA")
    status, offsets = whole.run(trace.lower_bound(), 3000)
    assert search.advance(3000 - search.nodes) == (status, offsets)
    assert search.nodes == whole.nodes


@settings(max_examples=40, deadline=None)
@given(st.one_of(traces(max_blocks=14, max_tick=16, max_size=12),
                 event_traces(max_blocks=14, max_size=12)),
       st.integers(1, 40), st.integers(0, 6))
def test_a_search_in_slices_visits_the_nodes_of_one_search(trace, slice_nodes, slack):
    capacity = trace.lower_bound() + slack
    whole = CanonicalSearch(*trace.columns(), "TAW")
    expected = whole.run(capacity, 400)
    sliced = CanonicalSearch(*trace.columns(), "TAW")
    sliced.start(capacity)
    result = (STOPPED, None)
    while sliced.nodes < 400 and result[0] == STOPPED:
        result = sliced.advance(min(slice_nodes, 400 - sliced.nodes))
    assert result == expected
    assert sliced.nodes == whole.nodes


def test_a_phase_share_knows_the_whole_budget_it_came_from():
    whole = Budget(deadline=10.0, clock=lambda: 0.0)
    part = whole.share(0.5)
    inner = part.share(0.5)
    assert (part.deadline, inner.deadline) == (5.0, 2.5)
    assert inner.whole is whole and part.whole is whole and whole.whole is whole


def test_a_core_found_is_filled_past_its_phase_share_within_the_whole_limit():
    """The peak core's fill is the phase's only payoff: once a core packs under the
    capacity, the fill may use the whole search's time left, not only the phase's share;
    where even that is too short, nothing is filled (no packing is yielded)."""
    from pgmo.solver.peak_core import core_packings

    n = 1200
    lowers = [2 * i for i in range(n)]
    uppers = [2 * i + 3 for i in range(n)]  # each block overlaps the next one
    sizes = [512 * (1 + i % 7) for i in range(n)]
    capacity = max(sizes[i] + sizes[i + 1] for i in range(n - 1))
    whole = Budget(deadline=10.0, clock=lambda: 1.0)
    part = whole.share(0.1)  # 0.9 s of its own: a 5 s fill does not fit it
    assert not part.fits(5.0) and whole.fits(5.0)
    packed = list(core_packings(lowers, uppers, sizes, capacity, part, fill_seconds=5.0))
    assert packed
    for _, offsets in packed:
        assert find_conflict(Trace.from_columns(lowers, uppers, sizes).blocks, offsets) is None
    assert not list(core_packings(lowers, uppers, sizes, capacity, part, fill_seconds=20.0))
