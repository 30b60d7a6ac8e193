"""CuPy's pool queries and the engine's views: each waits for the engine, the peaks,
the mode, the stats' old names.

Tests pgmo.engine.pool_queries and pgmo.engine.report.
"""

from __future__ import annotations

import pytest

from pgmo.units import round_size

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)
from .threads import CheckedThread


#: The queries that read or change what the engine holds: each waits for the engine.
LOCKED_QUERIES = ["stats", "used_bytes", "free_bytes", "total_bytes", "n_free_blocks",
                  "reset_peak_stats", "free_all_blocks"]


@pytest.mark.parametrize("query", LOCKED_QUERIES)
def test_a_query_waits_while_another_thread_holds_the_engine(hot_path, query):
    """A query answered in the middle of a malloc or free on another thread would read
    half-updated counters (or a set changing size under it)."""
    import threading

    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    asked, answered = threading.Event(), threading.Event()

    def ask():
        asked.set()
        getattr(e, query)()
        answered.set()

    with e._lock:  # as a malloc or a free on another thread holds it
        thread = CheckedThread(target=ask, name=f"{query}-asker")
        thread.start()
        assert asked.wait(30)
        assert not answered.wait(0.2), f"{query}() answered while the engine was held"
    thread.join(30)
    assert answered.is_set()


def test_departed_requests_keep_their_old_name_for_one_release(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
    st = c.engine.stats()
    assert st.departed_requests == 3
    assert st.fallback_requests == 3 and st.as_dict()["fallback_requests"] == 3
    assert st.numbers()["departed_requests"] == 3


def test_mode_stays_optimized_when_the_idle_arena_is_released(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.free_all_blocks()
    st = e.stats()
    assert st.arena_bytes == 0 and st.total_bytes == 0
    assert e.mode == "optimized"  # the plan stays; the arena comes back at the boundary
    c.iteration(HOT)
    st = e.stats()
    assert st.arena_bytes > 0 and st.planned_requests == 4


def test_peak_stats_and_their_reset(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    assert e.stats().peak_used_bytes == 2048 + 3072  # blocks 1 and 2 live together
    big = e.malloc(100_000)
    del big
    st = e.stats()
    assert st.used_bytes == 0 and st.peak_used_bytes == round_size(100_000)
    assert st.peak_total_bytes >= st.total_bytes > 0
    e.reset_peak_stats()
    st = e.stats()
    assert st.peak_used_bytes == st.used_bytes == 0
    assert st.peak_total_bytes == st.total_bytes
    c.iteration(HOT)  # from the arena now
    assert e.stats().peak_used_bytes == 2048 + 3072


def test_served_by_plan_tells_the_planned_iterations_from_the_others(hot_path):
    """What a measurement splits a run by: the iterations a plan served, and the rest
    (before the plan, and those that left it), each read after its end."""
    c = Checked(hot_path, warmup=1)
    e = c.engine
    assert not e.served_by_plan  # no iteration yet
    served = []
    for ops in (HOT, HOT, HOT):  # warm-up, profiled, planned
        c.iteration(ops)
        served.append(e.served_by_plan)
    assert served == [False, False, True]
    assert e.stats().planned_requests == 4
    e.begin_iteration()
    blocks = c.run(HOT[:2])
    assert e.served_by_plan  # so far on plan
    blocks.append(c.malloc(9000))  # larger than planned: off plan from here on
    assert not e.served_by_plan
    del blocks
    c.live.clear()
    e.end_iteration()
    assert not e.served_by_plan and e.stats().departed_requests >= 1
    for _ in range(2):  # the merged plan covers it again
        c.iteration(HOT)
    assert e.served_by_plan
