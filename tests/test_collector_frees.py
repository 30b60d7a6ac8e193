"""Blocks freed by the garbage collector: never lent twice, never lost from the books.

A block that outlives its iteration (a loss kept for logging, a gradient) and
then dies in a reference cycle (Chainer's graphs are full of them) is freed by
the cycle collector, which finalizes everything the cycle alone keeps alive
before it clears anything.  These tests drop survivors and ordinary blocks in
cycles, collect inside iterations, between them and from a thread of their
own, on both hot paths, and check every block's bytes while it lives.
"""

from __future__ import annotations

import contextlib
import gc
import threading

import pytest

from pgmo.engine import handout as compiled_handout
from pgmo.engine import reference_handout
from pgmo.engine.planner import REPLAN_MODES
from pgmo.testing import Checker, host_device_of, host_engine

from .threads import CheckedThread

MiB = 1 << 20
HOT_PATHS = ["plain"] + (["compiled"] if compiled_handout.COMPILED else [])


def hot_path_class(name):
    return reference_handout().HotPath if name == "plain" else compiled_handout.HotPath


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


class Cycle:
    """Something that keeps a block alive in a reference cycle (a graph node, say)."""

    def __init__(self, handle):
        self.handle = handle
        self.me = self


def drop_in_cycle(checker, handle):
    """Check the block, then leave it to the collector: only a cycle keeps it now."""
    assert checker.free(handle), "a survivor's bytes changed while it lived"
    Cycle(handle)


def run_iterations(engine, checker, iterations, collect_inside, seed=0):
    """Iterations of a few blocks and one survivor each; the last survivor dies in a cycle in
    the next iteration (collected there, or at the boundary).  Every live block is checked at
    each iteration's end."""
    sizes = [4 * MiB, 3 * MiB + 512, MiB, 6 * MiB]
    survivor = None
    for it in range(iterations):
        with engine.iteration():
            live = [checker.alloc(engine, s) for s in sizes]
            checker.free(live.pop(1))
            if collect_inside and survivor is not None:
                drop_in_cycle(checker, survivor)
                survivor = None
                gc.collect()
            live.append(checker.alloc(engine, 2 * MiB))
            new_survivor = checker.alloc(engine, MiB + 4096)
            for handle in live:
                assert checker.intact(handle), f"iteration {it}: a live block was overwritten"
            if survivor is not None:
                assert checker.intact(survivor)
            for handle in reversed(live):
                checker.free(handle)
            live.clear()
        if survivor is not None:
            drop_in_cycle(checker, survivor)
            gc.collect()
        survivor = new_survivor
    if survivor is not None:
        checker.free(survivor)


@pytest.mark.parametrize("hot_path", HOT_PATHS)
@pytest.mark.parametrize("collect_inside", [False, True], ids=["between", "inside"])
@pytest.mark.parametrize("replan", REPLAN_MODES)
def test_survivors_freed_by_the_collector_are_never_lent_twice(hot_path, collect_inside,
                                                                replan):
    engine = host_engine(hot_path=hot_path_class(hot_path), replan=replan)
    checker = Checker(host=True, device=host_device_of(engine))
    with collector_off():
        run_iterations(engine, checker, 8, collect_inside)
        gc.collect()
    assert checker.corrupted == 0 and checker.overlaps == 0
    stats = engine.stats()
    assert stats.mode == "optimized" or replan == "background"
    assert engine.used_bytes() == checker.live_bytes == 0
    assert engine.free_bytes() >= 0
    parts = stats.arena_bytes + stats.old_arena_bytes + stats.exact_bytes + stats.kept_bytes \
        + stats.stock_bytes
    assert parts == engine.total_bytes()


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_blocks_freed_by_the_collector_are_counted_as_freed(hot_path):
    """The compiled Release's free must be recorded when the collector frees it (a generated
    tp_clear once cleared its inbox first: used_bytes grew by every such free)."""
    engine = host_engine(hot_path=hot_path_class(hot_path))
    checker = Checker(host=True)
    with collector_off():
        for _ in range(5):
            with engine.iteration():
                kept = checker.alloc(engine, 4 * MiB)
                other = checker.alloc(engine, MiB)
                checker.free(other)
                del other
            drop_in_cycle(checker, kept)
            del kept
            gc.collect()
            assert engine.used_bytes() == checker.live_bytes == 0
            assert engine.free_bytes() >= 0


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_two_pools_in_two_threads_with_a_collector_thread(hot_path):
    """Frees run in whatever thread the collector runs in: two pools on two threads, and a
    third thread collecting all the time; every block checked."""
    stop = threading.Event()
    failures: list[str] = []

    def collect():
        while not stop.is_set():
            gc.collect()

    def train(seed):
        engine = host_engine(hot_path=hot_path_class(hot_path), replan="background")
        checker = Checker(host=True, device=host_device_of(engine))
        run_iterations(engine, checker, 25, collect_inside=bool(seed % 2), seed=seed)
        if checker.corrupted or checker.overlaps:
            failures.append(f"pool {seed}: {checker.corrupted} corrupted, "
                            f"{checker.overlaps} overlapping blocks")
        engine.close()

    collector = CheckedThread(target=collect, name="collector", daemon=True)
    collector.start()
    trainers = [CheckedThread(target=train, args=(k,), name=f"trainer-{k}") for k in range(2)]
    for t in trainers:
        t.start()
    try:
        for t in trainers:
            t.join(300)
    finally:
        stop.set()
        collector.join(60)
    assert failures == []
