"""The engine's modes and plans: warm-up, the profiled iteration on the event clock,
the plan installed at a boundary, ``optimize``, ``adopt`` and ``reset``.

Tests pgmo.engine.core (its iterations) and pgmo.engine.plan_choice.
"""

from __future__ import annotations

import pytest

from pgmo.engine import pool_options

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)


def test_profile_follows_the_event_clock(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    prof = c.engine.profile
    rows = [(b.id, b.lower, b.upper, b.size) for b in prof.blocks]
    # ticks: a0=0 a1=1 f0=2 a2=3 f1=4 a3=5 f2=6 f3=7
    assert rows == [(0, 0, 2, 1024), (1, 1, 4, 2048), (2, 3, 6, 3072), (3, 5, 7, 512)]
    assert c.engine.plan is not None and c.engine.mode == "optimized"


def test_warmup_then_profile_then_arena(hot_path):
    c = Checked(hot_path, warmup=2)
    e = c.engine
    modes = []
    for _ in range(5):
        modes.append(e.mode)
        c.iteration(HOT)
    # two warm-up iterations, one profiled, then the plan
    assert modes == ["warmup", "warmup", "profiling", "optimized", "optimized"]
    st = e.stats()
    assert st.profiled_requests == 12 and st.planned_requests == 8
    assert st.departed_requests == 0 and st.departures == 0 and st.reoptimizations == 0
    assert st.arena_bytes >= e.plan.peak == e.plan.lower_bound == 2048 + 3072
    assert st.plan_method == "bestfit" and st.iteration_source == "marked"


def test_hot_iterations_reuse_one_arena_and_allocate_nothing(hot_path):
    c = Checked(hot_path, warmup=1)
    for _ in range(2):
        c.iteration(HOT)
    raw, stock = len(c.arena_alloc.taken()), c.fallback.calls
    assert stock == 0  # warm-up and profiling took memory of their own, not the stock pool's
    arena = c.engine.hot.arena
    for _ in range(10):
        c.iteration(HOT)
    assert (len(c.arena_alloc.taken()), c.fallback.calls) == (raw, 0)
    assert c.engine.hot.arena is arena and len(c.arenas_taken()) == 1


def test_optimize_forces_a_plan_after_warmup_only(hot_path):
    c = Checked(hot_path, warmup=5)
    c.iteration(HOT)
    e = c.engine
    options = e.options
    assert e.plan is None and e.mode == "warmup"
    plan = e.optimize()
    assert plan.peak >= plan.lower_bound > 0
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 4
    assert e.options is options and e.options.warmup == 5  # the user's options stay


def test_an_unknown_replan_mode_is_refused_with_the_modes_to_choose_from():
    with pytest.raises(ValueError, match="unknown replan mode 'later'; choose one of "
                                         "background, sync, bestfit"):
        pool_options(replan="later")


def test_optimize_in_the_middle_of_an_iteration_takes_effect_at_the_next_boundary(hot_path):
    ops = HOT + [70_000, ("f", 4)]
    c = Checked(hot_path, warmup=0)
    c.iteration(ops)
    e = c.engine
    first = e.plan
    e.begin_iteration()
    arena = e.hot.arena
    blocks = c.run(ops[:3])  # two requests and a free, then the user asks for a new plan
    plan = e.optimize()
    assert plan is not first and e.plan is plan  # solved now...
    assert e.schedule.plan is first  # ...but this iteration keeps the plan it started with
    a2 = c.malloc(3000)  # the rest of the iteration, as ops[3:] does it
    c.free(blocks[1])
    blocks.clear()
    a3 = c.malloc(500)
    c.free(a2)
    c.free(a3)
    del a2, a3
    a4 = c.malloc(70_000)
    assert e.hot.arena is arena  # no arena change while the iteration runs
    c.free(a4)
    del a4
    e.end_iteration()
    st = e.stats()
    assert st.departed_requests == 0 and st.planned_requests == 5
    c.iteration(ops)
    assert e.schedule.plan is plan and e.stats().reoptimizations == 0


def test_an_adopted_plan_waits_for_the_warmup_and_says_so(hot_path):
    src = Checked(hot_path, warmup=0)
    src.iteration(HOT)
    profile, plan = src.engine.profile, src.engine.plan
    c = Checked(hot_path, warmup=1)
    e = c.engine
    e.adopt(profile, plan)
    assert e.mode == "warmup" and e.plan is plan
    c.iteration(HOT)
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 4 and e.stats().profiled_requests == 4


def test_reset_inside_a_planned_iteration_profiles_again(hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    c.iteration(HOT)  # profiled
    assert e.mode == "optimized"
    e.begin_iteration()
    a, b = c.malloc(1000), c.malloc(2000)  # planned
    e.reset()  # the plan goes half-way through the iteration
    c.free(a)
    x = c.malloc(3000)
    c.free(b)
    c.free(x)
    del a, b, x
    e.end_iteration()  # half a planned iteration is no profile
    assert e.plan is None and e.mode == "profiling"
    c.iteration(HOT)
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 2 + len([op for op in HOT if isinstance(op, int)])
