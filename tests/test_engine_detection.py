"""Iterations nobody marks: a repeating loop found and optimized, marks that replace
a detected period, the warning when no loop is found and where it points.

Tests pgmo.engine.loop_watch and pgmo.engine.detect, through the engine.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

import pytest

from pgmo.engine import PgmoWarning, reference_handout

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)


# -- iterations nobody marks ---------------------------------------------------------
def loop(c, repeats, ops=HOT, keep=None):
    """A training loop that never calls begin_iteration: only mallocs and frees."""
    for _ in range(repeats):
        blocks = c.run(ops)
        if keep is not None:
            keep.append(blocks)


def test_a_repeating_loop_is_found_and_optimized_without_marks(hot_path):
    c = Checked(hot_path, warmup=1)
    e = c.engine
    loop(c, 200)
    st = e.stats()
    assert st.iteration_source == "detected (every 4 requests)"
    assert e.mode == "optimized"
    assert st.planned_requests > 500  # most of the loop now comes from the arena
    assert st.departures == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning about missing marks
        loop(c, 10)


def test_marking_iterations_replaces_a_detected_period(hot_path):
    c = Checked(hot_path, warmup=0)
    loop(c, 100)
    e = c.engine
    assert e.stats().iteration_source.startswith("detected")
    c.iteration(HOT)
    c.iteration(HOT)
    st = e.stats()
    assert st.iteration_source == "marked"
    assert e.profile is not None and len(e.profile) == 4


def test_marking_iterations_drops_the_detected_plan_at_once(hot_path):
    c = Checked(hot_path, warmup=0)
    loop(c, 100)
    e = c.engine
    assert e.mode == "optimized" and e.plan is not None
    e.begin_iteration()  # the user's first iteration is profiled, not served by that plan
    assert e.mode == "profiling" and e.plan is None
    c.run(HOT)
    e.end_iteration()


def test_a_detected_period_whose_iterations_keep_departing_is_dropped(hot_path, caplog):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    loop(c, 100)
    assert e.stats().iteration_source == "detected (every 4 requests)"
    departures = e.stats().departures

    def growing(k):  # its first request is larger than any plan made so far
        return [HOT[0] + 4096 * k] + HOT[1:]

    with caplog.at_level(logging.INFO, logger="pgmo.pool"):
        for k in (1, 2, 3):
            c.run(growing(k))
            # The iteration that just ran ends with the next request.
            assert e.stats().iteration_source == "detected (every 4 requests)"
        assert e.stats().departures == departures + 3
        assert "keeps departing" not in caplog.text
        c.run(HOT)  # ends the third departing iteration in a row: the period goes
    assert e.stats().iteration_source == "none"
    assert e.plan is None and e.mode == "fallback"
    assert "detected iteration of 4 requests keeps departing from its plan" in caplog.text
    loop(c, 100)  # and the loop is looked for again
    assert e.stats().iteration_source == "detected (every 4 requests)"


def test_the_request_that_drops_a_period_is_watched_not_counted_in_the_old_iteration(
        hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    loop(c, 100)
    for k in (1, 2, 3):  # three departing iterations in a row
        c.run([HOT[0] + 4096 * k] + HOT[1:])
    before = e.stats()
    c.run([HOT[0]])  # its request ends the third one, and the period goes
    after = e.stats()
    assert after.iteration_source == "none" and after.requests == before.requests + 1
    # unmarked and watched again, not a request of the iteration that ended
    assert (after.profiled_requests, after.departed_requests, after.planned_requests,
            after.pinned_requests) == (before.profiled_requests, before.departed_requests,
                                       before.planned_requests, before.pinned_requests)


def test_no_loop_and_no_marks_warns_once_with_the_fix(hot_path):
    c = Checked(hot_path, warn_after=50)
    sizes = iter(range(1, 10 ** 6))  # never repeats
    with pytest.warns(PgmoWarning, match=r"found no repeating loop.*with pool\.iteration\(\)") \
            as caught:
        for _ in range(200):
            c.run([next(sizes) * 512, ("f", 0)])
    assert len(caught) == 1
    assert c.engine.stats().iteration_source == "none"
    assert c.engine.stats().planned_requests == 0


def test_detection_off_still_warns(hot_path):
    c = Checked(hot_path, warn_after=20, detect_iterations=False)
    with pytest.warns(PgmoWarning, match="loop detection is off") as caught:
        loop(c, 40)
    assert "found no repeating loop" not in str(caught[0].message)
    assert c.engine.stats().planned_requests == 0


def unique_requests(c, n):
    """``n`` requests of sizes that never repeat (no loop to find), each freed at once."""
    for k in range(1, n + 1):
        c.run([k * 512, ("f", 0)])


@pytest.mark.parametrize("detect", [True, False])
def test_mode_is_fallback_while_no_iteration_is_marked_or_found(hot_path, detect):
    c = Checked(hot_path, warmup=1, detect_iterations=detect)
    e = c.engine
    assert e.mode == e.stats().mode == "warmup"  # no request yet: what the next iteration does
    unique_requests(c, 100)
    assert e.mode == e.stats().mode == "fallback"
    modes = []
    for _ in range(3):  # the user starts marking iterations: the usual modes
        e.begin_iteration()
        modes.append(e.mode)
        c.run(HOT)
        e.end_iteration()
        modes.append(e.mode)
    assert modes == ["warmup", "profiling", "profiling", "optimized", "optimized", "optimized"]
    unique_requests(c, 10)  # outside the marked iterations: still the next one's mode
    assert e.mode == e.stats().mode == "optimized"


def test_a_detected_loop_leaves_fallback_and_is_optimized(hot_path):
    c = Checked(hot_path, warmup=1)
    e = c.engine
    seen = []
    for _ in range(40):
        blocks = []
        for op in HOT:  # after every malloc and free
            if isinstance(op, int):
                blocks.append(c.malloc(op))
            else:
                c.free(blocks[op[1]])
                blocks[op[1]] = None
            seen.append((e.mode, e.stats().iteration_source))
    assert seen[0] == ("fallback", "none")  # watching: no loop found yet
    # Fallback exactly until the loop is found, from then on the usual modes.
    assert all((mode == "fallback") == (source == "none") for mode, source in seen)
    assert seen[-1] == ("optimized", "detected (every 4 requests)")


@pytest.mark.parametrize("entry", ["engine", "pool", "pool with hooks"])
def test_unmarked_warning_names_the_users_call(hot_path, entry, monkeypatch):
    from pgmo.measure.hosts import host_engine, host_pool

    if hot_path is reference_handout().HotPath:
        monkeypatch.setenv("PGMO_PURE_PYTHON", "1")
    if entry == "engine":
        allocator = host_engine(warn_after=10)
        engine = allocator
    else:
        pytest.importorskip("cupy")
        allocator = host_pool(warn_after=10)
        engine = allocator.engine
    assert type(engine.hot) is hot_path
    hooks = contextlib.nullcontext()
    if entry == "pool with hooks":
        from cupy.cuda import memory_hook

        hooks = memory_hook.MemoryHook()
        hooks.name = "pgmo-test-silent"
    with warnings.catch_warnings(record=True) as caught, hooks:
        warnings.simplefilter("always")
        for k in range(1, 30):
            allocator.malloc(k * 512)
            line = sys._getframe().f_lineno - 1
    [w] = [w for w in caught if issubclass(w.category, PgmoWarning)]
    assert (w.filename, w.lineno) == (__file__, line)
