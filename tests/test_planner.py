"""Re-planning off the training process: the planning worker and its lifetime.

In background mode a worker process folds each log into the profile, plans it
with best-fit and then searches for a better plan; each plan is swapped in at
a later iteration boundary, never in the middle of one.  These tests run on
the engine alone (no CuPy) with every byte checked; they wait for background
work by polling with a generous timeout, never by assuming a speed.  The
worker's failures are tested in ``tests/test_planner_failures.py``.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import pgmo
from pgmo.synth import random_iteration
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, replay

from .held_planner import HeldPlanner
from .late_frees import LateFreer
from .threads import CheckedThread

BACKGROUND = {"replan": "background", "method": "best", "time_limit": 5.0}


#: Best-fit is 12 % above the lower bound here; the full search reaches it.
HARD = random_iteration(25)
#: The full search does not reach the lower bound here within seconds: a solve
#: that is still running when the test needs one.
STUBBORN = random_iteration(4, n=400)


def test_the_hard_trace_is_hard():
    assert pgmo.solve(HARD, method="bestfit").peak > HARD.lower_bound()
    assert pgmo.solve(HARD, method="best", time_limit=None, budget=20_000).peak == HARD.lower_bound()


def wait_for(condition, engine, trace, timeout: float = 60.0) -> list[dict]:
    """Replay ``trace`` once per iteration until ``condition()`` holds."""
    results = []
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "background work did not finish in time"
        results.append(replay([trace], engine))
        time.sleep(0.01)
    return results


def assert_clean(results):
    assert all(r["corrupted"] == 0 and r["overlaps"] == 0 for r in results)


def test_a_small_profile_gets_best_fit_at_once_then_the_better_plan_at_a_later_boundary():
    """Short runs are planned from the iteration after the profile on: a small profile's
    best-fit plan is made at the boundary (milliseconds), the worker's better one later."""
    # fine pages: exact arena bytes; the own heap: the page heap holds HARD's live bytes
    # within 1.10x, best-fit's plan does not, and that plan waits for the worker's instead
    engine = host_engine(warmup=1, page=512, heap="own", **BACKGROUND)
    first = replay([HARD] * 3, engine)
    assert first["modes"] == ["warmup", "profiling", "optimized"]
    assert first["stats"].plan_method in ("bestfit", "best")  # best-fit at once (or both)
    results = wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    assert_clean(results + [first])
    st = engine.stats()
    assert st.planned_peak == st.lower_bound == HARD.lower_bound()
    assert st.planned_peak <= st.arena_bytes <= st.planned_peak * (1 + 1 / 32)
    assert st.background_solves == 1 and engine.planner.replans == 0
    assert st.departed_requests == 0 and st.stale_plans == 0 and st.planner_failures == 0
    engine.close()


def test_a_large_profile_gets_best_fit_then_the_better_plan_each_at_a_later_boundary():
    engine = host_engine(warmup=1, page=512, **BACKGROUND)  # fine pages: exact arena bytes
    engine.planner.sync_blocks = 10  # HARD counts as large: planned by the worker only
    first = replay([HARD] * 2, engine)
    assert first["modes"] == ["warmup", "profiling"]
    results = wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    assert_clean(results + [first])
    modes = [m for r in results for m in r["modes"]]
    assert set(modes) <= {"planning", "optimized"}
    st = engine.stats()
    assert st.planned_peak == st.lower_bound == HARD.lower_bound()
    # the arena's end was trimmed to the better plan (in whole mappings: 1/32 of it)
    assert st.planned_peak <= st.arena_bytes <= st.planned_peak * (1 + 1 / 32)
    assert st.background_solves == 1
    assert st.departed_requests == 0 and st.stale_plans == 0 and st.planner_failures == 0
    engine.close()


def test_a_plan_made_in_the_worker_is_the_boundarys_plan_installed_at_a_boundary_only():
    """The worker plans as the boundary would (same offsets, under a step budget), and its
    plan, ready in the middle of an iteration, serves from the next boundary on."""
    options = {"method": "best", "time_limit": None, "budget": 20_000}
    engine = host_engine(warmup=1, replan="background", **options)
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    hot = engine.hot
    with HeldPlanner(engine) as held:
        replay([HARD, HARD], engine)  # warm-up, profiled: the log waits for the worker
        assert engine.mode == "planning" and engine.schedule is None
        live = []
        with engine.iteration():
            live.append(engine.malloc(HARD[0].size))
            held.settle()  # the worker plans the profile now, during this iteration
            assert engine.planner.busy is False
            live.append(engine.malloc(HARD[1].size))
            assert engine.schedule is None and engine.mode == "planning"
            assert hot.counts.planned == 0
            live.clear()
        assert engine.schedule is not None  # installed at the boundary
    background = engine.plan
    sync = host_engine(warmup=1, replan="sync", **options)
    replay([HARD, HARD], sync)
    assert background.method == sync.plan.method == "best"
    assert background.offsets == sync.plan.offsets
    assert background.trace.blocks == sync.plan.trace.blocks
    assert replay([HARD], engine)["modes"] == ["optimized"]
    engine.close()
    sync.close()


def test_an_adopted_plan_is_not_superseded_by_work_handed_over_before_it():
    """Logs sent to the worker (or waiting to be) before a plan is adopted are forgotten."""
    other = random_iteration(7)
    engine = host_engine(warmup=0, **BACKGROUND)
    with HeldPlanner(engine) as held:
        replay([HARD], engine)  # profiled: its log waits for the planner
        engine.adopt(other, pgmo.solve(other.without_open(), method="bestfit"))
        held.settle()
    results = [replay([other], engine) for _ in range(3)]
    assert_clean(results)
    assert engine.plan.trace.blocks == other.without_open().blocks
    assert engine.stats().departures == 0
    engine.close()


def test_the_boundary_never_waits_for_the_worker(monkeypatch):
    """While the worker plans (held here), iterations go on, served as profiling was."""
    engine = host_engine(warmup=0, **BACKGROUND)
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    with HeldPlanner(engine) as held:
        first = replay([HARD], engine)  # profiled; the boundary did not wait for a plan
        assert engine.stats().plan_method == "" and engine.mode == "planning"
        second = replay([HARD], engine)  # the heap serves meanwhile
        assert engine.stats().plan_method == "" and second["modes"] == ["planning"]
        held.settle()
    results = wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    modes = [m for r in results for m in r["modes"]]
    assert set(modes) <= {"planning", "optimized"}
    assert_clean(results + [first, second])
    engine.close()


def test_a_newer_profile_supersedes_a_running_solve():
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 3.0})
    hard = STUBBORN
    replay([hard], engine)
    wait_for(lambda: engine.stats().plan_method == "bestfit", engine, hard)
    assert engine.planner.busy, "the search ended early: STUBBORN needs a harder trace"
    bigger = pgmo.Trace.from_columns(*[list(c) for c in hard.columns()[:2]],
                                     [s + 512 for s in hard.columns()[2]])
    res = replay([bigger], engine)  # every request larger: a new profile
    assert res["corrupted"] == 0
    results = wait_for(lambda: engine.stats().stale_plans >= 1, engine, bigger)
    assert engine.stats().reoptimizations == 1  # one new profile, however many departures
    newest = engine.planner.profile
    assert newest[0].size == bigger[0].size
    results += wait_for(lambda: engine.plan.trace.blocks == newest.without_open().blocks,
                        engine, bigger)
    assert_clean(results)
    assert engine.plan.trace[0].size == bigger[0].size  # planned for the newest profile
    engine.close()


def test_background_solving_under_concurrent_mallocs_and_frees():
    """Other threads allocate and free while plans are swapped in: never an overlap.

    The iteration's frees come from another thread, at any time, and its
    sizes grow every few iterations: new profiles keep superseding background
    solves, and plans are swapped in at many boundaries.
    """
    engine = host_engine(warmup=1, warn_after=10**9, **BACKGROUND)  # others allocate meanwhile
    checker = Checker(host=True)
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def other_thread():
        rng = random.Random(threading.get_ident())
        held = []
        while not stop.is_set():
            with lock:
                held.append(checker.alloc(engine, rng.randint(1, 20_000)))
            if len(held) > 5:
                with lock:
                    if not checker.free(held.pop(0)):
                        errors.append("corrupted")
        with lock:
            for handle in held:
                checker.free(handle)
        held.clear()

    threads = [CheckedThread(target=other_thread, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    freer = LateFreer(checker, lock, errors)
    evs = pgmo.trace.events(HARD.blocks)
    try:
        for iteration in range(30):
            grow = 512 * (iteration // 3)
            # the last departure's plan is made: installed at this boundary, while the other
            # threads allocate and free
            assert engine.planner.wait_idle(60)
            live = {}
            with engine.iteration():
                for _, kind, i in evs:
                    if kind:
                        with lock:
                            live[i] = checker.alloc(engine, HARD.blocks[i].size + grow)
                    else:
                        freer.put(live.pop(i))  # freed by the other thread, later
                freer.wait()  # ...but within the iteration (else they are pinned)
    finally:
        stop.set()
        for t in threads:
            t.join(60)  # raises what failed on it
        freer.stop()
    assert not errors
    assert checker.corrupted == 0 and checker.overlaps == 0
    st = engine.stats()
    assert st.used_bytes == st.live_bytes == 0
    # each growth is a new profile, or a plan of its own once the grown shape recurs
    assert st.foreign_requests > 0 and st.planned_requests > 0
    assert st.reoptimizations + st.shape_plans >= 9
    engine.close()


def test_torture_workloads_with_background_replanning():
    """Variable lengths and sizes, plans arriving at any boundary: every byte checked."""
    from pgmo import synth

    engine = host_engine(warmup=1, **{**BACKGROUND, "time_limit": 0.5})
    results = []
    for seed in range(60):
        trace = synth.seq2seq_training(batch=2, hidden=16, vocab=40, layers=2, seed=seed % 12)
        results.append(replay([trace], engine))
        if seed % 7 == 0:
            results.append(replay([HARD, HARD], engine))
            assert engine.planner.wait_idle(60)  # its plan comes at the next boundary
    assert_clean(results)
    st = engine.stats()
    # The shapes vary: the profile stays the largest iteration (HARD), and the
    # others leave its plan and are placed in its arena's gaps.
    assert st.departures >= 1 and engine.planner.varying >= 1 and st.planned_requests > 0
    assert st.used_bytes == 0 and st.planner_failures == 0
    modes = {m for r in results for m in r["modes"]}
    assert "optimized" in modes and modes <= {"warmup", "profiling", "planning", "optimized"}
    engine.close()


# -- no orphan worker ------------------------------------------------------------------
def worker_of(engine, trace=HARD):
    wait_for(lambda: engine.planner._worker is not None, engine, trace)
    return engine.planner._worker.proc


def gone(proc, timeout: float = 10.0) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_dropping_the_engine_stops_its_worker():
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 30.0})
    proc = worker_of(engine, STUBBORN)
    del engine
    gc.collect()
    assert gone(proc)


def test_free_all_blocks_stops_an_idle_worker_and_a_later_profile_starts_one():
    engine = host_engine(warmup=0, **BACKGROUND)
    proc = worker_of(engine)
    wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    engine.free_all_blocks()
    assert gone(proc) and engine.planner._worker is None
    bigger = pgmo.Trace.from_columns(*[list(c) for c in HARD.columns()[:2]],
                                     [s + 512 for s in HARD.columns()[2]])
    replay([bigger, bigger], engine)
    wait_for(lambda: engine.planner._worker is not None, engine, bigger)
    engine.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_the_parents_worker_alone():
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 30.0})
    hard = STUBBORN
    proc = worker_of(engine, hard)
    pid = os.fork()
    if pid == 0:  # the child: no worker of its own, and it must not stop the parent's
        code = 0 if engine.planner._worker is None else 1
        engine.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert proc.poll() is None  # the parent's worker still runs
    engine.close()
    assert gone(proc)


def test_interpreter_exit_leaves_no_worker(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, {root!r})
        from tests.test_planner import STUBBORN, worker_of
        from pgmo.measure.hosts import host_engine
        engine = host_engine(warmup=0, replan="background", method="best", time_limit=30.0)
        print(worker_of(engine, STUBBORN).pid, flush=True)
    """).format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"worker {pid} outlived its interpreter")


def test_the_profiled_iteration_leaves_no_cache_beside_the_arena():
    """Warm-up and profiling hold only their live blocks, so when the background plan
    arrives the pool holds the arena alone, and never held more than it at once."""
    engine = host_engine(warmup=1, **BACKGROUND)
    results = wait_for(lambda: engine.stats().arena_bytes > 0, engine, HARD)
    st = engine.stats()
    assert st.total_bytes == st.arena_bytes and st.used_bytes == 0
    assert st.stock_bytes == st.exact_bytes == st.kept_bytes == 0
    lower = HARD.lower_bound()  # the most the profiled iteration had live, rounded alike
    assert st.peak_total_bytes == max(st.arena_bytes, lower)
    assert_clean(results)
    engine.close()


def _worker_planned_engine(request_size):
    """A background engine (best-fit, planned in the worker), and
    ``iteration(requests, settle=None)``: one iteration of that many requests (``settle``
    called first, inside it)."""
    engine = host_engine(warmup=1, replan="background", method="bestfit")

    def iteration(requests, settle=None):
        with engine.iteration():
            if settle is not None:
                settle()
            blocks = [engine.malloc(request_size) for _ in range(requests)]
            del blocks

    return engine, iteration


def test_a_departure_from_an_older_plan_is_folded_into_a_newer_profile():
    """The planner's profile may be newer than the plan an iteration was served from: here
    the first plan arrives during an iteration that is then profiled again.  A departure
    from that plan logs its sizes "as planned"; they must be read in the plan it was served
    from (the newer profile has one request: reading them there failed the planner)."""
    engine, iteration = _worker_planned_engine(request_size=1)
    with HeldPlanner(engine) as planner:
        iteration(2)  # warm-up
        iteration(2)  # profiled: two requests
        iteration(1, planner.settle)  # their plan arrives; this one is profiled again
        assert engine.stats().plan_method == "bestfit"  # the two-request plan, installed
        iteration(3)  # departs from it: two requests as planned, one beyond
        planner.settle()
        before = engine.stats()
        iteration(3)
    st = engine.stats()
    assert st.planner_failures == 0 and st.solve_failures == 0
    assert len(engine.profile) == 3  # a plan for all three...
    assert st.planned_requests - before.planned_requests == 3  # ...served the last iteration
    engine.close()


def test_a_plan_that_arrives_during_a_planning_iteration_is_kept():
    """The iteration served while the plan was made is not profiled again: its log would
    replace the profile the arrived plan was made for, and that plan would be superseded."""
    engine, iteration = _worker_planned_engine(request_size=512)
    with HeldPlanner(engine) as planner:
        iteration(2)  # warm-up
        iteration(2)  # profiled
        iteration(1, planner.settle)  # the plan arrives while this (shorter) one runs
        planner.settle()
        iteration(2)
    try:
        assert len(engine.planner.profile) == 2
        assert engine.stats().departures == 0
    finally:
        engine.close()


def test_the_worker_answers_a_log_it_folded_without_change_at_once(monkeypatch):
    """A plan that lands late is departed from the same way at every iteration: the worker
    folds such a log once, and answers it again at once (a fold of thousands of requests
    takes milliseconds; iterations that come faster would queue their logs without end)."""
    import io

    from pgmo.engine import profiles, worker as worker_module

    folds = []
    real_absorb = profiles.absorb
    monkeypatch.setattr(profiles, "absorb", lambda p, log: folds.append(log) or real_absorb(p, log))
    planning = worker_module._Planning(io.BytesIO())
    sent = []
    planning.send = sent.append
    first = ([0, 1, 2], [3, 2, 4], [512, 1024, 512])
    grown = ([0, 1, 2], [3, 2, 4], [512, 2048, 512])
    planning.take({"op": "fold", "job": 1, "kind": "profile", "log": first, "stages": []})
    for job in (2, 3, 4):
        planning.take({"op": "fold", "job": job, "kind": "merge", "log": grown, "stages": []})
    answers = [m for m in sent if m["op"] == "profile"]
    assert [m["changed"] for m in answers] == [True, True, False, False]
    assert len(folds) == 2  # the grown log: folded (changed), folded again (no change), then not
    assert planning.profile.blocks[1].size == 2048


def test_departed_logs_wait_for_a_worker_that_is_behind_at_most_a_few_at_a_time():
    from pgmo.engine.planner import FOLDS_WAITING, Planner
    from pgmo.engine.profiles import Log
    from pgmo.solver import SolverOptions

    planner = Planner(SolverOptions(method="bestfit"), mode="background")
    planner.sync_blocks = 0  # every log goes to the worker
    gate = threading.Event()
    planner.later(gate.wait)  # the planner thread is held: logs queue up
    log = Log([0, 1], [2, 3], [512, 512])
    planner.record(log, "profile")
    for _ in range(FOLDS_WAITING + 2):
        planner.record(Log([0, 1], [2, 3], [512, 1024]), "merge")
    assert planner.logs_dropped == 3  # the profile and three merges wait; three are dropped
    gate.set()
    assert planner.wait_idle(60)
    assert planner.profile is not None and planner.profile.blocks[1].size == 1024
    planner.shutdown()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_worker_plans_at_a_lower_cpu_priority_than_training():
    """The worker runs at :data:`~pgmo.engine.worker.WORKER_NICE` above the training process's
    nice value (the kernel caps it at 19): on a busy core training comes first, and the
    worker still gets a share (a plan lands)."""
    from pgmo.engine.worker import WORKER_NICE

    engine = host_engine(warmup=0, **BACKGROUND)
    proc = worker_of(engine)

    def nice(pid):  # the 19th field of /proc/<pid>/stat, after the command's closing ")"
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    assert 0 < WORKER_NICE < 19
    expected = min(19, nice(os.getpid()) + WORKER_NICE)
    deadline = time.monotonic() + 30  # set as the worker starts, before its imports
    while nice(proc.pid) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nice(proc.pid) == expected
    engine.close()


def test_a_pool_used_after_close_plans_again_instead_of_waiting_for_a_lost_plan():
    """close() stops the worker while it plans: what it was making is lost, and a pool used
    afterwards profiles and plans anew (it used to wait, in 'planning', for good)."""
    import pgmo.testing

    pool = pgmo.testing.host_pool(replan="background", method="best", plan_cache=False,
                                  time_limit=0.5)
    pool.engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    sizes = [1000 + 37 * i for i in range(300)]

    def iteration():
        with pool.iteration():
            blocks = [pool.malloc(s) for s in sizes]
            del blocks

    iteration()
    iteration()  # profiled: its plan is being made in the worker
    assert pool.engine.planner.busy
    pool.close()
    assert not pool.engine.planner.busy  # nothing awaited from a stopped worker
    for _ in range(40):
        iteration()
        if pool.stats().mode == "optimized":
            break
        pool.engine.planner.wait_idle(30)
    assert pool.stats().mode == "optimized" and pool.stats().planned_requests > 0
    pool.close()


@pytest.mark.parametrize("n, survivors", [
    (40, []), (40, [3]), (40, [0, 39]), (40, list(range(0, 40, 2))),  # a few, many
    (1500, []), (1500, [7, 1499]), (1500, list(range(0, 1500, 3))),  # a long log: NumPy's
])
def test_an_iteration_departed_when_a_request_outlived_it_that_its_plan_does_not_keep_apart(
        n, survivors):
    """Whatever their number: survivors the plan pins are expected, any other one is a
    departure; the log's room past the iteration's requests is not looked at, whatever it
    holds; requests beyond the plan's count are kept apart by none."""
    import array
    from types import SimpleNamespace

    import pgmo
    from pgmo.engine.handout import NOT_FREED
    from pgmo.engine.profiles import outlived_its_plan
    from pgmo.engine.schedule import compile_schedule

    def schedule_pinning(pinned, length=n):
        profile = pgmo.Trace.from_tuples([(i, i, None if i in pinned else i + 1, 512)
                                          for i in range(length)])
        closed = profile.without_open()
        offsets = tuple(512 * k for k in range(len(closed)))
        return compile_schedule(profile, pgmo.Plan(closed, offsets))

    uppers = array.array("q", [NOT_FREED]) * (n + 9)  # room past the n requests
    for i in range(n):
        if i not in survivors:
            uppers[i] = i + 1
    hot = SimpleNamespace(log_arrays=(None, uppers, None))
    pinned = set(survivors)
    assert not outlived_its_plan(hot, n, schedule_pinning(pinned))
    assert not outlived_its_plan(hot, n, schedule_pinning(pinned | {1, n - 2}))
    uppers[n + 3] = 5
    assert not outlived_its_plan(hot, n, schedule_pinning(pinned))
    for unexpected in survivors[:1] + survivors[-1:]:
        assert outlived_its_plan(hot, n, schedule_pinning(pinned - {unexpected}))
    if survivors:  # a log longer than its plan: the requests past it are nobody's survivors
        last = survivors[-1]
        assert outlived_its_plan(hot, n, schedule_pinning(pinned - {last}, length=last))
        assert not outlived_its_plan(hot, n, schedule_pinning(pinned, length=last + 1))
