"""The engine alone, with pure-Python memory sources: modes, clock, safety rules.

No CuPy here: the engine runs on fake sources whose addresses never repeat,
so any overlap can only come from the plan.  Every test runs against both
hot paths: the compiled one (when built) and the plain-Python reference.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import warnings

import pytest

from pgmo.engine import Backend, Engine, PgmoWarning, pool_options, reference_handout
from pgmo.engine import handout as compiled_handout
from pgmo.units import round_size

from .threads import CheckedThread

ARENA_BASE = 1 << 40
FALLBACK_BASE = 1 << 50

HOT_PATHS = ["reference"] + (["compiled"] if compiled_handout.COMPILED else [])


@pytest.fixture(params=HOT_PATHS)
def hot_path(request):
    return reference_handout().HotPath if request.param == "reference" \
        else compiled_handout.HotPath


class FakeBuffer:
    def __init__(self, ptr, size, log):
        self.ptr, self.size, self._log = ptr, size, log

    def __del__(self):
        self._log.append(("arena freed", self.ptr, self.size))


class FakeArenaAllocator:
    """The raw allocator (arenas and blocks of their own): non-overlapping fake addresses.

    Records allocations and frees; refuses sizes above ``fail_above``.
    """

    def __init__(self, fail_above=None):
        self.next = ARENA_BASE
        self.log = []
        self.fail_above = fail_above

    def __call__(self, size):
        if self.fail_above is not None and size > self.fail_above:
            raise MemoryError("no memory for the arena")
        ptr = self.next
        self.next += size + (1 << 20)
        self.log.append(("arena", ptr, size))
        return FakeBuffer(ptr, size, self.log)

    def taken(self):
        return [x for x in self.log if x[0] == "arena"]


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
    """What the user holds; keeps its memory object alive like CuPy's pointer."""

    __slots__ = ("ptr", "size", "mem")

    def __init__(self, mem, offset):
        self.ptr, self.size, self.mem = mem.ptr + offset, mem.size, mem

    @property
    def in_stock(self):
        return self.ptr >= FALLBACK_BASE


class Checked:
    """Engine plus a ledger asserting that live blocks never share an address."""

    def __init__(self, hot_path, arena_fail=False, context=None, **options):
        self.arena_alloc = FakeArenaAllocator(4096 if arena_fail else None)
        self.fallback = FakeFallback()
        options.setdefault("method", "bestfit")
        options.setdefault("replan", "sync")
        backend = Backend(self.arena_alloc, self.fallback, pointer_type=Ptr, context=context)
        self.engine = Engine(backend, pool_options(**options), hot_path=hot_path)
        self.live = {}
        self.arena_ptrs = set()

    def malloc(self, size):
        p = self.engine.malloc(size)
        for other in self.live.values():
            assert not (p.ptr < other.ptr + other.size and other.ptr < p.ptr + p.size), \
                "the engine handed out an address in use"
        self.live[id(p)] = p
        return p

    def free(self, p):
        del self.live[id(p)]

    def in_plan(self, p):
        """Whether ``p`` was carved from the current arena (not memory of its own)."""
        arena = self.engine.hot.arena
        return arena is not None and arena.ptr <= p.ptr < arena.ptr + arena.size

    def arenas_taken(self):
        """The raw allocations that became arenas, in order."""
        return [x for x in self.arena_alloc.taken() if x[1] in self.arena_ptrs]

    def note_arena(self):
        arena = self.engine.hot.arena
        if arena is not None:
            self.arena_ptrs.add(arena.ptr)

    def run(self, ops):
        """Run ops: an int allocates that many bytes, ('f', k) frees the k-th block."""
        blocks = []
        for op in ops:
            if isinstance(op, int):
                blocks.append(self.malloc(op))
            else:
                p = blocks[op[1]]
                blocks[op[1]] = None
                self.free(p)
                del p
        return blocks

    def iteration(self, ops):
        e = self.engine
        e.begin_iteration()
        self.note_arena()
        blocks = self.run(ops)
        e.end_iteration()
        self.note_arena()
        return blocks


HOT = [1000, 2000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]


def test_profile_follows_the_event_clock(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    prof = c.engine.profile
    rows = [(b.id, b.lower, b.upper, b.size) for b in prof.blocks]
    # ticks: a0=0 a1=1 f0=2 a2=3 f1=4 a3=5 f2=6 f3=7
    assert rows == [(0, 0, 2, 1024), (1, 1, 4, 2048), (2, 3, 6, 3072), (3, 5, 7, 512)]
    assert c.engine.plan is not None and c.engine.mode == "optimized"


def test_warmup_then_profile_then_arena(hot_path):
    c = Checked(hot_path, warmup=2)
    e = c.engine
    modes = []
    for _ in range(5):
        modes.append(e.mode)
        c.iteration(HOT)
    # two warm-up iterations, one profiled, then the plan
    assert modes == ["warmup", "warmup", "profiling", "optimized", "optimized"]
    st = e.stats()
    assert st.profiled_requests == 12 and st.planned_requests == 8
    assert st.departed_requests == 0 and st.departures == 0 and st.reoptimizations == 0
    assert st.arena_bytes >= e.plan.peak == e.plan.lower_bound == 2048 + 3072
    assert st.plan_method == "bestfit" and st.iteration_source == "marked"


def test_hot_iterations_reuse_one_arena_and_allocate_nothing(hot_path):
    c = Checked(hot_path, warmup=1)
    for _ in range(2):
        c.iteration(HOT)
    raw, stock = len(c.arena_alloc.taken()), c.fallback.calls
    assert stock == 0  # warm-up and profiling took memory of their own, not the stock pool's
    arena = c.engine.hot.arena
    for _ in range(10):
        c.iteration(HOT)
    assert (len(c.arena_alloc.taken()), c.fallback.calls) == (raw, 0)
    assert c.engine.hot.arena is arena and len(c.arenas_taken()) == 1


def test_block_kept_past_its_planned_free_sends_the_request_off_the_plan(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # request 1 reuses request 0's bytes
    e = c.engine
    assert e.plan.offsets == (0, 0)
    late = [1000, 1000, ("f", 1), ("f", 0)]  # request 0 now outlives request 1's start
    e.begin_iteration()
    blocks = [c.malloc(1000), c.malloc(1000)]
    assert c.in_plan(blocks[0]) and not c.in_plan(blocks[1])
    assert not blocks[1].in_stock  # memory of its own: nothing cached after it
    st = e.stats()
    assert st.departures == 1 and st.departed_requests == 1 and st.exact_bytes == 1024
    c.live.clear()
    blocks.clear()
    e.end_iteration()
    assert e.stats().reoptimizations == 1  # re-solved with the later free
    c.iteration(late)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # the old pattern still fits
    st = e.stats()
    assert st.departures == 1 and st.reoptimizations == 1
    assert st.planned_requests == 1 + 4


def test_block_from_last_iteration_still_alive_is_never_overwritten(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    kept = c.iteration([1000, 2000, ("f", 1), 3000, ("f", 2), 500, ("f", 3)])  # keeps block 0
    loss = kept[0]
    assert loss is not None and c.in_plan(loss)
    for _ in range(4):  # the ledger in Checked.malloc fails on any overlap
        c.iteration(HOT)
    c.free(loss)
    del loss, kept
    c.iteration(HOT)
    assert e.stats().reoptimizations >= 1  # the survivor was pinned by a re-solve


def test_bigger_request_diverges_the_rest_and_is_resolved_at_the_boundary(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    peak = e.plan.peak
    bigger = [1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]
    c.iteration(bigger)
    st = e.stats()
    assert st.departures == 1 and st.reoptimizations == 1
    assert st.departed_requests == 3  # request 1 and the rest of the iteration
    assert e.plan.peak > peak
    assert e.profile.blocks[1].size == round_size(9000)
    before = st.planned_requests
    c.iteration(bigger)
    c.iteration(HOT)  # smaller again: still fits
    st = e.stats()
    assert st.planned_requests == before + 8
    assert st.reoptimizations == 1


def _run_with_every_request_slow(c, hooked):
    """Send every request of ``c`` through the engine's slow path (as memory hooks do)."""
    calls = []

    def serve(size):
        calls.append(size)
        return c.engine.serve_unhooked(size)

    if hooked:
        c.engine.report_to_hooks(lambda: {"hook": object()}, serve)
    return calls


def test_the_inline_and_the_slow_path_make_the_same_hand_out_decision(hot_path):
    """Planned, late-freed, larger, extra and surviving requests: served alike (the same
    addresses, the same counts) whether the inline path or the slow path decides."""
    late = [1000, 2000, 3000, ("f", 0), ("f", 1), 500, ("f", 2), ("f", 3)]
    bigger = [1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]
    more = HOT + [700, ("f", 4)]
    outcomes = []
    for hooked in (False, True):
        c = Checked(hot_path, warmup=0)
        calls = _run_with_every_request_slow(c, hooked)
        kept, pointers = [], []
        for ops in (HOT, HOT, late, HOT, bigger, more, HOT, HOT + [64], HOT + [64]):
            blocks = c.iteration(ops)
            pointers.append([b.ptr for b in blocks if b is not None])
            kept.append(blocks[-1])
        st = c.engine.stats()
        assert (len(calls) > 0) == hooked  # the hooked engine served every request slowly
        outcomes.append((pointers, st))
    (inline, inline_stats), (slow, slow_stats) = outcomes
    assert inline == slow
    assert inline_stats == slow_stats
    assert inline_stats.departures >= 3 and inline_stats.departed_requests >= 3
    assert inline_stats.pinned_requests >= 1 and inline_stats.planned_requests > 0


def test_a_departure_is_counted_once_on_either_path(hot_path):
    for hooked in (False, True):
        c = Checked(hot_path, warmup=0)
        _run_with_every_request_slow(c, hooked)
        c.iteration(HOT)
        c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
        st = c.engine.stats()
        assert (st.departures, st.departed_requests, st.planned_requests) == (1, 3, 1)


def test_more_requests_than_planned_are_recorded_and_planned_next_time(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    longer = HOT + [700, 800, ("f", 4), ("f", 5)]
    c.iteration(longer)
    assert e.stats().reoptimizations == 1 and len(e.profile) == 6
    hits = e.stats().planned_requests
    c.iteration(longer)
    assert e.stats().planned_requests == hits + 6


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


#: The queries that read or change what the engine holds: each waits for the engine.
LOCKED_QUERIES = ["stats", "used_bytes", "free_bytes", "total_bytes", "n_free_blocks",
                  "reset_peak_stats", "free_all_blocks"]


@pytest.mark.parametrize("query", LOCKED_QUERIES)
def test_a_query_waits_while_another_thread_holds_the_engine(hot_path, query):
    """A query answered in the middle of a malloc or free on another thread would read
    half-updated counters (or a set changing size under it)."""
    import threading

    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    asked, answered = threading.Event(), threading.Event()

    def ask():
        asked.set()
        getattr(e, query)()
        answered.set()

    with e._lock:  # as a malloc or a free on another thread holds it
        thread = CheckedThread(target=ask, name=f"{query}-asker")
        thread.start()
        assert asked.wait(30)
        assert not answered.wait(0.2), f"{query}() answered while the engine was held"
    thread.join(30)
    assert answered.is_set()


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


def test_misuse_gives_clear_errors(hot_path):
    c = Checked(hot_path)
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
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        pool_options(method="magic")
    with pytest.raises(ValueError, match="warmup"):
        pool_options(warmup=-1)
    with pytest.raises(ValueError, match="replan mode 'later'"):
        pool_options(replan="later")
    with pytest.raises(TypeError, match="unknown option 'wramup'"):
        pool_options(wramup=1)


@pytest.mark.parametrize("size, error, message", [
    (-1, OverflowError, "can't convert negative value to size_t"),
    (2 ** 70, OverflowError, "too large to convert"),
    ("1024", TypeError, "an integer is required"),
    # Stricter than CuPy on purpose: CuPy 14 truncates 1.5 to 1 byte silently.
    (1.5, TypeError, "an integer is required, got float"),
])
def test_invalid_sizes_raise_like_cupy_in_every_mode(hot_path, size, error, message):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)  # optimized now: the inline path must refuse them too
    e = c.engine
    for phase in ("outside", "planned"):
        if phase == "planned":
            e.begin_iteration()
        with pytest.raises(error, match=message):
            e.malloc(size)
        if phase == "planned":
            e.end_iteration()
    assert e.stats().requests == len([op for op in HOT if isinstance(op, int)])


@pytest.mark.parametrize("size", [1 << 62, 1 << 63, (1 << 64) - 1])
def test_a_size_no_device_has_is_out_of_memory_in_every_mode(hot_path, size):
    # The fake device lends any size: only the engine can refuse, and must, the same way
    # in warm-up, profiling, optimized iterations and outside them (CuPy's pool: its
    # OutOfMemoryError), rather than overflow a C integer of the hot path.
    c = Checked(hot_path, warmup=1)
    e = c.engine
    modes = []
    for _ in range(3):
        e.begin_iteration()
        modes.append(e.mode)
        with pytest.raises(MemoryError, match="Out of memory allocating"):
            e.malloc(size)
        c.run(HOT)
        e.end_iteration()
    with pytest.raises(MemoryError, match="Out of memory allocating"):
        e.malloc(size)
    assert modes == ["warmup", "profiling", "optimized"]
    assert e.stats().requests == 3 * 4  # the refused requests are not requests
    assert e.stats().planned_requests == 4 and e.mode == "optimized"


def test_size_zero_is_a_null_block_and_not_a_request(hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    e.begin_iteration()
    p = e.malloc(0)
    assert p.ptr == 0 and p.size == 0
    e.end_iteration()
    assert e.stats().requests == 0


def test_optimize_forces_a_plan_after_warmup_only(hot_path):
    c = Checked(hot_path, warmup=5)
    c.iteration(HOT)
    e = c.engine
    options = e.options
    assert e.plan is None and e.mode == "warmup"
    plan = e.optimize()
    assert plan.peak >= plan.lower_bound > 0
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 4
    assert e.options is options and e.options.warmup == 5  # the user's options stay


def test_an_unknown_replan_mode_is_refused_with_the_modes_to_choose_from():
    with pytest.raises(ValueError, match="unknown replan mode 'later'; choose one of "
                                         "background, sync, bestfit"):
        pool_options(replan="later")


def test_departed_requests_keep_their_old_name_for_one_release(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
    st = c.engine.stats()
    assert st.departed_requests == 3
    assert st.fallback_requests == 3 and st.as_dict()["fallback_requests"] == 3
    assert st.numbers()["departed_requests"] == 3


def test_optimize_in_the_middle_of_an_iteration_takes_effect_at_the_next_boundary(hot_path):
    ops = HOT + [70_000, ("f", 4)]
    c = Checked(hot_path, warmup=0)
    c.iteration(ops)
    e = c.engine
    first = e.plan
    e.begin_iteration()
    arena = e.hot.arena
    blocks = c.run(ops[:3])  # two requests and a free, then the user asks for a new plan
    plan = e.optimize()
    assert plan is not first and e.plan is plan  # solved now...
    assert e.schedule.plan is first  # ...but this iteration keeps the plan it started with
    a2 = c.malloc(3000)  # the rest of the iteration, as ops[3:] does it
    c.free(blocks[1])
    blocks.clear()
    a3 = c.malloc(500)
    c.free(a2)
    c.free(a3)
    del a2, a3
    a4 = c.malloc(70_000)
    assert e.hot.arena is arena  # no arena change while the iteration runs
    c.free(a4)
    del a4
    e.end_iteration()
    st = e.stats()
    assert st.departed_requests == 0 and st.planned_requests == 5
    c.iteration(ops)
    assert e.schedule.plan is plan and e.stats().reoptimizations == 0


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


def test_mode_stays_optimized_when_the_idle_arena_is_released(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    e.free_all_blocks()
    st = e.stats()
    assert st.arena_bytes == 0 and st.total_bytes == 0
    assert e.mode == "optimized"  # the plan stays; the arena comes back at the boundary
    c.iteration(HOT)
    st = e.stats()
    assert st.arena_bytes > 0 and st.planned_requests == 4


def test_an_adopted_plan_waits_for_the_warmup_and_says_so(hot_path):
    src = Checked(hot_path, warmup=0)
    src.iteration(HOT)
    profile, plan = src.engine.profile, src.engine.plan
    c = Checked(hot_path, warmup=1)
    e = c.engine
    e.adopt(profile, plan)
    assert e.mode == "warmup" and e.plan is plan
    c.iteration(HOT)
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 4 and e.stats().profiled_requests == 4


def test_peak_stats_and_their_reset(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    assert e.stats().peak_used_bytes == 2048 + 3072  # blocks 1 and 2 live together
    big = e.malloc(100_000)
    del big
    st = e.stats()
    assert st.used_bytes == 0 and st.peak_used_bytes == round_size(100_000)
    assert st.peak_total_bytes >= st.total_bytes > 0
    e.reset_peak_stats()
    st = e.stats()
    assert st.peak_used_bytes == st.used_bytes == 0
    assert st.peak_total_bytes == st.total_bytes
    c.iteration(HOT)  # from the arena now
    assert e.stats().peak_used_bytes == 2048 + 3072


# -- iterations nobody marks ---------------------------------------------------------
def loop(c, repeats, ops=HOT, keep=None):
    """A training loop that never calls begin_iteration: only mallocs and frees."""
    for _ in range(repeats):
        blocks = c.run(ops)
        if keep is not None:
            keep.append(blocks)


def test_a_repeating_loop_is_found_and_optimized_without_marks(hot_path):
    c = Checked(hot_path, warmup=1)
    e = c.engine
    loop(c, 200)
    st = e.stats()
    assert st.iteration_source == "detected (every 4 requests)"
    assert e.mode == "optimized"
    assert st.planned_requests > 500  # most of the loop now comes from the arena
    assert st.departures == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning about missing marks
        loop(c, 10)


def test_marking_iterations_replaces_a_detected_period(hot_path):
    c = Checked(hot_path, warmup=0)
    loop(c, 100)
    e = c.engine
    assert e.stats().iteration_source.startswith("detected")
    c.iteration(HOT)
    c.iteration(HOT)
    st = e.stats()
    assert st.iteration_source == "marked"
    assert e.profile is not None and len(e.profile) == 4


def test_marking_iterations_drops_the_detected_plan_at_once(hot_path):
    c = Checked(hot_path, warmup=0)
    loop(c, 100)
    e = c.engine
    assert e.mode == "optimized" and e.plan is not None
    e.begin_iteration()  # the user's first iteration is profiled, not served by that plan
    assert e.mode == "profiling" and e.plan is None
    c.run(HOT)
    e.end_iteration()


def test_a_detected_period_whose_iterations_keep_departing_is_dropped(hot_path, caplog):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    loop(c, 100)
    assert e.stats().iteration_source == "detected (every 4 requests)"
    departures = e.stats().departures

    def growing(k):  # its first request is larger than any plan made so far
        return [HOT[0] + 4096 * k] + HOT[1:]

    with caplog.at_level(logging.INFO, logger="pgmo.pool"):
        for k in (1, 2, 3):
            c.run(growing(k))
            # The iteration that just ran ends with the next request.
            assert e.stats().iteration_source == "detected (every 4 requests)"
        assert e.stats().departures == departures + 3
        assert "keeps departing" not in caplog.text
        c.run(HOT)  # ends the third departing iteration in a row: the period goes
    assert e.stats().iteration_source == "none"
    assert e.plan is None and e.mode == "fallback"
    assert "detected iteration of 4 requests keeps departing from its plan" in caplog.text
    loop(c, 100)  # and the loop is looked for again
    assert e.stats().iteration_source == "detected (every 4 requests)"


def test_the_request_that_drops_a_period_is_watched_not_counted_in_the_old_iteration(
        hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    loop(c, 100)
    for k in (1, 2, 3):  # three departing iterations in a row
        c.run([HOT[0] + 4096 * k] + HOT[1:])
    before = e.stats()
    c.run([HOT[0]])  # its request ends the third one, and the period goes
    after = e.stats()
    assert after.iteration_source == "none" and after.requests == before.requests + 1
    # unmarked and watched again, not a request of the iteration that ended
    assert (after.profiled_requests, after.departed_requests, after.planned_requests,
            after.pinned_requests) == (before.profiled_requests, before.departed_requests,
                                       before.planned_requests, before.pinned_requests)


def test_reset_inside_a_planned_iteration_profiles_again(hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    c.iteration(HOT)  # profiled
    assert e.mode == "optimized"
    e.begin_iteration()
    a, b = c.malloc(1000), c.malloc(2000)  # planned
    e.reset()  # the plan goes half-way through the iteration
    c.free(a)
    x = c.malloc(3000)
    c.free(b)
    c.free(x)
    del a, b, x
    e.end_iteration()  # half a planned iteration is no profile
    assert e.plan is None and e.mode == "profiling"
    c.iteration(HOT)
    assert e.mode == "optimized"
    c.iteration(HOT)
    assert e.stats().planned_requests == 2 + len([op for op in HOT if isinstance(op, int)])


def test_no_loop_and_no_marks_warns_once_with_the_fix(hot_path):
    c = Checked(hot_path, warn_after=50)
    sizes = iter(range(1, 10 ** 6))  # never repeats
    with pytest.warns(PgmoWarning, match=r"found no repeating loop.*with pool\.iteration\(\)") \
            as caught:
        for _ in range(200):
            c.run([next(sizes) * 512, ("f", 0)])
    assert len(caught) == 1
    assert c.engine.stats().iteration_source == "none"
    assert c.engine.stats().planned_requests == 0


def test_detection_off_still_warns(hot_path):
    c = Checked(hot_path, warn_after=20, detect_iterations=False)
    with pytest.warns(PgmoWarning, match="loop detection is off") as caught:
        loop(c, 40)
    assert "found no repeating loop" not in str(caught[0].message)
    assert c.engine.stats().planned_requests == 0


def unique_requests(c, n):
    """``n`` requests of sizes that never repeat (no loop to find), each freed at once."""
    for k in range(1, n + 1):
        c.run([k * 512, ("f", 0)])


@pytest.mark.parametrize("detect", [True, False])
def test_mode_is_fallback_while_no_iteration_is_marked_or_found(hot_path, detect):
    c = Checked(hot_path, warmup=1, detect_iterations=detect)
    e = c.engine
    assert e.mode == e.stats().mode == "warmup"  # no request yet: what the next iteration does
    unique_requests(c, 100)
    assert e.mode == e.stats().mode == "fallback"
    modes = []
    for _ in range(3):  # the user starts marking iterations: the usual modes
        e.begin_iteration()
        modes.append(e.mode)
        c.run(HOT)
        e.end_iteration()
        modes.append(e.mode)
    assert modes == ["warmup", "profiling", "profiling", "optimized", "optimized", "optimized"]
    unique_requests(c, 10)  # outside the marked iterations: still the next one's mode
    assert e.mode == e.stats().mode == "optimized"


def test_a_detected_loop_leaves_fallback_and_is_optimized(hot_path):
    c = Checked(hot_path, warmup=1)
    e = c.engine
    seen = []
    for _ in range(40):
        blocks = []
        for op in HOT:  # after every malloc and free
            if isinstance(op, int):
                blocks.append(c.malloc(op))
            else:
                c.free(blocks[op[1]])
                blocks[op[1]] = None
            seen.append((e.mode, e.stats().iteration_source))
    assert seen[0] == ("fallback", "none")  # watching: no loop found yet
    # Fallback exactly until the loop is found, from then on the usual modes.
    assert all((mode == "fallback") == (source == "none") for mode, source in seen)
    assert seen[-1] == ("optimized", "detected (every 4 requests)")


@pytest.mark.parametrize("entry", ["engine", "pool", "pool with hooks"])
def test_unmarked_warning_names_the_users_call(hot_path, entry, monkeypatch):
    from pgmo.testing import host_engine, host_pool

    if hot_path is reference_handout().HotPath:
        monkeypatch.setenv("PGMO_PURE_PYTHON", "1")
    if entry == "engine":
        allocator = host_engine(warn_after=10)
        engine = allocator
    else:
        pytest.importorskip("cupy")
        allocator = host_pool(warn_after=10)
        engine = allocator.engine
    assert type(engine.hot) is hot_path
    hooks = contextlib.nullcontext()
    if entry == "pool with hooks":
        from cupy.cuda import memory_hook

        hooks = memory_hook.MemoryHook()
        hooks.name = "pgmo-test-silent"
    with warnings.catch_warnings(record=True) as caught, hooks:
        warnings.simplefilter("always")
        for k in range(1, 30):
            allocator.malloc(k * 512)
            line = sys._getframe().f_lineno - 1
    [w] = [w for w in caught if issubclass(w.category, PgmoWarning)]
    assert (w.filename, w.lineno) == (__file__, line)


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
