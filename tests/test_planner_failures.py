"""Background planning when its worker fails: a crash, a stop, a starved or slow worker, a
failure on the planner thread.  Each costs a plan, never a wait: the pool keeps serving,
counts it (``stats().planner_failures``), warns once, and the next profile gets a new worker.

The planner's other behaviour is tested in ``tests/test_planner.py``.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from pgmo.engine import worker as worker_module
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import replay

from .test_planner import BACKGROUND, HARD, STUBBORN, assert_clean, gone, wait_for, worker_of
from .threads import CheckedThread


def test_a_crashed_worker_is_counted_warned_about_once_and_the_pool_keeps_serving(caplog):
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 30.0})
    hard = STUBBORN
    with caplog.at_level(logging.WARNING, logger="pgmo.pool"):
        replay([hard], engine)
        wait_for(lambda: engine.stats().plan_method == "bestfit", engine, hard)
        assert engine.planner.busy  # the search goes on in the worker
        engine.planner._worker.proc.kill()
        results = wait_for(lambda: engine.stats().planner_failures == 1, engine, hard)
        results += [replay([hard], engine) for _ in range(3)]
    assert_clean(results)
    st = engine.stats()
    assert st.planner_failures == 1 and st.plan_method == "bestfit"
    assert st.planned_requests >= 3 * len(hard)  # still served from the best-fit plan
    warnings = [r for r in caplog.records if "background planner failed" in r.message]
    assert len(warnings) == 1 and "exited" in warnings[0].message
    engine.close()


def test_a_worker_that_dies_before_its_first_plan_costs_that_plan_only():
    """No plan yet and the worker is gone: the pool profiles again, and a new worker plans."""
    engine = host_engine(warmup=0, **BACKGROUND)
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    worker_of(engine).kill()
    results = wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    assert_clean(results)
    st = engine.stats()
    assert st.planner_failures <= 1  # the kill may land before the worker had work
    modes = [m for r in results for m in r["modes"]]
    assert set(modes) <= {"profiling", "planning", "optimized"}
    engine.close()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_stopped_worker_costs_a_plan_never_a_wait(monkeypatch, caplog):
    """A worker that stops answering (here: SIGSTOP) leaves the iterations running; past its
    time (the wall-clock backstop: it gets no CPU) it is killed and counted, and the next
    profile gets a new worker and its plan."""
    monkeypatch.setattr(worker_module, "WORKER_GRACE", 1.0)
    monkeypatch.setattr(worker_module, "WALL_FACTOR", 3.0)
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 0.5})
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    proc = worker_of(engine)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="pgmo.pool"):
            done = []
            runner = CheckedThread(target=lambda: done.extend(
                replay([STUBBORN], engine) for _ in range(5)), daemon=True)
            runner.start()
            runner.join(60)  # raises if the iterations waited for the stopped worker
            assert len(done) == 5 and engine.stats().plan_method == ""
            results = wait_for(lambda: engine.stats().planner_failures >= 1, engine, STUBBORN)
            assert gone(proc)
            results += wait_for(lambda: engine.stats().plan_method != "", engine, STUBBORN)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    assert_clean(done + results)
    assert "longer than its time limit" in caplog.text
    assert engine.planner._worker is not None and engine.planner._worker.proc is not proc
    engine.close()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_worker_that_got_no_cpu_is_not_judged_by_the_wall_clock(monkeypatch, caplog):
    """A worker at the lowest priority on a loaded machine gets little CPU: silent past its
    budget in wall-clock time (here: stopped for twice its budget, then let go), it is
    waited for, and its plan lands; only a worker silent far longer is stopped."""
    monkeypatch.setattr(worker_module, "WORKER_GRACE", 1.0)
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 0.5})
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    assert engine.planner.wait_idle(60)  # started and ready
    proc = worker_of(engine)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="pgmo.pool"):
            results = [replay([HARD], engine)]  # profiled: the log waits for the worker
            budget = 2 * 0.5 * 1.05 + 1.0
            stopped_until = time.monotonic() + 2 * budget
            while time.monotonic() < stopped_until:
                results.append(replay([HARD], engine))
                time.sleep(0.05)
            assert engine.stats().planner_failures == 0 and proc.poll() is None
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    results += wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    assert_clean(results)
    assert engine.stats().planner_failures == 0 and "longer than its time limit" not in caplog.text
    assert worker_of(engine) is proc
    engine.close()


def test_a_failure_on_the_planner_thread_costs_that_plan_only(monkeypatch, caplog):
    """A log the planner thread failed to send is counted, and not waited for: the next
    iteration is profiled again and planned."""
    engine = host_engine(warmup=0, **BACKGROUND)
    engine.planner.sync_blocks = 0  # no best-fit at the boundary: the worker plans
    send, failed = engine.planner._send_fold, []

    def fails_once(*args):
        if not failed:
            failed.append(True)
            raise RuntimeError("a failure on the planner thread")
        return send(*args)

    monkeypatch.setattr(engine.planner, "_send_fold", fails_once)
    with caplog.at_level(logging.WARNING, logger="pgmo.pool"):
        results = wait_for(lambda: engine.stats().plan_method == "best", engine, HARD)
    assert_clean(results)
    assert failed and engine.stats().planner_failures == 1
    assert "the planner thread failed" in caplog.text
    engine.close()


def test_a_worker_past_its_time_is_stopped_and_counted(monkeypatch, caplog):
    monkeypatch.setattr(worker_module, "WORKER_GRACE", 0.0)
    engine = host_engine(warmup=0, **{**BACKGROUND, "time_limit": 0.01})
    hard = STUBBORN  # starting Python alone takes longer than 10 ms
    with caplog.at_level(logging.WARNING, logger="pgmo.pool"):
        results = wait_for(lambda: engine.stats().planner_failures >= 1, engine, hard)
    assert_clean(results)
    assert "longer than its time limit" in caplog.text
    engine.close()
