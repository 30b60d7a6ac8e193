"""The engine alone, with pure-Python memory sources: modes, clock, safety rules."""

from __future__ import annotations

import gc
import threading

import pytest

from pgmo._engine import Engine, round_size

ARENA_BASE = 1 << 40
FALLBACK_BASE = 1 << 50


class FakeBuffer:
    def __init__(self, ptr, size, log):
        self.ptr, self.size, self._log = ptr, size, log

    def __del__(self):
        self._log.append(("arena freed", self.ptr, self.size))


class FakeArenaAllocator:
    """Hands out non-overlapping fake addresses; records allocations and frees."""

    def __init__(self, fail=False):
        self.next = ARENA_BASE
        self.log = []
        self.fail = fail

    def __call__(self, size):
        if self.fail:
            raise MemoryError("no memory for the arena")
        ptr = self.next
        self.next += size + (1 << 20)
        self.log.append(("arena", ptr, size))
        return FakeBuffer(ptr, size, self.log)


class FakeBlock:
    def __init__(self, pool, ptr, size):
        self.ptr, self.size, self._pool = ptr, size, pool

    def __del__(self):
        self._pool.used -= self.size
        self._pool.free += self.size


class FakeFallback:
    """A fallback that never reuses addresses: overlaps can only come from the arena."""

    def __init__(self):
        self.next = FALLBACK_BASE
        self.used = self.free = 0
        self.limit = 0
        self.calls = 0

    def malloc(self, size):
        rs = round_size(size)
        self.calls += 1
        ptr = self.next
        self.next += rs
        self.used += rs
        return FakeBlock(self, ptr, rs)

    def used_bytes(self):
        return self.used

    def free_bytes(self):
        return self.free

    def total_bytes(self):
        return self.used + self.free

    def n_free_blocks(self):
        return 1 if self.free else 0

    def free_all_blocks(self):
        self.free = 0

    def set_limit(self, size=None):
        self.limit = size


class Ptr:
    """What the user holds; keeps its memory object (the lease) alive like CuPy's pointer."""

    __slots__ = ("ptr", "size", "mem")

    def __init__(self, mem, offset):
        self.ptr, self.size, self.mem = mem.ptr + offset, mem.size, mem

    @property
    def in_arena(self):
        return self.ptr < FALLBACK_BASE


class Checked:
    """Engine plus a ledger asserting that live blocks never share an address."""

    def __init__(self, **kw):
        self.arena_alloc = FakeArenaAllocator(kw.pop("arena_fail", False))
        self.fallback = FakeFallback()
        kw.setdefault("method", "bestfit")
        self.engine = Engine(self.arena_alloc, self.fallback, pointer_type=Ptr, **kw)
        self.live = {}

    def malloc(self, size):
        p = self.engine.malloc(size)
        for other in self.live.values():
            assert not (p.ptr < other.ptr + other.size and other.ptr < p.ptr + p.size), \
                "the engine handed out an address in use"
        self.live[id(p)] = p
        return p

    def free(self, p):
        del self.live[id(p)]

    def iteration(self, sizes_and_frees):
        """Run ops: an int allocates that many bytes, ('f', k) frees the k-th block."""
        e = self.engine
        e.begin_iteration()
        blocks = []
        for op in sizes_and_frees:
            if isinstance(op, int):
                blocks.append(self.malloc(op))
            else:
                p = blocks[op[1]]
                blocks[op[1]] = None
                self.free(p)
                del p
        e.end_iteration()
        return blocks


HOT = [1000, 2000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]


def test_profile_follows_the_event_clock():
    c = Checked(warmup=0)
    c.iteration(HOT)
    prof = c.engine.profile
    rows = [(b.id, b.lower, b.upper, b.size) for b in prof.blocks]
    # ticks: a0=0 a1=1 f0=2 a2=3 f1=4 a3=5 f2=6 f3=7
    assert rows == [(0, 0, 2, 1024), (1, 1, 4, 2048), (2, 3, 6, 3072), (3, 5, 7, 512)]
    assert c.engine.plan is not None and c.engine.mode == "optimized"


def test_warmup_then_profile_then_arena():
    c = Checked(warmup=2)
    e = c.engine
    modes = []
    for _ in range(5):
        modes.append(e.mode)
        c.iteration(HOT)
    # two warm-up iterations, one profiled, then the plan
    assert modes == ["profiling", "profiling", "profiling", "optimized", "optimized"]
    assert e.profiled_requests == 12 and e.planned_requests == 8
    assert e.fallback_requests == 0 and e.departures == 0 and e.reoptimizations == 0
    assert e.arena_bytes() >= e.plan.peak == e.plan.lower_bound == 2048 + 3072


def test_hot_iterations_reuse_one_arena_and_never_touch_the_fallback():
    c = Checked(warmup=1)
    for _ in range(2):
        c.iteration(HOT)
    calls = c.fallback.calls
    for _ in range(10):
        c.iteration(HOT)
    assert c.fallback.calls == calls
    assert len([x for x in c.arena_alloc.log if x[0] == "arena"]) == 1


def test_block_kept_past_its_planned_free_goes_to_the_fallback():
    c = Checked(warmup=0)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # request 1 reuses request 0's bytes
    e = c.engine
    assert e.plan.offsets == (0, 0)
    late = [1000, 1000, ("f", 1), ("f", 0)]  # request 0 now outlives request 1's start
    blocks = []
    e.begin_iteration()
    blocks.append(c.malloc(1000))
    blocks.append(c.malloc(1000))
    assert blocks[0].in_arena and not blocks[1].in_arena
    assert e.departures == 1 and e.fallback_requests == 1
    c.live.clear()
    blocks.clear()
    e.end_iteration()
    assert e.reoptimizations == 1  # re-solved with the later free
    c.iteration(late)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # the old pattern still fits
    assert e.departures == 1 and e.reoptimizations == 1
    assert e.planned_requests == 1 + 4


def test_block_from_last_iteration_still_alive_is_never_overwritten():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    kept = c.iteration([1000, 2000, ("f", 1), 3000, ("f", 2), 500, ("f", 3)])  # keeps block 0
    loss = kept[0]
    assert loss is not None
    for _ in range(4):  # the ledger in Checked.malloc fails on any overlap
        c.iteration(HOT)
    c.free(loss)
    del loss, kept
    c.iteration(HOT)
    assert e.reoptimizations >= 1  # the survivor was pinned by a re-solve


def test_bigger_request_diverges_the_rest_and_is_resolved_at_the_boundary():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    peak = e.plan.peak
    c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
    assert e.departures == 1 and e.reoptimizations == 1
    assert e.fallback_requests == 3  # request 1 and the rest of the iteration
    assert e.plan.peak > peak
    assert e.profile.blocks[1].size == round_size(9000)
    before = e.planned_requests
    c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
    c.iteration(HOT)  # smaller again: still fits
    assert e.planned_requests == before + 8
    assert e.reoptimizations == 1


def test_more_requests_than_planned_are_recorded_and_planned_next_time():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    longer = HOT + [700, 800, ("f", 4), ("f", 5)]
    c.iteration(longer)
    assert e.reoptimizations == 1 and len(e.profile) == 6
    hits = e.planned_requests
    c.iteration(longer)
    assert e.planned_requests == hits + 6


def test_old_arena_lives_while_its_blocks_live():
    c = Checked(warmup=0)
    c.iteration([1000, ("f", 0)])
    e = c.engine
    e.begin_iteration()
    small = c.malloc(1000)
    e.end_iteration()  # survivor -> re-solve, arena reused or replaced
    assert small.in_arena
    c.iteration([50_000, ("f", 0)])  # grows the plan: a new, bigger arena
    c.iteration([50_000, ("f", 0)])
    freed = [x for x in c.arena_alloc.log if x[0] == "arena freed"]
    assert not any(ptr == small.ptr for _, ptr, _ in freed)
    c.free(small)
    del small
    c.iteration([50_000, ("f", 0)])
    gc.collect()
    freed = [x for x in c.arena_alloc.log if x[0] == "arena freed"]
    assert freed, "the old arena was never released"


def test_frees_from_other_threads_and_after_the_engine_is_gone():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    blocks = [c.malloc(1000), c.malloc(2000)]
    c.live.clear()
    t = threading.Thread(target=blocks.clear)
    t.start()
    t.join()
    e.end_iteration()
    assert e.snapshot()["live_bytes"] == 0
    e.begin_iteration()
    late = e.malloc(1000)
    e.end_iteration()
    c.engine = e = None
    gc.collect()
    del late  # the engine is gone: must not raise


def test_requests_from_another_thread_are_outside_the_plan():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    out = []
    t = threading.Thread(target=lambda: out.append(e.malloc(4096)))
    t.start()
    t.join()
    assert not out[0].in_arena
    assert e.foreign_requests == 1
    out.clear()
    e.end_iteration()
    assert e.reoptimizations == 0


def test_other_context_is_outside_the_plan():
    ctx = {"stream": 1}
    c = Checked(warmup=0, context=lambda: ctx["stream"])
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    a = c.malloc(1000)
    ctx["stream"] = 2
    b = c.malloc(1000)
    ctx["stream"] = 1
    assert a.in_arena and not b.in_arena
    assert e.foreign_requests == 1
    c.live.clear()
    del a, b
    e.end_iteration()


def test_interrupted_requests_are_not_numbered():
    c = Checked(warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.begin_iteration()
    e.interrupt()
    x = c.malloc(123456)
    assert e.mode == "fallback" and not x.in_arena
    e.resume()
    a = c.malloc(1000)
    assert a.in_arena and e.mode == "optimized"
    assert e.interrupted_requests == 1
    c.live.clear()
    del a, x
    e.end_iteration()
    assert e.reoptimizations == 0


def test_misuse_gives_clear_errors():
    c = Checked()
    e = c.engine
    with pytest.raises(RuntimeError, match="without begin_iteration"):
        e.end_iteration()
    with pytest.raises(RuntimeError, match="without interrupt"):
        e.resume()
    with pytest.raises(RuntimeError, match="nothing to optimize"):
        e.optimize()
    e.begin_iteration()
    with pytest.raises(RuntimeError, match="inside an iteration"):
        e.begin_iteration()
    e.end_iteration()
    with pytest.raises(ValueError, match="unknown method"):
        Engine(c.arena_alloc, c.fallback, pointer_type=Ptr, method="magic")
    with pytest.raises(ValueError, match="warmup"):
        Engine(c.arena_alloc, c.fallback, pointer_type=Ptr, warmup=-1)


def test_optimize_forces_a_plan_after_warmup_only():
    c = Checked(warmup=5)
    c.iteration(HOT)
    e = c.engine
    assert e.plan is None and e.mode == "profiling"
    plan = e.optimize()
    assert plan.peak >= plan.lower_bound > 0
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.planned_requests == 4


def test_arena_failure_keeps_serving_from_the_fallback():
    c = Checked(warmup=0, arena_fail=True)
    for _ in range(3):
        c.iteration(HOT)
    e = c.engine
    assert e.arena_failures >= 1 and e.planned_requests == 0
    assert e.mode == "profiling"


def test_survivors_are_pinned_to_the_fallback():
    c = Checked(warmup=0)
    keep = []
    for _ in range(4):
        blocks = c.iteration(HOT + [64])  # the last block outlives every iteration
        keep.append(blocks[-1])
    e = c.engine
    assert 4 in e._pinned
    assert not keep[-1].in_arena
    assert e.reoptimizations == 0  # profiled with the survivor: nothing to re-solve
    c.live.clear()


def test_optimize_in_the_middle_of_a_planned_iteration():
    c = Checked(warmup=0)
    c.iteration(HOT + [700, ("f", 4)])
    e = c.engine
    e.begin_iteration()
    a = c.malloc(1000)
    e._prof = ([1024], [0], [1])  # a shorter profile, as a loaded plan might have
    e.optimize()
    rest = [c.malloc(s) for s in (2000, 3000, 500, 700)]
    assert a.in_arena and not any(p.in_arena for p in rest)
    c.live.clear()
    del a, rest
    e.end_iteration()  # the mixed log is not merged into anything
    assert len(e.profile) == 1 and e.reoptimizations == 0
    c.iteration(HOT)  # beyond the one planned request: re-solved from this log
    assert e.reoptimizations == 1 and len(e.profile) == 4
