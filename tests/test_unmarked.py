"""LoopWatch alone: where iterations come from when the user marks none (no engine here)."""

from __future__ import annotations

from pgmo.engine.loop_watch import GIVE_UP, LoopWatch


def found_loop(watch, sizes=(1024, 2048, 3072, 512)):
    """Feed a repeating loop (each block freed before the next request) until an
    iteration starts; returns that request's number."""
    for k in range(10_000):
        if watch.request(sizes[k % len(sizes)], watched_frees=k):
            return k
        watch.unmarked()
    raise AssertionError("no period found")


def test_a_found_period_starts_iterations_at_its_phase():
    watch = LoopWatch(detect=True, warn_after=10 ** 9)
    assert (watch.period, watch.source, watch.unplanned) == (None, "none", False)
    k = found_loop(watch)
    assert k % 4 == 0 and watch.index == k  # the loop's first request, numbered
    assert (watch.period, watch.source, watch.unplanned) == (4, "detected (every 4 requests)",
                                                             False)


def test_a_period_is_dropped_after_departing_iterations_in_a_row_only():
    watch = LoopWatch(detect=True, warn_after=10 ** 9)
    found_loop(watch)
    almost = [True] * (GIVE_UP - 1)
    # One iteration that follows its plan starts the count again.
    assert all(watch.keep_period(d) for d in almost + [False] + almost)
    assert watch.period == 4
    assert not watch.keep_period(True)
    assert (watch.period, watch.source, watch.unplanned) == (None, "none", True)
    assert watch.index == -1  # a new search: nothing watched yet
    found_loop(watch)  # and it finds the loop again
    assert watch.period == 4


def test_marking_makes_a_found_period_give_way_and_stops_watching():
    watch = LoopWatch(detect=True, warn_after=10 ** 9)
    found_loop(watch)
    assert watch.mark() is True
    assert (watch.marked, watch.period, watch.source, watch.unplanned) == \
        (True, None, "marked", False)
    assert not watch.request(1024, 0) and watch.index == -1
    assert LoopWatch(detect=True, warn_after=1).mark() is False  # nothing found: no plan to drop


def test_building_a_model_is_no_loop_though_its_layers_repeat_their_sizes():
    """Parameters repeat their sizes layer after layer but are never freed: the live
    blocks keep growing, so no steady iteration is found (a false one would plan the
    model's construction and hold an arena beside CuPy's cache)."""
    watch = LoopWatch(detect=True, warn_after=10 ** 9)
    for k in range(4000):  # W and b of 2000 identical layers, all kept
        assert not watch.request((65536, 512)[k % 2], watched_frees=0)
        watch.unmarked()
    assert watch.period is None and watch.source == "none"
    found_loop(watch)  # the training loop after it is found
    assert watch.period == 4
