"""The footprint bench's figures a reader compares: the peak of the iterations no plan served
against that of the planned ones, and a small workload's smallest device in whole pages.

Tests the split and the page search of :mod:`pgmo.measure.footprint`, and the tables and
targets of ``python -m scripts.bench_footprint`` (its small workloads included).
"""

from __future__ import annotations

import re

from pgmo import bundled, workloads
from pgmo.measure import footprint
from pgmo.runs import run_from_iteration
from scripts import bench_footprint
from scripts.footprint_workloads import PAGE, SMALL, small_goal

MIB = 2 ** 20


def alexnet_run(iterations: int):
    trace = bundled.load("h100-alexnet-train-b32")
    grads = [b.size for b in trace.blocks if b.upper is None]
    return run_from_iteration(trace, iterations, setup=grads, state=grads)


def test_the_unplanned_and_the_planned_peaks_make_the_whole_runs():
    run = alexnet_run(5)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit")(None)
    mine = footprint.measure(run, pool)
    pool.close()
    assert mine.completed
    # warm-up and profiling are served online; the plan serves every iteration after them
    assert mine.served == [False, False, True, True, True]
    assert mine.peak == max(mine.peak_unplanned, mine.peak_planned)
    assert mine.peak_planned <= 1.05 * run.lower_bound_rounded()
    # the split covers every event: each part is at least what its iterations held
    begins = [k for k, (kind, _) in enumerate(run.events()) if kind == "begin"]
    assert mine.peak_unplanned >= max(mine.held[:begins[2]])
    assert mine.peak_planned == max(mine.held[begins[2]:])
    # CuPy's pool plans nothing: no split
    stock = footprint.measure(run, footprint.stock_pool())
    assert stock.served == [] and stock.peak_unplanned is None and stock.peak_planned is None


def test_a_run_cut_short_splits_its_peak_too():
    run = alexnet_run(4)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit")(run.lower_bound_rounded() // 2)
    mine = footprint.measure(run, pool)
    pool.close()
    assert not mine.completed
    assert mine.served == [False]  # the first iteration, open when the device was full
    assert mine.peak == mine.peak_unplanned and mine.peak_planned is None


def test_a_small_workloads_smallest_device_is_searched_in_whole_pages():
    member, options, _ = SMALL["small-cnn-infer-b1"]
    run = workloads.make(member, **{**options, "iterations": 5})
    limit = bench_footprint.Workload("small", run, "", False).limits[0]
    assert limit < bench_footprint.SMALL_LIMIT
    assert small_goal(limit) == (-(-limit // PAGE) + 1) * PAGE
    make = footprint.pgmo_pool(replan="sync", method="bestfit")
    smallest = footprint.smallest_capacity(run, make, run.bounds().physical, 4 * limit,
                                           **bench_footprint.search(limit))
    assert smallest is not None and smallest % PAGE == 0
    assert smallest <= small_goal(limit)  # the small workloads' target
    assert not footprint.completes(run, make, smallest - PAGE)  # exact, to the page
    # CuPy's pool needs more: a cached chunk per size class
    stock = footprint.smallest_capacity(run, footprint.stock_pool, run.bounds().physical,
                                        4 * limit, **bench_footprint.search(limit))
    assert stock is not None and stock % PAGE == 0 and stock > smallest


def test_the_bench_prints_the_split_and_judges_a_small_workload_by_its_pages():
    args = bench_footprint.parse_args(["--only", "small-cnn-infer-b1", "--modes", "sync/bestfit",
                                       "--heaps", "page heap"])
    [w] = bench_footprint.all_workloads(args)
    w.run = workloads.make("serving", **{**SMALL[w.name][1], "iterations": 5})
    row = bench_footprint.bench(w, args)
    cols = bench_footprint.columns(args)
    text = "\n".join(bench_footprint.tables([row], cols))
    [whole] = re.findall(r"^\| small-cnn-infer-b1 \| repeating \| [\d.]+ \([\d.]+\) \| "
                         r"[\d.]+ \| ([\d.]+) \|$", text, re.M)
    [(unplanned, n_unplanned, planned, n_planned)] = re.findall(
        r"^\| small-cnn-infer-b1 \| ([\d.]+) \((\d+)\) / ([\d.]+) \((\d+)\) \|$", text, re.M)
    assert (int(n_unplanned), int(n_planned)) == (2, 3)
    assert float(whole) == max(float(unplanned), float(planned))
    assert re.search(r"\| small-cnn-infer-b1 \| [\d.]+ \([\d.]+ MiB\) \| y+; [\d.]+ \([\d.]+ "
                     r"MiB\) \|", text)
    goal = small_goal(row["limit"])
    [line] = bench_footprint.verdicts([row], cols)
    assert row["modes"][cols[0]]["smallest"] <= goal and "every target met" in line
    # a device a page above the goal is a miss, named with the goal in MiB
    row["modes"][cols[0]]["smallest"] = goal + PAGE
    [line] = bench_footprint.verdicts([row], cols)
    assert f"smallest device <= the limit in pages + a page ({goal / MIB:.1f} MiB)" in line
    assert "NOT met" in line
