"""Whose a request is: another thread's, another device/stream's and an interrupted
one are outside the plan; frees from other threads and after the engine is gone.

Tests pgmo.engine.core (whose a request is) and pgmo.engine.frees.
"""

from __future__ import annotations

import gc

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)
from .threads import CheckedThread


def test_frees_from_other_threads_and_after_the_engine_is_gone(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    blocks = [c.malloc(1000), c.malloc(2000)]
    c.live.clear()
    t = CheckedThread(target=blocks.clear)
    t.start()
    t.join()
    e.end_iteration()
    assert e.stats().live_bytes == 0
    e.begin_iteration()
    late = e.malloc(1000)
    e.end_iteration()
    c.engine = e = None
    gc.collect()
    del late  # the engine is gone: must not raise


def test_requests_from_another_thread_are_outside_the_plan(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    out = []
    t = CheckedThread(target=lambda: out.append(e.malloc(4096)))
    t.start()
    t.join()
    assert out[0].in_stock
    assert e.stats().foreign_requests == 1
    out.clear()
    e.end_iteration()
    assert e.stats().reoptimizations == 0


def test_another_thread_can_neither_end_the_iteration_nor_begin_one_inside_it(hot_path):
    """The iteration is its thread's: another thread's end_iteration() used to end it, and
    the owner then got "end_iteration() without begin_iteration()", naming the wrong cause.
    Now the other thread gets an error naming both threads, and the iteration goes on."""
    import pytest

    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    a = c.malloc(1000)
    errors = []

    def other():
        for call in (e.end_iteration, e.begin_iteration):
            with pytest.raises(RuntimeError) as caught:
                call()
            errors.append(str(caught.value))

    t = CheckedThread(target=other, name="loader")
    t.start()
    t.join()
    assert errors == [f"{call} on thread 'loader', inside the iteration begun by thread "
                      f"'MainThread': an iteration is begun and ended on one thread"
                      for call in ("end_iteration()", "begin_iteration()")]
    assert e.state.inside and c.in_plan(a)
    b = c.malloc(2000)
    assert c.in_plan(b)  # the iteration went on, on its plan
    c.live.clear()
    del a, b
    e.end_iteration()
    assert e.stats().reoptimizations == 0


def test_other_context_is_outside_the_plan(hot_path):
    ctx = {"stream": 1}
    c = Checked(hot_path, warmup=0, context=lambda: ctx["stream"])
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    a = c.malloc(1000)
    ctx["stream"] = 2
    b = c.malloc(1000)
    ctx["stream"] = 1
    assert c.in_plan(a) and b.in_stock
    assert e.stats().foreign_requests == 1
    c.live.clear()
    del a, b
    e.end_iteration()


def test_interrupted_requests_are_not_numbered(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    e.interrupt()
    x = c.malloc(123456)
    assert e.mode == "fallback" and x.in_stock
    e.resume()
    a = c.malloc(1000)
    assert c.in_plan(a) and e.mode == "optimized"
    assert e.stats().interrupted_requests == 1
    c.live.clear()
    del a, x
    e.end_iteration()
    assert e.stats().reoptimizations == 0
