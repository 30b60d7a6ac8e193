"""The canonical search and the capacity tightening built on it.

Answers are checked against the independent validator and, on tiny traces,
against the exact solver's proven optimum: FOUND at the optimum, a proof of
infeasibility just below it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgmo
from pgmo.solver.budget import Budget
from pgmo.solver.canonical_search import (FOUND, INFEASIBLE, ORDER_RULES, STOPPED,
                                          CanonicalSearch, sections_of)
from pgmo.solver import numpy_nodes, search_nodes
from pgmo.solver.bestfit import bestfit_offsets
from pgmo.solver.peak_core import core_packings, peak_tick
from pgmo.solver.tightening import tighten
from pgmo.trace import Trace, packing_peak
from pgmo.validate import find_conflict

from .benchmarks import BENCH, needs_bench
from .strategies import event_traces, traces


def optimum(trace: Trace) -> int:
    from pgmo.solver import exact

    try:
        exact.resolve_backend("auto")
    except exact.ExactSolverUnavailable:
        pytest.skip("no exact solver installed (pip install 'pgmo[exact]')")
    offsets, optimal, _ = exact.exact_offsets(trace, time_limit=None)
    assert optimal
    return packing_peak(offsets, trace.columns()[2])


@settings(max_examples=80, deadline=None)
@given(st.one_of(traces(max_blocks=8, max_tick=10, max_size=8),
                 event_traces(max_blocks=8, max_size=8)), st.sampled_from(ORDER_RULES))
def test_search_finds_the_optimum_and_proves_nothing_fits_below(trace, rule):
    best = optimum(trace)
    search = CanonicalSearch(*trace.columns(), rule)
    status, offsets = search.run(best, node_limit=10**6)
    assert status == FOUND
    assert find_conflict(trace.blocks, offsets) is None
    assert packing_peak(offsets, trace.columns()[2]) <= best
    assert search.run(best - 1, node_limit=10**6) == (INFEASIBLE, None)


@settings(max_examples=60, deadline=None)
@given(st.one_of(traces(max_blocks=8, max_tick=10, max_size=8),
                 event_traces(max_blocks=8, max_size=8)), st.data())
def test_pinned_blocks_keep_their_offsets_and_the_rest_fits_around_them(trace, data):
    cols = trace.columns()
    known = bestfit_offsets(*cols)
    capacity = packing_peak(known, cols[2])
    pins = data.draw(st.sets(st.sampled_from(range(len(trace)))))
    pinned = {i: known[i] for i in pins}
    status, offsets = CanonicalSearch(*cols).run(capacity, 10**6, pinned=pinned)
    # The known packing, pushed down around the pinned blocks, is one answer.
    assert status == FOUND
    assert find_conflict(trace.blocks, offsets) is None
    assert packing_peak(offsets, cols[2]) <= capacity
    assert all(offsets[i] == o for i, o in pinned.items())


def test_search_stops_at_its_node_limit():
    rows = [(i, i % 5, i % 5 + 3, 1 + i % 7) for i in range(40)]
    trace = Trace.from_tuples(rows)
    search = CanonicalSearch(*trace.columns())
    status, offsets = search.run(trace.lower_bound(), node_limit=3)
    assert (status, offsets) == (STOPPED, None) or status == FOUND
    assert search.nodes <= 4  # the limit, and the node that found it spent


def test_sections_are_the_maximal_sets_of_live_blocks():
    # [0,4) and [2,6) meet in one section; [6,8) touches [2,6) only at 6.
    first, last, count = sections_of([0, 2, 6], [4, 6, 8])
    assert count == 2
    assert (first, last) == ([0, 0, 1], [1, 1, 2])


@settings(max_examples=40, deadline=None)
@given(st.one_of(traces(max_blocks=20), event_traces(max_blocks=20)), st.integers(0, 2))
def test_tightening_only_reports_valid_improvements_and_true_bounds(trace, seed):
    cols = trace.columns()
    known = packing_peak(bestfit_offsets(*cols), cols[2])
    result = tighten(*cols, trace.lower_bound(), known, Budget(steps=400), seed)
    assert result.nodes <= 400
    if result.offsets is None:
        assert result.peak == known
    else:
        assert find_conflict(trace.blocks, result.offsets) is None
        assert result.peak == packing_peak(result.offsets, cols[2]) < known
    assert trace.lower_bound() <= result.proven_bound
    if len(trace) <= 8:
        assert result.proven_bound <= optimum(trace)


def test_peak_tick_is_where_the_load_is_highest():
    assert peak_tick([0, 2, 5], [4, 6, 9], [1, 2, 4]) == 5


@needs_bench
def test_peak_core_packs_pangu_at_its_lower_bound():
    trace = pgmo.read_trace(BENCH / "idealloc" / "somas_tensors" / "pangu_2.6B.csv")
    cols = trace.columns()
    packings = list(core_packings(*cols, trace.lower_bound(), Budget(steps=8000)))
    assert packings
    name, offsets = packings[-1]
    assert find_conflict(trace.blocks, offsets) is None
    assert packing_peak(offsets, cols[2]) == trace.lower_bound()


@needs_bench
@pytest.mark.parametrize("name", ["A", "C", "G"])
def test_canonical_search_reaches_the_optimum_on_minimalloc_instances(name):
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / f"{name}.1048576.csv")
    plan = pgmo.solve(trace, time_limit=None, budget=300_000)
    assert plan.peak == trace.lower_bound() and plan.optimal


@settings(max_examples=60, deadline=None)
@given(traces(max_blocks=10, max_tick=12, max_size=8), st.sampled_from(ORDER_RULES),
       st.booleans())
def test_ordering_pieces_again_never_loses_the_optimum(trace, rule, reorder):
    best = optimum(trace)
    search = CanonicalSearch(*trace.columns(), rule, reorder=reorder)
    status, offsets = search.run(best, node_limit=10**6)
    assert status == FOUND and find_conflict(trace.blocks, offsets) is None
    assert search.run(best - 1, node_limit=10**6) == (INFEASIBLE, None)


@needs_bench
def test_pieces_ordered_again_pack_minimalloc_i_at_its_lower_bound_quickly():
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / "I.1048576.csv")
    runs = []
    for _ in range(2):
        search = CanonicalSearch(*trace.columns(), "TWA")
        status, offsets = search.run(trace.lower_bound(), node_limit=6000)
        runs.append((status, offsets, search.nodes))
    assert runs[0] == runs[1]  # deterministic
    status, offsets, _ = runs[0]
    assert status == FOUND and find_conflict(trace.blocks, offsets) is None
    assert packing_peak(offsets, trace.columns()[2]) == trace.lower_bound()


def _pinned_instance(seed: int, n: int = 80) -> Trace:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lo = rng.randrange(40)
        rows.append((i, lo, lo + rng.randrange(1, 12), rng.randrange(1, 40)))
    return Trace.from_tuples(rows)


#: (seed, rule, capacity above the lower bound, pinned?, status, nodes, a
#: checksum of the offsets), as the search gave them before its nodes were
#: made faster: speed-ups must visit the same nodes and find the same packings.
PINNED_RUNS = [
    (0, 'TWA', 0, False, 'found', 160, 442674),
    (0, 'TWA', 3, False, 'found', 160, 442674),
    (0, 'TWA', 0, True, 'found', 163, 429190),
    (0, 'TAW', 0, False, 'found', 160, 521170),
    (0, 'TAW', 3, False, 'found', 160, 521170),
    (0, 'TAW', 0, True, 'found', 710, 499857),
    (0, 'WAT', 0, False, 'found', 160, 416537),
    (0, 'WAT', 3, False, 'found', 160, 416537),
    (0, 'WAT', 0, True, 'found', 160, 416537),
    (1, 'TWA', 0, False, 'found', 160, 411247),
    (1, 'TWA', 3, False, 'found', 160, 411247),
    (1, 'TWA', 7, True, 'stopped', 3000, None),
    (1, 'TAW', 0, False, 'found', 160, 519426),
    (1, 'TAW', 3, False, 'found', 160, 519426),
    (1, 'TAW', 7, True, 'found', 231, 457840),
    (1, 'WAT', 0, False, 'found', 161, 363052),
    (1, 'WAT', 3, False, 'found', 161, 363052),
    (1, 'WAT', 7, True, 'found', 160, 362860),
    (2, 'TWA', 0, False, 'found', 167, 407379),
    (2, 'TWA', 3, False, 'found', 167, 407379),
    (2, 'TWA', 27, True, 'found', 170, 405502),
    (2, 'TAW', 0, False, 'found', 166, 441791),
    (2, 'TAW', 3, False, 'stopped', 3000, None),
    (2, 'TAW', 27, True, 'found', 180, 468702),
    (2, 'WAT', 0, False, 'stopped', 3000, None),
    (2, 'WAT', 3, False, 'found', 172, 398151),
    (2, 'WAT', 27, True, 'found', 162, 393570),
]


@pytest.mark.parametrize("kind", ["default", "numpy", "plain loops"])
def test_the_search_visits_the_same_nodes_and_finds_the_same_packings(kind):
    """Each way of doing the nodes' work (compiled where built) gives the pinned answers."""
    kernel = {"default": search_nodes.default_kind(), "numpy": numpy_nodes.NumpyNodes,
              "plain loops": search_nodes.plain_module().Nodes}[kind]
    assert kind != "plain loops" or not search_nodes.plain_module().COMPILED
    got = []
    for seed in range(3):
        trace = _pinned_instance(seed)
        cols = trace.columns()
        lb = trace.lower_bound()
        known = bestfit_offsets(*cols)
        peak = packing_peak(known, cols[2])
        for rule in ("TWA", "TAW", "WAT"):
            for cap, pins in ((lb, None), (lb + 3, None),
                              (peak, {i: known[i] for i in range(0, 80, 7)})):
                search = CanonicalSearch(*cols, rule, seed=seed or None)
                search.kernel_kind = kernel
                status, offsets = search.run(cap, 3000, pinned=pins)
                checksum = None if offsets is None else sum(o * (i + 1) for i, o in enumerate(offsets))
                got.append((seed, rule, cap - lb, pins is not None, status, search.nodes, checksum))
    assert got == PINNED_RUNS
