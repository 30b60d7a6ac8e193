"""Variable workloads (pgmo.workloads) through the pool: the footprint, the device syncs, the
capacity wall, in every re-planning mode, every block checked.

The runs are scaled down (a few thousand requests) and replayed on host
devices of 512-byte pages, so that the 2 MiB pages of a real driver do not
decide runs of a few MiB; python -m scripts.bench_footprint measures the full-size
runs on 2 MiB pages.  The limit is the one the footprint targets name: the
largest iteration's lower bound plus the long-lived blocks.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgmo import workloads
from pgmo.measure import footprint
from pgmo.measure.replay import replay_run

from .held_planner import HeldPlanner

#: Tests of what CuPy itself adds (its pool objects, its OutOfMemoryError); the rest run on
#: the pool's engine alone where CuPy is not installed (footprint.pgmo_pool).
needs_cupy = pytest.mark.skipif(not footprint.has_cupy(),
                                reason="needs CuPy (its pool objects, its OutOfMemoryError)")


MODES = [{"replan": "sync", "method": "bestfit"}, {"replan": "sync", "method": "best"},
         {"replan": "bestfit"}, {"replan": "background", "method": "bestfit"},
         {"replan": "background", "method": "best"}]
#: The members whose footprint target holds on the CPU model; serving misses it in its first
#: iteration (docs/footprint.md), and the recorded run is measured at full size by the bench.
HOLDING = ["lstm-random", "lstm-bucketed", "lstm-growing", "lstm-outliers", "cnn-resolutions"]
SMALL = {"lstm-random": {"scale": 0.05, "iterations": 10},
         "lstm-bucketed": {"scale": 0.05, "iterations": 10},
         "lstm-growing": {"scale": 0.05, "iterations": 12},
         "lstm-outliers": {"scale": 0.05, "iterations": 12},
         "serving": {"scale": 0.05, "iterations": 30},
         "cnn-resolutions": {"scale": 0.05, "iterations": 8}}


def small_run(name: str, seed: int):
    return workloads.make(name, seed=seed, **SMALL[name])


def limit_of(run) -> int:
    bounds = run.bounds()
    return max(bounds.largest + bounds.long_lived, bounds.physical)


def replay(run, capacity=None, **mode):
    options = {"time_limit": 0.5, "seed": 0, "page": 512, **mode}
    if options.get("method") is None:
        options.pop("method", None)
    pool = footprint.pgmo_pool(**options)(capacity)
    step = 0.002 if mode.get("replan") == "background" else 0.0
    try:
        return footprint.measure(run, pool, step_seconds=step), pool
    finally:
        pool.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "/".join(m.values()))
@pytest.mark.parametrize("name", HOLDING)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 16))
def test_a_variable_run_holds_near_its_limit_without_syncing_in_iterations(name, mode, seed):
    run = small_run(name, seed)
    result, pool = replay(run, **mode)
    assert result.completed and result.corrupted == 0, result.error
    assert result.peak <= 1.10 * limit_of(run)
    assert result.most_syncs_inside() == 0  # no cudaFree, no sync inside an iteration
    assert max(result.releases_inside) == 0  # no unmap, no trim either
    st = result.stats
    # one device sync before the boundary's one release (rule 4 of pgmo/engine/memory.py);
    # the page heap's old mappings may go at that boundary too, after a sync of their own
    # (rule 1), when the plan lands there
    tidies = st.heap_kind == "page heap (recycled pages)"
    assert result.most_syncs_at_a_boundary() <= (2 if tidies else 1)
    assert result.raw_share(5) == 0.0  # nothing reaches cudaMalloc
    assert st.stock_bytes == 0
    # A background plan is made in the worker process (at the lowest priority) and lands
    # at a later boundary: on a loaded machine a run this short can end before it does.
    late = mode.get("replan") == "background" and st.planned_requests == 0
    assert st.arena_kind == "reserved range" or (late and st.arena_kind == "none")


@pytest.mark.parametrize("name", ["lstm-bucketed", "lstm-random"])
def test_a_plan_that_never_lands_costs_no_more_memory_than_the_iterations_need(name):
    """Background plans can be late (a busy main thread starves the planner's): the
    iterations that wait for one are served by the heap, whose idle memory goes back at
    each boundary, so the peak stays near the limit however late the plan is.  Here it
    never lands: the planner is held for the whole run."""
    run = small_run(name, 0)
    pool = footprint.pgmo_pool(time_limit=0.5, seed=0, page=512, replan="background")(None)
    # no best-fit at the boundary for a small log: every plan is the held planner's
    getattr(pool, "engine", pool).planner.sync_blocks = 0
    try:
        with HeldPlanner(pool):
            result = footprint.measure(run, pool)
        assert result.completed and result.corrupted == 0, result.error
        assert result.stats.planned_requests == 0  # no plan landed
        assert result.peak <= 1.10 * limit_of(run)
        assert result.most_syncs_inside() == 0 and max(result.releases_inside) == 0
        assert result.most_syncs_at_a_boundary() <= 1
    finally:
        pool.close()


@pytest.mark.parametrize("name, full", [("lstm-bucketed", False), ("serving", True)])
def test_it_completes_on_every_device_from_115_percent_of_its_limit(name, full):
    """Serving at full size (ResNet-50, 2 MiB pages): scaled down, its online first
    iterations fragment more than a 1.15x device allows (docs/footprint.md)."""
    run = workloads.make(name, seed=0) if full else small_run(name, 1)
    limit = limit_of(run)
    for factor in (1.15, 1.5, 2.0, 4.0):
        result, _ = replay(run, int(limit * factor), replan="sync", method="bestfit",
                           **({"page": 2 << 20} if full else {}))
        assert result.completed and result.corrupted == 0, (factor, result.error)
        assert result.peak <= int(limit * factor)


def test_a_larger_batch_after_the_plan_completes_wherever_cupys_pool_does():
    """Serving whose largest batch comes after the plan (seed 1): that iteration is placed
    online in the arena's gaps, which needs 1.25x its limit (docs/footprint.md); CuPy's
    pool needs more, and pgmo never fails where it completes."""
    run = workloads.make("serving", seed=1)
    limit = limit_of(run)
    for factor in (1.25, 1.5, 2.0):
        capacity = int(limit * factor)
        mine, _ = replay(run, capacity, replan="sync", method="bestfit", page=2 << 20)
        theirs = footprint.measure(run, footprint.stock_pool(capacity), timeline=False)
        assert mine.completed or not theirs.completed, factor
        assert mine.completed, (factor, mine.error)


@needs_cupy
def test_a_device_too_small_is_cupys_out_of_memory_error_with_the_numbers():
    from cupy.cuda.memory import OutOfMemoryError

    run = small_run("lstm-outliers", 0)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit", page=512)(limit_of(run) // 2)
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating [\d,]+ bytes \("
                                               r"allocated so far: [\d,]+ bytes\)"):
        replay_run(run, pool, write=False)
    assert pool.stats().used_bytes == 0  # every block handed out was checked and freed
    pool.close()


def test_sync_runs_are_deterministic():
    run = small_run("lstm-random", 3)
    first, _ = replay(run, replan="sync", method="bestfit")
    second, _ = replay(run, replan="sync", method="bestfit")
    assert first.peak == second.peak and first.held == second.held
    assert first.stats.reoptimizations == second.stats.reoptimizations


def test_the_arena_follows_the_largest_iteration_that_ran_and_grows_in_place():
    """Re-plans only when an iteration larger than the plan's comes; the arena is never more
    than 1.1x the largest plan made for an iteration that ran, and it never moves."""
    run = small_run("lstm-growing", 0)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit", page=512)(None)
    plans, arenas = [], []

    def on_install(schedule):
        plans.append(schedule.arena_size)

    engine = getattr(pool, "engine", pool)  # the engine alone where CuPy is not installed
    engine.on_install = on_install
    hot = engine.hot
    bases = set()
    events = list(run.events())

    def watch(k):
        arena = hot.arena
        if arena is not None:
            arenas.append(arena.size)
            bases.add(arena.ptr)

    result = pgmo_replay(run, pool, watch)
    pool.close()
    assert result["corrupted"] == 0
    assert plans == sorted(plans) and len(plans) >= 3  # growing lengths: growing plans
    largest = max(plans)
    assert max(arenas) <= 1.1 * largest + 512
    assert len(bases) == 1  # one reserved range, grown in place: no second arena, no copy
    assert events  # the run was replayed whole


def pgmo_replay(run, pool, on_event):
    return replay_run(run, pool, write=False, on_event=on_event)


def test_recurring_shapes_get_plans_of_their_own():
    """Sorted batches: each bucket that recurs gets a plan, and fewer requests are placed off
    plan than with one plan for all."""
    run = workloads.make("lstm-bucketed", seed=0)
    with_shapes, _ = replay(run, replan="sync", method="bestfit", page=2 << 20)
    without, _ = replay(run, replan="sync", method="bestfit", shape_plans=False, page=2 << 20)
    assert with_shapes.completed and without.completed
    assert with_shapes.stats.shape_plans >= 2 and with_shapes.stats.shape_iterations >= 2
    assert without.stats.shape_plans == 0
    assert with_shapes.stats.departed_requests < 0.6 * without.stats.departed_requests
    assert with_shapes.peak <= 1.02 * without.peak


def test_the_background_planner_survives_a_varying_run(caplog):
    """The planner thread once failed with an IndexError when a log planned for one profile
    was folded into another (sizes logged as "as planned" beyond its end); the engine now fills
    a log from the schedule its iteration followed before the planner sees it."""
    run = small_run("lstm-random", 5)
    caplog.set_level(logging.WARNING, logger="pgmo.pool")
    pool = footprint.pgmo_pool(replan="background", method="best", page=512, time_limit=0.3)(
        int(limit_of(run) * 1.25))
    result = footprint.measure(run, pool)  # no compute between iterations: plans land late
    st = result.stats
    getattr(pool, "engine", pool).planner.shutdown()  # (the engine alone without CuPy)
    assert result.completed and result.corrupted == 0
    assert st.planner_failures == 0 and st.solve_failures == 0
    assert "planner thread failed" not in caplog.text


def test_a_log_planned_for_another_profile_is_filled_from_its_own():
    import pgmo
    from pgmo.engine.profiles import Log, absorb, filled

    short = pgmo.Trace.from_tuples([(0, 0, 2, 1024), (1, 1, 3, 512)])
    planned_for = pgmo.Trace.from_tuples([(i, i, i + 2, 2048) for i in range(5)])
    log = Log([0, 1, 2, 3, 4], [2, 3, 5, 6, 7], [0, 0, 0, 4096, 0])  # 0: "as planned"
    own = filled(log, planned_for)
    assert own.sizes == [2048, 2048, 2048, 4096, 2048]
    profile, varying = absorb(short, own)  # once an IndexError here
    assert varying and profile.lower_bound() > short.lower_bound()


def test_a_block_alive_at_a_boundary_keeps_its_granules_when_the_arena_is_trimmed():
    """A departed iteration grows the reserved arena and places a block in the new part; that
    block outlives the iteration (a loss kept for logging).  The boundary trims the arena
    back toward its plan, but never under a live block: its memory stays mapped, written and
    checked, until it is freed (a stale access to an unmapped granule would fault)."""
    from pgmo.measure.hosts import host_engine
    from pgmo.measure.replay import Checker

    MiB = 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit")
    device = engine.host_device
    checker = Checker(host=True, device=device, write=True)
    with engine.iteration():  # profiled: 1 MiB, then 2 MiB
        for size in (MiB, 2 * MiB):
            checker.free(checker.alloc(engine, size))
    assert engine.hot.arena is not None and engine.hot.arena.size == 2 * MiB
    with engine.iteration():  # larger than planned: placed off plan, the arena grows
        kept = checker.alloc(engine, 24 * MiB)  # outlives the iteration
        checker.free(checker.alloc(engine, MiB))
    arena = engine.hot.arena
    lo = kept[0].ptr - arena.ptr
    assert lo + 24 * MiB <= arena.size  # still mapped under the live block
    assert device.holds(kept[0].ptr, 24 * MiB)
    with engine.iteration():  # the next boundary too
        checker.free(checker.alloc(engine, MiB))
    assert device.holds(kept[0].ptr, 24 * MiB)
    assert checker.free(kept)  # its pattern intact, its memory held until now
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()


def test_without_virtual_memory_a_refused_larger_arena_leaves_the_old_one_in_use():
    """On a device without virtual memory management the arena is a cudaMalloc; when a
    larger plan's arena is refused, the pool keeps an arena of the size it had and that
    plan (the larger iterations leave it and are placed in its gaps), and takes the larger
    one once memory is there."""
    from pgmo.measure.hosts import host_engine
    from pgmo.measure.replay import Checker

    MiB = 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit", vmm=False, page=512)
    checker = Checker(host=True, device=engine.host_device)
    with engine.iteration():  # profiled: 2 MiB, then 2 MiB
        for size in (2 * MiB, 2 * MiB):
            checker.free(checker.alloc(engine, size))
    assert engine.hot.arena.size == 2 * MiB
    with engine.iteration():  # larger: a 3 MiB plan, whose arena the limit refuses
        for size in (3 * MiB, 3 * MiB):
            checker.free(checker.alloc(engine, size))
        engine.set_limit(engine.total_bytes() - 3 * MiB + MiB // 2)
    st = engine.stats()
    # the idle arena went back before the larger one was asked for (release before taking);
    # refused, an arena of its size was taken again, and its plan kept: nothing stranded
    assert engine.hot.arena.size == 2 * MiB and st.arena_failures == 1
    assert st.planned_peak == 2 * MiB and engine.mode == "optimized"
    before = st.planned_requests
    with engine.iteration():  # served from that arena
        for size in (2 * MiB, 2 * MiB):
            checker.free(checker.alloc(engine, size))
    assert engine.stats().planned_requests == before + 2
    engine.set_limit(0)  # memory is there again: the larger plan at the next boundary
    with engine.iteration():
        checker.free(checker.alloc(engine, 3 * MiB))
    assert engine.hot.arena.size == 3 * MiB and engine.stats().planned_peak == 3 * MiB
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()


def checked_iteration(engine, checker, sizes):
    """One iteration of ``engine``: a block of each size, written, checked and freed."""
    with engine.iteration():
        for size in sizes:
            assert checker.free(checker.alloc(engine, size))


def shape_plan(offsets, size):
    """A shape's plan as the planner would compile it: ``len(offsets)`` blocks of ``size``
    bytes one after the other, at these offsets."""
    import pgmo
    from pgmo.engine.schedule import compile_schedule

    n = len(offsets)
    profile = pgmo.Trace.from_tuples([(i, i, i + 1, size) for i in range(n)])
    return compile_schedule(profile, pgmo.Plan(profile, tuple(offsets)))


def test_a_shape_plan_that_lands_inside_an_iteration_longer_than_its_log_is_not_followed():
    """A recurring shape's plan is made in the background and may land after an iteration
    began, its log already sized for the plans there were.  Followed from that iteration's
    first request, a plan with more requests than the log has room for would fail half-way
    through a hand-out (the block counted, its free never armed).  The iteration follows the
    main plan instead (and departs from it); the shape's plan is followed from the next."""
    from pgmo.measure.hosts import host_engine
    from pgmo.measure.replay import Checker

    MiB = 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit")
    checker = Checker(host=True, device=engine.host_device, write=True)

    def iteration(sizes):
        checked_iteration(engine, checker, sizes)

    for _ in range(3):
        iteration([MiB, MiB])
    engine.shapes._plans[8192] = shape_plan([0, 0], 8192)  # a shape planned before: iterations
    engine.begin_iteration()                          # begin by choosing their plan
    log_room = len(engine.hot.log_arrays[0])
    engine.shapes._plans[4096] = shape_plan([0] * (log_room + 40), 4096)  # lands now
    for _ in range(log_room + 40):
        assert checker.free(checker.alloc(engine, 4096))
    engine.end_iteration()
    st = engine.stats()
    assert st.departures >= 1 and st.shape_iterations == 0
    iteration([4096] * (log_room + 40))  # the next iteration follows the shape's plan
    assert engine.stats().shape_iterations == 1
    assert engine.stats().departures == st.departures
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()


def test_a_ctrl_c_while_the_first_request_picks_the_plan_leaves_the_pick_to_the_next():
    """The first request of a varying workload's iteration picks its plan; a Ctrl-C that
    lands before the pick is installed leaves the iteration still to pick (the next request
    picks, through the engine), never serving from the plan installed before."""
    from pgmo.measure.hosts import host_engine
    from pgmo.measure.replay import Checker

    MiB = 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit")
    checker = Checker(host=True, device=engine.host_device, write=True)
    for sizes in ([MiB, MiB],) * 3 + ([2 * MiB, MiB],) * 3:  # a second shape, planned
        checked_iteration(engine, checker, sizes)
    follow, calls = engine._follow, []

    def cut_short(schedule):
        calls.append(schedule)
        if len(calls) == 1:
            raise KeyboardInterrupt
        follow(schedule)

    with engine.iteration():
        assert engine.state.choosing
        engine._follow = cut_short
        with pytest.raises(KeyboardInterrupt):
            checker.alloc(engine, MiB)
        assert engine.state.choosing  # not picked: the next request picks
        for size in (MiB, MiB):
            assert checker.free(checker.alloc(engine, size))
    assert len(calls) == 2 and calls[0] is calls[1]
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()


def test_a_shape_plan_that_lands_after_the_boundarys_fit_is_not_followed_into_a_trim():
    """A reserved arena may be trimmed inside an iteration (``free_all_blocks``, a full
    device) down to the plans its boundary fitted.  A shape's plan that landed after that
    fit is not covered, so it is followed from the next iteration, not this one: a trim
    inside this one could unmap the end it would hand out."""
    from pgmo.measure.hosts import host_engine
    from pgmo.measure.replay import Checker

    KiB, MiB = 1 << 10, 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit", page=512)
    checker = Checker(host=True, device=engine.host_device, write=True)

    def iteration(sizes):
        checked_iteration(engine, checker, sizes)

    for _ in range(3):
        iteration([MiB, MiB])
    engine.shapes._plans[4096] = shape_plan([0], 4096)  # iterations begin by choosing
    engine.shapes._plans[8192] = shape_plan([0, MiB], 16 * KiB)  # 1 MiB + 16 KiB
    iteration([MiB, MiB])  # the boundary fits the arena to it
    engine.shapes.forget(8192)
    iteration([MiB, MiB])  # the arena stays; the plans it is fitted to no longer need it
    assert engine.hot.arena.size > MiB
    engine.begin_iteration()
    late = shape_plan([0, MiB], 16 * KiB)
    engine.shapes._plans[16384] = late  # lands now, after the boundary's fit
    a = checker.alloc(engine, 16 * KiB)
    assert engine.current is not late
    assert checker.free(a)
    engine.free_all_blocks()  # trims the arena to the plans fitted
    b = checker.alloc(engine, 16 * KiB)
    assert engine.host_device.holds(b[0].ptr, 16 * KiB)
    assert checker.free(b)
    engine.end_iteration()
    iteration([16 * KiB, 16 * KiB])  # followed from the next iteration
    assert engine.current is late
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()


def test_the_addresses_of_plans_no_longer_followed_are_not_kept_for_ever():
    """More recurring shapes than the shape book keeps: evicted shapes come back and are
    planned again; the arena addresses computed for the plans followed stay bounded."""
    from pgmo.measure.hosts import host_engine

    KiB = 1 << 10
    engine = host_engine(warmup=0, replan="sync", method="bestfit", page=512)
    most = 0
    for _ in range(25):
        for k in range(12):
            with engine.iteration():
                blocks = [engine.malloc((k + 1) * 4 * KiB)]
                blocks += [engine.malloc(512 * KiB if j == k else 8 * KiB) for j in range(12)]
                del blocks
        most = max(most, len(engine._addresses))
    assert engine.shapes.planned > 12  # shapes were evicted and planned again
    assert most <= 16
    engine.close()
