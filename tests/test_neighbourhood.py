"""The large neighbourhood search: valid, never worse, deterministic under a step budget."""

from __future__ import annotations

from hypothesis import given, settings

import pgmo
from pgmo.solver.bestfit import bestfit_offsets
from pgmo.solver.budget import Budget
from pgmo.solver.neighbourhood import NeighbourhoodSearch
from pgmo.trace import packing_peak
from pgmo.validate import find_conflict

from .benchmarks import BENCH, needs_bench
from .strategies import event_traces, traces


@settings(max_examples=40, deadline=None)
@given(traces(max_blocks=30) | event_traces(max_blocks=30))
def test_slab_moves_return_a_valid_packing_no_higher_than_the_start(trace):
    cols = trace.columns()
    start = bestfit_offsets(*cols)
    budget = Budget(steps=2000)
    offsets = NeighbourhoodSearch(*cols, seed=1).run(start, budget, trace.lower_bound())
    assert find_conflict(trace.blocks, offsets) is None
    assert packing_peak(offsets, cols[2]) <= packing_peak(start, cols[2])
    assert budget.used <= 2000


@needs_bench
def test_slab_moves_lower_a_minimalloc_packing_and_repeat_for_a_seed_and_budget():
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / "E.1048576.csv")
    cols = trace.columns()
    start = bestfit_offsets(*cols)
    runs = [NeighbourhoodSearch(*cols, seed=3).run(start, Budget(steps=20_000),
                                                    trace.lower_bound()) for _ in range(2)]
    assert runs[0] == runs[1]
    assert find_conflict(trace.blocks, runs[0]) is None
    assert packing_peak(runs[0], cols[2]) < packing_peak(start, cols[2])


@needs_bench
def test_best_ends_with_slab_moves_and_reports_them():
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / "E.1048576.csv")
    plans = [pgmo.solve(trace, time_limit=None, budget=40_000, seed=2) for _ in range(2)]
    assert plans[0].offsets == plans[1].offsets
    info = plans[0].info
    assert info["nodes"] <= 40_000
    assert info["neighbourhood_moves"] > 0
    assert info["peaks"]["neighbourhood"] <= min(info["peaks"].values())
