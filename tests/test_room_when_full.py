"""Rule 6 of pgmo.engine.memory inside an iteration that left its plan.

A full device gets the reserved arena's free middle back (as CuPy's pool
frees its free chunks), and nothing is ever placed in memory that was given
back: not in those holes, not beyond an end trimmed meanwhile.  Checked block
by block on the host model and on the CUDA classes over the driver's
stand-ins, with the driver's calls failing.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgmo.device.host_memory import HostMemory
from pgmo.engine import reference_handout
from pgmo.device.mappings import MappingLedger
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, host_device_of
from pgmo.placement import Placer
from tests.cuda_standins import NOT_SUPPORTED, OUT_OF_MEMORY, FakeGPU
from tests.test_cuda_device import cuda_engine

MiB = 1 << 20


def pairs(engine, checker, iterations: int) -> None:
    """Iterations of two 2 MiB blocks live together (a 4 MiB plan once planned)."""
    for _ in range(iterations):
        with engine.iteration():
            a = checker.alloc(engine, 2 * MiB)
            b = checker.alloc(engine, 2 * MiB)
            assert checker.free(a) and checker.free(b)
            a = b = None  # (a handle held on would be a block that outlives its iteration)


def planned_pair(engine, checker) -> None:
    pairs(engine, checker, 4)
    assert engine.mode == "optimized"


def planned_on_8_mib(page: int = 512):
    """An engine on an 8 MiB device following the 4 MiB plan of :func:`planned_pair`."""
    engine = host_engine(capacity=8 * MiB, page=page)
    checker = Checker(host=True, device=host_device_of(engine))
    planned_pair(engine, checker)
    return engine, checker


def sound(engine, checker) -> None:
    assert checker.corrupted == 0 and checker.overlaps == 0
    stats = engine.stats()
    assert stats.used_bytes == checker.live_bytes
    assert stats.arena_bytes + stats.old_arena_bytes + stats.exact_bytes + stats.kept_bytes \
        + stats.stock_bytes == stats.total_bytes == engine.total_bytes()


@pytest.mark.parametrize("page", [512, 2 * MiB], ids=["byte-exact", "driver-page"])
def test_a_departed_iteration_on_a_full_device_gets_the_arenas_free_middle_back(page):
    """An 8 MiB device; the 4 MiB arena holds a freed 2 MiB block and a live one when the
    iteration asks for 5 MiB more than planned.  2 + 5 MiB live fit in 8, and CuPy's pool
    fits them by freeing its free chunk; pgmo used to answer out-of-memory, the arena's
    free middle being memory it could not give back.  The middle is unmapped (a hole, in
    which nothing is placed), mapped again as the iteration ends, and the plans go on."""
    engine, checker = planned_on_8_mib(page)
    with engine.iteration():
        a = checker.alloc(engine, 2 * MiB)
        b = checker.alloc(engine, 2 * MiB)
        assert checker.free(a)
        a = None
        c = checker.alloc(engine, 5 * MiB)  # larger than planned: the iteration departs
        assert engine.total_bytes() <= 8 * MiB and engine.memory.holes
        assert checker.intact(b) and checker.intact(c)
        assert checker.free(c) and checker.free(b)
        b = c = None
    assert not engine.memory.holes  # mapped again as the iteration ended
    planned = engine.stats().planned_requests
    pairs(engine, checker, 3)
    assert engine.stats().planned_requests >= planned + 6  # followed again
    assert engine.total_bytes() <= 8 * MiB
    sound(engine, checker)


def test_nothing_is_placed_beyond_an_arena_end_trimmed_inside_the_iteration():
    """A departed iteration grows the arena for a block, frees it, and then fills the
    device: the arena's free end is unmapped to make room.  The placer used to keep that
    end as a gap and place the next block there, in memory no longer mapped (on a GPU an
    illegal address; the checker counted 2 blocks outside held memory)."""
    engine, checker = planned_on_8_mib()
    with engine.iteration():
        a = checker.alloc(engine, 2 * MiB)
        b = checker.alloc(engine, 3 * MiB)  # larger than planned: departs, the arena grows
        assert checker.free(a)
        a = None
        x = checker.alloc(engine, 3 * MiB)  # no gap holds it: the arena grows again
        assert checker.free(x)
        x = None
        y = checker.alloc(engine, 5 * MiB)  # a full device: the arena's free end goes back
        assert checker.free(y)
        y = None
        z = checker.alloc(engine, 3 * MiB)  # where the old end lay
        assert checker.free(z) and checker.free(b)
        b = z = None
    sound(engine, checker)


def test_holes_that_cannot_be_mapped_again_keep_the_plan_off_until_they_can(caplog):
    """A block of the departed iteration outlives it, so the hole cannot be mapped again as
    the iteration ends: no plan is followed in the arena (its offsets lie in the hole), the
    next iterations are placed in the arena's gaps around it, with one warning; once the
    block dies the hole is mapped and the plan followed again."""
    caplog.set_level(logging.WARNING, logger="pgmo.pool")
    engine, checker = planned_on_8_mib()
    with engine.iteration():
        a = checker.alloc(engine, 2 * MiB)
        b = checker.alloc(engine, 2 * MiB)
        assert checker.free(a)
        a = None
        survivor = checker.alloc(engine, 5 * MiB)
        assert checker.free(b)
        b = None
    assert engine.memory.holes and "arena holes" in engine.stats().device_reasons
    planned = engine.stats().planned_requests
    for _ in range(3):
        with engine.iteration():
            a = checker.alloc(engine, 2 * MiB)
            b = checker.alloc(engine, MiB)  # 5 + 2 + 1: as much as the device has
            assert engine.total_bytes() <= 8 * MiB
            assert checker.free(a) and checker.free(b)
            a = b = None
    assert engine.stats().planned_requests == planned  # no plan followed over the hole
    warnings = [r for r in caplog.records if "middle" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert checker.free(survivor)
    survivor = None
    planned = engine.stats().planned_requests
    pairs(engine, checker, 4)
    assert not engine.memory.holes and "arena holes" not in engine.stats().device_reasons
    assert engine.stats().planned_requests > planned
    sound(engine, checker)


@pytest.mark.parametrize("code", [OUT_OF_MEMORY, NOT_SUPPORTED], ids=["oom", "not-supported"])
@pytest.mark.parametrize("call", [None, "cuMemUnmap", "cuMemCreate", "cuMemMap",
                                  "cuMemSetAccess"])
@pytest.mark.parametrize("start", [0, 1, 3], ids=["first", "second", "fourth"])
def test_a_driver_that_fails_while_the_middle_goes_back_lends_no_block_twice(call, code,
                                                                              start):
    """The same departures on the CUDA classes over the driver's stand-ins (2 MiB pages, an
    8 MiB device), with one of the driver's calls failing from its ``start``-th use on,
    after the plan was made: the middle stays mapped (a refused unmap), a hole stays a hole
    (a refused map), or the arena falls back to cudaMalloc; every block is checked, no
    kernel touches unmapped memory, and the books add up.  With no call failing, the first
    departure completes (its 2 + 5 MiB fit) and the second is CuPy's out-of-memory
    (2 + 7 MiB do not)."""
    gpu = FakeGPU(HostMemory(capacity=8 * MiB))
    engine, driver, _ = cuda_engine(gpu, heap="own")  # the heap maps pages too
    checker = Checker(host=True, device=gpu.memory)
    planned_pair(engine, checker)
    if call is not None:
        driver.fail = {call: (code, gpu.calls[call] + start)}
    outcomes = []
    for extra in (5, 7, 0, 3, 0, 0):
        live = []
        outcomes.append("ok")
        try:
            with engine.iteration():
                live.append(checker.alloc(engine, 2 * MiB))
                live.append(checker.alloc(engine, 2 * MiB))
                gpu.launch(live[1][0].ptr, 2 * MiB)
                assert checker.free(live.pop(0))
                if extra:
                    live.append(checker.alloc(engine, extra * MiB))
                    gpu.launch(live[-1][0].ptr, extra * MiB)
                while live:
                    assert checker.free(live.pop())
        except MemoryError:  # CuPy's error for a full device, at a request
            outcomes[-1] = "out of memory"
            while live:
                assert checker.free(live.pop())
    if call is None:
        assert outcomes == ["ok", "out of memory", "ok", "ok", "ok", "ok"]
        assert engine.stats().planned_requests > 0 and not engine.memory.holes
    assert gpu.violations == []
    sound(engine, checker)


def test_a_placer_withholds_and_cuts_only_free_space():
    placer = Placer(100, [(10, 20), (50, 60)])
    assert placer.free_spans() == [(0, 10), (20, 50), (60, 100)]
    placer.withhold(30, 40)
    assert placer.free_spans() == [(0, 10), (20, 30), (40, 50), (60, 100)]
    with pytest.raises(ValueError, match="not inside one gap"):
        placer.withhold(15, 25)  # a live block's
    assert placer.place(10) in (0, 20, 40)  # never the withheld range
    placer.cut(70)
    assert placer.size == 70 and placer.free_spans()[-1] == (60, 70)
    assert placer.place(25) == -1  # no gap holds it, and the range cannot grow
    placer.release(30, 40)  # given back to the placer: one gap with its neighbours
    assert (20, 50) in placer.free_spans() or (30, 50) in placer.free_spans()


def test_the_usable_end_is_looked_for_from_any_start():
    books = MappingLedger()
    books.add(0, 4)
    books.add(8, 4)
    books.add(12, 4, usable=False)
    assert books.usable_end() == 4
    assert books.usable_end(8) == 12  # the unusable mapping ends the run
    assert books.usable_end(4) == 4  # nothing mapped there


def test_the_books_say_whether_a_mapping_starts_in_a_range():
    """What the arena's boundary asks before it looks for its live blocks' end: whether a
    trim to ``lo`` would unmap anything below ``hi``."""
    books = MappingLedger()
    assert not books.starts_in(0, 100)
    books.add(0, 4)
    books.add(8, 4)
    assert books.starts_in(0, 1) and books.starts_in(8, 9) and books.starts_in(5, 12)
    assert not books.starts_in(1, 8)  # inside the first mapping, up to the second's start
    assert not books.starts_in(9, 100) and not books.starts_in(4, 4)
    books.remove(8)
    assert not books.starts_in(1, 100)


def test_a_run_of_mappings_leaves_the_books_in_one_piece_or_not_at_all():
    """One ``cuMemUnmap`` over several mappings: all of them off the books, a page's handle
    counted once less; a range that is not whole mappings changes nothing."""
    books = MappingLedger()
    books.add(0, 4)
    books.add(4, 4, handle="page")
    books.add(8, 4, handle="page")  # one physical page mapped twice
    books.add(12, 4)
    with pytest.raises(ValueError):
        books.remove_run(2, 10)  # starts inside a mapping
    with pytest.raises(ValueError):
        books.remove_run(4, 6)  # ends inside one
    assert len(books.mappings()) == 4 and books.mapped == 16 and books.maps_of("page") == 2
    gone = books.remove_run(4, 8)
    assert gone == [(4, 4, "page"), (8, 4, "page")]
    assert books.mappings() == [(0, 4), (12, 4)] and books.mapped == 8
    assert books.maps_of("page") == 0 and books.usable_end() == 4


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(st.integers(1, 6), min_size=1, max_size=5),
       iterations=st.lists(st.lists(st.tuples(st.integers(1, 16), st.booleans()),
                                    max_size=6), min_size=1, max_size=6),
       capacity=st.integers(4, 16), survivor=st.booleans(),
       page=st.sampled_from([512, 128 << 10]))
@example(plan=[1], iterations=[[(1, True), (8, False), (1, True)]], capacity=4,
         survivor=False, page=512)  # the old code lent memory it had given back
def test_departures_at_a_full_device_never_lend_memory_given_back(plan, iterations, capacity,
                                                                 survivor, page):
    """Random departed iterations on a 4-16 MiB device that fills: each iteration makes the
    planned blocks (128 KiB units), frees every other one, then asks for extra blocks of
    up to 8 MiB, each freed at once or kept to the iteration's end, one of them now and
    then outliving it.  A request may get CuPy's out-of-memory error (the iteration goes
    on without it, as a program that catches it would); a block in memory the pool gave
    back, or two blocks sharing a byte, never happen, and the books add up.  (The old
    code placed blocks in an arena end trimmed after such an error.)"""
    unit = 128 << 10
    engine = host_engine(capacity=capacity * MiB, page=page)
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    kept = None

    def alloc(size):
        try:
            return checker.alloc(engine, size)
        except MemoryError:
            return None

    def iteration(extras):
        nonlocal kept
        live = []
        with engine.iteration():
            for k, units in enumerate(plan):
                live.append(alloc(units * unit))
                if k % 2 and live[0] is not None:
                    assert checker.free(live.pop(0))
            for units, at_once in extras:
                handle = alloc(units * 4 * unit)
                if handle is None:
                    continue
                if survivor and kept is None:
                    kept = handle  # outlives the iteration
                elif at_once:
                    assert checker.free(handle)
                else:
                    live.append(handle)
                handle = None
            while live:
                handle = live.pop()
                assert handle is None or checker.free(handle)
            handle = None

    for _ in range(4):
        iteration([])
    for extras in iterations:
        iteration(extras)
        if kept is not None and len(extras) % 2:
            assert checker.free(kept)
            kept = None
    if kept is not None:
        assert checker.free(kept)
        kept = None
    iteration([])
    assert engine.total_bytes() <= capacity * MiB
    sound(engine, checker)


def test_a_ctrl_c_while_a_departed_iteration_ends_leaves_no_placer_behind():
    """A Ctrl-C while a departed iteration's frees are applied as it ends.  Its placer (the
    arena's gaps as that iteration left them) used to stay behind; in a later planned
    iteration a full device made room by unmapping those gaps, under that iteration's
    planned blocks (the checker counted a block in memory given back)."""
    plain = reference_handout().HotPath

    class CtrlCInDrain(plain):
        armed = False

        def drain(self):
            if CtrlCInDrain.armed:
                CtrlCInDrain.armed = False
                raise KeyboardInterrupt
            return super().drain()

    engine = host_engine(capacity=8 * MiB, page=512, hot_path=CtrlCInDrain)
    checker = Checker(host=True, device=host_device_of(engine))
    planned_pair(engine, checker)
    with pytest.raises(KeyboardInterrupt):
        with engine.iteration():
            a = checker.alloc(engine, 2 * MiB)
            b = checker.alloc(engine, 2 * MiB)
            assert checker.free(a)
            a = None
            c = checker.alloc(engine, 3 * MiB)  # larger than planned: the iteration departs
            assert checker.free(c) and checker.free(b)
            b = c = None
            CtrlCInDrain.armed = True
    with engine.iteration():
        a = checker.alloc(engine, 2 * MiB)
        b = checker.alloc(engine, 2 * MiB)
        with engine.interrupted():
            try:
                extra = checker.alloc(engine, 5 * MiB)  # 4 + 5 MiB: more than the device has
            except MemoryError:
                extra = None
        assert checker.intact(a) and checker.intact(b)  # (the old code: a was unmapped)
        assert extra is None
        assert checker.free(a) and checker.free(b)
        a = b = None
    sound(engine, checker)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=12),
       lo=st.integers(0, 40), n=st.integers(1, 40))
def test_a_run_of_whole_mappings_is_told_from_anything_else(pieces, lo, n):
    """``run`` answers the mappings that make up a range exactly, or refuses it: checked
    against the units each mapping covers (mappings side by side, with gaps)."""
    books, pos, units = MappingLedger(), 0, {}
    for length, gap in pieces:
        pos += gap  # a unit left unmapped before it
        books.add(pos, length)
        for u in range(pos, pos + length):
            units[u] = pos
        pos += length
    covered = all(u in units for u in range(lo, lo + n))
    whole = covered and units.get(lo) == lo and \
        (lo + n not in units or units[lo + n] == lo + n)
    if whole:
        starts = books.run(lo, n)
        assert starts == sorted({units[u] for u in range(lo, lo + n)})
    else:
        with pytest.raises(ValueError):
            books.run(lo, n)
