"""The arenas as the engine uses them: an old arena lives while its blocks do and goes
back at its last free, a refused arena, survivors' buffers, frees recorded in the inbox.

Tests pgmo.engine.memory, pgmo.engine.kept and pgmo.engine.frees.
"""

from __future__ import annotations

import gc
import sys

import pytest

from pgmo.engine import reference_handout
from pgmo.engine import handout as compiled_handout

from .engine_bench import ARENA_BASE, HOT_PATHS, FakeBuffer, Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)


def test_old_arena_lives_while_its_blocks_live(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration([1000, ("f", 0)])
    e = c.engine
    e.begin_iteration()
    small = c.malloc(1000)
    e.end_iteration()  # survivor -> re-solve, arena reused or replaced
    assert c.in_plan(small)
    c.iteration([50_000, ("f", 0)])  # grows the plan: a new, bigger arena
    c.iteration([50_000, ("f", 0)])
    freed = [x for x in c.arena_alloc.log if x[0] == "arena freed"]
    assert not any(ptr <= small.ptr < ptr + size for _, ptr, size in freed)
    where = small.ptr
    c.free(small)
    del small
    c.iteration([50_000, ("f", 0)])
    gc.collect()
    freed = [x for x in c.arena_alloc.log if x[0] == "arena freed"]
    assert any(ptr <= where < ptr + size for _, ptr, size in freed), \
        "the old arena was never released"


def test_old_arena_is_given_back_when_its_last_free_is_applied(hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    c.iteration([1000, 2000, ("f", 0), ("f", 1)])
    e.begin_iteration()
    kept = c.malloc(1000)  # lives on past the boundary, in the first arena
    c.free(c.malloc(50_000))  # larger than planned: a re-plan with a bigger arena
    e.end_iteration()
    c.note_arena()
    first, second = c.arenas_taken()
    assert first[1] <= kept.ptr < first[1] + first[2]
    c.free(kept)
    del kept
    e.begin_iteration()
    c.malloc(1000)  # applies the free; nothing else is queued after it
    gc.collect()
    freed = [x[1] for x in c.arena_alloc.log if x[0] == "arena freed" and x[1] in c.arena_ptrs]
    assert freed == [first[1]], "applied frees must not keep an old arena alive"


@pytest.mark.parametrize("module", HOT_PATHS)
def test_inbox_keeps_frees_recorded_while_others_are_applied(module):
    frees = sys.modules[(reference_handout() if module == "reference"
                         else compiled_handout).__name__.replace("handout", "frees")]
    inbox = frees.Inbox()
    arena = frees.Arena(FakeBuffer(ARENA_BASE, 4096, []), 4096)
    for index in range(3):
        inbox.record(index, 7, 512 * (index + 1), arena if index == 2 else None)
    inbox.consumed(2)  # the third came in while the first two were applied
    assert inbox.count == 1
    assert inbox.sizes[0] == 1536 and inbox.arenas[0] is arena
    assert inbox.arenas[1:] == [None, None], "moved entries must not keep arenas alive"
    inbox.arenas[0] = None  # as the hot path's drain does before applying it
    inbox.consumed(1)
    assert inbox.count == 0
    inbox.record(9, 7, 512, None)  # the next free reuses the first slot
    assert inbox.count == 1 and len(inbox.keys) == 3 and inbox.sizes[0] == 512
    inbox.consumed(1)
    for index in range(5000):  # a burst: its room is given back once applied
        inbox.record(index, 7, 512, None)
    inbox.consumed(5000)
    assert inbox.count == 0 and inbox.keys == []


def test_arena_failure_keeps_serving_each_request_from_memory_of_its_own(hot_path):
    c = Checked(hot_path, warmup=0, arena_fail=True)
    for _ in range(3):
        c.iteration(HOT)
    st = c.engine.stats()
    assert st.arena_failures >= 1 and st.planned_requests == 0
    assert c.engine.mode == "fallback"  # what it actually does
    assert st.stock_bytes == 0 and st.total_bytes == 0  # no cache: nothing held between


def test_survivors_get_buffers_of_their_own_reused_each_iteration(hot_path):
    c = Checked(hot_path, warmup=0)
    keep = []
    for _ in range(4):
        blocks = c.iteration(HOT + [64])  # the last block outlives every iteration
        keep.append(blocks[-1])
    e = c.engine
    assert 4 in e.schedule.pinned
    assert not c.in_plan(keep[-1]) and not keep[-1].in_stock
    st = e.stats()
    assert st.reoptimizations == 0  # profiled with the survivor: nothing to re-solve
    # kept apart as planned: pinned, not a departure from the plan
    assert st.pinned_requests == 3 and st.departed_requests == 0 and st.departures == 0
    assert st.requests == st.profiled_requests + st.planned_requests + st.pinned_requests
    assert st.kept_bytes == 3 * 512  # three live survivors' buffers
    raw = len(c.arena_alloc.taken())
    c.live.clear()
    del blocks
    keep.clear()  # every survivor's buffer is idle now ...
    c.iteration(HOT + [64])
    assert len(c.arena_alloc.taken()) == raw  # ... and the next survivor reuses one
    c.iteration(HOT)  # no survivor: the idle buffers wait one iteration ...
    c.iteration(HOT)
    assert e.stats().kept_bytes == 512  # ... then go back (the last survivor still lives)
    c.live.clear()


def test_a_refused_growth_takes_the_plans_size_and_goes_on_planning(hot_path):
    c = Checked(hot_path, warmup=0)
    c.arena_alloc.fail_above = 1420
    memory = c.engine.memory
    memory.fit(1300)
    memory.fit(1400, varying=True)  # grows by the factor (1,430 bytes): refused ...
    arena = c.engine.hot.arena
    assert arena is not None and arena.size == 1400  # ... then the plan's own size
    assert memory.failures == 1 and not memory.blocked
    memory.fit(1024)  # a later plan still changes the arena
    assert c.engine.hot.arena.size == 1024
