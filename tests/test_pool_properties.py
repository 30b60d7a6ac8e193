"""Pool properties on random workloads, in every re-planning mode, every block checked.

Each example drives a fresh pool through random iterations (sizes from 0 to
hundreds of MiB, open blocks, interrupts, blocks held across boundaries) in
each mode a user can choose: plans made at the boundary (``sync``, with the
paper's best-fit or the full search), best-fit only, and the background
planner (best-fit, then the search, in its worker process).  The
background planner is held between the points the example names
(:class:`~tests.held_planner.HeldPlanner`), so its plans arrive at the same
boundary in every run.  The checker counts live bytes on its own, and stamps
both ends of each block (large blocks stay cheap); host memory is real, so
an example never has more than :data:`LIVE_CAP` bytes live.
"""

from __future__ import annotations

import contextlib
import gc

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import pgmo
from pgmo.synth import random_iteration
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, host_device_of, replay
from pgmo.units import round_size

from .held_planner import HeldPlanner
from .interrupts import Injector, Interrupt
from .strategies import MIB, event_traces, request_sizes, workloads

#: Most bytes an example has live at once (host memory is real).
LIVE_CAP = 384 * MIB
#: Most bytes of one random trace.
TRACE_CAP = 160 * MIB
#: Search steps of the ``best`` method: a budget, not seconds, gives the same plan every run.
BUDGET = 2000

#: Every re-planning mode, with best-fit and the full search.
CONFIGS = {
    "sync-bestfit": {"replan": "sync", "method": "bestfit"},
    "sync-best": {"replan": "sync", "method": "best", "time_limit": None, "budget": BUDGET},
    "bestfit": {"replan": "bestfit", "method": "bestfit"},
    "background-bestfit": {"replan": "background", "method": "bestfit"},
    "background-best": {"replan": "background", "method": "best", "time_limit": None,
                        "budget": BUDGET},
}


def _cupy_pool(**options):
    pytest.importorskip("cupy")
    from pgmo.measure.hosts import host_pool

    return host_pool(**options)


#: (pool, config): every mode on the engine alone; the CuPy pool with the pool's defaults.
CASES = [("engine", name) for name in CONFIGS] + [("cupy-pool", "background-best"),
                                                 ("cupy-pool", "sync-bestfit")]


def _searched_traces(count: int = 12, n: int = 40) -> list[pgmo.Trace]:
    """Random iterations on which best-fit stays above the lower bound: the search (in
    the worker, for a background planner) has work to do."""
    found = []
    seed = 0
    while len(found) < count:
        trace = random_iteration(seed, n=n)
        if pgmo.solve(trace, method="bestfit").peak > trace.lower_bound():
            found.append(trace)
        seed += 1
    return found


SEARCHED = _searched_traces()
#: A random trace (sizes from 0 to :data:`TRACE_CAP` bytes, open blocks), or one that
#: best-fit leaves above the lower bound.
hot_traces = (event_traces(max_blocks=25, sizes=request_sizes(), max_total=TRACE_CAP,
                           open_blocks=True) | st.sampled_from(SEARCHED))


def make_pool(kind: str, config: str, warmup: int = 1):
    return (host_engine if kind == "engine" else _cupy_pool)(warmup=warmup, **CONFIGS[config])


def modes_of(config: str) -> set[str]:
    """What an iteration may do in ``config``: planning only with a background planner."""
    modes = {"warmup", "profiling", "optimized"}
    return modes | {"planning"} if CONFIGS[config]["replan"] == "background" else modes


def note_coverage(st) -> None:
    """What the example reached, for ``--hypothesis-show-statistics``."""
    event(f"plan: {st.plan_method or 'none'}")
    event("served from a plan" if st.planned_requests else "never served from a plan")
    event("departed" if st.departures else "never departed")
    event("searched in the worker" if st.background_solves else "no worker search")


class Cycle:
    """Something that keeps a block alive in a reference cycle (a graph node, say)."""

    def __init__(self, handle):
        self.handle, self.me = handle, self


def drive(pool, workload, planner: HeldPlanner, config: str, collector: bool = False,
          blocks: dict | None = None, checker: Checker | None = None) -> tuple[Checker, int]:
    """Run a workload (see ``strategies.workloads``), checking the pool after every op.

    Returns the checker, after everything was freed, and the requests made
    (size 0 is no request).  An allocation that would take the live bytes
    past :data:`LIVE_CAP` is skipped.  ``collector``: each block dies in a
    reference cycle, freed by the garbage collector at the iteration's end
    (the caller turns automatic collection off).  ``blocks``: where the
    handles are kept (``"live"``, ``"kept"``), so that a caller an exception
    interrupted can still check and free them (with its ``checker``).
    """
    checker = checker or Checker(host=True, device=host_device_of(pool), write="ends")
    blocks = blocks if blocks is not None else {}
    live = blocks.setdefault("live", [])  # blocks of this iteration (and held from the last)
    kept = blocks.setdefault("kept", [])  # blocks never freed until the end
    uncollected = [0]  # bytes of blocks dropped in cycles, not collected yet
    requests = 0

    def let_go(handle) -> None:
        checker.free(handle)
        if collector:
            Cycle(handle)
            uncollected[0] += round_size(handle[1])

    def collect() -> None:
        if collector:
            gc.collect()
            uncollected[0] = 0

    for ops, hold in workload:
        interrupted = False
        before = pool.stats()
        with pool.iteration():
            mode = pool.mode
            for kind, x in ops:
                if kind in ("a", "k"):
                    if checker.live_bytes + round_size(x) > LIVE_CAP:
                        continue
                    (live if kind == "a" else kept).append(checker.alloc(pool, x))
                    requests += x > 0
                elif kind == "f" and live:
                    let_go(live.pop(x % len(live)))
                elif kind == "i":
                    (pool.resume if interrupted else pool.interrupt)()
                    interrupted = not interrupted
                elif kind == "s":
                    planner.settle()
                assert pool.stats().used_bytes == checker.live_bytes + uncollected[0]
            if interrupted:
                pool.resume()
            if not hold:
                while live:
                    let_go(live.pop())
        collect()
        st = pool.stats()
        assert st.used_bytes == checker.live_bytes
        if not collector:  # (blocks waiting for the collector still count in the pool's)
            assert st.peak_used_bytes == checker.peak_bytes  # the pool served nothing else
        assert st.used_bytes <= st.total_bytes
        # The mode said what the iteration did: only optimized ones use the arena,
        # and only the others profile.
        assert mode in modes_of(config), mode
        if mode == "optimized":
            assert st.profiled_requests == before.profiled_requests
        else:
            assert st.planned_requests == before.planned_requests
    for held in (live, kept):
        while held:
            let_go(held.pop())
    collect()
    return checker, requests


@contextlib.contextmanager
def collector_off():
    """Collections happen only where the test calls gc.collect()."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("kind, config", CASES)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads())
@example(w=[([("f", 0), ("a", 1), ("a", 1)], False), ([("f", 0), ("a", 1), ("a", 1)], False),
            ([("s", 0), ("a", 1)], False), ([("a", 1), ("a", 1), ("a", 1)], False)])  # see below
def test_non_hot_workloads_never_corrupt(kind, config, w):
    """Random iterations never corrupt a block, the pool's counts are the checker's, and the
    planner never fails.  (The explicit example once failed the background planner: a
    departure's "as planned" sizes were read in a newer profile than its plan's.)"""
    pool = make_pool(kind, config)
    try:
        with HeldPlanner(pool) as planner:
            checker, requests = drive(pool, w, planner, config)
            planner.settle()
        assert checker.corrupted == 0 and checker.overlaps == 0
        st = pool.stats()
        assert st.used_bytes == st.live_bytes == 0
        assert st.requests == requests
        assert st.planner_failures == st.solve_failures == 0
        note_coverage(st)
    finally:
        pool.close()


@pytest.mark.parametrize("kind, config", CASES)
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(t=hot_traces, u=hot_traces,
       settles=st.lists(st.booleans(), min_size=8, max_size=8))
def test_random_traces_alternating(kind, config, t, u, settles):
    """Hot runs of one trace, then another: departures, plans arriving at drawn
    boundaries, never corruption; the pool's peak is the checker's."""
    pool = make_pool(kind, config)
    try:
        results = []
        sequence = [t, t, t, u, t, u, u, t]
        with HeldPlanner(pool) as planner:
            for trace, settle in zip(sequence, settles):
                results.append(replay([trace], pool, write="ends"))
                if settle:
                    planner.settle()
        for res in results:
            assert res["corrupted"] == 0 and res["overlaps"] == 0
            assert set(res["modes"]) <= modes_of(config)
        st = pool.stats()
        assert st.used_bytes == st.live_bytes == 0
        assert st.peak_used_bytes == max(res["peak_bytes"] for res in results)
        assert st.requests == sum(map(len, sequence))
        assert st.planner_failures == st.solve_failures == 0
        note_coverage(st)
    finally:
        pool.close()


@pytest.mark.parametrize("kind, config", CASES)
def test_every_mode_reaches_its_plan(kind, config):
    """The properties above are about planned iterations too: in each mode a repeating
    trace is served from the plan of the configured method once the planner settled."""
    trace = random_iteration(25)  # best-fit is above the lower bound: the search has work
    pool = make_pool(kind, config)
    try:
        with HeldPlanner(pool) as planner:
            first = replay([trace] * 2, pool, write="ends")
            planner.settle()
            then = replay([trace] * 2, pool, write="ends")
        assert first["modes"] == ["warmup", "profiling"]
        assert then["modes"] == ["optimized", "optimized"]
        assert all(r["corrupted"] == r["overlaps"] == 0 for r in (first, then))
        st = pool.stats()
        assert st.planned_requests == 2 * len(trace)
        options = CONFIGS[config]
        searched = options["method"] == "best" and options["replan"] != "bestfit"
        assert st.plan_method == ("best" if searched else "bestfit")
        assert st.planned_peak == (trace.lower_bound() if searched
                                   else pgmo.solve(trace, method="bestfit").peak)
    finally:
        pool.close()


@pytest.mark.parametrize("config", CONFIGS)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads())
def test_blocks_freed_by_the_collector_never_corrupt(config, w):
    """The same random workloads with every block dying in a reference cycle, freed by the
    garbage collector (survivors' buffers included): never a block lent twice, the books
    the checker's after every collection."""
    pool = make_pool("engine", config)
    try:
        with collector_off(), HeldPlanner(pool) as planner:
            checker, requests = drive(pool, w, planner, config, collector=True)
            planner.settle()
        assert checker.corrupted == 0 and checker.overlaps == 0
        st = pool.stats()
        assert st.used_bytes == st.live_bytes == 0 and st.requests == requests
        assert st.planner_failures == st.solve_failures == 0
    finally:
        pool.close()


@pytest.mark.parametrize("config", CONFIGS)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads(), at=st.integers(1, 4000))
def test_an_interrupt_anywhere_never_corrupts(config, w, at):
    """The same random workloads with a Ctrl-C at a drawn line of the engine: what the
    interrupted run held is intact, the engine is free and out of its iteration, the books
    add up, and the next iterations are checked byte by byte."""
    pool = make_pool("engine", config)
    blocks: dict = {}
    checker = Checker(host=True, device=host_device_of(pool), write="ends")
    try:
        with HeldPlanner(pool) as planner:
            try:
                with Injector(at):
                    drive(pool, w, planner, config, blocks=blocks, checker=checker)
            except Interrupt:
                pass
            planner.settle()
        assert pool._lock.acquire(blocking=False)
        pool._lock.release()
        assert not pool.in_iteration
        for held in blocks.values():
            while held:
                assert checker.free(held.pop())  # what the interrupted run held is intact
        gc.collect()
        assert pool.stats().used_bytes == checker.live_bytes == 0
        assert checker.corrupted == checker.overlaps == 0
        st = pool.stats()
        assert st.arena_bytes + st.old_arena_bytes + st.exact_bytes + st.kept_bytes + \
            st.stock_bytes == st.total_bytes
        after = replay([random_iteration(3, n=20)] * 3, pool, write="ends")
        assert after["corrupted"] == after["overlaps"] == 0
    finally:
        pool.close()
