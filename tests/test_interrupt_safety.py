"""A Ctrl-C (any BaseException) at any line of the engine leaves it usable, with honest books.

Users interrupt training all the time, and a notebook keeps the process (and
the pool) for the next cell.  These tests run a short workload once to list
every line of the engine it executes, then run it again once per line,
raising ``KeyboardInterrupt`` there (through ``sys.settrace``), and check
what a user relies on afterwards: no lock left held, no iteration left
open, ``used_bytes`` equal to the bytes of the blocks still held, the parts
of ``total_bytes`` adding up, every later block checked byte by byte, and
the device's memory back to zero once the pool and its blocks are gone.

The plain-Python hot path is traced line by line; the compiled one has no
lines to trace (it is C), so there the interrupts land in the engine's
Python code around it, which is where a real signal is delivered too.
"""

from __future__ import annotations

import gc
import time

import pytest

from pgmo.engine import handout as compiled_handout
from pgmo.engine import reference_handout
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, host_device_of

from .interrupts import Injector, Interrupt, SignalStorm

MiB = 1 << 20
HOT_PATHS = ["plain"] + (["compiled"] if compiled_handout.COMPILED else [])


SIZES = [3 * MiB, 5 * MiB + 512, MiB, 7 * MiB, 2 * MiB, 600_000]


def workload(engine, checker, live: list, iterations: int = 5) -> None:
    """Iterations that warm up, profile, follow a plan, depart from it (larger requests),
    keep a survivor, run an interruption, and make requests between iterations; the pool's
    queries in between.  Handles are kept in ``live`` (the caller's), so that whatever an
    interrupt leaves there is still checked and freed."""
    for it in range(iterations):
        scale = 2 if it == 4 else 1
        with engine.iteration():
            for k, size in enumerate(SIZES):
                live.append(checker.alloc(engine, size * scale))
                if k % 2:
                    checker.free(live.pop(0))
            with engine.interrupted():
                live.append(checker.alloc(engine, 700_000))
                checker.free(live.pop())
            survivor = checker.alloc(engine, MiB + 4096)
            while live:
                checker.free(live.pop())
            live.append(survivor)
            del survivor
        live.append(checker.alloc(engine, 300_000))  # between iterations
        if it == 3:
            engine.free_all_blocks()
        engine.stats()
        while len(live) > 1:
            checker.free(live.pop())
        if it == 2:
            engine.set_limit(1 << 40)
    while live:
        checker.free(live.pop())


def make(hot_path: str, replan: str):
    cls = reference_handout().HotPath if hot_path == "plain" else compiled_handout.HotPath
    engine = host_engine(hot_path=cls, replan=replan)
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    return engine, checker


def check_books(engine, checker) -> None:
    stats = engine.stats()
    parts = stats.arena_bytes + stats.old_arena_bytes + stats.exact_bytes + \
        stats.kept_bytes + stats.stock_bytes
    assert parts == stats.total_bytes == engine.total_bytes()
    assert stats.used_bytes == checker.live_bytes, "used_bytes counts blocks nobody holds"
    assert stats.free_bytes >= 0


def lines_of(hot_path: str, replan: str) -> list[tuple[str, int]]:
    engine, checker = make(hot_path, replan)
    with Injector() as probe:
        workload(engine, checker, [])
    return probe.lines


def interrupted_run(hot_path: str, replan: str, at: int) -> str:
    """The workload, interrupted at the ``at``-th line; then the checks, and four more
    iterations.  Returns where the interrupt landed ("" when the run ended before)."""
    engine, checker = make(hot_path, replan)
    device = host_device_of(engine)
    live: list = []
    where = ""
    with Injector(at) as injector:
        try:
            workload(engine, checker, live)
        except Interrupt as e:
            where = str(e)
    assert bool(injector.fired) == bool(where)
    # what the user's frames held went with them: still checked, then let go
    while live:
        assert checker.free(live.pop()), f"a block held across the interrupt changed ({where})"
    gc.collect()
    assert engine._lock.acquire(blocking=False), f"the engine's lock is held ({where})"
    engine._lock.release()
    assert not engine.in_iteration, f"an iteration is left open ({where})"
    check_books(engine, checker)
    workload(engine, checker, live, iterations=2)  # the pool goes on
    assert checker.corrupted == 0 and checker.overlaps == 0, where
    check_books(engine, checker)
    assert engine.used_bytes() == 0
    engine.close()
    del engine
    gc.collect()
    assert device.in_use == 0, f"the device still holds {device.in_use:,} bytes ({where})"
    return where


#: Both hot paths, plans made at the boundary (every line of the plain hot path is traced;
#: the compiled one is C, its callbacks are traced).  The background planner (a worker
#: process per engine) is interrupted by the storms below instead: a sweep would start a
#: thousand workers.
SWEEPS = [(hot_path, "sync") for hot_path in HOT_PATHS]


@pytest.mark.parametrize("hot_path, replan", SWEEPS)
def test_an_interrupt_at_any_line_of_the_engine_leaves_it_usable(hot_path, replan):
    lines = lines_of(hot_path, replan)
    first = {}
    for k, line in enumerate(lines, 1):
        first.setdefault(line, k)  # each distinct line, where it first runs
    landed = [interrupted_run(hot_path, replan, at) for at in sorted(first.values())]
    assert all(landed) and len(landed) > 100


def recover(engine) -> None:
    """What the error of an iteration left open tells the user: end it (under the storm too)."""
    while engine.in_iteration:
        try:
            engine.end_iteration(aborted=True)
        except Interrupt:
            pass


@pytest.mark.parametrize("replan", ["sync", "background"])
@pytest.mark.parametrize("interval", [0.0005, 0.003])
@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_a_storm_of_interrupts_never_lends_a_block_twice(hot_path, interval, replan):
    """Real signals every ``interval`` seconds for a whole session, each raising a
    KeyboardInterrupt wherever it lands in the engine (its handlers and clean-ups too):
    never a block lent twice; once the storm is over the lock is free, the books add up and
    the pool goes on."""
    engine, checker = make(hot_path, replan)
    device = host_device_of(engine)
    live: list = []
    interrupts = rounds = 0
    deadline = time.monotonic() + 60.0
    with SignalStorm(interval):
        # 150 rounds at least, and on until the storm has landed in the engine a few times:
        # the compiled hot path spends little time in Python frames, where a signal lands.
        while rounds < 150 or (interrupts <= 5 and time.monotonic() < deadline):
            rounds += 1
            try:
                workload(engine, checker, live, iterations=3)
            except Interrupt:
                interrupts += 1
            except RuntimeError as e:  # a second Ctrl-C landed while an iteration was closing
                assert "call end_iteration() first" in str(e)
                interrupts += 1
                recover(engine)
            while live:  # what the user's frames held: still intact
                assert checker.free(live.pop())
    assert interrupts > 5 and engine.completed > 20  # interrupted often, and got on
    gc.collect()
    assert engine._lock.acquire(blocking=False)
    engine._lock.release()
    if engine.in_iteration:  # a storm can leave one open: ending it is always possible
        engine.end_iteration(aborted=True)
    check_books(engine, checker)
    workload(engine, checker, live, iterations=4)
    assert checker.corrupted == 0 and checker.overlaps == 0
    check_books(engine, checker)
    engine.close()
    del engine
    gc.collect()
    assert device.in_use == 0


def test_the_injector_skips_only_a_with_statements_exit_and_nops():
    """The line events CPython sends on a ``with`` statement's line as its body ends (a
    normal end, a ``return`` inside, an exception's way out), before ``__exit__`` runs, and
    those at a ``NOP`` (a ``try:``), where no signal is delivered, are skipped; every other
    line is still interrupted, and no interrupt leaves the lock taken."""
    import threading

    lock = threading.Lock()

    def normal():
        with lock:
            x = 1
        return x

    def returns():
        with lock:
            return 1

    def raises():
        try:
            with lock:
                raise ValueError
        except ValueError:
            return 1

    # line events besides the skipped exits and NOPs: the with, the body's lines, the return
    # (returns: the with, its return a NOP inside it; raises: the with, the raise, the
    # except, the return, its try a NOP)
    for guarded, lines in ((normal, 3), (returns, 1), (raises, 4)):
        fired_at = []
        for at in range(1, 8):
            try:
                with Injector(at, traced=(guarded.__code__.co_filename,)):
                    guarded()
            except Interrupt:
                fired_at.append(at)
            assert lock.acquire(blocking=False), f"{guarded.__name__}: lock left at {at}"
            lock.release()
        assert fired_at == list(range(1, lines + 1)), (guarded.__name__, fired_at)


def test_a_ctrl_c_while_a_plan_is_handed_over_to_be_kept_leaves_nothing_for_close_to_wait_for(
        monkeypatch):
    """A Ctrl-C at any line of handing a plan over to be kept (background mode): the next
    plan handed over is the one kept, and the pool's close finds nothing left to wait for
    (an interrupted hand-over used to leave a job listed that nobody cleared, and close
    waited its whole limit for it)."""
    from pgmo.engine import background, planner as planner_module
    from pgmo.solver import SolverOptions

    monkeypatch.setattr(planner_module.Planner, "_ensure_worker", lambda self: None)
    monkeypatch.setattr(planner_module, "KEEP_WAIT", 3.0)  # a leak fails in 3 s, not 10
    fired_somewhere = False
    for at in range(1, 40):
        planner = planner_module.Planner(SolverOptions(method="bestfit"), mode="background")
        made: list[str] = []
        with Injector(at, traced=(background.__file__,)) as injector:
            try:
                planner.keep(dict, lambda: made.append("first"))
            except Interrupt:
                pass
        planner.keep(dict, lambda: made.append("second"))
        planner.shutdown()
        assert made[-1:] == ["second"], (at, made)  # the newest plan handed over is kept
        assert not planner._keeps, f"interrupted at line event {at}: a job left listed"
        if not injector.fired:
            break
        fired_somewhere = True
    else:
        raise AssertionError("the hand-over never ran to its end uninterrupted")
    assert fired_somewhere


# ------------------------------------------- a Ctrl-C the user catches, the iteration goes on
# A notebook user may catch the KeyboardInterrupt inside an iteration and go on with it.
# Each sweep raises it at every line of the functions named, one run per line, catches it
# where the user would, and goes on: never a block lent twice, never an error later.

def caught_at_every_line(scenario) -> int:
    """``scenario(at)`` for at = 1, 2, ... until its Ctrl-C lands nowhere (it returns whether
    it fired); the number of lines where it landed (some, or the sweep tests nothing)."""
    at = 0
    while scenario(at + 1):
        at += 1
    assert at > 3, "the sweep landed on too few lines to test anything"
    return at


def alloc_free_iterations(engine, checker, sizes, iterations: int) -> None:
    for _ in range(iterations):
        with engine.iteration():
            for size in sizes:
                assert checker.free(checker.alloc(engine, size))


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_a_ctrl_c_caught_inside_reset_leaves_an_iteration_that_goes_on(hot_path):
    """``reset()`` inside a planned iteration, cut short at any line: the iteration's later
    requests, larger than planned (a departure from a plan half forgotten used to fail an
    assertion), are served, and the pool goes on."""

    def scenario(at: int) -> bool:
        engine, checker = make(hot_path, "sync")
        alloc_free_iterations(engine, checker, SIZES, 3)  # warm-up, profiled, planned
        live = []
        with engine.iteration():
            assert engine.mode == "optimized"
            live += [checker.alloc(engine, size) for size in SIZES[:3]]
            with Injector(at, functions=frozenset({"reset", "_reset_plan"})) as injector:
                try:
                    engine.reset()
                except Interrupt:
                    pass
            live += [checker.alloc(engine, 2 * size) for size in SIZES[3:]]
            while live:
                assert checker.free(live.pop()), at
        alloc_free_iterations(engine, checker, SIZES, 4)
        assert checker.corrupted == 0 and checker.overlaps == 0, at
        check_books(engine, checker)
        assert engine.mode == "optimized"  # planned again
        engine.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)


def test_a_ctrl_c_caught_while_a_shape_is_marked_for_planning_leaves_it_to_be_planned():
    """Iterations of two shapes, in turn: the second shape is planned the second time an
    iteration of it leaves the main plan.  A Ctrl-C at any line of that (at the iteration's
    end) leaves the shape to be planned at its next iteration (one cut short between its
    mark and its planning was never planned)."""
    from pgmo.measure.hosts import host_engine

    a, b = [MiB, 3 * MiB, MiB], [2 * MiB, MiB]

    def scenario(at: int) -> bool:
        engine = host_engine(warmup=0, replan="sync", method="bestfit")
        checker = Checker(host=True, device=engine.host_device, write=True)
        for sizes in (a, b, a, b, a):
            alloc_free_iterations(engine, checker, sizes, 1)
        assert not engine.shapes.planned
        with Injector(at, functions=frozenset({"observe"})) as injector:
            try:
                alloc_free_iterations(engine, checker, b, 1)  # its second departure
            except Interrupt:
                pass
        for sizes in (a, b, a):
            alloc_free_iterations(engine, checker, sizes, 1)
        assert engine.shapes.planned == 1, f"the shape was never planned (line event {at})"
        switches = engine.shapes.switches
        alloc_free_iterations(engine, checker, b, 1)
        assert engine.shapes.switches == switches + 1  # followed from its own plan
        assert checker.corrupted == 0 and checker.overlaps == 0
        engine.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)


def test_a_ctrl_c_caught_while_the_first_request_takes_a_cached_plan_leaves_a_usable_iteration(
        monkeypatch, tmp_path):
    """A second run's first request takes the plan cached by the first; cut short at any
    line of that, the user asks again and goes on, with an interruption inside the
    iteration, past the 64 requests its log began with (a plan followed in a log sized for
    no plan used to fail there)."""
    pytest.importorskip("cupy")  # the pool keeps and reads the plans
    import shutil

    from pgmo.measure.hosts import host_pool

    sizes = [(k % 7 + 1) * 64 * 1024 for k in range(80)]

    def train(pool, checker, iterations, injector=None):
        for it in range(iterations):
            with pool.iteration():
                live = []
                for k, size in enumerate(sizes):
                    if k == 40:
                        with pool.interrupted():
                            assert checker.free(checker.alloc(pool, 3 * MiB))
                    try:
                        live.append(checker.alloc(pool, size))
                    except Interrupt:
                        assert it == 0 and k == 0 and injector is not None and injector.fired
                        live.append(checker.alloc(pool, size))  # the user asks again
                    if len(live) > 3:
                        assert checker.free(live.pop(0))
                while live:
                    assert checker.free(live.pop())

    first_cache = tmp_path / "first"
    monkeypatch.setenv("PGMO_CACHE_DIR", str(first_cache))
    first = host_pool(page=512, plan_cache=True)
    train(first, Checker(host=True, device=first.host_device, write=True), 4)
    first.close()

    def scenario(at: int) -> bool:
        cache = tmp_path / f"run-{at}"
        shutil.copytree(first_cache, cache)
        monkeypatch.setenv("PGMO_CACHE_DIR", str(cache))
        pool = host_pool(page=512, plan_cache=True)
        checker = Checker(host=True, device=pool.host_device, write=True)
        with Injector(at, functions=frozenset({"_choose_hint", "_take_hint"})) as injector:
            train(pool, checker, 1, injector)
        train(pool, checker, 3)
        assert checker.corrupted == 0 and checker.overlaps == 0, at
        assert pool.used_bytes() == checker.live_bytes == 0
        if not injector.fired:
            assert pool.stats().planned_requests >= 3 * len(sizes)  # the cached plan served
        pool.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)


def planned_engine(hot_path: str):
    """An engine on 512-byte pages following its plan of :func:`abce_iteration`, and its
    checker."""
    engine = host_engine(hot_path=HOT_PATHS_CLASSES[hot_path], warmup=1, page=512)
    checker = Checker(host=True, device=host_device_of(engine), write=True)
    for _ in range(2):
        abce_iteration(engine, checker)
    engine.optimize()  # (wanted: else declined, as it would hold no less than the heap)
    abce_iteration(engine, checker)
    assert engine.mode == "optimized"
    return engine, checker


HOT_PATHS_CLASSES = {"plain": reference_handout().HotPath, "compiled": compiled_handout.HotPath}


def abce_iteration(engine, checker, e_size: int = 2 * MiB) -> None:
    """A, B, C (2 MiB each); B freed; E (``e_size``); C freed; F: E planned in the arena's
    middle, where B was."""
    with engine.iteration():
        live = {k: checker.alloc(engine, 2 * MiB) for k in "ABC"}
        assert checker.free(live.pop("B"))
        live["E"] = checker.alloc(engine, e_size)
        assert checker.free(live.pop("C"))
        live["F"] = checker.alloc(engine, 2 * MiB)
        while live:  # all freed inside the iteration: none survives it
            assert checker.free(live.popitem()[1])


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_a_ctrl_c_caught_while_a_request_departs_leaves_no_planned_block_in_a_gap(hot_path):
    """A request larger than planned departs; cut short at any line of that, the user asks
    for its planned size instead and goes on, and a trim inside the iteration
    (``free_all_blocks``) gives back the arena's free middle: never under a live block (a
    placer built before the hot path left the plan listed the plan's places as gaps)."""

    def scenario(at: int) -> bool:
        engine, checker = planned_engine(hot_path)
        with engine.iteration():
            live = {k: checker.alloc(engine, 2 * MiB) for k in "ABC"}
            assert checker.free(live.pop("B"))
            with Injector(at, functions=frozenset({"_depart", "start_placing",
                                                   "_refresh_kind"})) as injector:
                try:
                    live["E"] = checker.alloc(engine, 4 * MiB)  # larger than planned
                except Interrupt:
                    live["E"] = checker.alloc(engine, 2 * MiB)  # the user asks again
            engine.free_all_blocks()
            changed = [name for name, handle in live.items() if not checker.intact(handle)]
            assert not changed, f"{changed} changed (line event {at})"
            assert checker.free(live.pop("C"))
            live["F"] = checker.alloc(engine, 2 * MiB)
            while live:
                assert checker.free(live.popitem()[1])
        for _ in range(2):
            abce_iteration(engine, checker)
        assert checker.corrupted == 0 and checker.overlaps == 0, at
        check_books(engine, checker)
        engine.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_a_ctrl_c_caught_while_a_departed_iteration_ends_leaves_no_placer_to_the_next(
        hot_path):
    """A departed iteration's end, cut short at any line: the next iteration follows its
    plan, and a trim inside it (``free_all_blocks``) never unmaps under its live blocks (a
    placer left behind by the cut listed their places as gaps)."""

    def scenario(at: int) -> bool:
        engine, checker = planned_engine(hot_path)
        with Injector(at, functions=frozenset({"_end", "stop_placing"})) as injector:
            try:
                abce_iteration(engine, checker, e_size=3 * MiB)  # departs
            except Interrupt:
                pass
        assert not engine.in_iteration
        with engine.iteration():
            live = {k: checker.alloc(engine, 2 * MiB) for k in "ABC"}
            assert checker.free(live.pop("B"))
            live["E"] = checker.alloc(engine, 2 * MiB)  # its plan's size, or smaller
            engine.free_all_blocks()
            changed = [name for name, handle in live.items() if not checker.intact(handle)]
            assert not changed, f"{changed} changed (line event {at})"
            assert checker.free(live.pop("C"))
            live["F"] = checker.alloc(engine, 2 * MiB)
            while live:
                assert checker.free(live.popitem()[1])
        for _ in range(2):
            abce_iteration(engine, checker, e_size=3 * MiB)
        assert checker.corrupted == 0 and checker.overlaps == 0, at
        check_books(engine, checker)
        engine.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)


def test_a_ctrl_c_caught_inside_the_own_heaps_malloc_loses_no_range():
    """The own heap serves a warm-up request; cut short at any line of its malloc, the range
    it was placing is free again once the heap looks (never neither free nor live, its
    pages held for ever)."""
    from pgmo.engine import own_heap

    def scenario(at: int) -> bool:
        engine = host_engine(hot_path=HOT_PATHS_CLASSES["plain"], warmup=5, page=512,
                             replan="sync", method="bestfit", heap="own")
        checker = Checker(host=True, device=host_device_of(engine), write=True)
        abce_iteration(engine, checker)
        heap = engine.memory.heap
        assert isinstance(heap, own_heap.OwnHeap)
        with engine.iteration():
            with Injector(at, functions=frozenset({"malloc"}),
                          traced=(own_heap.__file__,)) as injector:
                try:
                    assert checker.free(checker.alloc(engine, 3 * MiB))
                except Interrupt:
                    pass
            assert checker.free(checker.alloc(engine, MiB))
        engine.free_all_blocks()
        heap._collect()
        lost = heap.range.size - heap._space.free.free_bytes() - sum(heap.live.values())
        assert lost == 0, f"{lost:,} bytes neither free nor live (line event {at})"
        assert heap.held == heap.used == 0
        engine.close()
        return bool(injector.fired)

    caught_at_every_line(scenario)
