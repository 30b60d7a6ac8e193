"""The plan of last resort for traces too large for best-fit in the time left.

``best`` must return a valid plan within its limit on any trace; where the
paper's best-fit would not finish in time (60 000 blocks under 1 s), the
lanes (:mod:`pgmo.solver.lanes`) are that plan.  No test here measures wall
time: the budgets run on clocks the tests control.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pgmo import Trace
from pgmo.solver.budget import Budget
from pgmo.solver.lanes import lane_offsets, size_lanes
from pgmo.solver.phases import Incumbent, greedy, leading_skylines, peak_core
from pgmo.validate import find_conflict

from .strategies import event_traces, traces


@settings(max_examples=150, deadline=None)
@given(st.one_of(traces(), traces(max_size=4), event_traces(max_blocks=40, max_size=8)))
def test_lanes_pack_every_trace_validly(trace):
    offsets = lane_offsets(*trace.columns())
    assert find_conflict(trace.blocks, offsets) is None
    # Lanes of one size hold one block at a time: no more of them than its max load needs.
    lane_of, _, _, lane_size = size_lanes(*trace.columns())
    for size in set(lane_size):
        of_size = Trace.from_tuples([(b.id, b.lower, b.upper, 1) for b in trace.blocks
                                     if b.size == size])
        assert lane_size.count(size) == of_size.lower_bound()


def test_blocks_of_one_size_one_after_another_share_a_lane():
    trace = Trace.from_tuples([(0, 0, 2, 8), (1, 2, 5, 8), (2, 5, 6, 8), (3, 0, 6, 4)])
    offsets = lane_offsets(*trace.columns())
    assert offsets[0] == offsets[1] == offsets[2]
    assert max(o + b.size for o, b in zip(offsets, trace.blocks)) == trace.lower_bound() == 12


def incumbent(trace: Trace) -> Incumbent:
    return Incumbent(*trace.columns(), trace.lower_bound())


def big_trace(n: int = 600) -> Trace:
    return Trace.from_tuples([(i, i % 97, i % 97 + 1 + i % 13, 1 + i % 7) for i in range(n)])


def test_without_time_for_best_fit_the_lanes_come_first_and_best_fit_all_the_same():
    trace = big_trace()
    best = incumbent(trace)
    # The clock stands still just before the deadline: no estimate fits, and nothing runs out.
    report = greedy(best, Budget(deadline=1e-9, clock=lambda: 0.0))
    assert list(best.peaks)[:2] == ["lanes", "bestfit"]
    assert not report.out_of_time
    assert find_conflict(trace.blocks, best.packing[1]) is None
    assert best.packing[2] == min(best.peaks.values())


def test_when_time_runs_out_the_lanes_are_the_plan():
    trace = big_trace()
    best = incumbent(trace)
    reads = []

    def clock() -> float:  # past the deadline once the lanes have been timed
        reads.append(None)
        return 0.0 if len(reads) <= 3 else 10.0

    leading_skylines(best, Budget(deadline=1e-9, clock=clock))
    assert list(best.peaks) == ["lanes"]
    assert best.packing[0] == "lanes"
    assert find_conflict(trace.blocks, best.packing[1]) is None


def test_with_time_for_best_fit_no_lanes_run():
    trace = big_trace()
    best = incumbent(trace)
    greedy(best, Budget(deadline=100.0, clock=lambda: 0.0))
    assert "lanes" not in best.peaks and "bestfit" in best.peaks


def test_the_peak_core_is_skipped_without_time_for_one_fill():
    trace = big_trace()
    best = incumbent(trace)
    leading_skylines(best, Budget(deadline=100.0, clock=lambda: 0.0))  # no fill timed yet
    report = peak_core(best, Budget(deadline=1e-9, clock=lambda: 0.0))
    assert report.skipped == ["peak-core"] and report.nodes == 0
