"""method="exact": optimal peaks on known and brute-forced instances, honest status."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings

import pgmo
from pgmo.solver import exact
from pgmo.solver.exact import ExactSolverUnavailable, exact_offsets

from .strategies import traces
from .benchmarks import BENCH, needs_bench

def _backend(name: str, module: str):
    missing = importlib.util.find_spec(module.split(".")[0]) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{module} not installed"))


BACKENDS = (_backend("cpsat", "ortools"), _backend("highs", "scipy"))
_NO_SOLVER = all(importlib.util.find_spec(m) is None for m in ("ortools", "scipy"))
#: For tests that need some exact backend installed (pgmo[exact]).
needs_a_solver = pytest.mark.skipif(_NO_SOLVER, reason="no exact solver installed "
                                                       "(pip install pgmo[exact])")
needs_highs = pytest.mark.skipif(importlib.util.find_spec("scipy") is None,
                                 reason="SciPy not installed")


OMNI = sorted((BENCH / "omnimalloc-small").glob("*.csv")) if BENCH else []


def peak_of(trace, offsets) -> int:
    return max(o + b.size for o, b in zip(offsets, trace))


def stacked(trace) -> list[int]:
    """Every block above all earlier ones: valid, and poor, so the solver must work."""
    return list(itertools.accumulate([0] + [b.size for b in trace]))[:-1]


def brute_force_peak(trace) -> int:
    """Smallest peak over all orders of "put the block on top of its placed time-neighbours".

    Complete: listing an optimal packing's blocks by offset and dropping each
    onto its placed neighbours never raises a block, so some order reaches
    the optimum; every order gives a valid packing, so none goes below it.
    """
    blocks = trace.blocks
    best = None
    for order in itertools.permutations(range(len(blocks))):
        top: dict[int, int] = {}
        for i in order:
            b = blocks[i]
            top[i] = b.size + max((top[j] for j in top if b.overlaps_in_time(blocks[j])),
                                  default=0)
        peak = max(top.values())
        best = peak if best is None else min(best, peak)
    return best


@needs_bench
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", OMNI, ids=lambda p: p.name)
@pytest.mark.parametrize("warm", ["heuristic", "stacked"])
def test_omnimalloc_small_optimum_is_the_file_name(path, backend, warm):
    trace = pgmo.read_trace(path)
    expected = int(path.name.split(".")[1])
    offsets, optimal, info = exact_offsets(
        trace, time_limit=20, backend=backend, workers=1,
        warm=stacked(trace) if warm == "stacked" else None)
    pgmo.Plan(trace, offsets).validate()
    assert peak_of(trace, offsets) == expected
    assert optimal is True
    assert info["backend"] == backend and info["bound"] == expected


@needs_bench
@pytest.mark.parametrize("backend", (_backend("auto", "ortools"),) + BACKENDS)
def test_solve_exact_on_omnimalloc_gives_a_validated_optimal_plan(backend):
    path = OMNI[0]
    plan = pgmo.solve(pgmo.read_trace(path), method="exact", time_limit=2, backend=backend)
    assert plan.method == "exact" and plan.optimal is True
    assert plan.peak == int(path.name.split(".")[1])
    assert plan.info["backend"] == ("cpsat" if backend == "auto" else backend)
    assert plan.is_valid()


@pytest.mark.parametrize("limit", [-1, float("nan")])
def test_negative_time_limit_is_refused(limit):
    trace = pgmo.Trace.from_tuples([(0, 1, 1)])
    with pytest.raises(ValueError, match="time_limit must be >= 0"):
        exact_offsets(trace, time_limit=limit)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(max_blocks=6, max_tick=8, max_size=6))
def test_tiny_instances_match_brute_force(backend, trace):
    # time_limit=None: search until the optimum is proven, on any machine's speed
    offsets, optimal, info = exact_offsets(trace, time_limit=None, backend=backend, workers=1,
                                           warm=stacked(trace))
    assert pgmo.validate.find_conflict(trace.blocks, offsets) is None
    assert peak_of(trace, offsets) == brute_force_peak(trace)
    assert optimal is True
    assert info["bound"] == peak_of(trace, offsets)


# Random tiny traces almost never need more than their max load (none of
# 20,000 brute-forced 6-block ones did), so the brute-force test above only
# proves optima equal to the lower bound.  This 11-block trace (found by a
# random search, then shrunk) needs 248 > its max load 244: the two backends,
# with different models, must both reach and prove exactly that.
GAP_ROWS = [(10, 11, 58), (3, 6, 76), (5, 6, 71), (10, 11, 61), (6, 10, 39), (8, 10, 91),
            (9, 11, 83), (6, 9, 43), (4, 8, 95), (6, 8, 53), (9, 11, 31)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("warm", ["heuristic", "stacked"])
def test_optimum_above_the_lower_bound_is_proven(backend, warm):
    trace = pgmo.Trace.from_tuples(GAP_ROWS)
    assert trace.lower_bound() == 244
    offsets, optimal, info = exact_offsets(
        trace, time_limit=None, backend=backend, workers=1,
        warm=stacked(trace) if warm == "stacked" else None)
    pgmo.Plan(trace, offsets).validate()
    assert peak_of(trace, offsets) == 248
    assert optimal is True and info["bound"] == 248


@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_start_one_byte_above_the_optimum_is_improved(backend):
    # The smallest possible improvement: the models must not demand more.
    trace = pgmo.Trace.from_tuples([(1, 4, 1), (2, 3, 2), (3, 4, 3), (3, 4, 1)])
    warm = [2, 0, 3, 0]
    assert peak_of(trace, warm) == 6 and brute_force_peak(trace) == 5
    offsets, optimal, info = exact_offsets(trace, time_limit=None, backend=backend, workers=1,
                                           warm=warm)
    assert info["warm_peak"] == 6
    assert peak_of(trace, offsets) == 5 and optimal is True


@pytest.mark.parametrize("backend", BACKENDS)
def test_byte_sizes_with_a_common_factor_give_the_same_optimum(backend):
    # MiniMalloc-style sizes, all multiples of 1024: the models divide that out.
    trace = pgmo.Trace.from_tuples([(lo, hi, s * 1024) for lo, hi, s in GAP_ROWS])
    offsets, optimal, info = exact_offsets(trace, time_limit=None, backend=backend, workers=1,
                                           warm=stacked(trace))
    pgmo.Plan(trace, offsets).validate()
    assert peak_of(trace, offsets) == 248 * 1024 and optimal is True


@pytest.mark.parametrize("backend", BACKENDS)
def test_unproven_result_is_not_called_optimal(backend):
    trace = pgmo.Trace.from_tuples(GAP_ROWS)
    # Far too little time to improve on, let alone prove, a poor start.
    offsets, optimal, info = exact_offsets(trace, time_limit=0.0, backend=backend, workers=1,
                                           warm=stacked(trace))
    peak = peak_of(trace, offsets)
    assert optimal == (peak == 248 and info["bound"] == 248)
    assert info["bound"] <= 248 <= peak


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(trace=traces(max_blocks=12, max_tick=12, max_size=40))
def test_result_is_valid_and_never_worse_than_the_warm_start(backend, trace):
    offsets, optimal, info = exact_offsets(trace, time_limit=5, backend=backend, workers=1)
    assert pgmo.validate.find_conflict(trace.blocks, offsets) is None
    peak = peak_of(trace, offsets)
    assert trace.lower_bound() <= info["bound"] <= peak <= info["warm_peak"]
    assert optimal == (info["bound"] == peak)


@needs_bench
@pytest.mark.parametrize("backend", BACKENDS)
def test_time_limit_returns_a_valid_plan_with_honest_status(backend):
    trace = pgmo.read_trace(BENCH / "minimalloc" / "challenging" / "A.1048576.csv")
    start = time.perf_counter()
    offsets, optimal, info = exact_offsets(trace, time_limit=2, backend=backend, workers=1)
    elapsed = time.perf_counter() - start
    assert elapsed < 8, f"a 2 s limit took {elapsed:.1f} s"
    plan = pgmo.Plan(trace, offsets, optimal=optimal).validate()
    # A's optimum is its lower bound, so "optimal" means exactly that peak.
    assert optimal == (plan.peak == trace.lower_bound())
    assert plan.peak <= info["warm_peak"]
    assert info["bound"] >= trace.lower_bound()
    assert info["status"]


@needs_a_solver
def test_trace_already_at_lower_bound_needs_no_solver():
    trace = pgmo.Trace.from_tuples([(0, 2, 4), (2, 4, 4), (1, 3, 2)])
    offsets, optimal, info = exact_offsets(trace, time_limit=None)
    assert optimal is True and peak_of(trace, offsets) == trace.lower_bound() == 6


@needs_a_solver
def test_invalid_warm_start_is_refused():
    trace = pgmo.Trace.from_tuples([("a", 0, 2, 4), ("b", 1, 3, 2)])
    with pytest.raises(ValueError, match="warm start is not a valid packing.*id=a.*id=b"):
        exact_offsets(trace, warm=[0, 0])


def test_unknown_backend_is_refused():
    trace = pgmo.Trace.from_tuples([(0, 1, 1)])
    with pytest.raises(ValueError, match="unknown exact backend 'gurobi'"):
        exact_offsets(trace, backend="gurobi")


@pytest.mark.parametrize("backend", BACKENDS)
def test_too_large_instance_is_refused_with_advice(backend):
    n = exact.MAX_BLOCKS[backend] + 1
    trace = pgmo.Trace.from_tuples([(i, i + 1, 1) for i in range(n)])
    with pytest.raises(ValueError, match=rf"{n:,} blocks; the exact method .* takes at most "
                                         rf"{n - 1:,}\. Use the 'best' method") as err:
        exact_offsets(trace, backend=backend)
    assert "method=" not in str(err.value)  # written for a person, not in Python syntax


def _hide(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import then raises ImportError


def test_missing_solvers_give_an_install_hint(monkeypatch):
    _hide(monkeypatch, "ortools.sat.python.cp_model", "scipy.optimize")
    trace = pgmo.Trace.from_tuples([(0, 2, 4), (1, 3, 2), (2, 4, 3)])
    with pytest.raises(ImportError, match=r"OR-Tools.*SciPy.*pip install 'pgmo\[exact\]'") as err:
        pgmo.solve(trace, method="exact", time_limit=1)
    assert isinstance(err.value, ExactSolverUnavailable)
    assert "method=" not in str(err.value) and ">=" not in str(err.value)  # for a person
    # The other methods do not need the optional solvers.
    assert pgmo.solve(trace, method="bestfit").is_valid()


@pytest.mark.parametrize("backend, hidden, needs", [
    ("cpsat", "ortools.sat.python.cp_model", "OR-Tools"),
    ("highs", "scipy.optimize", "SciPy"),
])
def test_missing_named_backend_says_which_package(monkeypatch, backend, hidden, needs):
    _hide(monkeypatch, hidden)
    trace = pgmo.Trace.from_tuples([(0, 1, 1)])
    with pytest.raises(ExactSolverUnavailable, match=rf"{needs}.*pip install 'pgmo\[exact\]'"):
        exact_offsets(trace, backend=backend)


@needs_highs
def test_auto_falls_back_to_highs_without_ortools(monkeypatch):
    _hide(monkeypatch, "ortools.sat.python.cp_model")
    trace = pgmo.Trace.from_tuples([(0, 4, 3), (1, 3, 2), (2, 5, 2), (3, 6, 3)])
    offsets, optimal, info = exact_offsets(trace, time_limit=5, warm=stacked(trace))
    assert info["backend"] == "highs"
    assert optimal and peak_of(trace, offsets) == brute_force_peak(trace)


def test_importing_pgmo_and_other_methods_do_not_load_the_solvers():
    code = ("import sys, pgmo\n"
            "t = pgmo.Trace.from_tuples([(0, 2, 4), (1, 3, 2)])\n"
            "pgmo.solve(t, method='bestfit')\n"
            "import pgmo.solver.exact\n"
            "print(sorted(m for m in ('ortools', 'scipy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@settings(max_examples=60, deadline=None)
@given(trace=traces(max_blocks=15, max_tick=12, max_size=30))
def test_pair_count_and_compaction_helpers(trace):
    lowers, uppers, sizes = trace.columns()
    pairs = exact.overlapping_pairs(lowers, uppers)
    expected = {(i, j) for i, j in itertools.combinations(range(len(trace)), 2)
                if trace[i].overlaps_in_time(trace[j])}
    assert sorted(pairs) == sorted(expected)
    assert exact.count_overlapping_pairs(lowers, uppers) == len(expected)
    loose = [2 * o + 1 for o in stacked(trace)]  # valid, with gaps everywhere
    tight = exact.compact(lowers, uppers, sizes, loose)
    assert pgmo.validate.find_conflict(trace.blocks, tight) is None
    assert all(t <= o for t, o in zip(tight, loose))
