"""The heuristic solvers: bestfit (the paper's), the greedy orders, and best.

Every packing is checked with the independent validator
(:func:`pgmo.validate.find_conflict`), never with the solver's own bookkeeping.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgmo
from pgmo import Trace
from pgmo.solver import bestfit as bestfit_module
from pgmo.solver.bestfit import bestfit_offsets, paper_priority, skyline_offsets
from pgmo.solver.budget import Budget, OutOfTime
from pgmo.solver.greedy import ORDERS, gap_fit_offsets, order_by
from pgmo.solver.skyline_search import SkylineSearch
from pgmo.solver.skyline_dfs import capacity_search, skyline_dfs
from pgmo.validate import find_conflict

from .benchmarks import BENCH, needs_bench
from .strategies import event_traces, traces



def untimed(info: dict) -> dict:
    """``info`` less the phases' timings: all a step budget makes the same on every run."""
    phases = [{k: v for k, v in p.items() if k not in ("started", "seconds")}
              for p in info["phases"]]
    return {**info, "phases": phases}


def peak_of(trace: Trace, offsets) -> int:
    return max(o + b.size for o, b in zip(offsets, trace.blocks))


def bestfit(rows) -> list[int]:
    return bestfit_offsets(*Trace.from_tuples(rows).columns())


def assert_valid(trace: Trace, offsets) -> None:
    why = find_conflict(trace.blocks, list(offsets))
    assert why is None, why
    assert peak_of(trace, offsets) >= trace.lower_bound()


# -- property tests: every heuristic packs every instance validly ---------------

@settings(max_examples=150, deadline=None)
@given(st.one_of(traces(), event_traces()))
def test_bestfit_packs_validly(trace):
    assert_valid(trace, bestfit_offsets(*trace.columns()))


@settings(max_examples=60, deadline=None)
@given(st.one_of(traces(), event_traces()), st.sampled_from(sorted(ORDERS)),
       st.sampled_from(["best", "first"]))
def test_gap_fit_packs_validly_in_every_order(trace, order, rule):
    cols = trace.columns()
    assert_valid(trace, gap_fit_offsets(*cols, order_by(order, *cols), rule))


@settings(max_examples=40, deadline=None)
@given(st.one_of(traces(max_blocks=20), event_traces(max_blocks=20)))
def test_best_plan_validates_and_beats_bestfit(trace):
    plan = pgmo.solve(trace, method="best", time_limit=None, budget=2000)
    assert find_conflict(trace.blocks, plan.offsets) is None
    assert plan.lower_bound <= plan.peak <= pgmo.solve(trace, method="bestfit").peak
    assert plan.info["strategy"]
    if plan.peak == plan.lower_bound:
        assert plan.optimal


@settings(max_examples=30, deadline=None)
@given(traces(max_blocks=15), st.integers(0, 3))
def test_local_search_never_worse_than_its_start(trace, seed):
    cols = trace.columns()
    priority = paper_priority(*cols)
    start_peak = peak_of(trace, bestfit_offsets(*cols))
    search = SkylineSearch(*cols, seed=seed)
    offsets, peak, _ = search.run(priority, Budget(steps=200), target=trace.lower_bound())
    assert_valid(trace, offsets)
    assert peak == peak_of(trace, offsets) <= start_peak


@settings(max_examples=60, deadline=None)
@given(st.one_of(traces(max_blocks=15), event_traces(max_blocks=15)))
def test_backtracking_search_first_finds_the_greedy_packing(trace):
    # With capacity = the greedy peak the load bound never blocks the greedy
    # path, so depth first reaches the paper's packing before anything else.
    cols = trace.columns()
    greedy = bestfit_offsets(*cols)
    found = skyline_dfs(*cols, peak_of(trace, greedy), paper_priority(*cols),
                        deadline=float("inf"), leftmost_first=False)
    assert found == greedy


@settings(max_examples=60, deadline=None)
@given(st.one_of(traces(max_blocks=12), event_traces(max_blocks=12)), st.integers(0, 3))
def test_backtracking_search_respects_the_capacity(trace, slack):
    cols = trace.columns()
    lb = trace.lower_bound()
    capacity = lb + slack
    found = skyline_dfs(*cols, capacity, paper_priority(*cols), max_steps=5000)
    if found is not None:
        assert_valid(trace, found)
        assert peak_of(trace, found) <= capacity
    assert skyline_dfs(*cols, lb - 1, paper_priority(*cols), deadline=float("inf")) is None


@settings(max_examples=30, deadline=None)
@given(traces(max_blocks=15))
def test_capacity_search_only_reports_improvements(trace):
    cols = trace.columns()
    known = peak_of(trace, bestfit_offsets(*cols))
    offsets, peak, probes = capacity_search(*cols, trace.lower_bound(), known, Budget(steps=3000))
    if offsets is None:
        assert peak == known
    else:
        assert_valid(trace, offsets)
        assert peak == peak_of(trace, offsets) < known
    assert all(trace.lower_bound() <= cap < known for cap, _ in probes)


# -- the paper's best-fit, step by step ---------------------------------------

def test_figure1_style_walkthrough():
    """A six-block walk-through in the spirit of the paper's Figure 1.

    (The paper's own Figure 1 instance could not be retrieved here, so this
    instance is ours; every step below was derived by hand.)

    blocks (id: [lower, upper) size, lifetime):
      0: [0,10) 2, 10   1: [0,4) 3, 4   2: [4,10) 1, 6
      3: [5,8) 2, 3     4: [2,6) 1, 4   5: [8,10) 2, 2

    1. one line [0,10)@0; all fit, longest is 0 -> offset 0; line [0,10)@2.
    2. [0,10)@2: longest fitting is 2 (6 ticks) -> offset 2;
       lines [0,4)@2, [4,10)@3.
    3. lowest [0,4)@2: only 1 fits -> offset 2; lines [0,4)@5, [4,10)@3.
    4. lowest [4,10)@3: 3 and 5 fit (4 starts at 2), longest is 3 -> offset 3;
       lines [0,4)@5, [4,5)@3, [5,8)@5, [8,10)@3.
    5. lowest: [4,5)@3 and [8,10)@3 tie, take the leftmost [4,5): nothing
       fits -> lift to 5, equal to BOTH neighbours -> one line [0,8)@5.
    6. lowest [8,10)@3: 5 fits -> offset 3; it rises to 5 and merges: [0,10)@5.
    7. [0,10)@5: 4 fits -> offset 5.  Peak 6 = lower bound (ticks 2-4: 2+3+1).
    """
    rows = [(0, 0, 10, 2), (1, 0, 4, 3), (2, 4, 10, 1), (3, 5, 8, 2), (4, 2, 6, 1), (5, 8, 10, 2)]
    assert bestfit(rows) == [0, 2, 2, 3, 5, 3]
    plan = pgmo.solve(Trace.from_tuples(rows), method="bestfit")
    assert (plan.peak, plan.lower_bound) == (6, 6)


def test_stairs():
    """Same free tick, staggered lifetimes: longest first builds a staircase.

    0: [0,2) 3   1: [0,4) 2   2: [0,6) 1
    [0,6)@0 takes 2 (longest) -> [0,6)@1 takes 1 -> lines [0,4)@3, [4,6)@1;
    [4,6)@1 has no block -> lifted to 3 and merged -> [0,6)@3 takes 0.
    """
    assert bestfit([(0, 0, 2, 3), (1, 0, 4, 2), (2, 0, 6, 1)]) == [3, 1, 0]


def test_tetris_equal_lifetimes_prefer_larger_block():
    """0: [0,4) 2   1: [4,8) 3   2: [0,8) 1   3: [0,2) 1

    2 (8 ticks) goes first at 0.  0 and 1 both live 4 ticks: the larger, 1,
    wins the tie -> offset 1; lines [0,4)@1, [4,8)@4.  [0,4)@1 takes 0 ->
    [0,4)@3, which takes 3 into the notch: peak 4 = lower bound.
    """
    rows = [(0, 0, 4, 2), (1, 4, 8, 3), (2, 0, 8, 1), (3, 0, 2, 1)]
    assert bestfit(rows) == [1, 1, 0, 3]


def test_lift_merges_both_equal_neighbours():
    """0: [0,4) 2   1: [5,9) 2   2: [3,6) 1

    0 goes first (tie with 1 on lifetime and size, earlier block wins) ->
    [0,4)@2, [4,9)@0.  [4,9)@0 takes 1 -> [0,4)@2, [4,5)@0, [5,9)@2.  Nothing
    fits the one-tick gap [4,5): it is lifted to 2 and, both neighbours being
    at 2, all three merge into [0,9)@2, the only line block 2 fits in.
    """
    assert bestfit([(0, 0, 4, 2), (1, 5, 9, 2), (2, 3, 6, 1)]) == [0, 0, 2]


def test_blocks_touching_in_time_share_addresses():
    # Half-open lifetimes: [0,2) and [2,4) may use the same bytes.
    assert bestfit([(0, 0, 2, 8), (1, 2, 4, 8)]) == [0, 0]


def test_bestfit_ignores_trace_order_and_id():
    rows = [(7, 0, 10, 2), (3, 0, 4, 3), (9, 4, 10, 1)]
    shuffled = [rows[2], rows[0], rows[1]]
    a = dict(zip((r[0] for r in rows), bestfit(rows)))
    b = dict(zip((r[0] for r in shuffled), bestfit(shuffled)))
    assert a == b


def test_best_rule_takes_the_tightest_gap_first_rule_the_lowest():
    """Blocks 0-4 leave two holes during [2,4) for block 5 (size 1):
    addresses [1,4) (3 wide, freed by block 1) and [5,6) (1 wide, freed by
    block 3).  TFLite's best-fit rule takes the tight hole at 5; first fit
    takes the lowest at 1.  Blocks 0-4 land the same under both rules.
    """
    rows = [(0, 0, 4, 1), (1, 0, 2, 3), (2, 0, 4, 1), (3, 0, 2, 1), (4, 0, 4, 1), (5, 2, 4, 1)]
    trace = Trace.from_tuples(rows)
    cols = trace.columns()
    best = gap_fit_offsets(*cols, range(6), "best")
    first = gap_fit_offsets(*cols, range(6), "first")
    assert best == [0, 1, 4, 5, 6, 5]
    assert first == [0, 1, 4, 5, 6, 1]
    assert_valid(trace, best)
    assert_valid(trace, first)


def test_size_order_is_biggest_first():
    cols = ([0, 0, 0], [1, 2, 3], [2, 7, 7])
    assert order_by("size", *cols) == [1, 2, 0]
    assert order_by("size-lifetime", *cols) == [2, 1, 0]


def test_gap_fit_rejects_unknown_rule():
    with pytest.raises(ValueError, match="unknown gap rule 'worst'"):
        gap_fit_offsets([0], [1], [1], [0], "worst")


# -- solve() ------------------------------------------------------------------

def test_solve_rejects_unknown_method():
    trace = Trace.from_tuples([(0, 1, 4)])
    with pytest.raises(ValueError, match=r"unknown method 'fastest'; choose one of bestfit, best, exact"):
        pgmo.solve(trace, method="fastest")


def test_best_reports_how_it_won():
    trace = Trace.from_tuples([(0, 0, 2, 3), (1, 0, 4, 2), (2, 0, 6, 1), (3, 5, 7, 4)])
    plan = pgmo.solve(trace, method="best", time_limit=None, budget=100)
    assert plan.peak == plan.lower_bound and plan.optimal
    assert plan.info["reached_lower_bound"] is True
    assert plan.info["proved_optimal"] is True and plan.info["gap"] == 0
    assert plan.info["strategy"] in plan.info["peaks"]
    assert plan.info["peaks"][plan.info["strategy"]] == plan.peak


# -- shared benchmark instances -----------------------------------------------

def _omnimalloc_small():
    if BENCH is None:
        return []
    return sorted((BENCH / "omnimalloc-small").glob("*.csv"))


@needs_bench
@pytest.mark.parametrize("path", _omnimalloc_small(), ids=lambda p: p.stem)
@pytest.mark.parametrize("method", ["bestfit", "best"])
def test_omnimalloc_small_reach_the_optimum(path, method):
    # The number in the file name is the optimal peak (= lower bound).
    optimum = int(re.search(r"\.(\d+)$", path.stem).group(1))
    trace = pgmo.read_trace(path)
    plan = pgmo.solve(trace, method=method, time_limit=None, budget=1000)
    assert find_conflict(trace.blocks, plan.offsets) is None
    assert trace.lower_bound() == optimum
    assert plan.peak == optimum


@needs_bench
@pytest.mark.parametrize("name, inclusive", [
    ("iree/iree_mobilenet", True),
    ("iree/iree_mobilebert", True),  # bestfit is 4.5 % above; best must close it
    ("iopddl/G_1", False),
    ("somas_tensors/tiny_bert", False),
    ("somas_tensors/resnet50", False),  # greedy is 0.4 % above; the peak core closes it
    ("somas_tensors/bert_base", False),  # 5620 blocks; greedy is LB + 2052
    ("somas_tensors/pangu_2.6B", False),  # greedy 0.76 % above; the peak core reaches LB
])
def test_best_reaches_the_known_optimum_on_real_traces(name, inclusive):
    trace = pgmo.read_trace(BENCH / "idealloc" / f"{name}.csv", inclusive=inclusive)
    plan = pgmo.solve(trace, method="best", time_limit=None, budget=20_000)
    assert find_conflict(trace.blocks, plan.offsets) is None
    assert plan.peak == trace.lower_bound()
    assert plan.optimal and plan.info["proved_optimal"]
    assert plan.info["nodes"] <= 20_000


@needs_bench
def test_bestfit_reaches_lower_bound_on_y1():
    # 62k blocks; the paper's skyline reaches the lower bound here.
    trace = pgmo.read_trace(BENCH / "idealloc" / "iopddl" / "Y_1.csv")
    plan = pgmo.solve(trace, method="bestfit")
    assert plan.peak == trace.lower_bound() == 497261190115


# -- step budgets: the same plan on every machine -------------------------------

@settings(max_examples=25, deadline=None)
@given(st.one_of(traces(max_blocks=25), event_traces(max_blocks=25)), st.integers(0, 2))
def test_best_with_a_budget_is_deterministic(trace, seed):
    a = pgmo.solve(trace, method="best", time_limit=None, budget=500, seed=seed)
    b = pgmo.solve(trace, method="best", time_limit=None, budget=500, seed=seed)
    assert a.offsets == b.offsets
    assert untimed(a.info) == untimed(b.info)
    assert a.info["nodes"] <= 500


@needs_bench
def test_budget_gives_the_same_plan_on_a_hard_instance():
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / "B.1048576.csv")
    plans = [pgmo.solve(trace, time_limit=None, budget=3000) for _ in range(2)]
    assert plans[0].offsets == plans[1].offsets
    assert untimed(plans[0].info) == untimed(plans[1].info)
    assert plans[0].info["nodes"] <= 3000
    assert plans[0].peak <= pgmo.solve(trace, method="bestfit").peak


def test_best_reports_its_search():
    trace = Trace.from_tuples([(0, 0, 4, 2), (1, 4, 8, 3), (2, 0, 8, 1), (3, 0, 2, 1),
                               (4, 1, 7, 2), (5, 3, 5, 1)])
    plan = pgmo.solve(trace, time_limit=None, budget=1000)
    for key in ("strategy", "nodes", "restarts", "proved_optimal", "gap", "gap_bytes",
                "proven_bound", "stopped_by", "peaks", "phases"):
        assert key in plan.info
    assert plan.info["gap_bytes"] == plan.peak - plan.lower_bound
    assert plan.info["proven_bound"] <= plan.peak
    phases = plan.info["phases"]
    assert phases[0]["name"] == "greedy"  # the plan of last resort comes first
    assert sum(p["nodes"] for p in phases) == plan.info["nodes"]
    assert sum(p["restarts"] for p in phases) == plan.info["restarts"]
    ends = [p["started"] + p["seconds"] for p in phases]
    assert all(end <= later["started"] for end, later in zip(ends, phases[1:]))


def test_best_without_limit_or_budget_is_refused():
    trace = Trace.from_tuples([(0, 0, 4, 2)])
    with pytest.raises(ValueError, match="needs a time limit or a budget"):
        pgmo.solve(trace, method="best", time_limit=None)


def test_budget_shares_and_limits():
    budget = Budget(steps=100)
    part = budget.share(0.5)
    assert part.steps == 50 and part.deadline is None
    part.spend(50)
    assert part.expired() and part.limit(10) == 0
    budget.spend(part.used)
    assert budget.steps_left == 50 and budget.limit(80) == 50
    assert not Budget().expired() and Budget().limit(7) == 7


@settings(max_examples=60, deadline=None)
@given(st.one_of(traces(max_blocks=20), event_traces(max_blocks=20)), st.data())
def test_gap_fit_keeps_fixed_blocks_where_they_are(trace, data):
    cols = trace.columns()
    packed = bestfit_offsets(*cols)
    keep = data.draw(st.sets(st.integers(0, len(trace) - 1)))
    fixed = {i: packed[i] for i in keep}
    offsets = gap_fit_offsets(*cols, order_by("size", *cols), "first", fixed)
    assert all(offsets[i] == o for i, o in fixed.items())
    assert_valid(trace, offsets)


# -- best-fit compiled and as plain Python: the same offsets --------------------------

def bestfit_ways(cols, priority) -> dict[str, list[int] | None]:
    """Offsets from each way best-fit runs, from the same source: what
    :func:`skyline_offsets` runs (its int64 array steps compiled, where pgmo is
    built with a compiler), and uncompiled: the plain-Python steps and the
    array steps (None where the columns do not fit them)."""
    plain = bestfit_module.plain_module()
    assert not plain.COMPILED
    columns = plain._int64_columns(*cols, priority)
    return {"default": skyline_offsets(*cols, priority),
            "plain": plain._python_offsets(*cols, priority),
            "plain array steps": None if columns is None else plain._Skyline(*columns).run(None)}


@st.composite
def priorities(draw, trace: Trace) -> list[int]:
    """The paper's priority, or any order of the blocks."""
    cols = trace.columns()
    if draw(st.booleans()):
        return paper_priority(*cols)
    return draw(st.permutations(range(len(trace))))


@settings(max_examples=300, deadline=None)
@given(st.one_of(traces(max_blocks=60), traces(max_blocks=40, max_tick=8, max_size=4),
                 event_traces(max_blocks=40)), st.data())
def test_compiled_bestfit_packs_as_plain_python(trace, data):
    cols = trace.columns()
    priority = data.draw(priorities(trace))
    ways = bestfit_ways(cols, priority)
    assert ways["default"] == ways["plain"] == ways["plain array steps"]
    assert_valid(trace, ways["default"])


@settings(max_examples=100, deadline=None)
@given(traces(max_blocks=40), st.data(),
       st.sampled_from([0, -(2**63), 2**62, 2**63, 2**70]),
       st.sampled_from([1, 10**12, 2**56, 2**62]))
def test_bestfit_beyond_int64_packs_as_within(trace, data, shift, scale):
    """Ticks or heights past the compiled steps' int64 run as plain Python: shifted ticks
    give the same offsets, sizes scaled by k offsets scaled by k, either way."""
    lowers, uppers, sizes = trace.columns()
    priority = data.draw(priorities(trace))
    base = skyline_offsets(lowers, uppers, sizes, priority)
    moved = ([t + shift for t in lowers], [t + shift for t in uppers], [s * scale for s in sizes])
    ways = bestfit_ways(moved, priority)
    assert ways["default"] == ways["plain"] == [o * scale for o in base]
    fits = max(uppers) + shift < 2**62 and scale * sum(sizes) < 2**62
    assert (ways["plain array steps"] is not None) == fits
    assert ways["plain array steps"] in (None, ways["plain"])


def test_bestfit_with_a_priority_that_repeats_a_block_packs_as_plain_python():
    # Not a permutation: ranks repeat, which only the plain steps' walk breaks ties of.
    cols = ([0, 0, 1, 2, 0], [3, 2, 3, 3, 1], [4, 2, 1, 3, 5])
    priority = [3, 1, 3, 0, 2]
    ways = bestfit_ways(cols, priority)
    assert ways["plain array steps"] is None
    assert ways["default"] == ways["plain"]


@needs_bench
@pytest.mark.parametrize("name, inclusive", [
    ("iopddl/S_1", False),
    ("somas_tensors/bert_large", False),
    ("iree/iree_mobilebert", True),
])
@pytest.mark.parametrize("order", ["paper", "area"])
def test_compiled_bestfit_packs_real_traces_as_plain_python(name, inclusive, order):
    trace = pgmo.read_trace(BENCH / "idealloc" / f"{name}.csv", inclusive=inclusive)
    cols = trace.columns()
    priority = paper_priority(*cols) if order == "paper" else ORDERS[order](*cols)
    # The compiled steps run where pgmo is built with them (not for want of int64 columns).
    assert bestfit_module._int64_columns(*cols, priority) is not None
    offsets = skyline_offsets(*cols, priority)
    assert offsets == bestfit_module.plain_module()._python_offsets(*cols, priority)
    assert_valid(trace, offsets)


@needs_bench
def test_bestfit_array_steps_uncompiled_pack_a_real_trace_as_plain_python():
    trace = pgmo.read_trace(BENCH / "idealloc" / "iopddl" / "G_1.csv")
    ways = bestfit_ways(trace.columns(), paper_priority(*trace.columns()))
    assert ways["default"] == ways["plain"] == ways["plain array steps"]


@needs_bench
@pytest.mark.parametrize("way", ["default", "plain"])
def test_bestfit_looks_at_the_clock_while_it_packs(way):
    """A deadline that passes during the run stops it (not only one passed at its start)."""
    trace = pgmo.read_trace(BENCH / "idealloc" / "iopddl" / "G_1.csv")  # 3 647 lines
    reads: list[int] = []

    def clock() -> float:  # the deadline passes at the third look
        reads.append(1)
        return 0.0 if len(reads) < 3 else 9.0

    budget = Budget(deadline=2.0, clock=clock)
    run = skyline_offsets if way == "default" else bestfit_module.plain_module().skyline_offsets
    with pytest.raises(OutOfTime):
        run(*trace.columns(), paper_priority(*trace.columns()), budget)
    assert len(reads) == 3  # every _CHECK_EVERY lines, from the first

