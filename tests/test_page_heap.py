"""pgmo.engine.page_heap: fresh addresses per request over recycled physical pages.

On the host model of the device (pgmo.device.host_range.HostRange: a page mapped at two
addresses shares its bytes, an unmapped page faults), every block written and checked
by the replay checker; faults injected into the range's calls.
"""

from __future__ import annotations

import gc
import random

import pytest

from pgmo.device.host_memory import HostMemory
from pgmo.engine.page_heap import PageHeap
from pgmo.errors import DeviceError
from pgmo.measure import footprint
from pgmo.measure.replay import Checker

MiB = 1 << 20
PAGE = 2 * MiB


class Refusing:
    """A range whose ``name`` call is refused (raises ``error``) at its uses in ``when``
    (0 = the first); every other call goes to the real range."""

    def __init__(self, rng, name: str, when: set[int], error: BaseException):
        self._rng, self._name, self._when, self._error = rng, name, when, error
        self.uses = 0

    def __getattr__(self, attr):
        real = getattr(self._rng, attr)
        if attr != self._name:
            return real

        def call(*args):
            k, self.uses = self.uses, self.uses + 1
            if k in self._when:
                raise self._error
            return real(*args)

        return call


class Heap:
    """A page heap with the checker's face: ``malloc`` returns what CuPy's would."""

    def __init__(self, capacity=None, stream=None, wrap=None, runs_from=16):
        self.memory = HostMemory(capacity)
        rng = self.memory.reserve(1 << 34)
        self.heap = PageHeap(wrap(rng) if wrap else rng, stream, runs_from=runs_from)
        self.checker = Checker(host=True, device=self.memory)

    def malloc(self, size):
        return self.heap.malloc(size)

    def alloc(self, size):
        return self.checker.alloc(self, size)

    def boundary(self):
        self.heap.synchronize()
        return self.heap.trim()


def pages_with_live_bytes(blocks) -> int:
    """The distinct pages the live blocks touch, counted from their addresses alone."""
    pages = set()
    for memptr, size, _ in blocks:
        pages.update(range(memptr.ptr // PAGE, (memptr.ptr + size - 1) // PAGE + 1))
    return len(pages)


def test_a_wholly_free_page_is_mapped_again_where_a_block_needs_memory():
    """Where the pages held have no gap for a block, the wholly free ones back the
    addresses it gets (the own heap would map new pages beside them)."""
    h = Heap()
    a = h.alloc(4 * MiB)  # pages 0-1
    b = h.alloc(2 * MiB)  # page 2
    h.checker.free(a)
    del a
    c = h.alloc(6 * MiB)  # no 6 MiB gap in the pages held: pages 0-1 remapped, one made
    assert h.heap.held == h.memory.in_use == 4 * PAGE
    # each block's pages mapped with one grant of access over them
    assert h.heap.calls == {"create": 4, "map": 6, "access": 3} and h.heap.stale == 2
    assert h.checker.intact(b) and h.checker.intact(c)
    h.boundary()  # the old mappings go; the pages held are those with live bytes
    # pages 0-1 lie side by side: one cuMemUnmap drops both
    assert h.heap.held == 4 * PAGE and h.heap.stale == 0 and h.heap.calls["unmap"] == 1
    for block in (b, c):
        assert h.checker.free(block)
    assert h.checker.corrupted == h.checker.overlaps == 0


@pytest.mark.parametrize("joins", [True, False])
def test_stale_pages_side_by_side_go_in_one_unmap_where_the_device_joins_them(joins):
    """The first boundary drops thousands of stale mappings; one ``cuMemUnmap`` costs about
    30 us on the H100, so a run of them goes in one call where the driver takes it."""
    h = Heap(runs_from=0)
    h.memory.joins_unmaps = joins
    a = h.alloc(10 * MiB)  # pages 0-4
    keep = h.alloc(2 * MiB)  # page 5
    h.checker.free(a)
    del a
    b = h.alloc(12 * MiB)  # the five idle pages remapped at fresh addresses, one made
    assert h.heap.stale == 5
    unmaps = h.memory.unmaps
    h.boundary()
    assert h.heap.stale == 0 and h.memory.unmaps - unmaps == (1 if joins else 5)
    assert h.heap.boundary_calls["unmap"] == (1 if joins else 5)
    assert h.checker.intact(keep) and h.checker.intact(b)
    c = h.alloc(10 * MiB)  # the addresses dropped are free again
    for block in (keep, b, c):
        assert h.checker.free(block)
    assert h.checker.corrupted == h.checker.overlaps == 0


def test_a_page_whose_blocks_died_is_mapped_again_at_fresh_addresses_not_made_again():
    h = Heap(runs_from=0)
    a = h.alloc(4 * MiB)  # two pages made
    assert h.heap.calls == {"create": 2, "map": 2, "access": 1}
    a_ptr = a[0].ptr
    assert h.checker.free(a)
    del a
    b = h.alloc(6 * MiB)  # three pages: the two idle ones remapped, one made
    assert b[0].ptr != a_ptr and h.heap.calls["create"] == 3 and h.heap.calls["map"] == 5
    assert h.heap.calls["access"] == 2
    assert h.heap.held == h.memory.in_use == 3 * PAGE
    assert h.heap.stale == 2  # their old mappings, dropped at the boundary
    assert h.checker.free(b)
    del b
    assert h.checker.corrupted == h.checker.overlaps == 0


def test_a_dead_run_of_the_same_size_is_handed_out_as_it_lies_without_a_call():
    h = Heap(runs_from=0)
    a = h.alloc(4 * MiB)
    a_ptr = a[0].ptr
    h.checker.free(a)
    del a
    before = dict(h.heap.calls)
    b = h.alloc(4 * MiB)
    assert b[0].ptr == a_ptr and h.heap.calls == before
    h.checker.free(b)


def test_small_requests_share_a_page_recycled_once_all_its_blocks_died():
    h = Heap()
    small = [h.alloc(10_000) for _ in range(100)]
    assert h.heap.held == PAGE and h.heap.calls["create"] == 1
    for block in small:
        assert h.checker.free(block)
    del small, block
    assert h.heap.used == 0
    again = [h.alloc(10_000) for _ in range(100)]  # the same page, from its start
    assert h.heap.held == PAGE and h.heap.calls["create"] == 1
    for block in again:
        assert h.checker.free(block)


def test_a_large_block_goes_on_from_the_last_ones_page_and_that_page_lives_while_either_does():
    h = Heap(runs_from=1)
    a = h.alloc(3 * MiB)  # two pages, 1 MiB free in the second
    b = h.alloc(3 * MiB)  # that 1 MiB, then one fresh page after it: three pages, not four
    assert b[0].ptr == a[0].ptr + 3 * MiB and h.heap.held == 3 * PAGE
    h.checker.free(a)
    del a
    assert h.heap.used == 2 * PAGE  # the page the two share stays
    h.boundary()
    assert h.heap.held == 2 * PAGE and h.checker.intact(b)
    h.checker.free(b)


def test_small_blocks_are_placed_best_fit_in_the_pages_they_hold():
    h = Heap()
    blocks = [h.alloc(MiB // 2) for _ in range(8)]  # two pages
    freed, blocks = blocks[::2], blocks[1::2]
    for block in freed:
        h.checker.free(block)
    del freed, block
    again = [h.alloc(MiB // 2) for _ in range(4)]  # in the holes: no page more
    assert h.heap.held == 2 * PAGE and h.heap.calls["create"] == 2
    assert h.checker.corrupted == h.checker.overlaps == 0
    del blocks, again


@pytest.mark.parametrize("runs_from", [0, 16])
def test_at_a_boundary_the_pages_held_are_those_with_live_bytes_and_no_block_is_lent_twice(
        runs_from):
    h = Heap(runs_from=runs_from)
    rnd = random.Random(7)
    live = []
    for step in range(3000):
        if live and rnd.random() < 0.5:
            assert h.checker.free(live.pop(rnd.randrange(len(live))))
        else:
            size = rnd.choice([rnd.randrange(1, 4096), rnd.randrange(1, MiB),
                               rnd.randrange(MiB, 9 * MiB)])
            live.append(h.alloc(size))
        if step % 300 == 299:
            calls = dict(h.heap.calls)
            h.boundary()
            assert h.heap.held == h.heap.used == pages_with_live_bytes(live) * PAGE
            assert h.heap.stale == 0 and h.memory.in_use == h.heap.held
            # the boundary's calls: one unmap per stale mapping, one release per idle page
            assert sum(h.heap.boundary_calls.values()) == \
                sum(h.heap.calls.values()) - sum(calls.values())
    assert all(h.checker.intact(block) for block in live)
    assert h.checker.corrupted == h.checker.overlaps == 0
    assert h.heap.requests == h.checker.serial


def test_the_heap_makes_a_page_only_when_no_idle_one_is_left():
    """Runs of their own: within an iteration, the pages held never pass the most pages
    live at once."""
    h = Heap(runs_from=0)
    rnd = random.Random(3)
    live, most = [], 0
    for _ in range(2000):
        if live and rnd.random() < 0.5:
            h.checker.free(live.pop(rnd.randrange(len(live))))
        else:
            live.append(h.alloc(rnd.randrange(MiB, 9 * MiB)))
        most = max(most, pages_with_live_bytes(live))
        assert h.heap.held <= most * PAGE
    assert h.checker.corrupted == 0


def refused_inside(rng, name: str, when: set[int], error: BaseException):
    """``rng`` whose own ``name`` calls (those its other methods make too) are refused at
    the uses in ``when`` (0 = the first)."""
    real, uses = getattr(rng, name), [0]

    def call(*args, **kwargs):
        k, uses[0] = uses[0], uses[0] + 1
        if k in when:
            raise error
        return real(*args, **kwargs)

    setattr(rng, name, call)
    return rng


@pytest.mark.parametrize("call, when", [("map_page", {3}), ("grant", {1})])
@pytest.mark.parametrize("error", [MemoryError("device full"),
                                   DeviceError("cuMemMap", 2, "refused")])
@pytest.mark.parametrize("runs_from", [0, 16])
def test_a_refused_map_or_grant_maps_none_of_the_run_lends_nothing_and_the_heap_goes_on(
        call, when, error, runs_from):
    """A run of pages is mapped with one grant of access over it, all or nothing: a map
    refused half-way, or the grant, leaves none of the run mapped; its pages serve the
    next request."""
    h = Heap(wrap=lambda rng: refused_inside(rng, call, when, error), runs_from=runs_from)
    a = h.alloc(4 * MiB)  # maps 0 and 1, one grant
    mapped = len(h.heap.range.mappings())
    with pytest.raises(type(error)):
        h.alloc(6 * MiB)  # maps 2, then 3 is refused; or the grant over 2-4 is
    assert len(h.heap.range.mappings()) == mapped  # none of the run stays mapped
    b = h.alloc(6 * MiB)
    assert h.heap.calls["create"] == 5  # the refused run's pages made once, used by b
    c = h.alloc(100)
    assert h.checker.corrupted == h.checker.overlaps == 0
    for block in (a, b, c):
        assert h.checker.free(block)
    del a, b, c, block
    h.boundary()
    assert h.heap.held == h.heap.used == h.memory.in_use == 0


@pytest.mark.parametrize("runs_from", [0, 16])
def test_a_full_device_refuses_a_new_page_and_keeps_the_idle_ones_for_the_next_request(
        runs_from):
    h = Heap(capacity=4 * PAGE, runs_from=runs_from)
    a = h.alloc(6 * MiB)  # three pages
    with pytest.raises(MemoryError):
        h.alloc(4 * MiB)  # one idle page is missing: one made, the device refuses
    assert h.heap.held <= 4 * PAGE
    h.checker.free(a)
    del a
    b = h.alloc(8 * MiB)  # the three idle pages and the one made
    assert h.heap.held == 4 * PAGE and h.checker.corrupted == 0
    h.checker.free(b)


def test_a_refused_unmap_keeps_the_mapping_listed_and_the_next_boundary_drops_it():
    h = Heap(wrap=lambda rng: Refusing(rng, "unmap_pages", {0}, DeviceError("cuMemUnmap", 1,
                                                                            "refused")),
             runs_from=0)
    a = h.alloc(4 * MiB)
    h.checker.free(a)
    del a
    b = h.alloc(6 * MiB)  # two remapped: two stale mappings
    with pytest.raises(DeviceError):
        h.boundary()
    assert h.heap.stale == 2  # nothing was dropped
    h.boundary()
    assert h.heap.stale == 0 and h.heap.held == h.heap.used == 3 * PAGE
    assert h.checker.free(b)


def test_a_death_on_another_stream_is_reused_only_after_a_device_sync():
    current = [1]
    h = Heap(stream=lambda: current[0])
    a = h.heap.malloc(4 * MiB)
    a_ptr = a.ptr
    current[0] = 2
    syncs = h.memory.sync_calls
    b = h.heap.malloc(MiB)  # the heap moves to stream 2: one device sync
    assert h.memory.sync_calls == syncs + 1
    current[0] = 1
    c = h.heap.malloc(MiB)  # back to stream 1 (one more sync)
    del a  # dies on stream 1 while the heap serves stream 1: reusable at once
    d = h.heap.malloc(4 * MiB)
    assert d.ptr == a_ptr
    current[0] = 2
    e = h.heap.malloc(MiB)
    del d  # died on stream 1 while the heap serves stream 2
    f = h.heap.malloc(4 * MiB)
    assert f.ptr != a_ptr  # quarantined until the next sync
    del b, c, e, f


@pytest.mark.parametrize("name", ["h100-alexnet-train-b32", "serving"])
def test_a_whole_run_on_the_page_heap_keeps_every_block_intact(name):
    from pgmo import workloads

    from .test_footprint import real_run

    run = workloads.make(name) if name in workloads.names() \
        else real_run(name.removeprefix("h100-"), iterations=4)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit", heap="pages")(None)
    assert pool.stats().heap_kind == "page heap (recycled pages)"
    mine = footprint.measure(run, pool, write="ends")
    own_pool = footprint.pgmo_pool(replan="sync", method="bestfit", heap="own")(None)
    own = footprint.measure(run, own_pool, write=False)
    pool.close()
    own_pool.close()
    assert mine.completed and mine.corrupted == 0
    assert mine.peak <= own.peak  # the first iterations hold no packing, only live pages


def test_heap_pages_is_a_pool_option_and_says_which_heap_serves():
    from pgmo.engine import pool_options

    assert pool_options(heap="pages").heap == "pages"
    with pytest.raises(ValueError, match="unknown heap 'paged'; choose one of own, driver, pages"):
        pool_options(heap="paged")


def test_a_range_that_maps_no_pages_of_their_own_falls_back_to_the_own_heap_with_its_reason():
    from pgmo.engine import Engine, pool_options
    from pgmo.measure.hosts import host_backend

    backend = host_backend()
    reserve = backend.reserve
    assert reserve is not None

    class Plain:  # a reserved range without create_page / map_page / ...
        def __init__(self, size):
            self._rng = reserve(size)

        def __getattr__(self, name):
            if name in ("create_page", "map_page", "unmap_page", "release_page",
                        "pages_held"):
                raise AttributeError(name)
            return getattr(self._rng, name)

    import dataclasses

    engine = Engine(dataclasses.replace(backend, reserve=Plain),
                    pool_options(heap="pages", replan="sync", method="bestfit"))
    block = engine.malloc(4 * MiB)
    stats = engine.stats()
    assert stats.heap_kind == "own heap (reserved range)"
    assert "maps no pages of their own" in stats.device_reasons["heap"]
    del block
    engine.close()


def test_while_a_plan_is_awaited_each_boundary_drops_the_old_mappings_after_one_sync():
    """Rule 1 of memory.py: a repeating run waiting for its plan keeps its pages for the next
    iteration, and the mappings its remapped pages left go at the boundary."""
    from pgmo.measure.hosts import host_engine

    engine = host_engine(heap="pages", warmup=3, replan="sync", method="bestfit")
    device = engine.host_device
    for _ in range(2):
        with engine.iteration():
            blocks = [engine.malloc(size * MiB) for size in (40, 2, 40)]
            del blocks[0]  # its pages back the next block where the first one's were
            blocks.append(engine.malloc(60 * MiB))
            del blocks
            heap = engine.memory.heap
            stale = heap.stale  # pages remapped into the 60 MiB block: their old mappings
        # the stale pages lie in runs: one cuMemUnmap per run
        assert stale >= 20 and heap.stale == 0 and 1 <= heap.boundary_calls["unmap"] <= 2
    syncs = device.sync_calls
    held = heap.held
    with engine.iteration():
        blocks = [engine.malloc(size * MiB) for size in (40, 2, 40)]
        del blocks[0]
        blocks.append(engine.malloc(60 * MiB))
        del blocks
    assert device.sync_calls - syncs <= 1 and heap.held == held  # its pages kept, no new one
    engine.close()


def test_the_address_helpers_the_page_heap_uses():
    from pgmo.placement import PagedSpace, Placer

    p = Placer(100, [(10, 20)])
    assert p.largest() == (20, 80) and p.gap_at(0) == 10 and p.gap_at(5) == 0
    space = PagedSpace(8 * PAGE, PAGE)
    lo = space.place(3 * PAGE)
    space.set_backed(0, 3, True)
    space.free.release(lo, lo + PAGE)  # page 0 wholly free, pages 1-2 still used
    assert space.take_idle(5) == [0]  # taken out of the free space, no longer backed
    assert space.place(PAGE) != 0 and not space.backed[0]
    space.set_backed(1, 6, True)  # pages 1-2 backed already: 3 more
    space.set_backed(5, 8, False)
    assert space.backed_pages == space.backed.count(1) == 4  # counted, never scanned


# ------------------------------------------------------------------------ a Ctrl-C
def churn(h: Heap, seed: int, steps: int = 40, interrupted=None):
    """Random requests and frees over every path of the heap (small blocks, runs, the last
    run's last page, dead runs, idle pages remapped), a boundary half-way; a Ctrl-C
    (``interrupted``) is caught where a user would, around each call, and the run goes on.
    Every block is written and checked; what is left is freed."""
    rnd = random.Random(seed)
    live = []

    def caught(call):
        try:
            return call()
        except interrupted or ():
            return None

    for step in range(steps):
        if step == steps // 2:
            caught(h.boundary)
        if live and rnd.random() < 0.45:
            block = live.pop(rnd.randrange(len(live)))
            assert h.checker.free(block)
            del block
        else:
            size = rnd.choice([700, 64 * 1024, 1 * MiB, 3 * MiB, 5 * MiB, 9 * MiB, 33 * MiB])
            block = caught(lambda: h.alloc(size))
            if block is not None:
                live.append(block)
    for block in live:
        assert h.checker.free(block)
    del live, block
    caught(h.boundary)
    assert h.checker.corrupted == h.checker.overlaps == 0


def test_a_ctrl_c_at_any_line_of_a_request_never_lends_a_page_twice_and_the_heap_goes_on():
    """A Ctrl-C caught by the user at any line of the heap's request (and of the placement
    it calls), the run going on: no block shares a byte with a live one, every later call
    works.  (A Ctrl-C there may cost the pages it was placing: they stay held until the
    heap goes.)"""
    from .interrupts import Injector, Interrupt

    functions = frozenset({"malloc", "_collect", "_died", "_place_small", "_place_large",
                           "_run", "_dead_run", "_after", "_map_fresh", "_map_run",
                           "_take_pages", "place", "take", "release", "take_idle",
                           "unbacked", "set_backed", "largest", "gap_at"})
    with Injector(functions=functions) as counting:
        churn(Heap(runs_from=2), seed=3)
    assert counting.seen > 300
    for at in range(1, counting.seen, max(1, counting.seen // 120)):
        h = Heap(runs_from=2)
        with Injector(at=at, functions=functions) as injector:
            churn(h, seed=3, interrupted=Interrupt)
        assert injector.fired == 1, at


def test_a_real_ctrl_c_inside_a_boundarys_trim_or_tidy_waits_for_it_to_end():
    """A boundary's calls give pages back and drop mappings in steps that must not part
    (a page released twice, a mapping dropped and still listed): a Ctrl-C there is held
    and acted on as the call ends, with the books whole."""
    from .interrupts import Injector

    functions = frozenset({"trim", "tidy"})
    with Injector(functions=functions, real=True) as counting:  # (counts only)
        churn(Heap(runs_from=2), seed=5)
    assert counting.seen > 50
    for at in range(1, counting.seen, max(1, counting.seen // 60)):
        h = Heap(runs_from=2)
        with Injector(at=at, functions=functions, real=True) as injector:
            churn(h, seed=5, interrupted=KeyboardInterrupt)
        assert injector.fired == 1
        gc.collect()  # the interrupt's traceback held the last block a while
        h.boundary()  # nothing was left half done
        assert h.heap.held == h.heap.used == h.memory.in_use == 0 and h.heap.stale == 0


def test_a_ctrl_c_as_a_runs_mapping_returns_leaves_the_run_booked_and_the_heap_goes_on():
    """The CUDA layer holds a Ctrl-C through its call and raises it as the call returns, the
    run mapped: the heap books the run's pages as mapped and idle (the range's books say
    so, whatever the exception), so their addresses are never mapped again while mapped
    and the pages serve the next requests."""
    def ctrl_c_after(rng):
        real = rng.map_pages

        def map_pages(*args):
            real(*args)
            raise KeyboardInterrupt  # as :func:`pgmo.device.whole_calls.whole` delivers it

        rng.map_pages = map_pages
        return rng

    for size in (3 * MiB, 40 * MiB):  # a small block's pages; a run
        h = Heap(wrap=ctrl_c_after)
        with pytest.raises(KeyboardInterrupt):
            h.alloc(size)
        h.heap.range.map_pages = type(h.heap.range).map_pages.__get__(h.heap.range)
        blocks = [h.alloc(size) for _ in range(3)]
        assert h.checker.corrupted == h.checker.overlaps == 0
        for block in blocks:
            assert h.checker.free(block)
        del blocks, block
        h.boundary()  # the interrupted request's pages were given back with the rest
        assert h.heap.held == h.memory.in_use == 0 and h.heap.stale == 0


def test_a_refused_map_whose_undo_is_refused_too_retires_the_heap_with_a_device_error():
    """Two refusals in a row (a grant refused, then the unmap that undoes the run's maps)
    leave pages mapped that the heap did not place: it places nothing more (DeviceError,
    so the engine's next heap serves: rule 7 of pgmo/engine/memory.py), and never hands
    those addresses out."""
    h = Heap(wrap=lambda rng: refused_inside(
        refused_inside(rng, "grant", {1}, MemoryError("device full")),
        "unmap_page", {0}, DeviceError("cuMemUnmap", 2, "refused")))
    a = h.alloc(4 * MiB)
    for _ in range(2):
        with pytest.raises(DeviceError, match="left pages mapped"):
            h.alloc(40 * MiB)
    assert h.checker.intact(a) and h.checker.free(a)


def test_the_engine_moves_to_its_next_heap_when_the_page_heap_retires():
    from pgmo.measure.hosts import host_engine

    engine = host_engine(heap="pages", replan="sync", method="bestfit")
    a = engine.malloc(4 * MiB)  # the page heap serves
    refused_inside(refused_inside(engine.memory.heap.range, "grant", {0},
                                  MemoryError("device full")),
                   "unmap_page", {0}, DeviceError("cuMemUnmap", 2, "refused"))
    b = engine.malloc(40 * MiB)  # the page heap retires; the next heap serves it
    stats = engine.stats()
    assert stats.heap_kind != "page heap (recycled pages)"
    assert "left pages mapped" in stats.device_reasons["heap"]
    assert a.ptr + 4 * MiB <= b.ptr or b.ptr + 40 * MiB <= a.ptr
    del a, b
    engine.close()
