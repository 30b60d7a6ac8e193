"""Plans: the peak comes from the offsets, invalid packings are refused when read."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import pgmo
from pgmo import Plan, PlanError, Trace, TraceFormatError, read_plan
from .benchmarks import BENCH, needs_bench


SOLUTIONS = sorted((BENCH / "minimalloc" / "solutions").glob("*.csv")) if BENCH else []

TRACE = Trace.from_tuples([("a", 0, 4, 8), ("b", 2, 6, 4), ("c", 4, 8, 8)])


def test_peak_is_recomputed_from_the_offsets():
    plan = Plan(TRACE, (0, 8, 0))
    assert plan.peak == 12 and plan.lower_bound == 12 and plan.ratio == 1.0
    worse = Plan(TRACE, (100, 8, 0))
    assert worse.peak == 108
    assert worse.ratio == pytest.approx(9.0)


def test_peak_from_file_ignores_any_claim_in_the_metadata(tmp_path):
    path = tmp_path / "plan.json"
    Plan(TRACE, (0, 8, 16)).write(path)
    doc = json.loads(path.read_text())
    doc["metadata"]["plan"]["peak"] = 1  # a lie: the offsets need 24 bytes
    path.write_text(json.dumps(doc))
    assert read_plan(path).peak == 24


def test_optimal_is_inferred_only_at_the_lower_bound():
    assert Plan(TRACE, (0, 8, 0)).optimal is True
    assert Plan(TRACE, (0, 8, 16)).optimal is None
    assert Plan(TRACE, (0, 8, 16), optimal=False).optimal is False


def test_offsets_are_plain_ints_even_from_numpy():
    plan = Plan(TRACE, np.array([0, 8, 0], dtype=np.int64))
    assert plan.offsets == (0, 8, 0)
    assert all(type(o) is int for o in plan.offsets)
    assert plan.validate() is plan


def test_wrong_number_of_offsets_is_refused():
    with pytest.raises(ValueError, match="2 offsets for 3 blocks"):
        Plan(TRACE, (0, 8))


def test_validate_names_both_colliding_blocks():
    plan = Plan(TRACE, (0, 4, 0))  # b sits inside a while both are live
    assert not plan.is_valid()
    with pytest.raises(PlanError, match=r"block id=a .* overlaps block id=b "):
        plan.validate()


@pytest.mark.parametrize("suffix", [".csv", ".json", ".json.gz"])
def test_write_then_read_plan_round_trips(tmp_path, suffix):
    plan = Plan(TRACE, (0, 8, 0), method="best", seconds=0.5)
    path = tmp_path / ("plan" + suffix)
    plan.write(path)
    back = read_plan(path)
    assert back.trace.blocks == TRACE.blocks
    assert back.offsets == plan.offsets and back.peak == 12
    assert back.method == "file"
    if suffix != ".csv":
        assert back.trace.metadata["plan"]["method"] == "best"
        assert back.trace.metadata["plan"]["peak"] == 12


def test_read_plan_rejects_an_invalid_packing_naming_both_blocks(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("id,lower,upper,size,offset\nx1,0,4,8,0\nx2,3,5,8,7\n")
    with pytest.raises(PlanError) as err:
        read_plan(path)
    message = str(err.value)
    assert "block id=x1 " in message and "block id=x2 " in message
    # Asked not to validate, it reads the file and reports the problem on request.
    plan = read_plan(path, validate=False)
    assert plan.peak == 15 and not plan.is_valid()


def test_read_plan_needs_an_offset_column(tmp_path):
    path = tmp_path / "trace.csv"
    pgmo.write_trace(TRACE, path)
    with pytest.raises(TraceFormatError, match="a plan needs offsets") as err:
        read_plan(path)
    assert err.value.field == "offset" and str(path) in str(err.value)


def test_solve_returns_validated_plans_for_every_method():
    from pgmo.solver.exact import ExactSolverUnavailable, resolve_backend

    for method in pgmo.METHODS:
        if method == "exact":
            try:
                resolve_backend("auto")
            except ExactSolverUnavailable:
                continue  # an optional extra
        plan = pgmo.solve(TRACE, method=method, time_limit=2)
        assert plan.method == method and plan.is_valid()
        assert plan.peak >= plan.lower_bound


@needs_bench
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_minimalloc_solutions_validate_at_their_file_name_peaks(path):
    expected = int(re.search(r"\.peak(\d+)\.csv$", path.name).group(1))
    plan = read_plan(path)  # validates
    assert plan.peak == expected
    assert plan.lower_bound <= plan.peak


@needs_bench
def test_minimalloc_solution_with_one_block_moved_is_refused(tmp_path):
    path = SOLUTIONS[0]
    trace, offsets = pgmo.formats.load(path)
    # Put block 0 where a block live at the same time sits.
    j = next(j for j in range(1, len(trace)) if trace[0].overlaps_in_time(trace[j]))
    offsets[0] = offsets[j]
    bad = tmp_path / "moved.csv"
    pgmo.write_trace(trace, bad, offsets=offsets)
    with pytest.raises(PlanError, match=rf"block id={trace[0].id} "):
        read_plan(bad)
